//! Printing IR functions back as msl source (`msl grad FILE FN` shows derivatives this way).
//!
//! The output uses only surface syntax: operators, builtins with named arguments, `let`/`var`,
//! `if`, `for`, `while`, tuples, fields and model constructors, so it can be checked again.

use super::prim::Class;
use super::{Expr, ExprKind, Func, Lit, Local, Pat, Prim, Program, SliceEntry, Stmt};
use crate::types::TensorTy;
use crate::types::{dim_str, type_str, Elem, Type};
use std::fmt::Write as _;

/// Prints `f` as an msl function named `name`.
pub fn function_source(p: &Program, f: &Func, name: &str) -> String {
    let mut pr = Printer { p, f, out: String::new() };
    let mut g: Vec<String> = f.dims.iter().map(|s| p.sym_names[s.0 as usize].clone()).collect();
    g.extend(f.rests.iter().map(|r| format!("..{}", p.rest_names[r.0 as usize])));
    g.extend(f.models.iter().map(|v| format!("{}: Model", p.tyvar_names[v.0 as usize])));
    let gs = if g.is_empty() { String::new() } else { format!("[{}]", g.join(", ")) };
    let params: Vec<String> =
        f.params.iter().map(|l| format!("{}: {}", pr.name(*l), pr.ty(&f.locals[l.0 as usize].ty))).collect();
    let _ = write!(pr.out, "fn {name}{gs}({}) -> {} ", params.join(", "), pr.ty(&f.ret));
    pr.block_expr(&f.body, 0);
    pr.out.push('\n');
    pr.out
}

struct Printer<'a> {
    p: &'a Program,
    f: &'a Func,
    out: String,
}

