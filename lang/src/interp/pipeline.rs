//! The pipeline driver (`@pipeline`, LANGUAGE.md §8): a call, `grad` or `value_and_grad` of a
//! pipelined function splits the batch into microbatches and runs this stage's part of the
//! static schedule: the first stage computes what comes before the layer loop, every stage its
//! own run of layers, the last stage what follows; activations go forward and their gradients
//! back through the communicator's point-to-point messages. A stage keeps each microbatch's
//! input to each of its layers and recomputes the layer's forward in its backward (the pieces'
//! pullbacks). The value is the mean of the microbatches' values, and the gradient the mean of
//! theirs: for a loss that is a mean over the batch's rows, the whole batch's.

use super::value::{ModelValue, Value};
use super::{rt, Interp, R};
use crate::diag::Code;
use crate::ir::Pipeline;
use crate::shard::schedule::{self, Kind, Msg, Op};
use crate::source::Span;
use crate::types::{AxisId, FuncId};
use kernels::ops::BinaryOp;
use kernels::{DType, Tensor};
use std::collections::HashMap;
use std::rc::Rc;

/// What a stage holds of one microbatch between its forward and its backward.
#[derive(Default)]
struct Held {
    /// The input of each of this stage's layers.
    inputs: Vec<Value>,
    /// The last layer's output (on the last stage, for the loss's backward).
    out: Option<Value>,
}

