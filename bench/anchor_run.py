#!/usr/bin/env python3
"""Runs the anchors' bench.py (../shared/bench/anchors) with W3's batch changed: anchor_run.py ANCHORS
--batch B -- [bench.py's arguments]. Without --batch it is bench.py itself."""
import sys

anchors = sys.argv[1]
rest = sys.argv[2:]
batch = None
if rest[:1] == ["--batch"]:
    batch, rest = int(rest[1]), rest[2:]
if rest[:1] == ["--"]:
    rest = rest[1:]
sys.path.insert(0, anchors)
import bench  # noqa: E402

if batch:
    bench.MLP_B = batch
sys.argv = [bench.__file__] + rest
bench.main()
