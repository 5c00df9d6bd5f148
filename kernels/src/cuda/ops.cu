// msl's CUDA kernels for what is not a fused elementwise tree (those are generated per tree by
// jit::cuda): reductions, arg-max/min, softmax and log-softmax, running sums, gathers, one-hot
// encodings and updates of a block, over a tensor viewed as [outer, n, inner] with the operated
// axis in the middle. Each thread computes
// whole outputs in the CPU kernels' order of operations (kernels/src/cpu/reduce.rs), so that a
// result differs from the CPU's only by the summation order the CPU's lanes choose; compiled
// with --fmad=false. Names end in the element type: _f32, _f64.

#define MSL_LOOP(count)                                                                              \
    for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x, msl_step = (long long)gridDim.x * blockDim.x; \
         o < (count); o += msl_step)

// `a` when it is NaN or wins, else `b`: the CPU's max_p / min_p.
template <typename T> __device__ inline T msl_max(T a, T b) { return (a != a || a >= b) ? a : b; }
template <typename T> __device__ inline T msl_min(T a, T b) { return (a != a || a <= b) ? a : b; }
__device__ inline float msl_exp(float x) { return expf(x); }
__device__ inline double msl_exp(double x) { return exp(x); }
__device__ inline float msl_log(float x) { return logf(x); }
__device__ inline double msl_log(double x) { return log(x); }
__device__ inline bool msl_finite(float x) { return isfinite(x); }
__device__ inline bool msl_finite(double x) { return isfinite(x); }

// Sum, mean, max and min over the middle axis: out[outer, inner]; max and min need n >= 1.
template <typename T, int OP>
__device__ inline void msl_reduce(const T* __restrict__ x, T* __restrict__ out, long long outer, long long n, long long inner) {
    MSL_LOOP(outer * inner) {
        const T* p = x + (o / inner) * n * inner + o % inner;
        T acc = OP >= 2 ? p[0] : (T)0;
        for (long long k = OP >= 2 ? 1 : 0; k < n; ++k) {
            const T v = p[k * inner];
            acc = OP == 2 ? msl_max(acc, v) : OP == 3 ? msl_min(acc, v) : acc + v;
        }
        out[o] = OP == 1 ? acc / (T)n : acc;
    }
}

// The index of the first largest (smallest) element; the first NaN wins.
template <typename T, bool LARGEST>
__device__ inline void msl_arg(const T* __restrict__ x, int* __restrict__ out, long long outer, long long n, long long inner) {
    MSL_LOOP(outer * inner) {
        const T* p = x + (o / inner) * n * inner + o % inner;
        T best = p[0];
        int at = 0;
        if (best == best) {
            for (long long k = 1; k < n; ++k) {
                const T v = p[k * inner];
                if (v != v) { at = (int)k; break; }
                if (LARGEST ? v > best : v < best) { best = v; at = (int)k; }
            }
        }
        out[o] = at;
    }
}

// Softmax (LOG: log-softmax) over the middle axis, shifted by the row's maximum, as the CPU
// computes it: a row holding +inf is NaN throughout, as in NumPy, JAX and PyTorch.
template <typename T, bool LOG>
__device__ inline void msl_softmax(const T* __restrict__ x, T* __restrict__ out, long long outer, long long n, long long inner) {
    MSL_LOOP(outer * inner) {
        const long long base = (o / inner) * n * inner + o % inner;
        T m = x[base];
        for (long long k = 1; k < n; ++k) m = msl_max(m, x[base + k * inner]);
        const T shift = m;
        T sum = 0;
        for (long long k = 0; k < n; ++k) sum += msl_exp(x[base + k * inner] - shift);
        if (LOG) {
            const T ls = msl_log(sum);
            for (long long k = 0; k < n; ++k) out[base + k * inner] = x[base + k * inner] - shift - ls;
        } else {
            const T inv = (T)1 / sum;
            for (long long k = 0; k < n; ++k) out[base + k * inner] = msl_exp(x[base + k * inner] - shift) * inv;
        }
    }
}

