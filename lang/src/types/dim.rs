//! Symbolic dimensions: Laurent polynomials with rational coefficients over dimension variables.
//!
//! Normalisation makes equal dims structurally equal: `2*D == D + D`, `(E/H)*H == E`.
//! Division by a single term multiplies by its inverse; `E / H` must be exact at run time.

use std::fmt;

/// A dimension variable. Names live in the `SymTable`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sym(pub u32);

/// A product of variables with integer exponents, sorted by variable, no zero exponents.
pub type Mono = Vec<(Sym, i32)>;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rat {
    pub num: i128,
    pub den: i128,
}

fn gcd(a: i128, b: i128) -> i128 {
    let (mut a, mut b) = (a.abs(), b.abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.max(1)
}

impl Rat {
    pub fn int(n: i128) -> Rat {
        Rat { num: n, den: 1 }
    }
    pub fn new(num: i128, den: i128) -> Rat {
        // Saturating arithmetic can reach `i128::MIN`, whose negation and `abs` overflow; keep
        // values in the symmetric range so that `neg`, `abs` and the sign fix below are safe.
        let (num, den) = (num.max(-i128::MAX), den.max(-i128::MAX));
        let g = gcd(num, den);
        let s = if den < 0 { -1 } else { 1 };
        Rat { num: s * num / g, den: s * den / g }
    }
    fn add(self, o: Rat) -> Rat {
        Rat::new(
            self.num.saturating_mul(o.den).saturating_add(o.num.saturating_mul(self.den)),
            self.den.saturating_mul(o.den),
        )
    }
    fn mul(self, o: Rat) -> Rat {
        Rat::new(self.num.saturating_mul(o.num), self.den.saturating_mul(o.den))
    }
    fn is_zero(self) -> bool {
        self.num == 0
    }
}

/// A normalised dimension expression.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Dim {
    terms: Terms,
}

/// The terms of a `Dim`: sorted by monomial, each monomial once, no zero coefficient. A sorted
/// `Vec` rather than a `BTreeMap`: dims are tiny (mostly one term) and copied with every type
/// of the IR, and a non-empty B-tree allocates a whole node (~600 bytes) where this needs 56.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
struct Terms(Vec<(Mono, Rat)>);

impl Terms {
    fn new() -> Terms {
        Terms(Vec::new())
    }
    fn from<const K: usize>(terms: [(Mono, Rat); K]) -> Terms {
        terms.into_iter().collect()
    }
    fn insert(&mut self, m: Mono, c: Rat) {
        match self.0.binary_search_by(|(k, _)| k.cmp(&m)) {
            Ok(i) => self.0[i].1 = c,
            Err(i) => self.0.insert(i, (m, c)),
        }
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    fn iter(&self) -> impl Iterator<Item = (&Mono, &Rat)> {
        self.0.iter().map(|(m, c)| (m, c))
    }
    fn keys(&self) -> impl Iterator<Item = &Mono> {
        self.0.iter().map(|(m, _)| m)
    }
    fn values(&self) -> impl Iterator<Item = &Rat> {
        self.0.iter().map(|(_, c)| c)
    }
}

impl<'a> IntoIterator for &'a Terms {
    type Item = &'a (Mono, Rat);
    type IntoIter = std::slice::Iter<'a, (Mono, Rat)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl IntoIterator for Terms {
    type Item = (Mono, Rat);
    type IntoIter = std::vec::IntoIter<(Mono, Rat)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// Sums the coefficients of equal monomials and drops the zeros: O(n log n) for any n.
impl FromIterator<(Mono, Rat)> for Terms {
    fn from_iter<I: IntoIterator<Item = (Mono, Rat)>>(iter: I) -> Terms {
        let mut v: Vec<(Mono, Rat)> = iter.into_iter().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<(Mono, Rat)> = Vec::with_capacity(v.len());
        for (m, c) in v {
            match out.last_mut() {
                Some((lm, lc)) if *lm == m => *lc = lc.add(c),
                _ => {
                    if out.last().is_some_and(|(_, c)| c.is_zero()) {
                        out.pop();
                    }
                    out.push((m, c));
                }
            }
        }
        if out.last().is_some_and(|(_, c)| c.is_zero()) {
            out.pop();
        }
        Terms(out)
    }
}

impl Dim {
    pub fn constant(n: i64) -> Dim {
        let mut terms = Terms::new();
        if n != 0 {
            terms.insert(Vec::new(), Rat::int(n as i128));
        }
        Dim { terms }
    }