impl Interp<'_> {
    /// The pipeline that function `f` is, if it is one.
    pub(crate) fn pipeline_of(&self, f: FuncId) -> Option<usize> {
        self.prog.pipelines.iter().position(|p| p.func == f)
    }

    /// Runs pipeline `pi` on `args`: its value, and with `grad` the gradient with respect to
    /// the model (its first parameter).
    pub(crate) fn run_pipeline(
        &mut self,
        pi: usize,
        args: Vec<Value>,
        grad: bool,
        span: Span,
    ) -> R<(Value, Option<Value>)> {
        let p: Pipeline = self.prog.pipelines[pi].clone();
        let (stages, stage, axes) = match (p.axis, &self.spmd) {
            (Some(a), Some(s)) => (s.mesh.size(a) as usize, s.mesh.group_index(s.rank(), &[a]) as usize, vec![a]),
            _ => (1, 0, vec![]),
        };
        let kind = if grad || p.virtual_stages > 1 { p.schedule } else { Kind::GPipe };
        let sched =
            schedule::build(kind, stages, p.microbatches, p.virtual_stages).map_err(|e| rt(Code::E0605, e, span))?;
        let mut ops = sched.ranks[stage].clone();
        if !grad {
            ops = forward_only(ops);
        }
        let n_mb = p.microbatches;
        let Some(Value::Model(model)) = args.first().cloned() else {
            return Err(rt(Code::E0605, "a pipelined function takes the model first", span));
        };
        let Some(Value::Model(stack)) = model.fields.get(p.stack_field).cloned() else {
            return Err(rt(Code::E0605, "internal: the stack of layers is missing", span));
        };
        // With virtual stages a rank runs `v` runs of layers, not its own contiguous block: it
        // gathers the stack for the step and reduce-scatters the stack's gradient at the end.
        let v = p.virtual_stages.max(1);
        let gathered = v > 1 && !axes.is_empty();
        let whole = if gathered {
            Value::Model(stack.clone()).map_tensors(&mut |t| self.comm(|c| c.all_gather(&axes, 0, t), span))?
        } else {
            Value::Model(stack.clone())
        };
        let Value::Model(whole) = whole else { return Err(rt(Code::E0605, "internal: a stack", span)) };
        let mut leaves = Vec::new();
        let whole_v = Value::Model(whole.clone());
        whole_v.leaves(&mut leaves);
        let n_rows = leaves.first().and_then(|t| t.shape().first().copied()).unwrap_or(0);
        let layers: Vec<Value> = (0..n_rows)
            .map(|l| super::stacks::layer(self.prog, &whole, l))
            .collect::<Result<_, _>>()
            .map_err(|e| rt(Code::E0605, e.to_string(), span))?;
        let n_virtual = stages * v;
        if v > 1 && n_rows % n_virtual != 0 {
            return Err(rt(
                Code::E0602,
                format!(
                    "{n_rows} layers do not split into {n_virtual} runs ({stages} stages, {v} virtual stages each)"
                ),
                span,
            ));
        }
        // The layers (indices into `layers`) of this rank's chunk `c`: virtual stage `c * p + stage`.
        let per = if v > 1 { n_rows / n_virtual } else { n_rows };
        let run = |c: usize| {
            if v > 1 {
                let k = c * stages + stage;
                k * per..(k + 1) * per
            } else {
                0..n_rows
            }
        };
        let parts = split_batch(&args[1..], n_mb, span)?;
        let mode = crate::autodiff::mode_of(usize::MAX, false);
        let pullback = |f: FuncId| self.prog.derived.funcs.get(&(f, mode)).copied();
        let pbs = (pullback(p.pre), pullback(p.layer), pullback(p.post));
        let (pre_pb, layer_pb, post_pb) = match pbs {
            (Some(a), Some(b), Some(c)) => (a, b, c),
            _ if !grad => (p.pre, p.layer, p.post),
            _ => return Err(rt(Code::E0605, "internal: a pipeline piece has no pullback", span)),
        };
        let vstage = |c: usize| c * stages + stage;
        let scale = |t: DType| match t {
            DType::F64 => Value::Tensor(Tensor::scalar_f64(1.0 / n_mb as f64)),
            _ => Value::Tensor(Tensor::scalar_f32(1.0 / n_mb as f32)),
        };
        let (mut held, mut act_in, mut grad_in, mut act_out, mut grad_out) =
            (HashMap::<(usize, usize), Held>::new(), HashMap::new(), HashMap::new(), HashMap::new(), HashMap::new());
        let mut total: Option<Value> = None;
        let mut dm: Option<Value> = None;
        let mut dlayers: Vec<Option<Value>> = vec![None; n_rows];
        let model_v = Value::Model(model.clone());
        for op in &ops {
            let t0 = self.trace_start();
            match op {
                Op::Fwd { mb, chunk } => {
                    let (rest, k) = (&parts[*mb], vstage(*chunk));
                    let mut h = if k == 0 {
                        self.call(p.pre, with_first(&model_v, rest), HashMap::new(), vec![])?
                    } else {
                        // From the previous stage, or from this rank's previous chunk (one stage).
                        act_in
                            .remove(&(*mb, k - 1))
                            .or_else(|| act_out.remove(&(*mb, k - 1)))
                            .ok_or_else(|| rt(Code::E0605, "internal: an activation did not arrive", span))?
                    };
                    let mut hd = Held::default();
                    for b in &layers[run(*chunk)] {
                        let mut a = vec![b.clone(), h.clone()];
                        a.extend(rest.iter().cloned());
                        hd.inputs.push(std::mem::replace(&mut h, Value::unit()));
                        h = self.call(p.layer, a, HashMap::new(), vec![])?;
                    }
                    if k + 1 == n_virtual {
                        let mut a = with_first(&model_v, rest);
                        a.push(h.clone());
                        let v = self.call(p.post, a, HashMap::new(), vec![])?;
                        total = Some(match total {
                            Some(t) => self.binary(BinaryOp::Add, &t, &v, span)?,
                            None => v,
                        });
                        hd.out = Some(h);
                    } else {
                        act_out.insert((*mb, k), h);
                    }
                    held.insert((*mb, k), hd);
                }
                Op::Bwd { mb, chunk } => {
                    let (rest, k) = (&parts[*mb], vstage(*chunk));
                    let mut hd = held.remove(&(*mb, k)).unwrap_or_default();
                    let mut dh = if k + 1 == n_virtual {
                        let mut a = with_first(&model_v, rest);
                        let out = hd.out.take().ok_or_else(|| rt(Code::E0605, "internal: no output held", span))?;
                        let dt = out_dtype(&total);
                        a.push(out);
                        a.push(scale(dt));
                        let cot = items(self.call(post_pb, a, HashMap::new(), vec![])?);
                        accumulate(self, &mut dm, cot.first().cloned(), span)?;
                        cot.last().cloned().unwrap_or(Value::unit())
                    } else {
                        grad_in
                            .remove(&(*mb, k + 1))
                            .or_else(|| grad_out.remove(&(*mb, k + 1)))
                            .ok_or_else(|| rt(Code::E0605, "internal: a gradient did not arrive", span))?
                    };
                    let first = run(*chunk).start;
                    for (i, input) in hd.inputs.into_iter().enumerate().rev() {
                        let j = first + i;
                        let mut a = vec![layers[j].clone(), input];
                        a.extend(rest.iter().cloned());
                        a.push(dh);
                        let cot = items(self.call(layer_pb, a, HashMap::new(), vec![])?);
                        accumulate(self, &mut dlayers[j], cot.first().cloned(), span)?;
                        dh = cot.get(1).cloned().unwrap_or(Value::unit());
                    }
                    if k == 0 {
                        let mut a = with_first(&model_v, rest);
                        a.push(dh);
                        let cot = items(self.call(pre_pb, a, HashMap::new(), vec![])?);
                        accumulate(self, &mut dm, cot.first().cloned(), span)?;
                    } else {
                        grad_out.insert((*mb, k), dh);
                    }
                }
                Op::Comm { sends, recvs } => {
                    let mut bytes = Vec::with_capacity(sends.len());
                    for (peer, msg) in sends {
                        let v = match msg {
                            Msg::Act { mb, vstage } => act_out.remove(&(*mb, *vstage)),
                            Msg::Grad { mb, vstage } => grad_out.remove(&(*mb, *vstage)),
                        };
                        let v = v.ok_or_else(|| rt(Code::E0605, "internal: a message to send is missing", span))?;
                        let mut b = Vec::new();
                        encode(&v, &mut b).map_err(|e| rt(Code::E0605, e, span))?;
                        bytes.push((*peer, b));
                    }
                    let s: Vec<(usize, &[u8])> = bytes.iter().map(|(p, b)| (*p, &b[..])).collect();
                    let from: Vec<usize> = recvs.iter().map(|(p, _)| *p).collect();
                    let got = self.comm(|c| c.comm.send_recv(&axes, &s, &from), span)?;
                    for ((_, msg), b) in recvs.iter().zip(got) {
                        let v = decode(&mut &b[..]).map_err(|e| rt(Code::E0605, e, span))?;
                        match msg {
                            Msg::Act { mb, vstage } => act_in.insert((*mb, *vstage), v),
                            Msg::Grad { mb, vstage } => grad_in.insert((*mb, *vstage), v),
                        };
                    }
                    let sent = bytes.iter().map(|(_, b)| b.len() as u64).sum();
                    // `--comm-report` lists the stages' messages as site #0.
                    if let (Some(s), true) = (&self.spmd, !bytes.is_empty()) {
                        s.count(0, span, "pipeline send", sent);
                    }
                    if let (Some(t0), Some(tr)) = (t0, self.trace.as_mut()) {
                        if let Some(ev) = tr.end(t0, "send/recv".into(), super::trace::Kind::Collective, Some(span)) {
                            ev.bytes = Some(sent);
                        }
                    }
                    continue;
                }
            }
            if let Op::Fwd { mb, .. } | Op::Bwd { mb, .. } = op {
                let name = format!("{}{mb}", if matches!(op, Op::Fwd { .. }) { "F" } else { "B" });
                self.trace_span(t0, &name, super::trace::Kind::Stage, span);
            }
        }
        // The value: the mean over the microbatches, on the last stage, then on every stage.
        let total = match total {
            Some(t) => {
                let dt = out_dtype(&Some(t.clone()));
                self.binary(BinaryOp::Mul, &t, &scale(dt), span)?
            }
            None => Value::Tensor(Tensor::scalar_f32(0.0)),
        };
        let value = self.sum_over(&axes, total, span)?;
        if !grad {
            return Ok((value, None));
        }
        let zero = Value::Tensor(Tensor::scalar_f32(0.0));
        let dm = match dm {
            Some(d) => d,
            None => self.binary(BinaryOp::Mul, &model_v, &zero, span)?,
        };
        let Value::Model(dm) = dm else { return Err(rt(Code::E0605, "internal: a model's gradient", span)) };
        // Fields outside the stack get contributions from the first and last stages only.
        let mut fields = Vec::with_capacity(dm.fields.len());
        for (k, f) in dm.fields.iter().enumerate() {
            fields.push(if k == p.stack_field { f.clone() } else { self.sum_over(&axes, f.clone(), span)? });
        }
        let dl: Vec<Value> = dlayers
            .into_iter()
            .zip(&layers)
            .map(|(d, b)| match d {
                Some(d) => Ok(d),
                None => self.binary(BinaryOp::Mul, b, &zero, span),
            })
            .collect::<R<_>>()?;
        if !dl.is_empty() {
            let s = super::stacks::stack_layers(self.prog, stack.model, &dl)
                .map_err(|e| rt(Code::E0605, e.to_string(), span))?;
            let s = if gathered {
                // Every rank holds the gradient of the layers it ran: summed onto their owners.
                s.map_tensors(&mut |t| self.comm(|c| c.reduce_scatter(&axes, 0, t), span))?
            } else {
                s
            };
            let Value::Model(s) = s else { return Err(rt(Code::E0605, "internal: a stack's gradient", span)) };
            let s = ModelValue { model: s.model, dims: stack.dims.clone(), fields: s.fields.clone() };
            fields[p.stack_field] = Value::Model(Rc::new(s));
        }
        let g = Value::Model(Rc::new(ModelValue { model: dm.model, dims: dm.dims.clone(), fields }));
        Ok((value, Some(g)))
    }

    /// `v` summed over the ranks of `axes` (every float tensor in it); `v` itself on one stage.
    fn sum_over(&self, axes: &[AxisId], v: Value, span: Span) -> R<Value> {
        if axes.is_empty() {
            return Ok(v);
        }
        v.map_tensors(&mut |t| {
            if t.dtype().is_float() {
                self.comm(|c| c.all_reduce(axes, crate::dist::ReduceKind::Sum, t), span)
            } else {
                Ok(t.clone())
            }
        })
    }

    /// Runs `f` on this job's communicator (the one-process one without a job).
    fn comm<T>(&self, f: impl FnOnce(&crate::dist::Spmd) -> Result<T, String>, span: Span) -> R<T> {
        match &self.spmd {
            Some(s) => f(s).map_err(|e| rt(Code::E0605, e, span)),
            None => f(&crate::dist::Spmd::new(Default::default(), Box::new(crate::dist::Solo)))
                .map_err(|e| rt(Code::E0605, e, span)),
        }
    }
}

