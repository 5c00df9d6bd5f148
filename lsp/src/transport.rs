//! The framing layer in front of tower-lsp: reads `Content-Length` frames from stdin itself,
//! answers malformed ones with JSON-RPC errors, and hands only well-formed messages to the service.
//!
//! tower-lsp's own transport stops reading after the first frame it cannot decode (its framed
//! stream ends on the first error), so a single bad message would end the session. Here every
//! frame is checked before the service sees it: its headers, its size, that it is UTF-8 and
//! JSON, and that it has the shape of a JSON-RPC request, notification or response. A frame that
//! fails is answered directly (`-32700` parse error or `-32600` invalid request, as the JSON-RPC
//! specification asks) and the next frame is read. Messages that pass are re-serialized from the
//! parsed value, so that the service parses exactly what was checked.
//!
//! Output goes through one function that writes whole frames under stdout's lock, both for the
//! service's messages and for the error replies written here, so the two never interleave.

use serde_json::{json, Value};
use std::io::{self, BufRead, Read};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tower_lsp_server::jsonrpc::{Id, Request, Response};

/// Largest message body accepted; a larger `Content-Length` is refused before anything is read.
pub const MAX_BODY: u64 = 64 << 20;
/// Longest header line accepted, so that a stream without line breaks cannot grow a buffer.
const MAX_HEADER_LINE: usize = 8 << 10;
/// Most header lines in one frame (the protocol defines two).
const MAX_HEADERS: usize = 32;
/// What every frame starts with; after a malformed frame the input is skipped up to it.
const HEADER: &[u8] = b"Content-Length";

/// JSON-RPC's code for a message that is not JSON.
pub const PARSE_ERROR: i64 = -32700;
/// JSON-RPC's code for JSON that is not a request, notification or response.
pub const INVALID_REQUEST: i64 = -32600;

/// Writes one whole frame (headers and body) to the client.
pub type Out = Arc<dyn Fn(&[u8]) -> io::Result<()> + Send + Sync>;

/// The `Out` that writes to stdout, holding its lock for the whole frame.
pub fn stdout() -> Out {
    Arc::new(|frame: &[u8]| {
        use std::io::Write;
        let mut out = io::stdout().lock();
        out.write_all(frame)?;
        out.flush()
    })
}

/// A body with its `Content-Length` header.
pub fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = format!("Content-Length: {}\r\n\r\n", body.len()).into_bytes();
    f.extend_from_slice(body);
    f
}

/// A JSON-RPC error response.
pub fn error_reply(id: Value, code: i64, message: &str) -> Vec<u8> {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}).to_string().into_bytes()
}

/// What one frame of input turned out to be.
#[derive(Debug, PartialEq)]
pub enum Incoming {
    /// A well-formed message for the service: its body, re-serialized.
    Message(Vec<u8>),
    /// A frame that cannot be served, and the body of the error reply to send for it.
    Reject(Vec<u8>),
}

/// Reads frames from a byte stream.
pub struct Frames<R> {
    r: R,
    /// Bytes already consumed that start the next header line (after skipping to `HEADER`).
    carry: Vec<u8>,
    /// Whether the input must be skipped to the next `HEADER` before reading a frame: set after
    /// a malformed frame, whose reply is sent first (the client may wait for it before sending
    /// the next frame).
    resync: bool,
}

impl<R: BufRead> Frames<R> {
    pub fn new(r: R) -> Frames<R> {
        Frames { r, carry: Vec::new(), resync: false }
    }

    /// The next frame, checked; `None` at the end of the input.
    pub fn next_message(&mut self) -> io::Result<Option<Incoming>> {
        Ok(self.next_body()?.map(|body| match body {
            Ok(body) => check(&body),
            Err(why) => Incoming::Reject(error_reply(Value::Null, PARSE_ERROR, &format!("Parse error: {why}"))),
        }))
    }

    /// The next frame's body, or why its headers were refused (the input is then skipped to the
    /// next frame on the next call); `None` at the end of the input.
    fn next_body(&mut self) -> io::Result<Option<Result<Vec<u8>, String>>> {
        if std::mem::take(&mut self.resync) {
            self.skip_to_header()?;
        }
        let mut len = None;
        let mut problem = None;
        let mut lines = 0;
        loop {
            let Some(line) = self.line()? else {
                return Ok(None);
            };
            let Some(line) = line else {
                problem = Some(format!("a header line is longer than {MAX_HEADER_LINE} bytes"));
                break;
            };
            if line.is_empty() {
                if lines == 0 {
                    continue; // stray line breaks between frames are harmless
                }
                break;
            }
            lines += 1;
            if lines > MAX_HEADERS {
                problem = Some(format!("more than {MAX_HEADERS} header lines"));
                break;
            }
            match header(&line) {
                Ok(Some(n)) => len = Some(n),
                Ok(None) => {}
                Err(why) => {
                    problem = Some(why);
                    break;
                }
            }
        }
        let why = match (problem, len) {
            (None, Some(n)) if n <= MAX_BODY => return self.body(n),
            (None, Some(n)) => format!("Content-Length {n} is more than the limit of {MAX_BODY} bytes"),
            (None, None) => "no Content-Length header".to_string(),
            (Some(why), _) => why,
        };
        // Where the frame ends is unknown (or its body is not to be read): the next frame is
        // found by its header.
        self.resync = true;
        Ok(Some(Err(why)))
    }

