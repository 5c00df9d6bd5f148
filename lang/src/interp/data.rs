//! Data in and out of the interpreter: `load`, `save`, `exists`, `log_scalar` and `for … in batches(…)`.

use super::checkpoint::{assemble, mark_groups, named_tensors, pack};
use super::value::{scalar_i64, Value};
use super::{dtype_of, kerr, rt, Frame, Interp, R};
use crate::diag::Code;
use crate::ir::Expr;
use crate::source::Span;
use crate::types::TensorTy;
use crate::types::{Elem, ShapeItem, Type};
use kernels::{io, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The lower-case extension of a path.
fn extension(p: &Path) -> Option<String> {
    p.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase)
}

/// A kernel error as a run-time error whose message names the path as the program wrote it
/// (`shown`), not where it was found (`full`).
fn shown_as(e: kernels::KernelError, full: &Path, shown: &str, span: Span) -> super::Ctrl {
    let full = full.display().to_string();
    match kerr(e, span) {
        super::Ctrl::Error(mut r) => {
            r.message = r.message.replace(&full, shown);
            super::Ctrl::Error(r)
        }
        c => c,
    }
}

/// Whether a path names a checkpoint folder: it ends in `/`.
pub(crate) fn is_checkpoint(p: &str) -> bool {
    p.ends_with('/')
}

/// Where `load` finds a relative path: in the working directory `work` (the process's when
/// `None`) if it is there, else next to the program (`source`); `msl dryrun` reads headers the same way.
pub(crate) fn resolve_path(work: Option<&Path>, source: Option<&Path>, p: &str) -> PathBuf {
    let path = Path::new(p);
    let here = match work {
        Some(d) if path.is_relative() => d.join(path),
        _ => path.to_path_buf(),
    };
    if path.is_absolute() || here.exists() {
        return here;
    }
    match source {
        Some(d) if d.join(path).exists() => d.join(path),
        _ => here,
    }
}

/// Splits `"file.npz:name"` into the file and the entry.
pub(crate) fn split_entry(p: &str) -> (&str, Option<&str>) {
    if let Some((file, entry)) = p.rsplit_once(':') {
        let lower = file.to_ascii_lowercase();
        if lower.ends_with(".npz") || lower.ends_with(".safetensors") {
            return (file, Some(entry));
        }
    }
    (p, None)
}

