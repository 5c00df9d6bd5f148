//! Hostile files: FIFOs, devices, links and directories are refused without blocking; saves are
//! atomic and never write through a link; headers that lie about sizes are refused before
//! their data is read; CSV values that do not fit the asked element type are errors.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use kernels::io;
use kernels::{DType, Tensor};

use crate::{t32, t64};

fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kernels-io-safety").join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `f` on another thread and fails when it takes more than 10 s (a blocked open of a FIFO
/// would otherwise hang the test binary).
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|_| panic!("{what}: still blocked after 10 s"))
}

fn mkfifo(p: &Path) {
    let ok = std::process::Command::new("mkfifo").arg(p).status().unwrap().success();
    assert!(ok, "mkfifo {}", p.display());
}

#[test]
fn special_files_are_refused_without_blocking() {
    let dir = scratch("special");
    for ext in ["npy", "npz", "safetensors", "csv"] {
        let p = dir.join(format!("fifo.{ext}"));
        mkfifo(&p);
        let q = p.clone();
        let e = within("load of a FIFO", move || io::load(&q, None).unwrap_err().to_string());
        assert!(e.contains("fifo.") && e.ends_with("cannot read: not a regular file (a FIFO)"), "{e}");
        let q = p.clone();
        let e = within("save to a FIFO", move || io::save(&q, &t32(&[1], &[1.0])).unwrap_err().to_string());
        assert!(e.ends_with("cannot write: not a regular file (a FIFO)"), "{e}");
    }
    let q = dir.join("fifo.csv");
    let e = within("model load of a FIFO", move || io::load_csv(&q, DType::F32).unwrap_err().to_string());
    assert!(e.contains("(a FIFO)"), "{e}");
    let q = dir.join("fifo.safetensors");
    within("load_all of a FIFO", move || assert!(io::load_all_safetensors(&q).is_err()));
    // Source text (the REPL's `:load`) goes through the same check.
    let q = dir.join("fifo.npy");
    let e = within("read_to_string of a FIFO", move || io::file::read_to_string(&q).unwrap_err());
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    // A link to an endless device is not read at all.
    let z = dir.join("zero.npy");
    std::os::unix::fs::symlink("/dev/zero", &z).unwrap();
    let e = within("load of /dev/zero", move || io::load(&z, None).unwrap_err().to_string());
    assert!(e.ends_with("not a regular file (a device)"), "{e}");
    let d = dir.join("folder.npy");
    std::fs::create_dir(&d).unwrap();
    assert!(io::load(&d, None).unwrap_err().to_string().ends_with("not a regular file (a directory)"));
    let e = io::save(&d, &t32(&[1], &[1.0])).unwrap_err().to_string();
    assert!(e.ends_with("cannot write: not a regular file (a directory)"), "{e}");
}

#[test]
fn saves_replace_the_file_atomically_and_never_follow_links() {
    let dir = scratch("atomic");
    let real = dir.join("real.npy");
    let old = t64(&[2], &[1.0, 2.0]);
    io::save(&real, &old).unwrap();
    let before = std::fs::read(&real).unwrap();
    let link = dir.join("link.npy");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    // A link is refused, whatever it points to, and its pointee is left as it was.
    let e = io::save(&link, &t32(&[3], &[9.0, 9.0, 9.0])).unwrap_err().to_string();
    assert!(e.contains("link.npy") && e.ends_with("cannot write: not a regular file (a symbolic link)"), "{e}");
    assert_eq!(std::fs::read(&real).unwrap(), before);
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    let dangling = dir.join("dangling.safetensors");
    std::os::unix::fs::symlink(dir.join("nowhere.safetensors"), &dangling).unwrap();
    assert!(io::save(&dangling, &old).is_err());
    assert!(!dir.join("nowhere.safetensors").exists());
    // Loading through a link to a regular file is fine.
    assert_eq!(io::load(&link, None).unwrap(), old);

    // Every format replaces an existing file, keeps its permissions and leaves no temporary
    // file behind.
    use std::os::unix::fs::PermissionsExt;
    let new = t32(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    for ext in ["npy", "npz", "safetensors", "csv"] {
        let p = dir.join(format!("m.{ext}"));
        std::fs::write(&p, b"old contents").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        io::save(&p, &new).unwrap();
        let back = if ext == "csv" { io::load_csv(&p, DType::F32) } else { io::load(&p, None) };
        assert_eq!(back.unwrap(), new, "{ext}");
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o640, "{ext}");
    }
    let p = dir.join("named.npz");
    io::save_npz(&p, &[("a".into(), new.clone()), ("b".into(), old.clone())]).unwrap();
    assert_eq!(io::load(&p, Some("b")).unwrap(), old);
    let names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
    // A save into a folder that does not exist fails and names the file.
    let e = io::save(&dir.join("no/such/dir/x.npy"), &new).unwrap_err().to_string();
    assert!(e.contains("x.npy: cannot write:"), "{e}");
}