/// The schedule's forward half: its forwards and the activations they send and receive.
fn forward_only(ops: Vec<Op>) -> Vec<Op> {
    ops.into_iter()
        .filter_map(|op| match op {
            Op::Bwd { .. } => None,
            Op::Comm { sends, recvs } => {
                let act = |m: &(usize, Msg)| matches!(m.1, Msg::Act { .. });
                let (sends, recvs): (Vec<_>, Vec<_>) =
                    (sends.into_iter().filter(act).collect(), recvs.into_iter().filter(act).collect());
                (!sends.is_empty() || !recvs.is_empty()).then_some(Op::Comm { sends, recvs })
            }
            op => Some(op),
        })
        .collect()
}

/// The arguments after the model, each cut into `n` microbatches along its first dim (a
/// scalar or a non-tensor is given whole to every microbatch).
fn split_batch(args: &[Value], n: usize, span: Span) -> R<Vec<Vec<Value>>> {
    let mut out: Vec<Vec<Value>> = vec![Vec::with_capacity(args.len()); n];
    for a in args {
        match a {
            Value::Tensor(t) if t.rank() >= 1 => {
                let rows = t.shape()[0];
                if rows % n != 0 {
                    return Err(rt(
                        Code::E0602,
                        format!("a batch of {rows} rows does not split into {n} equal microbatches"),
                        span,
                    ));
                }
                let per = rows / n;
                let row: usize = t.shape()[1..].iter().product();
                for (j, o) in out.iter_mut().enumerate() {
                    let mut shape = t.shape().to_vec();
                    shape[0] = per;
                    let part = t.view(j * per * row, shape).map_err(|e| rt(Code::E0605, e.to_string(), span))?;
                    o.push(Value::Tensor(part));
                }
            }
            other => out.iter_mut().for_each(|o| o.push(other.clone())),
        }
    }
    Ok(out)
}

