#!/usr/bin/env python3
"""The builtins against NumPy on special values, run by `msl` on inputs that hold 0, -0,
subnormals, the largest floats, ±inf and NaN: every elementwise function and operator, the
reductions, integer arithmetic (wrapping, floor division and remainder of negatives), the
matrix, axis and indexing builtins, sorting (NaN, -0 and ties), `top_k` (ties lower index
first, as `lax.top_k`), `gather`/`take_along_axis`/`one_hot`, `conv2d` with stride and
padding, pooling, `fused_attention` (a partly filled cache, causal), `nn.layer_norm` and
`nn.cross_entropy`; compared with NumPy's results (float64 references where float32 NumPy
itself cancels, as in `gelu`'s tail).

    cargo build --release && python3 spec/tools/builtins_vs_numpy.py [path/to/msl]

Prints every disagreement (NaN for NaN and infinities exactly; others to a few units in the
last place) and exits 1 when there is one. Needs only NumPy (a throwaway venv: it is not a
test dependency). Works in a temporary folder.
"""
import math, os, subprocess, sys, tempfile

import numpy as np

MSL = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/msl")
os.chdir(tempfile.mkdtemp())
DISAGREEMENTS = 0


def inputs(**arrays):
    """Saves each array as NAME.npy; the `let` lines that load them, typed as they are."""
    lets = ""
    for name, a in arrays.items():
        np.save(f"{name}.npy", a)
        elem = {np.dtype(np.float32): "f32", np.dtype(np.int32): "i32"}[a.dtype]
        lets += f'    let {name}: {elem}[{", ".join(map(str, a.shape))}] = load("{name}.npy")\n'
    return lets


def run(lets, expr):
    """What `print(expr)` prints after `lets` (with `use nn`), or None and the error."""
    with open("p.msl", "w") as f:
        f.write(f"use nn\nfn main() {{\n{lets}    print({expr})\n}}\n")
    p = subprocess.run([MSL, "run", "p.msl"], capture_output=True, text=True)
    return (p.stdout.strip(), None) if p.returncode == 0 else (None, p.stderr.strip()[:300])


def numbers(text):
    for c in "[](),":
        text = text.replace(c, " ")
    return np.array([float(t) for t in text.split()])


def disagree(message):
    global DISAGREEMENTS
    print(message)
    DISAGREEMENTS += 1


def close(lets, expr, want, rtol=2e-5, atol=1e-6):
    """`expr` equals `want` to the tolerances, NaN where it is NaN."""
    out, err = run(lets, expr)
    if out is None:
        return disagree(f"{expr}: msl failed: {err}")
    got, want = numbers(out), np.asarray(want, dtype=np.float64).ravel()
    if got.shape != want.shape or not np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True):
        disagree(f"{expr}\n  msl   {out[:300]}\n  numpy {want[:40]}")


def elementwise(lets, expr, want, x, y, rtol, atol=1e-37):
    """`expr` element by element against `want`: NaN and infinities exactly, the rest within
    `rtol` (or `atol`), naming the inputs of each element that disagrees."""
    out, err = run(lets, expr)
    if out is None:
        return disagree(f"{expr}: msl failed: {err}")
    got, want = numbers(out), np.atleast_1d(np.asarray(want, dtype=np.float64))
    if got.shape != want.shape:
        return disagree(f"{expr}: shape {got.shape} vs {want.shape}: {out[:200]}")
    for i, (g, w) in enumerate(zip(got, want)):
        at = f"{expr}[{i}] x={x[i]!r} y={y[i]!r}: msl {g!r} numpy {w!r}"
        if np.isnan(w) or np.isnan(g):
            if not (np.isnan(w) and np.isnan(g)):
                disagree(at)
        elif np.isinf(w) or np.isinf(g):
            if g != w:
                disagree(at)
        elif abs(g - w) > rtol * max(abs(w), 1e-30) and abs(g - w) > atol:
            disagree(f"{at} rel {abs(g - w) / max(abs(w), 1e-30):.2e}")


