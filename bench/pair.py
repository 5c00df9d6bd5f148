#!/usr/bin/env python3
"""Paired rounds for one workload: the baseline (the anchors' bench.py in the venv) and msl, one
right after the other, several times. On a VM whose speed moves by 20-30 % within minutes, the
ratio within a round is what can be compared; the median of the per-round ratios is reported.

Usage: bench/pair.py [--rounds 6] [--workload W3|W5] [--framework jax|torch] [--mode eager]
"""
import argparse, json, os, statistics, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench  # noqa: E402


def baseline(py, anchors, framework, mode, workload):
    args = [py, os.path.join(anchors, "bench.py"), "--framework", framework, "--workloads", workload, "--reps", "5"]
    if mode:
        args += ["--mode", mode]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if d.get("kind") == "result" and d["workload"].startswith(workload):
            return d["ms_median"]
    sys.exit(f"no {workload} result from {framework}:\n{out}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--workload", default="W3", choices=["W3", "W5"])
    ap.add_argument("--framework", default="jax")
    ap.add_argument("--mode", default=None)
    ap.add_argument("--msl", default=os.path.join(os.path.dirname(HERE), "target/release/msl"))
    ap.add_argument("--venv", default=os.environ.get("VENV", "/tmp/msl-bench-venv"))
    ap.add_argument("--anchors", default=os.environ.get("ANCHORS", os.path.join(os.path.dirname(HERE), "../shared/bench/anchors")))
    a = ap.parse_args()
    py = os.path.join(a.venv, "bin/python")
    mode = ("--mode", "jit", "-O2")
    ratios = []
    for r in range(a.rounds):
        base = baseline(py, a.anchors, a.framework, a.mode, a.workload)
        if a.workload == "W3":
            ours = bench.per_step(a.msl, bench.W3, 2, 42, 3, mode, KERNEL=bench.W3_TRAIN)[0] * 1e3
        else:
            ours = bench.per_step(a.msl, bench.W5, 1, 5, 1, mode)[0] * 1e3
        ratios.append(ours / base)
        print(f"round {r + 1}: {a.framework} {base:.3f} ms, msl -O2 {ours:.3f} ms, ratio {ours / base:.3f}", flush=True)
    print(f"median ratio msl / {a.framework} ({a.workload}): {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}, {a.rounds} rounds)")


if __name__ == "__main__":
    main()
