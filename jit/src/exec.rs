//! Running a compiled loop over broadcast inputs: the loop nest around the generated code.
//!
//! The output shape is the NumPy broadcast of the inputs' shapes. Dimensions of size 1 are
//! dropped and neighbours that are contiguous in every input are merged (as the CPU kernels'
//! `Plan` does), leaving rows: the innermost merged dimension, along which each input is either
//! contiguous or broadcast (read once). The generated function computes one row, or a chunk of
//! one long row; this module walks the outer dimensions and spreads work over rayon's threads.

use crate::codegen::KernelFn;
use kernels::{DType, Storage, Tensor};
use rayon::prelude::*;

/// Outputs with at least this many elements are computed by several threads.
const PAR_MIN: usize = 1 << 15;

/// How the outputs of one call are laid out over its inputs.
#[derive(Clone, Debug)]
pub struct Layout {
    pub shape: Vec<usize>,
    pub n: usize,
    /// Length of one row.
    pub row_len: usize,
    /// Sizes of the outer dimensions (outermost first) and each input's stride in each.
    outer: Vec<usize>,
    outer_strides: Vec<Vec<usize>>,
    /// For each input: true when it is read once per row (stride 0 along the row).
    pub bcast: Vec<bool>,
}

/// The layout for these inputs, or `None` when their shapes do not broadcast together.
pub fn layout(inputs: &[Tensor]) -> Option<Layout> {
    // The common case first: inputs of one shape, and scalars.
    let first = inputs.iter().find(|t| t.rank() > 0).map_or(&[][..], |t| t.shape());
    if inputs.iter().all(|t| t.rank() == 0 || t.shape() == first) {
        let n = first.iter().product();
        return Some(Layout {
            shape: first.to_vec(),
            n,
            row_len: n,
            outer: Vec::new(),
            outer_strides: vec![Vec::new(); inputs.len()],
            bcast: inputs.iter().map(|t| t.rank() == 0).collect(),
        });
    }
    let mut shape: Vec<usize> = Vec::new();
    for t in inputs {
        shape = kernels::ops::broadcast_shapes("fused", &shape, t.shape()).ok()?;
    }
    let n: usize = shape.iter().product();
    let strides: Vec<Vec<usize>> = inputs.iter().map(|t| broadcast_strides(t.shape(), &shape)).collect();
    // Merge, innermost last: (size, per-input strides).
    let mut dims: Vec<(usize, Vec<usize>)> = Vec::new();
    for (i, &size) in shape.iter().enumerate() {
        if size == 1 {
            continue;
        }
        let st: Vec<usize> = strides.iter().map(|s| s[i]).collect();
        if let Some(last) = dims.last_mut() {
            if last.1.iter().zip(&st).all(|(&outer, &inner)| outer == inner * size) {
                last.0 *= size;
                last.1 = st;
                continue;
            }
        }
        dims.push((size, st));
    }
    let (row_len, row_strides) = dims.pop().unwrap_or((1, vec![0; inputs.len()]));
    // Contiguous inputs have stride 1 or 0 along the innermost dimension of size > 1.
    if row_strides.iter().any(|&s| s > 1) {
        return None;
    }
    let bcast = row_strides.iter().map(|&s| s == 0).collect();
    let outer_strides = (0..inputs.len()).map(|k| dims.iter().map(|d| d.1[k]).collect()).collect();
    Some(Layout {
        n,
        row_len: if n == 0 { 0 } else { row_len },
        outer: dims.iter().map(|d| d.0).collect(),
        outer_strides,
        shape,
        bcast,
    })
}

/// Strides (in elements) that read a contiguous tensor of shape `src` broadcast to `out`.
fn broadcast_strides(src: &[usize], out: &[usize]) -> Vec<usize> {
    let lead = out.len() - src.len();
    let mut own = vec![0; src.len()];
    let mut acc = 1;
    for i in (0..src.len()).rev() {
        own[i] = if src[i] == 1 { 0 } else { acc };
        acc *= src[i];
    }
    (0..out.len()).map(|i| if i < lead { 0 } else { own[i - lead] }).collect()
}