    pub fn var(s: Sym) -> Dim {
        let mut terms = Terms::new();
        terms.insert(vec![(s, 1)], Rat::int(1));
        Dim { terms }
    }

    pub fn add(&self, o: &Dim) -> Dim {
        if o.terms.is_empty() {
            return self.clone();
        }
        Dim { terms: self.terms.iter().chain(o.terms.iter()).map(|(m, c)| (m.clone(), *c)).collect() }
    }

    /// The value a product too large to expand stands for: a saturated constant, which
    /// `overflows`, so the checker reports it instead of spending unbounded time and memory.
    fn saturated() -> Dim {
        Dim { terms: Terms::from([(Vec::new(), Rat::int(i128::MAX))]) }
    }

    pub fn neg(&self) -> Dim {
        Dim { terms: self.terms.iter().map(|(m, c)| (m.clone(), Rat::new(-c.num, c.den))).collect() }
    }

    pub fn sub(&self, o: &Dim) -> Dim {
        self.add(&o.neg())
    }

    pub fn mul(&self, o: &Dim) -> Dim {
        // Expanding products of sums grows combinatorially (`(A+B+C+D)**40` has 12,341 terms).
        if self.terms.len().saturating_mul(o.terms.len()) > MAX_PRODUCT_TERMS {
            return Dim::saturated();
        }
        let products =
            self.terms.iter().flat_map(|(m1, c1)| o.terms.iter().map(|(m2, c2)| (mono_mul(m1, m2), c1.mul(*c2))));
        Dim { terms: products.collect() }
    }

    /// Division; `None` when the divisor is zero or a sum of several terms.
    pub fn div(&self, o: &Dim) -> Option<Dim> {
        if o.terms.len() != 1 {
            return None;
        }
        let (m, c) = o.terms.iter().next()?;
        let inv_m: Mono = m.iter().map(|&(s, e)| (s, e.saturating_neg())).collect();
        let mut single = Terms::new();
        single.insert(inv_m, Rat::new(c.den, c.num));
        Some(self.mul(&Dim { terms: single }))
    }

    /// The value when the dim is a constant integer.
    pub fn as_const(&self) -> Option<i64> {
        match self.terms.len() {
            0 => Some(0),
            1 => {
                let (m, c) = self.terms.iter().next()?;
                (m.is_empty() && c.den == 1).then(|| i64::try_from(c.num).ok()).flatten()
            }
            _ => None,
        }
    }

    /// True when a coefficient left the 64-bit range (the arithmetic saturates there, so the
    /// value is no longer exact): such a dim cannot be the size of any real tensor.
    pub fn overflows(&self) -> bool {
        let big = |v: i128| i64::try_from(v).is_err();
        self.terms.values().any(|c| big(c.num) || big(c.den))
    }

    /// A constant that is not an integer (from an inexact division such as `6/4`).
    pub fn is_fractional_const(&self) -> bool {
        self.terms.len() == 1 && self.terms.iter().all(|(m, c)| m.is_empty() && c.den != 1)
    }

    /// The variable when the dim is exactly one variable.
    pub fn as_var(&self) -> Option<Sym> {
        if self.terms.len() != 1 {
            return None;
        }
        let (m, c) = self.terms.iter().next()?;
        (m.len() == 1 && m[0].1 == 1 && c.num == 1 && c.den == 1).then(|| m[0].0)
    }

    pub fn is_one(&self) -> bool {
        self.as_const() == Some(1)
    }

    pub fn vars(&self) -> impl Iterator<Item = Sym> + '_ {
        self.terms.keys().flat_map(|m| m.iter().map(|&(s, _)| s))
    }

    pub fn mentions(&self, s: Sym) -> bool {
        self.vars().any(|v| v == s)
    }

