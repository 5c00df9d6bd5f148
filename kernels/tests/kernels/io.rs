//! File I/O: round trips, files written by NumPy and the Python `safetensors` package
//! (tests/data, made by tests/data/gen_data.py), hand-built headers, and corrupt files.

use std::path::{Path, PathBuf};

use kernels::io;
use kernels::{DType, KernelError, Tensor};

use crate::{check, t32, t64, ti};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

/// A fresh scratch directory for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kernels-io").join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn samples() -> Vec<Tensor> {
    vec![
        t32(&[2, 3], &[1.0, -2.5, 3.25, f32::INFINITY, 0.0, -0.0]),
        t64(&[3], &[std::f64::consts::PI, -1e-300, 1e300]),
        ti(&[2, 1, 2], &[i32::MIN, -1, 0, i32::MAX]),
        Tensor::from_bool(vec![3], vec![true, false, true]).unwrap(),
        Tensor::scalar_f32(7.5),
        t64(&[0, 4], &[]),
    ]
}

#[test]
fn npy_npz_and_safetensors_round_trip_every_dtype() {
    let dir = scratch("round_trip");
    for (i, t) in samples().iter().enumerate() {
        for ext in ["npy", "npz", "safetensors"] {
            let p = dir.join(format!("t{i}.{ext}"));
            io::save(&p, t).unwrap();
            assert_eq!(&io::load(&p, None).unwrap(), t, "{ext} {i}");
        }
    }
    let named: Vec<(String, Tensor)> =
        samples().into_iter().enumerate().map(|(i, t)| (format!("layers.{i}.w"), t)).collect();
    let p = dir.join("model.safetensors");
    io::save_safetensors(&p, &named).unwrap();
    assert_eq!(io::load_all_safetensors(&p).unwrap(), named);
    assert_eq!(io::load(&p, Some("layers.2.w")).unwrap(), named[2].1);
    let e = io::load(&p, None).unwrap_err().to_string();
    assert!(e.contains("several tensors") && e.contains("layers.0.w, layers.1.w"), "{e}");
    let p = dir.join("model.npz");
    io::save_npz(&p, &named).unwrap();
    assert_eq!(io::load_all_npz(&p).unwrap(), named);
    assert_eq!(io::load(&p, Some("layers.3.w")).unwrap(), named[3].1);
    assert!(io::save_safetensors(&dir.join("dup.safetensors"), &[named[0].clone(), named[0].clone()]).is_err());
}

#[test]
fn npy_files_written_by_numpy_load() {
    // np.asfortranarray(np.arange(6, dtype="<f8").reshape(2, 3) / 4)
    check(&io::load(&data("f8_fortran.npy"), None).unwrap(), &[2, 3], &[0.0, 0.25, 0.5, 0.75, 1.0, 1.25], 0.0);
    // np.array([[-3, 2**31 - 1], [5, -2**31]], dtype=">i8")
    let t = io::load(&data("i8_big.npy"), None).unwrap();
    assert_eq!(t.dtype(), DType::I32);
    assert_eq!(t.as_i32().unwrap(), &[-3, i32::MAX, 5, i32::MIN]);
    assert_eq!(io::load(&data("u1.npy"), None).unwrap().as_i32().unwrap(), &[0, 7, 255]);
    assert_eq!(io::load(&data("i2.npy"), None).unwrap().as_i32().unwrap(), &[-300, 12]);
    assert_eq!(io::load(&data("b1.npy"), None).unwrap().as_bool().unwrap(), &[true, false, true]);
    let s = io::load(&data("f4_scalar.npy"), None).unwrap();
    assert_eq!((s.shape(), s.as_f32().unwrap()), (&[] as &[usize], &[2.5f32][..]));
    assert_eq!(io::load(&data("f4_big.npy"), None).unwrap().as_f32().unwrap(), &[1.5, -2.25]);
    // np.array([0.5, -1.0, 65504.0, 6e-8], dtype="<f2") loads as f16 and widens exactly to f32.
    let h = io::load(&data("f2.npy"), None).unwrap();
    assert_eq!(h.dtype(), DType::F16);
    assert_eq!(h.cast(DType::F32).as_f32().unwrap(), &[0.5, -1.0, 65504.0, 2f32.powi(-24)]);
    let v2 = io::load(&data("f4_v2.npy"), None).unwrap();
    assert_eq!((v2.shape(), v2.as_f32().unwrap()), (&[1usize, 2][..], &[1.0f32, 2.0][..]));
    assert_eq!(io::load(&data("f4_v3.npy"), None).unwrap().as_f32().unwrap(), &[3.0]);
    let e = io::load(&data("i8_overflow.npy"), None).unwrap_err().to_string();
    assert!(e.contains("i8_overflow.npy") && e.contains("1099511627776") && e.contains("i32"), "{e}");
}

