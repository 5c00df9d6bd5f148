#!/usr/bin/env bash
# Activation recomputation: the transformer example's training step (examples/transformer:
# two pre-LN blocks, D = 64, 4 heads, F = 128, T = 16, batch 256) with and without `@recompute`
# on `block`. Prints each variant's peak heap during the run (`--mode jit -O2 --explain`, the
# allocator's count), peak resident memory of the eager interpreter (`/usr/bin/time`), and what
# a training step adds to the heap in both (`--trace`, bench/step_heap.py), and checks that both
# print the same losses. Rounds alternate.
#
#     cargo build --release && bash bench/recompute.sh [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
MSL=$(realpath "${MSL:-target/release/msl}")
ROUNDS=${1:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
main='fn main() {
    let (x, y) = sorting_task(digits(uniform(1024, L, seed: 1)))
    var m = init(Transformer[64, 4, 128], seed: 0)
    var opt = adam.init(m, lr: 0.001)
    for (xb, yb) in batches(x, y, size: 256, shuffle: 0) {
        let (l, g) = value_and_grad(loss)(m, xb, yb)
        (m, opt) = adam.step(m, g, opt)
        print(l)
    }
}'
sed '/^fn main()/,$d' examples/transformer/train.msl > "$tmp/plain.msl"
printf '%s\n' "$main" >> "$tmp/plain.msl"
sed 's/^fn block\[/@recompute\nfn block[/' "$tmp/plain.msl" > "$tmp/lean.msl"
grep -q '^@recompute' "$tmp/lean.msl"
echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
    for v in plain lean; do
        "$MSL" run --mode jit -O2 --explain --trace "$tmp/$v.o2.json" "$tmp/$v.msl" > "$tmp/$v.out" 2> "$tmp/$v.err"
        heap=$(sed -n 's/^memory: peak heap during the run //p' "$tmp/$v.err")
        rss=$( { /usr/bin/time -f '%M' "$MSL" run "$tmp/$v.msl" > "$tmp/$v.eager"; } 2>&1 | tail -1)
        "$MSL" run --trace "$tmp/$v.eager.json" "$tmp/$v.msl" > /dev/null
        cmp -s "$tmp/$v.out" "$tmp/$v.eager" || { echo "$v: -O2 and eager print differently"; exit 1; }
        step_o2=$(python3 bench/step_heap.py "$tmp/$v.o2.json")
        step_eager=$(python3 bench/step_heap.py "$tmp/$v.eager.json")
        printf 'round %d %-5s: -O2 peak heap %s (a step adds %s MB), eager peak RSS %.1f MiB (a step adds %s MB)\n' \
            "$r" "$v" "$heap" "$step_o2" "$(echo "$rss / 1024" | bc -l)" "$step_eager"
    done
    cmp -s "$tmp/plain.out" "$tmp/lean.out" || { echo "the losses differ:"; paste "$tmp/plain.out" "$tmp/lean.out"; exit 1; }
done
echo "losses (identical in both): $(tr '\n' ' ' < "$tmp/plain.out")"
