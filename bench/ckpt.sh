#!/usr/bin/env bash
# Checkpoint write/read throughput of 1 GiB against Python's safetensors and numpy.save, in
# alternating rounds of one run (bench/ckpt.py). The baselines run in a venv with numpy and
# safetensors from PyPI, made outside the repository on first use (never a test dependency).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-/tmp/msl-ckpt-bench-venv}
DIR=${DIR:-/tmp/msl-ckpt-bench}
cargo build --release -q -p kernels --example ckpt_bench
cargo build --release -q --bin msl
if ! "$VENV/bin/python" -c "import numpy, safetensors" 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q numpy safetensors
fi
lscpu | grep -E "Model name|^CPU\(s\)"
"$VENV/bin/python" bench/ckpt.py ./target/release/examples/ckpt_bench "$DIR" "${ROUNDS:-5}" ./target/release/msl
