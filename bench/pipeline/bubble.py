#!/usr/bin/env python3
"""Pipeline bubble and activation memory, measured from `msl run --trace` (issue 15).

For each schedule and microbatch count, runs a stack of equal layers over `pp` stages as a
pipeline for a few training steps with `--trace`, and from every rank's `stage` events (the
forward `Fj` and backward `Bj` of each microbatch) computes per step the idle fraction
1 - busy / (stages * step time), where the step runs from the first stage event of any rank to
the last; the first step is a warm-up and is dropped. It also reports each rank's peak heap
during the steps above its heap before the first one (the `heap` counter track), i.e. what the
stage holds of its microbatches' activations. Prints a Markdown table with the ideal bubble
(p-1)/(m+p-1) beside the measured one.

    python3 bench/pipeline/bubble.py [--msl target/release/msl] [--stages 2] [--steps 4]
"""
import argparse, json, os, platform, subprocess, sys, tempfile

PROGRAM = """mesh M[pp = {p}]

model Block[D] {{
    w: f32[D, D] = glorot_uniform(D, D)
    b: f32[D]    = zeros(D)
}}

model Net[D, L] {{
    layers: [Block[D]; L @pp]
    head: f32[D] = ones(D) * 0.01
}}

@pipeline(microbatches: {m}, schedule: "{kind}")
fn loss[N, D, L](m: Net[D, L], x: f32[N, D], y: f32[N]) -> f32 {{
    var h = x
    for l in 0..L {{
        h = tanh(h @ m.layers[l].w + m.layers[l].b)
    }}
    mean((h @ m.head - y) ** 2)
}}

fn main() {{
    var m = init(Net[{d}, {layers}], seed: 0)
    let x = normal({rows}, {d}, seed: 1)
    let y = normal({rows}, seed: 2)
    for step in 0..{steps} {{
        let (l, g) = value_and_grad(loss)(m, x, y)
        m = m - 0.01 * g
        print(step, l)
    }}
}}
"""


def cpu():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def measure(msl, p, m, kind, args):
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "pipe.msl")
        open(src, "w").write(PROGRAM.format(p=p, m=m, kind=kind, d=args.dim, layers=args.layers,
                                            rows=args.rows, steps=args.steps))
        trace = os.path.join(d, "trace.json")
        r = subprocess.run([msl, "run", "--ranks", str(p), "--trace", trace, src], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"msl failed: {r.stderr[-2000:]}")
        events = json.load(open(trace))
        events = events["traceEvents"] if isinstance(events, dict) else events
    stage = {}
    heap = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "stage":
            stage.setdefault(e["pid"], []).append((e["ts"], e["ts"] + e["dur"]))
        elif e.get("ph") == "C" and e.get("name") == "heap":
            heap.setdefault(e["pid"], []).append((e["ts"], e["args"]["MiB"]))
    per_step = 2 * m
    idle = []
    for k in range(1, args.steps):
        spans = []
        busy = 0.0
        for r in range(p):
            evs = sorted(stage[r])[k * per_step:(k + 1) * per_step]
            busy += sum(b - a for a, b in evs)
            spans += evs
        t0, t1 = min(a for a, _ in spans), max(b for _, b in spans)
        idle.append(1 - busy / (p * (t1 - t0)))
    peaks = []
    for r in range(p):
        first = min(a for a, _ in stage[r])
        before = [mib for t, mib in heap.get(r, []) if t <= first]
        base = before[-1] if before else 0.0
        peaks.append(max(mib for t, mib in heap.get(r, [(0, 0)])) - base)
    return sum(idle) / len(idle), min(idle), max(idle), peaks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--msl", default="target/release/msl")
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rows", type=int, default=1024)
    args = ap.parse_args()
    p = args.stages
    mb_bytes = args.rows * args.dim * 4 * (args.layers // p)
    print(f"CPU: {cpu()}, {os.cpu_count()} logical CPUs; {p} stages, {args.layers} layers of "
          f"{args.dim}x{args.dim}, batch {args.rows} rows, {args.steps - 1} measured steps")
    print()
    print("| schedule | microbatches | ideal bubble | measured bubble (mean, min-max) | peak heap above start per stage (MiB) | one microbatch's layer inputs per stage (MiB) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for kind in ["gpipe", "1f1b"]:
        for m in [4, 8]:
            mean, lo, hi, peaks = measure(args.msl, p, m, kind, args)
            ideal = (p - 1) / (m + p - 1)
            print(f"| {kind} | {m} | {ideal:.3f} | {mean:.3f} ({lo:.3f}-{hi:.3f}) | "
                  f"{' / '.join(f'{x:.1f}' for x in peaks)} | {mb_bytes / m / 2**20:.2f} |")


if __name__ == "__main__":
    main()
