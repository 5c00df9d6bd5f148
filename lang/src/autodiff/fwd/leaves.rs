//! Cotangents of a model holding a stack of layers, accumulated over a loop leaf by leaf.
//!
//! A loop over the layers (`for l in 0..L { h = block(m.layers[l], h) }`) reads one row of each
//! stacked field per iteration, whose cotangent is that row scattered into zeros of the whole
//! stack. Added to the model's accumulated cotangent every iteration, that costs the whole
//! model per iteration, O(L²) for L layers. Here the accumulator of such a free model is one
//! mutable slot per tensor leaf: a row contribution is added into its row in place
//! (`update(a, a[i] + row, at: i)`), a zero contribution costs nothing, anything else is added
//! leaf by leaf; the model is built from its leaves once, after the loop.

use super::*;
use crate::types::TensorTy;

/// What one contribution gives one leaf.
enum Part {
    /// `row` added at position `idx` of the leading (layer) dim.
    Row(Local, Local),
    /// Nothing.
    Zero,
    /// A whole value of the leaf's type.
    Whole(Local),
}

/// How a local of the loop body's block was defined, as far as the decomposition looks.
enum Def {
    Build(Vec<Local>),
    Scatter(Local, Local),
    Zeros,
    Add(Local, Local),
}

impl Gen<'_> {
    /// Whether a free value of type `t` is accumulated leaf by leaf: a model with a stack of
    /// layers among its fields and every leaf a tensor of known rank.
    pub(in crate::autodiff) fn by_leaves(&self, t: &Type) -> bool {
        let Type::Model(..) = t else { return false };
        let mut stack = false;
        let leaves = self.leaves(t, &mut Vec::new(), &mut stack);
        stack && leaves.is_some_and(|l| !l.is_empty())
    }

    /// The tensor leaves of a model type with their field paths; `None` when a leaf is not a
    /// tensor of known rank. Sets `stack` when a stack of layers is among them.
    fn leaves(&self, t: &Type, path: &mut Vec<usize>, stack: &mut bool) -> Option<Vec<(Vec<usize>, Type)>> {
        match t {
            Type::Tensor(TensorTy { shape, .. }) => {
                if shape.iter().any(|i| matches!(i, ShapeItem::Rest(_))) {
                    return None;
                }
                Some(vec![(path.clone(), t.clone())])
            }
            Type::Model(id, args) => {
                *stack |= self.prog.model(*id).stack.is_some();
                let mut out = Vec::new();
                for i in 0..self.prog.model(*id).fields.len() {
                    path.push(i);
                    let ft = self.field_type(*id, args, i);
                    out.extend(self.leaves(&ft, path, stack)?);
                    path.pop();
                }
                Some(out)
            }
            _ => None,
        }
    }

    /// One mutable slot of zeros per leaf of `t`, defined before the loop.
    pub(in crate::autodiff) fn leaf_slots(&mut self, t: &Type, v: Local) -> Res<Vec<(Vec<usize>, Local)>> {
        let leaves = self.leaves(t, &mut Vec::new(), &mut false).unwrap_or_default();
        let mut slots = Vec::new();
        for (path, ty) in leaves {
            let z = self.zeros_of(&ty, v)?;
            let s = self.new_local(ty, "fl", true);
            self.push_stmt(Stmt::Let { pat: Pat::Local(s), value: self.local(z) });
            slots.push((path, s));
        }
        Ok(slots)
    }

    /// Adds the contributions `cs` (values of model type `t`) into the leaf slots.
    pub(in crate::autodiff) fn add_into_leaves(
        &mut self,
        t: &Type,
        cs: &[Local],
        slots: &[(Vec<usize>, Local)],
    ) -> Res<()> {
        let defs = self.block_defs();
        for &c in cs {
            let mut parts: Vec<(Vec<usize>, Part)> = Vec::new();
            self.decompose(c, t, &mut Vec::new(), &defs, &mut parts);
            for (path, s) in slots {
                for (_, part) in parts.iter().filter(|(p, _)| p == path) {
                    let ty = self.ty_of(*s);
                    match part {
                        Part::Zero => {}
                        Part::Whole(x) => {
                            let acc = self.p(Prim::Add, &[*s, *x], Attrs::default(), ty);
                            self.push_stmt(Stmt::Assign { pat: Pat::Local(*s), value: self.local(acc) });
                        }
                        Part::Row(row, idx) => {
                            let rt = self.ty_of(*row);
                            let slice = Attrs { slice: vec![crate::ir::SliceEntry::Index], ..Attrs::default() };
                            let cur = self.p(Prim::Slice, &[*s, *idx], slice, rt.clone());
                            let sum = self.p(Prim::Add, &[cur, *row], Attrs::default(), rt);
                            let at = Attrs { axis: Some(0), ..Attrs::default() };
                            let upd = self.p(Prim::Update, &[*s, sum, *idx], at, ty);
                            self.push_stmt(Stmt::Assign { pat: Pat::Local(*s), value: self.local(upd) });
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The model of type `t` built from its leaf slots (after the loop).
    pub(in crate::autodiff) fn build_from_leaves(&mut self, t: &Type, slots: &[(Vec<usize>, Local)]) -> Res<Local> {
        self.build_at(t, &mut Vec::new(), slots)
    }

    fn build_at(&mut self, t: &Type, path: &mut Vec<usize>, slots: &[(Vec<usize>, Local)]) -> Res<Local> {
        match t {
            Type::Model(id, args) => {
                let mut fields = Vec::new();
                for i in 0..self.prog.model(*id).fields.len() {
                    path.push(i);
                    let ft = self.field_type(*id, args, i);
                    fields.push(self.build_at(&ft, path, slots)?);
                    path.pop();
                }
                let e = mk(
                    ExprKind::ModelBuild { fields: fields.iter().map(|f| self.local(*f)).collect() },
                    t.clone(),
                    self.sid,
                );
                Ok(self.emit(e, t.clone(), "lm"))
            }
            _ => {
                let Some(s) = slots.iter().find(|(p, _)| p == path).map(|(_, s)| *s) else {
                    return Err(err(self.span, "internal: a model leaf without its cotangent slot"));
                };
                Ok(self.emit(self.local(s), t.clone(), "lv"))
            }
        }
    }

    /// The definitions of the locals of the block being emitted that the decomposition follows.
    fn block_defs(&self) -> HashMap<Local, Def> {
        let mut defs = HashMap::new();
        let Some(block) = self.blocks.last() else { return defs };
        let local = |e: &Expr| match &e.kind {
            ExprKind::Local(l) => Some(*l),
            _ => None,
        };
        for s in block {
            let Stmt::Let { pat: Pat::Local(l), value } = s else { continue };
            let def = match &value.kind {
                ExprKind::ModelBuild { fields } => fields.iter().map(local).collect::<Option<Vec<_>>>().map(Def::Build),
                ExprKind::Prim { prim: Prim::ScatterAdd, args, attrs } if attrs.axis == Some(0) && args.len() == 2 => {
                    match (local(&args[0]), local(&args[1]), &args[1].ty) {
                        (Some(row), Some(idx), Type::Tensor(it)) if it.shape.is_empty() => Some(Def::Scatter(row, idx)),
                        _ => None,
                    }
                }
                ExprKind::Prim { prim: Prim::Zeros, .. } => Some(Def::Zeros),
                ExprKind::Prim { prim: Prim::Add, args, .. } if args.len() == 2 && value.ty.is_model() => {
                    match (local(&args[0]), local(&args[1])) {
                        (Some(a), Some(b)) => Some(Def::Add(a, b)),
                        _ => None,
                    }
                }
                _ => None,
            };
            if let Some(d) = def {
                defs.insert(*l, d);
            }
        }
        defs
    }

    /// What `c` (of type `t`, at field path `path`) gives each leaf below it.
    fn decompose(
        &mut self,
        c: Local,
        t: &Type,
        path: &mut Vec<usize>,
        defs: &HashMap<Local, Def>,
        out: &mut Vec<(Vec<usize>, Part)>,
    ) {
        match (t, defs.get(&c)) {
            (Type::Model(id, args), Some(Def::Build(fields))) if fields.len() == self.prog.model(*id).fields.len() => {
                for (i, f) in fields.clone().into_iter().enumerate() {
                    path.push(i);
                    let ft = self.field_type(*id, args, i);
                    self.decompose(f, &ft, path, defs, out);
                    path.pop();
                }
            }
            (Type::Model(..), Some(Def::Add(a, b))) => {
                let (a, b) = (*a, *b);
                self.decompose(a, t, path, defs, out);
                self.decompose(b, t, path, defs, out);
            }
            (Type::Model(id, args), _) => {
                // Not built here: each leaf reads its field of the value.
                for i in 0..self.prog.model(*id).fields.len() {
                    let ft = self.field_type(*id, args, i);
                    let f = self.emit(
                        mk(ExprKind::Field(Box::new(self.local(c)), i), ft.clone(), self.sid),
                        ft.clone(),
                        "lf",
                    );
                    path.push(i);
                    self.decompose(f, &ft, path, defs, out);
                    path.pop();
                }
            }
            (_, Some(Def::Scatter(row, idx))) => out.push((path.clone(), Part::Row(*row, *idx))),
            (_, Some(Def::Zeros)) => out.push((path.clone(), Part::Zero)),
            _ => out.push((path.clone(), Part::Whole(c))),
        }
    }
}
