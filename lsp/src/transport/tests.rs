//! Tests of the framing layer on hostile input: every bad frame gets its error reply and the
//! frame after it is still read.

use super::*;
use std::io::Cursor;
use std::sync::Mutex;

const GOOD: &str = r#"{"jsonrpc":"2.0","id":1,"method":"shutdown"}"#;

fn framed(body: &[u8]) -> Vec<u8> {
    frame(body)
}

/// Every frame of `input` as (error code or 0 for a message, reply id, forwarded body).
fn read_all(input: &[u8]) -> Vec<(i64, Value, Value)> {
    let mut frames = Frames::new(Cursor::new(input.to_vec()));
    let mut seen = Vec::new();
    while let Some(m) = frames.next_message().unwrap() {
        seen.push(match m {
            Incoming::Message(b) => (0, Value::Null, serde_json::from_slice(&b).unwrap()),
            Incoming::Reject(r) => {
                let v: Value = serde_json::from_slice(&r).unwrap();
                assert_eq!(v["jsonrpc"], "2.0");
                (v["error"]["code"].as_i64().unwrap(), v["id"].clone(), Value::Null)
            }
        });
    }
    seen
}

/// `bad` followed by a good frame gives one error with `code` and `id`, then the good message.
fn rejects(bad: &[u8], code: i64, id: Value) {
    let mut input = bad.to_vec();
    input.extend(framed(GOOD.as_bytes()));
    let seen = read_all(&input);
    assert_eq!(seen.len(), 2, "{:?} gave {seen:?}", String::from_utf8_lossy(bad));
    assert_eq!((seen[0].0, &seen[0].1), (code, &id), "{:?}", String::from_utf8_lossy(bad));
    assert_eq!(seen[1].0, 0);
    assert_eq!(seen[1].2["method"], "shutdown");
}

#[test]
fn a_good_message_is_passed_on() {
    let seen = read_all(&framed(GOOD.as_bytes()));
    assert_eq!(seen, vec![(0, Value::Null, serde_json::from_str(GOOD).unwrap())]);
}

#[test]
fn bodies_that_are_not_json_are_parse_errors() {
    rejects(&framed(b"this is not json"), PARSE_ERROR, Value::Null);
    rejects(&framed(b"{\"jsonrpc\": \"2.0\", \"id\": 1,"), PARSE_ERROR, Value::Null);
    rejects(&framed(b"{\"a\": \"\xff\xfe\"}"), PARSE_ERROR, Value::Null);
    rejects(&framed(b""), PARSE_ERROR, Value::Null);
}

#[test]
fn a_deeply_nested_body_is_a_parse_error() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    rejects(&framed(deep.as_bytes()), PARSE_ERROR, Value::Null);
}

