//! `msl repl`: an interactive session. On a terminal it uses rustyline (history in the user's
//! data folder, tab completion of names and fields); with piped input it reads plain lines and
//! prints only results, so that scripts and tests can drive it.
//!
//! Ctrl-C cancels the input being typed, or interrupts a running evaluation through the
//! interpreter's interrupt flag; a diagnostic never ends the session.

mod session;
mod slice;

use rustyline::completion::{Completer, FilenameCompleter, Pair};
use rustyline::error::ReadlineError;
use rustyline::highlight::Highlighter;
use rustyline::hint::Hinter;
use rustyline::history::DefaultHistory;
use rustyline::validate::Validator;
use rustyline::{Context, Editor, Helper};
use session::{Output, Session};
use std::cell::RefCell;
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const PROMPT: &str = "msl> ";
const MORE: &str = "...> ";

const HELP: &str = "\
Enter items (fn, model, dim, const, use), statements (let, var, assignments) or expressions.
An expression prints its value; `let` prints the type of what it binds. Input continues on the
next line while a bracket is open or a line ends with an operator.

  :type EXPR      the type and shape of EXPR, without running it (also :t)
  :grad FN [P]    the derivative of FN (as msl source) with respect to its first parameter or P
  :load FILE      add the items of a .msl file to the session
  :reset          forget every item and value
  :help           this text
  :quit           leave (also Ctrl-D)

Ctrl-C cancels the current input or interrupts a running evaluation.";

/// Runs the REPL until `:quit` or end of input. Returns the process exit status.
pub fn main(jit: bool, logdir: std::path::PathBuf) -> u8 {
    let interrupt = Arc::new(AtomicBool::new(false));
    let busy = Arc::new(AtomicBool::new(false));
    let tty = std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    {
        let (interrupt, busy) = (interrupt.clone(), busy.clone());
        // Ctrl-C while evaluating stops the evaluation; while a piped session waits for input
        // it ends the process as usual. On a terminal rustyline sees Ctrl-C itself.
        let _ = ctrlc::set_handler(move || {
            if busy.load(Ordering::SeqCst) {
                interrupt.store(true, Ordering::SeqCst);
            } else if !tty {
                std::process::exit(130);
            }
        });
    }
    catch_panic_messages();
    let mut s = Session::new(interrupt);
    s.jit = jit;
    s.scalars = Some(Rc::new(RefCell::new(crate::metrics::TensorBoard::new(logdir))));
    s.color = tty && std::env::var_os("NO_COLOR").is_none();
    let session = Rc::new(RefCell::new(s));
    let mut repl = Repl { session, busy };
    if tty {
        repl.run_terminal();
    } else {
        repl.run_piped();
    }
    0
}

struct Repl {
    session: Rc<RefCell<Session>>,
    busy: Arc<AtomicBool>,
}

enum Flow {
    Continue,
    Quit,
}

