"""The PyTorch side of bench/gen: the same GPT (D = 64, 4 heads, F = 256, 2 blocks, 128 ids,
context 1088) in eager mode under inference_mode, with a plain tensor key/value cache
(k_cache[:, :, t] = k; softmax over the first t + 1 positions), and without it (causal
scaled_dot_product_attention over the whole prefix); and an int8 Linear from
torch.ao.quantization.quantize_dynamic against f32 on the same shapes. Prints the lines msl's
gen.msl prints: `name milliseconds`."""
import math, time
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
D, H, FF, V, T = 64, 4, 256, 128, 1088
E = D // H


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.wq, self.wk, self.wv = (nn.Linear(D, D, bias=False) for _ in range(3))
        self.wo, self.w1, self.w2 = nn.Linear(D, D), nn.Linear(D, FF), nn.Linear(FF, D)

    def mlp(self, x):
        return x + self.w2(F.gelu(self.w1(self.ln2(x)), approximate="tanh"))

    def heads(self, a):
        b, s, _ = a.shape
        return a.view(b, s, H, E).transpose(1, 2)

    def forward(self, x):
        a = self.ln1(x)
        o = F.scaled_dot_product_attention(self.heads(self.wq(a)), self.heads(self.wk(a)), self.heads(self.wv(a)), is_causal=True)
        return self.mlp(x + self.wo(o.transpose(1, 2).reshape(x.shape)))

    def step(self, x, kc, vc, t):
        a = self.ln1(x)
        kc[:, :, t] = self.heads(self.wk(a))[:, :, 0]
        vc[:, :, t] = self.heads(self.wv(a))[:, :, 0]
        q = self.heads(self.wq(a))
        w = torch.softmax(q @ kc[:, :, : t + 1].transpose(-1, -2) / math.sqrt(E), dim=-1)
        o = w @ vc[:, :, : t + 1]
        return self.mlp(x + self.wo(o.transpose(1, 2).reshape(x.shape)))


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, D), nn.Parameter(torch.randn(T, D) * 0.1)
        self.l1, self.l2, self.lnf, self.out = Block(), Block(), nn.LayerNorm(D), nn.Linear(D, V)

    def last_logits(self, ids):
        x = self.tok(ids) + self.pos[: ids.shape[1]]
        return self.out(self.lnf(self.l2(self.l1(x))))[:, -1]


def cached_ms(m, p, n):
    caches = [torch.zeros(1, H, T, E) for _ in range(4)]
    ids = torch.zeros(1, 1, dtype=torch.long)
    for t in range(p + n):
        if t == p:
            t0 = time.perf_counter()
        x = m.tok(ids) + m.pos[t : t + 1]
        h = m.l1.step(x, caches[0], caches[1], t)
        h = m.l2.step(h, caches[2], caches[3], t)
        ids = m.out(m.lnf(h))[:, 0].argmax(-1, keepdim=True)
    return (time.perf_counter() - t0) * 1000 / n


def full_ms(m, s, n):
    ids = torch.zeros(1, s, dtype=torch.long)
    t0 = time.perf_counter()
    for _ in range(n):
        m.last_logits(ids).argmax(-1)
    return (time.perf_counter() - t0) * 1000 / n


def matmul_ms(n_rows, i, o, reps):
    lin = nn.Sequential(nn.Linear(i, o, bias=False))
    q = torch.ao.quantization.quantize_dynamic(lin, {nn.Linear}, dtype=torch.qint8)
    x = torch.randn(n_rows, i)
    out = []
    for f in (lin, q):
        f(x)
        t0 = time.perf_counter()
        for _ in range(reps):
            f(x).sum()
        out.append((time.perf_counter() - t0) * 1000 / reps)
    return out


torch.set_num_threads(2)
with torch.inference_mode():
    m = Gpt().eval()
    for p in (64, 256, 1024):
        print(f"cached_{p}", cached_ms(m, p, 32))
    for p, n in ((64, 16), (256, 8), (1024, 4)):
        print(f"full_{p}", full_ms(m, p, n))
    for (r, i, o, reps) in ((1, 1024, 4096, 50), (256, 1024, 1024, 10)):
        a, b = matmul_ms(r, i, o, reps)
        print(f"matmul_{r}x{i}x{o}_f32", a)
        print(f"matmul_{r}x{i}x{o}_int8", b)
