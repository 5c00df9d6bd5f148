//! `einsum` over one to three operands, lowered to diagonals, sums, permutes and batched matmul.
//!
//! Each pair of operands is contracted as one batched matrix product: the shared letters that
//! survive are the batch, the shared letters that do not are `k`, and each operand's own
//! letters are `m` and `n`. So `"bij,bjk->bik"` costs exactly one `matmul`, and operands whose
//! letters already sit in `[batch, k, m]` or `[batch, n, k]` order are read transposed rather
//! than copied.

use std::collections::BTreeMap;

use crate::cpu::matmul::matmul_t;
use crate::cpu::reduce::{reduce, ReduceOp};
use crate::cpu::shape::permute;
use crate::cpu::{contiguous_strides, dispatch, strided_copy};
use crate::error::KernelError;
use crate::tensor::Tensor;

/// Einstein summation with NumPy's rules, in explicit (`"ij,jk->ik"`) or implicit (`"ij,jk"`,
/// output = the letters that appear once, sorted) form. A letter repeated inside one operand
/// takes a diagonal. Ellipses (`...`) are not supported.
pub fn einsum(spec: &str, xs: &[Tensor]) -> Result<Tensor, KernelError> {
    let invalid = |m: String| KernelError::Invalid(format!("einsum \"{spec}\": {m}"));
    let clean: String = spec.chars().filter(|c| !c.is_whitespace()).collect();
    if clean.contains('.') {
        return Err(invalid("ellipses (...) are not supported".into()));
    }
    let (lhs, rhs) = match clean.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (clean.as_str(), None),
    };
    let terms: Vec<Vec<char>> = lhs.split(',').map(|t| t.chars().collect()).collect();
    if xs.is_empty() || xs.len() > 3 {
        return Err(invalid(format!("takes 1 to 3 operands, got {}", xs.len())));
    }
    if terms.len() != xs.len() {
        return Err(invalid(format!("the subscripts name {} operands but {} were given", terms.len(), xs.len())));
    }
    let mut sizes: BTreeMap<char, usize> = BTreeMap::new();
    let mut counts: BTreeMap<char, usize> = BTreeMap::new();
    for (i, (term, x)) in terms.iter().zip(xs).enumerate() {
        if let Some(c) = term.iter().find(|c| !c.is_ascii_alphabetic()) {
            return Err(invalid(format!("'{c}' is not a subscript letter")));
        }
        if term.len() != x.rank() {
            return Err(invalid(format!("operand {i} has {} subscripts but rank {}", term.len(), x.rank())));
        }
        for (&c, &d) in term.iter().zip(x.shape()) {
            *counts.entry(c).or_default() += 1;
            match sizes.get(&c) {
                Some(&s) if s != d => {
                    return Err(invalid(format!("letter '{c}' has size {s} in one place and {d} in another")))
                }
                _ => {
                    sizes.insert(c, d);
                }
            }
        }
    }
    let output: Vec<char> = match rhs {
        Some(r) => {
            let out: Vec<char> = r.chars().collect();
            for (i, c) in out.iter().enumerate() {
                if !c.is_ascii_alphabetic() {
                    return Err(invalid(format!("'{c}' is not a subscript letter")));
                }
                if !sizes.contains_key(c) {
                    return Err(invalid(format!("output letter '{c}' is in no operand")));
                }
                if out[..i].contains(c) {
                    return Err(invalid(format!("output letter '{c}' appears twice")));
                }
            }
            out
        }
        None => counts.iter().filter(|(_, &n)| n == 1).map(|(&c, _)| c).collect(),
    };

    let mut ops: Vec<(Vec<char>, Tensor)> = Vec::new();
    for (term, x) in terms.iter().zip(xs) {
        ops.push(diagonal(term, x));
    }
    // Letters used by a single operand and absent from the output are summed right away.
    for i in 0..ops.len() {
        let others: Vec<char> = ops
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .flat_map(|(_, o)| o.0.clone())
            .chain(output.iter().copied())
            .collect();
        let (letters, t) = &ops[i];
        let (l, t) = sum_out(letters, t, |c| others.contains(&c))?;
        ops[i] = (l, t);
    }
    while ops.len() > 1 {
        let (lb, b) = ops.remove(1);
        let (la, a) = ops.remove(0);
        let keep: Vec<char> = ops.iter().flat_map(|o| o.0.clone()).chain(output.iter().copied()).collect();
        ops.insert(0, contract(&la, &a, &lb, &b, &keep, &sizes)?);
    }
    let (letters, t) = ops.pop().expect("one operand remains");
    let perm: Vec<usize> =
        output.iter().map(|c| letters.iter().position(|l| l == c).expect("output letters survive")).collect();
    permute(&t, &perm)
}

