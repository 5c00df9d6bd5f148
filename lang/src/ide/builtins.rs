//! Signatures and one-line descriptions of the builtins, for hover, completion and signature help.
//!
//! The shape rules themselves live in the checker (`check/builtins.rs`); this table only says how
//! a builtin is called, in the notation of `spec/builtins.md`.

/// `(name, signature, description)` of every builtin callable as a function.
const TABLE: &[(&str, &str, &str)] = &[
    ("zeros", "zeros(d…) -> f32[d…]", "A tensor of the given dimensions filled with 0."),
    ("ones", "ones(d…) -> f32[d…]", "A tensor of the given dimensions filled with 1."),
    ("full", "full(v, d…) -> T[d…]", "A tensor of the given dimensions filled with the scalar `v`."),
    ("arange", "arange(n) -> i32[n]", "The integers `0, 1, …, n-1`."),
    ("eye", "eye(n) -> f32[n, n]", "The `n × n` identity matrix."),
    ("normal", "normal(d…, seed: s) -> f32[d…]", "Standard normal random numbers (counter-based, reproducible)."),
    ("uniform", "uniform(d…, seed: s) -> f32[d…]", "Uniform random numbers on [0, 1)."),
    ("he_normal", "he_normal(i, o) -> f32[i, o]", "He initialisation: a normal with standard deviation `sqrt(2 / i)`."),
    ("glorot_uniform", "glorot_uniform(i, o) -> f32[i, o]", "Glorot initialisation: uniform on `±sqrt(6 / (i + o))`."),
    ("exp", "exp(x: f[..S]) -> f[..S]", "Elementwise exponential."),
    ("log", "log(x: f[..S]) -> f[..S]", "Elementwise natural logarithm."),
    ("sqrt", "sqrt(x: f[..S]) -> f[..S]", "Elementwise square root."),
    ("rsqrt", "rsqrt(x: f[..S]) -> f[..S]", "Elementwise `1 / sqrt(x)`."),
    ("tanh", "tanh(x: f[..S]) -> f[..S]", "Elementwise hyperbolic tangent."),
    ("sigmoid", "sigmoid(x: f[..S]) -> f[..S]", "Elementwise logistic sigmoid."),
    ("relu", "relu(x: T[..S]) -> T[..S]", "Elementwise `max(x, 0)`."),
    ("gelu", "gelu(x: f[..S], approximate: true) -> f[..S]", "Gaussian error linear unit: the tanh approximation, or with `approximate: false` the exact `x * 0.5 * (1 + erf(x / sqrt(2)))` (PyTorch's default)."),
    ("erf", "erf(x: f[..S]) -> f[..S]", "The error function `2/sqrt(pi) * integral of exp(-t^2) from 0 to x`."),
    ("sin", "sin(x: f[..S]) -> f[..S]", "Elementwise sine."),
    ("cos", "cos(x: f[..S]) -> f[..S]", "Elementwise cosine."),
    ("abs", "abs(x: T[..S]) -> T[..S]", "Elementwise absolute value."),
    ("sign", "sign(x: T[..S]) -> T[..S]", "Elementwise sign: −1, 0 or 1."),
    ("floor", "floor(x: f[..S]) -> f[..S]", "Rounds down, keeping the float type."),
    ("pow", "pow(x, y) -> broadcast(x, y)", "`x` to the power `y`, elementwise with broadcasting; same as `x ** y`."),
    ("maximum", "maximum(a, b) -> broadcast(a, b)", "The elementwise larger value."),
    ("minimum", "minimum(a, b) -> broadcast(a, b)", "The elementwise smaller value."),
    ("where", "where(c: bool[..], a, b) -> broadcast(c, a, b)", "`a` where `c` is true, else `b`."),
    (
        "sum",
        "sum(x, axis: k, keepdims: false)",
        "Sum of all elements, or along `axis` (several: `axis: (0, 2)`); of a model, every element of its float tensors.",
    ),
    ("mean", "mean(x, axis: k, keepdims: false)", "Mean of all elements, or along `axis`."),
    ("max", "max(x, axis: k, keepdims: false)", "Largest element, or along `axis`."),
    ("min", "min(x, axis: k, keepdims: false)", "Smallest element, or along `axis`."),
    ("argmax", "argmax(x, axis: k) -> i32", "Index of the largest element, or along `axis`."),
    ("argmin", "argmin(x, axis: k) -> i32", "Index of the smallest element, or along `axis`."),
    ("logsumexp", "logsumexp(x, axis: k, keepdims: false)", "`log(sum(exp(x)))` computed without overflow."),
    ("cumsum", "cumsum(x, axis: k)", "Running sums along axis `k`; the shape is kept (bool counts as i32)."),
    ("softmax", "softmax(x: f[..S], axis: -1) -> f[..S]", "`exp(x) / sum(exp(x))` along an axis (default the last), with the maximum subtracted first."),
    ("log_softmax", "log_softmax(x: f[..S], axis: -1) -> f[..S]", "`x - logsumexp(x)` along an axis (default the last), with the maximum subtracted first."),
    ("reshape", "reshape(x, [d…])", "The same elements in a new shape; one dimension may be `_`."),
    ("transpose", "transpose(x: T[..S, A, B]) -> T[..S, B, A]", "Swaps the last two dimensions."),
    ("permute", "permute(x, [i…])", "Reorders the dimensions."),
    ("concat", "concat([a, b, …], axis: k)", "Joins tensors along an existing axis (sizes add)."),
    ("stack", "stack([a, b, …], axis: k)", "Joins equal-shaped tensors along a new axis."),
    ("expand_dims", "expand_dims(x, axis: k)", "Inserts a dimension of size 1."),
    ("squeeze", "squeeze(x, axis: k)", "Removes a dimension of size 1."),
    ("broadcast_to", "broadcast_to(x, [d…])", "Broadcasts `x` to the given shape."),
    ("gather", "gather(x, idx, axis: k)", "Picks entries of `x` along `axis` by integer indices."),
    (
        "scatter_add",
        "scatter_add(x, idx, updates, axis: k)",
        "Adds `updates` into `x` at integer indices along `axis`.",
    ),
    ("update", "update(x, v, at: i, axis: 0)", "`x` with `v` written at position `i` of `axis` (in place when `x` is not shared): a key/value cache's step."),
    ("argsort", "argsort(x, axis: -1, descending: false) -> i32", "The positions that order `x` along an axis (stable; NaN is largest)."),
    ("sort", "sort(x, axis: -1, descending: false)", "`x` ordered along an axis (stable; NaN is largest); differentiable."),
    ("top_k", "top_k(x: T[..S, N], k) -> (T[..S, k], i32[..S, k])", "The `k` largest values of the last axis, largest first, and their positions."),
    ("take_along_axis", "take_along_axis(x, idx, axis: k)", "Picks `x`'s entries along `axis` at the positions `idx` holds, one for one (NumPy's `take_along_axis`)."),
    ("scatter_add_along", "scatter_add_along(g, idx, n, axis: k)", "The adjoint of `take_along_axis`: zeros with `g` added at `idx` along `axis` (of size `n`)."),
    ("fused_attention", "fused_attention(q, k, v, len: S, causal: false)", "`softmax(q kᵀ / √D) v` for `q[..B, Q, D]`, `k[..B, S, D]`, `v[..B, S, E]` in one kernel (online softmax, no Q×S scores); only the first `len` keys are visible, and when `causal` query `i` sees keys up to position `len - Q + i`."),
    ("attention_weights", "attention_weights(q, k, len: S, causal: false)", "The softmax weights `[..B, Q, S]` of `fused_attention`'s mask (hidden keys 0)."),
    ("quantize", "quantize(m, i8)", "`m` (a model or a matrix) with every `f32` matrix held as int8 with one scale per output channel; `x @ w` with such a `w` is an int8 product. Same type as `m`."),
    ("prune", "prune(m, sparsity: s)", "`m` with the fraction `s` of each matrix's weights, the smallest in magnitude, set to zero. Same type as `m`."),
    ("categorical", "categorical(logits: f[..S, C], seed: s) -> i32[..S]", "One class per row drawn with probabilities `softmax(logits)` (Gumbel-max over `uniform(seed: s)`)."),
    ("one_hot", "one_hot(y: i32[..S], n) -> f32[..S, n]", "One-hot encoding of integer labels."),
    ("einsum", "einsum(\"spec\", a, b, …)", "Einstein summation, e.g. `einsum(\"bij,bjk->bik\", a, b)`."),
    (
        "conv2d",
        "conv2d(x: f[N, C, H, W], w: f[O, C, KH, KW], b: f[O], stride: s, padding: p) -> f[N, O, OH, OW]",
        "2-D cross-correlation (NCHW, as PyTorch); `OH = (H + 2p - KH) / s + 1`, floor division; the bias is optional.",
    ),
    (
        "conv2d_input_grad",
        "conv2d_input_grad(g: f[N, O, OH, OW], w: f[O, C, KH, KW], size: [H, W], stride: s, padding: p) -> f[N, C, H, W]",
        "The gradient of `conv2d` with respect to its input (the transposed convolution).",
    ),
    (
        "conv2d_weight_grad",
        "conv2d_weight_grad(x: f[N, C, H, W], g: f[N, O, OH, OW], kernel: [KH, KW], stride: s, padding: p) -> f[O, C, KH, KW]",
        "The gradient of `conv2d` with respect to its weights.",
    ),
    (
        "max_pool2d",
        "max_pool2d(x: f[N, C, H, W], kernel: k, stride: s) -> f[N, C, OH, OW]",
        "The maximum of each `k × k` window (stride defaults to `k`); `max_pool2d(x, v, …)` picks `v` at those maxima.",
    ),
    (
        "max_pool2d_grad",
        "max_pool2d_grad(x: f[N, C, H, W], g: f[N, C, OH, OW], kernel: k, stride: s) -> f[N, C, H, W]",
        "The gradient of `max_pool2d`: `g` sent to the first maximum of each window.",
    ),
    ("avg_pool2d", "avg_pool2d(x: f[N, C, H, W], kernel: k, stride: s) -> f[N, C, OH, OW]", "The mean of each `k × k` window."),
    (
        "avg_pool2d_grad",
        "avg_pool2d_grad(g: f[N, C, OH, OW], size: [H, W], kernel: k, stride: s) -> f[N, C, H, W]",
        "The gradient of `avg_pool2d`: each window's cotangent spread evenly over it.",
    ),
    ("params", "params(m) -> i32", "The number of parameters of a model."),
    ("map", "map(f, m, …)", "Applies a rank-polymorphic function to every tensor of one or more models."),
    ("init", "init(Model[…], seed: s)", "A model with every field initialised from its initialiser."),
    (
        "grad",
        "grad(f, wrt: p)",
        "The gradient of a scalar function with respect to a parameter (the first by default).",
    ),
    ("value_and_grad", "value_and_grad(f, wrt: p)", "A function returning `(value, gradient)`."),
    ("jvp", "jvp(f, primals, tangents)", "Forward mode: `(value, tangent)`."),
    ("vjp", "vjp(f, primals…)", "Reverse mode: `(value, pullback)`."),
    ("vmap", "vmap(f, in_axes: (…))", "Maps a function over a new leading dimension."),
    ("jacfwd", "jacfwd(f)(x)", "The Jacobian `[out…, in…]` of `f` at `x` by forward mode (a `jvp` per input element)."),
    ("jacrev", "jacrev(f)(x)", "The Jacobian `[out…, in…]` of `f` at `x` by reverse mode (a `grad` per output element)."),
    ("hessian", "hessian(f)(x)", "The Hessian `[in…, in…]` of a scalar `f` at `x`: `jacfwd(grad(f))(x)`."),
    ("stop_gradient", "stop_gradient(x) -> x", "The value of `x`, treated as a constant by differentiation."),
    (
        "print",
        "print(a, b, …, precision: k)",
        "Writes its arguments separated by one space and ends the line; `precision: k` prints floats with k decimals.",
    ),
    (
        "load",
        "load(path)",
        "Loads `.npy`, `.npz` (`\"file.npz:name\"`), `.safetensors`, `.csv`, `.txt` (bytes as `i32[N]`), or a checkpoint folder (`\"ckpt/\"`).",
    ),
    (
        "save",
        "save(path, value)",
        "Saves a tensor, a model or a tuple: one file, or a checkpoint folder when the path ends in `/`.",
    ),
    (
        "clock",
        "clock() -> f64",
        "Seconds on a monotonic clock since the process started, for timing (`clock() - t0`).",
    ),
    (
        "exists",
        "exists(path) -> bool",
        "Whether a file or folder is there; for a path ending in `/`, whether a complete checkpoint is.",
    ),
    (
        "log_scalar",
        "log_scalar(\"name\", step: i32, value: f32)",
        "Records a scalar at a step for TensorBoard (`msl run` writes `runs/<program>/`; `msl plot` draws it).",
    ),
    ("assert", "assert(c: bool, \"message\")", "Fails the run when `c` is false."),
    (
        "assert_close",
        "assert_close(a, b, rtol: 1e-5, atol: 1e-6)",
        "Fails the run when `a` and `b` differ beyond the tolerances.",
    ),
    ("batches", "batches(x, y, size: B, shuffle: seed, drop_last: true)", "Mini-batches of `(x, y)` for a `for (xb, yb) in …` loop; `drop_last: false` keeps a smaller last batch."),
    ("f32", "f32(x: T[..S]) -> f32[..S]", "Converts to `f32`, keeping the shape."),
    ("f64", "f64(x: T[..S]) -> f64[..S]", "Converts to `f64`, keeping the shape."),
    ("i32", "i32(x: T[..S]) -> i32[..S]", "Converts to `i32`, keeping the shape."),
    ("bool", "bool(x: T[..S]) -> bool[..S]", "Converts to `bool`, keeping the shape."),
    (
        "bf16",
        "bf16(x: T[..S]) -> bf16[..S]",
        "Converts to `bf16` (2 bytes an element, f32's range; computed in f32), rounding to nearest even.",
    ),
    (
        "f16",
        "f16(x: T[..S]) -> f16[..S]",
        "Converts to `f16` (IEEE half precision, 2 bytes an element; computed in f32), rounding to nearest even.",
    ),
];

/// The signature and description of a builtin, if `name` is one.
pub fn builtin_info(name: &str) -> Option<(&'static str, &'static str)> {
    TABLE.iter().find(|(n, _, _)| *n == name).map(|(_, s, d)| (*s, *d))
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_builtin_has_a_signature() {
        let missing: Vec<&str> =
            crate::ir::Prim::builtin_names().iter().copied().filter(|n| super::builtin_info(n).is_none()).collect();
        assert!(missing.is_empty(), "builtins without a signature: {missing:?}");
    }
}
