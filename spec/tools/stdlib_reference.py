#!/usr/bin/env python3
"""Checks every number printed in spec/stdlib.md against an independent NumPy computation.

    python3 spec/tools/stdlib_reference.py [path/to/stdlib.md]

For each `## section` of the spec this script holds a NumPy function that repeats the msl
programs of that section and returns what each `print` call shows. Every number of every
```output block is compared twice:

- with the same computation in float32, in the same order of operations as the msl code in
  stdlib/*.msl: msl must agree to a few units in the last place (`F32_RTOL`, `F32_ATOL`);
- with the computation in float64 on the same (float32) inputs: this measures float32 rounding
  only, and is reported (and must stay below `F64_RTOL`, `F64_ATOL`).

The random inputs of `nn.dropout` come from msl's Philox4x32-10 generator, which is
reimplemented here (kernels/src/rng.rs), so the masks are checked exactly too.

Exit status 0 when everything agrees, 1 otherwise. Needs only NumPy.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import numpy as np

# The absolute parts cover results that come out of a cancellation, where one unit in the last
# place of an intermediate is large relative to the result: gelu(-3) = 0.5 x (1 + tanh(-2.6…)) is
# 0.0036 and moves by 6e-8 when tanh moves by one unit in the last place (NumPy's and Rust's
# float32 tanh differ by that much there).
F32_RTOL, F32_ATOL = 1e-6, 1e-7
F64_RTOL, F64_ATOL = 2e-5, 1e-6
# Sections whose float32 results lose more than that to rounding, with the reason.
F64_TOL = {
    # log_softmax of logits near 1000: x - logsumexp(x) cancels, and float32 values near 1000
    # are 6.1e-5 apart, so the result is only good to about that much.
    "nn.log_softmax": (2e-5, 1e-4),
}

F = np.float32


# --- msl's random generator (kernels/src/rng.rs) -------------------------------------------

M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
MASK32 = 0xFFFFFFFF


def philox4x32_10(counter, key):
    c, k = list(counter), list(key)
    for r in range(10):
        if r > 0:
            k = [(k[0] + W0) & MASK32, (k[1] + W1) & MASK32]
        p0, p1 = M0 * c[0], M1 * c[2]
        hi0, lo0 = p0 >> 32, p0 & MASK32
        hi1, lo1 = p1 >> 32, p1 & MASK32
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0]
    return c


def stream_key(seed: int, path: str = ""):
    h = 0xCBF29CE484222325
    for b in path.encode():
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    k = h ^ (seed & 0xFFFFFFFFFFFFFFFF)
    return [k & MASK32, k >> 32]


def msl_uniform_f32(shape, seed: int) -> np.ndarray:
    """`uniform(shape…, seed: seed)` for f32: 24 random bits of word 0 of block i."""
    key = stream_key(seed)
    n = int(np.prod(shape))
    out = np.empty(n, dtype=F)
    for i in range(n):
        w = philox4x32_10([i & MASK32, i >> 32, 0, 0], key)[0]
        out[i] = F((w >> 8) / float(1 << 24))
    return out.reshape(shape)


# --- helpers -------------------------------------------------------------------------------


def ar(n, dt):
    """`f32(arange(n))` in dtype dt (exact in both)."""
    return np.arange(n).astype(dt)


def c(v, dt):
    """A literal as msl stores it (f32), then widened to dt."""
    return dt(F(v))


def logsumexp(x, axis, keepdims=False):
    m = np.max(x, axis=axis, keepdims=True)
    r = m + np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))
    return r if keepdims else np.squeeze(r, axis=axis)


def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def log_softmax(x, axis=-1):
    z = x - np.max(x, axis=axis, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=axis, keepdims=True))


def layer_norm(x, g, b, dt):
    mu = np.mean(x, axis=-1, keepdims=True)
    xc = x - mu
    var = np.mean(xc * xc, axis=-1, keepdims=True)
    return xc * (dt(1) / np.sqrt(var + c(0.00001, dt))) * g + b


def attention(q, k, v, causal, dt):
    d = q.shape[-1]
    scores = np.einsum("bhqd,bhkd->bhqk", q, k) * (dt(1) / np.sqrt(dt(d)))
    t = q.shape[2]
    pos = np.arange(t)
    allowed = (pos[:, None] >= pos[None, :]) | (not causal)
    masked = np.where(allowed, scores, c(-1e9, dt))
    return np.einsum("bhqk,bhkd->bhqd", softmax(masked), v)


def conv2d(x, w, b):
    n, ch, h, wd = x.shape
    o, _, kh, kw = w.shape
    out = np.zeros((n, o, h - kh + 1, wd - kw + 1), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            patch = x[:, :, i : i + h - kh + 1, j : j + wd - kw + 1]
            out = out + np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out + b.reshape(1, o, 1, 1)


def gelu(x, dt):
    k = c(0.7978845608028654, dt)
    return c(0.5, dt) * x * (dt(1) + np.tanh(k * (x + c(0.044715, dt) * x * x * x)))


def sigmoid(x, dt):
    return dt(1) / (dt(1) + np.exp(-x))


def vec(vals, dt):
    return np.array([F(v) for v in vals]).astype(dt)


# --- the sections of spec/stdlib.md --------------------------------------------------------
# Each returns one list per msl block, holding one entry per `print`; a model prints as the
# list of its fields in order.


def x23(dt):
    return (ar(6, dt).reshape(2, 3) / c(10, dt)).astype(dt)


def xs(dt):
    return ((ar(7, dt) - c(3, dt)) / c(2, dt)).astype(dt)


def s_linear(dt):
    x = x23(dt)
    w = (ar(6, dt).reshape(3, 2) - c(2, dt)) / c(4, dt)
    b = vec([0.5, -0.5], dt)
    x3 = ar(12, dt).reshape(2, 2, 3) / c(10, dt)
    return [[x @ w + b, x3 @ w + b]]


def s_relu(dt):
    step = vec([0, 0, 1], dt)
    return [[np.maximum(xs(dt), 0), np.maximum(ar(6, dt).reshape(2, 3) - c(2.5, dt), 0), step, step]]


def s_gelu(dt):
    return [[gelu(xs(dt), dt), gelu(vec([-6, -3, 3, 6], dt), dt)]]


def s_sigmoid(dt):
    return [[sigmoid(xs(dt), dt), sigmoid(vec([-20, 20], dt), dt)]]


def s_softmax(dt):
    x = x23(dt)
    return [[
        softmax(x),
        softmax(ar(6, dt).reshape(3, 2) * c(2, dt) - c(3, dt)),
        softmax(vec([1000, 1001, 1002], dt).reshape(1, 3)),
        np.sum(softmax(x), axis=-1),
    ]]


def s_log_softmax(dt):
    m = ar(6, dt).reshape(2, 3) * c(0.5, dt)
    sm = softmax(m, axis=0)
    ct = np.cos(sm)
    return [[
        log_softmax(x23(dt)),
        log_softmax(vec([1000, 1001, 1002], dt).reshape(1, 3)),
        sm,
        log_softmax(m, axis=0),
        sm * (ct - np.sum(ct * sm, axis=0, keepdims=True)),
        softmax(m),
    ]]


def s_cross_entropy(dt):
    logits = (ar(12, dt).reshape(3, 4) - c(5, dt)) / c(3, dt)
    y = np.array([0, 3, 1])

    def ce(lg, y):
        return logsumexp(lg, -1) - np.sum(lg * np.eye(lg.shape[1], dtype=dt)[y], axis=-1)

    z = np.zeros((2, 4), dtype=dt)
    return [[ce(logits, y), np.mean(ce(logits, y)), ce(z, np.array([2, 1]))]]


def s_mse(dt):
    pred = x23(dt)
    return [[
        np.mean((pred - c(0.25, dt)) ** 2),
        np.mean((vec([1, 2, 3], dt) - vec([1.5, 2, 1], dt)) ** 2),
    ]]


def s_accuracy(dt):
    logits = ((ar(12, dt) * c(7, dt)) % c(5, dt)).reshape(4, 3)
    am = np.argmax(logits, axis=-1)
    tie = np.argmax(vec([1, 1, 0], dt))
    return [[am, np.mean((am == np.array([2, 1, 0, 0])).astype(dt)), dt(tie == 0)]]


def s_layer_norm(dt):
    x = (ar(8, dt) * ar(8, dt)).reshape(2, 4) / c(10, dt)
    one, zero = np.ones(4, dt), np.zeros(4, dt)
    return [[
        layer_norm(x, one, zero, dt),
        layer_norm(x, vec([1, 0.5, 2, 1], dt), vec([0, 0.1, 0, -0.1], dt), dt),
        layer_norm(np.full((1, 4), 3, dt), one, vec([0, 1, 2, 3], dt), dt),
    ]]


def s_embedding(dt):
    table = ar(12, dt).reshape(4, 3) / c(10, dt)
    return [[table[[3, 0]], table[np.array([[0, 3], [2, 2]])]]]


def s_attention(dt):
    q = ar(12, dt).reshape(1, 2, 3, 2) / c(10, dt)
    k = (ar(12, dt).reshape(1, 2, 3, 2) - c(6, dt)) / c(8, dt)
    v = (ar(12, dt) * ar(12, dt)).reshape(1, 2, 3, 2) / c(100, dt)
    one = np.ones((2, 1, 1, 2), dt)
    return [
        [attention(q, k, v, False, dt), attention(q, k, v, True, dt)],
        [attention(one, one, ar(4, dt).reshape(2, 1, 1, 2), False, dt)],
        [[], []],  # attention_cached against the whole prefix: two `true` lines
    ]


def s_conv2d(dt):
    x = ar(16, dt).reshape(1, 1, 4, 4) / c(10, dt)
    w = vec([1, 0, 0, -1, 0.25, 0.25, 0.25, 0.25], dt).reshape(2, 1, 2, 2)
    x2 = ar(36, dt).reshape(2, 2, 3, 3) / c(10, dt)
    w2 = (ar(24, dt).reshape(3, 2, 2, 2) - c(12, dt)) / c(8, dt)
    return [[conv2d(x, w, vec([0, 1], dt)), conv2d(x2, w2, vec([0.5, 0, -0.5], dt))]]


def s_dropout(dt):
    x = (ar(8, dt) + c(1, dt)).reshape(2, 4)

    def dropout(x, rate, seed):
        keep = (msl_uniform_f32((2, 4), seed) >= F(rate)).astype(dt)
        return x * keep / (dt(1) - c(rate, dt))

    return [[
        msl_uniform_f32((2, 4), 3).astype(dt),
        dropout(x, 0.5, 3),
        dropout(x, 0.25, 7),
        dropout(x, 0.0, 3),
    ]]


def params_and_grads(dt):
    p = [np.full((2, 2), c(0.5, dt), dt), vec([1, -1], dt)]
    g = [ar(4, dt).reshape(2, 2) / c(10, dt), vec([0.5, -0.25], dt)]
    return p, g


def s_optim_sgd(dt):
    p, g = params_and_grads(dt)
    lr = c(0.1, dt)
    return [[[a - lr * b for a, b in zip(p, g)]]]


def s_sgd_step(dt):
    p, g = params_and_grads(dt)
    lr = c(0.1, dt)
    return [[[a - lr * b for a, b in zip(p, g)], [lr]]]


def s_momentum(dt):
    p, g = params_and_grads(dt)
    lr, beta = c(0.1, dt), c(0.9, dt)
    v = [np.zeros_like(a) for a in p]
    out = []
    for grad in (g, [c(-2, dt) * a for a in g]):
        v = [beta * vi + gi for vi, gi in zip(v, grad)]
        p = [a - lr * vi for a, vi in zip(p, v)]
        out.append(p)
    return [[out[0], out[1], v]]


def adam_steps(dt, wd=None):
    p, g = params_and_grads(dt)
    lr, b1, b2, eps = c(0.1, dt), c(0.9, dt), c(0.999, dt), c(1e-8, dt)
    mu = [np.zeros_like(a) for a in p]
    nu = [np.zeros_like(a) for a in p]
    out = []
    for t, grad in enumerate((g, [c(-2, dt) * a for a in g]), start=1):
        mu = [b1 * m + (dt(1) - b1) * gi for m, gi in zip(mu, grad)]
        nu = [b2 * n + (dt(1) - b2) * (gi * gi) for n, gi in zip(nu, grad)]
        c1 = dt(1) - b1 ** dt(t)
        c2 = dt(1) - b2 ** dt(t)
        upd = [(m / c1) / (np.sqrt(n / c2) + eps) for m, n in zip(mu, nu)]
        if wd is not None:
            p = [(dt(1) - lr * c(wd, dt)) * a for a in p]
        p = [a - lr * u for a, u in zip(p, upd)]
        out.append(p)
    return out, mu, nu


def s_adam(dt):
    out, mu, nu = adam_steps(dt)
    return [[out[0], out[1], mu, nu, [2]]]


def s_adamw(dt):
    out, _, _ = adam_steps(dt, wd=0.5)
    return [[out[0], out[1]]]


# --- mixed precision: bf16 and f16 emulated on float32 values ---------------------------------
# Each msl operation on a half type computes in float32 and rounds its result once to the
# storage type (round to nearest even); `hr` is that rounding. These sections ignore `dt`: their
# numbers are what the half types give, computed the same way for both comparisons.


def bf16r(a):
    u = np.asarray(a, dtype=F).reshape(-1).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(F).reshape(np.shape(a))


def f16r(a):
    return np.asarray(a, dtype=F).astype(np.float16).astype(F)


def lin_bf16_grad(w, b, x, y):
    """The derivative `msl grad` prints for `loss_bf16`: the cotangent rounds to bf16 at each
    conversion, products and sums accumulate in float32."""
    xb = bf16r(x)
    p = bf16r(bf16r(xb @ bf16r(w)) + bf16r(b))
    n = F(x.shape[0])
    ct = bf16r((np.full(p.shape, F(1)) / n * F(2)) * (p - y))
    return bf16r(xb.T @ ct), bf16r(ct.sum(axis=0))


def s_amp(dt):
    x = ar(24, F).reshape(8, 3) / F(24)
    y = x @ vec([1, -2, 0.5], F).reshape(3, 1) + F(0.25)
    w0, b0 = vec([0.3, -0.2, 0.1], F).reshape(3, 1), np.zeros(1, F)

    def loss32(w, b):
        return np.mean((x @ w + b - y) ** F(2), dtype=F)

    def grad32(w, b):
        ct = (np.full((8, 1), F(1)) / F(8) * F(2)) * (x @ w + b - y)
        return x.T @ ct, ct.sum(axis=0)

    def train(gradf):
        lr, b1, b2, eps = F(0.05), F(0.9), F(0.999), F(1e-8)
        p = [w0.copy(), b0.copy()]
        mu = [np.zeros_like(a) for a in p]
        nu = [np.zeros_like(a) for a in p]
        for t in range(1, 21):
            g = gradf(*p)
            mu = [b1 * m + (F(1) - b1) * gi for m, gi in zip(mu, g)]
            nu = [b2 * v + (F(1) - b2) * (gi * gi) for v, gi in zip(nu, g)]
            c1, c2 = F(1) - b1 ** F(t), F(1) - b2 ** F(t)
            p = [a - lr * ((m / c1) / (np.sqrt(v / c2) + eps)) for a, m, v in zip(p, mu, nu)]
        return p

    g0 = lin_bf16_grad(w0, b0, x, y)
    (w, b), (w32, b32) = train(lambda w, b: lin_bf16_grad(w, b, x, y)), train(grad32)
    block1 = [list(g0), [loss32(w, b), loss32(w32, b32)], [b, b32]]

    x = ar(12, F).reshape(4, 3) / F(12)
    w, b = vec([0.5, -0.5, 0.25, -0.75, 1.0, 0.125], F).reshape(3, 2), np.zeros(2, F)

    def grad16(w, b, scale):
        xh = f16r(x)
        yh = f16r(f16r(xh @ f16r(w)) + f16r(b))
        ct = f16r(F(1) * scale * F(1e-8))
        c2 = f16r(f16r(ct * yh) + f16r(ct * yh))
        return f16r(xh.T @ c2), f16r(c2.sum(axis=0))

    block2 = [[grad16(w, b, F(1))[1]]]
    scale, good = F(65536), 0
    for step in range(3):
        gw, gb = grad16(w, b, scale)
        inv = F(1) / scale
        block2.append([step, scale, inv * gb])
        w, b = w - F(1e6) * (inv * gw), b - F(1e6) * (inv * gb)
        good += 1
        scale, good = (scale * F(2), 0) if good >= 2 else (scale, good)
    with np.errstate(over="ignore", invalid="ignore"):
        gw, gb = grad16(w, b, F(1e30))
    finite = bool(np.isfinite(gw).all() and np.isfinite(gb).all())
    block2.append([F(1e30) * F(0.5)] if not finite else [np.nan])
    return [block1, block2]


SECTIONS = {
    "nn.linear": s_linear,
    "nn.relu": s_relu,
    "nn.gelu": s_gelu,
    "nn.sigmoid": s_sigmoid,
    "nn.softmax": s_softmax,
    "nn.log_softmax": s_log_softmax,
    "nn.cross_entropy": s_cross_entropy,
    "nn.mse": s_mse,
    "nn.accuracy": s_accuracy,
    "nn.layer_norm": s_layer_norm,
    "nn.embedding": s_embedding,
    "nn.attention": s_attention,
    "nn.conv2d": s_conv2d,
    "nn.dropout": s_dropout,
    "optim.sgd": s_optim_sgd,
    "optim.sgd: init and step": s_sgd_step,
    "optim.momentum: init and step": s_momentum,
    "optim.adam: init and step": s_adam,
    "optim.adamw: init and step": s_adamw,
    "amp: mixed precision": s_amp,
}


# --- reading the spec ----------------------------------------------------------------------

NUMBER = re.compile(r"(?<![\w.])(-?(?:\d+(?:\.\d*)?(?:e[+-]?\d+)?|inf)|nan)(?![\w.])")


def read_spec(path: Path):
    """{section: [output lines of each msl block]}, in file order."""
    sections: dict[str, list[list[str]]] = {}
    current = None
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            current = line[3:].strip()
            sections[current] = []
        elif line.strip() == "```output" and current is not None:
            j = i + 1
            block = []
            while lines[j].strip() != "```":
                block.append(lines[j])
                j += 1
            sections[current].append(block)
            i = j
        i += 1
    return sections


def flat(v):
    if isinstance(v, (list, tuple)):
        return [x for item in v for x in flat(item)]
    return [float(x) for x in np.asarray(v, dtype=np.float64).ravel()]


def shape_of_line(line: str):
    """The nested-list shape of a printed tensor (the first top-level list of the line)."""
    start = line.find("[")
    if start < 0:
        return ()
    depth, dims, counts = 0, [], []
    for ch in line[start:]:
        if ch == "[":
            depth += 1
            if len(counts) < depth:
                counts.append(1)
                dims.append(None)
            else:
                counts[depth - 1] = 1
        elif ch == ",":
            counts[depth - 1] += 1
        elif ch == "]":
            if dims[depth - 1] is None:
                dims[depth - 1] = counts[depth - 1]
            depth -= 1
            if depth == 0:
                break
    return tuple(dims)


def main() -> int:
    root = Path(__file__).resolve().parents[2]
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else root / "spec" / "stdlib.md"
    spec = read_spec(path)
    failures = 0
    checked = 0
    worst32 = worst64 = 0.0
    for name, fn in SECTIONS.items():
        if name not in spec:
            print(f"MISSING section {name!r} in {path.name}")
            failures += 1
            continue
        ref32, ref64 = fn(F), fn(np.float64)
        rtol64, atol64 = F64_TOL.get(name, (F64_RTOL, F64_ATOL))
        blocks = spec[name]
        if len(blocks) != len(ref32):
            print(f"{name}: {len(blocks)} output blocks, reference has {len(ref32)}")
            failures += 1
            continue
        for bi, (block, r32, r64) in enumerate(zip(blocks, ref32, ref64)):
            if len(block) != len(r32):
                print(f"{name} block {bi}: {len(block)} lines printed, reference has {len(r32)}")
                failures += 1
                continue
            for line, a32, a64 in zip(block, r32, r64):
                got = [float(m) for m in NUMBER.findall(line)]
                e32, e64 = flat(a32), flat(a64)
                if not isinstance(a32, list) and np.ndim(a32) > 0:
                    if shape_of_line(line) != np.shape(a32):
                        print(f"{name}: shape {shape_of_line(line)} printed, NumPy has {np.shape(a32)}: {line}")
                        failures += 1
                if len(got) != len(e32):
                    print(f"{name}: {len(got)} numbers printed, NumPy has {len(e32)}: {line}")
                    failures += 1
                    continue
                for g, x32, x64 in zip(got, e32, e64):
                    checked += 1
                    d32, d64 = abs(g - x32), abs(g - x64)
                    if math.isnan(g) or d32 > F32_RTOL * abs(x32) + F32_ATOL or d64 > rtol64 * abs(x64) + atol64:
                        print(f"{name}: msl {g!r} vs NumPy f32 {x32!r} / f64 {x64!r} in: {line}")
                        failures += 1
                    worst32 = max(worst32, d32 / (F32_RTOL * abs(x32) + F32_ATOL))
                    worst64 = max(worst64, d64 / (rtol64 * abs(x64) + atol64))
    print(f"checked {checked} numbers in {len(SECTIONS)} sections; the largest difference used "
          f"{worst32:.0%} of the float32 tolerance and {worst64:.0%} of the float64 one")
    print(f"stdlib reference: {checked - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