def elementwise_and_reductions():
    rng = np.random.default_rng(0)
    special = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1e-30, -1e-30, 1e-45, 3.4e38, -3.4e38, np.inf, -np.inf, np.nan,
                        88.7, 88.8, -87.3, -103.0, -104.0, 20.0, -20.0, 9.0, -9.0, 1e7, -1e7, 0.1, 2.5, -2.5, 3.5, -3.5,
                        1.5, -1.5, 6.0, -6.0, 10.0, -10.0, 1e-8, 2.0**-126, 15.0, 0.7, 100.0, -100.0], dtype=np.float32)
    x = np.concatenate([special, rng.standard_normal(60).astype(np.float32) * 5, (rng.standard_normal(30) * 100).astype(np.float32)])
    y = np.concatenate([np.roll(special, 7), rng.standard_normal(60).astype(np.float32) * 3, np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 7.0] * 5, np.float32)])
    lets = inputs(x=x, y=y)
    f, x64 = np.float32, x.astype(np.float64)
    erf = lambda v: np.vectorize(math.erf)(v.astype(np.float64)).astype(f)
    with np.errstate(all="ignore"):
        unary = {
            "exp(x)": np.exp(x), "log(x)": np.log(x), "sqrt(x)": np.sqrt(x), "rsqrt(x)": (1 / np.sqrt(x64)).astype(f),
            "tanh(x)": np.tanh(x), "sigmoid(x)": (1 / (1 + np.exp(-x64))).astype(f), "relu(x)": np.maximum(x, f(0)),
            "gelu(x)": 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3))),
            "erf(x)": erf(x), "sin(x)": np.sin(x), "cos(x)": np.cos(x), "abs(x)": np.abs(x),
            "sign(x)": np.sign(x), "floor(x)": np.floor(x), "-x": -x,
            "gelu(x, approximate: false)": (0.5 * x64 * (1 + erf(x / f(math.sqrt(2))).astype(np.float64))).astype(f),
            "x + y": x + y, "x - y": x - y, "x * y": x * y, "x / y": x / y, "x % y": np.mod(x, y), "x ** y": np.power(x, y),
            "maximum(x, y)": np.maximum(x, y), "minimum(x, y)": np.minimum(x, y),
            "f32(x < y)": (x < y).astype(f), "f32(x == y)": (x == y).astype(f), "f32(x >= y)": (x >= y).astype(f),
            "f32(x != y)": (x != y).astype(f), "where(x > y, x, y)": np.where(x > y, x, y),
        }
        z = x[60:90].astype(np.float64)
        e = np.exp(z - z.max())
        reductions = {
            "sum(x)": np.sum(x, dtype=np.float64), "mean(y)": np.mean(y.astype(np.float64)), "max(x)": np.max(x),
            "min(x)": np.min(x), "argmax(x)": np.argmax(x), "argmin(x)": np.argmin(x),
            "logsumexp(y)": np.log(np.sum(np.exp(y.astype(np.float64)))), "softmax(x[60:90])": e / e.sum(),
            "log_softmax(x[60:90])": (z - z.max()) - np.log(e.sum()), "cumsum(x[60:90], axis: 0)": np.cumsum(z),
        }
    for expr, want in unary.items():
        # gelu's left tail is x times a tiny probability: compared to an absolute bound far
        # below one unit of x (float32 cannot do better than f64's 1 + tanh(u) there).
        elementwise(lets, expr, want, x, y, 2e-6, 1e-7 if expr.startswith("gelu") else 1e-37)
    for expr, want in reductions.items():
        elementwise(lets, expr, want, x, y, 1e-5)


