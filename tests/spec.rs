//! The literate spec harness: runs every ```` ```msl ```` block of `spec/*.md` and compares it
//! with the ```` ```error ```` or ```` ```output ```` block that follows it.
//!
//! - A block followed by an `error` block must be rejected with exactly those diagnostics, one per
//!   line as `CODE line:col: message`.
//! - Every other block is run (`main`, then its `test` blocks); its printed output must match the
//!   `output` block that follows it, if any (numbers up to float rounding, 1e-5 relative: GEMM
//!   sums in an order that depends on the CPU's vector width), and it must not fail.
//! - Every block also runs with the JIT installed at `-O0`, `-O1` and `-O2`: each outcome must be
//!   exactly the interpreter's.
//!
//! `MSL_BLESS=1 cargo test --test spec` rewrites the expectation blocks from what msl does now
//! (and adds an `error` block to a rejected block that has none); review the diff before committing.
//! `MSL_SPEC=name` runs only files whose name contains `name`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use lang::spec::{parse_blocks, run_block};

mod common;
use common::same_up_to_rounding;

fn spec_files(root: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root)
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "md")).collect())
        .unwrap_or_default();
    files.sort();
    if let Ok(only) = std::env::var("MSL_SPEC") {
        files.retain(|f| f.to_string_lossy().contains(&only));
    }
    files
}

fn main() {
    // Specs may nest deeply; run on a large stack like the CLI does.
    let h = std::thread::Builder::new().stack_size(1 << 30).spawn(run).unwrap();
    let ok = h.join().unwrap_or(false);
    std::process::exit(if ok { 0 } else { 1 });
}

fn run() -> bool {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("spec");
    let bless = std::env::var_os("MSL_BLESS").is_some();
    let (mut passed, mut failed) = (0usize, 0usize);
    let (mut jit_calls, mut jit_fallbacks, mut jit_blocks) = (0u64, 0u64, 0usize);
    let (mut loops_native, mut loops_interp) = (0u64, 0u64);
    let (mut bodies, mut bodies_interp) = (0usize, 0usize);
    let mut report = String::new();
    for file in spec_files(&root) {
        let text = std::fs::read_to_string(&file).unwrap();
        let blocks = parse_blocks(&text);
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        let mut edits: Vec<(usize, usize, Vec<String>)> = Vec::new();
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        for b in &blocks {
            let label = format!("{name}:{}", b.start + 1);
            let outcome = run_block(&b.code, &root);
            let (actual_kind, actual) = (outcome.kind(), outcome.text().to_string());
            for level in [0u8, 1, 2] {
                let (jit, r) = jit::run_block(&b.code, &root, jit::Options::level(level));
                if level == 2 {
                    let r = r.borrow();
                    jit_calls += r.calls();
                    jit_fallbacks += r.fallbacks();
                    jit_blocks += usize::from(r.calls() > 0);
                    loops_native += r.loops.iter().map(|l| l.calls).sum::<u64>();
                    loops_interp += r.interpreted_loops();
                    bodies += r.bodies.len() - r.interpreted_bodies();
                    bodies_interp += r.interpreted_bodies();
                }
                if jit.kind() != actual_kind || jit.text() != actual {
                    failed += 1;
                    let _ = writeln!(
                        report,
                        "\n--- {label} [jit -O{level}]\n{}interpreter:\n```{actual_kind}\n{actual}```\njit -O{level}:\n```{}\n{}```",
                        b.code,
                        jit.kind(),
                        jit.text()
                    );
                }
            }
            if actual_kind == "output" && b.code.contains("fn main(") {
                if let Some(n) = mesh_devices(&b.code) {
                    match mpi_outcome(&b.code, &root, n, &label) {
                        Ok(None) => {}
                        Ok(Some(out)) if same_up_to_rounding(&out, &actual) => {}
                        Ok(Some(out)) => {
                            failed += 1;
                            let _ = writeln!(
                                report,
                                "\n--- {label} [mpirun -n {n}]\n{}one process:\n```output\n{actual}```\n{n} ranks:\n```\n{out}```",
                                b.code
                            );
                        }
                        Err(e) => {
                            failed += 1;
                            let _ = writeln!(report, "\n--- {label} [mpirun -n {n}]\n{}{e}", b.code);
                        }
                    }
                }
            }
            let ok = match (&b.expect, actual_kind) {
                // Printed numbers may differ in their last digits from one CPU to another: matrix
                // products and convolutions go through a GEMM whose microkernel, hence its
                // summation order, depends on the vector width (AVX2 or AVX-512).
                (Some((k, _, _, content)), ak) => {
                    k == ak && (content == &actual || (ak == "output" && same_up_to_rounding(content, &actual)))
                }
                (None, "output") => !actual.contains("error["),
                (None, _) => false,
            };
            if ok {
                passed += 1;
                continue;
            }
            if bless {
                let mut new = vec![format!("```{actual_kind}")];
                new.extend(actual.lines().map(str::to_string));
                new.push("```".to_string());
                match &b.expect {
                    Some((_, first, last, _)) => edits.push((*first, *last + 1, new)),
                    None => {
                        let end = b.start + b.code.lines().count() + 2;
                        new.insert(0, String::new());
                        edits.push((end, end, new));
                    }
                }
                passed += 1;
                continue;
            }
            failed += 1;
            let expected = match &b.expect {
                Some((k, _, _, c)) => format!("```{k}\n{c}```"),
                None => "(no error)".to_string(),
            };
            let _ = writeln!(
                report,
                "\n--- {label}\n{}expected:\n{expected}\nactual:\n```{actual_kind}\n{actual}```",
                b.code
            );
        }
        if bless && !edits.is_empty() {
            edits.sort_by_key(|e| std::cmp::Reverse(e.0));
            for (a, z, new) in edits {
                lines.splice(a..z.min(lines.len()), new);
            }
            std::fs::write(&file, lines.join("\n") + "\n").unwrap();
        }
    }
    print!("{report}");
    println!("spec: {passed} passed, {failed} failed");
    println!("spec [jit -O2]: {jit_calls} fused calls in {jit_blocks} blocks, {jit_fallbacks} fallbacks");
    println!("spec [jit -O2]: {loops_native} native runs of scalar loops, {loops_interp} interpreted loop runs");
    println!("spec [jit -O2]: {bodies} function bodies compiled to native code, {bodies_interp} interpreted");
    failed == 0
}

