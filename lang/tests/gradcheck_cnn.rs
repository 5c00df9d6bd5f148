//! Gradient checks of the convolution and pooling primitives (`spec/cnn.md`) against central
//! finite differences, at first and second order, through the harness of `gradcheck.rs`
//! (`support/`): `conv2d` with strides and paddings in every operand, the two convolution
//! gradients as functions of their own (whose rules are the other convolutions), and max and
//! average pooling with overlapping and disjoint windows.

mod support;

use support::*;

#[test]
fn conv2d_every_operand() {
    // (x, k, stride, padding)
    let configs: [([usize; 4], [usize; 4], usize, usize); 5] = [
        ([1, 2, 4, 4], [3, 2, 2, 2], 1, 0),
        ([2, 1, 5, 4], [2, 1, 3, 2], 2, 1),
        ([1, 2, 5, 5], [2, 2, 3, 3], 3, 2),
        ([2, 2, 3, 3], [1, 2, 1, 1], 2, 0),
        ([1, 1, 2, 3], [2, 1, 4, 4], 1, 1),
    ];
    let mut cases = Vec::new();
    for (i, (xs, ks, s, p)) in configs.iter().enumerate() {
        let out = |n: usize, k: usize| (n + 2 * p - k) / s + 1;
        let os = [xs[0], ks[0], out(xs[2], ks[2]), out(xs[3], ks[3])];
        cases.push(
            Case::new(
                format!("conv2d x{xs:?} k{ks:?} stride {s} padding {p}"),
                format!("sum(w * tanh(conv2d(x, k, b, stride: {s}, padding: {p})))"),
            )
            .param("x", f64t(xs))
            .param("k", f64t(ks))
            .param("b", f64t(&[ks[0]]))
            .weight(&os)
            .seed(i as u64 + 1),
        );
        // The gradients are primitives too, with rules made of the others.
        cases.push(
            Case::new(
                format!("conv2d_input_grad {i}"),
                format!(
                    "sum(w * sin(conv2d_input_grad(g, k, size: [{}, {}], stride: {s}, padding: {p})))",
                    xs[2], xs[3]
                ),
            )
            .param("g", f64t(&os))
            .param("k", f64t(ks))
            .weight(xs)
            .seed(i as u64 + 11),
        );
        cases.push(
            Case::new(
                format!("conv2d_weight_grad {i}"),
                format!(
                    "sum(w * sin(conv2d_weight_grad(x, g, kernel: [{}, {}], stride: {s}, padding: {p})))",
                    ks[2], ks[3]
                ),
            )
            .param("x", f64t(xs))
            .param("g", f64t(&os))
            .weight(ks)
            .seed(i as u64 + 21),
        );
    }
    run_all("conv2d", cases);
}

#[test]
fn pooling() {
    // (x, kernel, stride): disjoint, overlapping, and strided windows that skip a row.
    let configs: [([usize; 4], usize, usize); 4] =
        [([1, 2, 4, 4], 2, 2), ([2, 1, 4, 5], 2, 1), ([1, 1, 5, 5], 3, 2), ([1, 2, 3, 3], 3, 3)];
    let mut cases = Vec::new();
    for (i, (xs, k, s)) in configs.iter().enumerate() {
        let os = [xs[0], xs[1], (xs[2] - k) / s + 1, (xs[3] - k) / s + 1];
        for f in ["max_pool2d", "avg_pool2d"] {
            cases.push(
                Case::new(
                    format!("{f} x{xs:?} kernel {k} stride {s}"),
                    format!("sum(w * tanh({f}(x * x, kernel: {k}, stride: {s})))"),
                )
                // Random values have no ties, so the maxima are stable under the perturbation.
                .param("x", f64d(xs, Dist::Away(0.05, 2.0)))
                .weight(&os)
                .seed(i as u64 + 31),
            );
        }
        cases.push(
            Case::new(
                format!("max_pool2d_grad {i}"),
                format!("sum(w * sin(max_pool2d_grad(x, g, kernel: {k}, stride: {s})))"),
            )
            .param("x", f64d(xs, Dist::Away(0.05, 2.0)))
            .param("g", f64t(&os))
            .weight(xs)
            .wrt(&["g"])
            .seed(i as u64 + 41),
        );
        cases.push(
            Case::new(
                format!("avg_pool2d_grad {i}"),
                format!("sum(w * sin(avg_pool2d_grad(g, size: [{}, {}], kernel: {k}, stride: {s})))", xs[2], xs[3]),
            )
            .param("g", f64t(&os))
            .weight(xs)
            .seed(i as u64 + 51),
        );
    }
    run_all("pooling", cases);
}