#[test]
fn json_that_is_not_a_message_is_an_invalid_request() {
    rejects(&framed(b"[1, 2]"), INVALID_REQUEST, Value::Null);
    rejects(&framed(b"[]"), INVALID_REQUEST, Value::Null);
    rejects(&framed(b"7"), INVALID_REQUEST, Value::Null);
    rejects(&framed(b"\"shutdown\""), INVALID_REQUEST, Value::Null);
    rejects(&framed(br#"{"jsonrpc":"2.0","id":3,"method":7}"#), INVALID_REQUEST, json!(3));
    rejects(&framed(br#"{"jsonrpc":"2.0","id":"a","method":null}"#), INVALID_REQUEST, json!("a"));
    rejects(&framed(br#"{"jsonrpc":"2.0","id":{},"method":"hover"}"#), INVALID_REQUEST, Value::Null);
    rejects(&framed(br#"{"jsonrpc":"2.0","id":1.5,"method":"hover"}"#), INVALID_REQUEST, Value::Null);
    rejects(&framed(br#"{"jsonrpc":"1.0","id":1,"method":"hover"}"#), INVALID_REQUEST, json!(1));
    rejects(&framed(br#"{"id":1,"method":"hover"}"#), INVALID_REQUEST, json!(1));
}

#[test]
fn duplicate_keys_reach_the_service_once() {
    // tower-lsp refuses a duplicate field when it parses text, which used to end its reader; the
    // message passed on is written from the parsed value, so it holds each key once.
    let seen = read_all(&framed(br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"shutdown"}"#));
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].2, json!({"jsonrpc": "2.0", "id": 2, "method": "shutdown"}));
}

#[test]
fn bad_content_length_headers_are_parse_errors_and_the_next_frame_is_read() {
    let body = GOOD.as_bytes();
    for header in ["abc", "-5", "+5", "", "99999999999999999999999999", "1e3", "0x10"] {
        let mut bad = format!("Content-Length: {header}\r\n\r\n").into_bytes();
        bad.extend_from_slice(body);
        rejects(&bad, PARSE_ERROR, Value::Null);
    }
    // Over the limit: refused before reading the body, which is skipped.
    let mut bad = format!("Content-Length: {}\r\n\r\n", MAX_BODY + 1).into_bytes();
    bad.extend_from_slice(body);
    rejects(&bad, PARSE_ERROR, Value::Null);
    // No Content-Length at all.
    let mut bad = b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n".to_vec();
    bad.extend_from_slice(body);
    rejects(&bad, PARSE_ERROR, Value::Null);
    // A body without any header.
    let mut bad = body.to_vec();
    bad.extend_from_slice(b"\r\n");
    rejects(&bad, PARSE_ERROR, Value::Null);
    // A header line that never ends.
    rejects(&vec![b'x'; 100_000], PARSE_ERROR, Value::Null);
    // Too many headers.
    rejects(&b"X-A: 1\r\n".repeat(100), PARSE_ERROR, Value::Null);
}

/// Input that fails when read: what a client sends only after it has the reply to a bad frame.
struct NotYet;

impl Read for NotYet {
    fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
        Err(io::Error::other("read past the bad frame before replying to it"))
    }
}

#[test]
fn a_bad_frame_is_answered_before_more_input_is_read() {
    for bad in
        [&b"Content-Length: abc\r\n\r\n{}"[..], b"Content-Type: x\r\n\r\n", b"Content-Length: 99999999999\r\n\r\n"]
    {
        let input = std::io::BufReader::new(Cursor::new(bad.to_vec()).chain(NotYet));
        let mut frames = Frames::new(input);
        assert!(matches!(frames.next_message(), Ok(Some(Incoming::Reject(_)))), "{:?}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn other_headers_and_stray_line_breaks_are_accepted() {
    let mut input =
        b"\r\n\r\ncontent-length: 44\r\nContent-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n".to_vec();
    input.extend_from_slice(GOOD.as_bytes());
    input.extend(b"Content-Length: 44\n\n");
    input.extend_from_slice(GOOD.as_bytes());
    let seen = read_all(&input);
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen.iter().all(|s| s.0 == 0 && s.2["method"] == "shutdown"));
}

#[test]
fn input_that_ends_inside_a_frame_ends_the_stream() {
    assert!(read_all(b"").is_empty());
    assert!(read_all(b"Content-Len").is_empty());
    assert!(read_all(b"Content-Length: 44\r\n\r\n{\"jsonrpc\"").is_empty());
    assert!(read_all(b"Content-Length: 100000000000\r\n\r\n{}").len() == 1);
}

#[test]
fn an_unpaired_surrogate_becomes_the_replacement_character() {
    let open = |text: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","method":"textDocument/didOpen","params":{{"textDocument":{{"uri":"file:///a.msl","languageId":"msl","version":1,"text":"{text}"}}}}}}"#
        )
    };
    let text_of = |body: &str| -> String {
        let seen = read_all(&framed(body.as_bytes()));
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0].0, 0, "{body}");
        seen[0].2["params"]["textDocument"]["text"].as_str().unwrap().to_string()
    };
    assert_eq!(text_of(&open(r"a\ud800b")), "a\u{fffd}b");
    assert_eq!(text_of(&open(r"a\uDC00")), "a\u{fffd}");
    assert_eq!(text_of(&open(r"\ud800\ud800\udc00")), "\u{fffd}\u{10000}");
    // A pair is kept, and an escaped backslash does not start an escape.
    assert_eq!(text_of(&open(r"\ud834\udd1e \\ud800")), "\u{1d11e} \\ud800");
    // Outside strings nothing is rewritten: the body is still not JSON.
    rejects(&framed(br#"{"jsonrpc":"2.0","id":1,"method":"x"} \ud800"#), PARSE_ERROR, Value::Null);
}

#[test]
fn output_passes_on_whole_frames_only() {
    let got = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
    let sink = got.clone();
    let mut out = Output::new(Arc::new(move |f: &[u8]| {
        sink.lock().unwrap().push(f.to_vec());
        Ok(())
    }));
    let (a, b) = (framed(b"{\"a\":1}"), framed(b"{\"b\":2}"));
    let mut bytes = a.clone();
    bytes.extend_from_slice(&b);
    bytes.extend_from_slice(&a[..10]);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async {
        use tokio::io::AsyncWriteExt;
        out.write_all(&bytes).await.unwrap();
        assert_eq!(*got.lock().unwrap(), vec![a.clone(), b.clone()]);
        out.write_all(&a[10..]).await.unwrap();
    });
    assert_eq!(*got.lock().unwrap(), vec![a.clone(), b, a]);
}

#[test]
fn input_frames_each_message_for_the_service() {
    let (tx, rx) = mpsc::channel(4);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let read = rt.block_on(async move {
        use tokio::io::AsyncReadExt;
        tx.send(b"{\"a\":1}".to_vec()).await.unwrap();
        tx.send(b"{}".to_vec()).await.unwrap();
        drop(tx);
        let mut all = Vec::new();
        Input::new(rx).read_to_end(&mut all).await.unwrap();
        all
    });
    assert_eq!(read, b"Content-Length: 7\r\n\r\n{\"a\":1}Content-Length: 2\r\n\r\n{}");
}