// Running sum over the middle axis.
template <typename T>
__device__ inline void msl_cumsum(const T* __restrict__ x, T* __restrict__ out, long long outer, long long n, long long inner) {
    MSL_LOOP(outer * inner) {
        const long long base = (o / inner) * n * inner + o % inner;
        T acc = 0;
        for (long long k = 0; k < n; ++k) {
            acc += x[base + k * inner];
            out[base + k * inner] = acc;
        }
    }
}

// out[outer, m, inner] = x[outer, idx[j], inner] for the m indices; an index outside 0..n
// sets *bad to 1 (the host reports it) and writes 0.
template <typename T>
__device__ inline void msl_gather(const T* __restrict__ x, const int* __restrict__ idx, T* __restrict__ out, int* bad,
                                  long long outer, long long n, long long inner, long long m) {
    MSL_LOOP(outer * m * inner) {
        const long long a = o / (m * inner), j = (o / inner) % m, b = o % inner;
        const int i = idx[j];
        if (i < 0 || i >= n) { *bad = 1; out[o] = (T)0; continue; }
        out[o] = x[(a * n + i) * inner + b];
    }
}

// out[j, c] = 1 where idx[j] == c, else 0, for m indices and n classes; an index outside 0..n
// raises the flag (the CPU's one_hot refuses it).
template <typename T>
__device__ inline void msl_one_hot(const int* __restrict__ idx, T* __restrict__ out, int* bad, long long m, long long n) {
    MSL_LOOP(m * n) {
        const long long j = o / n, c = o % n;
        const int i = idx[j];
        if (i < 0 || i >= n) { *bad = 1; }
        out[o] = (T)(i == c ? 1 : 0);
    }
}

// v ([outer, m, inner]) written into out ([outer, n, inner], already a copy of the tensor updated)
// at positions at..at + m of the middle axis.
template <typename T>
__device__ inline void msl_update(const T* __restrict__ v, T* __restrict__ out, long long outer, long long n,
                                  long long inner, long long m, long long at) {
    MSL_LOOP(outer * m * inner) {
        const long long a = o / (m * inner), j = (o / inner) % m, b = o % inner;
        out[(a * n + at + j) * inner + b] = v[o];
    }
}

#define MSL_AXIS_PARAMS long long outer, long long n, long long inner
#define MSL_INSTANTIATE(T, S)                                                                                   \
    extern "C" __global__ void msl_sum_##S(const T* x, T* out, MSL_AXIS_PARAMS) { msl_reduce<T, 0>(x, out, outer, n, inner); } \
    extern "C" __global__ void msl_mean_##S(const T* x, T* out, MSL_AXIS_PARAMS) { msl_reduce<T, 1>(x, out, outer, n, inner); } \
    extern "C" __global__ void msl_max_##S(const T* x, T* out, MSL_AXIS_PARAMS) { msl_reduce<T, 2>(x, out, outer, n, inner); } \
    extern "C" __global__ void msl_min_##S(const T* x, T* out, MSL_AXIS_PARAMS) { msl_reduce<T, 3>(x, out, outer, n, inner); } \
    extern "C" __global__ void msl_argmax_##S(const T* x, int* out, MSL_AXIS_PARAMS) { msl_arg<T, true>(x, out, outer, n, inner); } \
    extern "C" __global__ void msl_argmin_##S(const T* x, int* out, MSL_AXIS_PARAMS) { msl_arg<T, false>(x, out, outer, n, inner); } \
    extern "C" __global__ void msl_softmax_##S(const T* x, T* out, MSL_AXIS_PARAMS) { msl_softmax<T, false>(x, out, outer, n, inner); } \
    extern "C" __global__ void msl_log_softmax_##S(const T* x, T* out, MSL_AXIS_PARAMS) { msl_softmax<T, true>(x, out, outer, n, inner); } \
    extern "C" __global__ void msl_cumsum_##S(const T* x, T* out, MSL_AXIS_PARAMS) { msl_cumsum<T>(x, out, outer, n, inner); } \
    extern "C" __global__ void msl_gather_##S(const T* x, const int* idx, T* out, int* bad, MSL_AXIS_PARAMS, long long m) { \
        msl_gather<T>(x, idx, out, bad, outer, n, inner, m);                                                    \
    }                                                                                                           \
    extern "C" __global__ void msl_one_hot_##S(const int* idx, T* out, int* bad, long long m, long long n) {      \
        msl_one_hot<T>(idx, out, bad, m, n);                                                                    \
    }                                                                                                           \
    extern "C" __global__ void msl_update_##S(const T* v, T* out, MSL_AXIS_PARAMS, long long m, long long at) {  \
        msl_update<T>(v, out, outer, n, inner, m, at);                                                          \
    }

