#!/usr/bin/env bash
# A data-parallel training step with the optimizer state held in pieces (`adam.init(m, …,
# shard: dp)`, ZeRO stage 1) on 2 ranks (`mesh M[dp = 2]`, mpirun): an MLP 256 → 1024 → 1024 →
# 10 (1.3 M parameters, a 5.3 MB gradient) at batch 64. Two builds side by side (A, B), and B
# without `shard:` as the plain data-parallel reference; the program times STEPS steps (40) with
# `clock()` after 2 warm-up steps, and rounds alternate which build runs first. Prints the
# median ms per step of each, checks that every run prints the same losses, and prints each
# build's `--comm-report` lines for the step.
#
#     bash bench/zero_step.sh A/target/release/msl B/target/release/msl [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
A=$(realpath "$1")
B=$(realpath "$2")
ROUNDS=${3:-5}
STEPS=${STEPS:-40}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
cat > "$tmp/z.msl" <<MSL
use nn
use optim.adam

mesh M[dp = 2]

model Mlp {
    w1: f32[256, 1024] = he_normal(256, 1024)
    b1: f32[1024] = zeros(1024)
    w2: f32[1024, 1024] = he_normal(1024, 1024)
    b2: f32[1024] = zeros(1024)
    w3: f32[1024, 10] = he_normal(1024, 10)
}

fn loss[N](m: Mlp, x: f32[N @dp, 256], y: i32[N @dp]) -> f32 {
    let h = relu(relu(x @ m.w1 + m.b1) @ m.w2 + m.b2)
    mean(nn.cross_entropy(h @ m.w3, y))
}

fn main() {
    var m = init(Mlp, seed: 0)
    var opt = adam.init(m, lr: 0.001, shard: dp)
    let x = normal(64, 256, seed: 1)
    let y = i32(floor(uniform(64, seed: 2) * 9.99))
    var t0 = clock()
    var last = 0.0
    for i in 0..$((STEPS + 2)) {
        if i == 2 { t0 = clock() }
        let (l, g) = value_and_grad(loss)(m, x, y)
        (m, opt) = adam.step(m, g, opt)
        last = l
    }
    print((clock() - t0) / $STEPS.0 * 1000.0, last)
}
MSL
sed 's/, shard: dp//' "$tmp/z.msl" > "$tmp/w.msl"
run() { "$1" run --ranks 2 "$2"; }
a=(); b=(); w=()
for r in $(seq "$ROUNDS"); do
    if [ $((r % 2)) -eq 1 ]; then
        oa=$(run "$A" "$tmp/z.msl"); ob=$(run "$B" "$tmp/z.msl"); ow=$(run "$B" "$tmp/w.msl")
    else
        ow=$(run "$B" "$tmp/w.msl"); ob=$(run "$B" "$tmp/z.msl"); oa=$(run "$A" "$tmp/z.msl")
    fi
    [ "${oa#* }" = "${ob#* }" ] && [ "${oa#* }" = "${ow#* }" ] || { echo "the losses differ: $oa / $ob / $ow"; exit 1; }
    a+=("${oa%% *}"); b+=("${ob%% *}"); w+=("${ow%% *}")
done
med() { printf '%s\n' "$@" | sort -g | sed -n "$(( (ROUNDS + 1) / 2 ))p"; }
ma=$(med "${a[@]}"); mb=$(med "${b[@]}"); mw=$(med "${w[@]}")
printf 'ms per step: A shard %7.2f   B shard %7.2f   B whole %7.2f   B/A %.2f   B shard/whole %.2f\n' \
    "$ma" "$mb" "$mw" "$(echo "$mb / $ma" | bc -l)" "$(echo "$mb / $mw" | bc -l)"
for x in A B; do
    bin=$A; [ $x = B ] && bin=$B
    echo "$x, shard: dp, collectives of rank 0 over the $((STEPS + 2)) steps:"
    "$bin" run --ranks 2 --comm-report "$tmp/z.msl" 2>&1 >/dev/null | grep -E '^  #' || true
done
echo "B, whole state:"
"$B" run --ranks 2 --comm-report "$tmp/w.msl" 2>&1 >/dev/null | grep -E '^  #' || true
