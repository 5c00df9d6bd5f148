//! Reverse rules of the convolutions.

use super::*;

/// Which of the three convolutions a rule differentiates.
pub(super) enum Conv {
    Forward,
    InputGrad,
    WeightGrad,
}

/// The convolutions: each is the adjoint of the others.
pub(super) fn conv(g: &mut Gen, s: &Site, v: &mut Vec<(usize, Local)>, which: Conv) -> Res<()> {
    let &Site { attrs, args, tys, act, bar, .. } = s;
    let (a, b) = (args[0], args[1]);
    let spatial = |t: &Type| fixed(&shape(t)).map(|d| d[2..].to_vec()).unwrap_or_default();
    let with = |shape: Vec<Dim>| Attrs { perm: attrs.perm.clone(), shape, ..Attrs::default() };
    let conv = Attrs { perm: attrs.perm.clone(), ..Attrs::default() };
    // (operand, primitive, its operands, attributes)
    let plan: [(Prim, [Local; 2], Attrs); 2] = match which {
        Conv::Forward => [
            (Prim::Conv2dInputGrad, [bar, b], with(spatial(&tys[0]))),
            (Prim::Conv2dWeightGrad, [a, bar], with(spatial(&tys[1]))),
        ],
        Conv::InputGrad => [(Prim::Conv2d, [bar, b], conv), (Prim::Conv2dWeightGrad, [bar, a], with(spatial(&tys[1])))],
        Conv::WeightGrad => [(Prim::Conv2dInputGrad, [b, bar], with(spatial(&tys[0]))), (Prim::Conv2d, [a, bar], conv)],
    };
    for (i, (q, ops, at)) in plan.into_iter().enumerate() {
        if act[i] {
            v.push((i, g.p(q, &ops, at, tys[i].clone())));
        }
    }
    Ok(())
}
