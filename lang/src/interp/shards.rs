//! Sharded checkpoints (LANGUAGE.md §9): under a launcher, `save("dir/", v)` has every rank
//! write the blocks it holds into its own data file (`rank<r>.<crc>.safetensors`; of the ranks
//! holding the same block, the one at index 0 of every axis the block is replicated over), then
//! rank 0 writes the index, naming the mesh, each tensor's global shape and layout, and where
//! each block lies, once every rank's file is complete. Nothing is gathered. `load("dir/")`
//! reads a checkpoint saved from any mesh: `kernels::io::checkpoint` assembles each tensor
//! from the shards that tile it, and the program then keeps its own blocks.

use super::checkpoint::{named_tensors, Node};
use super::value::Value;
use super::{rt, Interp, R};
use crate::diag::Code;
use crate::dist::Spmd;
use crate::source::Span;
use crate::types::{AxisId, Type};
use kernels::io::checkpoint::Wanted;
use kernels::io::checkpoint::{self as ck, FileEntry, Index, MeshAxis, Shard, TensorEntry};
use std::path::Path;

/// The layout of each tensor of `v` (of type `ty`), in the order of `named_tensors`: a model's
/// fields have their declared layouts, other tensors the layout of their type.
fn leaf_layouts(v: &Value, ty: &Type, prog: &crate::ir::Program, out: &mut Vec<Vec<Vec<AxisId>>>) {
    match v {
        Value::Tensor(_) => out.push(crate::shard::layout(ty)),
        // Per layer, as `named_tensors` names a stack's tensors.
        Value::Model(m) if prog.model(m.model).stack.is_some() => {
            for l in super::stacks::layers(prog, m).unwrap_or_default() {
                leaf_layouts(&l, &Type::Error, prog, out);
            }
        }
        Value::Model(m) => {
            for (f, fv) in prog.model(m.model).fields.iter().zip(&m.fields) {
                leaf_layouts(fv, &f.ty, prog, out);
            }
        }
        Value::Tuple(vs) => {
            for (i, x) in vs.iter().enumerate() {
                let t = match ty {
                    Type::Tuple(ts) => ts.get(i).cloned().unwrap_or(Type::Error),
                    _ => Type::Error,
                };
                leaf_layouts(x, &t, prog, out);
            }
        }
        _ => {}
    }
}

