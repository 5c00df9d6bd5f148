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


def elementwise_and_reductions():
    rng = np.random.default_rng(0)
    special = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1e-30, -1e-30, 1e-45, 3.4e38, -3.4e38, np.inf, -np.inf, np.nan,
                        88.7, 88.8, -87.3, -103.0, -104.0, 20.0, -20.0, 9.0, -9.0, 1e7, -1e7, 0.1, 2.5, -2.5, 3.5, -3.5,
                        1.5, -1.5, 6.0, -6.0, 10.0, -10.0, 1e-8, 2.0**-126, 15.0, 0.7, 100.0, -100.0], dtype=np.float32)
    x = np.concatenate([special, rng.standard_normal(60).astype(np.float32) * 5, (rng.standard_normal(30) * 100).astype(np.float32)])
    y = np.concatenate([np.roll(special, 7), rng.standard_normal(60).astype(np.float32) * 3, np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 7.0] * 5, np.float32)])
    np.save("x.npy", x); np.save("y.npy", y)
    N = len(x)
    def run(expr):
        src = f'fn main() {{\n    let x: f32[{N}] = load("x.npy")\n    let y: f32[{N}] = load("y.npy")\n    print({expr})\n}}\n'
        open("p.msl", "w").write(src)
        p = subprocess.run([MSL, "run", "p.msl"], capture_output=True, text=True)
        if p.returncode != 0:
            return None, p.stderr.strip().splitlines()[:3]
        out = p.stdout.strip()
        return out, None
    def parse(s):
        s = s.strip()
        if s.startswith("["):
            s = s[1:-1]
            return np.array([float(v) for v in s.split(",")]) if s else np.array([])
        return np.array([float(s)])
    def erf(v): return np.vectorize(math.erf)(v.astype(np.float64)).astype(np.float32)
    with np.errstate(all="ignore"):
        f = np.float32
        gelu = lambda v: (0.5 * v.astype(np.float64) * (1 + np.tanh(math.sqrt(2/math.pi) * (v.astype(np.float64) + 0.044715 * v.astype(np.float64)**3))))
        unary = {
            "exp(x)": np.exp(x), "log(x)": np.log(x), "sqrt(x)": np.sqrt(x), "rsqrt(x)": (1/np.sqrt(x.astype(np.float64))).astype(f),
            "tanh(x)": np.tanh(x), "sigmoid(x)": (1/(1+np.exp(-x.astype(np.float64)))).astype(f), "relu(x)": np.maximum(x, f(0)),
            "gelu(x)": gelu(x), "erf(x)": erf(x), "sin(x)": np.sin(x), "cos(x)": np.cos(x), "abs(x)": np.abs(x),
            "sign(x)": np.sign(x), "floor(x)": np.floor(x), "-x": -x,
            "gelu(x, approximate: false)": (0.5*x.astype(np.float64)*(1+erf(x/np.float32(math.sqrt(2))).astype(np.float64))).astype(f),
            "x + y": x + y, "x - y": x - y, "x * y": x * y, "x / y": x / y, "x % y": np.mod(x, y), "x ** y": np.power(x, y),
            "maximum(x, y)": np.maximum(x, y), "minimum(x, y)": np.minimum(x, y),
            "f32(x < y)": (x < y).astype(f), "f32(x == y)": (x == y).astype(f), "f32(x >= y)": (x >= y).astype(f),
            "f32(x != y)": (x != y).astype(f),
            "where(x > y, x, y)": np.where(x > y, x, y),
        }
        red = {
            "sum(x)": np.sum(x, dtype=np.float64), "mean(y)": np.mean(y.astype(np.float64)), "max(x)": np.max(x), "min(x)": np.min(x),
            "argmax(x)": np.argmax(x), "argmin(x)": np.argmin(x), "logsumexp(y)": np.log(np.sum(np.exp(y.astype(np.float64)))),
            "softmax(x[60:90])": None, "cumsum(x[60:90], axis: 0)": np.cumsum(x[60:90].astype(np.float64)),
            "log_softmax(x[60:90])": None,
        }
        z = x[60:90].astype(np.float64); e = np.exp(z - z.max())
        red["softmax(x[60:90])"] = e / e.sum(); red["log_softmax(x[60:90])"] = (z - z.max()) - np.log(e.sum())
    bad = [0]
    def compare(expr, want, tol, atol=1e-37):
        out, err = run(expr)
        if out is None:
            print(f"{expr}: msl failed: {err}"); bad[0] += 1; return
        got = parse(out); want = np.atleast_1d(np.asarray(want, dtype=np.float64))
        if got.shape != want.shape:
            print(f"{expr}: shape {got.shape} vs {want.shape}: {out[:200]}"); bad[0] += 1; return
        for i, (g, w) in enumerate(zip(got, want)):
            xi = x[i] if i < len(x) else None; yi = y[i] if i < len(y) else None
            if np.isnan(w) or np.isnan(g):
                if not (np.isnan(w) and np.isnan(g)):
                    print(f"{expr}[{i}] x={xi!r} y={yi!r}: msl {g!r} numpy {w!r}"); bad[0] += 1
                continue
            if np.isinf(w) or np.isinf(g):
                if g != w:
                    print(f"{expr}[{i}] x={xi!r} y={yi!r}: msl {g!r} numpy {w!r}"); bad[0] += 1
                continue
            if abs(g - w) > tol * max(abs(w), 1e-30) and abs(g - w) > atol:
                print(f"{expr}[{i}] x={xi!r} y={yi!r}: msl {g!r} numpy {w!r} rel {abs(g-w)/max(abs(w),1e-30):.2e}"); bad[0] += 1
    for k, v in unary.items():
        # gelu's left tail is x times a tiny probability: compared to an absolute bound far
        # below one unit of x (float32 cannot do better than f64's 1 + tanh(u) there).
        compare(k, v, 2e-6, 1e-7 if k.startswith("gelu") else 1e-37)
    for k, v in red.items():
        compare(k, v, 1e-5)
    return bad[0]


