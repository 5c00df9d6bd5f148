//! Signatures and one-line descriptions of the builtins, for hover, completion and signature help.
//!
//! A primitive's are in the primitive table (`ir::prim`, `Prim::info`); this table holds the
//! special forms' (`init`, the transforms, `batches`, the conversions …), which are not one
//! primitive each, in the notation of `spec/builtins.md`.

/// `(name, signature, description)` of every builtin that is not a primitive.
const TABLE: &[(&str, &str, &str)] = &[
    (
        "sort",
        "sort(x, axis: -1, descending: false)",
        "`x` ordered along an axis (stable; NaN is largest); differentiable.",
    ),
    (
        "top_k",
        "top_k(x: T[..S, N], k) -> (T[..S, k], i32[..S, k])",
        "The `k` largest values of the last axis, largest first, and their positions.",
    ),
    (
        "categorical",
        "categorical(logits: f[..S, C], seed: s) -> i32[..S]",
        "One class per row drawn with probabilities `softmax(logits)` (Gumbel-max over `uniform(seed: s)`).",
    ),
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
    (
        "jacrev",
        "jacrev(f)(x)",
        "The Jacobian `[out…, in…]` of `f` at `x` by reverse mode (a `grad` per output element).",
    ),
    ("hessian", "hessian(f)(x)", "The Hessian `[in…, in…]` of a scalar `f` at `x`: `jacfwd(grad(f))(x)`."),
    (
        "batches",
        "batches(x, y, size: B, shuffle: seed, drop_last: true)",
        "Mini-batches of `(x, y)` for a `for (xb, yb) in …` loop; `drop_last: false` keeps a smaller last batch.",
    ),
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

/// The signature and description of a builtin, if `name` is one: a primitive's from the
/// primitive table (`Prim::info`), a special form's from `TABLE`.
pub fn builtin_info(name: &str) -> Option<(&'static str, &'static str)> {
    let prim = crate::ir::Prim::ALL.iter().find(|p| p.callable() && p.name() == name).and_then(|p| p.info());
    prim.or_else(|| TABLE.iter().find(|(n, _, _)| *n == name).map(|(_, s, d)| (*s, *d)))
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
