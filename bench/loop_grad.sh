#!/usr/bin/env bash
# Reverse mode through a scalar `while` (issue 14, item 12): seconds of `msl run` for `grad`
# over n = 1k/2k/4k/8k iterations and `grad(grad(f))` over 1,000, with the loop's tape (the
# default) and with `@recompute` (each state recomputed from the loop's start: the scheme every
# loop used before the tape). Usage: bash bench/loop_grad.sh [path/to/msl] [extra msl run flags]
set -euo pipefail
MSL=${1:-target/release/msl}
shift || true
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
prog() { # $1: n, $2: the call
    cat > "$dir/p.msl" <<MSL
fn f(x: f32, n: i32) -> f32 {
    var y = x
    var k = 0
    while k < n {
        y = sin(y) * 0.999 + x * 0.001
        k += 1
    }
    y
}

@recompute
fn f_lean(x: f32, n: i32) -> f32 { f(x, n) }

fn main() {
    print($2)
}
MSL
}
secs() {
    local t0 t1
    t0=$(date +%s.%N)
    timeout 300 "$MSL" run "$@" "$dir/p.msl" > "$dir/out" || echo "(timed out or failed)" > "$dir/out"
    t1=$(date +%s.%N)
    printf '%.2f s (%s)' "$(echo "$t1 - $t0" | bc)" "$(cat "$dir/out")"
}
echo "| workload | tape (default) | \`@recompute\` |"
echo "| --- | --- | --- |"
for n in 1000 2000 4000 8000; do
    prog "$n" "grad(f)(0.5, $n)"; a=$(secs "$@")
    prog "$n" "grad(f_lean)(0.5, $n)"; b=$(secs "$@")
    echo "| \`grad\`, $n iterations | $a | $b |"
done
prog 1000 "grad(grad(f))(0.5, 1000)"; a=$(secs "$@")
prog 1000 "grad(grad(f_lean))(0.5, 1000)"; b=$(secs "$@")
echo "| \`grad(grad(f))\`, 1000 iterations | $a | $b |"
