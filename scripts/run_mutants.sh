#!/usr/bin/env bash
# Runs every program in a folder with `msl run` and reports the ones that crash: an exit status
# other than 0 (ran), 1 (rejected) or 2 (a run-time error with its message), or a panic message.
# The programs come from the mutation fuzzer (tests/robustness.rs):
#   MSL_MUTANTS_DIR=/tmp/mut MSL_MUTATIONS=300000 cargo test --release --test robustness mutated
#   bash scripts/run_mutants.sh /tmp/mut [target/release/msl]     (MSL_FLAGS=-O2 for the JIT)
# Each runs in a scratch folder (programs may save files) for at most 10 s, with 4 GiB of
# address space. A program stopped by the time limit is listed as slow, not as a crash.
set -u
dir=${1:?usage: run_mutants.sh FOLDER [MSL]}
msl=$(realpath "${2:-target/release/msl}")
work=$(mktemp -d)
crashes=0; slow=0; n=0
for f in "$dir"/*.msl; do
    n=$((n + 1))
    rm -rf "$work"/*
    cp "$f" "$work/p.msl"
    out=$( cd "$work" && ulimit -v 4194304 && timeout -s KILL 10 "$msl" run ${MSL_FLAGS:-} p.msl 2>&1 >/dev/null )
    rc=$?
    if [ $rc -eq 137 ]; then
        slow=$((slow + 1)); echo "slow: $f"
    elif [ $rc -gt 2 ] || grep -q "panicked" <<<"$out"; then
        crashes=$((crashes + 1)); echo "CRASH ($rc): $f"; tail -n 3 <<<"$out" | sed 's/^/    /'
    fi
done
rm -rf "$work"
echo "$n programs: $crashes crashed, $slow stopped at the time limit"
[ $crashes -eq 0 ]
