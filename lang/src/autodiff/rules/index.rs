//! Reverse rules of indexing and assembling: slices, `update`, `concat` and `stack`.

use super::*;

/// `x[i, a:b, :]`: the cotangent scattered back into zeros of `x`'s shape, last axis first.
pub(super) fn slice(g: &mut Gen, s: &Site, v: &mut Vec<(usize, Local)>) -> Res<()> {
    let &Site { attrs, args, tys, bar, ot, .. } = s;
    // A slice is a gather along each sliced axis; its adjoint scatters back, last axis
    // first.
    let Some(xd) = fixed(&shape(&tys[0])) else { return Err(err(g.span, "slice of a rest")) };
    let od = fixed(&shape(ot)).unwrap_or_default();
    let i32t = Type::scalar(ElemTy::I32);
    // Bound operands per axis, and output axis of each kept input axis.
    let mut bounds = Vec::new();
    let mut k = 1;
    let mut out_axis = Vec::new();
    let mut oi = 0;
    for kind in &attrs.slice {
        match kind {
            SliceEntry::Index => {
                bounds.push(vec![args[k]]);
                k += 1;
                out_axis.push(None);
            }
            SliceEntry::Range => {
                bounds.push(vec![args[k], args[k + 1]]);
                k += 2;
                out_axis.push(Some(oi));
                oi += 1;
            }
            SliceEntry::Full => {
                bounds.push(vec![]);
                out_axis.push(Some(oi));
                oi += 1;
            }
        }
    }
    let mut cur = bar;
    let mut cur_dims = od.clone();
    for j in (0..attrs.slice.len()).rev() {
        let pos = attrs.slice[..j].iter().filter(|&&kd| kd != SliceEntry::Index).count();
        let (idx, new_dims) = match attrs.slice[j] {
            SliceEntry::Index => {
                let i = bounds[j][0];
                let zero = g.emit(mk(ExprKind::Lit(crate::ir::Lit::Int(0)), i32t.clone(), g.sid), i32t.clone(), "z");
                let neg = g.cmp(Prim::Lt, i, zero);
                let n = g.emit(mk(ExprKind::DimValue(xd[j].clone()), i32t.clone(), g.sid), i32t.clone(), "n");
                let wrapped = g.bin(Prim::Add, i, n, i32t.clone());
                let idx = g.select(neg, wrapped, i, i32t.clone());
                let mut nd = cur_dims.clone();
                nd.insert(pos, xd[j].clone());
                (idx, nd)
            }
            SliceEntry::Range => {
                let len = od[out_axis[j].unwrap_or(0)].clone();
                let ar = g.p(
                    Prim::Arange,
                    &[],
                    Attrs { shape: vec![len.clone()], dtype: Some(ElemTy::I32), ..Attrs::default() },
                    Type::tensor(ElemTy::I32, vec![len]),
                );
                let idx = g.bin(Prim::Add, ar, bounds[j][0], g.ty_of(ar));
                let mut nd = cur_dims.clone();
                nd[pos] = xd[j].clone();
                (idx, nd)
            }
            SliceEntry::Full => continue,
        };
        let ty = tensor(elem(&tys[0]), new_dims.iter().cloned().map(ShapeItem::Dim).collect());
        cur = g.p(
            Prim::ScatterAdd,
            &[cur, idx],
            Attrs { axis: Some(pos), shape: new_dims.clone(), ..Attrs::default() },
            ty,
        );
        cur_dims = new_dims;
    }
    v.push((0, cur));
    Ok(())
}

/// `update(x, v, at: i)`: `x`'s cotangent with the block zeroed, `v`'s the block.
pub(super) fn update(g: &mut Gen, s: &Site, v: &mut Vec<(usize, Local)>) -> Res<()> {
    let &Site { attrs, args, tys, act, bar, .. } = s;
    // y = x with v written at i: x's gradient is ȳ with that block zeroed, v's is the block.
    let k = attrs.axis.unwrap_or(0);
    let (Some(xd), Some(vd)) = (fixed(&shape(&tys[0])), fixed(&shape(&tys[1]))) else {
        return Err(err(g.span, "update of a rest"));
    };
    let i = args[2];
    if act[0] {
        let zt = tys[1].clone();
        let dtype = Some(elem(&zt));
        let z = g.p(Prim::Zeros, &[], Attrs { shape: vd.clone(), dtype, ..Attrs::default() }, zt);
        v.push((0, g.p(Prim::Update, &[bar, z, i], attrs.clone(), tys[0].clone())));
    }
    if act[1] {
        let mut slice = vec![SliceEntry::Full; xd.len()];
        let mut sargs = vec![bar, i];
        if vd.len() == xd.len() {
            slice[k] = SliceEntry::Range;
            let i32t = Type::scalar(ElemTy::I32);
            let m = g.emit(mk(ExprKind::DimValue(vd[k].clone()), i32t.clone(), g.sid), i32t.clone(), "m");
            sargs.push(g.p(Prim::Add, &[i, m], Attrs::default(), i32t));
        } else {
            slice[k] = SliceEntry::Index;
        }
        v.push((1, g.p(Prim::Slice, &sargs, Attrs { slice, ..Attrs::default() }, tys[1].clone())));
    }
    Ok(())
}

/// `concat`/`stack`: each operand's part of the cotangent.
pub(super) fn concat_or_stack(g: &mut Gen, s: &Site, v: &mut Vec<(usize, Local)>) -> Res<()> {
    let &Site { p, attrs, tys, act, bar, ot, .. } = s;
    let axis = attrs.axis.unwrap_or(0);
    let mut off = Dim::constant(0);
    for (i, t) in tys.iter().enumerate() {
        let s = shape(t);
        let rank = shape(ot).len();
        let mut kinds = vec![SliceEntry::Full; rank];
        let i32t = Type::scalar(ElemTy::I32);
        let mut bounds = Vec::new();
        if p == Prim::Concat {
            let ShapeItem::Dim(size) = &s[axis] else { return Err(err(g.span, "concat over a rest")) };
            kinds[axis] = SliceEntry::Range;
            let end = off.add(size);
            for d in [off.clone(), end.clone()] {
                bounds.push(g.emit(mk(ExprKind::DimValue(d), i32t.clone(), g.sid), i32t.clone(), "b"));
            }
            off = end;
        } else {
            kinds[axis] = SliceEntry::Index;
            bounds.push(g.emit(
                mk(ExprKind::Lit(crate::ir::Lit::Int(i as i64)), i32t.clone(), g.sid),
                i32t.clone(),
                "b",
            ));
        }
        if act[i] {
            let mut xs = vec![bar];
            xs.extend(bounds);
            v.push((i, g.p(Prim::Slice, &xs, Attrs { slice: kinds, ..Attrs::default() }, t.clone())));
        }
    }
    Ok(())
}
