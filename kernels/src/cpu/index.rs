//! Indexing kernels: slices, gather/scatter along an axis, and one-hot encoding.

use crate::cpu::num::Num;
use crate::cpu::{check_axis, contiguous_strides, dispatch, strided_copy, Plan};
use crate::error::KernelError;
use crate::tensor::{checked_numel, DType, Element, Storage, Tensor};

/// How one axis is sliced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SliceSpec {
    /// One position; the axis is removed. Negative values count from the end.
    Index(i64),
    /// Positions `start..end`, which must satisfy `0 <= start <= end <= size`.
    Range { start: i64, end: i64 },
    /// The whole axis.
    Full,
}

/// Where a slice starts in the base tensor, and the region it covers (Index axes as size 1).
struct Region {
    offset: usize,
    shape: Vec<usize>,
    strides: Vec<usize>,
    out_shape: Vec<usize>,
}

fn resolve(shape: &[usize], specs: &[SliceSpec]) -> Result<Region, KernelError> {
    if specs.len() > shape.len() {
        return Err(KernelError::Invalid(format!(
            "slice: {} indices given for a tensor of rank {}",
            specs.len(),
            shape.len()
        )));
    }
    let strides = contiguous_strides(shape);
    let mut offset = 0;
    let mut region = shape.to_vec();
    let mut out_shape = Vec::with_capacity(shape.len());
    for (axis, &size) in shape.iter().enumerate() {
        let spec = specs.get(axis).copied().unwrap_or(SliceSpec::Full);
        let out_of_range = |index: i64| KernelError::IndexOutOfRange { index, axis, size };
        match spec {
            SliceSpec::Full => out_shape.push(size),
            SliceSpec::Index(i) => {
                let pos = if i < 0 { i + size as i64 } else { i };
                if pos < 0 || pos >= size as i64 {
                    return Err(out_of_range(i));
                }
                offset += pos as usize * strides[axis];
                region[axis] = 1;
            }
            SliceSpec::Range { start, end } => {
                if start < 0 || start > size as i64 {
                    return Err(out_of_range(start));
                }
                if end < start || end > size as i64 {
                    return Err(out_of_range(end));
                }
                offset += start as usize * strides[axis];
                region[axis] = (end - start) as usize;
                out_shape.push(region[axis]);
            }
        }
    }
    Ok(Region { offset, shape: region, strides, out_shape })
}

/// Basic slicing. Missing trailing specs mean `Full`; `Index` removes its axis.
pub fn slice(x: &Tensor, specs: &[SliceSpec]) -> Result<Tensor, KernelError> {
    let r = resolve(x.shape(), specs)?;
    Ok(dispatch!(x, v => Tensor::from_parts(
        r.out_shape.clone(),
        strided_copy(v, r.offset, &r.shape, &r.strides)
    )))
}

/// `zeros(base_shape)` with `upd` added into the region `specs` selects: the gradient of
/// [`slice`]. `upd` must have the shape that `slice` would return.
pub fn slice_update_add(base_shape: &[usize], specs: &[SliceSpec], upd: &Tensor) -> Result<Tensor, KernelError> {
    checked_numel(base_shape)?;
    let r = resolve(base_shape, specs)?;
    if upd.shape() != r.out_shape.as_slice() {
        return Err(KernelError::ShapeMismatch { op: "slice_update_add", lhs: r.out_shape, rhs: upd.shape().to_vec() });
    }
    fn place<T: Element>(base_shape: &[usize], r: &Region, u: &[T]) -> Tensor {
        let n: usize = base_shape.iter().product();
        let mut out = vec![T::zero(); n];
        let src_strides = contiguous_strides(&r.shape);
        let plan = Plan::new(&r.shape, &[&r.strides, &src_strides]);
        let (sd, ss) = (plan.row_strides[0], plan.row_strides[1]);
        // Slice regions never overlap themselves, so plain stores equal adding into zeros.
        plan.for_each_row(|off| {
            for j in 0..plan.row_len {
                out[r.offset + off[0] + j * sd] = u[off[1] + j * ss];
            }
        });
        Tensor::from_parts(base_shape.to_vec(), out)
    }
    Ok(dispatch!(upd, u => place(base_shape, &r, u)))
}

/// The i32 indices of `idx`, each checked against `size` (negative indices are errors).
fn checked_indices(idx: &Tensor, axis: usize, size: usize) -> Result<&[i32], KernelError> {
    let ix = idx.as_i32().ok_or_else(|| KernelError::dtype("gather", "i32 indices", idx.dtype()))?;
    if let Some(&bad) = ix.iter().find(|&&i| i < 0 || i as usize >= size) {
        return Err(KernelError::IndexOutOfRange { index: bad as i64, axis, size });
    }
    Ok(ix)
}

