//! Random well-typed msl programs for differential testing of the engines
//! (`jit/tests/differential.rs` in CI, `fuzz/fuzz_targets/differential.rs` under libFuzzer):
//! scalar loops over `i32`, `f32`, `f64` and `bool` variables with inlined helper functions and
//! every scalar operation the JIT compiles (literal and variable divisors, `pow`, casts, `if`,
//! `where`), then elementwise tensor expressions over those scalars, sometimes large enough for
//! the threaded split of fused loops, and in half the programs a loop of model arithmetic
//! (flat models: `+ - *`, scaling by those scalars, pointwise and per-tensor `map`). A program is
//! a function of a seed (or of a fuzzer's bytes, which take the first decisions).

use lang::spec::{run_block_with, Outcome};
use std::path::Path;

/// A random program from a seed.
pub fn program(seed: u64) -> String {
    Gen::new(Rng::seeded(seed)).program()
}

/// A random program whose first decisions are these bytes.
pub fn program_from_bytes(bytes: &[u8]) -> String {
    Gen::new(Rng::from_bytes(bytes)).program()
}

impl Gen {
    fn new(r: Rng) -> Gen {
        Gen { r, ints: vec![], f32s: vec![], f64s: vec![], bools: vec![], tensor: false }
    }
}

/// Whether every engine prints what the interpreter prints; the message names the first that
/// differs. `Ok` carries the interpreter's outcome and the number of native loop runs.
pub fn compare(src: &str) -> Result<(Outcome, u64), String> {
    let (eager, outs, native) = engines(src);
    for (level, o) in outs.iter().enumerate() {
        if o.text() != eager.text() {
            return Err(format!(
                "jit -O{level} differs from the interpreter on\n{src}\ninterpreter:\n{}\njit:\n{}",
                eager.text(),
                o.text()
            ));
        }
    }
    Ok((eager, native))
}

/// xorshift64*: a small deterministic generator (no dependency).
pub struct Rng {
    /// Decisions taken from these bytes first (a fuzzer's input), then from the generator.
    bytes: Vec<u8>,
    pos: usize,
    state: u64,
}

impl Rng {
    pub fn seeded(seed: u64) -> Rng {
        Rng { bytes: Vec::new(), pos: 0, state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1 }
    }

    pub fn from_bytes(bytes: &[u8]) -> Rng {
        let seed =
            bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
        Rng { bytes: bytes.to_vec(), pos: 0, state: seed | 1 }
    }

    fn next(&mut self) -> u64 {
        if let Some(&b) = self.bytes.get(self.pos) {
            self.pos += 1;
            return u64::from(b);
        }
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len() as u64) as usize]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Ty {
    Int,
    F32,
    F64,
    Bool,
}

struct Gen {
    r: Rng,
    /// Variables in scope of each type.
    ints: Vec<String>,
    f32s: Vec<String>,
    f64s: Vec<String>,
    bools: Vec<String>,
    /// Generating a tensor expression: `f32` leaves may be the tensors `t` and `u`, and `if`
    /// (scalar conditions, scalar branches) and scalar helpers are replaced by `where`.
    tensor: bool,
}

impl Gen {
    fn vars(&self, t: Ty) -> &Vec<String> {
        match t {
            Ty::Int => &self.ints,
            Ty::F32 => &self.f32s,
            Ty::F64 => &self.f64s,
            Ty::Bool => &self.bools,
        }
    }

    fn lit(&mut self, t: Ty) -> String {
        match t {
            Ty::Int => format!("{}", self.r.below(41) as i64 - 20),
            Ty::Bool => self.r.pick(&["true", "false"]).to_string(),
            _ => {
                let v = (self.r.below(4001) as f64 - 2000.0) / 64.0;
                format!("{v:?}")
            }
        }
    }