/// The number of ranks a block's `mesh M[a = 2, b = 2]` declares (none for fewer than two).
fn mesh_devices(code: &str) -> Option<usize> {
    let line = code.lines().find(|l| l.trim_start().starts_with("mesh "))?;
    let inner = line.split_once('[')?.1.split_once(']')?.0;
    let n: usize = inner.split(',').filter_map(|p| p.split_once('=')?.1.trim().parse::<usize>().ok()).product();
    (n > 1).then_some(n)
}

/// Runs a block under `mpirun -n n` (interpreter); `Ok(None)` when `mpirun` is absent (said once).
fn mpi_outcome(code: &str, root: &Path, n: usize, label: &str) -> Result<Option<String>, String> {
    static WARNED: std::sync::Once = std::sync::Once::new();
    if std::process::Command::new("mpirun").arg("--version").output().is_err() {
        WARNED.call_once(|| println!("spec: skipping the multi-rank runs of mesh blocks: `mpirun` is not installed"));
        return Ok(None);
    }
    // Next to the spec files, so that `use "./fixtures/…"` resolves as it does in-process.
    let file = root.join(format!(".mpi-{}-{}.msl", std::process::id(), label.replace([':', '.'], "_")));
    std::fs::write(&file, code).map_err(|e| e.to_string())?;
    // Run in a folder of its own, as the in-process runs are, so that what a block saves
    // (`save("big.ckpt/", m)`) lands there, not among the spec files (relative loads are also
    // tried next to the source, so `data/…` still resolves).
    let work = std::env::temp_dir().join(format!(
        "msl-spec-mpi-{}-{}",
        std::process::id(),
        label.replace([':', '.', '/'], "_")
    ));
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let mut cmd = std::process::Command::new("mpirun");
    let _session = common::Session::new(&mut cmd);
    let out = cmd
        .args(["-n", &n.to_string(), "--oversubscribe"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .arg(env!("CARGO_BIN_EXE_msl"))
        .arg("run")
        .arg(&file)
        .current_dir(&work)
        .output()
        .map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_dir_all(&work);
    if !out.status.success() {
        return Err(format!(
            "exit {:?}\nstdout:\n{}stderr:\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(Some(String::from_utf8_lossy(&out.stdout).into_owned()))
}
