//! The CUDA code generator (`jit::cuda`) over every fused tree the JIT meets in the spec
//! programs and in random programs: each kernel's CUDA C compiles with NVRTC to a CUBIN for
//! sm_90 (no GPU needed; `scripts/setup.sh` installs NVRTC, and the test is skipped with a
//! printed reason where it is absent), and the same source, compiled for the host by the C++
//! compiler with CUDA's few built-ins defined, computes what the Cranelift kernel of the tree
//! computes on broadcast inputs (exactly for bools, to 1e-5 relative for f32, as the contract
//! bounds a device's results). So the generator's semantics are checked on this machine, and
//! only the GPU's own math library is left for a GPU machine.

#[path = "../../kernels/tests/support/cuda_host.rs"]
mod cuda_host;

use cuda_host::{close, float, from_bytes, Rng};
use jit::codegen::{Jit, Spec};
use jit::fuse::{self, Node, Tree, Typed};
use jit::{cuda, exec};
use kernels::{DType, Tensor};
use std::path::{Path, PathBuf};

/// Every distinct fused tree of the spec files' programs and of `n` random programs, at -O1.
fn trees(n: u64) -> Vec<(Tree, Typed)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../spec");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().path()).collect();
    files.retain(|p| p.extension().is_some_and(|e| e == "md"));
    files.sort();
    let ((), trees) = jit::recording_trees(|| {
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap();
            for b in lang::spec::parse_blocks(&text) {
                let runs = b.expect.as_ref().is_some_and(|(kind, ..)| kind == "output");
                // Sharded blocks and files the block writes are the spec harness's business.
                if runs && !b.code.contains("mesh ") && !b.code.contains("save(") {
                    let _ = jit::run_block(&b.code, &root, jit::Options::level(1));
                }
            }
        }
        for seed in 1..=n {
            let _ = jit::run_block(&jit::proggen::program(seed), Path::new("."), jit::Options::level(1));
        }
    });
    trees
}

/// NVRTC, or the reason the test cannot run.
fn nvrtc() -> Option<(i32, i32)> {
    match kernels::cuda::nvrtc_version() {
        Ok(v) => Some(v),
        Err(why) => {
            println!("skipped: {why}");
            None
        }
    }
}

#[test]
fn every_fused_tree_compiles_to_an_sm_90_cubin() {
    let Some((major, minor)) = nvrtc() else { return };
    let trees = trees(40);
    assert!(trees.len() >= 50, "only {} distinct trees", trees.len());
    let mut sources = Vec::new();
    for (i, (tree, typed)) in trees.iter().enumerate() {
        let src =
            cuda::source(tree, typed, &format!("k{i}")).unwrap_or_else(|| panic!("no source for {}", tree.term()));
        sources.push(src);
    }
    // Several kernels per translation unit: one NVRTC call each.
    let mut bytes = 0;
    for chunk in sources.chunks(40) {
        let unit = chunk.join("\n");
        let cubin =
            kernels::cuda::compile_cubin(&unit, "sm_90", cuda::OPTIONS).unwrap_or_else(|e| panic!("{e}\n{unit}"));
        assert_eq!(&cubin[..4], b"\x7fELF", "a CUBIN is an ELF file");
        bytes += cubin.len();
    }
    println!("NVRTC {major}.{minor}: {} kernels compiled for sm_90, {bytes} bytes of CUBIN", sources.len());
}

/// `extern "C" void run_{name}(ins, out, n, rank, dims, strides)`: fills the kernel's index
/// struct and runs it as one thread of one block.
fn host_wrapper(tree: &Tree, typed: &Typed, name: &str) -> String {
    let (ins, out) = cuda::param_types(tree, typed).unwrap();
    let mut s = format!(
        "extern \"C\" void run_{name}(const void* const* ins, void* out, long long n, int rank, const long long* dims, const long long* st) {{\n    {name}_index ix;\n    ix.n = n; ix.rank = rank;\n    for (int d = 0; d < {m}; ++d) {{ ix.dims[d] = dims[d];",
        m = cuda::MAX_RANK
    );
    for k in 0..ins.len() {
        s.push_str(&format!(" ix.st{k}[d] = st[{k} * {m} + d];", m = cuda::MAX_RANK));
    }
    s.push_str(" }\n    ");
    s.push_str(&format!("{name}("));
    for (k, t) in ins.iter().enumerate() {
        s.push_str(&format!("(const {t}*)ins[{k}], "));
    }
    s.push_str(&format!("({out}*)out, ix);\n}}\n"));
    s
}

/// An input of element type `d` and shape `shape`.
fn input(rng: &mut Rng, d: DType, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    match d {
        DType::F32 => Tensor::from_vec(shape.to_vec(), (0..n).map(|_| float(rng) as f32).collect::<Vec<_>>()),
        DType::F64 => Tensor::from_vec(shape.to_vec(), (0..n).map(|_| float(rng)).collect::<Vec<_>>()),
        DType::Bool => {
            Tensor::from_vec(shape.to_vec(), (0..n).map(|_| rng.next().is_multiple_of(2)).collect::<Vec<_>>())
        }
        other => panic!("no fused tree takes {other}"),
    }
    .unwrap()
}

