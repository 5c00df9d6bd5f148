//! The msl language: front end (lexer, parser, modules, shape checker), typed IR and interpreter.
//!
//! This crate knows nothing of Cranelift, the LSP, MPI or CUDA; later stages consume its typed IR.

pub mod autodiff;
pub mod check;
pub mod diag;
pub mod dist;
pub mod dryrun;
pub mod ide;
pub mod interp;
pub mod ir;
pub mod passes;
pub mod shard;
pub mod source;
pub mod spec;
pub mod syntax;
pub mod types;

// The class patterns and their complements that the primitive table writes (`ir::prim`), named
// `crate::unary_prims!()`, `crate::not_unary_prims!()` etc.
pub(crate) use ir::prim::{
    along_prims, along_rules, binary_prims, collective_prims, not_along_prims, not_binary_prims, not_collective_prims,
    not_reduce_prims, not_unary_prims, other_prims, reduce_prims, unary_prims, unary_rules,
};