/// A `.npy` header for `shape` and `descr`, padded as NumPy pads it.
fn npy_header(descr: &str, shape: &str) -> Vec<u8> {
    let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(h.len() as u16).to_le_bytes());
    out.extend_from_slice(h.as_bytes());
    out
}

#[test]
fn headers_that_lie_about_sizes_are_refused_before_reading() {
    let dir = scratch("lying");
    let p = dir.join("x.npy");
    // 2^40 f64 claimed by a file of 64 bytes: refused from the file's length, without reading.
    std::fs::write(&p, npy_header("<f8", "(1099511627776,)")).unwrap();
    let e = io::load(&p, None).unwrap_err().to_string();
    assert!(
        e.ends_with("truncated: header says 1099511627776 f64 but file holds 0 bytes of data (needs 8796093022208)"),
        "{e}"
    );
    // Shapes msl cannot hold at all are refused from the header.
    std::fs::write(&p, npy_header("<f4", "(0, 4611686018427387904)")).unwrap();
    let e = io::load(&p, None).unwrap_err().to_string();
    assert!(e.contains("x.npy: size overflow: shape [0, 4611686018427387904]"), "{e}");
    std::fs::write(&p, npy_header("<f4", "(4294967296, 4294967297)")).unwrap();
    assert!(io::load(&p, None).unwrap_err().to_string().contains("size overflow"));
    std::fs::write(&p, npy_header("<f4", "(99999999999999999999999,)")).unwrap();
    assert!(io::load(&p, None).unwrap_err().to_string().contains("malformed .npy header"));
    // A header length past the end of the file.
    let mut bytes = npy_header("<f4", "(2,)");
    bytes[8..10].copy_from_slice(&u16::MAX.to_le_bytes());
    std::fs::write(&p, &bytes).unwrap();
    assert!(io::load(&p, None).unwrap_err().to_string().ends_with("truncated: the file ends inside its header"));
    let mut v2 = b"\x93NUMPY\x02\x00".to_vec();
    v2.extend_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(&p, &v2).unwrap();
    assert!(io::load(&p, None).unwrap_err().to_string().ends_with("truncated: the file ends inside its header"));
    // Text from the file is escaped in messages, so that it cannot drive the terminal.
    std::fs::write(&p, npy_header("<f4\x1b[2J\n", "(1,)")).unwrap();
    let e = io::load(&p, None).unwrap_err().to_string();
    assert!(e.contains("unsupported element type '<f4\\u{1b}[2J\\n'"), "{e}");
    let e = io::csv::parse_csv(b"a,b\n1,\x07\n", "c.csv").unwrap_err().to_string();
    assert!(e.ends_with("line 2, column 2: \"\\u{7}\" is not a number"), "{e}");
    // Extra bytes after the data of a plain .npy are ignored, as NumPy ignores them.
    let mut ok = npy_header("<f4", "(1,)");
    ok.extend_from_slice(&1.5f32.to_le_bytes());
    ok.extend_from_slice(b"trailing");
    std::fs::write(&p, &ok).unwrap();
    assert_eq!(io::load(&p, None).unwrap().as_f32().unwrap(), &[1.5]);
}