def integers():
    a = np.array([7, -7, 7, -7, 0, 1, -1, 2147483647, -2147483648, 13, -13, 100, 5, 6, -6, 3], dtype=np.int32)
    b = np.array([2, 2, -2, -2, 3, 1, 5, 1, -1, 4, 4, -7, 5, -3, 1, 3], dtype=np.int32)
    lets = inputs(a=a, b=b)
    with np.errstate(all="ignore"):
        cases = {"a + b": a + b, "a - b": a - b, "a * b": a * b, "a / b": np.floor_divide(a, b), "a % b": np.mod(a, b),
                 "maximum(a, b)": np.maximum(a, b), "abs(a)": np.abs(a), "-a": -a, "sign(a)": np.sign(a),
                 "sum(a)": np.sum(a, dtype=np.int32), "max(a)": a.max(), "argmin(a)": a.argmin(),
                 "cumsum(a, axis: 0)": np.cumsum(a, dtype=np.int32), "a ** 2": a ** 2}
    for expr, want in cases.items():
        close(lets, expr, want, rtol=0, atol=0)


def matrices_and_axes():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((5, 7)).astype(np.float32)
    a[1, 2], a[3, 4] = np.nan, np.inf
    b = rng.standard_normal((7, 3)).astype(np.float32)
    c = rng.standard_normal((2, 5, 7)).astype(np.float32) * 10
    lets = inputs(a=a, b=b, c=c)
    c64 = c.astype(np.float64)

    def softmax(z, ax):
        with np.errstate(invalid="ignore"):
            e = np.exp(z - z.max(axis=ax, keepdims=True))
            return e / e.sum(axis=ax, keepdims=True)

    cases = {
        "a @ b": a.astype(np.float64) @ b, "c @ b": c64 @ b, "sum(c, axis: 1)": c64.sum(1),
        "mean(c, axis: 2, keepdims: true)": c64.mean(2, keepdims=True), "max(c, axis: 0)": c.max(0),
        "argmax(c, axis: 2)": c.argmax(2), "softmax(c, axis: 1)": softmax(c64, 1), "log_softmax(c)": np.log(softmax(c64, 2)),
        "logsumexp(c, axis: 1)": np.log(np.exp(c64).sum(1)), "transpose(a)": a.T, "permute(c, [2, 0, 1])": c.transpose(2, 0, 1),
        "sum(c, axis: (0, 2))": c64.sum((0, 2)), "cumsum(c, axis: 1)": np.cumsum(c64, 1), 'einsum("bij,jk->bik", c, b)': c64 @ b,
        "c[1, 2:4, ::3]": c[1, 2:4, ::3], "c[:, -1]": c[:, -1], "reshape(c, [10, 7])": c.reshape(10, 7),
        "concat([a, a], axis: 1)": np.concatenate([a, a], 1),
        # A row holding NaN or +inf is NaN throughout (inf - inf), as NumPy, JAX and PyTorch give.
        "softmax(a)": softmax(a.astype(np.float64), 1), "log_softmax(a, axis: 0)": np.log(softmax(a.astype(np.float64), 0)),
    }
    for expr, want in cases.items():
        close(lets, expr, want, atol=1e-5)


def conv2d(x, w, b, s, p):
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)))
    kh, kw = w.shape[2:]
    oh, ow = (x.shape[2] - kh) // s + 1, (x.shape[3] - kw) // s + 1
    out = np.zeros((x.shape[0], w.shape[0], oh, ow))
    for i in range(oh):
        for j in range(ow):
            out[:, :, i, j] = np.einsum("nchw,ochw->no", x[:, :, i * s:i * s + kh, j * s:j * s + kw], w)
    return out + b[None, :, None, None]


def pool2d(x, k, s, reduce):
    oh, ow = (x.shape[2] - k) // s + 1, (x.shape[3] - k) // s + 1
    out = np.zeros((*x.shape[:2], oh, ow))
    for i in range(oh):
        for j in range(ow):
            out[:, :, i, j] = reduce(x[:, :, i * s:i * s + k, j * s:j * s + k].astype(np.float64), axis=(2, 3))
    return out


