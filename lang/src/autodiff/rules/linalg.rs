//! Reverse rules of the contractions: `@` and `einsum`.

use super::*;

/// `a @ b`: each operand's cotangent is a product with the other, its batch dims summed back.
pub(super) fn matmul(g: &mut Gen, s: &Site, v: &mut Vec<(usize, Local)>) -> Res<()> {
    let &Site { tys, act, bar, ot, .. } = s;
    let a = s.args.first().copied();
    let b = s.args.get(1).copied();
    let (a, b) = (a.unwrap(), b.unwrap());
    let (ra, rb) = (shape(&tys[0]).len(), shape(&tys[1]).len());
    match (ra, rb) {
        (1, 1) => {
            let _ = ();
            if act[0] {
                v.push((0, g.bin(Prim::Mul, bar, b, tys[1].clone())));
            }
            if act[1] {
                v.push((1, g.bin(Prim::Mul, bar, a, tys[0].clone())));
            }
        }
        (1, _) => {
            // y[.., m] = a[k] @ b[.., k, m]
            if act[0] {
                let ge = g.expand(bar, shape(ot).len() - 1);
                let bt = g.swap_last(b)?;
                let m = g.matmul(ge, bt);
                let mt = g.ty_of(m);
                let s = shape(&mt);
                let sq = tensor(
                    elem(&mt),
                    s[..s.len() - 2].iter().chain(std::iter::once(&s[s.len() - 1])).cloned().collect(),
                );
                let m = g.p(Prim::Squeeze, &[m], Attrs { axis: Some(s.len() - 2), ..Attrs::default() }, sq);
                v.push((0, g.unbroadcast(m, &tys[0])?));
            }
            if act[1] {
                // gb[.., k, m] = a[k] ⊗ g[.., m]
                let ae = g.expand(a, 1);
                let gr = g.expand(bar, shape(ot).len() - 1);
                let m = g.matmul(ae, gr);
                v.push((1, g.unbroadcast(m, &tys[1])?));
            }
        }
        (_, 1) => {
            // y[.., n] = a[.., n, k] @ b[k]
            if act[0] {
                let ge = g.expand(bar, shape(ot).len());
                let be = g.expand(b, 0);
                let m = g.matmul(ge, be);
                v.push((0, g.unbroadcast(m, &tys[0])?));
            }
            if act[1] {
                let at = g.swap_last(a)?;
                let ge = g.expand(bar, shape(ot).len());
                let m = g.matmul(at, ge);
                let mt = g.ty_of(m);
                let s = shape(&mt);
                let sq = tensor(elem(&mt), s[..s.len() - 1].to_vec());
                let m = g.p(Prim::Squeeze, &[m], Attrs { axis: Some(s.len() - 1), ..Attrs::default() }, sq);
                v.push((1, g.unbroadcast(m, &tys[1])?));
            }
        }
        _ => {
            if act[0] {
                let bt = g.swap_last(b)?;
                let m = g.matmul(bar, bt);
                v.push((0, g.unbroadcast(m, &tys[0])?));
            }
            if act[1] {
                let folded = if rb == 2 { g.rows_product(a, bar)? } else { None };
                let m = match folded {
                    Some(m) => m,
                    None => {
                        let at = g.swap_last(a)?;
                        g.matmul(at, bar)
                    }
                };
                v.push((1, g.unbroadcast(m, &tys[1])?));
            }
        }
    }
    Ok(())
}

/// `einsum`: each operand's cotangent is an einsum of the cotangent with the other operands.
pub(super) fn einsum(g: &mut Gen, s: &Site, v: &mut Vec<(usize, Local)>) -> Res<()> {
    let &Site { attrs, args, tys, act, bar, .. } = s;
    let spec = attrs.spec.clone().unwrap_or_default();
    let (lhs, out_l) = spec.split_once("->").unwrap_or((&spec, ""));
    let ins: Vec<&str> = lhs.split(',').collect();
    for (i, letters) in ins.iter().enumerate() {
        if !act[i] {
            continue;
        }
        if letters.chars().collect::<std::collections::HashSet<_>>().len() != letters.len() {
            return Err(err(g.span, "cannot differentiate an einsum with a repeated letter in one operand"));
        }
        let mut others = vec![out_l.to_string()];
        let mut ops = vec![bar];
        for (j, l2) in ins.iter().enumerate() {
            if j != i {
                others.push(l2.to_string());
                ops.push(args[j]);
            }
        }
        let avail: String = others.concat();
        let kept: String = letters.chars().filter(|c| avail.contains(*c)).collect();
        let s = shape(&tys[i]);
        let kept_shape: Vec<ShapeItem> =
            letters.chars().zip(s.iter()).filter(|(c, _)| avail.contains(*c)).map(|(_, d)| d.clone()).collect();
        let spec2 = format!("{}->{kept}", others.join(","));
        let ty2 = tensor(elem(&tys[i]), kept_shape);
        let mut x = g.p(Prim::Einsum, &ops, Attrs { spec: Some(spec2), ..Attrs::default() }, ty2);
        if kept.len() != letters.len() {
            // Letters summed away inside this operand alone: broadcast the cotangent back.
            for (pos, c) in letters.chars().enumerate() {
                if !avail.contains(c) {
                    x = g.expand(x, pos);
                }
            }
            x = g.bcast_like(x, args[i])?;
        }
        v.push((i, x));
    }
    Ok(())
}
