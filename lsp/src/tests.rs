//! Tests of the server's state: checks are caught, shared between questions about one version of
//! a document, and dropped with the document.

use super::*;

/// A server's state, with its messages to the client read and dropped (log messages would
/// otherwise fill the channel and wait).
fn inner() -> Arc<Inner> {
    use futures::StreamExt;
    let (service, socket) =
        LspService::new(|client| Backend { inner: Arc::new(Inner::new(client, Arc::new(AtomicBool::new(false)))) });
    tokio::spawn(socket.for_each(|_| async {}));
    service.inner().inner.clone()
}

fn checks_of(uri: &Uri) -> usize {
    check::CHECKED.lock().unwrap().iter().filter(|u| *u == uri.as_str()).count()
}

#[tokio::test]
async fn a_panic_while_answering_is_caught_and_the_server_goes_on() {
    let inner = inner();
    let uri: Uri = "file:///tmp/panic.msl".parse().unwrap();
    let text = "fn main() { let x = ones(2) }".to_string();
    let r: Option<()> =
        inner.with_check(&uri, Source::Text(text.clone()), "test", TIMEOUT, |_, _| panic!("boom")).await.unwrap();
    assert!(r.is_none());
    let n =
        inner.with_check(&uri, Source::Text(text.clone()), "test", TIMEOUT, |c, _| c.diagnostics.len()).await.unwrap();
    assert_eq!(n, Some(0));
    // The same in a document's worker, which keeps serving after the panic.
    inner.set_text(uri.clone(), text, 1);
    let r: Option<()> = inner.query(&uri, "test", |_, _| panic!("boom")).await.unwrap();
    assert!(r.is_none());
    assert_eq!(inner.query(&uri, "test", |c, _| c.diagnostics.len()).await.unwrap(), Some(0));
}

#[tokio::test]
async fn questions_about_one_version_share_its_check() {
    let inner = inner();
    let uri: Uri = "file:///tmp/msl-lsp-shared-check.msl".parse().unwrap();
    inner.set_text(uri.clone(), "fn main() { let x = ones(2)\n print(x) }".to_string(), 1);
    for _ in 0..3 {
        let n = inner.query(&uri, "test", |c, _| c.index.types.len()).await.unwrap();
        assert!(n.is_some_and(|n| n > 0));
    }
    assert_eq!(checks_of(&uri), 1, "three questions, one check");
    inner.set_text(uri.clone(), "fn main() { let y = ones(3)\n print(y) }".to_string(), 2);
    let t = inner.query(&uri, "test", |c, _| c.sources.text(convert::ROOT).to_string()).await.unwrap();
    assert!(t.unwrap().contains("ones(3)"), "a new version is checked anew");
    assert_eq!(checks_of(&uri), 2);
}

#[tokio::test]
async fn a_request_that_gives_up_does_not_cost_a_second_check() {
    let inner = inner();
    let uri: Uri = "file:///tmp/msl-lsp-gave-up.msl".parse().unwrap();
    let mut text = String::from("fn main() {\n    let x0 = ones(3)\n");
    for i in 0..2000 {
        text.push_str(&format!("    let x{} = x{i} + 1.0\n", i + 1));
    }
    text.push_str("    print(x2000)\n}\n");
    inner.set_text(uri.clone(), text, 1);
    let quick = Duration::from_millis(1);
    let r = inner.with_check(&uri, Source::Doc, "test", quick, |c, _| c.diagnostics.len()).await.unwrap();
    assert_eq!(r, None, "a check of 2,000 lines takes longer than a millisecond");
    // The check goes on (or, not started yet, is skipped) and serves the next question.
    assert_eq!(inner.query(&uri, "test", |c, _| c.diagnostics.len()).await.unwrap(), Some(0));
    assert_eq!(checks_of(&uri), 1);
}

#[tokio::test]
async fn closing_a_document_ends_its_worker() {
    let worker = DocWorker::start().unwrap();
    let uri: Uri = "file:///tmp/msl-lsp-closed.msl".parse().unwrap();
    let rx = worker.ask(&uri, Arc::from("fn main() {}"), |c, _| c.diagnostics.len()).unwrap();
    assert_eq!(rx.await.unwrap(), Ok(0));
    let thread = worker.close();
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while !thread.is_finished() {
        assert!(std::time::Instant::now() < end, "the worker did not end");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[cfg(unix)]
#[tokio::test]
async fn unopened_files_are_read_only_when_regular() {
    let inner = inner();
    let dir = std::env::temp_dir().join(format!("msl-lsp-unopened-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("a.msl");
    std::fs::write(&file, "fn main() { print(1) }\n").unwrap();
    let uri = Uri::from_file_path(&file).unwrap();
    let n = inner.query(&uri, "test", |c, _| c.sources.text(convert::ROOT).len()).await.unwrap();
    assert_eq!(n, Some(23));
    // A FIFO without a writer would block the read forever; /dev/zero would never end.
    let fifo = dir.join("fifo.msl");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for path in [fifo.as_path(), std::path::Path::new("/dev/zero")] {
        let uri = Uri::from_file_path(path).unwrap();
        let t = std::time::Instant::now();
        let r = inner.query(&uri, "test", |_, _| ()).await.unwrap();
        assert!(r.is_none(), "{path:?}");
        assert!(t.elapsed() < TIMEOUT / 2, "{path:?} was answered at once, not at the time limit");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