def attention(q, k, v, n, causal):
    s = np.einsum("bqd,bsd->bqs", q.astype(np.float64), k) / math.sqrt(q.shape[-1])
    nq = q.shape[1]
    hidden = np.zeros((nq, k.shape[1]), bool)
    hidden[:, n:] = True
    if causal:
        for i in range(nq):
            hidden[i, n - nq + i + 1:] = True
    s = np.where(hidden, -np.inf, s)
    e = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bqs,bse->bqe", e / e.sum(-1, keepdims=True), v)


def sorting_indexing_conv_attention_nn():
    rng = np.random.default_rng(3)
    x = np.array([3.0, np.nan, -1.0, 3.0, 0.0, -0.0, np.inf, -np.inf, 2.0, 3.0], np.float32)
    m = rng.standard_normal((4, 6)).astype(np.float32)
    m[1, 2] = m[1, 4]
    i = np.array([[0, 5, 2], [1, 1, 3], [5, 4, 0], [2, 2, 2]], np.int32)
    lets = inputs(x=x, m=m, i=i)
    close(lets, "sort(x)", np.sort(x))
    close(lets, "argsort(x)", np.argsort(x, kind="stable"))
    close(lets, "sort(m, axis: 0)", np.sort(m, axis=0))
    close(lets, "argsort(m)", np.argsort(m, axis=-1, kind="stable"))
    top = np.argsort(-m, axis=1, kind="stable")[:, :3]  # ties: the lower index first, as lax.top_k
    close(lets, "top_k(m, 3)", np.concatenate([np.take_along_axis(m, top, 1).ravel(), top.ravel()]))
    close(lets, "take_along_axis(m, i, axis: 1)", np.take_along_axis(m, i, 1))
    close(lets, "gather(m, i, axis: 1)", np.take(m, i, axis=1))
    close(lets, "one_hot(i, 6)", np.eye(6, dtype=np.float32)[i])

    cx = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    cw = rng.standard_normal((4, 3, 3, 2)).astype(np.float32)
    cb = rng.standard_normal(4).astype(np.float32)
    lets = inputs(cx=cx, cw=cw, cb=cb)
    close(lets, "conv2d(cx, cw, cb, stride: 1, padding: 0)", conv2d(cx, cw, cb, 1, 0), rtol=1e-4, atol=1e-5)
    close(lets, "conv2d(cx, cw, cb, stride: 2, padding: 1)", conv2d(cx, cw, cb, 2, 1), rtol=1e-4, atol=1e-5)
    close(lets, "max_pool2d(cx, kernel: 2, stride: 2)", pool2d(cx, 2, 2, np.max))
    close(lets, "avg_pool2d(cx, kernel: 3, stride: 2)", pool2d(cx, 3, 2, np.mean))

    q = rng.standard_normal((2, 5, 4)).astype(np.float32)
    k = rng.standard_normal((2, 7, 4)).astype(np.float32)
    v = rng.standard_normal((2, 7, 3)).astype(np.float32)
    lets = inputs(q=q, k=k, v=v)
    close(lets, "fused_attention(q, k, v, len: 7, causal: false)", attention(q, k, v, 7, False))
    close(lets, "fused_attention(q, k, v, len: 6, causal: true)", attention(q, k, v, 6, True))

    g = rng.standard_normal(6).astype(np.float32)
    be = rng.standard_normal(6).astype(np.float32)
    y = np.array([0, 5, 2, 3], np.int32)
    lets = inputs(m=m, g=g, be=be, y=y)
    m64 = m.astype(np.float64)
    mu, var = m64.mean(-1, keepdims=True), m64.var(-1, keepdims=True)
    close(lets, "nn.layer_norm(m, g, be)", (m64 - mu) / np.sqrt(var + 1e-5) * g + be, rtol=1e-4, atol=1e-5)
    close(lets, "nn.cross_entropy(m, y)", np.log(np.exp(m64).sum(-1)) - m64[np.arange(4), y])


if __name__ == "__main__":
    elementwise_and_reductions()
    integers()
    matrices_and_axes()
    sorting_indexing_conv_attention_nn()
    print(f"{DISAGREEMENTS} disagreements with NumPy")
    sys.exit(1 if DISAGREEMENTS else 0)
