//! Gradient-check harness: builds small msl programs, checks them in-process, and compares the
//! gradients msl computes (`grad`, `value_and_grad`, second order) with central finite
//! differences of the function itself.
#![allow(dead_code)]

use kernels::Tensor;
use lang::interp::{Ctrl, Interp, ModelValue, Value};
use lang::types::FuncId;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::rc::Rc;

// ---------------------------------------------------------------------------------------------
// Random numbers: xorshift64*, fixed seeds.

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x2545_F491_4F6C_DD1D);
        if r.0 == 0 {
            r.0 = 1;
        }
        r.next_u64();
        r
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform integer in [lo, hi).
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo) as u64) as usize
    }

    pub fn coin(&mut self, p: f64) -> bool {
        self.uniform() < p
    }

    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    pub fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.range(0, xs.len())].clone()
    }

    /// A random shape of rank `lo..=hi` with dims in 1..=4 (size-1 dims appear often).
    pub fn shape(&mut self, lo: usize, hi: usize) -> Vec<usize> {
        let r = self.range(lo, hi + 1);
        (0..r).map(|_| self.range(1, 5)).collect()
    }

    /// Two shapes that broadcast together: a random base shape, each operand dropping some
    /// leading dims and turning some dims into 1.
    pub fn broadcast_pair(&mut self) -> (Vec<usize>, Vec<usize>) {
        let base: Vec<usize> = {
            let r = self.range(1, 4);
            (0..r).map(|_| self.range(2, 5)).collect()
        };
        let one = |rng: &mut Rng| {
            let drop = if rng.coin(0.35) { rng.range(0, base.len() + 1) } else { 0 };
            base[drop..].iter().map(|&d| if rng.coin(0.35) { 1 } else { d }).collect::<Vec<_>>()
        };
        (one(self), one(self))
    }
}

/// The broadcast of two shapes (NumPy rules); the shapes are assumed compatible.
pub fn broadcast(a: &[usize], b: &[usize]) -> Vec<usize> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let x = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
            let y = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
            x.max(y)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Arguments.

/// How random float entries are drawn.
#[derive(Clone, Copy, Debug)]
pub enum Dist {
    /// Standard normal.
    Normal,
    /// Uniform in [lo, hi).
    Range(f64, f64),
    /// |x| uniform in [lo, hi), random sign: away from the kink of relu/abs/sign.
    Away(f64, f64),
}

impl Dist {
    fn draw(self, rng: &mut Rng) -> f64 {
        match self {
            Dist::Normal => rng.normal(),
            Dist::Range(lo, hi) => lo + (hi - lo) * rng.uniform(),
            Dist::Away(lo, hi) => {
                let m = lo + (hi - lo) * rng.uniform();
                if rng.coin(0.5) {
                    m
                } else {
                    -m
                }
            }
        }
    }
}

/// A parameter of the function under test.
#[derive(Clone, Debug)]
pub enum Arg {
    F64(Vec<usize>, Dist),
    F32(Vec<usize>, Dist),
    I32(Vec<usize>, i32, i32),
    Bool(Vec<usize>),
    /// Exact i32 values chosen by the test (indices, labels, loop counts).
    I32Values(Vec<usize>, Vec<i32>),
    Model {
        name: String,
        dims: Vec<i64>,
        fields: Vec<Arg>,
    },
    Tuple(Vec<Arg>),
}

pub fn f64t(shape: &[usize]) -> Arg {
    Arg::F64(shape.to_vec(), Dist::Normal)
}
pub fn f64d(shape: &[usize], d: Dist) -> Arg {
    Arg::F64(shape.to_vec(), d)
}
pub fn f32t(shape: &[usize]) -> Arg {
    Arg::F32(shape.to_vec(), Dist::Normal)
}
pub fn i32t(shape: &[usize], lo: i32, hi: i32) -> Arg {
    Arg::I32(shape.to_vec(), lo, hi)
}

pub fn shape_str(s: &[usize]) -> String {
    s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
}