/// An archive of members (name, bytes) written with `method`.
fn zip_of(path: &Path, members: &[(&str, Vec<u8>)], method: zip::CompressionMethod) {
    let mut z = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let options = zip::write::SimpleFileOptions::default().compression_method(method);
    for (name, bytes) in members {
        z.start_file(*name, options).unwrap();
        z.write_all(bytes).unwrap();
    }
    z.finish().unwrap();
}

#[test]
fn npz_members_are_checked_before_they_are_inflated() {
    let dir = scratch("npz");
    let p = dir.join("a.npz");
    for method in [zip::CompressionMethod::Stored, zip::CompressionMethod::Deflated] {
        // The header claims 2^40 doubles; the member holds 8 bytes of data.
        let mut lying = npy_header("<f8", "(1099511627776,)");
        lying.extend_from_slice(&1.0f64.to_le_bytes());
        zip_of(&p, &[("x.npy", lying)], method);
        let e = io::load(&p, None).unwrap_err().to_string();
        assert!(e.contains("a.npz:x: truncated: header says 1099511627776 f64 but file holds 8 bytes"), "{e}");
        // A megabyte of zeros behind a header that describes one float: refused after one
        // more byte, not inflated.
        let mut bomb = npy_header("<f4", "(1,)");
        bomb.extend(std::iter::repeat_n(0u8, 4 + (1 << 20)));
        zip_of(&p, &[("x.npy", bomb)], method);
        let e = io::load(&p, None).unwrap_err().to_string();
        assert!(
            e.contains("a.npz:x: corrupt archive member: it holds more bytes than its array header describes"),
            "{e}"
        );
        let mut good = npy_header("<f4", "(2,)");
        good.extend_from_slice(&[0, 0, 0x80, 0x3f, 0, 0, 0, 0x40]);
        zip_of(&p, &[("x.npy", good.clone()), ("y.npy", vec![1, 2, 3])], method);
        assert_eq!(io::load(&p, Some("x")).unwrap().as_f32().unwrap(), &[1.0, 2.0]);
        assert!(io::load(&p, Some("y")).unwrap_err().to_string().contains("a.npz:y: not a .npy file"));
    }
}

#[test]
fn csv_values_must_fit_the_element_type() {
    let parse = |text: &str, d: DType| io::csv::parse_csv_as(text.as_bytes(), "c.csv", d);
    let e = parse("id,count\n1,12\n\n2,99999999999\n", DType::I32).unwrap_err().to_string();
    assert_eq!(
        e,
        "c.csv: row 2 (line 4), column 2: 99999999999 is outside the range of i32 (-2147483648 to 2147483647), so it cannot be loaded as i32"
    );
    let e = parse("1,2.5\n", DType::I32).unwrap_err().to_string();
    assert!(e.ends_with("row 1 (line 1), column 2: 2.5 is not a whole number, so it cannot be loaded as i32"), "{e}");
    let e = parse("1\nnan\n", DType::I32).unwrap_err().to_string();
    assert!(e.ends_with("row 2 (line 2), column 1: nan is not a number, so it cannot be loaded as i32"), "{e}");
    assert!(parse("-inf\n", DType::I32).unwrap_err().to_string().contains("-inf is outside the range of i32"));
    let t = parse("-2147483648, 2147483647\n0,-0\n", DType::I32).unwrap();
    assert_eq!(t.as_i32().unwrap(), &[i32::MIN, i32::MAX, 0, 0]);
    assert_eq!(parse("1.5,0\n", DType::F32).unwrap(), t32(&[1, 2], &[1.5, 0.0]));
    assert_eq!(parse("1.5,0\n", DType::Bool).unwrap().as_bool().unwrap(), &[true, false]);
    assert_eq!(parse("a,b\n", DType::I32).unwrap().shape(), &[0, 0]);
    assert_eq!(Tensor::from_i32(vec![0, 0], vec![]).unwrap(), parse("", DType::I32).unwrap());
}
