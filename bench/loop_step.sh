#!/usr/bin/env bash
# The transformer example's training step (examples/transformer: two pre-LN blocks in a loop
# over a stack, D = 64, 4 heads, F = 128, T = 16) at batch 64 and 256, for two builds side by
# side, eager and `--mode jit -O2`: the program times 8 steps with `clock()` after 2 warm-up
# steps, so start-up and checking do not count; rounds alternate which build runs first. Prints
# the median ms per step of each build and their ratio, and checks both print the same losses
# (to 1e-5 relative).
#
#     bash bench/loop_step.sh A/target/release/msl B/target/release/msl [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
A=$(realpath "$1")
B=$(realpath "$2")
ROUNDS=${3:-5}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
for batch in 64 256; do
    sed '/^fn main()/,$d' examples/transformer/train.msl > "$tmp/p.msl"
    cat >> "$tmp/p.msl" <<MSL
fn main() {
    let (x, y) = sorting_task(digits(uniform($batch * 10, L, seed: 1)))
    var m = init(Transformer[64, 4, 128], seed: 0)
    var opt = adam.init(m, lr: 0.001)
    var t0 = clock()
    var i = 0
    var last = 0.0
    for (xb, yb) in batches(x, y, size: $batch, shuffle: 0) {
        if i == 2 { t0 = clock() }
        let (l, g) = value_and_grad(loss)(m, xb, yb)
        (m, opt) = adam.step(m, g, opt)
        last = l
        i = i + 1
    }
    print((clock() - t0) / 8.0 * 1000.0, last)
}
MSL
    for mode in "--mode eager" "--mode jit -O2"; do
        a=(); b=()
        for r in $(seq "$ROUNDS"); do
            # shellcheck disable=SC2086
            if [ $((r % 2)) -eq 1 ]; then
                oa=$("$A" run $mode "$tmp/p.msl"); ob=$("$B" run $mode "$tmp/p.msl")
            else
                ob=$("$B" run $mode "$tmp/p.msl"); oa=$("$A" run $mode "$tmp/p.msl")
            fi
            # The same losses, up to float rounding (a build may round a derivative differently).
            awk -v a="${oa#* }" -v b="${ob#* }" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * (1 + (a < 0 ? -a : a))) }' \
                || { echo "the losses differ: $oa / $ob"; exit 1; }
            a+=("${oa%% *}"); b+=("${ob%% *}")
        done
        ma=$(printf '%s\n' "${a[@]}" | sort -g | sed -n "$(( (ROUNDS + 1) / 2 ))p")
        mb=$(printf '%s\n' "${b[@]}" | sort -g | sed -n "$(( (ROUNDS + 1) / 2 ))p")
        printf 'batch %3d %-15s: A %7.2f ms  B %7.2f ms  B/A %.2f\n' "$batch" "$mode" "$ma" "$mb" "$(echo "$mb / $ma" | bc -l)"
    done
done