    fn expr(&mut self, t: Ty, depth: u32) -> String {
        if self.tensor && t != Ty::F32 {
            // Everything but the f32 spine of a tensor expression is scalar.
            self.tensor = false;
            let e = self.expr(t, depth);
            self.tensor = true;
            return e;
        }
        if depth == 0 || self.r.chance(25) {
            let mut vs = self.vars(t).clone();
            if self.tensor {
                vs.extend(["t".to_string(), "u".to_string()]);
            }
            return if !vs.is_empty() && self.r.chance(70) {
                vs[self.r.below(vs.len() as u64) as usize].clone()
            } else {
                self.lit(t)
            };
        }
        let d = depth - 1;
        match t {
            Ty::Int => match self.r.below(9) {
                0..=2 => {
                    let op = self.r.pick(&["+", "-", "*"]);
                    format!("({} {op} {})", self.expr(t, d), self.expr(t, d))
                }
                3 => {
                    let op = self.r.pick(&["/", "%"]);
                    // Mostly a divisor that cannot be zero, or a literal one (compiled as a
                    // multiplication); sometimes one that may be zero.
                    if self.r.chance(30) {
                        let k = [2, 3, 7, 10, 13, 64, 1000, 65537, 2147483647][self.r.below(9) as usize];
                        format!("({} {op} {k})", self.expr(t, d))
                    } else if self.r.chance(90) {
                        format!("({} {op} (abs({}) + 1))", self.expr(t, d), self.expr(t, d))
                    } else {
                        format!("({} {op} {})", self.expr(t, d), self.expr(t, d))
                    }
                }
                4 if self.r.chance(30) => format!("pow({}, minimum(abs({}), 9))", self.expr(t, d), self.expr(t, d)),
                4 => format!("{}({})", self.r.pick(&["abs", "-", "sign"]), self.expr(t, d)),
                5 => format!("{}({}, {})", self.r.pick(&["maximum", "minimum"]), self.expr(t, d), self.expr(t, d)),
                6 => {
                    let from = if self.r.chance(50) { Ty::F32 } else { Ty::F64 };
                    format!("i32({})", self.expr(from, d))
                }
                7 => format!("where({}, {}, {})", self.expr(Ty::Bool, d), self.expr(t, d), self.expr(t, d)),
                _ => format!("helper_i({}, {})", self.expr(Ty::Int, d), self.expr(Ty::F32, d)),
            },
            Ty::F32 | Ty::F64 => {
                let name = if t == Ty::F32 { "f32" } else { "f64" };
                match self.r.below(9) {
                    0..=2 => {
                        let op = self.r.pick(&["+", "-", "*", "/"]);
                        format!("({} {op} {})", self.expr(t, d), self.expr(t, d))
                    }
                    3 => {
                        let f = self
                            .r
                            .pick(&["exp", "tanh", "sigmoid", "sin", "cos", "abs", "relu", "gelu", "erf", "floor"]);
                        format!("{f}({})", self.expr(t, d))
                    }
                    4 => format!("{}(abs({}))", self.r.pick(&["sqrt", "log"]), self.expr(t, d)),
                    5 => format!("{}({}, {})", self.r.pick(&["maximum", "minimum"]), self.expr(t, d), self.expr(t, d)),
                    6 => {
                        let from =
                            *[Ty::Int, Ty::F32, Ty::F64, Ty::Bool].get(self.r.below(4) as usize).unwrap_or(&Ty::Int);
                        format!("{name}({})", self.expr(from, d))
                    }
                    7 | 8 if self.tensor => {
                        format!("where({}, {}, {})", self.expr(Ty::Bool, d), self.expr(t, d), self.expr(t, d))
                    }
                    7 => format!(
                        "(if {} {{ {} }} else {{ {} }})",
                        self.expr(Ty::Bool, d),
                        self.expr(t, d),
                        self.expr(t, d)
                    ),
                    _ if t == Ty::F32 => format!("helper_f({}, {})", self.expr(Ty::Int, d), self.expr(Ty::F32, d)),
                    _ => format!("(-{})", self.expr(t, d)),
                }
            }
            Ty::Bool => match self.r.below(4) {
                0 | 1 => {
                    let a = *[Ty::Int, Ty::F32, Ty::F64].get(self.r.below(3) as usize).unwrap_or(&Ty::Int);
                    let op = self.r.pick(&["<", "<=", ">", ">=", "==", "!="]);
                    format!("({} {op} {})", self.expr(a, d), self.expr(a, d))
                }
                2 => {
                    let op = self.r.pick(&["&&", "||"]);
                    format!("({} {op} {})", self.expr(t, d), self.expr(t, d))
                }
                _ => format!("!{}", self.expr(t, d)),
            },
        }
    }

    /// An expression of model type over the models `p` and `q` and the scalars in scope.
    fn model_expr(&mut self, depth: u32) -> String {
        if depth == 0 || self.r.chance(20) {
            return self.r.pick(&["p", "q"]).to_string();
        }
        let d = depth - 1;
        match self.r.below(6) {
            0 | 1 => {
                let op = self.r.pick(&["+", "-", "*"]);
                format!("({} {op} {})", self.model_expr(d), self.model_expr(d))
            }
            2 => {
                // A bounded scalar, so that a few steps stay finite.
                let k = self.expr(Ty::F32, 2);
                format!("(tanh({k}) * {})", self.model_expr(d))
            }
            3 | 4 => {
                let x = self.f32s.first().cloned().unwrap_or_else(|| "0.5".into());
                let bodies = [
                    "v * v".to_string(),
                    "tanh(v)".to_string(),
                    "exp(v * 0.1)".to_string(),
                    format!("maximum(v, {x} * 0.1)"),
                    format!("v * tanh({x}) + 0.5"),
                    "sigmoid(v) - 0.5".to_string(),
                ];
                let body = bodies[self.r.below(bodies.len() as u64) as usize].clone();
                format!("map(|v| {body}, {})", self.model_expr(d))
            }
            _ => format!("map(|v| v - mean(v), {})", self.model_expr(d)),
        }
    }