    /// A body of `len` bytes; `None` when the input ends first.
    fn body(&mut self, len: u64) -> io::Result<Option<Result<Vec<u8>, String>>> {
        // The buffer grows with the bytes that actually arrive, not with what the header claims.
        let mut body = Vec::with_capacity(len.min(64 << 10) as usize);
        (&mut self.r).take(len).read_to_end(&mut body)?;
        if (body.len() as u64) < len {
            return Ok(None);
        }
        Ok(Some(Ok(body)))
    }

    /// One header line without its line break; `Some(None)` when it is too long, `None` at the
    /// end of the input.
    fn line(&mut self) -> io::Result<Option<Option<Vec<u8>>>> {
        let mut line = std::mem::take(&mut self.carry);
        let limit = (MAX_HEADER_LINE + 2).saturating_sub(line.len()) as u64;
        let n = (&mut self.r).take(limit).read_until(b'\n', &mut line)?;
        if n == 0 && line.is_empty() {
            return Ok(None);
        }
        if line.last() != Some(&b'\n') {
            if (n as u64) < limit {
                return Ok(None); // the input ended inside a header
            }
            return Ok(Some(None));
        }
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        Ok(Some(Some(line)))
    }

    /// Skips input up to the next `Content-Length` (kept as the start of the next line).
    fn skip_to_header(&mut self) -> io::Result<()> {
        let mut matched = 0;
        loop {
            let buf = self.r.fill_buf()?;
            if buf.is_empty() {
                return Ok(());
            }
            let mut used = 0;
            for &b in buf {
                used += 1;
                // `HEADER` has no prefix that is also a suffix, so a mismatch restarts the match
                // at this byte without missing an occurrence.
                matched = if b == HEADER[matched] { matched + 1 } else { usize::from(b == HEADER[0]) };
                if matched == HEADER.len() {
                    break;
                }
            }
            self.r.consume(used);
            if matched == HEADER.len() {
                self.carry = HEADER.to_vec();
                return Ok(());
            }
        }
    }
}

/// The length of a `Content-Length` header, `None` for other headers (which are ignored, as
/// tower-lsp does), or why the line is not a header.
fn header(line: &[u8]) -> Result<Option<u64>, String> {
    let text = std::str::from_utf8(line).map_err(|_| "a header line is not UTF-8".to_string())?;
    let Some((name, value)) = text.split_once(':') else {
        return Err(format!("malformed header line {:?}", shorten(text)));
    };
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(format!("malformed header name {:?}", shorten(name)));
    }
    if !name.eq_ignore_ascii_case("content-length") {
        return Ok(None);
    }
    let value = value.trim();
    // `u64::from_str` would accept a leading `+`; the header is digits only.
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("Content-Length {:?} is not a number of bytes", shorten(value)));
    }
    match value.parse::<u64>() {
        Ok(n) => Ok(Some(n)),
        Err(_) => Err(format!("Content-Length {} is more than the limit of {MAX_BODY} bytes", shorten(value))),
    }
}

/// At most 40 characters of client input, for error messages.
fn shorten(s: &str) -> String {
    match s.char_indices().nth(40) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// Checks one body: UTF-8, JSON (with unpaired surrogates replaced), a JSON-RPC message.
pub fn check(body: &[u8]) -> Incoming {
    let reject = |id: Value, code, message: String| Incoming::Reject(error_reply(id, code, &message));
    let Ok(text) = std::str::from_utf8(body) else {
        return reject(Value::Null, PARSE_ERROR, "Parse error: the message is not UTF-8".to_string());
    };
    // serde_json's nesting limit (128) also bounds the stack used here and in the service.
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => match replace_lone_surrogates(text).and_then(|t| serde_json::from_str(&t).ok()) {
            Some(v) => v,
            None => return reject(Value::Null, PARSE_ERROR, format!("Parse error: {e}")),
        },
    };
    if !value.is_object() {
        let what = "Invalid Request: a message is a JSON object (batches are not part of the LSP)";
        return reject(Value::Null, INVALID_REQUEST, what.to_string());
    }
    // The same order as tower-lsp's `Message`: a response first, then a request or notification.
    let ok = serde_json::from_value::<Response>(value.clone()).is_ok()
        || serde_json::from_value::<Request>(value.clone()).is_ok();
    if !ok {
        let id = value.get("id").filter(|id| serde_json::from_value::<Id>((*id).clone()).is_ok());
        let message = match value.get("method") {
            Some(Value::String(_)) | None => "Invalid Request: not a JSON-RPC 2.0 message",
            Some(_) => "Invalid Request: `method` is not a string",
        };
        return reject(id.cloned().unwrap_or(Value::Null), INVALID_REQUEST, message.to_string());
    }
    Incoming::Message(value.to_string().into_bytes())
}

