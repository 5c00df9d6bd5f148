//! The msl language server (`msl lsp`): the LSP over stdio with tower-lsp-server.
//!
//! Input is read and checked frame by frame by `transport` before tower-lsp sees it, so that a
//! malformed message gets an error reply instead of ending the session. Answers come from a check
//! of the document's current text, made on the document's worker thread and kept there until the
//! text changes (`check`); every question runs inside `catch_unwind` and under a time limit, so a
//! panic or a stuck check is logged and answered with "nothing". Diagnostics are published after
//! a short debounce for every open document and for the user files it `use`s; they are the very
//! `Diagnostic` values `msl check` prints.
//!
//! The async side is one thread (a current-thread runtime); checks, the stdin reader and nothing
//! else get threads, each made with `std::thread::Builder` so that a refused thread (under a
//! limit on address space) is an error reply rather than a panic.

mod cache;
mod check;
mod convert;
mod features;
mod transport;
mod worker;

use check::{DocWorker, Outcome, Text};
use lang::check::Checked;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{oneshot, Semaphore};
use tower_lsp_server::jsonrpc::{Error as RpcError, ErrorCode, Result as RpcResult};
use tower_lsp_server::ls_types::*;
use tower_lsp_server::{Client, LanguageServer, LspService, Server};

/// Longest time one check and answer may take before the request is answered without it.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for the diagnostics of a version: nothing waits for them but a background task,
/// so a slow check of a large document still gets its diagnostics published.
const PUBLISH_LIMIT: Duration = Duration::from_secs(600);
/// Quiet time after an edit before diagnostics are recomputed.
const DEBOUNCE: Duration = Duration::from_millis(200);
/// Stack of the thread that reads stdin: it parses JSON, whose nesting is limited to 128.
const READER_STACK: usize = 8 << 20;
/// Frames read ahead of the service.
const READ_AHEAD: usize = 16;

/// Serves the LSP on stdin/stdout until `exit`. Returns the process exit status: 0 when the
/// client sent `shutdown` first, 1 otherwise (as the protocol asks), 2 when it cannot start.
pub fn run() -> u8 {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_time().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the language server: {e}");
            return 2;
        }
    };
    let out = transport::stdout();
    let (tx, rx) = tokio::sync::mpsc::channel(READ_AHEAD);
    let errors = out.clone();
    let reader = std::thread::Builder::new()
        .name("msl-lsp-stdin".to_string())
        .stack_size(READER_STACK)
        .spawn(move || transport::pump(std::io::stdin().lock(), tx, errors));
    if let Err(e) = reader {
        eprintln!("error: cannot start the language server: {e}");
        return 2;
    }
    let shutdown = Arc::new(AtomicBool::new(false));
    let flag = shutdown.clone();
    rt.block_on(async move {
        let (service, socket) = LspService::new(move |client| Backend { inner: Arc::new(Inner::new(client, flag)) });
        Server::new(transport::Input::new(rx), transport::Output::new(out), socket).serve(service).await;
    });
    // The stdin reader and any stuck check would otherwise keep the process alive; they run on
    // threads of their own, which end with the process.
    rt.shutdown_timeout(Duration::from_millis(100));
    u8::from(!shutdown.load(Ordering::SeqCst))
}

struct Doc {
    text: Arc<str>,
    version: i32,
    /// The thread that keeps this document's check (started on the first question).
    worker: Option<DocWorker>,
}

struct Inner {
    client: Client,
    docs: Mutex<HashMap<Uri, Doc>>,
    /// The other files each document published diagnostics to (to clear them later).
    extra: Mutex<HashMap<Uri, Vec<Uri>>>,
    /// Permits for checks of texts that are not open documents.
    one_off: Arc<Semaphore>,
    shutdown: Arc<AtomicBool>,
}

struct Backend {
    inner: Arc<Inner>,
}

/// What a check is of.
enum Source {
    /// The open document's current text (or, when it is not open, the file on disk).
    Doc,
    /// Another text for the document's URI (completion's patched copy).
    Text(String),
}

/// The reply for a request that could not get a thread to check on.
fn no_thread(e: std::io::Error) -> RpcError {
    RpcError {
        code: ErrorCode::InternalError,
        message: format!("msl: cannot start a thread to check the document: {e}").into(),
        data: None,
    }
}

