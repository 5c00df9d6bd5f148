#!/usr/bin/env bash
# Runs every program in a folder with `msl run` and reports the ones that crash: an exit status
# other than 0 (ran), 1 (rejected) or 2 (a run-time error with its message), or a panic message.
# With --compare, also runs each at -O0, -O1 and -O2 and reports any whose output or exit status
# differs from the interpreter's. The programs come from the mutation fuzzer (tests/robustness.rs):
#   MSL_MUTANTS_DIR=/tmp/mut MSL_MUTATIONS=300000 cargo test --release --test robustness mutated
#   bash scripts/run_mutants.sh [--compare] /tmp/mut [target/release/msl]
# MSL_FLAGS adds flags to every run (`MSL_FLAGS="--ranks 2"` for the sharded ones). Each program
# runs in a scratch folder (programs may save files) for at most 10 s, with 4 GiB of address
# space; one stopped by the time limit is listed as slow, not as a crash.
set -u
compare=0
if [ "${1:-}" = "--compare" ]; then compare=1; shift; fi
dir=${1:?usage: run_mutants.sh [--compare] FOLDER [MSL]}
msl=$(realpath "${2:-target/release/msl}")
work=$(mktemp -d)
crashes=0; slow=0; differ=0; n=0

# Runs $1 with the extra flags $2; sets out (stdout), err (stderr) and rc.
run() {
    rm -rf "${work:?}"/*
    cp "$1" "$work/p.msl"
    out=$( cd "$work" && ulimit -v 4194304 && timeout -s KILL 10 "$msl" run ${MSL_FLAGS:-} $2 p.msl 2>"$work.err" )
    rc=$?
    err=$(cat "$work.err")
}

for f in "$dir"/*.msl; do
    n=$((n + 1))
    run "$f" ""
    if [ $rc -eq 137 ]; then
        slow=$((slow + 1)); echo "slow: $f"; continue
    elif [ $rc -gt 2 ] || grep -q "panicked" <<<"$err"; then
        crashes=$((crashes + 1)); echo "CRASH ($rc): $f"; tail -n 3 <<<"$err" | sed 's/^/    /'; continue
    fi
    [ $compare -eq 1 ] || continue
    ref=$out; refrc=$rc
    for level in -O0 -O1 -O2; do
        run "$f" "$level"
        [ $rc -eq 137 ] && break
        if [ "$out" != "$ref" ] || [ $rc -ne $refrc ]; then
            differ=$((differ + 1)); echo "DIFFERS at $level (exit $rc, interpreter $refrc): $f"
            diff <(echo "$ref") <(echo "$out") | head -n 4 | sed 's/^/    /'
            break
        fi
    done
done
rm -rf "$work" "$work.err"
echo "$n programs: $crashes crashed, $differ differ from the interpreter, $slow stopped at the time limit"
[ $crashes -eq 0 ] && [ $differ -eq 0 ]