fn data_ptr(t: &Tensor) -> usize {
    t.storage().addr()
}

/// The buffer of input `t` when nothing else refers to it (then `t` is left a placeholder).
fn take_unique(t: &mut Tensor) -> Option<Buf> {
    let (shape, storage) = std::mem::replace(t, Tensor::scalar_bool(false)).into_parts();
    let back = |s| Tensor::new(shape.clone(), s).expect("the tensor's own shape and storage");
    let r = match storage {
        Storage::F32(a) => a.into_vec().map(Buf::F32).map_err(Storage::F32),
        Storage::F64(a) => a.into_vec().map(Buf::F64).map_err(Storage::F64),
        Storage::I32(a) => a.into_vec().map(Buf::I32).map_err(Storage::I32),
        Storage::Bool(a) => a.into_vec().map(Buf::Bool).map_err(Storage::Bool),
        s @ (Storage::Bf16(_) | Storage::F16(_)) => Err(s),
    };
    match r {
        Ok(b) => Some(b),
        Err(s) => {
            *t = back(s);
            None
        }
    }
}

/// Runs `f` over the layout and returns the output tensor of element type `out`. With
/// `reuse`, the output goes into the buffer of an input of the output's type and shape that
/// nothing else refers to (an element is read before it is written at the same index); the
/// flag says whether that happened.
pub fn run(f: KernelFn, inputs: &mut [Tensor], lay: &Layout, out: DType, reuse: bool) -> (Tensor, bool) {
    let mut donated = None;
    if reuse {
        for (k, t) in inputs.iter_mut().enumerate() {
            if !lay.bcast[k] && t.dtype() == out && t.shape() == lay.shape.as_slice() {
                if let Some(b) = take_unique(t) {
                    donated = Some((k, b));
                    break;
                }
            }
        }
    }
    let mut base: Vec<usize> = inputs.iter().map(data_ptr).collect();
    let mut size: Vec<usize> = inputs.iter().map(|t| t.dtype().size_in_bytes()).collect();
    let osize = out.size_in_bytes();
    let reused = donated.is_some();
    let mut buf = match donated {
        Some((k, b)) => {
            // The donor's slot holds a placeholder now: read the buffer as the output.
            base[k] = b.ptr();
            size[k] = osize;
            b
        }
        // Not zeroed: the loops below write every element before the length is set (a freed
        // buffer reused by `kernels::pool` would otherwise be cleared for nothing).
        None => match out {
            DType::F32 => Buf::F32(Vec::with_capacity(lay.n)),
            DType::F64 => Buf::F64(Vec::with_capacity(lay.n)),
            DType::I32 => Buf::I32(Vec::with_capacity(lay.n)),
            DType::Bool => Buf::Bool(Vec::with_capacity(lay.n)),
            // Never fused (`fuse::elem_ok`): computed in f32.
            DType::Bf16 | DType::F16 => Buf::F32(Vec::with_capacity(lay.n)),
        },
    };
    let obase = match &mut buf {
        Buf::F32(v) => v.as_mut_ptr() as usize,
        Buf::F64(v) => v.as_mut_ptr() as usize,
        Buf::I32(v) => v.as_mut_ptr() as usize,
        Buf::Bool(v) => v.as_mut_ptr() as usize,
    };
    if lay.n > 0 {
        let rows = lay.n / lay.row_len;
        // The pointers of row `r`'s inputs, starting `start` elements into the row.
        let row_ptrs = |r: usize, start: usize, ptrs: &mut Vec<*const u8>| {
            ptrs.clear();
            for k in 0..base.len() {
                let mut off = if lay.bcast[k] { 0 } else { start };
                let mut rest = r;
                for d in (0..lay.outer.len()).rev() {
                    off += (rest % lay.outer[d]) * lay.outer_strides[k][d];
                    rest /= lay.outer[d];
                }
                ptrs.push((base[k] + off * size[k]) as *const u8);
            }
        };
        let call = |r: usize, start: usize, len: usize, ptrs: &mut Vec<*const u8>| {
            row_ptrs(r, start, ptrs);
            let o = (obase + (r * lay.row_len + start) * osize) as *mut u8;
            // SAFETY: every pointer addresses `len` elements (contiguous inputs) or one element
            // (broadcast inputs) of a live tensor, and `o` addresses `len` elements of the
            // output, which no other call writes; `f` was compiled for exactly these element
            // types and broadcast flags.
            unsafe { f(ptrs.as_ptr(), o, len) };
        };
        let threads = rayon::current_num_threads();
        if lay.n < PAR_MIN || threads < 2 {
            let mut ptrs = Vec::with_capacity(base.len());
            for r in 0..rows {
                call(r, 0, lay.row_len, &mut ptrs);
            }
        } else if rows < threads * 4 {
            // Few long rows: split each row into chunks (whole vectors, 64-byte lines).
            let tasks_per_row = (threads * 4).div_ceil(rows);
            let chunk = lay.row_len.div_ceil(tasks_per_row).next_multiple_of(16).max(PAR_MIN / 8);
            let per_row = lay.row_len.div_ceil(chunk);
            let _awake = kernels::threads::Linger;
            (0..rows * per_row).into_par_iter().for_each(|t| {
                let (r, c) = (t / per_row, t % per_row);
                let start = c * chunk;
                call(r, start, chunk.min(lay.row_len - start), &mut Vec::new());
            });
        } else {
            let group = rows.div_ceil(threads * 4);
            let _awake = kernels::threads::Linger;
            (0..rows.div_ceil(group)).into_par_iter().for_each(|g| {
                let mut ptrs = Vec::with_capacity(base.len());
                for r in g * group..((g + 1) * group).min(rows) {
                    call(r, 0, lay.row_len, &mut ptrs);
                }
            });
        }
    }
    if !reused {
        // SAFETY: the capacity is `lay.n`, and the calls above wrote every element of
        // `0..lay.n` (each row whole, or in chunks that cover it) with a valid value of the
        // output's element type (the compiled code stores `bool`s as 0 or 1).
        unsafe { buf.set_len(lay.n) };
    }
    let shape = lay.shape.clone();
    let t = match buf {
        Buf::F32(v) => Tensor::from_vec(shape, v),
        Buf::F64(v) => Tensor::from_vec(shape, v),
        Buf::I32(v) => Tensor::from_vec(shape, v),
        Buf::Bool(v) => Tensor::from_vec(shape, v),
    }
    .expect("the output has the layout's element count");
    (t, reused)
}