impl Repl {
    fn run_piped(&mut self) {
        let stdin = std::io::stdin();
        let mut buf = Pending::default();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            if buf.is_empty() && line.trim_start().starts_with(':') {
                if let Flow::Quit = self.command(line.trim()) {
                    return;
                }
                continue;
            }
            match buf.push(&line) {
                More::No => self.input(&buf.take()),
                More::Yes => {}
                More::TooLong => too_long(&mut buf),
            }
        }
        if !buf.text.trim().is_empty() {
            self.input(&buf.take());
        }
    }

    fn run_terminal(&mut self) {
        let config = rustyline::Config::builder()
            .auto_add_history(false)
            .completion_type(rustyline::CompletionType::List)
            .build();
        let mut ed: Editor<ReplHelper, DefaultHistory> = match Editor::with_config(config) {
            Ok(e) => e,
            Err(e) => {
                eprintln!("note: line editing is not available ({e}); reading plain lines");
                return self.run_piped();
            }
        };
        ed.set_helper(Some(ReplHelper { session: self.session.clone(), files: FilenameCompleter::new() }));
        let history = history_path();
        if let Some(h) = &history {
            let _ = ed.load_history(h);
        }
        println!("msl {} — :help for help, :quit to leave", env!("CARGO_PKG_VERSION"));
        let mut buf = Pending::default();
        loop {
            let prompt = if buf.is_empty() { PROMPT } else { MORE };
            match ed.readline(prompt) {
                Ok(line) => {
                    if buf.is_empty() && line.trim_start().starts_with(':') {
                        let _ = ed.add_history_entry(line.trim());
                        if let Flow::Quit = self.command(line.trim()) {
                            break;
                        }
                        continue;
                    }
                    match buf.push(&line) {
                        More::Yes => continue,
                        More::TooLong => {
                            too_long(&mut buf);
                            continue;
                        }
                        More::No => {}
                    }
                    let input = buf.take();
                    let _ = ed.add_history_entry(input.trim_end());
                    self.input(&input);
                }
                Err(ReadlineError::Interrupted) => {
                    // Ctrl-C cancels the input being typed.
                    buf.take();
                }
                Err(ReadlineError::Eof) => {
                    if buf.is_empty() {
                        break;
                    }
                    self.input(&buf.take());
                }
                Err(e) => {
                    eprintln!("error: cannot read input: {e}");
                    break;
                }
            }
            if let Some(h) = &history {
                let _ = ed.save_history(h);
            }
        }
        if let Some(h) = &history {
            let _ = ed.save_history(h);
        }
    }

    /// Evaluates an input with Ctrl-C routed to the interpreter, catching any panic.
    fn guarded(&self, f: impl FnOnce(&mut Session) -> Output) {
        self.busy.store(true, Ordering::SeqCst);
        GUARDED.store(true, Ordering::SeqCst);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut self.session.borrow_mut())));
        GUARDED.store(false, Ordering::SeqCst);
        self.busy.store(false, Ordering::SeqCst);
        match r {
            Ok(out) => show(&out),
            Err(_) => {
                let why = PANIC.lock().unwrap_or_else(|p| p.into_inner()).take().unwrap_or_default();
                eprintln!(
                    "error: internal error (a bug in msl) while evaluating this input: {why}; the session goes on"
                );
                // A panic may have left the session half-updated; a clean borrow is all we need.
            }
        }
    }

    fn input(&self, text: &str) {
        self.guarded(|s| s.eval(text));
    }

    fn command(&mut self, line: &str) -> Flow {
        let (cmd, arg) = match line.split_once(char::is_whitespace) {
            Some((c, a)) => (c, a.trim()),
            None => (line, ""),
        };
        match cmd {
            ":q" | ":quit" | ":exit" => return Flow::Quit,
            ":h" | ":help" | ":?" => println!("{HELP}"),
            ":t" | ":type" if !arg.is_empty() => self.guarded(|s| s.type_of(arg)),
            ":grad" if !arg.is_empty() => self.guarded(|s| s.grad_of(arg)),
            ":load" | ":l" if !arg.is_empty() => self.guarded(|s| s.load(arg)),
            ":reset" => {
                let mut s = self.session.borrow_mut();
                let mut fresh = Session::new(s.interrupt.clone());
                fresh.color = s.color;
                fresh.jit = s.jit;
                fresh.scalars = s.scalars.take();
                *s = fresh;
                println!("session cleared");
            }
            ":t" | ":type" | ":grad" | ":load" | ":l" => {
                eprintln!("error: `{cmd}` needs an argument; see :help")
            }
            _ => eprintln!("error: unknown command `{cmd}`; :help lists the commands"),
        }
        Flow::Continue
    }
}

/// True while an input is evaluated under `catch_unwind` (on any thread: a kernel's worker
/// panics on its own thread, and rayon hands the panic to the evaluating one).
static GUARDED: AtomicBool = AtomicBool::new(false);
/// The message and place of the last panic caught while `GUARDED`.
static PANIC: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Makes a panic while an input is evaluated one error line of the session (its message and
/// place, kept for `guarded` to print) instead of the default hook's report with a backtrace
/// hint; panics elsewhere keep the default report.
fn catch_panic_messages() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !GUARDED.load(Ordering::SeqCst) {
            return default(info);
        }
        let p = info.payload();
        let msg = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
        let mut text = msg.unwrap_or_else(|| "a panic".to_string());
        // A place inside the standard library (`capacity overflow`) says nothing to a user.
        if let Some(l) = info.location().filter(|l| !l.file().starts_with("/rustc/")) {
            text.push_str(&format!(" (at {}:{})", l.file(), l.line()));
        }
        *PANIC.lock().unwrap_or_else(|p| p.into_inner()) = Some(text);
    }));
}