#[test]
fn compressed_npz_from_numpy_needs_an_entry_name() {
    // np.savez_compressed("two.npz", x=np.arange(4, dtype="<f4").reshape(2, 2), labels=np.array([1, 0, 2], dtype="<i8"))
    let p = data("two.npz");
    let x = io::load(&p, Some("x")).unwrap();
    check(&x, &[2, 2], &[0.0, 1.0, 2.0, 3.0], 0.0);
    assert_eq!(io::load(&p, Some("labels")).unwrap().as_i32().unwrap(), &[1, 0, 2]);
    let e = io::load(&p, None).unwrap_err().to_string();
    assert!(e.contains("two.npz") && e.contains("x, labels"), "{e}");
    let e = io::load(&p, Some("y")).unwrap_err().to_string();
    assert!(e.contains("no array named 'y'") && e.contains("x, labels"), "{e}");
}

#[test]
fn safetensors_from_python_and_by_hand() {
    // safetensors.numpy.save_file({"h": float16 [1.0, -0.5, 0.099975586],
    //   "ids": int64 [[1, -2], [3, 2**31 - 1]], "mask": bool [True, False]}, "mixed.safetensors")
    let all = io::load_all_safetensors(&data("mixed.safetensors")).unwrap();
    let get = |n: &str| all.iter().find(|(k, _)| k == n).unwrap().1.clone();
    assert_eq!(get("h").dtype(), DType::F16);
    assert_eq!(get("h").cast(DType::F32).as_f32().unwrap(), &[1.0, -0.5, 0.099_975_586]);
    assert_eq!(get("ids").as_i32().unwrap(), &[1, -2, 3, i32::MAX]);
    assert_eq!(get("ids").shape(), &[2, 2]);
    assert_eq!(get("mask").as_bool().unwrap(), &[true, false]);

    // A file assembled byte by byte: a BF16 tensor and an I64 tensor whose value overflows i32.
    let header = br#"{"b":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"big":{"dtype":"I64","shape":[1],"data_offsets":[4,12]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header);
    bytes.extend_from_slice(&0x3fc0u16.to_le_bytes()); // bf16 1.5
    bytes.extend_from_slice(&0xc000u16.to_le_bytes()); // bf16 -2.0
    bytes.extend_from_slice(&(1i64 << 40).to_le_bytes());
    let dir = scratch("by_hand");
    let p = dir.join("hand.safetensors");
    std::fs::write(&p, &bytes).unwrap();
    let b = io::load(&p, Some("b")).unwrap();
    assert_eq!(b.dtype(), DType::Bf16);
    assert_eq!(b.cast(DType::F32).as_f32().unwrap(), &[1.5, -2.0]);
    let e = io::load(&p, Some("big")).unwrap_err().to_string();
    assert!(e.contains("hand.safetensors") && e.contains("does not fit in i32"), "{e}");

    // The header this crate writes, read back as text.
    let p = dir.join("one.safetensors");
    io::save(&p, &t32(&[2], &[1.0, 2.0])).unwrap();
    let raw = std::fs::read(&p).unwrap();
    let n = u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize;
    assert_eq!(n % 8, 0);
    let text = std::str::from_utf8(&raw[8..8 + n]).unwrap().trim_end();
    assert_eq!(text, r#"{"__metadata__":{"format":"pt"},"value":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#);
    assert_eq!(raw.len(), 8 + n + 8);
}

#[test]
fn csv_with_header_and_errors() {
    let dir = scratch("csv");
    let p = dir.join("d.csv");
    std::fs::write(&p, "a, b ,c\n1,2.5,-3\n\n4,5e-1,nan\r\n").unwrap();
    let t = io::load(&p, None).unwrap();
    assert_eq!(t.dtype(), DType::F64);
    check(&t, &[2, 3], &[1.0, 2.5, -3.0, 4.0, 0.5, f64::NAN], 0.0);
    std::fs::write(&p, "1,2\n3\n").unwrap();
    let e = io::load(&p, None).unwrap_err().to_string();
    assert!(e.contains("d.csv") && e.contains("line 2 has 1 values but line 1 has 2"), "{e}");
    std::fs::write(&p, "x,y\n1,2\n3,oops\n").unwrap();
    let e = io::load(&p, None).unwrap_err().to_string();
    assert!(e.contains("line 3, column 2") && e.contains("oops"), "{e}");
    let m = t64(&[2, 2], &[0.1, -2.0, 1e-7, 3.0]);
    io::save(&p, &m).unwrap();
    assert_eq!(io::load(&p, None).unwrap(), m);
    io::save(&p, &ti(&[3], &[1, 2, 3])).unwrap();
    check(&io::load(&p, None).unwrap(), &[3, 1], &[1.0, 2.0, 3.0], 0.0);
    assert!(io::save(&p, &t32(&[1, 1, 1], &[1.0])).is_err());
}

#[test]
fn truncated_npy_reports_sizes() {
    let dir = scratch("truncated");
    let p = dir.join("x.npy");
    io::save(&p, &t64(&[1797, 64], &vec![0.0; 1797 * 64])).unwrap();
    let mut bytes = std::fs::read(&p).unwrap();
    bytes.truncate(128 + 1000);
    std::fs::write(&p, &bytes).unwrap();
    let e = io::load(&p, None).unwrap_err().to_string();
    assert!(
        e.ends_with("x.npy: truncated: header says 1797×64 f64 but file holds 1000 bytes of data (needs 920064)"),
        "{e}"
    );
    std::fs::write(&p, b"PK\x03\x04 not numpy").unwrap();
    let e = io::load(&p, None).unwrap_err().to_string();
    assert!(e.ends_with("x.npy: not a .npy file (bad magic)"), "{e}");
    let missing = dir.join("missing.npy");
    assert!(matches!(io::load(&missing, None), Err(KernelError::Io { .. })));
    assert!(io::load(&dir.join("x.bin"), None).is_err());
}

#[test]
fn loaded_tensors_are_checked_against_declarations() {
    let p = Path::new("data/x.npy");
    let t = t64(&[1797, 65], &vec![0.0; 1797 * 65]);
    let e = io::check_loaded(p, &t, Some(DType::F32), Some(&[1797, 64])).unwrap_err();
    assert!(matches!(e, KernelError::FileMismatch { .. }));
    assert_eq!(e.to_string(), "data/x.npy: expected f32 [1797, 64] but the file holds f64 [1797, 65]");
    assert!(io::check_loaded(p, &t, Some(DType::F64), None).is_ok());
    assert!(io::check_loaded(p, &t, None, Some(&[1797, 65])).is_ok());
}

/// Every prefix and many single-byte corruptions of each valid file must give `Ok` or an
/// `Err` naming the file, never a panic.
#[test]
fn corrupt_files_never_panic() {
    let dir = scratch("corrupt");
    let mut inputs: Vec<(String, Vec<u8>)> = Vec::new();
    for name in ["f8_fortran.npy", "i8_big.npy", "f4_v2.npy", "two.npz", "mixed.safetensors"] {
        inputs.push((name.to_string(), std::fs::read(data(name)).unwrap()));
    }
    inputs.push(("c.csv".into(), b"a,b\n1,2\n3,4\n".to_vec()));
    for (name, bytes) in &inputs {
        let ext = name.rsplit('.').next().unwrap();
        let p = dir.join(format!("bad.{ext}"));
        let entry = if ext == "npz" { Some("x") } else { None };
        let mut variants: Vec<Vec<u8>> = (0..bytes.len()).map(|n| bytes[..n].to_vec()).collect();
        let mut seed = 0x9e3779b97f4a7c15u64;
        for _ in 0..300 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            let mut v = bytes.clone();
            let at = (seed >> 33) as usize % v.len();
            v[at] = (seed >> 13) as u8;
            variants.push(v);
        }
        variants.push(vec![0xff; 64]);
        for v in variants {
            std::fs::write(&p, &v).unwrap();
            let r = if ext == "safetensors" {
                io::load_all_safetensors(&p).map(|_| ())
            } else {
                io::load(&p, entry).map(|_| ())
            };
            if let Err(e) = r {
                assert!(e.to_string().contains("bad."), "{name}: {e}");
            }
        }
    }
}

