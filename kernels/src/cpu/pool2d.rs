//! 2-D max and average pooling over NCHW tensors (square windows, no padding, as
//! `torch.nn.functional.max_pool2d` / `avg_pool2d` with `padding=0`) and their adjoints.
//!
//! Max pooling picks the first maximum of each window in row-major order (a NaN counts as the
//! maximum, so it propagates), which is where PyTorch sends the gradient; the adjoint adds the
//! cotangent of every window at that one position.

use rayon::prelude::*;

use crate::cpu::num::Float;
use crate::error::KernelError;
use crate::tensor::{checked_numel, Storage, Tensor};

/// The sizes of one pooling: input `[n, c, h, w]`, output `[n, c, oh, ow]`,
/// `oh = (h - k) / stride + 1` (floor division).
#[derive(Clone, Copy, Debug)]
struct Geo {
    planes: usize,
    h: usize,
    w: usize,
    k: usize,
    s: usize,
    oh: usize,
    ow: usize,
}

impl Geo {
    fn new(op: &'static str, shape: &[usize], k: usize, s: usize) -> Result<Geo, KernelError> {
        let &[n, c, h, w] = shape else {
            return Err(KernelError::Invalid(format!("{op}: the input must have rank 4, found shape {shape:?}")));
        };
        if s == 0 {
            return Err(KernelError::Invalid(format!("{op}: the stride must be at least 1")));
        }
        if k == 0 || k > h || k > w {
            return Err(KernelError::Invalid(format!("{op}: the window {k}×{k} does not fit the input {h}×{w}")));
        }
        let (oh, ow) = ((h - k) / s + 1, (w - k) / s + 1);
        checked_numel(&[n, c, oh, ow])?;
        Ok(Geo { planes: n * c, h, w, k, s, oh, ow })
    }

    /// The flat position (in its plane) of the first maximum of window (`oy`, `ox`) of `x`.
    fn argmax<T: Float>(&self, x: &[T], oy: usize, ox: usize) -> usize {
        let mut best = (oy * self.s) * self.w + ox * self.s;
        for i in 0..self.k {
            let row = (oy * self.s + i) * self.w + ox * self.s;
            for j in row..row + self.k {
                let (v, b) = (x[j], x[best]);
                if v > b || (v.is_nan_v() && !b.is_nan_v()) {
                    best = j;
                }
            }
        }
        best
    }
}

fn float_pair(op: &'static str, a: &Tensor, b: &Tensor) -> Result<(), KernelError> {
    if a.dtype() != b.dtype() || !a.dtype().is_float() {
        return Err(KernelError::DTypeMismatch {
            op,
            expected: format!("float operands of one element type ({})", a.dtype()),
            found: b.dtype().to_string(),
        });
    }
    Ok(())
}

/// `max_pool2d(x, k, s)`, or with `v` (shaped like `x`) the elements of `v` where `x` has the
/// first maximum of each window.
pub fn max_pool2d(x: &Tensor, v: Option<&Tensor>, k: usize, s: usize) -> Result<Tensor, KernelError> {
    let op = "max_pool2d";
    let v = v.unwrap_or(x);
    float_pair(op, x, v)?;
    if x.shape() != v.shape() {
        return Err(KernelError::ShapeMismatch { op, lhs: x.shape().to_vec(), rhs: v.shape().to_vec() });
    }
    let g = Geo::new(op, x.shape(), k, s)?;
    let shape = vec![x.shape()[0], x.shape()[1], g.oh, g.ow];
    fn run<T: Float>(x: &[T], v: &[T], g: &Geo) -> Vec<T> {
        let (hw, o) = (g.h * g.w, g.oh * g.ow);
        let mut out = vec![T::zero(); g.planes * o];
        if o == 0 || hw == 0 {
            return out;
        }
        out.par_chunks_mut(o).zip(x.par_chunks(hw).zip(v.par_chunks(hw))).for_each(|(dst, (xp, vp))| {
            for oy in 0..g.oh {
                for ox in 0..g.ow {
                    dst[oy * g.ow + ox] = vp[g.argmax(xp, oy, ox)];
                }
            }
        });
        out
    }
    Ok(match (x.storage(), v.storage()) {
        (Storage::F32(a), Storage::F32(b)) => Tensor::from_parts(shape, run(a, b, &g)),
        (Storage::F64(a), Storage::F64(b)) => Tensor::from_parts(shape, run(a, b, &g)),
        _ => return Err(KernelError::dtype(op, "a float tensor", x.dtype())),
    })
}

