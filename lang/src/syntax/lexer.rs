//! The lexer (logos) and the newline filter that decides which line breaks end a statement.
//!
//! Statements end at a newline or `;`. A newline inside `()` or `[]`, after a binary operator or
//! a comma, right after `{` or before `}` continues the line; the filter drops those newlines so
//! that the grammar only ever sees meaningful separators.

use crate::diag::{Code, Diagnostic};
use crate::source::{FileId, Span};
use logos::Logos;

/// Deepest bracket nesting the parser accepts; deeper input gets `E0106`, never a stack overflow.
pub const MAX_NESTING: usize = 256;

#[derive(Clone, Debug, PartialEq, Default)]
pub enum LexError {
    #[default]
    Unknown,
    BadInt,
    Unterminated(&'static str),
    BadEscape(char),
}

#[derive(Logos, Clone, Debug, PartialEq)]
#[logos(error = LexError)]
#[logos(skip r"[ \t\r\f]+")]
pub enum Tok<'a> {
    #[regex(r"//[^\n]*", allow_greedy = true)]
    LineComment,
    #[token("/*", block_comment)]
    BlockComment,
    #[regex(r"\n")]
    Newline,
    #[token(";")]
    Semi,

    #[token("fn")]
    Fn,
    #[token("let")]
    Let,
    #[token("var")]
    Var,
    #[token("model")]
    Model,
    #[token("dim")]
    Dim,
    #[token("const")]
    Const,
    #[token("use")]
    Use,
    #[token("mesh")]
    Mesh,
    #[token("test")]
    Test,
    #[token("if")]
    If,
    #[token("else")]
    Else,
    #[token("for")]
    For,
    #[token("in")]
    In,
    #[token("while")]
    While,
    #[token("return")]
    Return,
    #[token("break")]
    Break,
    #[token("continue")]
    Continue,
    #[token("true")]
    True,
    #[token("false")]
    False,

    #[regex(r"[A-Za-z_][A-Za-z0-9_]*", |lex| lex.slice())]
    Ident(&'a str),
    #[regex(r"[0-9]+", parse_int)]
    Int(i64),
    #[regex(r"[0-9]+\.[0-9]+([eE][+-]?[0-9]+)?", |lex| lex.slice())]
    #[regex(r"[0-9]+[eE][+-]?[0-9]+", |lex| lex.slice())]
    Float(&'a str),
    #[token("\"", string)]
    Str(String),

    #[token("(")]
    LParen,
    #[token(")")]
    RParen,
    #[token("[")]
    LBracket,
    #[token("]")]
    RBracket,
    #[token("{")]
    LBrace,
    #[token("}")]
    RBrace,
    #[token(",")]
    Comma,
    #[token(".")]
    Dot,
    #[token("..")]
    DotDot,
    #[token(":")]
    Colon,
    #[token("->")]
    Arrow,
    #[token("@")]
    At,
    #[token("=")]
    Eq,
    #[token("+=")]
    PlusEq,
    #[token("-=")]
    MinusEq,
    #[token("*=")]
    StarEq,
    #[token("/=")]
    SlashEq,
    #[token("==")]
    EqEq,
    #[token("!=")]
    Ne,
    #[token("<")]
    Lt,
    #[token("<=")]
    Le,
    #[token(">")]
    Gt,
    #[token(">=")]
    Ge,
    #[token("+")]
    Plus,
    #[token("-")]
    Minus,
    #[token("*")]
    Star,
    #[token("**")]
    StarStar,
    #[token("/")]
    Slash,
    #[token("%")]
    Percent,
    #[token("!")]
    Bang,
    #[token("&&")]
    AndAnd,
    #[token("||")]
    OrOr,
    #[token("|")]
    Pipe,
}

fn parse_int<'a>(lex: &mut logos::Lexer<'a, Tok<'a>>) -> Result<i64, LexError> {
    lex.slice().parse::<i64>().map_err(|_| LexError::BadInt)
}

fn block_comment<'a>(lex: &mut logos::Lexer<'a, Tok<'a>>) -> Result<(), LexError> {
    match lex.remainder().find("*/") {
        Some(end) => {
            lex.bump(end + 2);
            Ok(())
        }
        None => {
            lex.bump(lex.remainder().len());
            Err(LexError::Unterminated("block comment"))
        }
    }
}