def integers():
    a = np.array([7, -7, 7, -7, 0, 1, -1, 2147483647, -2147483648, 13, -13, 100, 5, 6, -6, 3], dtype=np.int32)
    b = np.array([2, 2, -2, -2, 3, 1, 5, 1, -1, 4, 4, -7, 5, -3, 1, 3], dtype=np.int32)
    np.save("a.npy", a); np.save("b.npy", b)
    N = len(a)
    def run(expr):
        src = f'fn main() {{\n    let a: i32[{N}] = load("a.npy")\n    let b: i32[{N}] = load("b.npy")\n    print({expr})\n}}\n'
        open("q.msl", "w").write(src)
        p = subprocess.run([MSL, "run", "q.msl"], capture_output=True, text=True)
        return (p.stdout.strip() if p.returncode == 0 else "ERR " + p.stderr.strip().splitlines()[0])
    with np.errstate(all="ignore"):
        cases = {"a + b": a + b, "a - b": a - b, "a * b": a * b, "a / b": np.floor_divide(a, b), "a % b": np.mod(a, b),
                 "maximum(a, b)": np.maximum(a, b), "abs(a)": np.abs(a), "-a": -a, "sign(a)": np.sign(a),
                 "sum(a)": np.sum(a, dtype=np.int32), "max(a)": a.max(), "argmin(a)": a.argmin(), "cumsum(a, axis: 0)": np.cumsum(a, dtype=np.int32),
                 "a ** 2": a ** 2}
    bad = 0
    for k, v in cases.items():
        got = run(k)
        want = str(v.tolist()).replace(" ", "") if isinstance(v, np.ndarray) else str(int(v))
        if got.replace(" ", "") != want:
            print(f"{k}:\n  msl   {got}\n  numpy {want}")
            bad += 1
    return bad


def matrices_and_axes():
    rng = np.random.default_rng(1)
    A = rng.standard_normal((5, 7)).astype(np.float32); A[1, 2] = np.nan; A[3, 4] = np.inf
    B = rng.standard_normal((7, 3)).astype(np.float32)
    C = rng.standard_normal((2, 5, 7)).astype(np.float32) * 10
    np.save("A.npy", A); np.save("B.npy", B); np.save("C.npy", C)
    def run(expr):
        src = f'fn main() {{\n    let a: f32[5, 7] = load("A.npy")\n    let b: f32[7, 3] = load("B.npy")\n    let c: f32[2, 5, 7] = load("C.npy")\n    print({expr})\n}}\n'
        open("r.msl", "w").write(src)
        p = subprocess.run([MSL, "run", "r.msl"], capture_output=True, text=True)
        return p.stdout.strip() if p.returncode == 0 else None, p.stderr
    def parse(s):
        s = s.replace("[", " ").replace("]", " ").replace(",", " ")
        return np.array([float(t) for t in s.split()])
    C64 = C.astype(np.float64)
    def sm(z, ax):
        e = np.exp(z - z.max(axis=ax, keepdims=True)); return e / e.sum(axis=ax, keepdims=True)
    cases = {
      "a @ b": A.astype(np.float64) @ B, "c @ b": C64 @ B, "sum(c, axis: 1)": C64.sum(1), "mean(c, axis: 2, keepdims: true)": C64.mean(2, keepdims=True),
      "max(c, axis: 0)": C.max(0), "argmax(c, axis: 2)": C.argmax(2), "softmax(c, axis: 1)": sm(C64, 1), "log_softmax(c)": np.log(sm(C64, 2)),
      "logsumexp(c, axis: 1)": np.log(np.exp(C64).sum(1)), "transpose(a)": A.T, "permute(c, [2, 0, 1])": C.transpose(2, 0, 1),
      "sum(c, axis: (0, 2))": C64.sum((0, 2)), "cumsum(c, axis: 1)": np.cumsum(C64, 1), "einsum(\"bij,jk->bik\", c, b)": C64 @ B,
      "c[1, 2:4, ::3]": C[1, 2:4, ::3], "c[:, -1]": C[:, -1], "reshape(c, [10, 7])": C.reshape(10, 7), "concat([a, a], axis: 1)": np.concatenate([A, A], 1),
      "var_sum(a)": None,
    }
    cases.pop("var_sum(a)")
    bad = 0
    for k, want in cases.items():
        out, err = run(k)
        if out is None:
            print(k, "FAILED", err.strip().splitlines()[:2]); bad += 1; continue
        got = parse(out); w = np.asarray(want, dtype=np.float64).ravel()
        if got.shape != w.shape:
            print(k, "shape", got.shape, w.shape); bad += 1; continue
        ok = np.allclose(got, w, rtol=2e-5, atol=1e-5, equal_nan=True)
        if not ok:
            i = np.argmax(~np.isclose(got, w, rtol=2e-5, atol=1e-5, equal_nan=True))
            print(k, "differs at", i, got[i], w[i]); bad += 1
    return bad