fn show(out: &Output) {
    let mut stdout = std::io::stdout();
    let _ = stdout.write_all(out.out.as_bytes());
    let _ = stdout.flush();
    if !out.err.is_empty() {
        eprint!("{}", out.err);
    }
}

/// The longest input the REPL gathers while it is incomplete (an open bracket, string or
/// comment); past it the input is dropped with an error instead of growing without bound.
const MAX_INPUT: usize = 1 << 20;

/// Whether an input needs more lines.
#[derive(Debug, PartialEq, Eq)]
enum More {
    Yes,
    No,
    /// It is still incomplete and past [`MAX_INPUT`].
    TooLong,
}

/// The lines of an input gathered so far, and what they say about its end: the bracket depth
/// and whether the last token asks for more. Each line is lexed once, on its own, so that an
/// input of many lines costs time in proportion to its length (lexing all of it again for every
/// line made a long open bracket quadratic). Only a line that starts or ends a string or block
/// comment spanning lines needs the whole input lexed again, and a line without a quote or a
/// comment mark inside one cannot change anything.
#[derive(Default)]
struct Pending {
    text: String,
    depth: i64,
    /// The last token is an operator or a comma.
    continues: bool,
    /// Inside a string or block comment that a later line must end.
    in_literal: bool,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    fn take(&mut self) -> String {
        std::mem::take(self).text
    }

    fn push(&mut self, line: &str) -> More {
        self.text.push_str(line);
        self.text.push('\n');
        let marks = |s: &str| s.contains('"') || s.contains("/*") || s.contains("*/");
        let scan = if self.in_literal {
            if marks(line) {
                Some(Scan::of(&self.text))
            } else {
                None
            }
        } else {
            let s = Scan::of(line);
            if s.in_literal || self.depth + s.peak > lang::syntax::lexer::MAX_NESTING as i64 {
                // The line opens a string or comment it does not close, or the input nests past
                // the limit (which the lexer reports): only the whole text says how it ends.
                Some(Scan::of(&self.text))
            } else {
                self.depth += s.depth;
                self.continues = s.continues.unwrap_or(self.continues);
                None
            }
        };
        if let Some(s) = scan {
            if s.too_deep {
                return More::No;
            }
            self.depth = s.depth;
            self.continues = s.continues.unwrap_or(false);
            self.in_literal = s.in_literal;
        }
        let more = self.in_literal || self.depth > 0 || self.continues;
        match more {
            false => More::No,
            true if self.text.len() > MAX_INPUT => More::TooLong,
            true => More::Yes,
        }
    }
}

/// Drops an input that grew past [`MAX_INPUT`] without ending.
fn too_long(buf: &mut Pending) {
    let lines = buf.text.lines().count();
    buf.take();
    eprintln!(
        "error: this input is over {} MiB ({lines} lines) and still not complete (an open bracket, string or \
         comment?); it was dropped",
        MAX_INPUT >> 20
    );
}

/// What the tokens of a text say about its end.
struct Scan {
    /// Opening brackets minus closing ones.
    depth: i64,
    /// The greatest depth reached.
    peak: i64,
    /// Whether the last token (not a newline or `;`) asks for more; `None` without tokens.
    continues: Option<bool>,
    /// The text ends inside a string or block comment.
    in_literal: bool,
    /// The lexer found the nesting limit passed.
    too_deep: bool,
}