    /// Replaces variables by dims. Missing variables stay.
    pub fn subst(&self, f: &dyn Fn(Sym) -> Option<Dim>) -> Dim {
        let mut out = Vec::new();
        for (m, c) in &self.terms {
            let mut term = Dim { terms: Terms::from([(Vec::new(), *c)]) };
            for &(s, e) in m {
                let base = f(s).unwrap_or_else(|| Dim::var(s));
                let factor = if e >= 0 {
                    pow(&base, e as u32)
                } else {
                    match pow(&base, e.unsigned_abs()).div_opt_one() {
                        Some(d) => d,
                        None => {
                            // A sum in a denominator cannot be normalised; keep the variable.
                            let mut single = Terms::new();
                            single.insert(vec![(s, e)], Rat::int(1));
                            Dim { terms: single }
                        }
                    }
                };
                term = term.mul(&factor);
            }
            out.extend(term.terms);
        }
        Dim { terms: out.into_iter().collect() }
    }

    fn div_opt_one(&self) -> Option<Dim> {
        Dim::constant(1).div(self)
    }

    /// If `self == 0` is linear in `v` with the other variables bound, the solution for `v`.
    pub fn solve_for(&self, v: Sym) -> Option<Dim> {
        // self = a*v + rest, with a a single term free of v (a constant, or `H` in `H*E - D`)
        // and rest free of v.
        let mut a = Dim::default();
        let mut rest = Dim::default();
        for (m, c) in &self.terms {
            let e: i32 = m.iter().filter(|(s, _)| *s == v).map(|(_, e)| *e).sum();
            match e {
                0 => rest = rest.add(&Dim { terms: Terms::from([(m.clone(), *c)]) }),
                1 => {
                    let others: Mono = m.iter().copied().filter(|(s, _)| *s != v).collect();
                    a = a.add(&Dim { terms: Terms::from([(others, *c)]) });
                }
                _ => return None,
            }
        }
        rest.neg().div(&a)
    }

    /// Renders with variable names from `names`.
    pub fn display<'a>(&'a self, names: &'a dyn Fn(Sym) -> String) -> DimDisplay<'a> {
        DimDisplay { dim: self, names }
    }
}

/// Most term pairs one product may expand; beyond it the product saturates (see `saturated`).
const MAX_PRODUCT_TERMS: usize = 1 << 14;

/// `d ** e` by repeated squaring: exponents can be huge (`I*I*…` nested through models).
fn pow(d: &Dim, mut e: u32) -> Dim {
    let mut out = Dim::constant(1);
    let mut base = d.clone();
    while e > 0 {
        if e & 1 == 1 {
            out = out.mul(&base);
        }
        e >>= 1;
        if e > 0 {
            base = base.mul(&base);
        }
    }
    out
}

/// The product of two monomials: a merge of two lists sorted by variable.
fn mono_mul(a: &Mono, b: &Mono) -> Mono {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    loop {
        let (s, e) = match (a.get(i), b.get(j)) {
            (Some(&(sa, ea)), Some(&(sb, eb))) if sa == sb => {
                (i, j) = (i + 1, j + 1);
                (sa, ea.saturating_add(eb))
            }
            (Some(&x), Some(&(sb, _))) if x.0 < sb => {
                i += 1;
                x
            }
            (_, Some(&y)) => {
                j += 1;
                y
            }
            (Some(&x), None) => {
                i += 1;
                x
            }
            (None, None) => break,
        };
        if e != 0 {
            out.push((s, e));
        }
    }
    out
}

pub struct DimDisplay<'a> {
    dim: &'a Dim,
    names: &'a dyn Fn(Sym) -> String,
}

