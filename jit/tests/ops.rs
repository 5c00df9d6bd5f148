//! Fused code against the interpreter, op by op and in trees: every elementwise primitive the
//! JIT compiles, on random inputs mixed with NaN, ±inf, ±0, subnormals and overflow-range
//! values, at sizes that exercise the vector loop, its scalar tail and the threaded split.
//! Results must be bit-identical (any NaN equals any NaN: the kernels do not fix payloads).

use jit::{install, Options};
use kernels::Tensor;
use lang::interp::{Ctrl, Interp, Value};
use std::collections::HashMap;
use std::path::Path;

/// Functions of `x`, `y` (same shape) and the bool mask `c`; each is one tree.
const SRC: &str = r#"
fn neg[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { -x }
fn exp_[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { exp(x) }
fn log_[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { log(x) }
fn sqrt_[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { sqrt(x) }
fn rsqrt_[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { rsqrt(x) }
fn tanh_[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { tanh(x) }
fn sigmoid_[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { sigmoid(x) }
fn relu_[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { relu(x) }
fn gelu_[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { gelu(x) }
fn sin_[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { sin(x) }
fn cos_[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { cos(x) }
fn abs_[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { abs(x) }
fn sign_[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { sign(x) }
fn floor_[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { floor(x) }
fn add[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { x + y }
fn sub[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { x - y }
fn mul[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { x * y }
fn div[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { x / y }
fn rem[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { x % y }
fn pow_[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { pow(x, y) }
fn maximum_[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { maximum(x, y) }
fn minimum_[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { minimum(x, y) }
fn eq[N](x: f32[N], y: f32[N], c: bool[N]) -> bool[N] { x == y }
fn ne[N](x: f32[N], y: f32[N], c: bool[N]) -> bool[N] { x != y }
fn lt[N](x: f32[N], y: f32[N], c: bool[N]) -> bool[N] { x < y }
fn le[N](x: f32[N], y: f32[N], c: bool[N]) -> bool[N] { x <= y }
fn gt[N](x: f32[N], y: f32[N], c: bool[N]) -> bool[N] { x > y }
fn ge[N](x: f32[N], y: f32[N], c: bool[N]) -> bool[N] { x >= y }
fn and_[N](x: f32[N], y: f32[N], c: bool[N]) -> bool[N] { c && (x < y) }
fn or_[N](x: f32[N], y: f32[N], c: bool[N]) -> bool[N] { c || (x < y) }
fn not_[N](x: f32[N], y: f32[N], c: bool[N]) -> bool[N] { !c }
fn where_[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { where(c, x, y) }
fn where_mask[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { where(x > y, x * 2.0, -1.0) }
fn where_zero[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { where(x > y, x + y, 0.0) }
fn where_zero_first[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { where(c, 0.0, x * y) }
fn where_neg_zero[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { where(c, x, -0.0) + where(c, -0.0, y) }
fn relu_sum[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { relu(x + y) }
fn cast_bool[N](x: f32[N], y: f32[N], c: bool[N]) -> bool[N] { bool(x) }
fn cast_from_bool[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { f32(c) * x }
fn cast_f64[N](x: f32[N], y: f32[N], c: bool[N]) -> f64[N] { f64(x) * 3.0 }
fn cast_f32[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { f32(f64(x) / 3.0) }
fn mask_mix[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { f32(x < y) + x }
fn gelu_affine[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { gelu(x * y + 0.5) }
fn gelu_written[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] {
    0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
}
fn softplus[N](x: f32[N], y: f32[N], c: bool[N]) -> f32[N] { log(1.0 + exp(x)) - y / 7.0 }
fn add64[N](x: f64[N], y: f64[N], c: bool[N]) -> f64[N] { x * y + x / y - y }
fn exp64[N](x: f64[N], y: f64[N], c: bool[N]) -> f64[N] { exp(x) + tanh(y) + log(x) + sin(x) * cos(y) }
fn misc64[N](x: f64[N], y: f64[N], c: bool[N]) -> f64[N] { sigmoid(x) + relu(y) + gelu(x) + sign(y) + floor(x) + rsqrt(y) }
fn pow64[N](x: f64[N], y: f64[N], c: bool[N]) -> f64[N] { pow(x, y) + x % y + maximum(x, y) - minimum(x, y) }
fn cmp64[N](x: f64[N], y: f64[N], c: bool[N]) -> bool[N] { (x < y) || (x == y) && !c }
fn where64[N](x: f64[N], y: f64[N], c: bool[N]) -> f64[N] { where(c, x, -y) + abs(x) }
fn where_zero64[N](x: f64[N], y: f64[N], c: bool[N]) -> f64[N] { where(x > 0.0, y, 0.0) + where(c, 0.0, relu(x - y)) }
fn bias[R, C](x: f32[R, C], b: f32[C]) -> f32[R, C] { gelu(x * 2.0 + b) }
fn col[R, C](x: f32[R, C], b: f32[R, 1]) -> f32[R, C] { exp(x - b) / 3.0 }
fn outer[R, C](a: f32[R, 1], b: f32[C]) -> f32[R, C] { tanh(a * b + 1.0) }
"#;

/// xorshift64*: fixed seeds, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn value(&mut self) -> f64 {
        const SPECIAL: [f64; 14] = [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            0.0,
            -0.0,
            1.0,
            -1.0,
            88.8,
            -104.0,
            1e-40,
            -1e-41,
            3e38,
            0.5,
            2.0,
        ];
        let r = self.next();
        match r % 8 {
            0 => SPECIAL[(r >> 8) as usize % SPECIAL.len()],
            1 => ((r >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 200.0,
            _ => ((r >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 8.0,
        }
    }
}

fn same(a: &Tensor, b: &Tensor) -> Result<(), String> {
    if a.shape() != b.shape() || a.dtype() != b.dtype() {
        return Err(format!("shape/type {:?} {} vs {:?} {}", a.shape(), a.dtype(), b.shape(), b.dtype()));
    }
    let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
    let bits = |v: f64, t: &Tensor| {
        if t.dtype() == kernels::DType::F32 {
            u64::from((v as f32).to_bits())
        } else {
            v.to_bits()
        }
    };
    for (i, (p, q)) in x.iter().zip(&y).enumerate() {
        if !(p.is_nan() && q.is_nan()) && bits(*p, a) != bits(*q, b) {
            return Err(format!("element {i}: interpreter {p:e}, jit {q:e}"));
        }
    }
    Ok(())
}

fn run(prog: &lang::ir::Program, f: lang::types::FuncId, args: &[Value], jit: bool) -> (Tensor, Option<jit::Report>) {
    let mut it = Interp::new(prog, Box::new(std::io::sink()));
    let report = jit.then(|| install(&mut it, Options { level: 1, min_ops: 1 }));
    let v = match it.call(f, args.to_vec(), HashMap::new(), vec![]) {
        Ok(v) | Err(Ctrl::Return(v)) => v,
        Err(Ctrl::Error(e)) => panic!("run-time error: {}", e.message),
    };
    drop(it);
    let r = report.map(|r| std::mem::take(&mut *r.borrow_mut()));
    (v.tensor().expect("a tensor result").clone(), r)
}

fn tensor(rng: &mut Rng, shape: &[usize], f64_: bool) -> Tensor {
    let n = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.value()).collect();
    let t = Tensor::from_f64(shape.to_vec(), v).unwrap();
    if f64_ {
        t
    } else {
        t.cast(kernels::DType::F32)
    }
}

#[test]
fn every_op_matches_the_interpreter() {
    let c = lang::check::check_source("ops.msl", SRC, Path::new("."));
    assert!(!c.has_errors(), "{:?}", c.diagnostics.iter().map(|d| &d.message).collect::<Vec<_>>());
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut failures = Vec::new();
    let mut fused = 0;
    for (name, fid) in &c.program.root_funcs {
        let f64_ = name.contains("64");
        for &n in &[1usize, 3, 4, 7, 64, 1001, 70_003] {
            let args: Vec<Value> = match name.as_str() {
                "bias" => vec![tensor(&mut rng, &[n.div_ceil(8), 8], false), tensor(&mut rng, &[8], false)],
                "col" => {
                    vec![tensor(&mut rng, &[n.div_ceil(5), 5], false), tensor(&mut rng, &[n.div_ceil(5), 1], false)]
                }
                "outer" => vec![tensor(&mut rng, &[n.div_ceil(9), 1], false), tensor(&mut rng, &[9], false)],
                _ => {
                    let mask: Vec<bool> = (0..n).map(|_| rng.next().is_multiple_of(3)).collect();
                    vec![
                        tensor(&mut rng, &[n], f64_),
                        tensor(&mut rng, &[n], f64_),
                        Tensor::from_bool(vec![n], mask).unwrap(),
                    ]
                }
            }
            .into_iter()
            .map(Value::Tensor)
            .collect();
            let (want, _) = run(&c.program, *fid, &args, false);
            let (got, report) = run(&c.program, *fid, &args, true);
            let report = report.unwrap();
            if report.calls() == 0 || report.fallbacks() > 0 {
                failures.push(format!("{name} (n = {n}): not compiled: {:?}", report.sites));
            }
            fused += report.calls();
            if let Err(e) = same(&want, &got) {
                failures.push(format!("{name} (n = {n}): {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
    assert!(fused > 300, "only {fused} fused calls ran");
}

#[test]
fn one_compile_serves_every_size() {
    let src = "fn f[N](x: f32[N]) -> f32[N] { tanh(x * 0.25 + 1.0) }";
    let c = lang::check::check_source("cache.msl", src, Path::new("."));
    let fid = c.program.root_funcs[0].1;
    let mut rng = Rng(7);
    let mut compiles = 0;
    for n in [5usize, 100, 4096, 50_000] {
        let args = vec![Value::Tensor(tensor(&mut rng, &[n], false))];
        let (_, report) = run(&c.program, fid, &args, true);
        compiles += report.unwrap().sites.iter().map(|s| s.compiles.len()).sum::<usize>();
    }
    // The cache is per thread and outlives each interpreter: only the first size compiles.
    assert_eq!(compiles, 1);
}

#[test]
fn one_tree_under_changing_broadcast_patterns_stays_exact() {
    let c = lang::check::check_source("memo.msl", SRC, Path::new("."));
    let fid = c.program.root_funcs.iter().find(|(n, _)| n == "col").unwrap().1;
    let mut rng = Rng(99);
    let mut it = Interp::new(&c.program, Box::new(std::io::sink()));
    let report = install(&mut it, Options { level: 1, min_ops: 1 });
    // `b: f32[R, 1]` is broadcast along rows of `x: f32[R, C]` unless C = 1.
    for cols in [5usize, 1, 5, 33] {
        let args: Vec<Value> = vec![tensor(&mut rng, &[40, cols], false), tensor(&mut rng, &[40, 1], false)]
            .into_iter()
            .map(Value::Tensor)
            .collect();
        let (want, _) = run(&c.program, fid, &args, false);
        let got = match it.call(fid, args, HashMap::new(), vec![]) {
            Ok(v) | Err(Ctrl::Return(v)) => v.tensor().unwrap().clone(),
            Err(Ctrl::Error(e)) => panic!("{}", e.message),
        };
        same(&want, &got).unwrap_or_else(|e| panic!("cols = {cols}: {e}"));
    }
    let r = report.borrow();
    assert_eq!((r.calls(), r.fallbacks()), (4, 0));
}
