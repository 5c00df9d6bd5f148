// The msl extension: starts `msl lsp` (stdio) for every .msl file.
const vscode = require("vscode");
const { LanguageClient } = require("vscode-languageclient/node");

let client;

function activate() {
  const command = vscode.workspace.getConfiguration("msl").get("path", "msl");
  const server = { command, args: ["lsp"] };
  client = new LanguageClient(
    "msl",
    "msl language server",
    { run: server, debug: server },
    { documentSelector: [{ scheme: "file", language: "msl" }] }
  );
  return client.start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
