//! The msl language server (`msl lsp`): the LSP over stdio with tower-lsp-server.
//!
//! Every answer comes from a fresh check of the document's current text (checking is fast, and
//! the checker's results are not `Send`): the check and the answer run together on a blocking
//! thread with a large stack, inside `catch_unwind` and under a time limit. A panic or a stuck
//! check is logged and answered with "nothing", so no input can crash or stall the session.
//! Diagnostics are published after a short debounce for every open document and for the
//! user files it `use`s; they are the very `Diagnostic` values `msl check` prints.

mod convert;
mod features;

use lang::check::Checked;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_lsp_server::jsonrpc::Result as RpcResult;
use tower_lsp_server::ls_types::*;
use tower_lsp_server::{Client, LanguageServer, LspService, Server};

/// Stack of the threads that check: the checker recurses once per nesting level.
const STACK: usize = 512 << 20;
/// Longest time one check and answer may take before the request is answered without it.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Quiet time after an edit before diagnostics are recomputed.
const DEBOUNCE: Duration = Duration::from_millis(200);

/// Serves the LSP on stdin/stdout until `exit`. Returns the process exit status: 0 when the
/// client sent `shutdown` first, 1 otherwise (as the protocol asks).
pub fn run() -> u8 {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(16)
        .thread_stack_size(STACK)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the language server: {e}");
            return 2;
        }
    };
    let shutdown = Arc::new(AtomicBool::new(false));
    let flag = shutdown.clone();
    rt.block_on(async move {
        let (service, socket) = LspService::new(move |client| Backend { inner: Arc::new(Inner::new(client, flag)) });
        Server::new(tokio::io::stdin(), tokio::io::stdout(), socket).serve(service).await;
    });
    // The stdin reader and any stuck check would otherwise keep the process alive.
    rt.shutdown_timeout(Duration::from_millis(100));
    u8::from(!shutdown.load(Ordering::SeqCst))
}

struct Doc {
    text: String,
    version: i32,
}

struct Inner {
    client: Client,
    docs: Mutex<HashMap<Uri, Doc>>,
    /// The other files each document published diagnostics to (to clear them later).
    extra: Mutex<HashMap<Uri, Vec<Uri>>>,
    shutdown: Arc<AtomicBool>,
}

struct Backend {
    inner: Arc<Inner>,
}