impl Inner {
    fn new(client: Client, shutdown: Arc<AtomicBool>) -> Inner {
        Inner {
            client,
            docs: Mutex::new(HashMap::new()),
            extra: Mutex::new(HashMap::new()),
            one_off: Arc::new(Semaphore::new(check::MAX_ONE_OFF)),
            shutdown,
        }
    }

    fn docs(&self) -> std::sync::MutexGuard<'_, HashMap<Uri, Doc>> {
        self.docs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn version(&self, uri: &Uri) -> Option<i32> {
        self.docs().get(uri).map(|d| d.version)
    }

    /// Sends `f` to the worker of the open document `uri`, starting one if needed (or if the
    /// one it has is stuck).
    fn ask_doc<T, F>(&self, uri: &Uri, f: F) -> std::io::Result<oneshot::Receiver<Outcome<T>>>
    where
        T: Send + 'static,
        F: FnOnce(&Checked, &Uri) -> T + Send + 'static,
    {
        let mut docs = self.docs();
        let doc = docs.get_mut(uri).ok_or_else(|| std::io::Error::other("the document is not open"))?;
        let w = match &mut doc.worker {
            Some(w) if !w.stuck() => w,
            _ => doc.worker.insert(DocWorker::start()?),
        };
        let asked = w.ask(uri, doc.text.clone(), f);
        if asked.is_none() {
            doc.worker = None; // it ended: the next question starts a new one
        }
        asked.ok_or_else(|| std::io::Error::other("the document's worker has ended"))
    }

    /// Checks the document `uri` (or `source`'s text for it) and computes `f` from the result,
    /// on another thread, catching panics and giving up after `limit`. `Ok(None)` when there is
    /// no answer (logged); an error only when no thread could be started.
    async fn with_check<T, F>(
        &self,
        uri: &Uri,
        source: Source,
        what: &str,
        limit: Duration,
        f: F,
    ) -> RpcResult<Option<T>>
    where
        T: Send + 'static,
        F: FnOnce(&Checked, &Uri) -> T + Send + 'static,
    {
        let open = self.docs().contains_key(uri);
        let text = match source {
            Source::Doc if open => {
                return match self.ask_doc(uri, f) {
                    Ok(rx) => self.answer(uri, what, limit, async { Ok(rx) }).await,
                    Err(e) => Err(no_thread(e)),
                };
            }
            Source::Doc => Text::File,
            Source::Text(t) => Text::Given(t),
        };
        let permits = self.one_off.clone();
        let u = uri.clone();
        let start = async move {
            let permit = permits.acquire_owned().await.map_err(std::io::Error::other)?;
            check::one_off(&u, text, f, permit)
        };
        self.answer(uri, what, limit, start).await
    }

    /// Waits (at most `limit`, starting included) for the answer of a check and logs why there
    /// is none. A check that outlasts its request goes on, and is kept for the next question.
    async fn answer<T>(
        &self,
        uri: &Uri,
        what: &str,
        limit: Duration,
        start: impl std::future::Future<Output = std::io::Result<oneshot::Receiver<Outcome<T>>>>,
    ) -> RpcResult<Option<T>> {
        let waited = tokio::time::timeout(limit, async {
            match start.await {
                Ok(rx) => Ok(rx.await),
                Err(e) => Err(e),
            }
        })
        .await;
        let problem = match waited {
            Ok(Ok(Ok(Ok(v)))) => return Ok(Some(v)),
            Ok(Ok(Ok(Err(why)))) => why,
            Ok(Ok(Err(_))) => "was dropped unanswered".to_string(),
            Ok(Err(e)) => return Err(no_thread(e)),
            Err(_) => format!("took longer than {} s; answered without it", limit.as_secs()),
        };
        self.client.log_message(MessageType::ERROR, format!("msl: {what} for {} {problem}", uri.as_str())).await;
        Ok(None)
    }

    /// Checks the document as it is now and runs `f` on the result.
    async fn query<T, F>(&self, uri: &Uri, what: &str, f: F) -> RpcResult<Option<T>>
    where
        T: Send + 'static,
        F: FnOnce(&Checked, &Uri) -> T + Send + 'static,
    {
        self.with_check(uri, Source::Doc, what, TIMEOUT, f).await
    }

