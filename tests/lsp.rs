//! Drives `msl lsp` over stdio with JSON-RPC, as an editor does: initialize, open a document,
//! get its diagnostics, hover, go to definition, complete, ask for inlay hints and signature
//! help, break the code half-way through an edit, then shut down and exit. Then as a hostile
//! client does: malformed frames and messages, special files, a planted link in the stdlib
//! cache, and a limit on address space; the server must answer and go on each time.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(30);

struct Client {
    child: Child,
    stdin: Option<ChildStdin>,
    rx: Receiver<Value>,
    next_id: i64,
    /// Messages read while waiting for something else.
    backlog: Vec<Value>,
}

/// A scratch folder for one test, made anew.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("msl-lsp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

impl Client {
    /// `msl lsp`, with the stdlib cache in a scratch folder rather than the user's own.
    fn start() -> Client {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_msl"));
        static N: AtomicUsize = AtomicUsize::new(0);
        cmd.arg("lsp").env("XDG_CACHE_HOME", scratch(&format!("cache{}", N.fetch_add(1, Ordering::Relaxed))));
        Client::spawn(cmd)
    }

    fn spawn(mut cmd: Command) -> Client {
        let mut child =
            cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("start msl lsp");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                let mut len = None;
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let line = line.trim_end();
                    if line.is_empty() {
                        break;
                    }
                    if let Some(v) = line.strip_prefix("Content-Length: ") {
                        len = v.parse::<usize>().ok();
                    }
                }
                let mut body = vec![0; len.expect("Content-Length header")];
                if r.read_exact(&mut body).is_err() {
                    return;
                }
                let v: Value = serde_json::from_slice(&body).expect("a JSON message");
                if tx.send(v).is_err() {
                    return;
                }
            }
        });
        let stdin = child.stdin.take();
        Client { child, stdin, rx, next_id: 1, backlog: vec![] }
    }

    fn send(&mut self, v: Value) {
        let body = v.to_string();
        self.send_raw(format!("Content-Length: {}\r\n\r\n{body}", body.len()).as_bytes());
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        let s = self.stdin.as_mut().expect("stdin open");
        s.write_all(bytes).unwrap();
        s.flush().unwrap();
    }

    fn notify(&mut self, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// The first message (new or from the backlog) that `pred` accepts.
    fn wait(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(i) = self.backlog.iter().position(&pred) {
            return self.backlog.remove(i);
        }
        let end = Instant::now() + TIMEOUT;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let v = self.rx.recv_timeout(left).unwrap_or_else(|_| panic!("timed out waiting for {what}"));
            if pred(&v) {
                return v;
            }
            self.backlog.push(v);
        }
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let v = self.wait(method, |m| m["id"] == json!(id));
        assert!(v.get("error").is_none(), "{method} failed: {v}");
        v["result"].clone()
    }

    /// The next diagnostics published for `uri` with the given document version.
    fn diagnostics(&mut self, uri: &str, version: i64) -> Vec<Value> {
        let v = self.wait("diagnostics", |m| {
            m["method"] == "textDocument/publishDiagnostics"
                && m["params"]["uri"] == uri
                && m["params"]["version"] == version
        });
        v["params"]["diagnostics"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const GOOD: &str = "use nn.{linear, relu}

/// Doubles a tensor.
fn double[N](x: f32[N, 4]) -> f32[N, 4] {
    let y = x * 2.0
    y
}

model Lin[I, O] {
    w: f32[I, O] = glorot_uniform(I, O)
    b: f32[O] = zeros(O)
}

fn main() {
    let a = ones(3, 4)
    let b = double(a)
    let m = init(Lin[4, 2], seed: 0)
    /* 𝄞 */ let c = linear(b, m.w, m.b)
    print(c)
}
";

/// (line, UTF-16 column) of the `nth` occurrence of `needle`, plus `extra` bytes (ASCII).
fn pos(text: &str, needle: &str, nth: usize, extra: usize) -> (u64, u64) {
    let at = text.match_indices(needle).nth(nth).unwrap_or_else(|| panic!("no {needle:?}")).0 + extra;
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let line = text[..at].matches('\n').count();
    (line as u64, text[line_start..at].encode_utf16().count() as u64)
}

fn td(uri: &str, (line, character): (u64, u64)) -> Value {
    json!({"textDocument": {"uri": uri}, "position": {"line": line, "character": character}})
}

#[test]
fn lsp_session_over_stdio() {
    let dir = std::env::temp_dir().join(format!("msl-lsp-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("main.msl");
    let uri = format!("file://{}", path.display());
    let mut c = Client::start();

    let init = c.request("initialize", json!({"processId": null, "rootUri": null, "capabilities": {}}));
    let caps = &init["capabilities"];
    for cap in
        ["hoverProvider", "definitionProvider", "completionProvider", "inlayHintProvider", "signatureHelpProvider"]
    {
        assert!(!caps[cap].is_null(), "missing {cap}: {init}");
    }
    c.notify("initialized", json!({}));

    // A shape error, after a 4-byte character on the same line: the column counts UTF-16 units.
    let broken = GOOD.replace("linear(b, m.w, m.b)", "b @ b");
    c.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": uri, "languageId": "msl", "version": 1, "text": broken}}),
    );
    let ds = c.diagnostics(&uri, 1);
    assert_eq!(ds.len(), 1, "{ds:?}");
    let d = &ds[0];
    assert_eq!(d["code"], "E0301");
    assert!(d["message"].as_str().unwrap().contains("4 vs 3"), "{d}");
    let (line, col) = pos(&broken, "b @ b", 0, 0);
    assert_eq!(d["range"]["start"]["line"], line);
    assert_eq!(d["range"]["start"]["character"], col, "UTF-16 column: {d}");
    assert!(!d["relatedInformation"].as_array().unwrap().is_empty(), "secondary labels as related information: {d}");

    // Fixed: the diagnostics go away.
    c.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": uri, "version": 2}, "contentChanges": [{"text": GOOD}]}),
    );
    assert!(c.diagnostics(&uri, 2).is_empty());

    // Hover: the symbolic shape of a binding, and a function's signature, doc and instance.
    let h = c.request("textDocument/hover", td(&uri, pos(GOOD, "y = x", 0, 0)));
    let text = h["contents"]["value"].as_str().unwrap();
    assert!(text.contains("y: f32[N, 4]"), "{h}");
    let h = c.request("textDocument/hover", td(&uri, pos(GOOD, "double(a)", 0, 1)));
    let text = h["contents"]["value"].as_str().unwrap();
    assert!(text.contains("fn double[N](x: f32[N, 4]) -> f32[N, 4]"), "{h}");
    assert!(text.contains("Doubles a tensor."), "{h}");
    assert!(text.contains("N = 3"), "{h}");
    let h = c.request("textDocument/hover", td(&uri, pos(GOOD, "c = linear", 0, 0)));
    assert!(h["contents"]["value"].as_str().unwrap().contains("c: f32[3, 2]"), "{h}");

    // Go to definition: a local, a function, a model field, and into the stdlib.
    let d = c.request("textDocument/definition", td(&uri, pos(GOOD, "y\n}", 0, 0)));
    assert_eq!(d["uri"], uri);
    assert_eq!(
        (d["range"]["start"]["line"].as_u64().unwrap(), d["range"]["start"]["character"].as_u64().unwrap()),
        pos(GOOD, "y = x", 0, 0)
    );
    let d = c.request("textDocument/definition", td(&uri, pos(GOOD, "double(a)", 0, 0)));
    assert_eq!(d["range"]["start"]["line"].as_u64().unwrap(), pos(GOOD, "double[N]", 0, 0).0);
    let d = c.request("textDocument/definition", td(&uri, pos(GOOD, "linear(b", 0, 0)));
    let target = d["uri"].as_str().unwrap();
    assert!(target.ends_with("/nn.msl"), "{d}");
    let stdlib = std::fs::read_to_string(target.trim_start_matches("file://"))
        .expect("the stdlib file is written for the editor");
    assert!(stdlib.contains("fn linear"));

    // References of a local.
    let r = c.request("textDocument/references", json!({"textDocument": {"uri": uri}, "position": {"line": pos(GOOD, "b = double", 0, 0).0, "character": pos(GOOD, "b = double", 0, 0).1}, "context": {"includeDeclaration": true}}));
    assert_eq!(r.as_array().unwrap().len(), 2, "{r}");

    // Inlay hints after every untyped `let`.
    let hints = c.request("textDocument/inlayHint", json!({"textDocument": {"uri": uri}, "range": {"start": {"line": 0, "character": 0}, "end": {"line": 100, "character": 0}}}));
    let labels: Vec<&str> = hints.as_array().unwrap().iter().map(|h| h["label"].as_str().unwrap()).collect();
    for want in [": f32[N, 4]", ": f32[3, 4]", ": Lin[4, 2]", ": f32[3, 2]"] {
        assert!(labels.contains(&want), "no hint {want}: {labels:?}");
    }

    // Document symbols.
    let syms = c.request("textDocument/documentSymbol", json!({"textDocument": {"uri": uri}}));
    let names: Vec<&str> = syms.as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["double", "Lin", "main"]);

    // Completion after `m.` in half-typed code: the model's fields.
    let typing = GOOD.replace("    print(c)\n", "    print(c)\n    let z = m.\n");
    c.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": uri, "version": 3}, "contentChanges": [{"text": typing}]}),
    );
    let (l, ch) = pos(&typing, "m.\n", 0, 2);
    let items = c.request("textDocument/completion", td(&uri, (l, ch)));
    let labels: Vec<&str> = items.as_array().unwrap().iter().map(|i| i["label"].as_str().unwrap()).collect();
    assert_eq!(labels, ["w", "b"], "{items}");
    let items = c.request("textDocument/completion", td(&uri, pos(GOOD, "print(c)", 0, 0)));
    let labels: Vec<&str> = items.as_array().unwrap().iter().map(|i| i["label"].as_str().unwrap()).collect();
    for want in ["a", "b", "m", "double", "Lin", "linear", "zeros", "for"] {
        assert!(labels.contains(&want), "no completion {want}: {labels:?}");
    }

    // Signature help inside a call.
    let calling = GOOD.replace("    print(c)\n", "    print(c)\n    let q = double(\n");
    c.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": uri, "version": 4}, "contentChanges": [{"text": calling}]}),
    );
    let s = c.request("textDocument/signatureHelp", td(&uri, pos(&calling, "double(\n", 0, 7)));
    assert_eq!(s["signatures"][0]["label"], "fn double[N](x: f32[N, 4]) -> f32[N, 4]", "{s}");

    // Broken half-way through an edit: every request still answers, diagnostics still arrive.
    let half =
        GOOD.replace("let b = double(a)", "let b = double(a @ [1, (").replace("model Lin[I, O] {", "model Lin[I, O");
    c.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": uri, "version": 5}, "contentChanges": [{"text": half}]}),
    );
    for (l, ch) in [(0, 0), (5, 4), (15, 20), (19, 3), (99, 0)] {
        c.request("textDocument/hover", td(&uri, (l, ch)));
        c.request("textDocument/completion", td(&uri, (l, ch)));
        c.request("textDocument/signatureHelp", td(&uri, (l, ch)));
        c.request("textDocument/definition", td(&uri, (l, ch)));
    }
    c.request("textDocument/inlayHint", json!({"textDocument": {"uri": uri}, "range": {"start": {"line": 0, "character": 0}, "end": {"line": 100, "character": 0}}}));
    let ds = c.diagnostics(&uri, 5);
    assert!(!ds.is_empty());
    assert!(ds.iter().all(|d| d["code"].as_str().unwrap().starts_with("E01")), "syntax errors: {ds:?}");

    // Shutdown, exit: the process ends, with status 0.
    assert_eq!(c.request("shutdown", Value::Null), Value::Null);
    // stdin stays open: the server must exit on `exit`, not on end of input.
    c.notify("exit", Value::Null);
    let end = Instant::now() + TIMEOUT;
    loop {
        if let Some(status) = c.child.try_wait().unwrap() {
            assert_eq!(status.code(), Some(0));
            break;
        }
        assert!(Instant::now() < end, "msl lsp did not exit after `exit`");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn used_files_get_diagnostics_and_definitions() {
    let dir = std::env::temp_dir().join(format!("msl-lsp-use-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("layers.msl"),
        "/// Scales by two.\nfn scale[N](x: f32[N]) -> f32[N] { x * 2.0 }\n\nfn wrong(x: f32[3]) -> f32[4] { x }\n",
    )
    .unwrap();
    let main = "use \"./layers.msl\"\n\nfn main() {\n    let y = layers.scale(ones(5))\n    print(y)\n}\n";
    let path = dir.join("main.msl");
    std::fs::write(&path, main).unwrap();
    let uri = format!("file://{}", path.display());
    let used = format!("file://{}", dir.join("layers.msl").display());
    let mut c = Client::start();
    c.request("initialize", json!({"processId": null, "rootUri": null, "capabilities": {}}));
    c.notify("initialized", json!({}));
    c.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": uri, "languageId": "msl", "version": 1, "text": main}}),
    );
    assert!(c.diagnostics(&uri, 1).is_empty());
    // The used file's own error is published to it, though it is not open.
    let v = c.wait("diagnostics of the used file", |m| {
        m["method"] == "textDocument/publishDiagnostics" && m["params"]["uri"] == used.as_str()
    });
    let ds = v["params"]["diagnostics"].as_array().unwrap();
    assert_eq!(ds.len(), 1, "{v}");
    assert_eq!(ds[0]["range"]["start"]["line"], 3);
    // Hover and definition reach into it.
    let h = c.request("textDocument/hover", td(&uri, pos(main, "scale(", 0, 1)));
    let text = h["contents"]["value"].as_str().unwrap();
    assert!(
        text.contains("fn scale[N](x: f32[N]) -> f32[N]") && text.contains("N = 5") && text.contains("Scales by two."),
        "{h}"
    );
    let d = c.request("textDocument/definition", td(&uri, pos(main, "scale(", 0, 1)));
    assert_eq!(d["uri"], used.as_str());
    assert_eq!(d["range"]["start"]["line"], 1);
    c.request("shutdown", Value::Null);
    c.notify("exit", Value::Null);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A body with its header.
fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = format!("Content-Length: {}\r\n\r\n", body.len()).into_bytes();
    f.extend_from_slice(body);
    f
}

impl Client {
    /// Waits for the error reply to a bad frame: its code and id.
    fn error_reply(&mut self, what: &str) -> (i64, Value) {
        let v = self.wait(what, |m| m.get("error").is_some() && m.get("method").is_none());
        (v["error"]["code"].as_i64().unwrap(), v["id"].clone())
    }

    /// A request the server answers without checking anything (an unknown method), to show that
    /// it still reads and serves the next message.
    fn ping(&mut self) {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": "msl/ping"}));
        let v = self.wait("the answer to a ping", |m| m["id"] == json!(id));
        assert_eq!(v["error"]["code"], -32601, "method not found: {v}");
    }
}

// Uses FIFOs, links, modes or `ulimit`: Unix only.
#[cfg(unix)]
#[test]
fn hostile_messages_get_error_replies_and_the_server_goes_on() {
    let mut c = Client::start();
    c.request("initialize", json!({"processId": null, "rootUri": null, "capabilities": {}}));
    c.notify("initialized", json!({}));
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let cases: Vec<(&str, Vec<u8>, i64, Value)> = vec![
        ("a body that is not JSON", frame(b"hello"), -32700, Value::Null),
        ("a JSON array", frame(b"[1, 2, 3]"), -32600, Value::Null),
        ("a JSON number", frame(b"42"), -32600, Value::Null),
        ("a method that is a number", frame(br#"{"jsonrpc":"2.0","id":5,"method":7}"#), -32600, json!(5)),
        ("an id that is an object", frame(br#"{"jsonrpc":"2.0","id":{},"method":"shutdown"}"#), -32600, Value::Null),
        ("invalid UTF-8", frame(b"{\"jsonrpc\":\"2.0\",\"method\":\"\xff\xfe\"}"), -32700, Value::Null),
        ("a 100,000-deep array", frame(deep.as_bytes()), -32700, Value::Null),
        ("a Content-Length that is not a number", b"Content-Length: abc\r\n\r\n{}".to_vec(), -32700, Value::Null),
        ("a negative Content-Length", b"Content-Length: -5\r\n\r\n{}".to_vec(), -32700, Value::Null),
        (
            "a Content-Length past u64",
            b"Content-Length: 99999999999999999999999\r\n\r\n{}".to_vec(),
            -32700,
            Value::Null,
        ),
        // 1 TB is refused without reading (or allocating) it, and the frame after it is read.
        ("a huge Content-Length", b"Content-Length: 1000000000000\r\n\r\n{}".to_vec(), -32700, Value::Null),
        ("no Content-Length", b"Content-Type: x\r\n\r\n{}".to_vec(), -32700, Value::Null),
    ];
    for (what, bytes, code, id) in cases {
        c.send_raw(&bytes);
        assert_eq!(c.error_reply(what), (code, id), "{what}");
        c.ping();
    }

    // An unpaired surrogate in a document becomes U+FFFD; the document is served.
    let uri = "file:///tmp/msl-lsp-surrogate.msl";
    let open = format!(
        r#"{{"jsonrpc":"2.0","method":"textDocument/didOpen","params":{{"textDocument":{{"uri":"{uri}","languageId":"msl","version":1,"text":"fn main() {{\n    let a = ones(3)\n    print(a) // \ud800\n}}\n"}}}}}}"#
    );
    c.send_raw(&frame(open.as_bytes()));
    assert!(c.diagnostics(uri, 1).is_empty(), "the comment holds U+FFFD, which is fine");
    let h = c.request("textDocument/hover", td(uri, (1, 8)));
    assert!(h["contents"]["value"].as_str().unwrap().contains("a: f32[3]"), "{h}");

    // Unopened special files are not read: /dev/zero never ends, a FIFO without a writer blocks.
    let dir = scratch("special");
    let fifo = dir.join("fifo.msl");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    for path in ["/dev/zero".to_string(), fifo.display().to_string()] {
        let t = Instant::now();
        let h = c.request("textDocument/hover", td(&format!("file://{path}"), (0, 0)));
        assert_eq!(h, Value::Null, "{path}");
        assert!(t.elapsed() < Duration::from_secs(5), "{path} answered at once");
    }
    let _ = std::fs::remove_dir_all(&dir);

    assert_eq!(c.request("shutdown", Value::Null), Value::Null);
    c.notify("exit", Value::Null);
}

// Uses FIFOs, links, modes or `ulimit`: Unix only.
#[cfg(unix)]
#[test]
fn the_stdlib_cache_is_private_and_never_written_through_a_link() {
    let dir = scratch("planted");
    let (cache, tmp) = (dir.join("cache"), dir.join("tmp"));
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, "mine").unwrap();
    // Links where the stdlib module would be written: in the shared temp folder the server used
    // before (where anyone can make them), and in the private cache folder.
    let version = env!("CARGO_PKG_VERSION");
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    for d in [tmp.join(format!("msl-stdlib-{version}")), cache.join(format!("msl/stdlib-{version}"))] {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&d).unwrap();
        std::os::unix::fs::symlink(&victim, d.join("nn.msl")).unwrap();
    }
    let text = "use nn.linear\n\nfn main() {\n    print(linear(ones(2, 3), ones(3, 4), ones(4)))\n}\n";
    let uri = format!("file://{}", dir.join("main.msl").display());
    let definition_of_linear = |cache: &PathBuf| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_msl"));
        cmd.arg("lsp").env("XDG_CACHE_HOME", cache).env("TMPDIR", &tmp);
        let mut c = Client::spawn(cmd);
        c.request("initialize", json!({"processId": null, "rootUri": null, "capabilities": {}}));
        c.notify(
            "textDocument/didOpen",
            json!({"textDocument": {"uri": uri, "languageId": "msl", "version": 1, "text": text}}),
        );
        c.request("textDocument/definition", td(&uri, pos(text, "linear(", 0, 0)))
    };
    assert_eq!(definition_of_linear(&cache), Value::Null, "no definition rather than a write through the link");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "mine");
    // Without the link the module is written, into a folder only this user can open.
    let fresh = dir.join("fresh");
    let d = definition_of_linear(&fresh);
    let target = PathBuf::from(d["uri"].as_str().unwrap().trim_start_matches("file://"));
    assert!(target.starts_with(&fresh), "{target:?}");
    assert!(std::fs::read_to_string(&target).unwrap().contains("fn linear"));
    let mode = |p: &std::path::Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(target.parent().unwrap()), 0o700);
    assert_eq!(mode(&target), 0o600);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "mine");
    let _ = std::fs::remove_dir_all(&dir);
}

