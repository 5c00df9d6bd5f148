#!/usr/bin/env python3
"""Paired rounds: the baseline (the anchors' bench.py, pinned venv) and msl, one right after the
other, round after round. On a VM whose speed moves by 20-30 % within minutes, only the ratio within
a round can be compared; the median of the per-round ratios is reported, with the CPU, its vector
extensions and the load of every round.

msl's W3 and W5 start from the anchors' data and initial weights (bench/anchor_data.py) and print
the loss of steps 1 and 10; a round whose losses differ from the baseline's by more than 1e-4 stops
the script. msl's time per step is the difference of two runs with different step counts divided by
the difference (start-up, loading and compilation cancel), the median of --diffs such differences.

Usage: bench/pair.py --workload W3|W5|W6 [--batch 256] [--framework jax|torch|python]
                     [--mode eager|compile] [--msl-mode O2|O1|interp] [--rounds 6] [--json OUT]
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODES = {"O2": ["--mode", "jit", "-O2"], "O1": ["--mode", "jit", "-O1"], "interp": []}
W6 = open(os.path.join(HERE, "bench.py")).read().split('W6 = """')[1].split('"""')[0]


def cpu():
    info = {"model": "?", "flags": []}
    for line in open("/proc/cpuinfo"):
        k, _, v = line.partition(":")
        if k.strip() == "model name":
            info["model"] = v.strip()
        if k.strip() == "flags":
            fl = v.split()
            info["flags"] = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16") if f in fl]
            break
    return info


def load():
    return float(open("/proc/loadavg").read().split()[0])


def w5_anchored(data):
    src = open(os.path.join(HERE, "w5.msl.in")).read()
    swaps = [
        ("let x = normal(16, 128, 256, seed: 1)", f'let x: f32[16, 128, 256] = load("{data}/w5_x.npy")'),
        ("let t = normal(16, 128, 256, seed: 2)", f'let t: f32[16, 128, 256] = load("{data}/w5_t.npy")'),
        ("var p = init(Block[256, 4, 1024], seed: 0)", f'var p: Block[256, 4, 1024] = load("{data}/w5.safetensors")'),
        ("let (l, g) = value_and_grad(loss)(p, x, t)\n",
         "let (l, g) = value_and_grad(loss)(p, x, t)\n"
         '        if step == 0 || step == 9 {\n            print("loss", step + 1, l)\n        }\n'),
        ("print(loss(p, x, t))", ""),
    ]
    for a, b in swaps:
        assert a in src, f"bench/w5.msl.in no longer holds {a!r}"
        src = src.replace(a, b)
    return src


def run_msl(msl, src, mode):
    with tempfile.NamedTemporaryFile("w", suffix=".msl", delete=False) as f:
        f.write(src)
    try:
        t = time.perf_counter()
        p = subprocess.run([msl, "run", *mode, f.name], capture_output=True, text=True)
        dt = time.perf_counter() - t
        if p.returncode != 0:
            sys.exit(f"msl failed:\n{p.stderr}\n{src}")
        losses = {int(w[1]): float(w[2]) for w in (l.split() for l in p.stdout.splitlines()) if w[:1] == ["loss"]}
        return dt, losses
    finally:
        os.unlink(f.name)


def msl_sample(a, template, k1, k2):
    """Seconds per step (median of a.diffs differences) and the losses printed."""
    diffs, losses = [], {}
    for _ in range(a.diffs):
        t1, _ = run_msl(a.msl, template.replace("STEPS", str(k1)), MODES[a.msl_mode])
        t2, losses = run_msl(a.msl, template.replace("STEPS", str(k2)), MODES[a.msl_mode])
        diffs.append((t2 - t1) / (k2 - k1))
    return statistics.median(diffs), losses


def baseline(a, workload):
    args = [a.py, os.path.join(HERE, "anchor_run.py"), a.anchors]
    if a.batch != 256:
        args += ["--batch", str(a.batch)]
    args += ["--", "--framework", a.framework, "--workloads", workload, "--reps", str(a.reps)]
    if a.mode:
        args += ["--mode", a.mode]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"baseline failed:\n{out.stderr[-3000:]}")
    meta = {}
    for line in out.stdout.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if d.get("kind") == "meta":
            meta = d
        if d.get("kind") == "result" and d["workload"].startswith(workload + "_") and "numpy vectorized" not in d.get("variant", ""):
            res = d
    return res, meta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="W3", choices=["W3", "W5", "W6"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--framework", default="jax")
    ap.add_argument("--mode", default=None)
    ap.add_argument("--msl-mode", default="O2", choices=list(MODES))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--diffs", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--msl", default=os.path.join(ROOT, "target/release/msl"))
    ap.add_argument("--venv", default=os.environ.get("VENV", "/tmp/anchors/venv"))
    ap.add_argument("--anchors", default=os.environ.get("ANCHORS", os.path.join(ROOT, "../shared/bench/anchors")))
    a = ap.parse_args()
    a.py = os.path.join(a.venv, "bin/python")
    data = os.path.join(ROOT, "bench/out/data")
    if a.workload != "W6":
        subprocess.run([a.py, os.path.join(HERE, "anchor_data.py"), a.anchors, data, "--batch", str(a.batch)], check=True)
    if a.workload == "W3":
        template = open(os.path.join(HERE, "w3.msl.in")).read().replace("BATCH", str(a.batch)).replace("DATA", data)
        k1, k2 = 10, 10 + max(100, int(100_000 / a.batch))
        if a.msl_mode == "interp":
            k2 = 10 + (k2 - 10) // 2
    elif a.workload == "W5":
        template, k1, k2 = w5_anchored(data), 10, 30
    else:
        template = W6
        k1, k2 = 1000, (100_000_000 if a.msl_mode != "interp" else 1_000_000) + 1000
    c = cpu()
    print(f"# {a.workload} (batch {a.batch}) msl {a.msl_mode} vs {a.framework} {a.mode or ''}; "
          f"CPU {c['model']} ({', '.join(c['flags'])}), {os.cpu_count()} cpus", flush=True)
    rounds = []
    for r in range(a.rounds):
        l0 = load()
        res, meta = baseline(a, a.workload)
        base = res["ms_median"]
        sec, losses = msl_sample(a, template, k1, k2)
        ours = sec * 1e3 * (10_000_000 if a.workload == "W6" else 1)
        if a.workload != "W6":
            for step, key in ((1, "loss_step1"), (10, "loss_step10")):
                want, got = res[key], losses.get(step)
                if got is None or abs(got - want) > 1e-4 * max(1.0, abs(want)):
                    sys.exit(f"loss of step {step}: msl {got}, {a.framework} {want}")
        rounds.append({"baseline_ms": base, "msl_ms": ours, "ratio": ours / base, "load": l0, "losses": losses})
        print(f"round {r + 1}: load {l0:.2f}, {a.framework} {base:.3f} ms, msl {a.msl_mode} {ours:.3f} ms, "
              f"ratio {ours / base:.3f}" + (f", losses {losses[1]:.4f} -> {losses[10]:.4f}" if losses else ""),
              flush=True)
    ratios = [x["ratio"] for x in rounds]
    med = statistics.median(ratios)
    versions = meta.get("versions", {})
    print(f"median ratio msl / {a.framework}: {med:.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}, "
          f"{a.rounds} rounds); msl {statistics.median(x['msl_ms'] for x in rounds):.3f} ms, "
          f"{a.framework} {statistics.median(x['baseline_ms'] for x in rounds):.3f} ms; versions {versions}")
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps({"workload": a.workload, "batch": a.batch, "framework": a.framework, "mode": a.mode,
                                "msl_mode": a.msl_mode, "cpu": c, "versions": versions, "rounds": rounds,
                                "median_ratio": med}) + "\n")


if __name__ == "__main__":
    main()
