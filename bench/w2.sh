#!/usr/bin/env bash
# W2 (`y = gelu(x * w + b)` on 16M f32, as ../shared/bench/anchors/bench.py): msl -O0 against
# -O1 (one fused Cranelift loop), and the compile latency of that fused tree.
#   1. in-process (jit/examples/w2.rs): medians of REPS calls on the same inputs, bit-identity
#      check, compile latency;
#   2. end to end through `msl run --mode jit -O<n>`: a program run with 1 and 1+K calls, the
#      per-call time being the difference of wall times over K (start-up and data cancel out),
#      median of REPS pairs.
# Usage: bash bench/w2.sh [REPS] [K]
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-5}
K=${2:-10}
cargo build --release -q --bin msl
cargo build --release -q -p jit --example w2
echo "== W2 in-process"
./target/release/examples/w2 16777216 "$REPS"
echo "== W2 through msl run --mode jit (median of $REPS, $K calls)"
python3 - "$REPS" "$K" <<'EOF'
import os, statistics, subprocess, sys, tempfile, time
reps, k = int(sys.argv[1]), int(sys.argv[2])
src = """fn main() {
    let x = normal(16777216, seed: 1)
    let w = normal(16777216, seed: 2)
    let b = normal(16777216, seed: 3)
    for step in 0..STEPS {
        let y = gelu(x * w + b)
    }
    print(sum(gelu(x * w + b)))
}
"""
def wall(level, steps):
    with tempfile.NamedTemporaryFile("w", suffix=".msl", delete=False) as f:
        f.write(src.replace("STEPS", str(steps)))
    try:
        t = time.perf_counter()
        subprocess.run(["./target/release/msl", "run", "--mode", "jit", f"-O{level}", f.name], check=True, capture_output=True)
        return time.perf_counter() - t
    finally:
        os.unlink(f.name)
res = {}
for level in (0, 1):
    s = [(wall(level, 1 + k) - wall(level, 1)) / k * 1e3 for _ in range(reps)]
    res[level] = s
    print(f"  -O{level}: {statistics.median(s):.1f} ms/call (min {min(s):.1f}, max {max(s):.1f})")
print(f"  speed-up -O1 over -O0: {statistics.median(res[0]) / statistics.median(res[1]):.2f}x")
EOF
