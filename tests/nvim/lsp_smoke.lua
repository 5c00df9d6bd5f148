-- Neovim's built-in LSP client against `msl lsp`: open a file, wait for its diagnostics, ask
-- for a hover, and write what arrived to $MSL_OUT. Exits 0 when both arrived as expected.
--
-- Run by tests/nvim.rs as
--   MSL_BIN=… MSL_FILE=… MSL_OUT=… MSL_HOVER_LINE=… MSL_HOVER_COL=… MSL_HOVER_EXPECT=… \
--   nvim --headless -u NONE -i NONE -n -c "luafile tests/nvim/lsp_smoke.lua"
-- Works with Neovim 0.7 (Debian 12), which has `vim.lsp.start_client` but not `vim.lsp.start`.

local out_path = os.getenv("MSL_OUT")
local lines = {}

local function log(s)
  table.insert(lines, s)
end

local function finish(ok)
  local f = io.open(out_path, "w")
  if f then
    f:write(table.concat(lines, "\n") .. "\n" .. (ok and "RESULT ok" or "RESULT failed") .. "\n")
    f:close()
  end
  for _, c in pairs(vim.lsp.get_active_clients()) do
    c.stop()
  end
  vim.wait(500, function() return #vim.lsp.get_active_clients() == 0 end, 20)
  os.exit(ok and 0 or 1)
end

local ok, err = pcall(function()
  local file = os.getenv("MSL_FILE")
  vim.cmd("edit " .. vim.fn.fnameescape(file))
  local buf = vim.api.nvim_get_current_buf()
  local config = {
    name = "msl",
    cmd = { os.getenv("MSL_BIN"), "lsp" },
    root_dir = vim.fn.fnamemodify(file, ":p:h"),
  }
  local id = vim.lsp.start_client(config)
  if not id then
    log("could not start msl lsp")
    return finish(false)
  end
  vim.lsp.buf_attach_client(buf, id)

  -- A diagnostic arrives through the client's default publishDiagnostics handler.
  local got = vim.wait(30000, function() return #vim.diagnostic.get(buf) > 0 end, 50)
  if not got then
    log("no diagnostic arrived")
    return finish(false)
  end
  for _, d in ipairs(vim.diagnostic.get(buf)) do
    local code = d.code or (d.user_data and d.user_data.lsp and d.user_data.lsp.code) or "?"
    log(string.format("diagnostic %d:%d [%s] %s", d.lnum, d.col, code, (d.message:gsub("\n", " | "))))
  end

  -- A hover at the given position.
  local client = vim.lsp.get_client_by_id(id)
  local params = {
    textDocument = { uri = vim.uri_from_bufnr(buf) },
    position = { line = tonumber(os.getenv("MSL_HOVER_LINE")), character = tonumber(os.getenv("MSL_HOVER_COL")) },
  }
  local resp = client.request_sync("textDocument/hover", params, 30000, buf)
  if not resp or resp.err or not resp.result then
    log("no hover: " .. vim.inspect(resp))
    return finish(false)
  end
  local value = resp.result.contents.value or vim.inspect(resp.result.contents)
  log("hover " .. (value:gsub("\n", " | ")))
  local want = os.getenv("MSL_HOVER_EXPECT")
  if not value:find(want, 1, true) then
    log("hover lacks " .. want)
    return finish(false)
  end
  finish(true)
end)
if not ok then
  log("error: " .. tostring(err))
  finish(false)
end
