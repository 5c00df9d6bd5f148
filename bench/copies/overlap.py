#!/usr/bin/env python3
"""Communication hidden by overlap, from `msl run --trace` files (bench/copies/run.sh).

For each trace: per rank, the time spent in blocking collectives (`cat` collective), in waits
for deferred collectives (`cat` wait), and the deferred collectives' own spans (`cat`
deferred). Exposed communication is blocking time plus waiting time. Printed as one JSON line
per file: the mean over ranks, in milliseconds.
"""
import json
import sys


def summary(path):
    with open(path) as f:
        events = json.load(f)
    if isinstance(events, dict):
        events = events.get("traceEvents", [])
    ranks = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        r = ranks.setdefault(e["pid"], {"collective": 0.0, "wait": 0.0, "deferred": 0.0, "count": 0})
        cat = e.get("cat")
        if cat in ("collective", "wait", "deferred"):
            r[cat] += e["dur"] / 1000.0
            if cat != "wait":
                r["count"] += 1
    n = max(len(ranks), 1)
    out = {k: sum(r[k] for r in ranks.values()) / n for k in ("collective", "wait", "deferred", "count")}
    out["exposed"] = out["collective"] + out["wait"]
    out["file"] = path
    return out


for p in sys.argv[1:]:
    print(json.dumps(summary(p)))