fn with_first(first: &Value, rest: &[Value]) -> Vec<Value> {
    let mut a = Vec::with_capacity(rest.len() + 1);
    a.push(first.clone());
    a.extend(rest.iter().cloned());
    a
}

/// A pullback's cotangents, one per parameter.
fn items(v: Value) -> Vec<Value> {
    match v {
        Value::Tuple(xs) => xs.to_vec(),
        v => vec![v],
    }
}

fn out_dtype(v: &Option<Value>) -> DType {
    match v {
        Some(Value::Tensor(t)) => t.dtype(),
        _ => DType::F32,
    }
}

fn accumulate(it: &mut Interp, acc: &mut Option<Value>, v: Option<Value>, span: Span) -> R<()> {
    let Some(v) = v else { return Ok(()) };
    *acc = Some(match acc.take() {
        Some(a) => it.binary(BinaryOp::Add, &a, &v, span)?,
        None => v,
    });
    Ok(())
}

/// A message's bytes: a tensor as its element type, rank, dims and data; a tuple as its items.
/// The element types a message carries, by their code.
const WIRE_TYPES: [DType; 6] = [DType::F32, DType::F64, DType::I32, DType::Bf16, DType::F16, DType::Bool];

fn encode(v: &Value, out: &mut Vec<u8>) -> Result<(), String> {
    match v {
        Value::Tensor(t) => {
            let code = WIRE_TYPES
                .iter()
                .position(|d| *d == t.dtype())
                .ok_or_else(|| format!("a pipeline stage cannot send {} values", t.dtype().name()))?;
            out.push(code as u8);
            out.extend((t.rank() as u32).to_le_bytes());
            for d in t.shape() {
                out.extend((*d as u64).to_le_bytes());
            }
            kernels::io::push_le_data(out, t);
        }
        Value::Tuple(xs) => {
            out.push(9);
            out.extend((xs.len() as u32).to_le_bytes());
            for x in xs.iter() {
                encode(x, out)?;
            }
        }
        _ => return Err("a pipeline stage sends tensors and tuples of them".into()),
    }
    Ok(())
}

fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
    if b.len() < n {
        return Err("a pipeline message ended early".into());
    }
    let (h, t) = b.split_at(n);
    *b = t;
    Ok(h)
}

fn decode(b: &mut &[u8]) -> Result<Value, String> {
    let code = take(b, 1)?[0];
    let u32_at = |b: &mut &[u8]| -> Result<usize, String> {
        Ok(u32::from_le_bytes(take(b, 4)?.try_into().map_err(|_| "bad message")?) as usize)
    };
    if code == 9 {
        let n = u32_at(b)?;
        let items = (0..n).map(|_| decode(b)).collect::<Result<Vec<_>, _>>()?;
        return Ok(Value::Tuple(Rc::new(items)));
    }
    let rank = u32_at(b)?;
    let mut shape = Vec::with_capacity(rank.min(b.len() / 8));
    for _ in 0..rank {
        shape.push(u64::from_le_bytes(take(b, 8)?.try_into().map_err(|_| "bad message")?) as usize);
    }
    let dtype = *WIRE_TYPES.get(code as usize).ok_or("a pipeline message of an unknown kind")?;
    let len =
        shape.iter().try_fold(dtype.size_in_bytes(), |a, &d| a.checked_mul(d)).ok_or("a pipeline message too large")?;
    let t = kernels::io::tensor_from_le(dtype, shape, take(b, len)?).map_err(|e| e.to_string())?;
    Ok(Value::Tensor(t))
}
