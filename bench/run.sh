#!/usr/bin/env bash
# Reproduces BENCHMARKS.md: msl's workloads and the NumPy / CPython baselines, in one run.
# The baselines use the anchors' own bench.py (../shared/bench/anchors) in a venv with NumPy only,
# created outside the repository on first use (never a test dependency).
set -euo pipefail
cd "$(dirname "$0")/.."
ANCHORS=${ANCHORS:-../shared/bench/anchors}
VENV=${VENV:-/tmp/msl-bench-venv}
cargo build --release -q --bin msl
cargo build --release -q -p kernels --example gemm_bench
if [[ ! -x $VENV/bin/python ]]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q numpy
fi
mkdir -p bench/out
echo "== msl W1 (GEMM 1024³ f32)"
./target/release/examples/gemm_bench | tee bench/out/gemm.txt
echo "== NumPy W1, W3 (same run)"
# OpenBLAS core-type overrides slow a current NumPy on this machine kind (see env notes).
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$VENV/bin/python" "$ANCHORS/bench.py" --framework numpy --workloads W1,W3 --reps 5 | tee bench/out/numpy.jsonl
echo "== CPython W6"
python3 "$ANCHORS/bench.py" --framework python --workloads W6 --reps 3 | tee bench/out/python.jsonl
echo "== msl W3, W6"
python3 bench/bench.py --reps 5
