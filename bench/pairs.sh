#!/usr/bin/env bash
# Every paired table of issue 19 in one run: msl and the anchors' baselines alternate round by
# round (bench/pair.py), on the anchors' data and weights, losses checked against the baseline's.
# Needs the anchors' pinned venv: A=$(mktemp -d)/anchors && cp -r ../shared/bench/anchors "$A" &&
# (cd "$A" && bash setup.sh --no-mindspore --no-tinygrad); then VENV=$A/venv bash bench/pairs.sh.
# Writes bench/out/pairs.jsonl and prints one summary line per table.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-6}
OUT=bench/out/pairs.jsonl
mkdir -p bench/out && : > "$OUT"
cargo build --release -q
grep -m1 'model name' /proc/cpuinfo
echo "vector extensions: $(grep -o -w 'avx2\|fma\|avx512f' /proc/cpuinfo | sort -u | tr '\n' ' ')"
run() { python3 bench/pair.py --json "$OUT" "$@" | tail -n 1; }
run --workload W3 --framework jax --rounds "$ROUNDS"
run --workload W3 --framework jax --batch 64 --rounds "$ROUNDS"
run --workload W3 --framework torch --mode eager --msl-mode interp --rounds "$ROUNDS"
run --workload W5 --framework torch --mode eager --rounds "$ROUNDS"
run --workload W5 --framework torch --mode compile --rounds "$(( (ROUNDS + 1) / 2 ))"
run --workload W6 --framework python --rounds "$ROUNDS"