impl Printer<'_> {
    fn ty(&self, t: &Type) -> String {
        type_str(t, self.p)
    }

    fn name(&self, l: Local) -> String {
        let base = self.f.locals.get(l.0 as usize).map(|i| self.p.names.get(i.name)).unwrap_or("v");
        let base =
            if base.is_empty() || base == "_" || base.starts_with("test ") || base.contains('.') { "v" } else { base };
        format!("{base}_{}", l.0)
    }

    fn pat(&self, p: &Pat) -> String {
        match p {
            Pat::Local(l) => self.name(*l),
            Pat::Ignore => "_".to_string(),
            Pat::Tuple(ps) => format!("({})", ps.iter().map(|p| self.pat(p)).collect::<Vec<_>>().join(", ")),
        }
    }

    fn indent(&mut self, n: usize) {
        self.out.push_str(&"    ".repeat(n));
    }

    /// Prints a block-valued expression as `{ … }`.
    fn block_expr(&mut self, e: &Expr, depth: usize) {
        self.out.push_str("{\n");
        match &e.kind {
            ExprKind::Block { stmts, result } => {
                for s in stmts {
                    self.stmt(s, depth + 1);
                }
                if !result.ty.is_unit() || !matches!(result.kind, ExprKind::Tuple(_)) {
                    self.indent(depth + 1);
                    let r = self.expr(result, 0, depth + 1);
                    self.out.push_str(&r);
                    self.out.push('\n');
                }
            }
            _ => {
                self.indent(depth + 1);
                let r = self.expr(e, 0, depth + 1);
                self.out.push_str(&r);
                self.out.push('\n');
            }
        }
        self.indent(depth);
        self.out.push('}');
    }

    fn stmt(&mut self, s: &Stmt, depth: usize) {
        self.indent(depth);
        match s {
            Stmt::Let { pat, value } => {
                let mutable = matches!(pat, Pat::Local(l) if self.f.locals[l.0 as usize].mutable && self.assigned(*l));
                let kw = if mutable { "var" } else { "let" };
                let ann = match pat {
                    Pat::Local(_) if matches!(value.ty, Type::Tensor(TensorTy { elem: ref e, .. }) if !e.is_weak()) => {
                        format!(": {}", self.ty(&value.ty))
                    }
                    _ => String::new(),
                };
                let v = self.expr(value, 0, depth);
                let _ = write!(self.out, "{kw} {}{ann} = {v}", self.pat(pat));
            }
            Stmt::Assign { pat, value } => {
                let v = self.expr(value, 0, depth);
                let _ = write!(self.out, "{} = {v}", self.pat(pat));
            }
            Stmt::Expr(e) => {
                let v = self.expr(e, 0, depth);
                self.out.push_str(&v);
            }
            Stmt::BindDims { local, .. } => {
                let _ = write!(self.out, "// shape of {} checked at run time", self.name(*local));
            }
        }
        self.out.push('\n');
    }

    fn assigned(&self, l: Local) -> bool {
        let mut found = false;
        super::walk::walk(&self.f.body, &mut |e| {
            if let ExprKind::Block { stmts, .. } = &e.kind {
                for s in stmts {
                    if let Stmt::Assign { pat, .. } = s {
                        let mut ls = Vec::new();
                        ls.extend(pat.locals());
                        found |= ls.contains(&l);
                    }
                }
            }
        });
        found
    }

    /// `[K = 4]` for the dims of model `id` that no field's type mentions, which a constructor
    /// cannot infer (`Smooth[K = 4](w: …)`); empty when the fields determine every dim.
    fn unfielded_dims(&self, id: crate::types::ModelId, targs: &[crate::types::TypeArg]) -> String {
        let def = self.p.model(id);
        let seen: Vec<crate::types::Sym> = def.fields.iter().flat_map(|f| f.ty.dim_syms()).collect();
        let dims = targs.iter().filter_map(|a| match a {
            crate::types::TypeArg::Dim(d) => Some(d),
            crate::types::TypeArg::Type(_) => None,
        });
        let named: Vec<String> = def
            .dims
            .iter()
            .zip(dims)
            .filter(|(s, _)| !seen.contains(*s))
            .map(|(s, d)| format!("{} = {}", self.p.sym_names[s.0 as usize], dim_str(d, self.p)))
            .collect();
        if named.is_empty() {
            String::new()
        } else {
            format!("[{}]", named.join(", "))
        }
    }

    fn args(&mut self, es: &[Expr], depth: usize) -> Vec<String> {
        es.iter().map(|a| self.expr(a, 0, depth)).collect()
    }

    /// Prints an expression; parenthesised when its operator binds looser than `min`.
    fn expr(&mut self, e: &Expr, min: u8, depth: usize) -> String {
        match &e.kind {
            ExprKind::Lit(Lit::Int(n)) => match &e.ty {
                Type::Tensor(TensorTy { elem: Elem::T(t), .. }) if t.is_float() => format!("{n}.0"),
                _ => n.to_string(),
            },
            ExprKind::Lit(Lit::Float(x)) => {
                let s = format!("{x:?}");
                if x.is_finite() {
                    s
                } else {
                    "0.0".to_string()
                }
            }
            ExprKind::Lit(Lit::Bool(b)) => b.to_string(),
            ExprKind::Lit(Lit::Str(s)) => format!("{s:?}"),
            ExprKind::Local(l) => self.name(*l),
            ExprKind::Const(c) => self.p.names.get(self.p.consts[c.0 as usize].name).to_string(),
            ExprKind::DimValue(d) => {
                let s = dim_str(d, self.p);
                if s.contains(' ') {
                    format!("({s})")
                } else {
                    s
                }
            }
            ExprKind::Prim { prim, args, attrs } => {
                let a = self.args(args, depth);
                if let (Some(sym), Class::Binary | Class::Other) = (prim.symbol(), prim.class()) {
                    let pr = prim.precedence();
                    let l = self.expr(&args[0], pr, depth);
                    let r = self.expr(&args[1], pr + 1, depth);
                    let s = format!("{l} {sym} {r}");
                    return if pr < min { format!("({s})") } else { s };
                }
                let s = match prim {
                    Prim::Neg => format!("-{}", self.expr(&args[0], 8, depth)),
                    Prim::Not => format!("!{}", self.expr(&args[0], 8, depth)),
                    Prim::Cast => format!("{}({})", attrs.dtype.map(|t| t.name()).unwrap_or("f32"), a[0]),
                    Prim::Reshape | Prim::BroadcastTo => {
                        let dims: Vec<String> = attrs.shape.iter().map(|d| dim_str(d, self.p)).collect();
                        format!("{}({}, [{}])", prim.name(), a[0], dims.join(", "))
                    }
                    Prim::Permute | Prim::Transpose => {
                        format!(
                            "permute({}, [{}])",
                            a[0],
                            attrs.perm.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
                        )
                    }
                    Prim::Concat | Prim::Stack => {
                        format!("{}([{}], axis: {})", prim.name(), a.join(", "), attrs.axis.unwrap_or(0))
                    }
                    // `@copies`: on one process a copy is a run of rows and the join a concat.
                    Prim::CopyJoin => format!("concat([{}], axis: {})", a.join(", "), attrs.axis.unwrap_or(0)),
                    Prim::CopySplit => {
                        let ax = attrs.axis.unwrap_or(0);
                        let len = match &e.ty {
                            Type::Tensor(TensorTy { shape, .. }) => match shape.get(ax) {
                                Some(crate::types::ShapeItem::Dim(d)) => dim_str(d, self.p),
                                _ => String::new(),
                            },
                            _ => String::new(),
                        };
                        let c = attrs.perm.first().copied().unwrap_or(0);
                        let mut parts = vec![":".to_string(); ax];
                        parts.push(format!("{c} * ({len}):{c} * ({len}) + {len}"));
                        format!("{}[{}]", self.expr(&args[0], 10, depth), parts.join(", "))
                    }
                    Prim::Einsum => format!("einsum({:?}, {})", attrs.spec.clone().unwrap_or_default(), a.join(", ")),
                    Prim::Zeros
                    | Prim::Ones
                    | Prim::Arange
                    | Prim::Eye
                    | Prim::Normal
                    | Prim::Uniform
                    | Prim::HeNormal
                    | Prim::GlorotUniform => {
                        let mut dims: Vec<String> = attrs.shape.iter().map(|d| dim_str(d, self.p)).collect();
                        if *prim == Prim::Eye {
                            dims.truncate(1);
                        }
                        let mut all = dims;
                        all.extend(a.iter().take(1).map(|s| format!("seed: {s}")));
                        // `uniform(like: x, seed: s)`: the second operand is `stop_gradient(x)`.
                        all.extend(a.iter().skip(1).map(|s| format!("like: {s}")));
                        let call = format!("{}({})", prim.name(), all.join(", "));
                        match attrs.dtype {
                            Some(t) if t != crate::types::ElemTy::F32 && *prim != Prim::Arange => {
                                format!("{}({call})", t.name())
                            }
                            Some(crate::types::ElemTy::F32) if *prim == Prim::Arange => format!("f32({call})"),
                            _ => call,
                        }
                    }
                    Prim::Full => {
                        let dims: Vec<String> = attrs.shape.iter().map(|d| dim_str(d, self.p)).collect();
                        format!("full({}, {})", a[0], dims.join(", "))
                    }
                    Prim::OneHot => format!(
                        "one_hot({}, {})",
                        a[0],
                        attrs.shape.first().map(|d| dim_str(d, self.p)).unwrap_or_default()
                    ),
                    Prim::ScatterAdd => {
                        let k = attrs.axis.unwrap_or(0);
                        let n = attrs.shape.get(k).map(|d| dim_str(d, self.p)).unwrap_or_default();
                        format!("scatter_add({}, {}, {n}, axis: {k})", a[0], a[1])
                    }
                    Prim::ScatterAddAlong => {
                        let k = attrs.axis.unwrap_or(0);
                        let n = attrs.shape.get(k).map(|d| dim_str(d, self.p)).unwrap_or_default();
                        format!("scatter_add_along({}, {}, {n}, axis: {k})", a[0], a[1])
                    }
                    Prim::Argsort => {
                        let k = attrs.axis.unwrap_or(0);
                        let call = format!("argsort({}, axis: {k}, descending: {})", a[0], attrs.descending);
                        // `top_k`'s positions: the first entries of the order, as a slice.
                        match attrs.shape.first() {
                            Some(keep) => {
                                let rank = match &e.ty {
                                    crate::types::Type::Tensor(t) => t.shape.len(),
                                    _ => k + 1,
                                };
                                let parts: Vec<String> = (0..rank)
                                    .map(|i| if i == k { format!("0:{}", dim_str(keep, self.p)) } else { ":".into() })
                                    .collect();
                                format!("{call}[{}]", parts.join(", "))
                            }
                            None => call,
                        }
                    }
                    Prim::Update if a.len() == 3 => {
                        format!("update({}, {}, at: {}, axis: {})", a[0], a[1], a[2], attrs.axis.unwrap_or(0))
                    }
                    Prim::Quantize => format!("quantize({}, i8)", a[0]),
                    Prim::Prune => format!("prune({}, sparsity: {})", a[0], a[1]),
                    Prim::Attention | Prim::AttentionWeights => {
                        let n = a.len();
                        let ops = a[..n.saturating_sub(2)].join(", ");
                        format!("{}({ops}, len: {}, causal: {})", prim.name(), a[n - 2], a[n - 1])
                    }
                    Prim::Conv2d | Prim::Conv2dInputGrad | Prim::Conv2dWeightGrad => {
                        let at = |i: usize| attrs.perm.get(i).copied().unwrap_or(0);
                        let mut all = a.clone();
                        if !attrs.shape.is_empty() {
                            let d: Vec<String> = attrs.shape.iter().map(|d| dim_str(d, self.p)).collect();
                            let key = if *prim == Prim::Conv2dInputGrad { "size" } else { "kernel" };
                            all.push(format!("{key}: [{}]", d.join(", ")));
                        }
                        all.push(format!("stride: {}, padding: {}", at(0), at(1)));
                        format!("{}({})", prim.name(), all.join(", "))
                    }
                    Prim::MaxPool2d | Prim::MaxPool2dGrad | Prim::AvgPool2d | Prim::AvgPool2dGrad => {
                        let at = |i: usize| attrs.perm.get(i).copied().unwrap_or(0);
                        let mut all = a.clone();
                        if !attrs.shape.is_empty() {
                            let d: Vec<String> = attrs.shape.iter().map(|d| dim_str(d, self.p)).collect();
                            all.push(format!("size: [{}]", d.join(", ")));
                        }
                        all.push(format!("kernel: {}, stride: {}", at(0), at(1)));
                        format!("{}({})", prim.name(), all.join(", "))
                    }
                    Prim::Slice => {
                        let mut it = a[1..].iter();
                        // A range whose bounds are not literals is printed as `s:s + K`, its
                        // length `K` from the result's type, which is what the checker accepts.
                        let out_dims: Vec<String> = match &e.ty {
                            Type::Tensor(TensorTy { shape, .. }) => shape
                                .iter()
                                .map(|d| match d {
                                    crate::types::ShapeItem::Dim(d) => dim_str(d, self.p),
                                    _ => String::new(),
                                })
                                .collect(),
                            _ => vec![],
                        };
                        let mut axis = 0;
                        let parts: Vec<String> = attrs
                            .slice
                            .iter()
                            .map(|k| match k {
                                SliceEntry::Index => it.next().cloned().unwrap_or_default(),
                                SliceEntry::Range => {
                                    let s = it.next().cloned().unwrap_or_default();
                                    let e = it.next().cloned().unwrap_or_default();
                                    axis += 1;
                                    let literals = s.parse::<i64>().is_ok() && e.parse::<i64>().is_ok();
                                    match out_dims.get(axis - 1) {
                                        Some(len) if !len.is_empty() && !literals => {
                                            format!("{s}:{s} + {len}")
                                        }
                                        _ => format!("{s}:{e}"),
                                    }
                                }
                                SliceEntry::Full => {
                                    axis += 1;
                                    ":".to_string()
                                }
                            })
                            .collect();
                        format!("{}[{}]", self.expr(&args[0], 10, depth), parts.join(", "))
                    }
                    _ => {
                        // any other primitive: a call, `name(operands, axis: k, …)`
                        let mut all = a.clone();
                        if let Some(ax) = attrs.axis {
                            all.push(if attrs.from_end { format!("axis: -{ax}") } else { format!("axis: {ax}") });
                        }
                        if attrs.keepdims {
                            all.push("keepdims: true".to_string());
                        }
                        if let Some(k) = attrs.precision {
                            all.push(format!("precision: {k}"));
                        }
                        if *prim == Prim::Squeeze && attrs.axis.is_none() {
                            all.truncate(1);
                        }
                        // The sum over a model is written `sum(m)`.
                        let name = if *prim == Prim::ModelSum { "sum" } else { prim.name() };
                        format!("{name}({})", all.join(", "))
                    }
                };
                if matches!(prim, Prim::Neg | Prim::Not) && min > 7 {
                    format!("({s})")
                } else {
                    s
                }
            }
            ExprKind::Call { func, args, .. } => {
                let a = self.args(args, depth);
                format!("{}({})", self.p.names.get(self.p.func(*func).name), a.join(", "))
            }
            ExprKind::Tuple(items) => {
                let a = self.args(items, depth);
                if a.len() == 1 {
                    format!("({},)", a[0])
                } else if matches!(e.ty, Type::List(_)) {
                    format!("[{}]", a.join(", "))
                } else {
                    format!("({})", a.join(", "))
                }
            }
            ExprKind::TupleGet(t, i) => format!("{}.{i}", self.expr(t, 10, depth)),
            ExprKind::Field(m, i) => {
                let name = match &m.ty {
                    Type::Model(id, _) => {
                        self.p.model(*id).fields.get(*i).map(|f| self.p.names.get(f.name).to_string())
                    }
                    _ => None,
                };
                format!("{}.{}", self.expr(m, 10, depth), name.unwrap_or_else(|| i.to_string()))
            }
            ExprKind::ModelBuild { fields } => {
                let a = self.args(fields, depth);
                match &e.ty {
                    Type::Model(id, targs) => {
                        let def = self.p.model(*id);
                        let parts: Vec<String> = def
                            .fields
                            .iter()
                            .zip(a)
                            .map(|(f, v)| format!("{}: {v}", self.p.names.get(f.name)))
                            .collect();
                        // A stack of models: `[Block; L](…)`, its layers counted by its first dim.
                        let name = match (def.stack, targs.first()) {
                            (Some(inner), Some(crate::types::TypeArg::Dim(l))) => {
                                let named = self.unfielded_dims(inner, &targs[1..]);
                                format!(
                                    "[{}{named}; {}]",
                                    self.p.names.get(self.p.model(inner).name),
                                    dim_str(l, self.p)
                                )
                            }
                            _ => format!("{}{}", self.p.names.get(def.name), self.unfielded_dims(*id, targs)),
                        };
                        format!("{name}({})", parts.join(", "))
                    }
                    _ => format!("({})", a.join(", ")),
                }
            }
            ExprKind::ModelInit { seed, .. } => {
                format!("init({}, seed: {})", self.ty(&e.ty), self.expr(seed, 0, depth))
            }
            ExprKind::Block { .. } => {
                let saved = std::mem::take(&mut self.out);
                self.block_expr(e, depth);
                std::mem::replace(&mut self.out, saved)
            }
            ExprKind::If { cond, then, els } => {
                let c = self.expr(cond, 0, depth);
                let saved = std::mem::take(&mut self.out);
                self.block_expr(then, depth);
                self.out.push_str(" else ");
                self.block_expr(els, depth);
                let body = std::mem::replace(&mut self.out, saved);
                format!("if {c} {body}")
            }
            ExprKind::ForRange { var, start, end, body } => {
                let (s, en) = (self.expr(start, 0, depth), self.expr(end, 0, depth));
                let saved = std::mem::take(&mut self.out);
                self.block_expr(body, depth);
                let b = std::mem::replace(&mut self.out, saved);
                format!("for {} in {s}..{en} {b}", self.name(*var))
            }
            ExprKind::While { cond, body } => {
                let c = self.expr(cond, 0, depth);
                let saved = std::mem::take(&mut self.out);
                self.block_expr(body, depth);
                let b = std::mem::replace(&mut self.out, saved);
                format!("while {c} {b}")
            }
            ExprKind::Return(v) => format!("return {}", self.expr(v, 0, depth)),
            ExprKind::FuncRef(f) => self.p.names.get(self.p.func(*f).name).to_string(),
            _ => "/* not expressible in msl source */ ()".to_string(),
        }
    }
}
