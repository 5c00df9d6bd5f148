#!/usr/bin/env bash
# The whole test suite: formatting, lints, then every test (unit, spec, robustness, CLI, LSP).
# `.ci/run` runs exactly this on a clean clone. The last line sums every test run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy (and every table over primitives exhaustive: scripts/tables.sh)"
clog=$(mktemp)
log=$(mktemp)
trap 'rm -f "$clog" "$log"' EXIT
cargo clippy --workspace --all-targets -- -D warnings --force-warn clippy::wildcard_enum_match_arm 2> "$clog" || {
    grep -A12 "^error" "$clog" | head -200
    exit 1
}
bash scripts/tables.sh "$clog"
echo "== cargo test"
status=0
cargo test --workspace 2>&1 | tee "$log" || status=$?
passed=$(grep -Eo '(test result: (ok|FAILED)\. |^spec: )[0-9]+ passed' "$log" | grep -Eo '[0-9]+ passed' | awk '{s += $1} END {print s + 0}')
failed=$(grep -Eo '(test result: (ok|FAILED)\. [0-9]+ passed; |^spec: [0-9]+ passed, )[0-9]+ failed' "$log" | grep -Eo '[0-9]+ failed' | awk '{s += $1} END {print s + 0}')
echo
echo "tests: $passed passed, $failed failed"
exit "$status"