impl Scan {
    fn of(text: &str) -> Scan {
        use lang::syntax::lexer::Tok;
        let (toks, diags) = lang::syntax::lexer::lex(lang::source::FileId(0), text);
        let (mut depth, mut peak) = (0i64, 0i64);
        for (_, t, _) in &toks {
            match t {
                Tok::LParen | Tok::LBracket | Tok::LBrace => depth += 1,
                Tok::RParen | Tok::RBracket | Tok::RBrace => depth -= 1,
                _ => {}
            }
            peak = peak.max(depth);
        }
        let last = toks.iter().rev().find(|(_, t, _)| !matches!(t, Tok::Newline | Tok::Semi));
        Scan {
            depth,
            peak,
            continues: last.map(|(_, t, _)| continues(t)),
            in_literal: diags.iter().any(|d| d.code == lang::diag::Code::E0102),
            too_deep: diags.iter().any(|d| d.code == lang::diag::Code::E0106),
        }
    }
}

/// A token that cannot end an input: an operator, a comma, `=`, `->` or `.`.
fn continues(t: &lang::syntax::lexer::Tok) -> bool {
    use lang::syntax::lexer::Tok;
    matches!(
        t,
        Tok::Plus
            | Tok::Minus
            | Tok::Star
            | Tok::StarStar
            | Tok::Slash
            | Tok::Percent
            | Tok::At
            | Tok::AndAnd
            | Tok::OrOr
            | Tok::EqEq
            | Tok::Ne
            | Tok::Lt
            | Tok::Le
            | Tok::Gt
            | Tok::Ge
            | Tok::Comma
            | Tok::Eq
            | Tok::Arrow
            | Tok::Dot
    )
}

/// `$XDG_DATA_HOME/msl/history` or `~/.local/share/msl/history`, its folder created; `None`
/// when there is no such place (history is then not kept).
fn history_path() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".local/share"),
    };
    let dir = base.join("msl");
    std::fs::create_dir_all(&dir).ok()?;
    Some(dir.join("history"))
}

struct ReplHelper {
    session: Rc<RefCell<Session>>,
    files: FilenameCompleter,
}

impl Completer for ReplHelper {
    type Candidate = Pair;

    fn complete(&self, line: &str, pos: usize, ctx: &Context<'_>) -> rustyline::Result<(usize, Vec<Pair>)> {
        if let Some(rest) = line.strip_prefix(":load ").or_else(|| line.strip_prefix(":l ")) {
            let _ = rest;
            return self.files.complete(line, pos, ctx);
        }
        let start = line[..pos].rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
        let word = &line[start..pos];
        if line.starts_with(':') && start <= 1 {
            let cmds = [":type", ":grad", ":load", ":reset", ":help", ":quit"];
            let c = cmds
                .iter()
                .filter(|c| c.starts_with(line))
                .map(|c| Pair { display: c.to_string(), replacement: c.to_string() });
            return Ok((0, c.collect()));
        }
        // `:type EXPR` completes inside EXPR.
        let (text, shift) = match line.split_once(' ') {
            Some((c, rest)) if c.starts_with(':') => (rest, c.len() + 1),
            _ => (line, 0),
        };
        if pos < shift {
            return Ok((pos, vec![]));
        }
        let Ok(session) = self.session.try_borrow() else {
            return Ok((pos, vec![]));
        };
        // A failure to complete shows no candidates, and no panic report in the middle of the line.
        GUARDED.store(true, Ordering::SeqCst);
        let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| session.complete(text, pos - shift)))
            .unwrap_or_default();
        GUARDED.store(false, Ordering::SeqCst);
        let mut pairs: Vec<Pair> = found
            .into_iter()
            .filter(|c| c.label.starts_with(word))
            .map(|c| Pair {
                display: match &c.detail {
                    Some(d) if c.kind != lang::ide::SymbolKind::Builtin => {
                        format!("{}: {d}", c.label)
                    }
                    _ => c.label.clone(),
                },
                replacement: c.label,
            })
            .collect();
        pairs.sort_by(|a, b| a.replacement.cmp(&b.replacement));
        Ok((start, pairs))
    }
}

impl Hinter for ReplHelper {
    type Hint = String;
}
impl Highlighter for ReplHelper {}
impl Validator for ReplHelper {}
impl Helper for ReplHelper {}