pub fn tensor_ty(elem: &str, s: &[usize]) -> String {
    if s.is_empty() {
        elem.to_string()
    } else {
        format!("{elem}[{}]", shape_str(s))
    }
}

impl Arg {
    pub fn ty(&self) -> String {
        match self {
            Arg::F64(s, _) => tensor_ty("f64", s),
            Arg::F32(s, _) => tensor_ty("f32", s),
            Arg::I32(s, ..) | Arg::I32Values(s, _) => tensor_ty("i32", s),
            Arg::Bool(s) => tensor_ty("bool", s),
            Arg::Model { name, dims, .. } => {
                if dims.is_empty() {
                    name.clone()
                } else {
                    format!("{name}[{}]", dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "))
                }
            }
            Arg::Tuple(ts) => {
                let items: Vec<String> = ts.iter().map(|t| t.ty()).collect();
                if items.len() == 1 {
                    format!("({},)", items[0])
                } else {
                    format!("({})", items.join(", "))
                }
            }
        }
    }

    fn is_float(&self) -> bool {
        match self {
            Arg::F64(..) | Arg::F32(..) => true,
            Arg::Model { .. } => true,
            Arg::Tuple(ts) => ts.iter().any(|t| t.is_float()),
            _ => false,
        }
    }

    fn is_plain_f64(&self) -> bool {
        matches!(self, Arg::F64(..))
    }

    /// Draws the float leaves (depth first, as `Value::leaves` orders them).
    fn draw(&self, rng: &mut Rng) -> Vec<Leaf> {
        let mut out = Vec::new();
        self.draw_into(rng, &mut out);
        out
    }

    fn draw_into(&self, rng: &mut Rng, out: &mut Vec<Leaf>) {
        let n = |s: &[usize]| s.iter().product::<usize>();
        match self {
            Arg::F64(s, d) => {
                out.push(Leaf { shape: s.clone(), kind: LeafKind::F64, data: (0..n(s)).map(|_| d.draw(rng)).collect() })
            }
            Arg::F32(s, d) => out.push(Leaf {
                shape: s.clone(),
                kind: LeafKind::F32,
                data: (0..n(s)).map(|_| d.draw(rng) as f32 as f64).collect(),
            }),
            Arg::I32(s, lo, hi) => out.push(Leaf {
                shape: s.clone(),
                kind: LeafKind::I32,
                data: (0..n(s)).map(|_| (*lo + rng.range(0, (*hi - *lo) as usize) as i32) as f64).collect(),
            }),
            Arg::I32Values(s, v) => {
                out.push(Leaf { shape: s.clone(), kind: LeafKind::I32, data: v.iter().map(|&x| x as f64).collect() })
            }
            Arg::Bool(s) => out.push(Leaf {
                shape: s.clone(),
                kind: LeafKind::Bool,
                data: (0..n(s)).map(|_| if rng.coin(0.5) { 1.0 } else { 0.0 }).collect(),
            }),
            Arg::Model { fields, .. } => fields.iter().for_each(|f| f.draw_into(rng, out)),
            Arg::Tuple(ts) => ts.iter().for_each(|f| f.draw_into(rng, out)),
        }
    }

    /// Builds the value from leaves (consumed in order).
    fn build(&self, prog: &lang::ir::Program, leaves: &mut std::slice::Iter<Leaf>) -> Result<Value, String> {
        Ok(match self {
            Arg::Model { name, dims, fields } => {
                let id = model_id(prog, name).ok_or_else(|| format!("no model `{name}`"))?;
                let fields = fields.iter().map(|f| f.build(prog, leaves)).collect::<Result<Vec<_>, _>>()?;
                Value::Model(Rc::new(ModelValue { model: id, dims: dims.clone(), fields }))
            }
            Arg::Tuple(ts) => {
                Value::Tuple(Rc::new(ts.iter().map(|f| f.build(prog, leaves)).collect::<Result<Vec<_>, _>>()?))
            }
            _ => Value::Tensor(leaves.next().ok_or("missing leaf")?.tensor()),
        })
    }
}

fn model_id(prog: &lang::ir::Program, name: &str) -> Option<lang::types::ModelId> {
    (0..prog.models.len())
        .map(|i| lang::types::ModelId(i as u32))
        .find(|&id| prog.names.get(prog.model(id).name) == name)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum LeafKind {
    F64,
    F32,
    I32,
    Bool,
}

/// One tensor of an argument, its entries held as f64.
#[derive(Clone, Debug)]
struct Leaf {
    shape: Vec<usize>,
    kind: LeafKind,
    data: Vec<f64>,
}

impl Leaf {
    fn tensor(&self) -> Tensor {
        let s = self.shape.clone();
        match self.kind {
            LeafKind::F64 => Tensor::from_f64(s, self.data.clone()),
            LeafKind::F32 => Tensor::from_f32(s, self.data.iter().map(|&x| x as f32).collect()),
            LeafKind::I32 => Tensor::from_i32(s, self.data.iter().map(|&x| x as i32).collect()),
            LeafKind::Bool => Tensor::from_bool(s, self.data.iter().map(|&x| x != 0.0).collect()),
        }
        .expect("leaf tensor")
    }

    fn is_float(&self) -> bool {
        matches!(self.kind, LeafKind::F64 | LeafKind::F32)
    }
}

// ---------------------------------------------------------------------------------------------
// Cases.

/// Finite-difference step and tolerances: `|a - n| <= atol * max(1, |f|) + rtol * max(|a|, |n|)`.
/// The absolute part scales with `|f|` because the round-off of a central difference is about
/// `eps * |f| / h`.
#[derive(Clone, Copy, Debug)]
pub struct Tol {
    pub h: f64,
    pub rtol: f64,
    pub atol: f64,
}

/// f64 everywhere: h = 1e-6, round-off ≈ 1e-10·|f|, truncation ≈ 1e-13·f‴.
pub const F64: Tol = Tol { h: 1e-6, rtol: 1e-6, atol: 1e-8 };
/// An f32 computation somewhere: f32 round-off (6e-8·|f|) divided by 2h dominates, so h is
/// larger (2⁻⁷) and the truncation error h²·f‴/6 ≈ 1e-5·f‴ sets the tolerance.
pub const F32: Tol = Tol { h: 0.0078125, rtol: 2e-3, atol: 5e-4 };

#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    pub prelude: String,
    pub params: Vec<(String, Arg)>,
    pub ret: String,
    pub body: String,
    pub wrt: Vec<String>,
    pub tol: Tol,
    pub second_order: bool,
    pub value_and_grad: bool,
    pub seed: u64,
    /// A known limitation: a program rejected with only E0403 diagnostics is accepted.
    pub allow_e0403: bool,
}

impl Case {
    pub fn new(name: impl Into<String>, body: impl Into<String>) -> Case {
        Case {
            name: name.into(),
            prelude: String::new(),
            params: Vec::new(),
            ret: "f64".into(),
            body: body.into(),
            wrt: Vec::new(),
            tol: F64,
            second_order: true,
            value_and_grad: true,
            seed: 1,
            allow_e0403: false,
        }
    }
    pub fn param(mut self, name: &str, a: Arg) -> Case {
        self.params.push((name.into(), a));
        self
    }
    /// A fixed random weight `w: f64[shape]` (not differentiated), so sums are not symmetric.
    pub fn weight(self, shape: &[usize]) -> Case {
        self.param("w", f64t(shape))
    }
    pub fn wrt(mut self, names: &[&str]) -> Case {
        self.wrt = names.iter().map(|s| s.to_string()).collect();
        self
    }
    pub fn prelude(mut self, p: &str) -> Case {
        self.prelude.push_str(p);
        self.prelude.push('\n');
        self
    }
    pub fn ret(mut self, r: &str) -> Case {
        self.ret = r.into();
        self
    }
    pub fn tol(mut self, t: Tol) -> Case {
        self.tol = t;
        self
    }
    pub fn first_order_only(mut self) -> Case {
        self.second_order = false;
        self
    }
    pub fn no_value_and_grad(mut self) -> Case {
        self.value_and_grad = false;
        self
    }
    pub fn allow_e0403(mut self) -> Case {
        self.allow_e0403 = true;
        self
    }
    pub fn seed(mut self, s: u64) -> Case {
        self.seed = s;
        self
    }

