#!/usr/bin/env python3
"""msl's side of the anchor benchmarks (../shared/bench/anchors/bench.py), on the same workloads.

Each msl workload is a program run twice with different repetition counts; the per-step time is
the difference of the two wall times divided by the difference of the counts, so start-up and
data generation cancel out. Medians over --reps runs. Prints a Markdown table and writes JSON
lines to --out. Baselines (NumPy, CPython) are run in the same invocation by
bench/run.sh through the anchors' own bench.py.
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


def run(msl, src):
    with tempfile.NamedTemporaryFile("w", suffix=".msl", delete=False) as f:
        f.write(src)
        path = f.name
    try:
        t = time.perf_counter()
        p = subprocess.run([msl, "run", path], capture_output=True, text=True)
        dt = time.perf_counter() - t
        if p.returncode != 0:
            sys.exit(f"msl failed:\n{p.stderr}\n{src}")
        return dt
    finally:
        os.unlink(path)


def per_step(msl, template, k1, k2, reps, **subst):
    def prog(k):
        s = template.replace("STEPS", str(k))
        for a, b in subst.items():
            s = s.replace(a, b)
        return s
    samples = []
    for _ in range(reps):
        t1 = run(msl, prog(k1))
        t2 = run(msl, prog(k2))
        samples.append((t2 - t1) / (k2 - k1))
    return statistics.median(samples), min(samples), max(samples)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--msl", default=os.path.join(ROOT, "target/release/msl"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/out/msl.jsonl"))
    a = ap.parse_args()
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    rows = []
    med, lo, hi = per_step(a.msl, W3, 2, 22, a.reps, KERNEL=W3_TRAIN)
    rows.append(("W3 MLP 784-512-512-10 SGD step, B=256 (eager interpreter)", "ms/step", med * 1e3, lo * 1e3, hi * 1e3))
    fmed, flo, fhi = per_step(a.msl, W3, 2, 42, a.reps, KERNEL=W3_FORWARD)
    rows.append(("W3 forward (loss only)", "ms/call", fmed * 1e3, flo * 1e3, fhi * 1e3))
    rows.append(("W3 gradient step / forward", "ratio", med / fmed, lo / fhi, hi / flo))
    wmed, wlo, whi = per_step(a.msl, W6, 1000, 10_000_000 + 1000, max(1, a.reps // 2))
    rows.append(("W6 scalar loop Σ(i·i)%7, 10M iterations (interpreter)", "ms", wmed * 1e10, wlo * 1e10, whi * 1e10))
    with open(a.out, "w") as f:
        for r in rows:
            f.write(json.dumps({"workload": r[0], "unit": r[1], "median": r[2], "min": r[3], "max": r[4]}) + "\n")
    print("| workload | unit | median | min–max |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.3g} | {r[3]:.3g}–{r[4]:.3g} |")


if __name__ == "__main__":
    main()
