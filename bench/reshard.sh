#!/usr/bin/env bash
# Resharding a checkpoint: a 512 MiB model (two f32[8192, 8192] matrices, split by columns and by
# rows over `mp`) saved from `mesh M[dp = 2, mp = 2]` on 4 ranks, then loaded on 4 ranks under
# `--mesh dp=1,mp=4` (every block changes) and on 1 process. A load's time is the run's time
# minus that of the same program without the load (start-up, MPI, checking). Rounds alternate.
# Needs a release build and Open MPI.
#
#     cargo build --release && bash bench/reshard.sh [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
MSL=$(realpath "${MSL:-target/release/msl}")
ROUNDS=${1:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
model='mesh M[dp = 2, mp = 2]
model Big {
    a: f32[8192, 8192 @mp] = normal(8192, 8192)
    b: f32[8192 @mp, 8192] = normal(8192, 8192)
}'
printf '%s\nfn main() {\n    save("ck/", init(Big, seed: 0))\n}\n' "$model" > "$tmp/save.msl"
printf '%s\nfn main() {\n    let m: Big = load("ck/")\n    print(m.a[0, 0] + m.b[0, 0])\n}\n' "$model" > "$tmp/load.msl"
printf '%s\nfn main() {\n    print(1.0)\n}\n' "$model" > "$tmp/none.msl"
cd "$tmp"
secs() { local t0 t1; t0=$(date +%s.%N); "$@" > out 2>&1 || { cat out; exit 1; }; t1=$(date +%s.%N); echo "$t1 - $t0" | bc -l; }
echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
save=$(secs mpirun -n 4 "$MSL" run save.msl)
printf 'save 512 MiB from 2x2 (4 ranks): %.2f s (with start-up)\n' "$save"
for r in $(seq "$ROUNDS"); do
    a=$(secs mpirun -n 4 "$MSL" run --mesh dp=1,mp=4 load.msl); b=$(secs mpirun -n 4 "$MSL" run --mesh dp=1,mp=4 none.msl)
    c=$(secs "$MSL" run load.msl); d=$(secs "$MSL" run none.msl)
    printf 'round %d: 2x2 -> 1x4 (4 ranks) %.2f s, 2x2 -> 1 process %.2f s\n' "$r" "$(echo "$a - $b" | bc -l)" "$(echo "$c - $d" | bc -l)"
done
