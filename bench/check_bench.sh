#!/usr/bin/env bash
# Times `msl check` on a generated ~20,000-line program: the "msl check on a 20,000-line program"
# section of BENCHMARKS.md. Builds msl in release mode, generates the program with
# bench/gen_check_program.py into bench/out/, checks it RUNS times (default 7) and prints the
# median wall time and the peak resident set size (from wait4's rusage of each run; also from
# /usr/bin/time -v when that is installed).
#
#   bench/check_bench.sh                  # 2,000 functions, 7 runs
#   RUNS=15 FUNCTIONS=4000 bench/check_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-7}
FUNCTIONS=${FUNCTIONS:-2000}
cargo build --release -q --bin msl
mkdir -p bench/out
PROG=bench/out/check_bench.msl
python3 bench/gen_check_program.py --functions "$FUNCTIONS" --out "$PROG"
./target/release/msl check "$PROG" # the program must check cleanly (exit 0)
python3 - "$PROG" "$RUNS" <<'PY'
import os, statistics, subprocess, sys, time

prog, runs = sys.argv[1], int(sys.argv[2])
times, rss = [], []
for _ in range(runs):
    t0 = time.perf_counter()
    p = subprocess.Popen(["target/release/msl", "check", prog], stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    times.append(time.perf_counter() - t0)
    if status != 0:
        sys.exit(f"msl check exited with status {status}")
    rss.append(usage.ru_maxrss)  # KiB on Linux
lines = sum(1 for _ in open(prog))
ms = [t * 1000 for t in times]
print(f"program: {prog} ({lines} lines, {os.path.getsize(prog)} bytes)")
print(f"msl check, {runs} runs: median {statistics.median(ms):.0f} ms wall (min {min(ms):.0f}, max {max(ms):.0f})")
print(f"peak RSS: {max(rss) / 1024:.1f} MiB (median over runs {statistics.median(rss) / 1024:.1f} MiB)")
PY
if [[ -x /usr/bin/time ]]; then
    echo "/usr/bin/time -v, one more run:"
    /usr/bin/time -v ./target/release/msl check "$PROG" 2>&1 | grep -E "Elapsed|Maximum resident"
fi