MSL_INSTANTIATE(float, f32)
MSL_INSTANTIATE(double, f64)

// Random numbers: the CPU's Philox4x32-10 streams (kernels/src/rng.rs), so that a tensor made
// on the device holds the CPU's values. Element j of a region (`start`, `len` of each of `rank`
// dims of a tensor of shape `shape`: a rank's block of a sharded init) draws the counter of its
// row-major index g in the whole tensor, (g mod 2^32, g div 2^32, 0, 0).
__device__ inline void msl_philox(unsigned c[4], unsigned k0, unsigned k1) {
    for (int r = 0; r < 10; ++r) {
        if (r > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        const unsigned long long p0 = (unsigned long long)0xD2511F53u * c[0];
        const unsigned long long p1 = (unsigned long long)0xCD9E8D57u * c[2];
        const unsigned n0 = (unsigned)(p1 >> 32) ^ c[1] ^ k0, n2 = (unsigned)(p0 >> 32) ^ c[3] ^ k1;
        c[1] = (unsigned)p1;
        c[3] = (unsigned)p0;
        c[0] = n0;
        c[2] = n2;
    }
}

struct msl_region { int rank; long long shape[8], start[8], len[8]; };

__device__ inline void msl_block(const msl_region& r, long long j, unsigned k0, unsigned k1, unsigned c[4]) {
    unsigned long long g = 0, stride = 1;
    for (int d = r.rank - 1; d >= 0; --d) {
        const long long n = r.len[d] > 1 ? r.len[d] : 1;
        g += (unsigned long long)(r.start[d] + j % n) * stride;
        j /= n;
        stride *= (unsigned long long)r.shape[d];
    }
    c[0] = (unsigned)g; c[1] = (unsigned)(g >> 32); c[2] = 0; c[3] = 0;
    msl_philox(c, k0, k1);
}

// 53 random bits in [0, 1).
__device__ inline double msl_unit_f64(unsigned lo, unsigned hi) {
    return (double)((((unsigned long long)hi << 32) | lo) >> 11) * (1.0 / 9007199254740992.0);
}

// Uniform in [lo, lo + scale): f32 from 24 bits of the first word, kept below `hi`.
extern "C" __global__ void msl_uniform_f32(float* out, long long n, const msl_region r, unsigned k0, unsigned k1, float lo, float scale, float hi) {
    MSL_LOOP(n) {
        unsigned c[4];
        msl_block(r, o, k0, k1, c);
        const float u = lo + scale * (float)((double)(c[0] >> 8) * (1.0 / 16777216.0));
        out[o] = (u >= hi && scale > 0.0f) ? __int_as_float(__float_as_int(hi) - 1) : u;
    }
}

extern "C" __global__ void msl_uniform_f64(double* out, long long n, const msl_region r, unsigned k0, unsigned k1, double lo, double scale) {
    MSL_LOOP(n) {
        unsigned c[4];
        msl_block(r, o, k0, k1, c);
        out[o] = lo + scale * msl_unit_f64(c[0], c[1]);
    }
}

// Normal: Box-Muller on the block's two 53-bit uniforms, in f64 (f32 results rounded from it).
__device__ inline double msl_normal(const msl_region& r, long long o, unsigned k0, unsigned k1, double mean, double sd) {
    unsigned c[4];
    msl_block(r, o, k0, k1, c);
    const double u1 = 1.0 - msl_unit_f64(c[0], c[1]);
    const double u2 = msl_unit_f64(c[2], c[3]);
    const double rad = sqrt(-2.0 * log(u1));
    return mean + sd * rad * cos(6.283185307179586 * u2);
}

extern "C" __global__ void msl_normal_f64(double* out, long long n, const msl_region r, unsigned k0, unsigned k1, double mean, double sd) {
    MSL_LOOP(n) { out[o] = msl_normal(r, o, k0, k1, mean, sd); }
}

extern "C" __global__ void msl_normal_f32(float* out, long long n, const msl_region r, unsigned k0, unsigned k1, double mean, double sd) {
    MSL_LOOP(n) { out[o] = (float)msl_normal(r, o, k0, k1, mean, sd); }
}

// Fused attention, softmax(q kᵀ / √D) v without the scores (kernels/src/cpu/attention.rs): one
// thread per query row walks the visible keys in tiles of 64 with the CPU's online softmax
// (running maximum `m`, sum `l`, output rescaled by exp(m_old - m_new) per tile), in its order
// of operations. q[B, Q, D], k[B, S, D], v[B, S, E] -> out[B, Q, E]; the first `len` keys are
// visible, and with `causal` query i (at position len - Q + i) sees the keys up to its own.
template <typename T>
__device__ inline void msl_attention(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                     T* __restrict__ out, long long batch, long long nq, long long s, long long d,
                                     long long e, long long len, int causal, T scale) {
    MSL_LOOP(batch * nq) {
        const long long b = o / nq, i = o % nq;
        const T* qi = q + (b * nq + i) * d;
        const T* kb = k + b * s * d;
        const T* vb = v + b * s * e;
        T* oi = out + (b * nq + i) * e;
        const long long visible = causal ? len - nq + i + 1 : len;
        T m = (T)__int_as_float(0xff800000), l = 0, sc[64];  // m starts at -inf
        for (long long c = 0; c < e; ++c) oi[c] = 0;
        for (long long t0 = 0; t0 < visible; t0 += 64) {
            const long long n = visible - t0 < 64 ? visible - t0 : 64;
            for (long long j = 0; j < n; ++j) {
                T acc = 0;
                for (long long c = 0; c < d; ++c) acc = acc + qi[c] * kb[(t0 + j) * d + c];
                sc[j] = acc * scale;
            }
            T top = m;
            for (long long j = 0; j < n; ++j) top = msl_max(top, sc[j]);
            const T correction = msl_exp(m - top);
            T sum = 0;
            for (long long j = 0; j < n; ++j) { sc[j] = msl_exp(sc[j] - top); sum = sum + sc[j]; }
            for (long long c = 0; c < e; ++c) oi[c] = oi[c] * correction;
            for (long long j = 0; j < n; ++j)
                for (long long c = 0; c < e; ++c) oi[c] = oi[c] + sc[j] * vb[(t0 + j) * e + c];
            l = l * correction + sum;
            m = top;
        }
        const T inv = (T)1 / l;
        for (long long c = 0; c < e; ++c) oi[c] = oi[c] * inv;
    }
}

#define MSL_ATTENTION(T, S)                                                                                       \
    extern "C" __global__ void msl_attention_##S(const T* q, const T* k, const T* v, T* out, long long batch,      \
                                                 long long nq, long long s, long long d, long long e, long long len, \
                                                 int causal, T scale) {                                           \
        msl_attention<T>(q, k, v, out, batch, nq, s, d, e, len, causal, scale);                                   \
    }
MSL_ATTENTION(float, f32)
MSL_ATTENTION(double, f64)