def sorting_indexing_conv_attention_nn():
    rng = np.random.default_rng(3)
    def run(decls, expr):
        pre = "use nn\n" if decls.startswith("use nn\n") else ""
        decls = decls[len(pre):]
        src = pre + "fn main() {\n" + decls + f"    print({expr})\n}}\n"
        open("p.msl", "w").write(src)
        p = subprocess.run([MSL, "run", "p.msl"], capture_output=True, text=True)
        return (p.stdout.strip(), None) if p.returncode == 0 else (None, p.stderr.strip()[:300])
    def parse(s):
        s = s.replace("[", " ").replace("]", " ").replace(",", " ").replace("(", " ").replace(")", " ")
        return np.array([float(t) for t in s.split()])
    bad = 0
    def cmp(name, decls, expr, want, rtol=2e-5, atol=1e-6):
        nonlocal bad
        out, err = run(decls, expr)
        if out is None:
            print(name, "FAILED:", err); bad += 1; return
        got = parse(out); w = np.asarray(want, dtype=np.float64).ravel()
        if got.shape != w.shape or not np.allclose(got, w, rtol=rtol, atol=atol, equal_nan=True):
            print(name, "\n  msl  ", out[:300], "\n  numpy", w[:40]); bad += 1
    # sorting with NaN/ties
    x = np.array([3.0, np.nan, -1.0, 3.0, 0.0, -0.0, np.inf, -np.inf, 2.0, 3.0], np.float32)
    np.save("x.npy", x)
    D = '    let x: f32[10] = load("x.npy")\n'
    cmp("sort", D, "sort(x)", np.sort(x))
    cmp("argsort", D, "argsort(x)", np.argsort(x, kind="stable"))
    # descending stable: numpy equivalent: stable sort on negated key, NaN largest first?
    m = rng.standard_normal((4, 6)).astype(np.float32); m[1, 2] = m[1, 4]
    np.save("m.npy", m)
    M = '    let m: f32[4, 6] = load("m.npy")\n'
    cmp("sort axis0", M, "sort(m, axis: 0)", np.sort(m, axis=0))
    cmp("argsort last", M, "argsort(m)", np.argsort(m, axis=-1, kind="stable"))
    idx = np.argsort(-m, axis=1, kind="stable")[:, :3]  # ties: the lower index first, as lax.top_k
    cmp("top_k", M, "top_k(m, 3)", np.concatenate([np.take_along_axis(m, idx, 1).ravel(), idx.ravel()]))
    ids = np.array([[0, 5, 2], [1, 1, 3], [5, 4, 0], [2, 2, 2]], np.int32); np.save("ids.npy", ids)
    I = '    let i: i32[4, 3] = load("ids.npy")\n'
    cmp("take_along", M + I, "take_along_axis(m, i, axis: 1)", np.take_along_axis(m, ids, 1))
    cmp("gather", M + I, "gather(m, i, axis: 1)", np.take(m, ids, axis=1))
    cmp("one_hot", I, "one_hot(i, 6)", np.eye(6, dtype=np.float32)[ids])
    # conv2d and pooling
    X = rng.standard_normal((2, 3, 7, 6)).astype(np.float32); W = rng.standard_normal((4, 3, 3, 2)).astype(np.float32); Bb = rng.standard_normal(4).astype(np.float32)
    np.save("X.npy", X); np.save("W.npy", W); np.save("B.npy", Bb)
    C = '    let x: f32[2, 3, 7, 6] = load("X.npy")\n    let w: f32[4, 3, 3, 2] = load("W.npy")\n    let b: f32[4] = load("B.npy")\n'
    def conv(x, w, b, s, p):
        x = np.pad(x.astype(np.float64), ((0,0),(0,0),(p,p),(p,p)))
        N,Cc,H,Wd = x.shape; O,_,KH,KW = w.shape
        OH=(H-KH)//s+1; OW=(Wd-KW)//s+1
        out=np.zeros((N,O,OH,OW))
        for i in range(OH):
            for j in range(OW):
                out[:,:,i,j]=np.einsum("nchw,ochw->no", x[:,:,i*s:i*s+KH,j*s:j*s+KW], w)
        return out + b[None,:,None,None]
    cmp("conv2d s1p0", C, "conv2d(x, w, b, stride: 1, padding: 0)", conv(X, W, Bb, 1, 0), rtol=1e-4, atol=1e-5)
    cmp("conv2d s2p1", C, "conv2d(x, w, b, stride: 2, padding: 1)", conv(X, W, Bb, 2, 1), rtol=1e-4, atol=1e-5)
    def pool(x, k, s, f):
        N,Cc,H,Wd = x.shape; OH=(H-k)//s+1; OW=(Wd-k)//s+1
        out=np.zeros((N,Cc,OH,OW))
        for i in range(OH):
            for j in range(OW):
                out[:,:,i,j]=f(x[:,:,i*s:i*s+k,j*s:j*s+k].astype(np.float64), axis=(2,3))
        return out
    cmp("max_pool", C, "max_pool2d(x, kernel: 2, stride: 2)", pool(X, 2, 2, np.max))
    cmp("avg_pool k3 s2", C, "avg_pool2d(x, kernel: 3, stride: 2)", pool(X, 3, 2, np.mean))
    # attention
    q = rng.standard_normal((2, 5, 4)).astype(np.float32); k = rng.standard_normal((2, 7, 4)).astype(np.float32); v = rng.standard_normal((2, 7, 3)).astype(np.float32)
    np.save("q.npy", q); np.save("k.npy", k); np.save("v.npy", v)
    A = '    let q: f32[2, 5, 4] = load("q.npy")\n    let k: f32[2, 7, 4] = load("k.npy")\n    let v: f32[2, 7, 3] = load("v.npy")\n'
    def att(q, k, v, n, causal):
        s = np.einsum("bqd,bsd->bqs", q.astype(np.float64), k) / math.sqrt(q.shape[-1])
        Q = q.shape[1]
        mask = np.zeros((Q, k.shape[1]), bool); mask[:, n:] = True
        if causal:
            for i in range(Q):
                mask[i, n - Q + i + 1:] = True
        s = np.where(mask, -np.inf, s)
        e = np.exp(s - s.max(-1, keepdims=True)); p = e / e.sum(-1, keepdims=True)
        return np.einsum("bqs,bse->bqe", p, v)
    cmp("attention", A, "fused_attention(q, k, v, len: 7, causal: false)", att(q, k, v, 7, False))
    cmp("attention len 6 causal", A, "fused_attention(q, k, v, len: 6, causal: true)", att(q, k, v, 6, True))
    # stdlib
    g = rng.standard_normal(6).astype(np.float32); be = rng.standard_normal(6).astype(np.float32); np.save("g.npy", g); np.save("be.npy", be)
    L = M + '    let g: f32[6] = load("g.npy")\n    let be: f32[6] = load("be.npy")\n'
    mu = m.astype(np.float64).mean(-1, keepdims=True); var = m.astype(np.float64).var(-1, keepdims=True)
    cmp("layer_norm", "use nn\n" + L, "nn.layer_norm(m, g, be)", (m - mu) / np.sqrt(var + 1e-5) * g + be, rtol=1e-4, atol=1e-5)
    y = np.array([0, 5, 2, 3], np.int32); np.save("y.npy", y)
    lse = np.log(np.exp(m.astype(np.float64)).sum(-1))
    cmp("cross_entropy", "use nn\n" + M + '    let y: i32[4] = load("y.npy")\n', "nn.cross_entropy(m, y)", lse - m[np.arange(4), y])
    return bad


if __name__ == "__main__":
    bad = elementwise_and_reductions() + integers() + matrices_and_axes() + sorting_indexing_conv_attention_nn()
    print(f"{bad} disagreements with NumPy")
    sys.exit(1 if bad else 0)
