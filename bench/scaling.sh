#!/usr/bin/env bash
# Scaling of a sharded program on this machine: a W3-sized MLP SGD step (784-512-512-10,
# B = 256, value_and_grad + update) on 1 rank x 1 thread against 2 ranks x 1 thread, data
# parallel (`mesh M[dp = 2]`, the batch split) and tensor parallel (`mesh M[mp = 2]`, Megatron
# pairs: w1 by columns, w2 by rows). Rounds alternate the one-process and the two-rank run; a
# step's time is the difference of a long and a short run over the difference of their steps,
# so start-up (MPI, checking) cancels. Needs a release build and Open MPI.
#
# For dp each round also times the ceiling: two independent one-process runs of half the batch
# at once, nothing communicated, which is what a free all-reduce would leave.
#
# With TORCH_PY set to a Python that has PyTorch (a throwaway venv: `pip install torch`), each
# data-parallel round also runs the same step under PyTorch DDP (bench/ddp.py: gloo, 2 processes
# of 1 thread, the same model and batch), in the same round, and the ratio is printed.
#
#     cargo build --release && [TORCH_PY=/tmp/venv/bin/python] bash bench/scaling.sh [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
MSL=${MSL:-target/release/msl}
ROUNDS=${1:-5}
SHORT=5
LONG=45
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

program() { # $1 = dp | mp | half (dp's step on half the batch, no mesh), $2 = steps
    local mesh w1 b1 w2 rows=256
    if [ "$1" = half ]; then
        mesh=''; w1='f32[784, 512]'; b1='f32[512]'; w2='f32[512, 512]'; x='f32[N, 784]'; y='i32[N]'; rows=128
    elif [ "$1" = dp ]; then
        mesh='mesh M[dp = 2]'; w1='f32[784, 512]'; b1='f32[512]'; w2='f32[512, 512]'; x='f32[N @dp, 784]'; y='i32[N @dp]'
    else
        mesh='mesh M[mp = 2]'; w1='f32[784, 512 @mp]'; b1='f32[512 @mp]'; w2='f32[512 @mp, 512]'; x='f32[N, 784]'; y='i32[N]'
    fi
    cat <<MSL
use nn
$mesh
model Mlp {
    w1: $w1 = he_normal(784, 512)
    b1: $b1 = zeros(512)
    w2: $w2 = he_normal(512, 512)
    b2: f32[512] = zeros(512)
    w3: f32[512, 10] = he_normal(512, 10)
    b3: f32[10] = zeros(10)
}
fn loss[N](m: Mlp, x: $x, y: $y) -> f32 {
    let h1 = relu(x @ m.w1 + m.b1)
    let h2 = relu(h1 @ m.w2 + m.b2)
    mean(nn.cross_entropy(h2 @ m.w3 + m.b3, y))
}
fn main() {
    let x = normal($rows, 784, seed: 1)
    let y = i32(floor(uniform($rows, seed: 2) * 9.99))
    var m = init(Mlp, seed: 0)
    for i in 0..$2 {
        let (l, g) = value_and_grad(loss)(m, x, y)
        m = m - 0.01 * g
    }
    print(loss(m, x, y))
}
MSL
}

# Two processes at once, each running the same command (the ceiling of data parallelism on
# these cores: each does half the batch and nothing is communicated).
pair() { "$@" & local p=$!; "$@"; wait "$p"; }
secs() { local t0 t1; t0=$(date +%s.%N); "$@" > "$tmp/out" 2>&1 || { cat "$tmp/out" >&2; echo "failed: $*" >&2; kill $$; }; t1=$(date +%s.%N); echo "$t1 - $t0" | bc -l; }
step_ms() { # command prefix...; uses $tmp/short.msl and $tmp/long.msl
    local a b; a=$(secs "$@" "$tmp/short.msl"); b=$(secs "$@" "$tmp/long.msl")
    echo "($b - $a) * 1000 / ($LONG - $SHORT)" | bc -l
}

echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
for kind in dp mp; do
    program "$kind" "$SHORT" > "$tmp/short.msl"
    program "$kind" "$LONG" > "$tmp/long.msl"
    program half "$SHORT" > "$tmp/half_short.msl"
    program half "$LONG" > "$tmp/half_long.msl"
    one=(); two=(); ddp=(); free=()
    for r in $(seq "$ROUNDS"); do
        one+=("$(step_ms env RAYON_NUM_THREADS=1 "$MSL" run)")
        two+=("$(step_ms env RAYON_NUM_THREADS=1 mpirun -n 2 -x RAYON_NUM_THREADS "$MSL" run)")
        if [ "$kind" = dp ]; then
            a=$(secs pair env RAYON_NUM_THREADS=1 "$MSL" run "$tmp/half_short.msl")
            b=$(secs pair env RAYON_NUM_THREADS=1 "$MSL" run "$tmp/half_long.msl")
            free+=("$(echo "($b - $a) * 1000 / ($LONG - $SHORT)" | bc -l)")
        fi
        if [ "$kind" = dp ] && [ -n "${TORCH_PY:-}" ]; then
            # gloo's start-up now and then aborts a process: one retry on another port.
            ddp+=("$("$TORCH_PY" bench/ddp.py "$SHORT" "$((LONG - SHORT))" $((29500 + r)) 2>/dev/null ||
                "$TORCH_PY" bench/ddp.py "$SHORT" "$((LONG - SHORT))" $((29600 + r)))")
        fi
    done
    printf '%s\n' "${one[@]}" | sort -g > "$tmp/one"; printf '%s\n' "${two[@]}" | sort -g > "$tmp/two"
    m1=$(sed -n "$(( (ROUNDS + 1) / 2 ))p" "$tmp/one"); m2=$(sed -n "$(( (ROUNDS + 1) / 2 ))p" "$tmp/two")
    printf '%s: step 1 rank x 1 thread %.2f ms (%.2f-%.2f), 2 ranks x 1 thread %.2f ms (%.2f-%.2f): throughput %.2fx\n' \
        "$kind" "$m1" "$(head -1 "$tmp/one")" "$(tail -1 "$tmp/one")" "$m2" "$(head -1 "$tmp/two")" "$(tail -1 "$tmp/two")" \
        "$(echo "$m1 / $m2" | bc -l)"
    if [ "${#free[@]}" -gt 0 ]; then
        printf '%s\n' "${free[@]}" | sort -g > "$tmp/free"
        m4=$(sed -n "$(( (ROUNDS + 1) / 2 ))p" "$tmp/free")
        printf '%s: ceiling, two independent 1-thread processes of half the batch at once, no communication: %.2f ms (%.2f-%.2f): throughput %.2fx\n' \
            "$kind" "$m4" "$(head -1 "$tmp/free")" "$(tail -1 "$tmp/free")" "$(echo "$m1 / $m4" | bc -l)"
    fi
    if [ "${#ddp[@]}" -gt 0 ]; then
        printf '%s\n' "${ddp[@]}" | sort -g > "$tmp/ddp"
        m3=$(sed -n "$(( (ROUNDS + 1) / 2 ))p" "$tmp/ddp")
        printf '%s: PyTorch %s DDP (gloo) 2 processes x 1 thread %.2f ms (%.2f-%.2f): msl / PyTorch %.2f\n' \
            "$kind" "$("$TORCH_PY" -c 'import torch; print(torch.__version__)')" "$m3" "$(head -1 "$tmp/ddp")" \
            "$(tail -1 "$tmp/ddp")" "$(echo "$m2 / $m3" | bc -l)"
    fi
done
