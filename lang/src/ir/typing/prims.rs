//! The type rule of every primitive: its result type from its operands' types and its
//! attributes. One exhaustive match, so a new primitive does not compile without its rule.

use super::{dims, elems_agree, tensor, Rule};
use crate::ir::prim::{Domain, Joins, Reduces};
use crate::ir::{Attrs, Expr, ExprKind, Lit, Prim, SliceEntry};
use crate::types::unify::{broadcast, join_elem, matmul_shape, window_out_size};
use crate::types::{Dim, Elem, ElemTy, ShapeItem, Type};

type Shape = Vec<ShapeItem>;

/// The operand `i`'s element type and shape.
fn tensor_arg(args: &[Expr], i: usize) -> Result<(Elem, &Shape), String> {
    match args.get(i).map(|a| &a.ty) {
        Some(Type::Tensor(t)) => Ok((t.elem, &t.shape)),
        Some(_) => Err(format!("operand {i} is not a tensor")),
        None => Err(format!("operand {i} is missing")),
    }
}

/// The fixed dims of a shape (no `..` rest).
fn fixed(s: &Shape) -> Result<Vec<Dim>, String> {
    crate::types::fixed_dims(s).ok_or_else(|| "a `..` rest where fixed dims are needed".to_string())
}

fn arity(args: &[Expr], n: usize) -> Result<(), String> {
    if args.len() == n {
        Ok(())
    } else {
        Err(format!("{} operands, expected {n}", args.len()))
    }
}

fn axis(attrs: &Attrs, rank: usize) -> Result<usize, String> {
    match attrs.axis {
        Some(a) if a < rank => Ok(a),
        Some(a) => Err(format!("axis {a} of a rank-{rank} operand")),
        None => Err("no axis".into()),
    }
}

/// The position of `attrs`' axis in a shape of `rank` items, counted from the end with
/// `attrs.from_end` (over a `..` rest).
fn axis_counted(attrs: &Attrs, rank: usize) -> Result<usize, String> {
    let a = attrs.axis.ok_or("no axis")?;
    let i = if attrs.from_end { rank.checked_sub(a) } else { Some(a) };
    i.filter(|&i| i < rank).ok_or_else(|| format!("axis {a} of a rank-{rank} operand"))
}

