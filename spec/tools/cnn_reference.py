#!/usr/bin/env python3
"""Checks every number printed in spec/cnn.md against an independent computation.

    python3 spec/tools/cnn_reference.py [path/to/cnn.md]

Values come from plain NumPy loops in float64 (convolution, pooling, batch norm, written
from PyTorch's definitions, not from msl's kernels); gradients from JAX in float64
(`jax.lax.conv_general_dilated`, `jax.lax.reduce_window`, `jax.grad`), so nothing here shares
code with msl. The dropout masks use msl's Philox generator as reimplemented in
`stdlib_reference.py`. Every number must agree to 1e-5 relative (1e-6 absolute). Lines that
report a run-time error (`error[…]`) are compared as text.

Needs NumPy and JAX (a throwaway venv: `pip install numpy jax`). Exit status 0 when all agree.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stdlib_reference import NUMBER, msl_uniform_f32, read_spec  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

RTOL, ATOL = 1e-5, 1e-6


def f32(v):
    """The float32 value msl computes with, as float64."""
    return np.asarray(v, dtype=np.float32).astype(np.float64)


def ar(n):
    return np.arange(n, dtype=np.float64)


# --- direct definitions (PyTorch's) ----------------------------------------------------------


def conv2d_loops(x, w, b=None, stride=1, padding=0):
    n, c, h, wd = x.shape
    o, c2, kh, kw = w.shape
    assert c == c2
    xp = np.zeros((n, c, h + 2 * padding, wd + 2 * padding))
    xp[:, :, padding:padding + h, padding:padding + wd] = x
    oh, ow = (h + 2 * padding - kh) // stride + 1, (wd + 2 * padding - kw) // stride + 1
    out = np.zeros((n, o, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * stride:i * stride + kh, j * stride:j * stride + kw]
            out[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w)
    if b is not None:
        out += b.reshape(1, o, 1, 1)
    return out


def pool_loops(x, k, s, op):
    n, c, h, w = x.shape
    oh, ow = (h - k) // s + 1, (w - k) // s + 1
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            out[:, :, i, j] = op(x[:, :, i * s:i * s + k, j * s:j * s + k].reshape(n, c, -1), axis=-1)
    return out


def max_pool_first_grad(x, g, k, s):
    """PyTorch's max-pool gradient: each window's cotangent at its first maximum."""
    n, c, h, w = x.shape
    out = np.zeros_like(x)
    for a in range(n):
        for b in range(c):
            for i in range(g.shape[2]):
                for j in range(g.shape[3]):
                    win = x[a, b, i * s:i * s + k, j * s:j * s + k]
                    p = int(np.argmax(win))
                    out[a, b, i * s + p // k, j * s + p % k] += g[a, b, i, j]
    return out


def batch_norm(x, gamma, beta):
    mu = x.mean(axis=(0, 2, 3), keepdims=True)
    var = ((x - mu) ** 2).mean(axis=(0, 2, 3), keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * gamma.reshape(1, -1, 1, 1) + beta.reshape(1, -1, 1, 1)


# --- JAX versions, for gradients -------------------------------------------------------------


def jconv(x, w, b=None, stride=1, padding=0):
    y = jax.lax.conv_general_dilated(x, w, (stride, stride), [(padding, padding)] * 2,
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"))
    return y if b is None else y + b.reshape(1, -1, 1, 1)


def jpool(x, k, s, kind):
    if kind == "max":
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, k, k), (1, 1, s, s), "VALID")
    return jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 1, k, k), (1, 1, s, s), "VALID") / (k * k)


def jbatch_norm(x, gamma, beta):
    mu = x.mean(axis=(0, 2, 3), keepdims=True)
    var = ((x - mu) ** 2).mean(axis=(0, 2, 3), keepdims=True)
    return (x - mu) / jnp.sqrt(var + 1e-5) * gamma.reshape(1, -1, 1, 1) + beta.reshape(1, -1, 1, 1)


# --- the sections ----------------------------------------------------------------------------


def s_conv2d():
    x = f32(ar(16).reshape(1, 1, 4, 4) / 10)
    w = f32(np.array([1, 0, 0, -1, 0.25, 0.25, 0.25, 0.25]).reshape(2, 1, 2, 2))
    b = np.array([0.0, 1.0])
    x5 = f32(ar(50).reshape(1, 2, 5, 5) / 50)
    w5 = f32((ar(24).reshape(3, 2, 2, 2) - 12) / 8)
    b5 = np.array([0.5, 0.0, -0.5])
    block0 = [
        conv2d_loops(x, w, b),
        conv2d_loops(x, w, b, 2, 1),
        conv2d_loops(x5, w5, None, 2),
        conv2d_loops(x5, w5, b5, 3, 2),
    ]

    def loss(x, w, b):
        y = jconv(x, w, b, 2, 1)
        return jnp.sum(y * y) / 2

    assert np.allclose(jconv(x5, w5, b5, 2, 1), conv2d_loops(x5, w5, b5, 2, 1))
    block1 = [loss(x5, w5, b5)] + [jax.grad(loss, argnums=i)(x5, w5, b5) for i in range(3)]
    w3 = np.ones((1, 1, 3, 3))
    block2 = [conv2d_loops(np.ones((1, 1, 3, 3)), w3, None, 1, 1), conv2d_loops(np.ones((1, 1, 5, 5)), w3, None, 2)]
    return [block0, block1, block2]


def s_pool():
    x = np.array([1, 3, 3, 2, 0, 3, 1, 1, 4, 4, 0, 5, 4, 1, 2, 5], dtype=np.float64).reshape(1, 1, 4, 4)
    ones = lambda k, s: np.ones(pool_loops(x, k, s, np.max).shape)  # noqa: E731
    avg_grad = jax.grad(lambda t: jnp.sum(jpool(t, 3, 1, "avg")))(x)
    t = ar(16).reshape(1, 1, 4, 4)
    # the tangent at the first maxima: the value of `t` where `x` has them
    first = max_pool_first_grad(x, np.ones((1, 1, 2, 2)), 2, 2)
    dy = np.array([t[first > 0]]).reshape(1, 1, 2, 2)
    return [[
        pool_loops(x, 2, 2, np.max),
        pool_loops(x, 2, 1, np.max),
        pool_loops(x, 3, 2, np.max),
        pool_loops(x, 2, 2, np.mean),
        pool_loops(x, 3, 1, np.mean),
        max_pool_first_grad(x, ones(2, 2), 2, 2),
        max_pool_first_grad(x, ones(2, 1), 2, 1),
        avg_grad,
        dy,
    ]]


def s_small_cnn():
    x = f32(np.sin(f32(ar(72))).reshape(2, 1, 6, 6))
    w = f32(np.cos(f32(ar(36))).reshape(4, 1, 3, 3))
    b = f32([0.1, -0.2, 0.3, 0.0])

    def net(x, w, b):
        h = jnp.tanh(jconv(x, w, b, 1, 1))
        p = jpool(h, 2, 2, "max")
        return jnp.mean(jpool(p, 3, 3, "avg"))

    def gnorm(x, w, b):
        g = jax.grad(net, argnums=1)(x, w, b)
        return jnp.sum(g * g)

    return [[net(x, w, b), jax.grad(net, argnums=2)(x, w, b), gnorm(x, w, b),
             jax.grad(gnorm, argnums=2)(x, w, b), jax.grad(gnorm, argnums=0)(x, w, b)]]


def s_batch_norm():
    x = f32((ar(24) * ar(24) / 100).reshape(2, 3, 2, 2))
    gamma, beta = np.array([1.0, 2.0, 0.5]), np.array([0.0, 1.0, -1.0])
    y = batch_norm(x, gamma, beta)
    g = jax.grad(lambda g: jnp.sum(jbatch_norm(x, g, beta) * x))(gamma)
    return [[y, y.mean(axis=(0, 2, 3)), g]]


def s_dropout():
    x = ar(8).reshape(2, 4) + 1

    def dropout(x, rate, seed):
        keep = (msl_uniform_f32(x.shape, seed) >= np.float32(rate)).astype(np.float64)
        return x * keep / (1 - rate)

    x3 = x.reshape(2, 2, 2)
    keep3 = (msl_uniform_f32((2, 2, 2), 3) >= np.float32(0.5)).astype(np.float64) * 2
    return [[dropout(x, 0.5, 3), dropout(x3, 0.5, 3), dropout(x.reshape(1, 2, 2, 2), 0.25, 7),
             dropout(ar(5), 0.5, 1), keep3]]


SECTIONS = {
    "conv2d": s_conv2d,
    "max_pool2d and avg_pool2d": s_pool,
    "A small CNN, differentiated twice": s_small_cnn,
    "nn.batch_norm": s_batch_norm,
    "nn.dropout": s_dropout,
}


def main() -> int:
    root = Path(__file__).resolve().parents[2]
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else root / "spec" / "cnn.md"
    spec = read_spec(path)
    checked = failed = 0
    for name, fn in SECTIONS.items():
        blocks = [b for b in spec.get(name, []) if b]
        want = fn()
        if len(blocks) != len(want):
            print(f"{name}: {len(blocks)} output blocks in the spec, {len(want)} computed")
            failed += 1
            continue
        for bi, (lines, ref) in enumerate(zip(blocks, want)):
            lines = [ln for ln in lines if not ln.startswith("error[")]
            if len(lines) != len(ref):
                print(f"{name} block {bi}: {len(lines)} lines printed, reference has {len(ref)}")
                failed += 1
                continue
            for line, r in zip(lines, ref):
                got = [float(m) for m in NUMBER.findall(line)]
                exp = np.asarray(r, dtype=np.float64).ravel()
                if len(got) != len(exp):
                    print(f"{name} block {bi}: {len(got)} numbers vs {len(exp)}: {line[:80]}")
                    failed += 1
                    continue
                for g, e in zip(got, exp):
                    checked += 1
                    if abs(g - e) > ATOL + RTOL * abs(e):
                        failed += 1
                        print(f"{name} block {bi}: msl {g} vs reference {e} in {line[:80]}")
    print(f"cnn reference: {checked} numbers checked, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