/// Each leaf's element type, by input number.
fn leaf_types(tree: &Tree, typed: &Typed) -> Vec<DType> {
    let mut out = vec![DType::F32; tree.n_inputs];
    for (i, n) in tree.nodes.iter().enumerate() {
        if let Node::Leaf(k) = n {
            out[*k] = typed.dtype[i];
        }
    }
    out
}

#[test]
fn generated_kernels_compute_what_the_cranelift_kernels_compute() {
    let trees = trees(40);
    let mut unit = String::new();
    for (i, (tree, typed)) in trees.iter().enumerate() {
        let name = format!("k{i}");
        unit.push_str(&cuda::source(tree, typed, &name).unwrap());
        unit.push_str(&host_wrapper(tree, typed, &name));
    }
    let Some(lib) = cuda_host::build("fused", &unit) else { return };
    type Run = unsafe extern "C" fn(*const *const u8, *mut u8, i64, i32, *const i64, *const i64);
    let mut jit = Jit::new().unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut elements, mut broadcast) = (0, 0);
    let out_shape = [3usize, 37];
    for (i, (tree, typed)) in trees.iter().enumerate() {
        // Input 0 has the result's shape; the others are rows, columns or scalars, in turn.
        let shapes: Vec<Vec<usize>> = (0..tree.n_inputs)
            .map(|k| match k % 4 {
                0 => out_shape.to_vec(),
                1 => vec![out_shape[1]],
                2 => vec![],
                _ => vec![out_shape[0], 1],
            })
            .collect();
        let mut inputs: Vec<Tensor> =
            leaf_types(tree, typed).iter().zip(&shapes).map(|(&d, s)| input(&mut rng, d, s)).collect();
        broadcast += shapes.iter().filter(|s| s.as_slice() != out_shape).count();
        // The devices' reference: the tree as `KernelId::Fused` carries it, node by node.
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let reference = kernels::ops::fused(&fuse::device_tree(tree, typed).unwrap(), &refs).unwrap();
        // The Cranelift kernel, run the way the JIT runs it.
        let lay = exec::layout(&inputs).unwrap();
        let vector = fuse::vector_type(tree, typed, &inputs);
        let key = fuse::key(tree, typed, &lay.bcast, vector);
        let spec = Spec { tree, typed, bcast: &lay.bcast, vector };
        let (compiled, _) = jit.get_or_compile(&key, &spec).unwrap();
        let out_t = *typed.dtype.last().unwrap();
        let (want, _) = exec::run(compiled.f, &mut inputs, &lay, out_t, false);
        // The generated kernel: strides of each input over the result's dims (0 where broadcast).
        let m = cuda::MAX_RANK;
        let mut dims = vec![1i64; m];
        for (d, &n) in out_shape.iter().enumerate() {
            dims[d] = n as i64;
        }
        let mut strides = vec![0i64; m * inputs.len()];
        for (k, t) in inputs.iter().enumerate() {
            let off = out_shape.len() - t.rank();
            let mut s = 1i64;
            for d in (0..t.rank()).rev() {
                if t.shape()[d] != 1 {
                    strides[k * m + off + d] = s;
                }
                s *= t.shape()[d] as i64;
            }
        }
        let n: usize = out_shape.iter().product();
        let mut got = vec![0u64; n];
        let ptrs: Vec<*const u8> = inputs.iter().map(|t| t.storage().addr() as *const u8).collect();
        // SAFETY: `run_k{i}` takes one pointer per input, each to a live tensor of the element
        // type the kernel was generated for and of the shape the strides describe, and `got`
        // holds `n` elements of the output type.
        unsafe {
            let run: libloading::Symbol<Run> = lib.get(format!("run_k{i}").as_bytes()).unwrap();
            run(
                ptrs.as_ptr(),
                got.as_mut_ptr() as *mut u8,
                n as i64,
                out_shape.len() as i32,
                dims.as_ptr(),
                strides.as_ptr(),
            );
        }
        let (w, g) = (want.to_f64_vec(), from_bytes(&got, out_t, n));
        for (j, (a, b)) in g.iter().zip(&w).enumerate() {
            assert!(close(*a, *b, out_t), "{}: element {j}: CUDA C {a} vs Cranelift {b}", tree.term());
        }
        assert_eq!(reference.shape(), want.shape());
        for (j, (a, b)) in reference.to_f64_vec().iter().zip(&w).enumerate() {
            assert!(close(*a, *b, out_t), "{}: element {j}: reference {a} vs Cranelift {b}", tree.term());
        }
        elements += n;
    }
    println!(
        "{} generated kernels and the reference agree with Cranelift's on {elements} elements ({broadcast} broadcast inputs)",
        trees.len()
    );
}