    /// Publishes the diagnostics of a document and of the user files it uses.
    async fn publish(&self, uri: Uri) {
        let Some(version) = self.version(&uri) else {
            return;
        };
        // The question takes the document's text right away, with nothing awaited in between,
        // so the check is of this version.
        let Ok(Some(groups)) =
            self.with_check(&uri, Source::Doc, "diagnostics", PUBLISH_LIMIT, convert::diagnostics_by_file).await
        else {
            return;
        };
        if self.version(&uri) != Some(version) {
            return; // a newer edit publishes its own
        }
        let open: Vec<Uri> = self.docs().keys().cloned().collect();
        let mut extra = Vec::new();
        for (u, ds) in groups {
            if u == uri {
                self.client.publish_diagnostics(u, ds, Some(version)).await;
            } else if !open.contains(&u) {
                extra.push(u.clone());
                self.client.publish_diagnostics(u, ds, None).await;
            }
        }
        let old = self.extra.lock().unwrap_or_else(|e| e.into_inner()).insert(uri, extra.clone()).unwrap_or_default();
        for u in old.into_iter().filter(|u| !extra.contains(u) && !open.contains(u)) {
            self.client.publish_diagnostics(u, vec![], None).await;
        }
    }

    /// Publishes after `delay` unless the document changed again meanwhile.
    fn schedule(self: &Arc<Self>, uri: Uri, delay: Duration) {
        let inner = self.clone();
        tokio::spawn(async move {
            let v = inner.version(&uri);
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if inner.version(&uri) == v && v.is_some() {
                inner.publish(uri).await;
            }
        });
    }

    /// Sets the text of an open document, keeping its worker (which notices the new text).
    fn set_text(&self, uri: Uri, text: String, version: i32) {
        let mut docs = self.docs();
        let worker = docs.remove(&uri).and_then(|d| d.worker);
        docs.insert(uri, Doc { text: text.into(), version, worker });
    }
}