/// A declared dim at position `i` of the node's own type (a size the operands do not carry).
fn declared_dim(declared: &Type, i: usize) -> Option<Dim> {
    match declared {
        Type::Tensor(t) => match t.shape.get(i) {
            Some(ShapeItem::Dim(d)) => Some(d.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// A compile-time integer an operand holds (a literal, a dim, their sums and differences).
fn static_int(e: &Expr) -> Option<Dim> {
    match &e.kind {
        ExprKind::Lit(Lit::Int(n)) => Some(Dim::constant(*n)),
        ExprKind::DimValue(d) => Some(d.clone()),
        ExprKind::Prim { prim: Prim::Add, args, .. } if args.len() == 2 => {
            Some(static_int(&args[0])?.add(&static_int(&args[1])?))
        }
        ExprKind::Prim { prim: Prim::Sub, args, .. } if args.len() == 2 => {
            Some(static_int(&args[0])?.sub(&static_int(&args[1])?))
        }
        ExprKind::Prim { prim: Prim::Cast, args, .. } if args.len() == 1 => static_int(&args[0]),
        _ => None,
    }
}

/// The length of `start..end`: their difference when both are known, or when `end` is
/// `start + k` written as such.
fn range_len(start: &Expr, end: &Expr) -> Option<Dim> {
    if let (Some(a), Some(b)) = (static_int(start), static_int(end)) {
        return Some(b.sub(&a));
    }
    if let ExprKind::Prim { prim: Prim::Add, args, .. } = &end.kind {
        if args.len() == 2 && same_value(&args[0], start) {
            return static_int(&args[1]);
        }
    }
    None
}

/// Whether two operand expressions certainly hold the same value (the same local or literal).
fn same_value(a: &Expr, b: &Expr) -> bool {
    match (&a.kind, &b.kind) {
        (ExprKind::Local(x), ExprKind::Local(y)) => x == y,
        (ExprKind::Lit(x), ExprKind::Lit(y)) => x == y,
        (ExprKind::DimValue(x), ExprKind::DimValue(y)) => x == y,
        _ => false,
    }
}

/// The einsum result's dims from the explicit specification `ab,bc->ac`.
fn einsum_shape(spec: &str, args: &[Expr]) -> Result<Option<Vec<Dim>>, String> {
    let Some((ins, out)) = spec.split_once("->") else { return Err(format!("einsum spec `{spec}` has no `->`")) };
    if spec.contains('.') {
        return Ok(None);
    }
    let mut sizes: Vec<(char, Dim)> = Vec::new();
    for (i, term) in ins.split(',').enumerate() {
        let (_, s) = tensor_arg(args, i)?;
        let ds = fixed(s)?;
        if ds.len() != term.chars().count() {
            return Err(format!("einsum operand {i} has rank {}, its term `{term}` {}", ds.len(), term.len()));
        }
        for (c, d) in term.chars().zip(ds) {
            match sizes.iter().find(|(x, _)| *x == c) {
                Some((_, prev)) if *prev != d && !prev.is_one() && !d.is_one() => {
                    return Err(format!("einsum letter `{c}` has two sizes"))
                }
                Some(_) => {}
                None => sizes.push((c, d)),
            }
        }
    }
    out.chars()
        .map(|c| sizes.iter().find(|(x, _)| *x == c).map(|(_, d)| d.clone()))
        .collect::<Option<Vec<_>>>()
        .map(Some)
        .ok_or_else(|| format!("einsum output `{out}` names a letter no operand has"))
}

/// The rule of primitive `prim` applied to `args` with `attrs`; `declared` is the node's own
/// type, read only where the primitive's result is its declaration or a size the IR does not
/// carry.
pub(super) fn rule(prim: Prim, args: &[Expr], attrs: &Attrs, declared: &Type) -> Result<Rule, String> {
    // Model arithmetic (`m - lr * g`, `-g`, `sqrt(v)`) and the sum of two cotangents of a
    // tuple: elementwise over every part, the result of the structure's type.
    if matches!(prim.class(), crate::ir::prim::Class::Unary | crate::ir::prim::Class::Binary) {
        if let Some(m) = args.iter().find(|a| a.ty.is_model() || matches!(a.ty, Type::Tuple(_))) {
            return Ok(Rule::Is(m.ty.clone()));
        }
    }
    let rule = rule_of(prim, args, attrs, declared)?;
    // A bf16/f16 sum, mean or contraction typed f32 is a partial result kept unrounded until it is
    // combined across ranks (the sharding pass types it so), then rounded once.
    if let (Rule::Is(Type::Tensor(t)), Type::Tensor(d)) = (&rule, declared) {
        let accumulates = matches!(prim, Prim::Sum | Prim::Mean | Prim::MatMul | Prim::Einsum);
        if accumulates && matches!(t.elem, Elem::T(ElemTy::Bf16 | ElemTy::F16)) && d.elem == Elem::T(ElemTy::F32) {
            return Ok(Rule::Is(tensor(d.elem, t.shape.clone())));
        }
    }
    Ok(rule)
}

fn rule_of(prim: Prim, args: &[Expr], attrs: &Attrs, declared: &Type) -> Result<Rule, String> {
    use Prim as P;
    let same_as = |i: usize| -> Result<Rule, String> {
        args.get(i).map(|a| Rule::Is(a.ty.clone())).ok_or_else(|| format!("operand {i} is missing"))
    };
    let unit = || Ok(Rule::Is(Type::unit()));
    let created = |shape: Shape| -> Result<Rule, String> {
        let et = attrs.dtype.ok_or("a creation without its element type")?;
        Ok(Rule::Is(tensor(Elem::T(et), shape)))
    };
    match prim {
        // The operand's type; `!` of any operand is bool.
        crate::unary_prims!() => {
            arity(args, 1)?;
            let (_, s) = tensor_arg(args, 0)?;
            match prim.unary_kernel() {
                Some((_, Domain::Bool)) => Ok(Rule::Is(tensor(Elem::T(ElemTy::Bool), s.clone()))),
                _ => same_as(0),
            }
        }
        // Broadcast operands; the result's element type is theirs or bool, as the entry says.
        crate::binary_prims!() => {
            arity(args, 2)?;
            let (ea, sa) = tensor_arg(args, 0)?;
            let (eb, sb) = tensor_arg(args, 1)?;
            let e = match prim.binary_kernel() {
                Some((_, Joins::Bool)) if elems_agree(ea, eb) || join_elem(ea, eb).is_some() => Elem::T(ElemTy::Bool),
                Some((_, Joins::Bool)) => return Err("operands of different element types".into()),
                _ => join_elem(ea, eb).ok_or("operands of different element types")?,
            };
            let s = broadcast(sa, sb).map_err(|_| "operands do not broadcast".to_string())?;
            Ok(Rule::Is(tensor(e, s)))
        }
        P::MatMul => {
            arity(args, 2)?;
            let (ea, sa) = tensor_arg(args, 0)?;
            let (eb, sb) = tensor_arg(args, 1)?;
            let e = join_elem(ea, eb).ok_or("operands of different element types")?;
            let shape = matmul_shape(sa, sb).map_err(|e| format!("`@` of these shapes: {e:?}"))?;
            Ok(Rule::Is(tensor(e, shape)))
        }
        P::Where => {
            arity(args, 3)?;
            let (_, sc) = tensor_arg(args, 0)?;
            let (ea, sa) = tensor_arg(args, 1)?;
            let (eb, sb) = tensor_arg(args, 2)?;
            let e = join_elem(ea, eb).ok_or("branches of different element types")?;
            let s = broadcast(sc, sa).and_then(|s| broadcast(&s, sb)).map_err(|_| "operands do not broadcast")?;
            Ok(Rule::Is(tensor(e, s)))
        }
        P::Cast => {
            arity(args, 1)?;
            let (_, s) = tensor_arg(args, 0)?;
            created(s.clone())
        }
        P::Sum | P::Mean | P::Max | P::Min | P::Argmax | P::Argmin | P::Logsumexp => reduction(prim, args, attrs),
        // The operand's shape, of the elements the entry gives.
        crate::along_prims!() => {
            arity(args, 1)?;
            let (e, s) = tensor_arg(args, 0)?;
            axis_counted(attrs, s.len())?;
            Ok(Rule::Is(tensor(reduction_elem(prim, e), s.clone())))
        }
        P::Reshape | P::BroadcastTo => {
            arity(args, 1)?;
            let (e, _) = tensor_arg(args, 0)?;
            Ok(Rule::Is(tensor(e, dims(&attrs.shape))))
        }
        P::Transpose | P::Permute => {
            arity(args, 1)?;
            let (e, s) = tensor_arg(args, 0)?;
            let ds = fixed(s)?;
            let mut sorted = attrs.perm.clone();
            sorted.sort();
            if sorted != (0..ds.len()).collect::<Vec<_>>() {
                return Err(format!("{:?} is not a permutation of {} axes", attrs.perm, ds.len()));
            }
            Ok(Rule::Is(tensor(e, attrs.perm.iter().map(|&i| ShapeItem::Dim(ds[i].clone())).collect())))
        }
        P::Concat | P::Stack => concat_or_stack(prim, args, attrs),
        P::CopySplit | P::CopyJoin => copies(prim, args, attrs),
        P::ExpandDims => {
            arity(args, 1)?;
            let (e, s) = tensor_arg(args, 0)?;
            let mut ds = fixed(s)?;
            let ax = axis(attrs, ds.len() + 1)?;
            ds.insert(ax, Dim::constant(1));
            Ok(Rule::Is(tensor(e, dims(&ds))))
        }
        P::Squeeze => {
            arity(args, 1)?;
            let (e, s) = tensor_arg(args, 0)?;
            let mut ds = fixed(s)?;
            match attrs.axis {
                Some(a) if a < ds.len() && ds[a].is_one() => {
                    ds.remove(a);
                }
                Some(a) => return Err(format!("axis {a} is not of size 1")),
                None => ds.retain(|d| !d.is_one()),
            }
            Ok(Rule::Is(tensor(e, dims(&ds))))
        }
        P::Gather => {
            arity(args, 2)?;
            let (e, s) = tensor_arg(args, 0)?;
            let (_, is) = tensor_arg(args, 1)?;
            let xd = fixed(s)?;
            let ax = axis(attrs, xd.len())?;
            let mut shape = dims(&xd[..ax]);
            shape.extend(is.iter().cloned());
            shape.extend(dims(&xd[ax + 1..]));
            Ok(Rule::Is(tensor(e, shape)))
        }
        P::OneHot => {
            arity(args, 1)?;
            let (_, s) = tensor_arg(args, 0)?;
            let mut shape = s.clone();
            shape.push(ShapeItem::Dim(attrs.shape.first().ok_or("`one_hot` without its size")?.clone()));
            created(shape)
        }
        P::Einsum => {
            let spec = attrs.spec.as_deref().ok_or("`einsum` without its specification")?;
            let mut elem = tensor_arg(args, 0)?.0;
            for i in 1..args.len() {
                elem = join_elem(elem, tensor_arg(args, i)?.0).ok_or("operands of different element types")?;
            }
            match einsum_shape(spec, args)? {
                Some(ds) => Ok(Rule::Is(tensor(elem, dims(&ds)))),
                None => Ok(Rule::Declared),
            }
        }
        P::Conv2d => conv2d(args, attrs),
        P::Conv2dInputGrad => {
            arity(args, 2)?;
            let (e, gs) = tensor_arg(args, 0)?;
            let g = fixed(gs)?;
            let w = fixed(tensor_arg(args, 1)?.1)?;
            if g.len() != 4 || w.len() != 4 || attrs.shape.len() != 2 {
                return Err("`conv2d_input_grad` needs rank-4 operands and the input's size".into());
            }
            let out = [g[0].clone(), w[1].clone(), attrs.shape[0].clone(), attrs.shape[1].clone()];
            Ok(Rule::Is(tensor(e, dims(&out))))
        }
        P::Conv2dWeightGrad => {
            arity(args, 2)?;
            let (e, xs) = tensor_arg(args, 0)?;
            let x = fixed(xs)?;
            let g = fixed(tensor_arg(args, 1)?.1)?;
            if g.len() != 4 || x.len() != 4 || attrs.shape.len() != 2 {
                return Err("`conv2d_weight_grad` needs rank-4 operands and the kernel's size".into());
            }
            let out = [g[1].clone(), x[1].clone(), attrs.shape[0].clone(), attrs.shape[1].clone()];
            Ok(Rule::Is(tensor(e, dims(&out))))
        }
        P::MaxPool2d | P::AvgPool2d => pool2d(args, attrs),
        P::MaxPool2dGrad => {
            arity(args, 2)?;
            let (e, _) = tensor_arg(args, 1)?;
            let (_, xs) = tensor_arg(args, 0)?;
            Ok(Rule::Is(tensor(e, xs.clone())))
        }
        P::AvgPool2dGrad => {
            arity(args, 1)?;
            let (e, gs) = tensor_arg(args, 0)?;
            let g = fixed(gs)?;
            if g.len() != 4 || attrs.shape.len() != 2 {
                return Err("`avg_pool2d_grad` needs a rank-4 operand and the input's size".into());
            }
            let out = [g[0].clone(), g[1].clone(), attrs.shape[0].clone(), attrs.shape[1].clone()];
            Ok(Rule::Is(tensor(e, dims(&out))))
        }
        P::Slice => slice(args, attrs, declared),
        P::ScatterAdd | P::ScatterAddAlong => {
            arity(args, 2)?;
            let (e, _) = tensor_arg(args, 0)?;
            Ok(Rule::Is(tensor(e, dims(&attrs.shape))))
        }
        P::Update => {
            arity(args, 3)?;
            tensor_arg(args, 1)?;
            same_as(0)
        }
        P::Argsort => {
            arity(args, 1)?;
            let (_, s) = tensor_arg(args, 0)?;
            let mut ds = fixed(s)?;
            let ax = axis(attrs, ds.len())?;
            if let Some(k) = attrs.shape.first() {
                ds[ax] = k.clone();
            }
            Ok(Rule::Is(tensor(Elem::T(ElemTy::I32), dims(&ds))))
        }
        P::TakeAlong => {
            arity(args, 2)?;
            let (e, _) = tensor_arg(args, 0)?;
            let (_, is) = tensor_arg(args, 1)?;
            Ok(Rule::Is(tensor(e, is.clone())))
        }
        P::Attention => {
            arity(args, 5)?;
            let (e, qs) = tensor_arg(args, 0)?;
            let (_, vs) = tensor_arg(args, 2)?;
            let mut shape = qs.clone();
            let last = vs.last().ok_or("`fused_attention` of a scalar")?.clone();
            *shape.last_mut().ok_or("`fused_attention` of a scalar")? = last;
            Ok(Rule::Is(tensor(e, shape)))
        }
        P::AttentionWeights => {
            arity(args, 4)?;
            let (e, qs) = tensor_arg(args, 0)?;
            let (_, ks) = tensor_arg(args, 1)?;
            if qs.len() < 2 || ks.len() < 2 {
                return Err("attention operands of rank < 2".into());
            }
            let mut shape = qs[..qs.len() - 1].to_vec();
            shape.push(ks[ks.len() - 2].clone());
            Ok(Rule::Is(tensor(e, shape)))
        }
        P::Quantize => {
            arity(args, 1)?;
            same_as(0)
        }
        P::Prune => {
            arity(args, 2)?;
            same_as(0)
        }
        P::Zeros | P::Ones | P::Arange | P::Eye => created(dims(&attrs.shape)),
        P::Full => {
            arity(args, 1)?;
            created(dims(&attrs.shape))
        }
        P::Normal | P::Uniform | P::HeNormal | P::GlorotUniform => match args.get(1) {
            // `uniform` shaped like an operand (`categorical`'s noise).
            Some(a) if attrs.shape.is_empty() => match &a.ty {
                Type::Tensor(t) => created(t.shape.clone()),
                _ => Err("random numbers shaped like a non-tensor".into()),
            },
            _ => created(dims(&attrs.shape)),
        },
        P::Params => {
            arity(args, 1)?;
            Ok(Rule::Is(Type::scalar(ElemTy::I32)))
        }
        P::Map => match args.get(1) {
            Some(m) => Ok(Rule::Is(m.ty.clone())),
            None => Err("`map` without a model".into()),
        },
        P::ModelSum => {
            arity(args, 1)?;
            Ok(Rule::Is(Type::scalar(ElemTy::F32)))
        }
        P::ShardState | P::StopGradient => {
            arity(args, 1)?;
            same_as(0)
        }
        P::TapeNew => match declared {
            Type::List(ts) if ts.len() == 1 => Ok(Rule::Declared),
            _ => Err("a tape not typed as a list of one state".into()),
        },
        P::TapePush => {
            arity(args, 2)?;
            match &args[0].ty {
                Type::List(ts) if ts.len() == 1 && super::agree(&ts[0], &args[1].ty) => same_as(0),
                Type::List(_) => Err("a pushed state of another type than the tape's".into()),
                _ => Err("a push onto a non-tape".into()),
            }
        }
        P::TapeGet => {
            arity(args, 2)?;
            match &args[0].ty {
                Type::List(ts) if ts.len() == 1 => Ok(Rule::Is(ts[0].clone())),
                _ => Err("an entry of a non-tape".into()),
            }
        }
        P::Print | P::Save | P::LogScalar | P::Assert | P::AssertClose => unit(),
        P::Load => Ok(Rule::Declared),
        P::Exists => {
            arity(args, 1)?;
            Ok(Rule::Is(Type::scalar(ElemTy::Bool)))
        }
        P::Clock => {
            arity(args, 0)?;
            Ok(Rule::Is(Type::scalar(ElemTy::F64)))
        }
        P::AllReduceSum
        | P::AllReduceMax
        | P::AllReduceMin
        | P::AllReduceMean
        | P::AllGather
        | P::ReduceScatter
        | P::LocalSlice
        | P::AllToAll => {
            // Dims keep their global sizes: a collective changes the layout, not the type.
            arity(args, 1)?;
            same_as(0)
        }
    }
}

/// The element type of reduction (or primitive along one axis) `prim` of `e` elements, as its
/// table entry says: the arg-reductions give indices, a sum of booleans counts them.
pub(crate) fn reduction_elem(prim: Prim, e: Elem) -> Elem {
    match prim.reduces().or(prim.along().map(|a| a.elems)) {
        Some(Reduces::Index) => Elem::T(ElemTy::I32),
        Some(Reduces::Counts) if e == Elem::T(ElemTy::Bool) => Elem::T(ElemTy::I32),
        Some(Reduces::Counts | Reduces::Float | Reduces::Same) | None => e,
    }
}

/// A reduction: the axis removed (kept as 1 with `keepdims`), or every axis.
fn reduction(prim: Prim, args: &[Expr], attrs: &Attrs) -> Result<Rule, String> {
    arity(args, 1)?;
    let (e, s) = tensor_arg(args, 0)?;
    let out = reduction_elem(prim, e);
    let shape = match attrs.axis {
        None if attrs.keepdims => s.iter().map(|_| ShapeItem::Dim(Dim::constant(1))).collect(),
        None => vec![],
        Some(_) => {
            let i = axis_counted(attrs, s.len())?;
            let mut shape = s.clone();
            if attrs.keepdims {
                shape[i] = ShapeItem::Dim(Dim::constant(1));
            } else {
                shape.remove(i);
            }
            shape
        }
    };
    Ok(Rule::Is(tensor(out, shape)))
}

/// `concat` adds the operands' sizes along the axis; `stack` adds an axis of their count.
fn concat_or_stack(prim: Prim, args: &[Expr], attrs: &Attrs) -> Result<Rule, String> {
    let (e, s0) = tensor_arg(args, 0)?;
    let mut out = fixed(s0)?;
    let out_rank = if prim == Prim::Stack { out.len() + 1 } else { out.len() };
    let ax = axis(attrs, out_rank)?;
    if prim == Prim::Concat {
        let mut total = Dim::constant(0);
        for i in 0..args.len() {
            let ds = fixed(tensor_arg(args, i)?.1)?;
            total = total.add(ds.get(ax).ok_or("operands of different ranks")?);
        }
        out[ax] = total;
    } else {
        out.insert(ax, Dim::constant(args.len() as i64));
    }
    Ok(Rule::Is(tensor(e, dims(&out))))
}

/// `copy_split(x)` (copy `perm[0]` of `perm[1]` along `axis`: that dim divided by the count)
/// and `copy_join(x0, …)` (as many copies of one shape: that dim multiplied by the count).
fn copies(prim: Prim, args: &[Expr], attrs: &Attrs) -> Result<Rule, String> {
    let (e, s0) = tensor_arg(args, 0)?;
    let mut out = fixed(s0)?;
    let ax = axis(attrs, out.len())?;
    if prim == Prim::CopySplit {
        arity(args, 1)?;
        let (n, c) = (attrs.perm.get(1).copied().unwrap_or(0), attrs.perm.first().copied().unwrap_or(0));
        if n == 0 || c >= n {
            return Err(format!("copy {c} of {n}"));
        }
        out[ax] = out[ax].div(&Dim::constant(n as i64)).ok_or("a copy of a dim that does not divide")?;
    } else {
        for i in 1..args.len() {
            if fixed(tensor_arg(args, i)?.1)? != fixed(s0)? {
                return Err("copies of different shapes".into());
            }
        }
        out[ax] = out[ax].mul(&Dim::constant(args.len() as i64));
    }
    Ok(Rule::Is(tensor(e, dims(&out))))
}

/// `conv2d(x[N, C, H, W], w[O, C, KH, KW])` with `attrs.perm = [stride, padding]`.
fn conv2d(args: &[Expr], attrs: &Attrs) -> Result<Rule, String> {
    arity(args, 2)?;
    let (e, xs) = tensor_arg(args, 0)?;
    let x = fixed(xs)?;
    let w = fixed(tensor_arg(args, 1)?.1)?;
    let [stride, pad] = attrs.perm[..] else { return Err("`conv2d` without stride and padding".into()) };
    if x.len() != 4 || w.len() != 4 {
        return Err("`conv2d` of operands not of rank 4".into());
    }
    let mut out = vec![x[0].clone(), w[0].clone()];
    for i in [2, 3] {
        out.push(window_out_size(&x[i], &w[i], stride as i64, pad as i64));
    }
    Ok(Rule::Is(tensor(e, dims(&out))))
}

/// Pooling of `x[N, C, H, W]` with `attrs.perm = [kernel, stride]`.
fn pool2d(args: &[Expr], attrs: &Attrs) -> Result<Rule, String> {
    let (e, xs) = tensor_arg(args, 0)?;
    let x = fixed(xs)?;
    let [kernel, stride] = attrs.perm[..] else { return Err("pooling without kernel and stride".into()) };
    if x.len() != 4 {
        return Err("pooling of an operand not of rank 4".into());
    }
    let mut out = vec![x[0].clone(), x[1].clone()];
    for i in [2, 3] {
        out.push(window_out_size(&x[i], &Dim::constant(kernel as i64), stride as i64, 0));
    }
    Ok(Rule::Is(tensor(e, dims(&out))))
}

/// `x[i, a:b, :]`: the entries take the leading axes; what follows them (a `..` rest too) is kept.
fn slice(args: &[Expr], attrs: &Attrs, declared: &Type) -> Result<Rule, String> {
    // The entries take the leading axes; what follows them (a `..` rest too) is kept.
    let (e, s) = tensor_arg(args, 0)?;
    let (mut out, mut next) = (Vec::new(), 1);
    for (i, entry) in attrs.slice.iter().enumerate() {
        let d = match s.get(i) {
            Some(ShapeItem::Dim(d)) => d,
            Some(ShapeItem::Rest(_)) => return Err("a slice entry at a `..` rest".into()),
            None => return Err(format!("{} slice entries for a rank-{} operand", attrs.slice.len(), s.len())),
        };
        match entry {
            SliceEntry::Index => next += 1,
            SliceEntry::Full => out.push(ShapeItem::Dim(d.clone())),
            SliceEntry::Range => {
                let (a, b) = (args.get(next).ok_or("a missing bound")?, args.get(next + 1).ok_or("a missing bound")?);
                next += 2;
                // A run-time length is the node's own: the checker proved it.
                let len = range_len(a, b).or_else(|| declared_dim(declared, out.len()));
                out.push(ShapeItem::Dim(len.ok_or("a range of unknown length")?));
            }
        }
    }
    out.extend(s.iter().skip(attrs.slice.len()).cloned());
    if next != args.len() {
        return Err(format!("{} operands for {} bounds", args.len(), next - 1));
    }
    Ok(Rule::Is(tensor(e, out)))
}