/// `numpy.take(x, idx, axis)`: the result has shape
/// `x.shape[..axis] ++ idx.shape ++ x.shape[axis+1..]`.
pub fn gather(x: &Tensor, idx: &Tensor, axis: usize) -> Result<Tensor, KernelError> {
    check_axis("gather", axis, x.rank())?;
    let size = x.shape()[axis];
    let ix = checked_indices(idx, axis, size)?;
    let outer: usize = x.shape()[..axis].iter().product();
    let inner: usize = x.shape()[axis + 1..].iter().product();
    let mut shape = x.shape()[..axis].to_vec();
    shape.extend_from_slice(idx.shape());
    shape.extend_from_slice(&x.shape()[axis + 1..]);
    // The result combines dims of two tensors, so its size is new and checked; an empty one
    // is made at once (the copy loop would still run `outer` times, which may be 2^40).
    if checked_numel(&shape)? == 0 {
        return crate::cpu::shape::zeros(x.dtype(), &shape);
    }
    fn take<T: Element>(v: &[T], ix: &[i32], outer: usize, size: usize, inner: usize) -> Vec<T> {
        let mut out = Vec::with_capacity(outer * ix.len() * inner);
        for o in 0..outer {
            for &i in ix {
                let start = (o * size + i as usize) * inner;
                out.extend_from_slice(&v[start..start + inner]);
            }
        }
        out
    }
    Ok(dispatch!(x, v => Tensor::from_parts(shape, take(v, ix, outer, size, inner))))
}

/// The adjoint of [`gather`]: `zeros(x_shape)` with each slice of `upd` added at its index
/// (repeated indices accumulate). `upd` must have the shape `gather` would return.
pub fn scatter_add(x_shape: &[usize], idx: &Tensor, upd: &Tensor, axis: usize) -> Result<Tensor, KernelError> {
    check_axis("scatter_add", axis, x_shape.len())?;
    let empty = checked_numel(x_shape)? == 0;
    let size = x_shape[axis];
    let ix = checked_indices(idx, axis, size)?;
    let outer: usize = x_shape[..axis].iter().product();
    let inner: usize = x_shape[axis + 1..].iter().product();
    let mut expected = x_shape[..axis].to_vec();
    expected.extend_from_slice(idx.shape());
    expected.extend_from_slice(&x_shape[axis + 1..]);
    if upd.shape() != expected.as_slice() {
        return Err(KernelError::ShapeMismatch { op: "scatter_add", lhs: expected, rhs: upd.shape().to_vec() });
    }
    if empty && upd.dtype() != DType::Bool {
        // Nothing to add into; the loop below would still run `outer` times.
        return crate::cpu::shape::zeros(upd.dtype(), x_shape);
    }
    fn add<T: Num>(u: &[T], ix: &[i32], x_shape: &[usize], outer: usize, inner: usize) -> Tensor {
        let size = x_shape.iter().product::<usize>() / (outer * inner).max(1);
        let mut out = vec![T::zero(); x_shape.iter().product()];
        for o in 0..outer {
            for (j, &i) in ix.iter().enumerate() {
                let dst = (o * size + i as usize) * inner;
                let src = (o * ix.len() + j) * inner;
                for (d, &s) in out[dst..dst + inner].iter_mut().zip(&u[src..src + inner]) {
                    *d = d.add_w(s);
                }
            }
        }
        Tensor::from_parts(x_shape.to_vec(), out)
    }
    match upd.storage() {
        Storage::F32(u) => Ok(add(u, ix, x_shape, outer, inner)),
        Storage::F64(u) => Ok(add(u, ix, x_shape, outer, inner)),
        Storage::I32(u) => Ok(add(u, ix, x_shape, outer, inner)),
        Storage::Bool(_) => Err(KernelError::dtype("scatter_add", "a numeric tensor", DType::Bool)),
        Storage::Bf16(_) | Storage::F16(_) => upd.in_f32(|w| scatter_add(x_shape, idx, w, axis)),
    }
}