impl LanguageServer for Backend {
    async fn initialize(&self, _: InitializeParams) -> RpcResult<InitializeResult> {
        Ok(InitializeResult {
            server_info: Some(ServerInfo {
                name: "msl".to_string(),
                version: Some(env!("CARGO_PKG_VERSION").to_string()),
            }),
            capabilities: ServerCapabilities {
                text_document_sync: Some(TextDocumentSyncCapability::Options(TextDocumentSyncOptions {
                    open_close: Some(true),
                    change: Some(TextDocumentSyncKind::FULL),
                    save: Some(TextDocumentSyncSaveOptions::SaveOptions(SaveOptions { include_text: Some(true) })),
                    ..Default::default()
                })),
                hover_provider: Some(HoverProviderCapability::Simple(true)),
                definition_provider: Some(OneOf::Left(true)),
                references_provider: Some(OneOf::Left(true)),
                document_symbol_provider: Some(OneOf::Left(true)),
                inlay_hint_provider: Some(OneOf::Left(true)),
                completion_provider: Some(CompletionOptions {
                    trigger_characters: Some(vec![".".to_string()]),
                    ..Default::default()
                }),
                signature_help_provider: Some(SignatureHelpOptions {
                    trigger_characters: Some(vec!["(".to_string(), ",".to_string()]),
                    retrigger_characters: None,
                    work_done_progress_options: Default::default(),
                }),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    async fn initialized(&self, _: InitializedParams) {
        self.inner.client.log_message(MessageType::INFO, "msl language server ready").await;
    }

    async fn shutdown(&self) -> RpcResult<()> {
        self.inner.shutdown.store(true, Ordering::SeqCst);
        Ok(())
    }

    async fn did_open(&self, p: DidOpenTextDocumentParams) {
        let uri = p.text_document.uri;
        self.inner.set_text(uri.clone(), p.text_document.text, p.text_document.version);
        self.inner.schedule(uri, Duration::ZERO);
    }

    async fn did_change(&self, p: DidChangeTextDocumentParams) {
        let uri = p.text_document.uri;
        // Full synchronisation: the last change holds the whole text.
        let Some(change) = p.content_changes.into_iter().last() else {
            return;
        };
        self.inner.set_text(uri.clone(), change.text, p.text_document.version);
        self.inner.schedule(uri, DEBOUNCE);
    }

    async fn did_save(&self, p: DidSaveTextDocumentParams) {
        if let Some(text) = p.text {
            if let Some(d) = self.inner.docs().get_mut(&p.text_document.uri) {
                // The same text keeps its check.
                if *d.text != *text {
                    d.text = text.into();
                }
            }
        }
        // Files that use the saved one may change too.
        let open: Vec<Uri> = self.inner.docs().keys().cloned().collect();
        for u in open {
            self.inner.schedule(u, Duration::ZERO);
        }
    }

    async fn did_close(&self, p: DidCloseTextDocumentParams) {
        let uri = p.text_document.uri;
        // Dropping the document drops its worker's channel: the worker ends, and with it the
        // check it kept.
        self.inner.docs().remove(&uri);
        let extra = self.inner.extra.lock().unwrap_or_else(|e| e.into_inner()).remove(&uri).unwrap_or_default();
        for u in extra.into_iter().chain(std::iter::once(uri)) {
            self.inner.client.publish_diagnostics(u, vec![], None).await;
        }
    }

    async fn hover(&self, p: HoverParams) -> RpcResult<Option<Hover>> {
        let pos = p.text_document_position_params.position;
        let uri = p.text_document_position_params.text_document.uri;
        Ok(self.inner.query(&uri, "hover", move |c, _| features::hover(c, pos)).await?.flatten())
    }

    async fn goto_definition(&self, p: GotoDefinitionParams) -> RpcResult<Option<GotoDefinitionResponse>> {
        let pos = p.text_document_position_params.position;
        let uri = p.text_document_position_params.text_document.uri;
        Ok(self.inner.query(&uri, "definition", move |c, root| features::definition(c, root, pos)).await?.flatten())
    }

    async fn references(&self, p: ReferenceParams) -> RpcResult<Option<Vec<Location>>> {
        let pos = p.text_document_position.position;
        let uri = p.text_document_position.text_document.uri;
        let decl = p.context.include_declaration;
        self.inner.query(&uri, "references", move |c, root| features::references(c, root, pos, decl)).await
    }

    async fn document_symbol(&self, p: DocumentSymbolParams) -> RpcResult<Option<DocumentSymbolResponse>> {
        let syms = self.inner.query(&p.text_document.uri, "symbols", |c, _| features::document_symbols(c)).await?;
        Ok(syms.map(DocumentSymbolResponse::Nested))
    }

    async fn inlay_hint(&self, p: InlayHintParams) -> RpcResult<Option<Vec<InlayHint>>> {
        let range = p.range;
        self.inner.query(&p.text_document.uri, "inlay hints", move |c, _| features::inlay_hints(c, range)).await
    }

    async fn completion(&self, p: CompletionParams) -> RpcResult<Option<CompletionResponse>> {
        let pos = p.text_document_position.position;
        let uri = p.text_document_position.text_document.uri;
        let Some(text) = self.inner.docs().get(&uri).map(|d| d.text.clone()) else {
            return Ok(None);
        };
        // Right after a `.` the text rarely parses: complete a placeholder member so that the
        // checker types the receiver (the placeholder itself is never offered). Otherwise the
        // document's own check answers.
        let offset = convert::offset_in(&text, pos);
        let complete = move |c: &Checked, _: &Uri| features::completions(c, offset);
        let items = if text[..offset].ends_with('.') {
            let mut patched = text.to_string();
            patched.insert_str(offset, "__complete");
            self.inner.with_check(&uri, Source::Text(patched), "completion", TIMEOUT, complete).await?
        } else {
            self.inner.query(&uri, "completion", complete).await?
        };
        Ok(items.map(CompletionResponse::Array))
    }

    async fn signature_help(&self, p: SignatureHelpParams) -> RpcResult<Option<SignatureHelp>> {
        let pos = p.text_document_position_params.position;
        let uri = p.text_document_position_params.text_document.uri;
        Ok(self.inner.query(&uri, "signature help", move |c, _| features::signature_help(c, pos)).await?.flatten())
    }
}

#[cfg(test)]
mod tests;
