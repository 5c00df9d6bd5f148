#!/usr/bin/env bash
# Every table over the primitives and the kernels' operations is exhaustive: a `match` on
# `Prim`, `UnaryOp`, `BinaryOp`, `ReduceOp` or `KernelId` names every variant, so a new one does
# not compile until each table has its arm (ARCHITECTURE.md, step 5, **Typed IR**: the primitive
# table). The only catch-all arms allowed say why on their line or the next:
# `// any other …: <reason>` (a printer's call syntax, a fold's fast path, a device that does not
# run a kernel yet).
# Reads the output of `cargo clippy … --force-warn clippy::wildcard_enum_match_arm` ($1).
set -euo pipefail
cd "$(dirname "$0")/.."
log=$1
bad=0
while IFS=: read -r file line _; do
    if ! sed -n "${line},$((line + 1))p" "$file" | grep -q "any other"; then
        echo "$file:$line: a catch-all arm in a table over primitives or kernel operations"
        sed -n "${line}p" "$file"
        bad=1
    fi
done < <(awk '
    /^warning: wildcard match/ { inw = 1; loc = ""; next }
    inw && /-->/ { loc = $2; next }
    inw && /help: try:/ {
        if ($0 ~ /(Prim|UnaryOp|BinaryOp|ReduceOp|KernelId)::/) print loc
        inw = 0
    }
' "$log" | sort -u)
if [ "$bad" = 1 ]; then
    echo "name every variant (the class patterns in lang/src/ir/prim.rs help), or say why not with \`// any other …\`"
    exit 1
fi
echo "every table over primitives and kernel operations is exhaustive"
