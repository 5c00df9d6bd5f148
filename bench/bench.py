#!/usr/bin/env python3
"""msl's side of the anchor benchmarks (../shared/bench/anchors/bench.py), on the same workloads.

Each msl workload is a program run twice with different repetition counts; the per-step time is
the difference of the two wall times divided by the difference of the counts, so start-up and
data generation cancel out. Medians over --reps runs. Every workload runs in the interpreter
(`msl run`) and compiled (`msl run --mode jit -O1`, `-O2`). W4 (compile latency, source to
native code) is `msl check`'s time plus what the first train step costs beyond a steady one
(wall(1 step) - wall(0 steps) - steady step: lazy derivation and JIT compilation). Prints a
Markdown table and writes JSON lines to --out. Baselines (NumPy, JAX, CPython) are run in the
same invocation by bench/run.sh through the anchors' own bench.py.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

W3 = """
use nn.{linear, relu, cross_entropy}

model Mlp {
    w1: f32[784, 512] = he_normal(784, 512)
    b1: f32[512] = zeros(512)
    w2: f32[512, 512] = he_normal(512, 512)
    b2: f32[512] = zeros(512)
    w3: f32[512, 10] = he_normal(512, 10)
    b3: f32[10] = zeros(10)
}

fn loss(m: Mlp, x: f32[256, 784], y: i32[256]) -> f32 {
    let h1 = relu(linear(x, m.w1, m.b1))
    let h2 = relu(linear(h1, m.w2, m.b2))
    mean(cross_entropy(linear(h2, m.w3, m.b3), y))
}

fn main() {
    let x = normal(256, 784, seed: 1)
    let y = i32(floor(uniform(256, seed: 2) * 10.0))
    var m = init(Mlp, seed: 0)
    for step in 0..STEPS {
        KERNEL
    }
    print(loss(m, x, y))
}
"""
W3_TRAIN = "let (l, g) = value_and_grad(loss)(m, x, y)\n        m = m - 0.01 * g"
W3_FORWARD = "let l = loss(m, x, y)"

W5 = open(os.path.join(HERE, "w5.msl.in")).read()

W6 = """
fn main() {
    var acc = 0
    for i in 0..STEPS {
        let r = i % 7
        acc = acc + (r * r) % 7
    }
    print(acc)
}
"""


def run(msl, src, mode=(), cmd="run"):
    with tempfile.NamedTemporaryFile("w", suffix=".msl", delete=False) as f:
        f.write(src)
        path = f.name
    try:
        t = time.perf_counter()
        p = subprocess.run([msl, cmd, *mode, path], capture_output=True, text=True)
        dt = time.perf_counter() - t
        if p.returncode != 0:
            sys.exit(f"msl failed:\n{p.stderr}\n{src}")
        return dt
    finally:
        os.unlink(path)


def prog(template, k, subst):
    s = template.replace("STEPS", str(k))
    for a, b in subst.items():
        s = s.replace(a, b)
    return s


def per_step(msl, template, k1, k2, reps, mode=(), **subst):
    samples = []
    for _ in range(reps):
        t1 = run(msl, prog(template, k1, subst), mode)
        t2 = run(msl, prog(template, k2, subst), mode)
        samples.append((t2 - t1) / (k2 - k1))
    return statistics.median(samples), min(samples), max(samples)


def compile_latency(msl, template, steady, reps, mode, **subst):
    """msl check + (wall(1 step) - wall(0 steps) - steady step), medians, in seconds."""
    check = statistics.median(run(msl, prog(template, 1, subst), (), "check") for _ in range(reps))
    extra = []
    for _ in range(reps):
        t0 = run(msl, prog(template, 0, subst), mode)
        t1 = run(msl, prog(template, 1, subst), mode)
        extra.append(t1 - t0 - steady)
    return check, statistics.median(extra)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--msl", default=os.path.join(ROOT, "target/release/msl"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/out/msl.jsonl"))
    a = ap.parse_args()
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    rows = []
    modes = [("interpreter", ()), ("jit -O1", ("--mode", "jit", "-O1")), ("jit -O2", ("--mode", "jit", "-O2"))]
    steady = {}
    for name, mode in modes:
        med, lo, hi = per_step(a.msl, W3, 2, 22, a.reps, mode, KERNEL=W3_TRAIN)
        steady[name] = med
        rows.append((f"W3 MLP 784-512-512-10 SGD step, B=256 ({name})", "ms/step", med * 1e3, lo * 1e3, hi * 1e3))
    fmed, flo, fhi = per_step(a.msl, W3, 2, 42, a.reps, KERNEL=W3_FORWARD)
    rows.append(("W3 forward (loss only, interpreter)", "ms/call", fmed * 1e3, flo * 1e3, fhi * 1e3))
    rows.append(("W3 gradient step / forward (interpreter)", "ratio", steady["interpreter"] / fmed, 0, 0))
    for name, mode in modes[1:]:
        check, extra = compile_latency(a.msl, W3, steady[name], a.reps, mode, KERNEL=W3_TRAIN)
        rows.append((f"W4 W3 source to native: msl check + first-step extra ({name})", "ms",
                     (check + extra) * 1e3, check * 1e3, extra * 1e3))
    for name, mode in modes:
        med, lo, hi = per_step(a.msl, W5, 1, 4, max(1, a.reps // 2), mode)
        rows.append((f"W5 pre-LN block d256 h4 s128 b16, Adam step ({name})", "ms/step", med * 1e3, lo * 1e3, hi * 1e3))
    wmed, wlo, whi = per_step(a.msl, W6, 1000, 10_000_000 + 1000, 1)
    rows.append(("W6 scalar loop Σ(i·i)%7, 10M iterations (interpreter)", "ms", wmed * 1e10, wlo * 1e10, whi * 1e10))
    for name, mode in modes[1:]:
        wmed, wlo, whi = per_step(a.msl, W6, 1000, 100_000_000 + 1000, a.reps, mode)
        rows.append((f"W6 scalar loop Σ(i·i)%7, 10M iterations ({name})", "ms", wmed * 1e10, wlo * 1e10, whi * 1e10))
    with open(a.out, "w") as f:
        for r in rows:
            f.write(json.dumps({"workload": r[0], "unit": r[1], "median": r[2], "min": r[3], "max": r[4]}) + "\n")
    print("| workload | unit | median | min–max (W4: check, first-step extra) |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.3g} | {r[3]:.3g}–{r[4]:.3g} |")


if __name__ == "__main__":
    main()
