//! Source files and byte spans: every AST node and IR statement points back here.

use std::ops::Range;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct FileId(pub u32);

/// A byte range in one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Span {
    pub file: FileId,
    pub start: u32,
    pub end: u32,
}

impl Span {
    pub fn new(file: FileId, start: usize, end: usize) -> Span {
        Span { file, start: start as u32, end: end as u32 }
    }

    pub fn range(&self) -> Range<usize> {
        self.start as usize..self.end as usize
    }

    /// The smallest span covering both (same file assumed).
    pub fn to(self, other: Span) -> Span {
        if self.file != other.file {
            return self;
        }
        Span { file: self.file, start: self.start.min(other.start), end: self.end.max(other.end) }
    }
}

#[derive(Clone, Debug)]
pub struct SourceFile {
    pub name: String,
    pub text: String,
    /// Byte offset of the start of every line.
    line_starts: Vec<usize>,
    /// The text is all ASCII (a column in characters is then a column in bytes).
    ascii: bool,
}

/// All files of one compilation: the user's files, files they `use`, and stdlib modules.
#[derive(Clone, Debug, Default)]
pub struct SourceMap {
    files: Vec<SourceFile>,
}

impl SourceMap {
    pub fn new() -> SourceMap {
        SourceMap::default()
    }

    pub fn add(&mut self, name: impl Into<String>, text: impl Into<String>) -> FileId {
        let text = text.into();
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        let ascii = text.is_ascii();
        self.files.push(SourceFile { name: name.into(), text, line_starts, ascii });
        FileId(self.files.len() as u32 - 1)
    }

    pub fn get(&self, id: FileId) -> &SourceFile {
        &self.files[id.0 as usize]
    }

    pub fn name(&self, id: FileId) -> &str {
        &self.get(id).name
    }

    pub fn text(&self, id: FileId) -> &str {
        &self.get(id).text
    }

    pub fn files(&self) -> impl Iterator<Item = (FileId, &SourceFile)> {
        self.files.iter().enumerate().map(|(i, f)| (FileId(i as u32), f))
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_col(&self, id: FileId, offset: u32) -> (usize, usize) {
        let f = self.get(id);
        let offset = (offset as usize).min(f.text.len());
        let line = f.line_starts.partition_point(|&s| s <= offset) - 1;
        let start = f.line_starts[line];
        // Counting characters costs the length of the line; in an ASCII file bytes are characters
        // (so thousands of diagnostics on one megabyte-long line stay cheap).
        let col = match f.text.get(start..offset) {
            Some(s) if f.ascii => s.len(),
            // A byte-order mark opening the file is not a column.
            Some(s) => s.chars().count() - usize::from(line == 0 && s.starts_with('\u{feff}')),
            None => offset - start,
        };
        (line + 1, col + 1)
    }

    /// The byte range of the line that contains `offset` (without its newline).
    pub fn line_range(&self, id: FileId, offset: u32) -> Range<usize> {
        let f = self.get(id);
        let offset = (offset as usize).min(f.text.len());
        let line = f.line_starts.partition_point(|&s| s <= offset) - 1;
        let start = f.line_starts[line];
        let end = f.line_starts.get(line + 1).map_or(f.text.len(), |&next| next - 1);
        start..end.max(start)
    }

    /// 0-based line and UTF-16 column of a byte offset, as the LSP counts positions.
    pub fn line_utf16(&self, id: FileId, offset: u32) -> (u32, u32) {
        let f = self.get(id);
        let offset = (offset as usize).min(f.text.len());
        let line = f.line_starts.partition_point(|&s| s <= offset) - 1;
        let start = f.line_starts[line];
        let col = f.text.get(start..offset).map(|s| s.encode_utf16().count()).unwrap_or(0);
        (line as u32, col as u32)
    }

    /// The byte offset of a 0-based line and UTF-16 column (LSP positions), clamped to the file.
    pub fn offset_of_utf16(&self, id: FileId, line: u32, col: u32) -> usize {
        let f = self.get(id);
        let Some(&start) = f.line_starts.get(line as usize) else { return f.text.len() };
        let mut units = 0u32;
        for (i, ch) in f.text[start..].char_indices() {
            if units >= col || ch == '\n' {
                return start + i;
            }
            units += ch.len_utf16() as u32;
        }
        f.text.len()
    }
}
