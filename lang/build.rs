//! Build script: generates the LALRPOP parser and embeds the msl standard library sources.
use std::fmt::Write as _;
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=src/syntax/grammar.lalrpop");
    lalrpop::Configuration::new().use_cargo_dir_conventions().process().expect("lalrpop grammar");
    embed_stdlib();
}

/// Writes `$OUT_DIR/stdlib_files.rs`: a table of (module path, source) for every `.msl` file
/// under `../stdlib`, so that the `msl` binary resolves `use nn` from any working directory.
fn embed_stdlib() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../stdlib");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    collect(&root, &root, &mut files);
    files.sort();
    let mut out = String::from("pub static STDLIB_FILES: &[(&str, &str)] = &[\n");
    for (module, path) in &files {
        println!("cargo:rerun-if-changed={}", path.display());
        writeln!(out, "    ({module:?}, include_str!({:?})),", path.display().to_string()).unwrap();
    }
    out.push_str("];\n");
    let dest = Path::new(&std::env::var("OUT_DIR").unwrap()).join("stdlib_files.rs");
    std::fs::write(dest, out).unwrap();
}

fn collect(root: &Path, dir: &Path, files: &mut Vec<(String, std::path::PathBuf)>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            println!("cargo:rerun-if-changed={}", path.display());
            collect(root, &path, files);
        } else if path.extension().is_some_and(|e| e == "msl") {
            let rel = path.strip_prefix(root).unwrap().with_extension("");
            let module =
                rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect::<Vec<_>>().join(".");
            files.push((module, path.canonicalize().unwrap()));
        }
    }
}
