#!/usr/bin/env bash
# The gradient of a loop over a stack of layers (`for l in 0..L { h = tanh(h @ m.layers[l].w) }`,
# 128 × 128 layers, batch 256) for L = 8, 32 and 128, for two builds side by side: rounds
# alternate which build runs first, and the program times its own `grad` calls with `clock()`
# (three after one warm-up), so start-up and checking do not count. Prints the median ms per
# gradient of each build and their ratio.
#
#     bash bench/layers.sh A/target/release/msl B/target/release/msl [rounds]
set -euo pipefail
A=$1
B=$2
ROUNDS=${3:-5}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
for L in 8 32 128; do
    cat > "$tmp/p.msl" <<MSL
model Block[D] {
    w: f32[D, D] = glorot_uniform(D, D)
}
model Net[D, L] {
    layers: [Block[D]; L]
}
fn loss(m: Net[128, $L], x: f32[256, 128]) -> f32 {
    var h = x
    for l in 0..$L {
        h = tanh(h @ m.layers[l].w)
    }
    sum(h * h)
}
fn main() {
    let m = init(Net[128, $L], seed: 0)
    let x = ones(256, 128)
    var s = sum(grad(loss)(m, x).layers.w)
    let t0 = clock()
    for i in 0..3 {
        s = s + sum(grad(loss)(m, x).layers.w)
    }
    print((clock() - t0) / 3.0 * 1000.0)
}
MSL
    a=(); b=()
    for r in $(seq "$ROUNDS"); do
        if [ $((r % 2)) -eq 1 ]; then
            a+=("$("$A" run "$tmp/p.msl")"); b+=("$("$B" run "$tmp/p.msl")")
        else
            b+=("$("$B" run "$tmp/p.msl")"); a+=("$("$A" run "$tmp/p.msl")")
        fi
    done
    ma=$(printf '%s\n' "${a[@]}" | sort -g | sed -n "$(( (ROUNDS + 1) / 2 ))p")
    mb=$(printf '%s\n' "${b[@]}" | sort -g | sed -n "$(( (ROUNDS + 1) / 2 ))p")
    printf 'L = %3d: A %8.2f ms  B %8.2f ms  B/A %.2f\n' "$L" "$ma" "$mb" "$(echo "$mb / $ma" | bc -l)"
done
