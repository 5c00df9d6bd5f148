#!/usr/bin/env python3
"""Exposed communication per step, from `msl run --trace` files (bench/copies/run.sh).

A step is a call event named `value_and_grad(loss)` (a training step) or `loss` (a forward
pass); the first is a warm-up and is skipped. Within a training step the backward pass starts
where `cross_entropy_vjp` (the loss's custom derivative) starts. Per rank and phase: exposed
communication is the time in blocking collectives (`cat` collective) plus the time waiting for
deferred ones (`cat` wait). Prints one JSON object per file: the median over steps of the mean
over ranks, in milliseconds, per phase (`fwd`, `bwd`), and the step's duration.
"""
import json
import statistics
import sys


def summary(path):
    with open(path) as f:
        doc = json.load(f)
    events = [e for e in doc.get("traceEvents", []) if e.get("ph") == "X"]
    per_rank = {}
    for e in events:
        per_rank.setdefault(e["pid"], []).append(e)
    steps = {}  # step index -> list of per-rank dicts
    for pid, evs in per_rank.items():
        evs.sort(key=lambda e: e["ts"])
        windows = [e for e in evs if e["cat"] == "call" and e["name"] in ("value_and_grad(loss)", "loss")]
        windows = [w for w in windows if not any(o is not w and o["ts"] <= w["ts"] and w["ts"] + w["dur"] <= o["ts"] + o["dur"] for o in windows)]
        for i, w in enumerate(windows[1:]):
            t0, t1 = w["ts"], w["ts"] + w["dur"]
            inside = [e for e in evs if t0 <= e["ts"] < t1]
            split = min((e["ts"] for e in inside if e["cat"] == "call" and e["name"] == "cross_entropy_vjp"), default=t1)
            row = {"step": w["dur"] / 1000.0, "fwd": 0.0, "bwd": 0.0}
            for e in inside:
                if e["cat"] in ("collective", "wait"):
                    row["fwd" if e["ts"] < split else "bwd"] += e["dur"] / 1000.0
            steps.setdefault(i, []).append(row)
    out = {"file": path, "steps": len(steps)}
    for k in ("step", "fwd", "bwd"):
        means = [sum(r[k] for r in rows) / len(rows) for rows in steps.values()]
        out[k] = statistics.median(means) if means else 0.0
    return out


for p in sys.argv[1:]:
    print(json.dumps(summary(p)))