    fn wrt_names(&self) -> Vec<String> {
        if !self.wrt.is_empty() {
            return self.wrt.clone();
        }
        self.params.iter().filter(|(n, a)| n != "w" && a.is_float()).map(|(n, _)| n.clone()).collect()
    }

    fn param_list(&self) -> String {
        self.params.iter().map(|(n, a)| format!("{n}: {}", a.ty())).collect::<Vec<_>>().join(", ")
    }

    fn arg_list(&self) -> String {
        self.params.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>().join(", ")
    }

    fn arg_of(&self, name: &str) -> &Arg {
        &self.params.iter().find(|(n, _)| n == name).expect("wrt names a parameter").1
    }

    /// The first-order program: `f`, `d_X` (the gradient wrt X) and `vg_X` (value_and_grad).
    pub fn program(&self) -> String {
        let (ps, args) = (self.param_list(), self.arg_list());
        let mut s = format!("{}\nfn f({ps}) -> {} {{\n    {}\n}}\n", self.prelude, self.ret, self.body.trim());
        for x in self.wrt_names() {
            let t = self.arg_of(&x).ty();
            let _ = writeln!(s, "fn d_{x}({ps}) -> {t} {{ grad(f, wrt: {x})({args}) }}");
            if self.value_and_grad {
                let _ = writeln!(s, "fn vg_{x}({ps}) -> ({}, {t}) {{ value_and_grad(f, wrt: {x})({args}) }}", self.ret);
            }
        }
        s
    }