impl Interp<'_> {
    /// A relative path in the working directory ([`Interp::work_dir`], else the process's).
    pub(crate) fn in_work_dir(&self, path: &Path) -> PathBuf {
        match &self.work_dir {
            Some(d) if path.is_relative() => d.join(path),
            _ => path.to_path_buf(),
        }
    }

    /// A relative path is tried against the working directory, then the program's directory.
    fn resolve(&self, p: &str) -> PathBuf {
        resolve_path(self.work_dir.as_deref(), self.source_dir.as_deref(), p)
    }

    /// `exists(path)`: whether the path names a file or folder (resolved as `load` resolves
    /// it); for a checkpoint path (ending in `/`), whether a complete checkpoint is there.
    pub(crate) fn exists(&mut self, path: &Value, span: Span) -> R<Value> {
        let Value::Str(p) = path else { return Err(rt(Code::E0605, "`exists` needs a path", span)) };
        let full = self.resolve(p);
        let found = if is_checkpoint(p) { io::checkpoint::is_complete(&full) } else { full.exists() };
        Ok(Value::Tensor(Tensor::scalar_bool(found)))
    }

    pub(crate) fn load(&mut self, path: &Value, ty: &Type, span: Span, frame: &mut Frame) -> R<Value> {
        let Value::Str(p) = path else { return Err(rt(Code::E0605, "`load` needs a path", span)) };
        let (file, entry) = if is_checkpoint(p) { (&**p, None) } else { split_entry(p) };
        let full = self.resolve(file);
        let kerr = |e: kernels::KernelError| shown_as(e, &full, file, span);
        if is_checkpoint(p) {
            let mut wanted = Vec::new();
            let node = self.plan(ty, "", &frame.dims, &HashMap::new(), span, &mut wanted)?;
            mark_groups(&node, &mut wanted, &mut 0, &mut 0);
            // In a sharded run each rank reads only the blocks of its model fields.
            let sharded = self.spmd.clone();
            let by_block = sharded.as_deref().is_some_and(|s| self.set_regions(s, &node, &mut wanted));
            let tensors = io::checkpoint::read_checkpoint(&full, &wanted).map_err(kerr)?;
            let v = pack(assemble(self.prog, &node, &mut tensors.into_iter().map(Value::Tensor), span)?);
            return match sharded {
                Some(s) if !by_block => self.localize(&s, v, span),
                // A stack split over an axis is read layer by layer, whole: keep this rank's run.
                Some(s) => self.stacks_split(&s, v, span),
                _ => Ok(v),
            };
        }
        match ty {
            Type::Tensor(TensorTy { elem: Elem::T(et), shape, .. }) => {
                let want = dtype_of(*et);
                // CSV holds text numbers: they are read as the annotated type, and one that type
                // cannot hold is an error naming its row and column. Other formats must already
                // hold that type.
                let t = if entry.is_none() && full.extension().is_some_and(|e| e.eq_ignore_ascii_case("csv")) {
                    let t = io::load_csv(&full, want).map_err(kerr)?;
                    if shape.len() == 1 && t.rank() == 2 && t.shape()[1] == 1 {
                        t.with_shape(vec![t.shape()[0]]).map_err(kerr)?
                    } else {
                        t
                    }
                } else {
                    // A file's bf16/f16 values widen exactly to a wanted f32 or f64.
                    io::widen_loaded(io::load(&full, entry).map_err(kerr)?, want)
                };
                // Fixed dims are checked here; dims bound at run time are checked by BindDims.
                let fixed: Option<Vec<usize>> = shape
                    .iter()
                    .map(|i| match i {
                        ShapeItem::Dim(d) => {
                            let v = d.subst(&|s| frame.dims.get(&s).map(|&x| crate::types::Dim::constant(x)));
                            Some(v.as_const().map(|x| x as usize))
                        }
                        ShapeItem::Rest(_) => None,
                    })
                    .collect::<Option<Vec<Option<usize>>>>()
                    .and_then(|v| v.into_iter().collect());
                let shape_ok = match &fixed {
                    Some(f) => f.as_slice() == t.shape(),
                    None => t.rank() == shape.len(),
                };
                if t.dtype() != want || !shape_ok {
                    let expected = crate::types::type_str(ty, self.prog);
                    return Err(rt(
                        Code::E0601,
                        format!("{}: expected {expected} but the file holds {} {:?}", file, t.dtype(), t.shape()),
                        span,
                    ));
                }
                Ok(Value::Tensor(t))
            }
            Type::Model(..) | Type::Tuple(_) if entry.is_none() => {
                let named = match extension(&full).as_deref() {
                    Some("safetensors") => io::load_all_safetensors(&full).map_err(kerr)?,
                    Some("npz") => io::load_all_npz(&full).map_err(kerr)?,
                    _ => {
                        return Err(rt(
                            Code::E0601,
                            format!(
                                "{file}: a model or a tuple is loaded from a .safetensors or .npz file, or from a checkpoint folder (a path ending in `/`)"
                            ),
                            span,
                        ))
                    }
                };
                let mut wanted = Vec::new();
                let node = self.plan(ty, "", &frame.dims, &HashMap::new(), span, &mut wanted)?;
                let mut tensors = Vec::with_capacity(wanted.len());
                for w in &wanted {
                    let Some((_, t)) = named.iter().find(|(n, _)| *n == w.name) else {
                        return Err(rt(Code::E0601, format!("{file}: has no tensor named `{}`", w.name), span));
                    };
                    // A dim of any size (none of a checked program) takes the file's.
                    let shape: Vec<usize> = if w.shape.len() == t.rank() {
                        w.shape.iter().zip(t.shape()).map(|(w, d)| w.unwrap_or(*d)).collect()
                    } else {
                        w.shape.iter().map(|d| d.unwrap_or(0)).collect()
                    };
                    // A quantized matrix (saved from `quantize`): int8 values and `NAME.scale`.
                    let scale = format!("{}.scale", w.name);
                    let scales = named.iter().find(|(n, _)| *n == scale).map(|(_, s)| s);
                    if let (Some(s), kernels::DType::F32, kernels::DType::I32, 2) =
                        (scales, w.dtype, t.dtype(), t.rank())
                    {
                        io::check_loaded(&full, t, Some(kernels::DType::I32), Some(&shape)).map_err(kerr)?;
                        let q = super::compress::from_file(t, s).map_err(kerr)?;
                        tensors.push(Value::Quant(std::rc::Rc::new(q)));
                        continue;
                    }
                    let t = io::widen_loaded(t.clone(), w.dtype);
                    io::check_loaded(&full, &t, Some(w.dtype), Some(&shape)).map_err(kerr)?;
                    tensors.push(Value::Tensor(t));
                }
                Ok(pack(assemble(self.prog, &node, &mut tensors.into_iter(), span)?))
            }
            _ => Err(rt(Code::E0605, "`load` of this type is not supported", span)),
        }
    }

    pub(crate) fn save(&mut self, path: &Value, v: &Value, span: Span) -> R<Value> {
        let Value::Str(p) = path else { return Err(rt(Code::E0605, "`save` needs a path", span)) };
        let full = self.in_work_dir(Path::new(&**p));
        let kerr = |e: kernels::KernelError| shown_as(e, &full, p, span);
        if is_checkpoint(p) {
            io::checkpoint::write_checkpoint(&full, &named_tensors(v, self.prog)).map_err(kerr)?;
            return Ok(Value::unit());
        }
        // A quantized matrix keeps its int8 form only in a .safetensors file.
        let plain;
        let v = match v {
            Value::Quant(_) if extension(&full).as_deref() != Some("safetensors") => {
                plain = super::compress::plain(v.clone());
                &plain
            }
            _ => v,
        };
        match (v, extension(&full).as_deref()) {
            (Value::Tensor(t), _) => io::save(&full, t).map_err(kerr)?,
            (other, Some("safetensors")) => {
                // Quantized matrices keep their int8 values (`w`, I8) and scales (`w.scale`).
                let (mut named, mut int8) = (Vec::new(), std::collections::HashSet::new());
                match other {
                    Value::Quant(_) => other.named_leaves_with(self.prog, "value", &mut named, Some(&mut int8)),
                    _ => other.named_leaves_with(self.prog, "", &mut named, Some(&mut int8)),
                }
                io::save_safetensors_int8(&full, &named, &int8).map_err(kerr)?
            }
            (other, Some("npz")) => io::save_npz(&full, &named_tensors(other, self.prog)).map_err(kerr)?,
            _ => {
                return Err(rt(
                    Code::E0601,
                    format!(
                        "{p}: a model or a tuple is saved as a .safetensors or .npz file, or as a checkpoint folder (a path ending in `/`)"
                    ),
                    span,
                ))
            }
        }
        Ok(Value::unit())
    }

    /// `log_scalar(name, step, value)`: hands the scalar to the installed [`super::ScalarLog`].
    pub(crate) fn log_scalar(&mut self, args: &[Value], span: Span) -> R<Value> {
        let (Some(Value::Str(tag)), Some(step), Some(value)) = (args.first(), args.get(1), args.get(2)) else {
            return Err(rt(Code::E0605, "`log_scalar` takes a name, a step and a value", span));
        };
        if tag.is_empty() {
            return Err(rt(Code::E0605, "`log_scalar` needs a non-empty name", span));
        }
        let (Some(step), Some(value)) =
            (step.tensor().and_then(scalar_i64), value.tensor().and_then(Tensor::scalar_value_f64))
        else {
            return Err(rt(Code::E0605, "`log_scalar` needs a scalar step and value", span));
        };
        self.scalars.scalar(tag, step, value).map_err(|why| rt(Code::E0601, why, span))?;
        Ok(Value::unit())
    }

    #[allow(clippy::too_many_arguments)]
    /// `for (…) in batches(…) { body }` in the interpreter (compiled bodies run the same steps
    /// from native code, `host`).
    pub(crate) fn for_batches(&mut self, e: &Expr, body: &Expr, frame: &mut Frame) -> R<Value> {
        let b = self.batches_begin(e, frame)?;
        for i in 0..b.count {
            self.check_interrupt(self.span(e))?;
            self.batch_bind(e, &b, i, frame)?;
            self.eval(body, frame)?;
            self.batch_done();
        }
        self.batches_end();
        Ok(Value::unit())
    }
}
