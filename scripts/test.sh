#!/usr/bin/env bash
# The whole test suite: formatting, lints, then every test (unit, spec, robustness).
# `.ci/run` runs exactly this on a clean clone.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test"
cargo test --workspace