fn string<'a>(lex: &mut logos::Lexer<'a, Tok<'a>>) -> Result<String, LexError> {
    let rest = lex.remainder();
    let mut out = String::new();
    let mut chars = rest.char_indices();
    let mut bad = None;
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => {
                lex.bump(i + 1);
                return match bad {
                    Some(c) => Err(LexError::BadEscape(c)),
                    None => Ok(out),
                };
            }
            '\n' => break,
            '\\' => match chars.next() {
                Some((_, 'n')) => out.push('\n'),
                Some((_, 't')) => out.push('\t'),
                Some((_, '\\')) => out.push('\\'),
                Some((_, '"')) => out.push('"'),
                Some((_, c)) => bad = bad.or(Some(c)),
                None => break,
            },
            c => out.push(c),
        }
    }
    let len = rest.find('\n').unwrap_or(rest.len());
    lex.bump(len);
    Err(LexError::Unterminated("string literal"))
}

impl Tok<'_> {
    /// A token after which a newline does not end the statement.
    fn continues_line(&self) -> bool {
        use Tok::*;
        matches!(
            self,
            Plus | Minus
                | Star
                | StarStar
                | Slash
                | Percent
                | At
                | EqEq
                | Ne
                | Lt
                | Le
                | Gt
                | Ge
                | AndAnd
                | OrOr
                | Eq
                | PlusEq
                | MinusEq
                | StarEq
                | SlashEq
                | Comma
                | Arrow
                | Dot
                | Colon
                | LBrace
                | Bang
                | Newline
                | Semi
        )
    }
}

pub type Spanned<'a> = (usize, Tok<'a>, usize);

/// Lexical errors reported per file; past them the lexer goes on but stays quiet, so that a
/// binary or garbage file gives a screenful of errors rather than one per byte.
pub const MAX_LEX_ERRORS: usize = 100;

