//! Static sizes: a shape whose dims are all known at compile time and whose elements no tensor
//! can hold (more than `kernels::tensor::MAX_ELEMENTS`) is a diagnostic, not a run-time error.

use super::*;

impl Checker {
    /// Reports `v`'s type if it is a static shape too large for a tensor, once: an expression
    /// around one already reported (`sum(ones(N, N))`) is not reported again.
    pub(super) fn check_static_size(&mut self, v: &ir::Expr, span: Span) {
        let Type::Tensor(TensorTy { shape, .. }) = &v.ty else { return };
        let mut dims = Vec::with_capacity(shape.len());
        for item in shape {
            match item {
                ShapeItem::Dim(d) => match d.as_const().and_then(|c| u128::try_from(c).ok()) {
                    Some(c) => dims.push(c),
                    None => return,
                },
                ShapeItem::Rest(_) => return,
            }
        }
        let count = dims.iter().filter(|&&d| d != 0).try_fold(1u128, |a, &d| a.checked_mul(d));
        if count.is_some_and(|c| c <= kernels::tensor::MAX_ELEMENTS as u128) {
            return;
        }
        let inside = |s: &Span| s.file == span.file && span.start <= s.start && s.end <= span.end;
        if self.oversized.iter().any(inside) {
            return;
        }
        self.oversized.push(span);
        let msg = kernels::KernelError::SizeOverflow { dims }.to_string();
        self.error(
            Diagnostic::error(Code::E0105, span, msg)
                .label(format!("this is {}", self.ty_str(&v.ty)))
                .with_help("a tensor holds at most 2^60 - 1 elements"),
        );
    }
}