#[test]
fn text_files_are_vectors_of_bytes() {
    let dir = scratch("text");
    let p = dir.join("hello.txt");
    let text = "héllo\n\u{1F600}";
    std::fs::write(&p, text).unwrap();
    let t = io::load(&p, None).unwrap();
    let want: Vec<i32> = text.bytes().map(i32::from).collect();
    assert_eq!(t.shape(), &[want.len()]);
    assert_eq!(t.as_i32().unwrap(), want.as_slice());
    assert_eq!(io::shape_of(&p, None).unwrap(), Some(vec![want.len()]));
    let out = dir.join("out.txt");
    io::save(&out, &t).unwrap();
    assert_eq!(std::fs::read_to_string(&out).unwrap(), text);
    // A value that is not a byte is refused, and the earlier file stays as it was.
    let bad = ti(&[3], &[104, 256, -1]);
    let e = io::save(&out, &bad).unwrap_err().to_string();
    assert!(e.contains("value 256 at position 1 is not a byte (0 to 255)"), "{e}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), text);
    let e = io::save(&out, &t32(&[2], &[1.0, 2.0])).unwrap_err().to_string();
    assert!(e.contains("i32 bytes"), "{e}");
    let e = io::save(&out, &ti(&[1, 2], &[1, 2])).unwrap_err().to_string();
    assert!(e.contains("rank-2"), "{e}");
    // An empty file is an empty vector.
    std::fs::write(&p, "").unwrap();
    assert_eq!(io::load(&p, None).unwrap().shape(), &[0]);
}

#[test]
fn little_endian_bytes_round_trip_every_element_type() {
    use kernels::io::{push_le_data, tensor_from_le};
    use kernels::DType;
    let f = Tensor::from_f32(vec![2, 3], vec![1.5, -0.0, f32::INFINITY, f32::NAN, 1e-40, 7.0]).unwrap();
    let cases = [
        f.clone(),
        f.cast(DType::F64),
        f.cast(DType::Bf16),
        f.cast(DType::F16),
        Tensor::from_i32(vec![4], vec![0, -1, i32::MAX, i32::MIN]).unwrap(),
        Tensor::from_bool(vec![3], vec![true, false, true]).unwrap(),
        Tensor::from_f32(vec![0, 5], vec![]).unwrap(),
    ];
    for t in cases {
        let mut bytes = vec![9u8];
        push_le_data(&mut bytes, &t);
        assert_eq!(bytes.len(), 1 + t.len() * t.dtype().size_in_bytes(), "{:?}", t.dtype());
        // Bytes as the formats write them: element by element, little-endian.
        if t.dtype() == DType::F32 && !t.is_empty() {
            assert_eq!(&bytes[1..5], &1.5f32.to_le_bytes());
        }
        let back = tensor_from_le(t.dtype(), t.shape().to_vec(), &bytes[1..]).unwrap();
        assert_eq!(back.shape(), t.shape());
        assert_eq!(format!("{:?}", back.to_f64_vec()), format!("{:?}", t.to_f64_vec()), "{:?}", t.dtype());
        // One byte too few or too many, or a shape whose size overflows, is an error.
        assert!(t.is_empty() || tensor_from_le(t.dtype(), t.shape().to_vec(), &bytes[1..bytes.len() - 1]).is_err());
        assert!(tensor_from_le(t.dtype(), t.shape().to_vec(), &[&bytes[1..], &[0u8][..]].concat()).is_err());
        assert!(tensor_from_le(t.dtype(), vec![usize::MAX, 2], &bytes[1..]).is_err());
    }
}