/// The adjoint of `max_pool2d`: `g[n, c, oh, ow]` added at the first maximum of each window of
/// `x`, shaped like `x`.
pub fn max_pool2d_grad(x: &Tensor, g: &Tensor, k: usize, s: usize) -> Result<Tensor, KernelError> {
    let op = "max_pool2d_grad";
    float_pair(op, x, g)?;
    let geo = Geo::new(op, x.shape(), k, s)?;
    let want = [x.shape()[0], x.shape()[1], geo.oh, geo.ow];
    if g.shape() != want {
        return Err(KernelError::ShapeMismatch { op, lhs: g.shape().to_vec(), rhs: want.to_vec() });
    }
    fn run<T: Float>(x: &[T], gr: &[T], g: &Geo) -> Vec<T> {
        let (hw, o) = (g.h * g.w, g.oh * g.ow);
        let mut out = vec![T::zero(); g.planes * hw];
        if o == 0 || hw == 0 {
            return out;
        }
        out.par_chunks_mut(hw).zip(x.par_chunks(hw).zip(gr.par_chunks(o))).for_each(|(dst, (xp, gp))| {
            for oy in 0..g.oh {
                for ox in 0..g.ow {
                    let i = g.argmax(xp, oy, ox);
                    dst[i] = dst[i] + gp[oy * g.ow + ox];
                }
            }
        });
        out
    }
    let shape = x.shape().to_vec();
    Ok(match (x.storage(), g.storage()) {
        (Storage::F32(a), Storage::F32(b)) => Tensor::from_parts(shape, run(a, b, &geo)),
        (Storage::F64(a), Storage::F64(b)) => Tensor::from_parts(shape, run(a, b, &geo)),
        _ => return Err(KernelError::dtype(op, "a float tensor", x.dtype())),
    })
}

/// `avg_pool2d(x, k, s)`: the mean of each `k×k` window.
pub fn avg_pool2d(x: &Tensor, k: usize, s: usize) -> Result<Tensor, KernelError> {
    let op = "avg_pool2d";
    float_pair(op, x, x)?;
    let g = Geo::new(op, x.shape(), k, s)?;
    let shape = vec![x.shape()[0], x.shape()[1], g.oh, g.ow];
    fn run<T: Float>(x: &[T], g: &Geo) -> Vec<T> {
        let (hw, o) = (g.h * g.w, g.oh * g.ow);
        let mut out = vec![T::zero(); g.planes * o];
        if o == 0 || hw == 0 {
            return out;
        }
        let n = T::from_usize(g.k * g.k);
        out.par_chunks_mut(o).zip(x.par_chunks(hw)).for_each(|(dst, xp)| {
            for oy in 0..g.oh {
                for ox in 0..g.ow {
                    let mut acc = T::zero();
                    for i in 0..g.k {
                        let row = (oy * g.s + i) * g.w + ox * g.s;
                        for &v in &xp[row..row + g.k] {
                            acc = acc + v;
                        }
                    }
                    dst[oy * g.ow + ox] = acc / n;
                }
            }
        });
        out
    }
    Ok(match x.storage() {
        Storage::F32(a) => Tensor::from_parts(shape, run(a, &g)),
        Storage::F64(a) => Tensor::from_parts(shape, run(a, &g)),
        _ => return Err(KernelError::dtype(op, "a float tensor", x.dtype())),
    })
}

/// The adjoint of `avg_pool2d`: each window's cotangent divided by `k²` and added over the
/// window, giving `[n, c, h, w]`.
pub fn avg_pool2d_grad(g: &Tensor, size: [usize; 2], k: usize, s: usize) -> Result<Tensor, KernelError> {
    let op = "avg_pool2d_grad";
    float_pair(op, g, g)?;
    let &[n, c, ..] = g.shape() else {
        return Err(KernelError::Invalid(format!("{op}: the gradient must have rank 4, found shape {:?}", g.shape())));
    };
    let geo = Geo::new(op, &[n, c, size[0], size[1]], k, s)?;
    if g.shape() != [n, c, geo.oh, geo.ow] {
        return Err(KernelError::ShapeMismatch { op, lhs: g.shape().to_vec(), rhs: vec![n, c, geo.oh, geo.ow] });
    }
    fn run<T: Float>(gr: &[T], g: &Geo) -> Vec<T> {
        let (hw, o) = (g.h * g.w, g.oh * g.ow);
        let mut out = vec![T::zero(); g.planes * hw];
        if o == 0 || hw == 0 {
            return out;
        }
        let n = T::from_usize(g.k * g.k);
        out.par_chunks_mut(hw).zip(gr.par_chunks(o)).for_each(|(dst, gp)| {
            for oy in 0..g.oh {
                for ox in 0..g.ow {
                    let share = gp[oy * g.ow + ox] / n;
                    for i in 0..g.k {
                        let row = (oy * g.s + i) * g.w + ox * g.s;
                        for d in &mut dst[row..row + g.k] {
                            *d = *d + share;
                        }
                    }
                }
            }
        });
        out
    }
    let shape = vec![n, c, size[0], size[1]];
    Ok(match g.storage() {
        Storage::F32(a) => Tensor::from_parts(shape, run(a, &geo)),
        Storage::F64(a) => Tensor::from_parts(shape, run(a, &geo)),
        _ => return Err(KernelError::dtype(op, "a float tensor", g.dtype())),
    })
}