    /// The second-order program: `s2_X = sum(v * grad(f, wrt: X))` and its gradient `d2_X`.
    fn program2(&self, xs: &[String]) -> String {
        let (ps, args) = (self.param_list(), self.arg_list());
        let mut s = format!("{}\nfn f({ps}) -> {} {{\n    {}\n}}\n", self.prelude, self.ret, self.body.trim());
        for x in xs {
            let t = self.arg_of(x).ty();
            let _ = writeln!(s, "fn s2_{x}({ps}, v_: {t}) -> {} {{ sum(v_ * grad(f, wrt: {x})({args})) }}", self.ret);
            let _ = writeln!(s, "fn d2_{x}({ps}, v_: {t}) -> {t} {{ grad(s2_{x}, wrt: {x})({args}, v_) }}");
        }
        s
    }
}

// ---------------------------------------------------------------------------------------------
// Running.

/// Type-checks a program; `Err` carries the rendered diagnostics.
pub fn check(text: &str) -> Result<lang::check::Checked, String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let c = catch_unwind(AssertUnwindSafe(|| lang::check::check_source("gradcheck.msl", text, dir)))
        .map_err(|p| format!("the checker panicked: {}", panic_msg(&p)))?;
    if c.has_errors() {
        return Err(lang::diag::render_short(&c.diagnostics, &c.sources));
    }
    Ok(c)
}

pub fn panic_msg(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "?".into()
    }
}

pub fn func(prog: &lang::ir::Program, name: &str) -> Result<FuncId, String> {
    prog.root_funcs.iter().find(|(n, _)| n == name).map(|(_, f)| *f).ok_or_else(|| format!("no function `{name}`"))
}