/// One input of [`run_parts`]: its address at each part, or one address for every part.
pub enum PartInput {
    /// Read once per part (a scalar): the address of its one element.
    Each(usize),
    /// The address of the part's first element, part by part (contiguous within the part),
    /// and the size of an element in bytes.
    Parts(Vec<usize>, usize),
}

/// Runs `f` over parts of `lens[i]` elements each, input `k` read through `inputs[k]`; the
/// output is one buffer of every part, part after part, of element type `out`. `donor` is
/// the buffer of an input the output may take (its own parts at the same places: an element
/// is read before it is written at the same index), else one is allocated. Long parts are
/// split into chunks of whole vectors, and the chunks of all parts go to rayon's threads
/// together, so a model of many tensors costs one fan-out, not one per tensor.
pub fn run_parts(
    f: KernelFn,
    inputs: &[PartInput],
    lens: &[usize],
    out: DType,
    donor: Option<&mut Tensor>,
) -> (Tensor, bool) {
    let n: usize = lens.iter().sum();
    let donated = donor.and_then(take_unique);
    let reused = donated.is_some();
    let mut buf = match donated {
        Some(b) => b,
        None => match out {
            DType::F32 => Buf::F32(Vec::with_capacity(n)),
            DType::F64 => Buf::F64(Vec::with_capacity(n)),
            DType::I32 => Buf::I32(Vec::with_capacity(n)),
            DType::Bool => Buf::Bool(Vec::with_capacity(n)),
            DType::Bf16 | DType::F16 => Buf::F32(Vec::with_capacity(n)),
        },
    };
    let obase = buf.ptr();
    let osize = out.size_in_bytes();
    let mut starts = Vec::with_capacity(lens.len());
    let mut at = 0;
    for &l in lens {
        starts.push(at);
        at += l;
    }
    let threads = rayon::current_num_threads();
    let chunk = if n < PAR_MIN || threads < 2 {
        usize::MAX
    } else {
        n.div_ceil(threads * 4).next_multiple_of(16).max(PAR_MIN / 8)
    };
    // (part, first element in the part, elements)
    let mut tasks: Vec<(usize, usize, usize)> = Vec::new();
    for (i, &l) in lens.iter().enumerate() {
        let mut s = 0;
        while s < l {
            let len = (l - s).min(chunk);
            tasks.push((i, s, len));
            s += len;
        }
    }
    let call = |&(i, start, len): &(usize, usize, usize)| {
        let ptrs: Vec<*const u8> = inputs
            .iter()
            .map(|inp| match inp {
                PartInput::Each(a) => *a as *const u8,
                PartInput::Parts(p, size) => (p[i] + start * size) as *const u8,
            })
            .collect();
        let o = (obase + (starts[i] + start) * osize) as *mut u8;
        // SAFETY: every `Parts` address starts `lens[i]` elements of a live tensor at part `i`
        // (so `start + len ≤ lens[i]` elements are in bounds), every `Each` address one
        // element, and `o` addresses `len` elements of the output, which no other task writes
        // (tasks cover disjoint ranges); `f` was compiled for these element types with the
        // `Each` inputs broadcast.
        unsafe { f(ptrs.as_ptr(), o, len) };
    };
    if tasks.len() > 1 && chunk != usize::MAX {
        let _awake = kernels::threads::Linger;
        tasks.par_iter().for_each(call);
    } else {
        tasks.iter().for_each(call);
    }
    if !reused {
        // SAFETY: the capacity is `n`, and the tasks above wrote every element of `0..n`
        // (each part whole, in chunks that cover it) with a valid value of the element type.
        unsafe { buf.set_len(n) };
    }
    let t = match buf {
        Buf::F32(v) => Tensor::from_vec(vec![n], v),
        Buf::F64(v) => Tensor::from_vec(vec![n], v),
        Buf::I32(v) => Tensor::from_vec(vec![n], v),
        Buf::Bool(v) => Tensor::from_vec(vec![n], v),
    };
    (t.expect("the output has the parts' element count"), reused)
}

/// The output buffer while the loop writes it.
enum Buf {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I32(Vec<i32>),
    Bool(Vec<bool>),
}

impl Buf {
    /// # Safety
    /// As `Vec::set_len`: `n` is within capacity and the first `n` elements are initialised.
    unsafe fn set_len(&mut self, n: usize) {
        // SAFETY: the caller's guarantee.
        unsafe {
            match self {
                Buf::F32(v) => v.set_len(n),
                Buf::F64(v) => v.set_len(n),
                Buf::I32(v) => v.set_len(n),
                Buf::Bool(v) => v.set_len(n),
            }
        }
    }

    fn ptr(&self) -> usize {
        match self {
            Buf::F32(v) => v.as_ptr() as usize,
            Buf::F64(v) => v.as_ptr() as usize,
            Buf::I32(v) => v.as_ptr() as usize,
            Buf::Bool(v) => v.as_ptr() as usize,
        }
    }
}