impl Interp<'_> {
    /// Sets, for every model field of a load planned as `node`, the block of it this rank
    /// holds (`Wanted::region`). False, with no region set, when a split field's size is known
    /// only once read or does not split: the value is then read whole and cut (`localize`).
    pub(crate) fn set_regions(&self, s: &Spmd, node: &Node, wanted: &mut [Wanted]) -> bool {
        let ok = self.regions(s, node, None, wanted, &mut 0);
        if !ok {
            for w in wanted.iter_mut() {
                w.region = None;
            }
        }
        ok
    }

    fn regions(
        &self,
        s: &Spmd,
        node: &Node,
        layout: Option<&[Vec<AxisId>]>,
        wanted: &mut [Wanted],
        at: &mut usize,
    ) -> bool {
        match node {
            Node::Tensor => {
                let i = *at;
                *at += 1;
                let (Some(l), Some(w)) = (layout, wanted.get_mut(i)) else { return true };
                if l.iter().all(Vec::is_empty) {
                    return true;
                }
                let Some(shape) = w.shape.iter().copied().collect::<Option<Vec<usize>>>() else { return false };
                let mut start = vec![0; shape.len()];
                let mut len = shape.clone();
                for (d, axes) in l.iter().enumerate().take(shape.len()) {
                    let k = s.mesh.parts(axes).max(1) as usize;
                    if shape[d] % k != 0 {
                        return false;
                    }
                    len[d] = shape[d] / k;
                    start[d] = s.mesh.group_index(s.rank(), axes) as usize * len[d];
                }
                w.region = Some((start, len));
                true
            }
            Node::Model { id, fields, .. } => {
                let def = self.prog.model(*id);
                let mut ok = true;
                for (f, n) in def.fields.iter().zip(fields) {
                    ok &= self.regions(s, n, Some(&crate::shard::layout(&f.ty)), wanted, at);
                }
                ok
            }
            Node::Tuple(ns) | Node::Stack { layers: ns, .. } => {
                let mut ok = true;
                for n in ns {
                    ok &= self.regions(s, n, None, wanted, at);
                }
                ok
            }
        }
    }

    /// A loaded value with each model field cut to this rank's block of its declared layout
    /// (models hold blocks in a sharded run; a loaded tensor's own annotation is applied by the
    /// sharding pass).
    pub(crate) fn localize(&self, s: &Spmd, v: Value, span: Span) -> R<Value> {
        match v {
            Value::Model(m) => {
                let def = self.prog.model(m.model);
                let mut fields = Vec::with_capacity(m.fields.len());
                for (f, fv) in def.fields.iter().zip(&m.fields) {
                    fields.push(match fv {
                        Value::Tensor(t) => {
                            let mut t = t.clone();
                            for (d, axes) in crate::shard::layout(&f.ty).iter().enumerate() {
                                if !axes.is_empty() {
                                    t = s.local_slice(axes, d, &t).map_err(|m| rt(Code::E0602, m, span))?;
                                }
                            }
                            Value::Tensor(t)
                        }
                        other => self.localize(s, other.clone(), span)?,
                    });
                }
                Ok(Value::Model(std::rc::Rc::new(super::value::ModelValue {
                    model: m.model,
                    dims: m.dims.clone(),
                    fields,
                })))
            }
            Value::Tuple(vs) => {
                let items = vs.iter().map(|x| self.localize(s, x.clone(), span)).collect::<R<Vec<_>>>()?;
                Ok(Value::Tuple(items.into()))
            }
            other => Ok(other),
        }
    }

    /// `save("dir/", v)` on every rank of a sharded run (see the module documentation).
    pub(crate) fn save_sharded(
        &mut self,
        s: &Spmd,
        dir: &Path,
        shown: &str,
        v: &Value,
        ty: &Type,
        span: Span,
    ) -> R<()> {
        let fail = |m: String| rt(Code::E0601, format!("{shown}: {m}"), span);
        // A stack split over an axis is saved whole (its layers gathered), by the ranks at index
        // 0 of that axis, so its tensors are named per layer as on one process.
        let whole = self.stacks_whole(s, v.clone(), span)?;
        let v = &whole;
        let named = named_tensors(v, self.prog);
        let mut layouts = Vec::new();
        leaf_layouts(v, ty, self.prog, &mut layouts);
        layouts.resize(named.len(), Vec::new());
        let rank = s.rank();
        let coords = s.mesh.coords(rank);
        let mut entries = Vec::with_capacity(named.len());
        let mut mine = Vec::new();
        let mut starts = Vec::new();
        for (i, ((name, t), l)) in named.iter().zip(&layouts).enumerate() {
            let mut global = t.shape().to_vec();
            let mut start = vec![0; global.len()];
            for (d, axes) in l.iter().enumerate().take(global.len()) {
                let k = s.mesh.parts(axes).max(1) as usize;
                start[d] = s.mesh.group_index(rank, axes) as usize * global[d];
                global[d] *= k;
            }
            let replicated_over = (0..s.mesh.names.len()).filter(|a| !l.iter().flatten().any(|x| x.0 as usize == *a));
            let owner = replicated_over.into_iter().all(|a| coords[a] == 0);
            let layout = (0..global.len())
                .map(|d| {
                    l.get(d)
                        .map_or(Vec::new(), |axes| axes.iter().map(|a| s.mesh.names[a.0 as usize].clone()).collect())
                })
                .collect();
            entries.push(TensorEntry {
                name: name.clone(),
                dtype: kernels::io::safetensors::dtype_name(t.dtype()).to_string(),
                shape: global,
                layout,
                shards: Vec::new(),
            });
            if owner {
                mine.push((name.clone(), t.clone()));
                starts.push((i, start));
            }
        }
        let kerr = |e: kernels::KernelError| fail(e.to_string());
        ck::prepare_checkpoint(dir).map_err(kerr)?;
        let written = if mine.is_empty() { None } else { Some(ck::write_data_file(dir, rank, &mine).map_err(kerr)?) };
        // What this rank wrote: its file and, for each block, the tensor it belongs to.
        let meta: Option<(FileEntry, Vec<(usize, Shard)>)> = written.map(|(file, shards)| {
            let placed = shards
                .into_iter()
                .zip(&starts)
                .map(|(mut sh, (i, start))| {
                    sh.start.clone_from(start);
                    (*i, sh)
                })
                .collect();
            (file, placed)
        });
        let bytes = serde_json::to_vec(&meta).map_err(|e| fail(e.to_string()))?;
        let all = s.exchange(&bytes).map_err(fail)?;
        if rank == 0 {
            let mut files = Vec::new();
            for b in &all {
                let got: Option<(FileEntry, Vec<(usize, Shard)>)> =
                    serde_json::from_slice(b).map_err(|e| fail(format!("a rank's shard list: {e}")))?;
                let Some((file, placed)) = got else { continue };
                for (i, mut sh) in placed {
                    sh.file = files.len();
                    if let Some(e) = entries.get_mut(i) {
                        e.shards.push(sh);
                    }
                }
                files.push(file);
            }
            let mesh =
                s.mesh.names.iter().zip(&s.mesh.sizes).map(|(n, k)| MeshAxis { name: n.clone(), size: *k as usize });
            let index = Index {
                format: ck::FORMAT.to_string(),
                version: ck::VERSION,
                mesh: Some(mesh.collect()),
                files,
                tensors: entries,
            };
            ck::write_index(dir, &index).map_err(kerr)?;
        }
        // No rank goes on (to a `load` of this folder, say) before the index is there.
        s.barrier().map_err(fail)
    }
}

