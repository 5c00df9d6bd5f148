// msl's CUDA kernels for what is not a fused elementwise tree (those are generated per tree by
// jit::cuda): reductions, arg-max/min, softmax and log-softmax, running sums and gathers, over a
// tensor viewed as [outer, n, inner] with the operated axis in the middle. Each thread computes
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

// Softmax (LOG: log-softmax) over the middle axis, shifted by the row's maximum (0 when that is
// infinite), as the CPU computes it.
template <typename T, bool LOG>
__device__ inline void msl_softmax(const T* __restrict__ x, T* __restrict__ out, long long outer, long long n, long long inner) {
    MSL_LOOP(outer * inner) {
        const long long base = (o / inner) * n * inner + o % inner;
        T m = x[base];
        for (long long k = 1; k < n; ++k) m = msl_max(m, x[base + k * inner]);
        const T shift = (msl_finite(m) || m != m) ? m : (T)0;
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
    }

MSL_INSTANTIATE(float, f32)
MSL_INSTANTIATE(double, f64)
