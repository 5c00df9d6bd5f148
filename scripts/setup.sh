#!/usr/bin/env bash
# Installs the system packages msl's tests need. Today: none beyond the Rust toolchain, so this
# only checks that cargo is there; later issues add packages here (never install them by hand).
set -euo pipefail
if ! command -v cargo >/dev/null; then
    echo "error: cargo is required (install Rust 1.95 with rustup)" >&2
    exit 1
fi
rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt clippy >/dev/null 2>&1 || true