/// Calls a root function; errors (and panics) become messages.
pub fn call(prog: &lang::ir::Program, name: &str, args: Vec<Value>) -> Result<Value, String> {
    let f = func(prog, name)?;
    let r = catch_unwind(AssertUnwindSafe(|| {
        let mut it = Interp::new(prog, Box::new(std::io::sink()));
        it.call(f, args, HashMap::new(), vec![])
    }));
    match r {
        Ok(Ok(v)) | Ok(Err(Ctrl::Return(v))) => Ok(v),
        Ok(Err(Ctrl::Error(e))) => Err(format!("run-time error in `{name}`: {:?} {}", e.code, e.message)),
        Err(p) => Err(format!("the interpreter panicked in `{name}`: {}", panic_msg(&p))),
    }
}

pub fn scalar(v: &Value) -> Result<f64, String> {
    v.tensor().and_then(|t| t.scalar_value_f64()).ok_or_else(|| "result is not a scalar".to_string())
}

/// The tensor leaves of a value, as f64 vectors with shapes.
fn value_leaves(v: &Value) -> Vec<(Vec<usize>, Vec<f64>)> {
    let mut ls = Vec::new();
    v.leaves(&mut ls);
    ls.iter().map(|t| (t.shape().to_vec(), t.to_f64_vec())).collect()
}

fn fmt_vec(v: &[f64]) -> String {
    let items: Vec<String> = v.iter().map(|x| format!("{x:.9}")).collect();
    format!("[{}]", items.join(", "))
}

/// Per-case inputs: one list of leaves per parameter.
struct Inputs {
    leaves: Vec<Vec<Leaf>>,
}

impl Inputs {
    fn values(&self, c: &Case, prog: &lang::ir::Program) -> Result<Vec<Value>, String> {
        c.params.iter().zip(&self.leaves).map(|((_, a), l)| a.build(prog, &mut l.iter())).collect()
    }
    fn describe(&self, c: &Case) -> String {
        let mut s = String::new();
        for ((n, _), ls) in c.params.iter().zip(&self.leaves) {
            for (j, l) in ls.iter().enumerate() {
                let _ = writeln!(
                    s,
                    "  {n}{} {:?} = {}",
                    if ls.len() > 1 { format!(".leaf{j}") } else { String::new() },
                    l.shape,
                    fmt_vec(&l.data)
                );
            }
        }
        s
    }
}

/// Central finite differences of `fname` wrt every float entry of parameter `pi`.
fn finite_diff(
    c: &Case,
    prog: &lang::ir::Program,
    fname: &str,
    inputs: &Inputs,
    extra: &[Value],
    pi: usize,
) -> Result<Vec<Vec<f64>>, String> {
    let mut out = Vec::new();
    for li in 0..inputs.leaves[pi].len() {
        let leaf = &inputs.leaves[pi][li];
        let mut g = vec![0.0; leaf.data.len()];
        if !leaf.is_float() {
            out.push(g);
            continue;
        }
        for (e, ge) in g.iter_mut().enumerate() {
            let x0 = leaf.data[e];
            let mut vals = [0.0; 2];
            let mut xs = [0.0; 2];
            for (k, sgn) in [1.0, -1.0].iter().enumerate() {
                let mut xi = x0 + sgn * c.tol.h;
                if leaf.kind == LeafKind::F32 {
                    xi = xi as f32 as f64;
                }
                xs[k] = xi;
                let mut inp = Inputs { leaves: inputs.leaves.clone() };
                inp.leaves[pi][li].data[e] = xi;
                let mut args = inp.values(c, prog)?;
                args.extend(extra.iter().cloned());
                vals[k] = scalar(&call(prog, fname, args)?)?;
            }
            *ge = (vals[0] - vals[1]) / (xs[0] - xs[1]);
        }
        out.push(g);
    }
    Ok(out)
}

