//! The AVX2 build of the hot loops (`kernels::simd`) computes the same bits as the baseline
//! build: every unary and binary operation, the reductions, `logsumexp` and the softmaxes, on
//! inputs long enough to take the parallel paths and holding NaN, ±∞, ±0 and subnormals.

use kernels::ops::{self, BinaryOp, ReduceOp, UnaryOp};
use kernels::{rng, simd, DType, Tensor};

/// The build switch is process-wide: the tests of this file take turns.
static SWITCH: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn transposes_in_8x8_blocks_match_the_definition() {
    let _turn = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    // Every shape class of the blocked path: whole blocks, ragged edges, several matrices, tiles
    // (32) and bands split across threads, 4-byte ints as well as floats.
    for (b, r, c) in [(1, 8, 8), (2, 9, 17), (1, 33, 65), (3, 64, 40), (1, 300, 257), (1, 1024, 96)] {
        let n = b * r * c;
        let v: Vec<i32> = (0..n as i32).map(|i| i.wrapping_mul(2_654_435_761_u32 as i32)).collect();
        let x = Tensor::from_vec(vec![b, r, c], v.clone()).expect("tensor");
        for on in [false, true] {
            simd::set_avx2(on);
            let t = ops::swap_last(&x).expect("transpose");
            assert_eq!(t.shape(), &[b, c, r]);
            let got = t.as_i32().expect("i32");
            for m in 0..b {
                for i in 0..r {
                    for j in 0..c {
                        assert_eq!(got[m * r * c + j * r + i], v[m * r * c + i * c + j], "{b}x{r}x{c} avx2 {on}");
                    }
                }
            }
        }
    }
    simd::set_avx2(true);
}

/// Normal values scaled over many binades, with special values sprinkled in.
fn input(shape: &[usize], key: &str, dtype: DType) -> Tensor {
    let base = rng::normal(DType::F64, shape, rng::stream_key(7, key), 0.0, 1.0).expect("normal");
    let scale = rng::uniform(DType::F64, shape, rng::stream_key(8, key), -6.0, 6.0).expect("uniform");
    let specials = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, 1e-40, -1e-39, 89.0, -104.0, 9.0];
    let v: Vec<f64> = base
        .as_f64()
        .expect("f64")
        .iter()
        .zip(scale.as_f64().expect("f64"))
        .enumerate()
        .map(|(i, (&x, &s))| if i % 97 == 0 { specials[(i / 97) % specials.len()] } else { x * 10f64.powf(s / 3.0) })
        .collect();
    if dtype == DType::F32 {
        Tensor::from_vec(shape.to_vec(), v.iter().map(|&x| x as f32).collect()).expect("tensor")
    } else {
        Tensor::from_vec(shape.to_vec(), v).expect("tensor")
    }
}

fn bits(t: &Tensor) -> Vec<u64> {
    match (t.as_f32(), t.as_f64()) {
        (Some(v), _) => v.iter().map(|x| x.to_bits() as u64).collect(),
        (_, Some(v)) => v.iter().map(|x| x.to_bits()).collect(),
        _ => t.as_bool().map(|v| v.iter().map(|&b| b as u64).collect()).expect("float or bool"),
    }
}

type Op<'a> = (String, Box<dyn Fn() -> Tensor + 'a>);

#[test]
fn avx2_and_baseline_builds_give_the_same_bits() {
    let _turn = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    simd::set_avx2(true);
    if !simd::avx2_enabled() {
        println!("skipped: this CPU has no AVX2 and FMA, so only the baseline build runs");
        return;
    }
    for dtype in [DType::F32, DType::F64] {
        let x = input(&[300, 257], "x", dtype);
        let y = input(&[300, 257], "y", dtype);
        let row = input(&[257], "r", dtype);
        let mut cases: Vec<Op> = Vec::new();
        // Every operation on floats (`not` takes bools).
        for &op in UnaryOp::ALL.iter().filter(|&&u| u != UnaryOp::Not) {
            let x = &x;
            cases.push((format!("{op:?}"), Box::new(move || ops::unary(op, x).expect("unary"))));
        }
        for op in [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::Rem,
            BinaryOp::Pow,
            BinaryOp::Max,
            BinaryOp::Lt,
        ] {
            let (x, y, row) = (&x, &y, &row);
            cases.push((format!("{op:?}"), Box::new(move || ops::binary(op, x, y).expect("binary"))));
            cases.push((format!("{op:?} row"), Box::new(move || ops::binary(op, x, row).expect("binary"))));
        }
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Prod] {
            for axis in [Some(0), Some(1), None] {
                let x = &x;
                cases.push((
                    format!("{op:?} {axis:?}"),
                    Box::new(move || ops::reduce(op, x, axis, false).expect("reduce")),
                ));
            }
        }
        for axis in [0, 1] {
            let x = &x;
            cases.push((
                format!("logsumexp {axis}"),
                Box::new(move || ops::logsumexp(x, Some(axis), true).expect("lse")),
            ));
            cases.push((format!("softmax {axis}"), Box::new(move || ops::softmax(x, axis).expect("softmax"))));
            cases.push((format!("log_softmax {axis}"), Box::new(move || ops::log_softmax(x, axis).expect("lsm"))));
        }
        for shape in [[1, 8, 8], [3, 37, 45], [2, 64, 256], [1, 300, 257], [5, 7, 3]] {
            let t = input(&shape, "t", dtype);
            cases.push((format!("transpose {shape:?}"), Box::new(move || ops::swap_last(&t).expect("transpose"))));
        }
        for (name, f) in &cases {
            simd::set_avx2(false);
            let base = bits(&f());
            simd::set_avx2(true);
            let wide = bits(&f());
            let diff = base.iter().zip(&wide).position(|(a, b)| a != b);
            assert!(diff.is_none() && base.len() == wide.len(), "{dtype} {name}: the builds differ at {diff:?}");
        }
    }
}