// Uses FIFOs, links, modes or `ulimit`: Unix only.
#[cfg(unix)]
#[test]
fn answers_under_a_limit_on_address_space() {
    // Two kernel threads, as on a two-core machine, whatever this one has: each reserves a 1 GiB
    // stack (src/main.rs), which leaves the server about 800 MiB of the 3 GB.
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(format!("ulimit -v 3000000; exec {} lsp", env!("CARGO_BIN_EXE_msl")))
        .env("RAYON_NUM_THREADS", "2");
    let mut c = Client::spawn(cmd);
    let init = c.request("initialize", json!({"processId": null, "rootUri": null, "capabilities": {}}));
    assert!(!init["capabilities"]["hoverProvider"].is_null(), "{init}");
    c.notify("initialized", json!({}));
    let uri = "file:///tmp/msl-lsp-ulimit.msl";
    let text = "fn main() {\n    let a = ones(3)\n    print(a)\n}\n";
    c.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": uri, "languageId": "msl", "version": 1, "text": text}}),
    );
    // A check needs a thread with a large stack: it gets a smaller one, or the request an error.
    let id = c.next_id;
    c.next_id += 1;
    c.send(json!({"jsonrpc": "2.0", "id": id, "method": "textDocument/hover", "params": td(uri, (1, 8))}));
    let v = c.wait("hover", |m| m["id"] == json!(id));
    let answered = v["result"]["contents"]["value"].as_str().is_some_and(|s| s.contains("a: f32[3]"));
    assert!(answered || v["error"]["code"] == -32603, "{v}");
    assert_eq!(c.request("shutdown", Value::Null), Value::Null);
}
