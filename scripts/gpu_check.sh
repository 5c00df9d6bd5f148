#!/usr/bin/env bash
# The CUDA checks for a machine with a GPU but no Rust toolchain or network (issue 17, item 7).
#
#   bash scripts/gpu_check.sh build   # on the CPU machine: test binaries and msl, stripped, into target/gpu/
#   bash scripts/gpu_check.sh run     # on the GPU machine, with target/gpu carried there
#
# `run` prints the GPU, then runs the CUDA device's comparison against the CPU device (every
# kernel it has: elementwise, cuBLAS products, reductions, gathers, attention, draws) and the
# kernel-source tests (NVRTC from the machine's CUDA toolkit, found through LD_LIBRARY_PATH),
# then every spec example on `--device cuda`, interpreted and at -O1; a skipped test says why.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-run}" in
build)
    mkdir -p target/gpu
    cargo build --release
    for t in cuda_device cuda_ops; do
        exe=$(cargo test --release -p kernels --test "$t" --no-run --message-format=json 2>/dev/null |
            python3 -c 'import json, sys
for line in sys.stdin:
    j = json.loads(line)
    if j.get("executable"):
        print(j["executable"])' | tail -n 1)
        cp "$exe" "target/gpu/$t"
    done
    cp target/release/msl target/gpu/msl
    # The device tool carries at most 64 MiB: without debug info the three fit.
    strip target/gpu/*
    du -sh target/gpu
    ;;
run)
    nvidia-smi -L || echo "note: nvidia-smi found no GPU"
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
        [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
    done
    status=0
    for t in cuda_device cuda_ops; do
        echo "== $t"
        "target/gpu/$t" --nocapture --test-threads 1 || status=1
    done
    echo "== msl run --device cuda"
    printf 'fn main() {\n    print(sum(ones(4)))\n}\n' > "${TMPDIR:-/tmp}/gpu_check.msl"
    target/gpu/msl run --device cuda "${TMPDIR:-/tmp}/gpu_check.msl" || echo "(exit $?)"
    # Every spec example, its expected output checked, with the CUDA device's kernels on the
    # GPU (the rest on the CPU): the same text as on the CPU, or the example fails.
    echo "== msl test --device cuda spec/"
    target/gpu/msl test --device cuda spec/ | tail -n 5 || status=1
    # The same at -O1: each fused tree the JIT finds runs as one kernel generated from it.
    echo "== msl test --device cuda --mode jit -O1 spec/"
    target/gpu/msl test --device cuda --mode jit -O1 spec/ | tail -n 5 || status=1
    exit "$status"
    ;;
*)
    echo "usage: bash scripts/gpu_check.sh build|run" >&2
    exit 2
    ;;
esac
