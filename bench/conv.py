#!/usr/bin/env python3
"""The CNN benchmark (BENCHMARKS.md, "conv2d"): forward + backward of a 64×16×28×28 → 32-channel
3×3 convolution (stride 1, no padding), msl against PyTorch's or JAX's conv on the same shapes,
alternating round by round (the VM's speed drifts, so ratios within a round are compared).

msl's time per step is the difference of two runs (2 and 12 steps) divided by 10, so start-up,
checking and initialisation cancel; the baseline is timed in-process after a warm-up.

Usage: bench/conv.py [--rounds 5] [--msl target/debug/msl] [--framework torch|jax]
                     [--python /tmp/venv/bin/python] [--old] [--threads 1] [--mode 'jit -O2']

The dev profile builds `kernels` and `gemm` at opt-level 3, so target/debug/msl runs the
convolution kernels at full speed (the interpreter around them is unoptimised).
"""
import argparse, os, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
N, C, H, W, O, K = 64, 16, 28, 28, 32, 3
OH, OW = H - K + 1, W - K + 1
FLOPS = 3 * 2 * N * O * OH * OW * C * K * K  # forward + input gradient + weight gradient

BASELINE = r'''
import sys, time, statistics
fw, reps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
N, C, H, W, O, K = 64, 16, 28, 28, 32, 3
if fw == "torch":
    import torch
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    x = torch.randn(N, C, H, W, requires_grad=True)
    w = torch.randn(O, C, K, K, requires_grad=True)
    b = torch.zeros(O, requires_grad=True)
    def step():
        x.grad = w.grad = b.grad = None
        torch.nn.functional.conv2d(x, w, b).sum().backward()
        return float(w.grad[0, 0, 0, 0])
    print("threads", torch.get_num_threads(), file=sys.stderr)
else:
    import jax, jax.numpy as jnp
    kx, kw = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.normal(kx, (N, C, H, W), jnp.float32)
    w = jax.random.normal(kw, (O, C, K, K), jnp.float32)
    b = jnp.zeros((O,), jnp.float32)
    def loss(x, w, b):
        y = jax.lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return jnp.sum(y + b.reshape(1, O, 1, 1))
    g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    def step():
        gx, gw, gb = g(x, w, b)
        return float(gw[0, 0, 0, 0])
for _ in range(3):
    step()
ts = []
for _ in range(reps):
    t = time.perf_counter(); step(); ts.append(time.perf_counter() - t)
print(statistics.median(ts))
'''


def msl_run(msl, steps, conv, mode, env=None):
    src = open(os.path.join(HERE, "conv.msl.in")).read().replace("STEPS", str(steps)).replace("CONV", conv)
    with tempfile.NamedTemporaryFile("w", suffix=".msl", delete=False) as f:
        f.write(src)
    t = time.perf_counter()
    subprocess.run([msl, "run", *mode, f.name], check=True, capture_output=True, env=env)
    t = time.perf_counter() - t
    os.unlink(f.name)
    return t


def msl_step(msl, conv, mode, k1=2, k2=12, env=None):
    return (msl_run(msl, k2, conv, mode, env) - msl_run(msl, k1, conv, mode, env)) / (k2 - k1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--msl", default=os.path.join(ROOT, "target/debug/msl"))
    ap.add_argument("--framework", default="torch", choices=["torch", "jax"])
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--mode", default="", help="e.g. 'jit -O2' (default: the interpreter)")
    ap.add_argument("--old", action="store_true", help="also time the msl-level conv2d it replaced")
    ap.add_argument("--threads", type=int, default=0, help="threads for both sides (default: all cores)")
    a = ap.parse_args()
    env = dict(os.environ)
    if a.threads:
        # msl's rayon pool, PyTorch's intra-op pool and XLA's Eigen pool, all to the same size.
        env["RAYON_NUM_THREADS"] = str(a.threads)
        env["XLA_FLAGS"] = f"--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads={a.threads}"
    mode = ["--mode", *a.mode.split()] if a.mode else []
    gf = lambda s: FLOPS / s / 1e9  # noqa: E731
    print(f"{FLOPS / 1e9:.3f} GFLOP per forward + backward step")
    rows = []
    for r in range(a.rounds):
        ours = msl_step(a.msl, "conv2d", mode, env=env)
        base = float(subprocess.run([a.python, "-c", BASELINE, a.framework, "10", str(a.threads)], check=True,
                                    capture_output=True, text=True, env=env).stdout.strip())
        old = msl_step(a.msl, "old_conv2d", mode, 1, 3, env) if a.old else None
        rows.append((ours, base, old))
        extra = f", old msl conv2d {old * 1e3:.0f} ms ({gf(old):.1f} GFLOP/s)" if old else ""
        print(f"round {r + 1}: msl {ours * 1e3:.1f} ms ({gf(ours):.1f} GFLOP/s), {a.framework} {base * 1e3:.1f} ms "
              f"({gf(base):.1f} GFLOP/s), ratio msl/{a.framework} time {ours / base:.2f}{extra}", flush=True)
    med = lambda i: statistics.median(x[i] for x in rows)  # noqa: E731
    ratio = statistics.median(x[0] / x[1] for x in rows)
    print(f"median: msl {med(0) * 1e3:.1f} ms = {gf(med(0)):.1f} GFLOP/s; {a.framework} {med(1) * 1e3:.1f} ms = "
          f"{gf(med(1)):.1f} GFLOP/s; time ratio msl/{a.framework} {ratio:.2f} ({a.rounds} rounds)")
    if a.old:
        print(f"old msl conv2d: {med(2) * 1e3:.0f} ms = {gf(med(2)):.1f} GFLOP/s")


if __name__ == "__main__":
    main()
