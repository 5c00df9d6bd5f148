//! Reverse rules of the reductions `sum` and `mean` (the primitives along one axis have theirs
//! in their table entries).

use super::*;

/// `sum`/`mean`: the cotangent broadcast back over the reduced axes (divided by their count).
pub(super) fn sum_or_mean(g: &mut Gen, s: &Site, v: &mut Vec<(usize, Local)>) -> Res<()> {
    let &Site { p, attrs, tys, bar, ot, .. } = s;
    let a = s.args.first().copied();
    let k = g.keep(bar, attrs.axis, attrs.keepdims);
    let mut x = g.bcast_like(k, a.unwrap())?;
    if p == Prim::Mean {
        let s = shape(&tys[0]);
        let n = match attrs.axis {
            Some(ax) => match &s[ax] {
                ShapeItem::Dim(d) => Some(d.clone()),
                _ => Some(Dim::constant(1)),
            },
            None => fixed(&s).map(|ds| ds.iter().fold(Dim::constant(1), |acc, d| acc.mul(d))),
        };
        let c = match n {
            Some(n) => g.count(n, elem(ot)),
            None => {
                // The mean of a `..` rest: its element count is only known at run time.
                let z = g.zeros_like(a.unwrap())?;
                let one = g.scalar(1.0, &tys[0]);
                let ones = g.bin(Prim::Add, z, one, tys[0].clone());
                g.p(Prim::Sum, &[ones], Attrs::default(), tensor(elem(ot), vec![]))
            }
        };
        x = g.bin(Prim::Div, x, c, tys[0].clone());
    }
    v.push((0, x));
    Ok(())
}
