#!/usr/bin/env bash
# Multi-copy parallelism (`@copies`): the tensor-parallel transformer of
# examples/parallel/transformer.msl on `mesh M[mp = 2]` (2 ranks, one thread each), its `block`
# with and without `@copies(2)`, each run with deferred collectives (the default) and with every
# collective waited for where it starts (`MSL_OVERLAP=0`). For each variant: ms per training
# step (value_and_grad + adam, after one warm-up step) and per forward pass (the loss alone),
# and from `--trace` (bench/copies/overlap.py): the communication exposed (blocking collectives
# plus waits) per step, median over the steps after the first, forward and backward apart.
# Hidden fraction = 1 - exposed / exposed with MSL_OVERLAP=0 (the same program, its collectives
# all blocking). Rounds alternate the variants. Checks that every variant prints the
# same losses (4 decimals).
#
#     cargo build --release && bash bench/copies/run.sh [rounds] [D] [F] [batch]
set -euo pipefail
cd "$(dirname "$0")/../.."
MSL=$(realpath "${MSL:-target/release/msl}")
ROUNDS=${1:-3}
D=${2:-128}
F=${3:-512}
BATCH=${4:-128}
STEPS=${STEPS:-6}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
tmp=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
body() {
    sed -e 's/^mesh M\[dp = 2, mp = 2\]/mesh M[mp = 2]/' -e 's/ @dp//g' -e '/^fn main()/,$d' examples/parallel/transformer.msl
    cat <<MAIN
fn main() {
    let (x, y) = sorting_task(digits(uniform($BATCH * ($STEPS + 1), L, seed: 1)))
    var m = init(Transformer[$D, 4, $F], seed: 0)
    var opt = adam.init(m, lr: 0.001)
    var t0 = clock()
    var i = 0
    for (xb, yb) in batches(x, y, size: $BATCH) {
        if i == 1 {
            t0 = clock()
        }
        $1
        i = i + 1
    }
    print("ms", (clock() - t0) * 1000.0 / f64(i - 1))
}
MAIN
}
body 'let (l, g) = value_and_grad(loss)(m, xb, yb)
        (m, opt) = adam.step(m, g, opt)
        print(l, precision: 4)' > "$tmp/step_plain.msl"
body 'print(loss(m, xb, yb), precision: 4)' > "$tmp/fwd_plain.msl"
for p in step fwd; do
    sed 's/^fn block\[/@copies(2)\nfn block[/' "$tmp/${p}_plain.msl" > "$tmp/${p}_copies.msl"
    grep -q '^@copies' "$tmp/${p}_copies.msl"
done
echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "D = $D, F = $F, batch $BATCH, T = 16, mesh [mp = 2], $STEPS timed steps"
for r in $(seq "$ROUNDS"); do
    for p in fwd step; do
        for v in plain copies; do
            for o in 0 1; do
                out="$tmp/$p.$v.$o"
                MSL_OVERLAP=$o RAYON_NUM_THREADS=1 mpirun -n 2 -x MSL_OVERLAP -x RAYON_NUM_THREADS \
                    "$MSL" run --trace "$out.json" "$tmp/${p}_$v.msl" > "$out.txt"
                ms=$(sed -n 's/^ms //p' "$out.txt")
                sed '/^ms /d' "$out.txt" > "$out.losses"
                cmp -s "$out.losses" "$tmp/$p.plain.0.losses" || { echo "$p $v overlap=$o prints other losses"; exit 1; }
                python3 bench/copies/overlap.py "$out.json" | python3 -c "
import json, sys
s = json.loads(sys.stdin.read())
print('round $r %-4s %-6s overlap=%s: %7.2f ms per step (clock), median step %7.2f ms, exposed communication fwd %6.3f ms bwd %6.3f ms' % ('$p', '$v', '$o', $ms, s['step'], s['fwd'], s['bwd']))
"
            done
        done
    done
done
echo "losses (step, identical in every variant): $(tr '\n' ' ' < "$tmp/step.plain.0.losses")"