/// Compares analytic against numeric leaves; `Err` describes the worst mismatch.
fn compare(
    tol: &Tol,
    fval: f64,
    analytic: &[(Vec<usize>, Vec<f64>)],
    numeric: &[Vec<f64>],
    shapes: &[Vec<usize>],
) -> Result<(), String> {
    if analytic.len() != numeric.len() {
        return Err(format!("gradient has {} tensors, expected {}", analytic.len(), numeric.len()));
    }
    let mut msg = String::new();
    for (j, ((ash, a), n)) in analytic.iter().zip(numeric).enumerate() {
        if ash != &shapes[j] || a.len() != n.len() {
            let _ = writeln!(msg, "  leaf {j}: gradient shape {ash:?}, expected {:?}", shapes[j]);
            continue;
        }
        let mut bad = None;
        for i in 0..a.len() {
            let err = (a[i] - n[i]).abs();
            let lim = tol.atol * fval.abs().max(1.0) + tol.rtol * a[i].abs().max(n[i].abs());
            // NaN counts as a mismatch.
            if err.is_nan() || err > lim {
                bad = Some(i);
                break;
            }
        }
        if let Some(i) = bad {
            let _ = writeln!(
                msg,
                "  leaf {j} shape {ash:?}: first mismatch at flat index {i}: analytic {} vs numeric {}\n    analytic: {}\n    numeric:  {}",
                a[i],
                n[i],
                fmt_vec(a),
                fmt_vec(n)
            );
        }
    }
    if msg.is_empty() {
        Ok(())
    } else {
        Err(msg)
    }
}

/// Counts of what a suite checked.
#[derive(Default, Debug)]
pub struct Stats {
    pub cases: usize,
    pub first: usize,
    pub second: usize,
    pub failures: Vec<String>,
    pub limitations: Vec<String>,
}

impl Stats {
    pub fn run(&mut self, c: &Case) {
        self.cases += 1;
        if let Err(e) = self.run_inner(c) {
            self.failures.push(format!("=== case `{}` (seed {}) ===\n{e}", c.name, c.seed));
        }
    }

    fn run_inner(&mut self, c: &Case) -> Result<(), String> {
        let text = c.program();
        let ck = match check(&text) {
            Ok(ck) => ck,
            Err(d) if c.allow_e0403 && d.lines().all(|l| l.contains("[E0403]")) && !d.is_empty() => {
                self.limitations.push(format!("{}: {}", c.name, d.trim()));
                return Ok(());
            }
            Err(d) => return Err(format!("program does not check:\n{d}\nprogram:\n{text}")),
        };
        let prog = &ck.program;
        let mut rng = Rng::new(c.seed);
        let inputs = Inputs { leaves: c.params.iter().map(|(_, a)| a.draw(&mut rng)).collect() };
        let ctx = |e: String| format!("{e}\nprogram:\n{text}\ninputs:\n{}", inputs.describe(c));
        let args = inputs.values(c, prog).map_err(ctx)?;
        let fval = scalar(&call(prog, "f", args.clone()).map_err(ctx)?).map_err(ctx)?;
        let mut errs = String::new();
        let wrt = c.wrt_names();
        for x in &wrt {
            let pi = c.params.iter().position(|(n, _)| n == x).unwrap();
            let shapes: Vec<Vec<usize>> = inputs.leaves[pi].iter().map(|l| l.shape.clone()).collect();
            let analytic = match call(prog, &format!("d_{x}"), args.clone()) {
                Ok(v) => value_leaves(&v),
                Err(e) => {
                    let _ = writeln!(errs, "grad wrt {x}: {e}");
                    continue;
                }
            };
            let numeric = finite_diff(c, prog, "f", &inputs, &[], pi).map_err(ctx)?;
            self.first += 1;
            if let Err(m) = compare(&c.tol, fval, &analytic, &numeric, &shapes) {
                let _ = writeln!(errs, "grad wrt {x} differs from finite differences:\n{m}");
            }
            if c.value_and_grad {
                match call(prog, &format!("vg_{x}"), args.clone()) {
                    Ok(Value::Tuple(t)) if t.len() == 2 => {
                        let v = scalar(&t[0])?;
                        if (v - fval).abs() > 1e-12 * fval.abs().max(1.0) {
                            let _ = writeln!(errs, "value_and_grad wrt {x}: value {v} but f gives {fval}");
                        }
                        if let Err(m) = compare(
                            &Tol { h: 0.0, rtol: 1e-12, atol: 1e-14 },
                            0.0,
                            &value_leaves(&t[1]),
                            &analytic.iter().map(|l| l.1.clone()).collect::<Vec<_>>(),
                            &shapes,
                        ) {
                            let _ = writeln!(errs, "value_and_grad wrt {x}: gradient differs from grad:\n{m}");
                        }
                    }
                    Ok(_) => {
                        let _ = writeln!(errs, "value_and_grad wrt {x} did not return a pair");
                    }
                    Err(e) => {
                        let _ = writeln!(errs, "value_and_grad wrt {x}: {e}");
                    }
                }
            }
        }
        if !errs.is_empty() {
            return Err(ctx(errs));
        }
        if c.second_order {
            let xs: Vec<String> = wrt.iter().filter(|x| c.arg_of(x).is_plain_f64()).cloned().collect();
            if !xs.is_empty() {
                self.second_order(c, &xs, &inputs, &mut rng)?;
            }
        }
        Ok(())
    }