/// Where a document lives: its name for diagnostics and the folder its `use "…"` paths start from.
fn doc_location(uri: &Uri) -> (String, PathBuf) {
    let cwd = std::env::current_dir().unwrap_or_default();
    match uri.to_file_path() {
        Some(p) if p.is_absolute() => {
            let dir = p.parent().map(|d| d.to_path_buf()).unwrap_or(cwd);
            (p.display().to_string(), dir)
        }
        _ => (uri.as_str().to_string(), cwd),
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default()
}

impl Inner {
    fn new(client: Client, shutdown: Arc<AtomicBool>) -> Inner {
        Inner { client, docs: Mutex::new(HashMap::new()), extra: Mutex::new(HashMap::new()), shutdown }
    }

    fn docs(&self) -> std::sync::MutexGuard<'_, HashMap<Uri, Doc>> {
        self.docs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn text(&self, uri: &Uri) -> Option<(String, i32)> {
        self.docs().get(uri).map(|d| (d.text.clone(), d.version))
    }

    fn version(&self, uri: &Uri) -> Option<i32> {
        self.docs().get(uri).map(|d| d.version)
    }

    /// Checks `text` as the document `uri` and computes `f` from the result, on a blocking
    /// thread, catching panics and giving up after `TIMEOUT`.
    async fn with_check<T, F>(&self, uri: &Uri, text: String, what: &str, f: F) -> Option<T>
    where
        T: Send + 'static,
        F: FnOnce(&Checked, &Uri) -> T + Send + 'static,
    {
        let root = uri.clone();
        let task = tokio::task::spawn_blocking(move || {
            std::panic::catch_unwind(AssertUnwindSafe(|| {
                let (name, dir) = doc_location(&root);
                let c = lang::check::check_source(&name, &text, &dir);
                f(&c, &root)
            }))
        });
        let problem = match tokio::time::timeout(TIMEOUT, task).await {
            Ok(Ok(Ok(v))) => return Some(v),
            Ok(Ok(Err(p))) => format!("panicked: {}", panic_message(&*p)),
            Ok(Err(e)) => format!("failed: {e}"),
            Err(_) => format!("took longer than {} s; answered without it", TIMEOUT.as_secs()),
        };
        self.client.log_message(MessageType::ERROR, format!("msl: {what} for {} {problem}", uri.as_str())).await;
        None
    }

    /// Checks the document as it is now and runs `f` on the result.
    async fn query<T, F>(&self, uri: &Uri, what: &str, f: F) -> Option<T>
    where
        T: Send + 'static,
        F: FnOnce(&Checked, &Uri) -> T + Send + 'static,
    {
        let (text, _) = self.text(uri).or_else(|| {
            let p = uri.to_file_path()?;
            Some((std::fs::read_to_string(&*p).ok()?, 0))
        })?;
        self.with_check(uri, text, what, f).await
    }

    /// Publishes the diagnostics of a document and of the user files it uses.
    async fn publish(&self, uri: Uri) {
        let Some((text, version)) = self.text(&uri) else {
            return;
        };
        let Some(groups) = self.with_check(&uri, text, "diagnostics", convert::diagnostics_by_file).await else {
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
        self.inner.docs().insert(uri.clone(), Doc { text: p.text_document.text, version: p.text_document.version });
        self.inner.schedule(uri, Duration::ZERO);
    }

    async fn did_change(&self, p: DidChangeTextDocumentParams) {
        let uri = p.text_document.uri;
        // Full synchronisation: the last change holds the whole text.
        let Some(change) = p.content_changes.into_iter().last() else {
            return;
        };
        self.inner.docs().insert(uri.clone(), Doc { text: change.text, version: p.text_document.version });
        self.inner.schedule(uri, DEBOUNCE);
    }

    async fn did_save(&self, p: DidSaveTextDocumentParams) {
        if let Some(text) = p.text {
            if let Some(d) = self.inner.docs().get_mut(&p.text_document.uri) {
                d.text = text;
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
        self.inner.docs().remove(&uri);
        let extra = self.inner.extra.lock().unwrap_or_else(|e| e.into_inner()).remove(&uri).unwrap_or_default();
        for u in extra.into_iter().chain(std::iter::once(uri)) {
            self.inner.client.publish_diagnostics(u, vec![], None).await;
        }
    }

    async fn hover(&self, p: HoverParams) -> RpcResult<Option<Hover>> {
        let pos = p.text_document_position_params.position;
        let uri = p.text_document_position_params.text_document.uri;
        Ok(self.inner.query(&uri, "hover", move |c, _| features::hover(c, pos)).await.flatten())
    }

    async fn goto_definition(&self, p: GotoDefinitionParams) -> RpcResult<Option<GotoDefinitionResponse>> {
        let pos = p.text_document_position_params.position;
        let uri = p.text_document_position_params.text_document.uri;
        Ok(self.inner.query(&uri, "definition", move |c, root| features::definition(c, root, pos)).await.flatten())
    }

    async fn references(&self, p: ReferenceParams) -> RpcResult<Option<Vec<Location>>> {
        let pos = p.text_document_position.position;
        let uri = p.text_document_position.text_document.uri;
        let decl = p.context.include_declaration;
        Ok(self.inner.query(&uri, "references", move |c, root| features::references(c, root, pos, decl)).await)
    }

    async fn document_symbol(&self, p: DocumentSymbolParams) -> RpcResult<Option<DocumentSymbolResponse>> {
        let syms = self.inner.query(&p.text_document.uri, "symbols", |c, _| features::document_symbols(c)).await;
        Ok(syms.map(DocumentSymbolResponse::Nested))
    }

    async fn inlay_hint(&self, p: InlayHintParams) -> RpcResult<Option<Vec<InlayHint>>> {
        let range = p.range;
        Ok(self.inner.query(&p.text_document.uri, "inlay hints", move |c, _| features::inlay_hints(c, range)).await)
    }

    async fn completion(&self, p: CompletionParams) -> RpcResult<Option<CompletionResponse>> {
        let pos = p.text_document_position.position;
        let uri = p.text_document_position.text_document.uri;
        let Some((mut text, _)) = self.inner.text(&uri) else {
            return Ok(None);
        };
        // Right after a `.` the text rarely parses: complete a placeholder member so that the
        // checker types the receiver (the placeholder itself is never offered).
        let offset = convert::offset_in(&text, pos);
        if text[..offset].ends_with('.') {
            text.insert_str(offset, "__complete");
        }
        let items = self.inner.with_check(&uri, text, "completion", move |c, _| features::completions(c, offset)).await;
        Ok(items.map(CompletionResponse::Array))
    }

    async fn signature_help(&self, p: SignatureHelpParams) -> RpcResult<Option<SignatureHelp>> {
        let pos = p.text_document_position_params.position;
        let uri = p.text_document_position_params.text_document.uri;
        Ok(self.inner.query(&uri, "signature help", move |c, _| features::signature_help(c, pos)).await.flatten())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_while_answering_is_caught_and_the_server_goes_on() {
        let (service, _socket) =
            LspService::new(|client| Backend { inner: Arc::new(Inner::new(client, Arc::new(AtomicBool::new(false)))) });
        let inner = service.inner().inner.clone();
        let uri: Uri = "file:///tmp/panic.msl".parse().unwrap();
        let text = "fn main() { let x = ones(2) }".to_string();
        let r: Option<()> = inner.with_check(&uri, text.clone(), "test", |_, _| panic!("boom")).await;
        assert!(r.is_none());
        let n = inner.with_check(&uri, text, "test", |c, _| c.diagnostics.len()).await;
        assert_eq!(n, Some(0));
    }
}
