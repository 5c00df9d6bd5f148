//! A stable text form of the typed IR (`msl check --emit ir`), used by golden tests.

use super::walk::walk;
use super::{Expr, ExprKind, FnTarget, Func, Lit, Pat, Program, Stmt};
use crate::types::{dim_str, type_str, Type};
use std::fmt::Write as _;

/// Prints every function of the root file (and the functions they reach), then tests.
pub fn dump(p: &Program) -> String {
    let mut out = String::new();
    let mut seen = vec![false; p.funcs.len()];
    let mut todo: Vec<crate::types::FuncId> = p.root_funcs.iter().map(|(_, f)| *f).collect();
    todo.extend(p.tests.iter().map(|t| t.func));
    todo.extend(p.pipelines.iter().flat_map(|pl| [pl.pre, pl.layer, pl.post]));
    let mut order = Vec::new();
    while let Some(f) = todo.pop() {
        if std::mem::replace(&mut seen[f.0 as usize], true) {
            continue;
        }
        order.push(f);
        collect_calls(&p.func(f).body, &mut todo);
    }
    order.sort();
    for f in order {
        dump_func(p, p.func(f), &mut out);
        out.push('\n');
    }
    out
}

fn collect_calls(e: &Expr, out: &mut Vec<crate::types::FuncId>) {
    walk(e, &mut |e| match &e.kind {
        ExprKind::Call { func, .. } | ExprKind::FuncRef(func) => out.push(*func),
        ExprKind::CallValue { target, .. } | ExprKind::Transform { target, .. } => target_funcs(target, out),
        _ => {}
    });
}

fn target_funcs(t: &FnTarget, out: &mut Vec<crate::types::FuncId>) {
    match t {
        FnTarget::Func(f) => out.push(*f),
        FnTarget::Grad { inner, .. } | FnTarget::Vmap { inner, .. } => target_funcs(inner, out),
        FnTarget::Dynamic => {}
    }
}

struct Printer<'a> {
    p: &'a Program,
    func: &'a Func,
    out: &'a mut String,
}

fn dump_func(p: &Program, f: &Func, out: &mut String) {
    let mut g: Vec<String> = f.dims.iter().map(|s| p.sym_names[s.0 as usize].clone()).collect();
    g.extend(f.rests.iter().map(|r| format!("..{}", p.rest_names[r.0 as usize])));
    g.extend(f.models.iter().map(|v| format!("{}: Model", p.tyvar_names[v.0 as usize])));
    let gs = if g.is_empty() { String::new() } else { format!("[{}]", g.join(", ")) };
    let mut pr = Printer { p, func: f, out };
    let params: Vec<String> =
        f.params.iter().map(|l| format!("{}: {}", pr.local(*l), pr.ty(&pr.func.locals[l.0 as usize].ty))).collect();
    let _ = write!(pr.out, "fn {}{gs}({}) -> {} ", p.names.get(f.name), params.join(", "), pr.ty(&f.ret));
    pr.expr(&f.body, 0);
    pr.out.push('\n');
}

