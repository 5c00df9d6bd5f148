#!/usr/bin/env python3
"""The matrix products of one W3 or W5 step in JAX (one jitted einsum each) or PyTorch, in the
orientation `kernels/examples/step_gemms.rs` times msl's: medians of 30 calls, microseconds.
Usage: step_gemms.py w3|w5 jax|torch   (run it with the anchors' venv)"""
import sys, time
import numpy as np

W3 = [("x @ w1", 256, 784, 512, 0, 0), ("h1 @ w2", 256, 512, 512, 0, 0), ("h2 @ w3", 256, 512, 10, 0, 0),
      ("h2^T @ d", 512, 256, 10, 1, 0), ("d @ w3^T", 256, 10, 512, 0, 1), ("h1^T @ g", 512, 256, 512, 1, 0),
      ("g @ w2^T", 256, 512, 512, 0, 1), ("x^T @ g", 784, 256, 512, 1, 0)]
W5 = [("h @ wq", 2048, 256, 256, 0, 0), ("h @ w1", 2048, 256, 1024, 0, 0), ("f @ w2", 2048, 1024, 256, 0, 0),
      ("g @ wq^T", 2048, 256, 256, 0, 1), ("g @ w1^T", 2048, 1024, 256, 0, 1), ("g @ w2^T", 2048, 256, 1024, 0, 1),
      ("h^T @ g", 256, 2048, 256, 1, 0), ("h^T @ g1", 256, 2048, 1024, 1, 0), ("f^T @ g", 1024, 2048, 256, 1, 0)]
cases = W5 if sys.argv[1] == "w5" else W3
fw = sys.argv[2]
rng = np.random.default_rng(0)
if fw == "jax":
    import jax, jax.numpy as jnp
else:
    import torch
total = 0
for name, m, k, n, ta, tb in cases:
    a = rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
    eq = ("ji" if ta else "ij") + "," + ("kj" if tb else "jk") + "->ik"
    if fw == "jax":
        a, b = jnp.asarray(a), jnp.asarray(b)
        f = jax.jit(lambda a, b, eq=eq: jnp.einsum(eq, a, b))
        call = lambda: f(a, b).block_until_ready()
    else:
        a, b = torch.from_numpy(a), torch.from_numpy(b)
        call = lambda: (a.T if ta else a) @ (b.T if tb else b)
    call()
    ts = []
    for _ in range(30):
        t = time.perf_counter(); call(); ts.append(time.perf_counter() - t)
    ts.sort()
    total += ts[15]
    print(f"{name:10} {m}x{k}x{n}: {ts[15] * 1e6:8.1f} us {2 * m * n * k / ts[15] / 1e9:6.1f} GFLOP/s")
print(f"total {total * 1e3:.3f} ms")