/// Source text quoted in a message, cut after 40 characters.
fn elide(s: &str) -> String {
    match s.char_indices().nth(40) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// Lexes a whole file into the token stream the grammar reads, with separators already filtered.
/// Lexical errors become diagnostics; the offending text is skipped so that parsing goes on.
pub fn lex(file: FileId, src: &str) -> (Vec<Spanned<'_>>, Vec<Diagnostic>) {
    let mut diags = Vec::new();
    let mut raw: Vec<Spanned> = Vec::new();
    let mut lexer = Tok::lexer(src);
    while let Some(tok) = lexer.next() {
        let r = lexer.span();
        let span = Span::new(file, r.start, r.end);
        // A UTF-8 byte-order mark at the start of the file is not text (Python, rustc and
        // editors accept one); anywhere else it is an unexpected character.
        if r.start == 0 && src.starts_with('\u{feff}') && r.end <= '\u{feff}'.len_utf8() {
            continue;
        }
        match tok {
            Ok(Tok::LineComment | Tok::BlockComment) => {}
            Ok(t) => raw.push((r.start, t, r.end)),
            Err(e) => {
                // A run of characters that start no token is one error, not one per character.
                if e == LexError::Unknown {
                    let adjacent =
                        |d: &&mut Diagnostic| d.code == Code::E0101 && d.primary.span.end as usize == r.start;
                    if let Some(last) = diags.last_mut().filter(adjacent) {
                        last.primary.span.end = r.end as u32;
                        let run = elide(&src[last.primary.span.range()]);
                        last.message = format!("unexpected characters `{run}`");
                        continue;
                    }
                }
                let d = match e {
                    LexError::Unknown => {
                        let ch = src[r.clone()].chars().next().unwrap_or('?');
                        Diagnostic::error(Code::E0101, span, format!("unexpected character {ch:?}"))
                            .label("not part of any token")
                    }
                    LexError::BadInt => Diagnostic::error(
                        Code::E0105,
                        span,
                        format!("integer literal {} does not fit in 64 bits", elide(&src[r.clone()])),
                    )
                    .label("too large"),
                    LexError::Unterminated(what) => {
                        Diagnostic::error(Code::E0102, span, format!("unterminated {what}"))
                            .label("starts here and never ends")
                    }
                    LexError::BadEscape(c) => {
                        Diagnostic::error(Code::E0107, span, format!("unknown escape sequence `\\{c}` in string"))
                            .with_help("the escapes are \\n \\t \\\\ and \\\"")
                    }
                };
                if diags.len() + 1 == MAX_LEX_ERRORS {
                    diags.push(d.with_help(format!(
                        "this is the {MAX_LEX_ERRORS}th lexical error in this file; further ones are not reported"
                    )));
                } else if diags.len() < MAX_LEX_ERRORS {
                    diags.push(d);
                }
                // Keep the token stream well formed: a bad literal still stands for a value.
                match e {
                    LexError::BadInt => raw.push((r.start, Tok::Int(0), r.end)),
                    LexError::Unterminated("string literal") | LexError::BadEscape(_) => {
                        raw.push((r.start, Tok::Str(String::new()), r.end))
                    }
                    _ => {}
                }
            }
        }
    }
    let toks = filter_newlines(file, raw, &mut diags);
    (toks, diags)
}

/// Drops the newlines that do not end a statement and merges runs of separators.
fn filter_newlines<'a>(file: FileId, raw: Vec<Spanned<'a>>, diags: &mut Vec<Diagnostic>) -> Vec<Spanned<'a>> {
    let mut out: Vec<Spanned<'a>> = Vec::with_capacity(raw.len());
    let mut stack: Vec<Tok> = Vec::new();
    let n = raw.len();
    let mut iter = raw.into_iter().peekable();
    let _ = n;
    while let Some((s, tok, e)) = iter.next() {
        match tok {
            // Inside `[…]` an explicit `;` separates a stack's layer type from its length
            // (`[Block[D]; L]`).
            Tok::Semi if matches!(stack.last(), Some(Tok::LBracket)) => out.push((s, Tok::Semi, e)),
            Tok::Newline | Tok::Semi => {
                let in_parens = matches!(stack.last(), Some(Tok::LParen | Tok::LBracket));
                let after_cont = out.last().is_none_or(|(_, t, _)| t.continues_line());
                let before_close =
                    matches!(iter.peek(), None | Some((_, Tok::RBrace | Tok::Else | Tok::Newline | Tok::Semi, _)));
                // An explicit `;` is always kept unless it is redundant, so `a; b` splits even
                // inside a block on one line.
                let keep = !in_parens && !after_cont && !before_close;
                if keep {
                    out.push((s, Tok::Semi, e));
                }
            }
            Tok::LParen | Tok::LBracket | Tok::LBrace => {
                stack.push(tok.clone());
                if stack.len() > MAX_NESTING {
                    diags.push(
                        Diagnostic::error(
                            Code::E0106,
                            Span::new(file, s, e),
                            format!("brackets nested more than {MAX_NESTING} deep"),
                        )
                        .label("too deep"),
                    );
                    // Stop reading: the rest of the file cannot be parsed sensibly.
                    return out;
                }
                out.push((s, tok, e));
            }
            Tok::RParen | Tok::RBracket | Tok::RBrace => {
                stack.pop();
                out.push((s, tok, e));
            }
            _ => out.push((s, tok, e)),
        }
    }
    out
}

/// The doc comment (`///` lines) directly above byte offset `start`, if any.
pub fn doc_comment_before(src: &str, start: usize) -> Option<String> {
    let before = src.get(..start)?;
    let mut lines: Vec<&str> = Vec::new();
    // Skip the rest of the line the item starts on (annotations may sit above the keyword).
    for line in before.lines().rev().skip(usize::from(!before.ends_with('\n'))) {
        let t = line.trim();
        if let Some(doc) = t.strip_prefix("///") {
            lines.push(doc.strip_prefix(' ').unwrap_or(doc));
        } else if t.starts_with('@') && lines.is_empty() {
            continue;
        } else {
            break;
        }
    }
    if lines.is_empty() {
        return None;
    }
    lines.reverse();
    Some(lines.join("\n"))
}