/// What is done to each tensor of a split stack (gather it, or keep this rank's block).
type BlockOp<'a> = &'a dyn Fn(&Spmd, &[AxisId], &kernels::Tensor) -> Result<kernels::Tensor, String>;

impl Interp<'_> {
    /// `v` with every stack split over a mesh axis (`[Block[D]; L @pp]`) gathered whole.
    pub(crate) fn stacks_whole(&self, s: &Spmd, v: Value, span: Span) -> R<Value> {
        self.map_stacks(s, v, span, &|s, axes, t| s.all_gather(axes, 0, t))
    }

    /// `v` with every stack split over a mesh axis cut to this rank's run of layers.
    pub(crate) fn stacks_split(&self, s: &Spmd, v: Value, span: Span) -> R<Value> {
        self.map_stacks(s, v, span, &|s, axes, t| s.local_slice(axes, 0, t))
    }

    fn map_stacks(&self, s: &Spmd, v: Value, span: Span, f: BlockOp) -> R<Value> {
        let each = |x: Value, axis: Option<AxisId>| -> R<Value> {
            match axis {
                None => self.map_stacks(s, x, span, f),
                // A field of a split stack (a nested model field is a stack too): every tensor
                // in it is split.
                Some(a) => x.map_tensors(&mut |t| f(s, &[a], t).map_err(|m| rt(Code::E0602, m, span))),
            }
        };
        match v {
            Value::Model(m) => {
                let axis = self.prog.model(m.model).stack_axis;
                let fields = m.fields.iter().map(|x| each(x.clone(), axis)).collect::<R<Vec<_>>>()?;
                Ok(Value::Model(std::rc::Rc::new(super::value::ModelValue {
                    model: m.model,
                    dims: m.dims.clone(),
                    fields,
                })))
            }
            Value::Tuple(vs) => {
                let items = vs.iter().map(|x| each(x.clone(), None)).collect::<R<Vec<_>>>()?;
                Ok(Value::Tuple(items.into()))
            }
            other => Ok(other),
        }
    }
}