    fn program(&mut self) -> String {
        let mut s = String::new();
        let models = self.r.chance(50);
        if models {
            s.push_str("model P { a: f32[3], b: f32[2, 4] }\n\n");
        }
        // Two helpers that the loops call (inlined by the JIT), with early returns.
        s.push_str("fn helper_i(a: i32, x: f32) -> i32 {\n    if a > 7 { return a % 5 }\n    var k = a\n");
        s.push_str("    for j in 0..3 { k = k * 3 + j }\n    if x < 0.0 { return -k }\n    k\n}\n\n");
        s.push_str("fn helper_f(a: i32, x: f32) -> f32 {\n    if a < -3 { return x * 0.5 }\n    x + f32(a)\n}\n\n");
        s.push_str("fn main() {\n");
        let decls = [("i", Ty::Int, "i32"), ("x", Ty::F32, "f32"), ("d", Ty::F64, "f64"), ("b", Ty::Bool, "bool")];
        for (p, t, tn) in decls {
            for k in 0..2 {
                let name = format!("{p}{k}");
                let init = self.lit(t);
                s.push_str(&format!("    var {name}: {tn} = {init}\n"));
                match t {
                    Ty::Int => self.ints.push(name),
                    Ty::F32 => self.f32s.push(name),
                    Ty::F64 => self.f64s.push(name),
                    Ty::Bool => self.bools.push(name),
                }
            }
        }
        let n = 1 + self.r.below(40);
        let looped = if self.r.chance(30) {
            s.push_str(&format!("    var w = 0\n    while w < {n} {{\n        w = w + 1\n"));
            "w"
        } else {
            s.push_str(&format!("    for step in 0..{n} {{\n"));
            "step"
        };
        self.ints.push(looped.to_string());
        for _ in 0..(2 + self.r.below(5)) {
            let t = [Ty::Int, Ty::F32, Ty::F64, Ty::Bool][self.r.below(4) as usize];
            let vs = self.vars(t).clone();
            let target = vs.iter().find(|v| v.as_str() != looped && self.r.chance(50)).or(vs.first()).cloned();
            let Some(target) = target.filter(|v| v.as_str() != looped) else { continue };
            let e = self.expr(t, 4);
            if self.r.chance(25) {
                let c = self.expr(Ty::Bool, 2);
                s.push_str(&format!("        if {c} {{ {target} = {e} }}\n"));
            } else {
                s.push_str(&format!("        {target} = {e}\n"));
            }
        }
        s.push_str("    }\n");
        self.ints.pop();
        s.push_str("    print(i0, i1, x0, x1, d0, d1, b0, b1)\n");
        // Elementwise tensor expressions over the scalars (fused at -O1).
        // Sometimes large enough for the threaded split of fused loops (and `-O2`'s in-place
        // results), checked through the exact sum as well as the printed ends.
        let n = if self.r.chance(20) { 70001 } else { 37 };
        s.push_str(&format!("    let t = normal({n}, seed: 3)\n    let u = uniform({n}, seed: 4)\n"));
        self.tensor = true;
        for _ in 0..2 {
            let e = self.expr(Ty::F32, 4);
            s.push_str(&format!("    let r = t * 0.0 + {e}\n    print(r, sum(r))\n"));
        }
        self.tensor = false;
        if models {
            s.push_str("    var p = P(a: normal(3, seed: 5), b: normal(2, 4, seed: 6))\n");
            s.push_str("    let q = P(a: uniform(3, seed: 7), b: uniform(2, 4, seed: 8))\n");
            s.push_str(&format!("    for k in 0..{} {{\n", 1 + self.r.below(4)));
            for _ in 0..(1 + self.r.below(3)) {
                let e = self.model_expr(3);
                s.push_str(&format!("        p = {e}\n"));
            }
            s.push_str("    }\n    print(p.a, p.b)\n");
        }
        s.push_str("}\n");
        s
    }
}

/// Runs `src` in the interpreter and with the JIT at `-O0`, `-O1` and `-O2`: the outcomes, and
/// how many times a loop ran as native code.
pub fn engines(src: &str) -> (Outcome, [Outcome; 3], u64) {
    let dir = Path::new(".");
    let eager = run_block_with(src, dir, &mut |_| {});
    let mut native = 0;
    let mut run = |level: u8| {
        let (o, r) = crate::run_block(src, dir, crate::Options::level(level));
        native += r.borrow().loops.iter().map(|l| l.calls).sum::<u64>();
        o
    };
    let outs = [run(0), run(1), run(2)];
    (eager, outs, native)
}