impl Printer<'_> {
    fn ty(&self, t: &Type) -> String {
        type_str(t, self.p)
    }

    fn local(&self, l: super::Local) -> String {
        match self.func.locals.get(l.0 as usize) {
            Some(info) => format!("{}%{}", self.p.names.get(info.name), l.0),
            None => format!("?%{}", l.0),
        }
    }

    fn pat(&self, pat: &Pat) -> String {
        match pat {
            Pat::Local(l) => self.local(*l),
            Pat::Ignore => "_".to_string(),
            Pat::Tuple(ps) => format!("({})", ps.iter().map(|p| self.pat(p)).collect::<Vec<_>>().join(", ")),
        }
    }

    fn indent(&mut self, n: usize) {
        for _ in 0..n {
            self.out.push_str("    ");
        }
    }

    fn list(&mut self, es: &[Expr], depth: usize) {
        for (i, a) in es.iter().enumerate() {
            if i > 0 {
                self.out.push_str(", ");
            }
            self.expr(a, depth);
        }
    }

    fn expr(&mut self, e: &Expr, depth: usize) {
        match &e.kind {
            ExprKind::Lit(Lit::Int(n)) => {
                let _ = write!(self.out, "{n}:{}", self.ty(&e.ty));
            }
            ExprKind::Lit(Lit::Float(x)) => {
                let _ = write!(self.out, "{x:?}:{}", self.ty(&e.ty));
            }
            ExprKind::Lit(Lit::Bool(b)) => {
                let _ = write!(self.out, "{b}");
            }
            ExprKind::Lit(Lit::Str(s)) => {
                let _ = write!(self.out, "{s:?}");
            }
            ExprKind::Local(l) => {
                let s = self.local(*l);
                self.out.push_str(&s);
            }
            ExprKind::Const(c) => {
                let _ = write!(self.out, "const {}", self.p.names.get(self.p.consts[c.0 as usize].name));
            }
            ExprKind::DimValue(d) => {
                let _ = write!(self.out, "dim({})", dim_str(d, self.p));
            }
            ExprKind::Prim { prim, args, attrs } => {
                let _ = write!(self.out, "{}(", prim.name());
                self.list(args, depth);
                let mut extra = Vec::new();
                if let Some(a) = attrs.axis {
                    extra.push(if attrs.from_end { format!("axis: -{a}") } else { format!("axis: {a}") });
                }
                if attrs.keepdims {
                    extra.push("keepdims".to_string());
                }
                if let Some(k) = attrs.precision {
                    extra.push(format!("precision: {k}"));
                }
                if !attrs.shape.is_empty() {
                    let dims: Vec<String> = attrs.shape.iter().map(|d| dim_str(d, self.p)).collect();
                    extra.push(format!("shape: [{}]", dims.join(", ")));
                }
                if !attrs.perm.is_empty() {
                    extra.push(format!("perm: {:?}", attrs.perm));
                }
                if !attrs.slice.is_empty() {
                    let entries: Vec<&str> = attrs
                        .slice
                        .iter()
                        .map(|k| match k {
                            super::SliceEntry::Index => "i",
                            super::SliceEntry::Range => "a:b",
                            super::SliceEntry::Full => ":",
                        })
                        .collect();
                    extra.push(format!("slice: [{}]", entries.join(", ")));
                }
                if let Some(s) = &attrs.spec {
                    extra.push(format!("spec: {s:?}"));
                }
                if let Some(t) = attrs.dtype {
                    extra.push(format!("dtype: {}", t.name()));
                }
                if !extra.is_empty() {
                    if !args.is_empty() {
                        self.out.push_str("; ");
                    }
                    self.out.push_str(&extra.join(", "));
                }
                let _ = write!(self.out, "):{}", self.ty(&e.ty));
            }
            ExprKind::Call { func, dims, args, .. } => {
                let ds: Vec<String> = dims.iter().map(|d| dim_str(d, self.p)).collect();
                let _ = write!(self.out, "call {}[{}](", self.p.names.get(self.p.func(*func).name), ds.join(", "));
                self.list(args, depth);
                let _ = write!(self.out, "):{}", self.ty(&e.ty));
            }
            ExprKind::CallValue { callee, target, args } => {
                self.out.push_str("apply(");
                self.expr(callee, depth);
                let _ = write!(self.out, " as {}; ", self.target(target));
                self.list(args, depth);
                let _ = write!(self.out, "):{}", self.ty(&e.ty));
            }
            ExprKind::FuncRef(f) => {
                let _ = write!(self.out, "fnref {}", self.p.names.get(self.p.func(*f).name));
            }
            ExprKind::Closure { id, captures } => {
                let caps: Vec<String> = captures.iter().map(|l| self.local(*l)).collect();
                let inst: Vec<String> = self.p.closures[id.0 as usize]
                    .instances
                    .iter()
                    .map(|(k, f)| format!("({k}) => fn#{}", f.0))
                    .collect();
                let _ = write!(self.out, "closure#{}[{}]{{{}}}", id.0, caps.join(", "), inst.join("; "));
            }
            ExprKind::Transform { target, callee } => {
                let _ = write!(self.out, "{}(", self.target(target));
                self.expr(callee, depth);
                self.out.push(')');
            }
            ExprKind::Jvp { target, callee, primals, tangents } => {
                let _ = write!(self.out, "jvp[{}](", self.target(target));
                self.expr(callee, depth);
                self.out.push_str("; ");
                self.list(primals, depth);
                self.out.push_str("; ");
                self.list(tangents, depth);
                let _ = write!(self.out, "):{}", self.ty(&e.ty));
            }
            ExprKind::Vjp { target, callee, primals } => {
                let _ = write!(self.out, "vjp[{}](", self.target(target));
                self.expr(callee, depth);
                self.out.push_str("; ");
                self.list(primals, depth);
                let _ = write!(self.out, "):{}", self.ty(&e.ty));
            }
            ExprKind::Tuple(es) => {
                self.out.push('(');
                self.list(es, depth);
                if es.len() == 1 {
                    self.out.push(',');
                }
                self.out.push(')');
            }
            ExprKind::TupleGet(a, i) => {
                self.expr(a, depth);
                let _ = write!(self.out, ".{i}");
            }
            ExprKind::Field(a, i) => {
                self.expr(a, depth);
                let name = match &a.ty {
                    Type::Model(m, _) => self.p.model(*m).fields.get(*i).map(|f| self.p.names.get(f.name).to_string()),
                    _ => None,
                };
                let _ = write!(self.out, ".{}", name.unwrap_or_else(|| i.to_string()));
            }
            ExprKind::ModelInit { seed, .. } => {
                let _ = write!(self.out, "init({}; seed: ", self.ty(&e.ty));
                self.expr(seed, depth);
                self.out.push(')');
            }
            ExprKind::ModelBuild { fields } => {
                let _ = write!(self.out, "{}{{", self.ty(&e.ty));
                self.list(fields, depth);
                self.out.push('}');
            }
            ExprKind::Block { stmts, result } => {
                self.out.push_str("{\n");
                for s in stmts {
                    self.indent(depth + 1);
                    match s {
                        Stmt::Let { pat, value } => {
                            let _ = write!(self.out, "let {}: {} = ", self.pat(pat), self.ty(&value.ty));
                            self.expr(value, depth + 1);
                        }
                        Stmt::Assign { pat, value } => {
                            let _ = write!(self.out, "{} = ", self.pat(pat));
                            self.expr(value, depth + 1);
                        }
                        Stmt::BindDims { local, dims, rank, .. } => {
                            let ds: Vec<String> = dims
                                .iter()
                                .map(|(i, s, d)| match s {
                                    Some(s) => format!("{i}: bind {}", self.p.sym_names[s.0 as usize]),
                                    None => format!("{i}: check {}", dim_str(d, self.p)),
                                })
                                .collect();
                            let _ =
                                write!(self.out, "bind_dims {} rank {rank} [{}]", self.local(*local), ds.join(", "));
                        }
                        Stmt::Expr(v) => self.expr(v, depth + 1),
                    }
                    self.out.push('\n');
                }
                self.indent(depth + 1);
                self.expr(result, depth + 1);
                self.out.push('\n');
                self.indent(depth);
                self.out.push('}');
            }
            ExprKind::If { cond, then, els } => {
                self.out.push_str("if ");
                self.expr(cond, depth);
                self.out.push_str(" then ");
                self.expr(then, depth);
                self.out.push_str(" else ");
                self.expr(els, depth);
            }
            ExprKind::ForRange { var, start, end, body } => {
                let _ = write!(self.out, "for {} in ", self.local(*var));
                self.expr(start, depth);
                self.out.push_str("..");
                self.expr(end, depth);
                self.out.push(' ');
                self.expr(body, depth);
            }
            ExprKind::ForBatches { vars, data, size, shuffle, drop_last, body, .. } => {
                let vs: Vec<String> = vars.iter().map(|l| self.local(*l)).collect();
                let _ = write!(self.out, "for ({}) in batches(", vs.join(", "));
                self.list(data, depth);
                self.out.push_str("; size: ");
                self.expr(size, depth);
                if let Some(s) = shuffle {
                    self.out.push_str(", shuffle: ");
                    self.expr(s, depth);
                }
                if !drop_last {
                    self.out.push_str(", drop_last: false");
                }
                self.out.push_str(") ");
                self.expr(body, depth);
            }
            ExprKind::While { cond, body } => {
                self.out.push_str("while ");
                self.expr(cond, depth);
                self.out.push(' ');
                self.expr(body, depth);
            }
            ExprKind::Return(v) => {
                self.out.push_str("return ");
                self.expr(v, depth);
            }
        }
    }

    fn target(&self, t: &FnTarget) -> String {
        match t {
            FnTarget::Func(f) => format!("fn {}#{}", self.p.names.get(self.p.func(*f).name), f.0),
            FnTarget::Grad { inner, wrt, with_value } => {
                format!("{}[wrt {wrt}]({})", if *with_value { "value_and_grad" } else { "grad" }, self.target(inner))
            }
            FnTarget::Vmap { inner, in_axes } => format!("vmap{in_axes:?}({})", self.target(inner)),
            FnTarget::Dynamic => "dynamic".to_string(),
        }
    }
}
