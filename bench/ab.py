#!/usr/bin/env python3
"""Two builds of msl side by side: the same workloads (W1-W6 of ../shared/bench/anchors, msl's
programs from bench/bench.py) run by build A and build B alternately, round by round, so that a
change of the machine's speed during the run falls on both. Per-step times are differences of two
runs with different step counts (start-up, data and compilation cancel out); the table gives each
build's median and the median of the per-round ratios B/A, with the CPU and the load.

Usage: bench/ab.py A_MSL B_MSL [--rounds 5] [--only SUBSTRING] [--json OUT]
"""
import argparse, json, os, statistics, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
from pair import cpu, load  # noqa: E402

W1 = """
fn main() {
    let a = normal(1024, 1024, seed: 1)
    let b = normal(1024, 1024, seed: 2)
    for step in 0..STEPS {
        let c = a @ b
    }
    print(sum(a @ b))
}
"""
W2 = """
fn main() {
    let x = normal(16777216, seed: 1)
    let w = normal(16777216, seed: 2)
    let b = normal(16777216, seed: 3)
    for step in 0..STEPS {
        let y = gelu(x * w + b)
    }
    print(sum(gelu(x * w + b)))
}
"""
JIT = {"interp": (), "O1": ("--mode", "jit", "-O1"), "O2": ("--mode", "jit", "-O2")}
# (name, template, substitutions, low and high step counts, modes)
WORKLOADS = [
    ("W1 GEMM 1024³", W1, {}, 2, 12, ["interp"]),
    ("W2 gelu(x*w+b) 16M", W2, {}, 1, 6, ["interp", "O1"]),
    ("W3 MLP train step", bench.W3, {"KERNEL": bench.W3_TRAIN}, 2, 22, ["interp", "O2"]),
    ("W3 MLP forward", bench.W3, {"KERNEL": bench.W3_FORWARD}, 2, 42, ["interp"]),
    ("W5 transformer block step", bench.W5, {}, 1, 4, ["interp", "O2"]),
    ("W6 scalar loop (1M)", bench.W6, {}, 1000, 1_001_000, ["interp"]),
    ("W6 scalar loop (100M)", bench.W6, {}, 1000, 100_001_000, ["O2"]),
]


def step(msl, template, subst, k1, k2, mode):
    t1 = bench.run(msl, bench.prog(template, k1, subst), JIT[mode])
    t2 = bench.run(msl, bench.prog(template, k2, subst), JIT[mode])
    return (t2 - t1) / (k2 - k1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--only", help="run only the workloads whose name contains this")
    args = ap.parse_args()
    info = cpu()
    print(f"CPU: {info['model']} ({', '.join(info['flags'])}), {os.cpu_count()} threads")
    rows = []
    for name, tpl, subst, k1, k2, modes in WORKLOADS:
        if args.only and args.only not in name:
            continue
        for mode in modes:
            ta, tb, ratios, loads = [], [], [], []
            for r in range(args.rounds):
                loads.append(load())
                # Alternate which build goes first, so neither always runs on a warmer machine.
                order = [(args.a, ta), (args.b, tb)] if r % 2 == 0 else [(args.b, tb), (args.a, ta)]
                for msl, out in order:
                    out.append(step(msl, tpl, subst, k1, k2, mode))
                ratios.append(tb[-1] / ta[-1])
            row = {
                "workload": name,
                "mode": mode,
                "a_ms": statistics.median(ta) * 1e3,
                "b_ms": statistics.median(tb) * 1e3,
                "ratio": statistics.median(ratios),
                "ratios": ratios,
                "load": loads,
            }
            rows.append(row)
            print(
                f"| {name} | {mode} | {row['a_ms']:.4g} | {row['b_ms']:.4g} | {row['ratio']:.3f} "
                f"({min(ratios):.3f}–{max(ratios):.3f}) | {statistics.median(loads):.2f} |",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": info, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