/// `text` with every `\u` escape of an unpaired UTF-16 surrogate replaced by `\ufffd`, or `None`
/// when it has none. Editors that keep text as UTF-16 can send such a character (half of an
/// emoji, cut by an edit); serde_json refuses it, and one bad character should not make the whole
/// document unreadable, so it becomes U+FFFD, as invalid UTF-8 does elsewhere.
fn replace_lone_surrogates(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let unit = |i: usize| -> Option<u16> {
        let hex = b.get(i..i + 6)?;
        if hex[0] != b'\\' || hex[1] != b'u' {
            return None;
        }
        u16::from_str_radix(std::str::from_utf8(&hex[2..]).ok()?, 16).ok()
    };
    let mut out = String::with_capacity(text.len());
    let (mut i, mut copied, mut replaced, mut in_string) = (0, 0, false, false);
    while i < b.len() {
        match b[i] {
            b'"' => {
                in_string = !in_string;
                i += 1;
            }
            b'\\' if in_string => match unit(i) {
                Some(0xD800..=0xDBFF) if matches!(unit(i + 6), Some(0xDC00..=0xDFFF)) => i += 12,
                Some(0xD800..=0xDFFF) => {
                    out.push_str(&text[copied..i]);
                    out.push_str("\\ufffd");
                    i += 6;
                    copied = i;
                    replaced = true;
                }
                _ => i += 2, // any other escape is two characters, or starts `\u` with four digits
            },
            _ => i += 1,
        }
    }
    if !replaced {
        return None;
    }
    out.push_str(&text[copied..]);
    Some(out)
}

/// Reads frames from `input` until it ends, handing messages to `tx` and answering the rest
/// through `out`. Meant for a thread of its own: it blocks on `input`.
pub fn pump<R: BufRead>(input: R, tx: mpsc::Sender<Vec<u8>>, out: Out) {
    let mut frames = Frames::new(input);
    loop {
        match frames.next_message() {
            Ok(Some(Incoming::Message(m))) => {
                if tx.blocking_send(m).is_err() {
                    return; // the service has stopped
                }
            }
            Ok(Some(Incoming::Reject(reply))) => {
                if out(&frame(&reply)).is_err() {
                    return; // the client has gone
                }
            }
            Ok(None) | Err(_) => return,
        }
    }
}

/// The service's input: the checked messages, framed again for tower-lsp's reader.
pub struct Input {
    rx: mpsc::Receiver<Vec<u8>>,
    cur: Vec<u8>,
    at: usize,
}

impl Input {
    pub fn new(rx: mpsc::Receiver<Vec<u8>>) -> Input {
        Input { rx, cur: Vec::new(), at: 0 }
    }
}

impl AsyncRead for Input {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.at == this.cur.len() {
            match this.rx.poll_recv(cx) {
                Poll::Ready(Some(body)) => {
                    this.cur = frame(&body);
                    this.at = 0;
                }
                Poll::Ready(None) => return Poll::Ready(Ok(())), // end of input
                Poll::Pending => return Poll::Pending,
            }
        }
        let n = buf.remaining().min(this.cur.len() - this.at);
        buf.put_slice(&this.cur[this.at..this.at + n]);
        this.at += n;
        Poll::Ready(Ok(()))
    }
}

/// The service's output: collects tower-lsp's bytes and passes each complete frame to `Out`.
pub struct Output {
    out: Out,
    buf: Vec<u8>,
}

impl Output {
    pub fn new(out: Out) -> Output {
        Output { out, buf: Vec::new() }
    }

    /// The length of the first complete frame in the buffer, if there is one. tower-lsp writes
    /// only `Content-Length` headers, so nothing else needs reading.
    fn complete(&self) -> Option<usize> {
        let end = self.buf.windows(4).position(|w| w == b"\r\n\r\n")?;
        let head = std::str::from_utf8(&self.buf[..end]).ok()?;
        let len: usize = head.lines().find_map(|l| l.strip_prefix("Content-Length:"))?.trim().parse().ok()?;
        let total = end + 4 + len;
        (self.buf.len() >= total).then_some(total)
    }
}

impl AsyncWrite for Output {
    fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        this.buf.extend_from_slice(data);
        while let Some(n) = this.complete() {
            (this.out)(&this.buf[..n])?;
            this.buf.drain(..n);
        }
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests;
