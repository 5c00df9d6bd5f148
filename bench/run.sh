#!/usr/bin/env bash
# Reproduces BENCHMARKS.md: msl's workloads and the NumPy / JAX / CPython baselines, in one run.
# The baselines use the anchors' own bench.py (../shared/bench/anchors) in a venv with NumPy and
# JAX (CPU) from PyPI, created outside the repository on first use (never a test dependency).
# PyTorch (eager and torch.compile) runs when the venv has it: its PyPI wheel pulls ~3.5 GB of
# CUDA libraries, so it is installed only with TORCH=1 (the anchors' pins, torch 2.15.0).
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
"$VENV/bin/python" -c "import jax" 2>/dev/null || "$VENV/bin/pip" install -q "jax[cpu]"
if [[ ${TORCH:-0} == 1 ]] && ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    "$VENV/bin/pip" install -q torch==2.15.0
fi
mkdir -p bench/out
echo "== msl W1 (GEMM 1024³ f32)"
./target/release/examples/gemm_bench | tee bench/out/gemm.txt
echo "== NumPy W1, W3 (same run)"
# OpenBLAS core-type overrides slow a current NumPy on this machine kind (see env notes).
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$VENV/bin/python" "$ANCHORS/bench.py" --framework numpy --workloads W1,W3 --reps 5 | tee bench/out/numpy.jsonl
echo "== JAX jit W1, W2, W3, W4, W5 (same run)"
"$VENV/bin/python" "$ANCHORS/bench.py" --framework jax --workloads W1,W2,W3,W4,W5 --reps 5 | tee bench/out/jax.jsonl
if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    echo "== PyTorch eager and torch.compile W1, W2, W3, W5 (same run)"
    "$VENV/bin/python" "$ANCHORS/bench.py" --framework torch --mode eager --workloads W1,W2,W3,W5 --reps 5 | tee bench/out/torch_eager.jsonl
    "$VENV/bin/python" "$ANCHORS/bench.py" --framework torch --mode compile --workloads W2,W3,W5 --reps 5 | tee bench/out/torch_compile.jsonl
else
    echo "== PyTorch not installed (TORCH=1 installs it): no torch columns"
fi
echo "== CPython W6"
python3 "$ANCHORS/bench.py" --framework python --workloads W6 --reps 3 | tee bench/out/python.jsonl
echo "== msl W2 (-O0 vs -O1)"
bash bench/w2.sh 5 10 | tee bench/out/w2.txt
echo "== msl W3, W4, W5, W6 (interpreter, jit -O1, jit -O2)"
python3 bench/bench.py --reps 5
