#!/usr/bin/env python3
"""Paired rounds of bench/gen: msl's gen.msl and PyTorch's torch_gen.py one right after the other,
round after round, so that both see the same machine load; per metric, the median over rounds of
msl's time and of the ratio msl / PyTorch (below 1: msl is faster). Prints a Markdown table with
the CPU, its vector extensions and the load.

Usage: VENV=/path/to/anchors/venv bench/gen/pair.py [--rounds 5] [--msl target/release/msl]
"""
import argparse, os, statistics, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def figures(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    return {k: float(v) for k, v in (line.split()[:2] for line in out.splitlines() if line.strip())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--msl", default=os.path.join(ROOT, "target/release/msl"))
    a = ap.parse_args()
    py = os.path.join(os.environ.get("VENV", ""), "bin/python") if os.environ.get("VENV") else sys.executable
    flags = open("/proc/cpuinfo").read().split("flags")[1].split("\n")[0].split()
    model = [l.split(":")[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][0]
    print(f"CPU: {model}, {os.cpu_count()} cores; {' '.join(f for f in ('avx2', 'fma', 'avx512f', 'avx512_vnni') if f in flags)}")
    msl, torch, loads = {}, {}, []
    for r in range(a.rounds):
        loads.append(float(open("/proc/loadavg").read().split()[0]))
        for k, v in figures([a.msl, "run", "bench/gen/gen.msl"]).items():
            msl.setdefault(k, []).append(v)
        for k, v in figures([py, os.path.join(HERE, "torch_gen.py")]).items():
            torch.setdefault(k, []).append(v)
    print(f"{a.rounds} rounds, load {min(loads):.2f}–{max(loads):.2f}\n")
    print("| metric | msl ms | PyTorch ms | msl / PyTorch (median of rounds) |")
    print("| --- | --- | --- | --- |")
    for k in msl:
        ratios = [m / t for m, t in zip(msl[k], torch[k])]
        print(f"| {k} | {statistics.median(msl[k]):.3f} | {statistics.median(torch[k]):.3f} | {statistics.median(ratios):.2f} |")


if __name__ == "__main__":
    main()