/// One-hot encoding: shape `idx.shape ++ [n]`, 1 at each index and 0 elsewhere.
pub fn one_hot(idx: &Tensor, n: usize, dtype: DType) -> Result<Tensor, KernelError> {
    let ix = idx.as_i32().ok_or_else(|| KernelError::dtype("one_hot", "i32 indices", idx.dtype()))?;
    if let Some(&bad) = ix.iter().find(|&&i| i < 0 || i as usize >= n) {
        return Err(KernelError::IndexOutOfRange { index: bad as i64, axis: idx.rank(), size: n });
    }
    let mut shape = idx.shape().to_vec();
    shape.push(n);
    let mut v = vec![0.0f64; checked_numel(&shape)?];
    for (row, &i) in ix.iter().enumerate() {
        v[row * n + i as usize] = 1.0;
    }
    Ok(Tensor::from_parts(shape, v).cast(dtype))
}

/// `x` with the block `v` written at positions `at..at + m` of `axis`, `m` being `v`'s size
/// there (a `v` of one rank less is one position, as `x[at] = v`). The buffer of `x` is reused
/// when nothing else shares it, so a key/value cache updated in a loop is written in place.
pub fn update(x: Tensor, v: &Tensor, at: i64, axis: usize) -> Result<Tensor, KernelError> {
    let end = update_fits(&x, v, at, axis)?;
    let specs: Vec<SliceSpec> =
        (0..x.rank()).map(|i| if i == axis { SliceSpec::Range { start: at, end } } else { SliceSpec::Full }).collect();
    update_region(x, v, &specs)
}

/// Whether `update(x, v, at, axis)` can write (the end of the written range), so that a
/// caller holding `x` by reference can check before handing it over.
pub(crate) fn update_fits(x: &Tensor, v: &Tensor, at: i64, axis: usize) -> Result<i64, KernelError> {
    update_check((x.shape(), x.dtype()), (v.shape(), v.dtype()), at, axis)
}

/// [`update_fits`] from the shapes and element types of `x` and `v` (a device's tensors).
pub(crate) fn update_check(
    (x_shape, x_dtype): (&[usize], DType),
    (v_shape, v_dtype): (&[usize], DType),
    at: i64,
    axis: usize,
) -> Result<i64, KernelError> {
    let rank = x_shape.len();
    check_axis("update", axis, rank)?;
    if v_dtype != x_dtype {
        return Err(KernelError::DTypeMismatch {
            op: "update",
            expected: x_dtype.to_string(),
            found: v_dtype.to_string(),
        });
    }
    let mut vshape = v_shape.to_vec();
    if v_shape.len() + 1 == rank {
        vshape.insert(axis, 1);
    }
    let fits = vshape.len() == rank && (0..rank).all(|i| i == axis || vshape[i] == x_shape[i]);
    if !fits {
        return Err(KernelError::ShapeMismatch { op: "update", lhs: x_shape.to_vec(), rhs: v_shape.to_vec() });
    }
    let (n, m) = (x_shape[axis], vshape[axis]);
    let end = at.saturating_add(m as i64);
    if at < 0 || end > n as i64 {
        let index = if at < 0 { at } else { end - 1 };
        return Err(KernelError::IndexOutOfRange { index, axis, size: n });
    }
    Ok(end)
}

fn update_region(x: Tensor, v: &Tensor, specs: &[SliceSpec]) -> Result<Tensor, KernelError> {
    let r = resolve(x.shape(), specs)?;
    fn write<T: Element>(buf: crate::tensor::Shared<T>, r: &Region, u: &[T]) -> Vec<T> {
        let mut out = buf.into_vec().unwrap_or_else(|shared| shared.as_slice().to_vec());
        let src_strides = contiguous_strides(&r.shape);
        let plan = Plan::new(&r.shape, &[&r.strides, &src_strides]);
        let (sd, ss) = (plan.row_strides[0], plan.row_strides[1]);
        plan.for_each_row(|off| {
            for j in 0..plan.row_len {
                out[r.offset + off[0] + j * sd] = u[off[1] + j * ss];
            }
        });
        out
    }
    let (shape, storage) = x.into_parts();
    let out = match (storage, v.storage()) {
        (Storage::F32(b), Storage::F32(u)) => Storage::F32(write(b, &r, u.as_slice()).into()),
        (Storage::F64(b), Storage::F64(u)) => Storage::F64(write(b, &r, u.as_slice()).into()),
        (Storage::I32(b), Storage::I32(u)) => Storage::I32(write(b, &r, u.as_slice()).into()),
        (Storage::Bool(b), Storage::Bool(u)) => Storage::Bool(write(b, &r, u.as_slice()).into()),
        _ => return Err(KernelError::Invalid("update: element types differ".into())),
    };
    Tensor::new(shape, out)
}
