//! Data in and out of the interpreter: `load`, `save`, `log_scalar` and `for … in batches(…)`.

use super::value::{scalar_i64, ModelValue, Value};
use super::{dtype_of, kerr, rt, Frame, Interp, R};
use crate::diag::Code;
use crate::ir::Expr;
use crate::source::Span;
use crate::types::TensorTy;
use crate::types::{Elem, ShapeItem, Type, TypeArg};
use kernels::{io, Tensor};
use std::path::{Path, PathBuf};
use std::rc::Rc;

impl Interp<'_> {
    /// A relative path is tried against the working directory, then the program's directory.
    fn resolve(&self, p: &str) -> PathBuf {
        let path = Path::new(p);
        if path.is_absolute() || path.exists() {
            return path.to_path_buf();
        }
        match &self.source_dir {
            Some(d) if d.join(path).exists() => d.join(path),
            _ => path.to_path_buf(),
        }
    }

    /// Splits `"file.npz:name"` into the file and the entry.
    fn split_entry(p: &str) -> (&str, Option<&str>) {
        if let Some((file, entry)) = p.rsplit_once(':') {
            let lower = file.to_ascii_lowercase();
            if lower.ends_with(".npz") || lower.ends_with(".safetensors") {
                return (file, Some(entry));
            }
        }
        (p, None)
    }

    pub(crate) fn load(&mut self, path: &Value, ty: &Type, span: Span, frame: &mut Frame) -> R<Value> {
        let Value::Str(p) = path else { return Err(rt(Code::E0605, "`load` needs a path", span)) };
        let (file, entry) = Self::split_entry(p);
        let full = self.resolve(file);
        // Messages name the file as the program wrote it, not where it was found.
        let shown = full.display().to_string();
        let kerr = |e: kernels::KernelError, span: Span| match kerr(e, span) {
            super::Ctrl::Error(mut r) => {
                r.message = r.message.replace(&shown, file);
                super::Ctrl::Error(r)
            }
            c => c,
        };
        match ty {
            Type::Tensor(TensorTy { elem: Elem::T(et), shape, .. }) => {
                let want = dtype_of(*et);
                // CSV holds text numbers: they are read as the annotated type, and one that type
                // cannot hold is an error naming its row and column. Other formats must already
                // hold that type.
                let t = if entry.is_none() && full.extension().is_some_and(|e| e.eq_ignore_ascii_case("csv")) {
                    let t = io::load_csv(&full, want).map_err(|e| kerr(e, span))?;
                    if shape.len() == 1 && t.rank() == 2 && t.shape()[1] == 1 {
                        t.with_shape(vec![t.shape()[0]]).map_err(|e| kerr(e, span))?
                    } else {
                        t
                    }
                } else {
                    io::load(&full, entry).map_err(|e| kerr(e, span))?
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
            Type::Model(id, args) => {
                let named = io::load_all_safetensors(&full).map_err(|e| kerr(e, span))?;
                let dims = self.type_arg_dims(args, frame, span)?;
                self.model_from_named(*id, dims, args, "", &named, &full, span, frame).map(Value::packed)
            }
            _ => Err(rt(Code::E0605, "`load` of this type is not supported", span)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn model_from_named(
        &mut self,
        id: crate::types::ModelId,
        dims: Vec<i64>,
        _args: &[TypeArg],
        prefix: &str,
        named: &[(String, Tensor)],
        file: &Path,
        span: Span,
        frame: &mut Frame,
    ) -> R<Value> {
        let def = self.prog.model(id);
        let mut env = frame.dims.clone();
        for (s, v) in def.dims.iter().zip(&dims) {
            env.insert(*s, *v);
        }
        let sub = Frame { locals: vec![], dims: env, rests: Default::default() };
        let mut fields = Vec::new();
        for f in &def.fields {
            let name = self.prog.names.get(f.name);
            let path = if prefix.is_empty() { name.to_string() } else { format!("{prefix}.{name}") };
            match &f.ty {
                Type::Model(mid, margs) => {
                    let mdims = self.type_arg_dims(margs, &sub, span)?;
                    let mut sub2 = Frame { locals: vec![], dims: sub.dims.clone(), rests: Default::default() };
                    fields.push(self.model_from_named(*mid, mdims, margs, &path, named, file, span, &mut sub2)?);
                }
                Type::Tensor(TensorTy { elem: Elem::T(et), shape, .. }) => {
                    let Some((_, t)) = named.iter().find(|(n, _)| *n == path) else {
                        return Err(rt(Code::E0601, format!("{}: has no tensor named `{path}`", file.display()), span));
                    };
                    let want: Vec<usize> = shape
                        .iter()
                        .filter_map(|i| match i {
                            ShapeItem::Dim(d) => self.dim(&sub, d, span).ok().map(|x| x as usize),
                            ShapeItem::Rest(_) => None,
                        })
                        .collect();
                    io::check_loaded(file, t, Some(dtype_of(*et)), Some(&want)).map_err(|e| kerr(e, span))?;
                    fields.push(Value::Tensor(t.clone()));
                }
                _ => return Err(rt(Code::E0601, format!("field `{path}` cannot be loaded"), span)),
            }
        }
        Ok(Value::Model(Rc::new(ModelValue { model: id, dims, fields })))
    }

    pub(crate) fn save(&mut self, path: &Value, v: &Value, span: Span) -> R<Value> {
        let Value::Str(p) = path else { return Err(rt(Code::E0605, "`save` needs a path", span)) };
        let full = PathBuf::from(&**p);
        match v {
            Value::Tensor(t) => io::save(&full, t).map_err(|e| kerr(e, span))?,
            other => {
                let mut named = Vec::new();
                other.named_leaves(self.prog, "", &mut named);
                io::save_safetensors(&full, &named).map_err(|e| kerr(e, span))?;
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