    /// d/dx ⟨v, ∇ₓf⟩ by msl (grad of a grad) against finite differences of ⟨v, ∇ₓf⟩.
    fn second_order(&mut self, c: &Case, xs: &[String], inputs: &Inputs, rng: &mut Rng) -> Result<(), String> {
        let text = c.program2(xs);
        let ck = check(&text).map_err(|d| format!("second-order program does not check:\n{d}\nprogram:\n{text}"))?;
        let prog = &ck.program;
        let ctx = |e: String| format!("second order: {e}\nprogram:\n{text}\ninputs:\n{}", inputs.describe(c));
        let args = inputs.values(c, prog).map_err(ctx)?;
        let mut errs = String::new();
        for x in xs {
            let pi = c.params.iter().position(|(n, _)| n == x).unwrap();
            let vleaf = c.arg_of(x).draw(rng);
            let v = Value::Tensor(vleaf[0].tensor());
            let mut a2 = args.clone();
            a2.push(v.clone());
            let sval = scalar(&call(prog, &format!("s2_{x}"), a2.clone()).map_err(ctx)?).map_err(ctx)?;
            let shapes = vec![inputs.leaves[pi][0].shape.clone()];
            let analytic = match call(prog, &format!("d2_{x}"), a2) {
                Ok(v) => value_leaves(&v),
                Err(e) => {
                    let _ = writeln!(errs, "grad of grad wrt {x}: {e}\n  v_ = {}", fmt_vec(&vleaf[0].data));
                    continue;
                }
            };
            let numeric = finite_diff(c, prog, &format!("s2_{x}"), inputs, &[v], pi).map_err(ctx)?;
            self.second += 1;
            if let Err(m) = compare(&c.tol, sval, &analytic, &numeric, &shapes) {
                let _ = writeln!(
                    errs,
                    "grad of ⟨v, grad wrt {x}⟩ differs from finite differences:\n{m}  v_ = {}",
                    fmt_vec(&vleaf[0].data)
                );
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(ctx(errs))
        }
    }

    /// Panics with every failure, after printing the counts.
    pub fn finish(self, suite: &str) {
        eprintln!(
            "{suite}: {} cases, {} first-order and {} second-order gradient checks, {} failures",
            self.cases,
            self.first,
            self.second,
            self.failures.len()
        );
        for l in &self.limitations {
            eprintln!("  known limitation (clean E0403): {l}");
        }
        if !self.failures.is_empty() {
            panic!("{suite}: {} failing cases\n\n{}", self.failures.len(), self.failures.join("\n"));
        }
    }
}

/// Runs all cases and panics with every failure.
pub fn run_all(suite: &str, cases: impl IntoIterator<Item = Case>) {
    let mut st = Stats::default();
    for c in cases {
        st.run(&c);
    }
    st.finish(suite);
}
