#!/usr/bin/env bash
# Installs the system packages msl needs: Open MPI and libclang (the build links the `mpi` crate),
# the Rust toolchain's rustfmt/clippy components and Debian's neovim for the editor test. New
# packages go here, never installed by hand.
set -euo pipefail
if ! command -v cargo >/dev/null; then
    echo "error: cargo is required (install Rust 1.95 with rustup)" >&2
    exit 1
fi
rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt clippy >/dev/null 2>&1 || true

# Neovim, whose built-in LSP client tests `msl lsp` as a real editor would (tests/nvim.rs; the
# test is skipped with a printed reason where nvim is absent). Only as root, only with apt.
if ! command -v nvim >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    if apt-get update -qq >/dev/null 2>&1 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends neovim >/dev/null 2>&1; then
        echo "installed $(nvim --version | head -n 1)"
    else
        echo "note: could not install neovim; the editor test will be skipped" >&2
    fi
fi

# Open MPI for the multi-rank runtime (`dist/`, `msl run --ranks N`, the sharded spec blocks), and
# libclang for the `mpi` crate's bindings: the build needs both.
if ! command -v mpirun >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    if apt-get update -qq >/dev/null 2>&1 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            libopenmpi-dev openmpi-bin libclang-dev >/dev/null 2>&1; then
        echo "installed $(mpirun --version 2>/dev/null | head -n 1)"
    else
        echo "note: could not install Open MPI; multi-rank tests will be skipped" >&2
    fi
fi
if ! command -v mpicc >/dev/null; then
    echo "note: building msl needs Open MPI and libclang: install libopenmpi-dev openmpi-bin libclang-dev" >&2
fi
