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

# NVRTC, so that the test suite compiles every generated CUDA kernel to sm_90 CUBIN on a machine
# with no GPU (`kernels::cuda`, `jit/tests/cuda.rs`; skipped with a printed reason where absent):
# the library of PyPI's nvidia-cuda-nvrtc-cu12 wheel, unpacked into msl's cache folder.
NVRTC_VERSION=12.9.86
nvrtc_dir="${XDG_CACHE_HOME:-$HOME/.cache}/msl/nvrtc"
if [ ! -f "$nvrtc_dir/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" ] && command -v python3 >/dev/null; then
    tmp="$(mktemp -d)"
    pip=(python3 -m pip)
    if ! python3 -m pip --version >/dev/null 2>&1; then
        python3 -m venv "$tmp/venv" >/dev/null 2>&1 && pip=("$tmp/venv/bin/python" -m pip)
    fi
    if "${pip[@]}" download -q --no-deps "nvidia-cuda-nvrtc-cu12==$NVRTC_VERSION" -d "$tmp" >/dev/null 2>&1 &&
        mkdir -p "$nvrtc_dir" && python3 -m zipfile -e "$tmp"/nvidia_cuda_nvrtc_cu12-*.whl "$nvrtc_dir"; then
        echo "installed NVRTC $NVRTC_VERSION into $nvrtc_dir"
    else
        echo "note: could not install NVRTC; the CUDA kernel compile test will be skipped" >&2
    fi
    rm -rf "$tmp"
fi