impl fmt::Display for DimDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.dim.terms.is_empty() {
            return write!(f, "0");
        }
        // Constants last, like people write `N + 1`.
        let mut terms: Vec<_> = self.dim.terms.iter().collect();
        terms.sort_by_key(|(m, _)| m.is_empty());
        for (i, (m, c)) in terms.iter().enumerate() {
            let neg = c.num < 0;
            if i > 0 {
                write!(f, "{}", if neg { " - " } else { " + " })?;
            } else if neg {
                write!(f, "-")?;
            }
            let num = c.num.abs();
            let num_part: Vec<String> = m
                .iter()
                .filter(|(_, e)| *e > 0)
                .map(|&(s, e)| if e == 1 { (self.names)(s) } else { format!("{}**{}", (self.names)(s), e) })
                .collect();
            let den_part: Vec<String> = m
                .iter()
                .filter(|(_, e)| *e < 0)
                .map(|&(s, e)| if e == -1 { (self.names)(s) } else { format!("{}**{}", (self.names)(s), -e) })
                .collect();
            let mut s = String::new();
            if num != 1 || num_part.is_empty() {
                s.push_str(&num.to_string());
            }
            for v in &num_part {
                if !s.is_empty() {
                    s.push('*');
                }
                s.push_str(v);
            }
            if c.den != 1 {
                s.push('/');
                s.push_str(&c.den.to_string());
            }
            for v in &den_part {
                s.push('/');
                s.push_str(v);
            }
            write!(f, "{s}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(s: Sym) -> String {
        ["N", "D", "E", "H"][s.0 as usize].to_string()
    }

    #[test]
    fn normalises() {
        let d = Dim::var(Sym(1));
        assert_eq!(d.mul(&Dim::constant(2)), d.add(&d));
        let e = Dim::var(Sym(2));
        let h = Dim::var(Sym(3));
        assert_eq!(e.div(&h).unwrap().mul(&h), e);
        let n1 = Dim::var(Sym(0)).add(&Dim::constant(1));
        assert_eq!(n1.display(&names).to_string(), "N + 1");
        assert_eq!(e.div(&h).unwrap().display(&names).to_string(), "E/H");
        assert_eq!(Dim::constant(6).div(&Dim::constant(3)).unwrap().as_const(), Some(2));
        assert!(Dim::constant(6).div(&Dim::constant(4)).unwrap().is_fractional_const());
    }

    #[test]
    fn saturates_without_panicking() {
        let mut d = Dim::constant(-2);
        for _ in 0..200 {
            d = d.mul(&Dim::constant(2));
        }
        assert!(d.overflows());
        let _ = d.neg().mul(&Dim::constant(-3)).add(&d).div(&d);
        assert!(d.display(&names).to_string().starts_with('-'));
        assert!(!Dim::constant(i64::MAX).overflows());
        // Huge exponents and combinatorial expansions finish at once and saturate.
        let sum = (0..4).map(|i| Dim::var(Sym(i))).fold(Dim::default(), |a, b| a.add(&b));
        assert!(pow(&sum, 200).overflows());
        assert!(pow(&Dim::constant(2), u32::MAX).overflows());
        assert_eq!(pow(&sum, 3), sum.mul(&sum).mul(&sum));
    }

    #[test]
    fn normal_form_is_canonical() {
        let (n, d) = (Dim::var(Sym(0)), Dim::var(Sym(1)));
        let one = Dim::constant(1);
        // (N + 1)(N - 1) == N*N - 1, whichever way it is built.
        let lhs = n.add(&one).mul(&n.sub(&one));
        let rhs = n.mul(&n).sub(&one);
        assert_eq!(lhs, rhs);
        assert_eq!(lhs.display(&names).to_string(), "N**2 - 1");
        assert_eq!(n.add(&d).add(&one), one.add(&d).add(&n));
        assert_eq!(n.mul(&d).mul(&n), n.mul(&n).mul(&d));
        assert_eq!(n.sub(&n), Dim::default());
        assert_eq!(n.sub(&n).as_const(), Some(0));
        assert_eq!(n.mul(&d).div(&d).unwrap(), n);
        assert_eq!(n.mul(&d).subst(&|s| (s == Sym(1)).then(|| Dim::constant(3))), n.mul(&Dim::constant(3)));
    }

    #[test]
    fn solves_linear() {
        // 2*N + 1 - 9 = 0  ->  N = 4
        let eq = Dim::var(Sym(0)).mul(&Dim::constant(2)).add(&Dim::constant(1)).sub(&Dim::constant(9));
        assert_eq!(eq.solve_for(Sym(0)).unwrap().as_const(), Some(4));
    }

    #[test]
    fn solves_with_a_symbolic_coefficient() {
        // H*E - D = 0  ->  E = D/H, and (D/H)*H is D again.
        let (e, h, d) = (Dim::var(Sym(0)), Dim::var(Sym(1)), Dim::var(Sym(2)));
        let sol = h.mul(&e).sub(&d).solve_for(Sym(0)).unwrap();
        assert_eq!(sol, d.div(&h).unwrap());
        assert_eq!(sol.mul(&h), d);
        // E*E - D and (H + 1)*E - D have no single-term solution.
        assert!(e.mul(&e).sub(&d).solve_for(Sym(0)).is_none());
        assert!(h.add(&Dim::constant(1)).mul(&e).sub(&d).solve_for(Sym(0)).is_none());
    }
}
