#!/usr/bin/env python3
"""The heap a training step adds: from a `msl run --trace` file, for each step (the events
between two `print`s, one print per step), the largest `heap` counter value minus its value when
the step starts. Prints the median over the steps after the first (warm-up), in MB.

    python3 bench/step_heap.py trace.json
"""
import json
import statistics
import sys

doc = json.load(open(sys.argv[1]))
events = doc["traceEvents"] if isinstance(doc, dict) else doc
heap = sorted((e["ts"], float(next(iter(e["args"].values())))) for e in events
              if e.get("ph") == "C" and e.get("name") == "heap")
prints = sorted(e["ts"] for e in events if e.get("name") == "print")
own = []
for a, b in zip(prints, prints[1:]):
    hs = [h for t, h in heap if a <= t < b]
    if hs:
        own.append(max(hs) - hs[0])
print(f"{statistics.median(own):.1f}")