/// Removes repeated letters of one operand by taking the diagonal; letters keep the order of
/// their first appearance.
fn diagonal(term: &[char], x: &Tensor) -> (Vec<char>, Tensor) {
    let mut letters: Vec<char> = Vec::new();
    for &c in term {
        if !letters.contains(&c) {
            letters.push(c);
        }
    }
    if letters.len() == term.len() {
        return (letters, x.clone());
    }
    let own = contiguous_strides(x.shape());
    let mut shape = Vec::new();
    let mut strides = Vec::new();
    for &c in &letters {
        let mut stride = 0;
        let mut size = 0;
        for (i, &t) in term.iter().enumerate() {
            if t == c {
                stride += own[i];
                size = x.shape()[i];
            }
        }
        shape.push(size);
        strides.push(stride);
    }
    let t = dispatch!(x, v => Tensor::from_parts(shape.clone(), strided_copy(v, 0, &shape, &strides)));
    (letters, t)
}

/// Sums away every letter for which `keep` is false.
fn sum_out(letters: &[char], t: &Tensor, keep: impl Fn(char) -> bool) -> Result<(Vec<char>, Tensor), KernelError> {
    let mut letters = letters.to_vec();
    let mut t = t.clone();
    for i in (0..letters.len()).rev() {
        if !keep(letters[i]) {
            t = reduce(ReduceOp::Sum, &t, Some(i), false)?;
            letters.remove(i);
        }
    }
    Ok((letters, t))
}

/// Contracts two operands into one whose letters are `batch ++ a_only ++ b_only`.
fn contract(
    la: &[char],
    a: &Tensor,
    lb: &[char],
    b: &Tensor,
    keep: &[char],
    sizes: &BTreeMap<char, usize>,
) -> Result<(Vec<char>, Tensor), KernelError> {
    // A letter that only one side has and nobody needs later is summed first.
    let (la, a) = sum_out(la, a, |c| lb.contains(&c) || keep.contains(&c))?;
    let (lb, b) = sum_out(lb, b, |c| la.contains(&c) || keep.contains(&c))?;
    let batch: Vec<char> = la.iter().copied().filter(|c| lb.contains(c) && keep.contains(c)).collect();
    let contracted: Vec<char> = la.iter().copied().filter(|c| lb.contains(c) && !keep.contains(c)).collect();
    let a_only: Vec<char> = la.iter().copied().filter(|c| !lb.contains(c)).collect();
    let b_only: Vec<char> = lb.iter().copied().filter(|c| !la.contains(c)).collect();
    let size = |cs: &[char]| cs.iter().map(|c| sizes[c]).product::<usize>();
    let (nb, m, k, n) = (size(&batch), size(&a_only), size(&contracted), size(&b_only));

    let (a3, ta) = arrange(&la, &a, &[&batch, &a_only, &contracted], &[&batch, &contracted, &a_only], [nb, m, k])?;
    let (b3, tb) = arrange(&lb, &b, &[&batch, &contracted, &b_only], &[&batch, &b_only, &contracted], [nb, k, n])?;
    let prod = matmul_t(&a3, &b3, ta, tb)?;
    let mut letters = batch.clone();
    letters.extend(&a_only);
    letters.extend(&b_only);
    let shape: Vec<usize> = letters.iter().map(|c| sizes[c]).collect();
    Ok((letters, prod.with_shape(shape)?))
}

/// Brings an operand into the 3-D layout `plain` (`[batch, rows, cols]`), or reports that its
/// letters are already in the `transposed` order so the product can read it transposed.
fn arrange(
    letters: &[char],
    t: &Tensor,
    plain: &[&[char]; 3],
    transposed: &[&[char]; 3],
    dims: [usize; 3],
) -> Result<(Tensor, bool), KernelError> {
    let flat = |groups: &[&[char]; 3]| groups.concat();
    let (p, q) = (flat(plain), flat(transposed));
    if letters == p.as_slice() {
        return Ok((t.with_shape(dims.to_vec())?, false));
    }
    if letters == q.as_slice() {
        return Ok((t.with_shape(vec![dims[0], dims[2], dims[1]])?, true));
    }
    let perm: Vec<usize> = p.iter().map(|c| letters.iter().position(|l| l == c).expect("letter present")).collect();
    Ok((permute(t, &perm)?.with_shape(dims.to_vec())?, false))
}
