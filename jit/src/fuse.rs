//! Finding fusable trees in the typed IR and typing them at run time.
//!
//! A tree is a maximal connected set of elementwise primitive applications whose static element
//! types are float or bool. Its leaves are the subexpressions the interpreter evaluates (locals,
//! calls, matrix products, reductions, anything not elementwise); literals become constants in
//! the compiled code. Shapes are not part of a tree: they arrive with the inputs at run time,
//! so one compiled loop serves every size.
//!
//! Element types are decided at run time from the inputs, by the same rules the interpreter
//! applies op by op (`interp::prims`): a rank-0 operand takes the element type of a tensor
//! operand, otherwise the wider type wins; comparisons give bool. A tree whose inputs need a
//! rule the JIT does not implement (any i32 value) is declined and runs op by op.

use kernels::ops::{BinaryOp, UnaryOp};
use kernels::{DType, Tensor};
use lang::ir::{Expr, ExprKind, Local, Prim, SpanId};
use lang::types::TensorTy;
use lang::types::{Elem, ElemTy, ShapeItem, Type};
use std::collections::HashMap;
use std::fmt::Write as _;

/// One node of a fused tree; nodes are stored children first, the root last.
#[derive(Clone, Debug)]
pub enum Node {
    /// Input number `i` (leaves in pre-order; a repeated local is one input).
    Leaf(usize),
    /// A literal, as the interpreter's rank-0 tensor.
    Const(Tensor),
    /// An elementwise operation; `to` is the target of a `Cast`.
    Op { op: ElemOp, to: Option<DType>, args: Vec<usize> },
}

/// An operation a fused tree computes: a kernel's unary or binary operation, `where`, or a
/// conversion. Code generators (Cranelift here, CUDA C in `kernels::cuda::elem`) lower these,
/// not primitives: [`elem_op`] is the one map from the IR's elementwise primitives.
pub use kernels::ops::ElemOp;

/// The operation of an elementwise primitive (`Prim::is_elementwise`), through the kernels'
/// map (`lang::ir::eval`); `None` for any other primitive.
pub fn elem_op(p: Prim) -> Option<ElemOp> {
    use lang::ir::eval::{binary_op, unary_op};
    if p == Prim::Where {
        return Some(ElemOp::Where);
    }
    if p == Prim::Cast {
        return Some(ElemOp::Cast);
    }
    unary_op(p).map(ElemOp::Unary).or_else(|| binary_op(p).map(ElemOp::Binary))
}

/// The tree as devices take it (`KernelId::Fused`), or `None` when a constant is not a scalar.
pub fn device_tree(tree: &Tree, typed: &Typed) -> Option<kernels::ops::Fused> {
    use kernels::ops::FusedNode;
    let nodes = tree
        .nodes
        .iter()
        .map(|n| {
            Some(match n {
                Node::Leaf(k) => FusedNode::Input(*k),
                Node::Const(c) => FusedNode::Const(c.scalar_value_f64()?),
                Node::Op { op, args, .. } => FusedNode::Op(*op, args.clone()),
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(kernels::ops::Fused {
        nodes,
        dtype: typed.dtype.clone(),
        operand: typed.operand.clone(),
        inputs: tree.n_inputs,
    })
}

/// A fused tree of elementwise primitives.
#[derive(Clone, Debug)]
pub struct Tree {
    pub nodes: Vec<Node>,
    pub n_inputs: usize,
    pub span: SpanId,
}

impl Tree {
    /// The primitive names of the tree's operations, children first.
    pub fn op_names(&self) -> Vec<&'static str> {
        self.nodes
            .iter()
            .filter_map(|n| match n {
                Node::Op { op, .. } => Some(op.name()),
                _ => None,
            })
            .collect()
    }

    /// The tree as a term, inputs written `in0`, `in1`, … (for `--explain`).
    pub fn term(&self) -> String {
        let mut s = String::new();
        self.write_term(self.nodes.len() - 1, &mut s);
        s
    }

    fn write_term(&self, i: usize, s: &mut String) {
        match &self.nodes[i] {
            Node::Leaf(k) => {
                let _ = write!(s, "in{k}");
            }
            Node::Const(t) => {
                let _ = match t.as_f32() {
                    Some(v) => write!(s, "{}", v[0]),
                    None => write!(s, "{}", t.scalar_value_f64().unwrap_or(f64::NAN)),
                };
            }
            Node::Op { op, to, args } => {
                s.push_str(op.name());
                if let Some(d) = to {
                    let _ = write!(s, "<{d}>");
                }
                s.push('(');
                for (j, a) in args.iter().enumerate() {
                    if j > 0 {
                        s.push_str(", ");
                    }
                    self.write_term(*a, s);
                }
                s.push(')');
            }
        }
    }
}

/// The elementwise primitives the JIT compiles: those with an [`ElemOp`].
pub fn is_elementwise(p: Prim) -> bool {
    elem_op(p).is_some()
}

/// A tensor type whose element type the JIT handles (float or bool).
fn elem_ok(ty: &Type) -> bool {
    match ty {
        // The storage-only types are computed by the interpreter (in f32, rounded to storage).
        Type::Tensor(TensorTy { elem: Elem::T(t), .. }) => !matches!(t, ElemTy::I32 | ElemTy::Bf16 | ElemTy::F16),
        Type::Tensor(TensorTy { elem: Elem::WeakFloat, .. }) => true,
        _ => false,
    }
}

/// An expression the tree takes in as an interior node: an elementwise primitive over float or
/// bool tensors whose operands are float or bool tensors too; or arithmetic on models (which
/// the interpreter runs over their flat parameter buffers, see [`lang::interp::ModelValue::flat`]),
/// whose operands are models of its type or scalars.
fn interior(e: &Expr) -> bool {
    match &e.kind {
        ExprKind::Prim { prim, args, .. } if e.ty.is_model() => {
            let operand = |a: &Expr| {
                a.ty == e.ty
                    || (elem_ok(&a.ty) && matches!(&a.ty, Type::Tensor(TensorTy { shape: s, .. }) if s.is_empty()))
            };
            is_elementwise(*prim) && args.iter().all(operand)
        }
        ExprKind::Prim { prim, args, .. } => {
            is_elementwise(*prim) && elem_ok(&e.ty) && args.iter().all(|a| elem_ok(&a.ty))
        }
        _ => false,
    }
}

/// Whether `e` may root a fused tree at all: an interior node whose static shape is not a
/// scalar (scalar arithmetic is host code, cheaper in the interpreter), or model arithmetic.
pub fn may_root(e: &Expr) -> bool {
    if e.ty.is_model() {
        return interior(e);
    }
    let Type::Tensor(TensorTy { shape, .. }) = &e.ty else {
        return false;
    };
    let maybe_nonscalar = shape.iter().any(|i| match i {
        ShapeItem::Dim(d) => d.as_const() != Some(1),
        ShapeItem::Rest(_) => true,
    });
    maybe_nonscalar && interior(e)
}

/// Whether `e` becomes a constant of the tree: a float or bool literal.
fn is_const(e: &Expr) -> bool {
    matches!(e.kind, ExprKind::Lit(_)) && elem_ok(&e.ty)
}

/// The value of a constant (see [`is_const`]), exactly as the interpreter makes it.
fn constant(e: &Expr) -> Option<Tensor> {
    match &e.kind {
        ExprKind::Lit(l) => lang::interp::accel::literal(l, &e.ty),
        _ => None,
    }
}

/// Builds the tree rooted at `e` (which must satisfy [`may_root`]) and collects its leaves.
/// A local read several times in the tree is one input (reading a local has no effect), and an
/// operation that occurs several times on the same operands is one node, computed once per
/// element (every node is pure; `-O2` copies a value read several times by one tree into it).
pub fn analyse(e: &Expr) -> (Tree, Vec<&Expr>) {
    let mut b = Builder { nodes: Vec::new(), leaves: Vec::new(), locals: Vec::new(), seen: HashMap::new() };
    b.build(e);
    (Tree { nodes: b.nodes, n_inputs: b.leaves.len(), span: e.span }, b.leaves)
}

/// What makes two nodes the same: an operation on the same nodes, an input, or a constant
/// of one element type and bits.
#[derive(PartialEq, Eq, Hash)]
enum Key {
    Op(ElemOp, Option<DType>, Vec<usize>),
    Leaf(usize),
    Const(DType, u64),
}

struct Builder<'e> {
    nodes: Vec<Node>,
    leaves: Vec<&'e Expr>,
    locals: Vec<(Local, usize)>,
    seen: HashMap<Key, usize>,
}

impl<'e> Builder<'e> {
    fn build(&mut self, e: &'e Expr) -> usize {
        if let ExprKind::Prim { prim, args, attrs } = &e.kind {
            if let Some(op) = elem_op(*prim).filter(|_| interior(e)) {
                let args: Vec<usize> = args.iter().map(|a| self.build(a)).collect();
                let to = (op == ElemOp::Cast).then(|| lang::interp::accel::dtype(attrs.dtype.unwrap_or(ElemTy::F32)));
                return self.node(Key::Op(op, to, args.clone()), Node::Op { op, to, args });
            }
        }
        if let Some(t) = is_const(e).then(|| constant(e)).flatten() {
            let key = t.scalar_value_f64().map(|v| Key::Const(t.dtype(), v.to_bits()));
            return match key {
                Some(k) => self.node(k, Node::Const(t)),
                None => self.push(Node::Const(t)),
            };
        }
        if let Some(&(_, i)) = self.locals.iter().find(|(l, _)| matches!(e.kind, ExprKind::Local(m) if m == *l)) {
            return self.node(Key::Leaf(i), Node::Leaf(i));
        }
        if let ExprKind::Local(l) = e.kind {
            self.locals.push((l, self.leaves.len()));
        }
        self.leaves.push(e);
        let i = self.leaves.len() - 1;
        self.node(Key::Leaf(i), Node::Leaf(i))
    }

    /// The node `key` names, pushed as `node` the first time.
    fn node(&mut self, key: Key, node: Node) -> usize {
        if let Some(&i) = self.seen.get(&key) {
            return i;
        }
        let i = self.push(node);
        self.seen.insert(key, i);
        i
    }

    fn push(&mut self, node: Node) -> usize {
        self.nodes.push(node);
        self.nodes.len() - 1
    }
}

/// The leaves of the tree rooted at `e`, in the order of [`analyse`], without building it.
pub fn leaves<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
    if let ExprKind::Prim { args, .. } = &e.kind {
        if interior(e) {
            for a in args {
                leaves(a, out);
            }
            return;
        }
    }
    if is_const(e) {
        return;
    }
    if let ExprKind::Local(l) = e.kind {
        if out.iter().any(|x| matches!(x.kind, ExprKind::Local(m) if m == l)) {
            return;
        }
    }
    out.push(e);
}

/// The element types of a tree for given inputs.
#[derive(Clone, Debug)]
pub struct Typed {
    /// Each node's result element type.
    pub dtype: Vec<DType>,
    /// Each node's operand element type (after the interpreter's unification); for `where`,
    /// that of the two branches.
    pub operand: Vec<DType>,
}

fn width(d: DType) -> u8 {
    match d {
        DType::Bool => 0,
        DType::I32 => 1,
        DType::Bf16 | DType::F16 => 2,
        DType::F32 => 3,
        DType::F64 => 4,
    }
}

/// `ir::eval::unify_dtypes` on (element type, is rank 0) pairs.
fn unify(a: (DType, bool), b: (DType, bool)) -> DType {
    if a.0 == b.0 {
        a.0
    } else if a.1 != b.1 {
        // A scalar adapts to a tensor.
        if a.1 {
            b.0
        } else {
            a.0
        }
    } else if width(a.0) >= width(b.0) {
        a.0
    } else {
        b.0
    }
}

/// Types the tree for inputs of these element types and ranks, or `None` when some operation
/// would meet an element type the JIT does not compile (i32 anywhere, arithmetic on bool).
pub fn type_tree(tree: &Tree, inputs: &[Tensor]) -> Option<Typed> {
    let n = tree.nodes.len();
    let mut dtype = Vec::with_capacity(n);
    let mut operand = Vec::with_capacity(n);
    let mut scalar = Vec::with_capacity(n);
    let is_float = |d: DType| d.is_float();
    for node in &tree.nodes {
        let (d, o, s) = match node {
            Node::Leaf(i) => {
                let t = inputs.get(*i)?;
                (t.dtype(), t.dtype(), t.rank() == 0)
            }
            Node::Const(t) => (t.dtype(), t.dtype(), true),
            Node::Op { op, to, args } => {
                let arg = |k: usize| (dtype[args[k]], scalar[args[k]]);
                let s = args.iter().all(|&a| scalar[a]);
                if args.iter().any(|&a| dtype[a] == DType::I32) {
                    return None;
                }
                match op {
                    ElemOp::Unary(UnaryOp::Not) => {
                        let x = arg(0).0;
                        (x == DType::Bool).then_some(())?;
                        (x, x, s)
                    }
                    ElemOp::Unary(_) => {
                        let x = arg(0).0;
                        is_float(x).then_some(())?;
                        (x, x, s)
                    }
                    ElemOp::Cast => {
                        let to = to.filter(|t| *t != DType::I32)?;
                        (to, arg(0).0, s)
                    }
                    ElemOp::Where => {
                        (arg(0).0 == DType::Bool).then_some(())?;
                        let u = unify(arg(1), arg(2));
                        (u, u, s)
                    }
                    ElemOp::Binary(b) if b.is_comparison() => (DType::Bool, unify(arg(0), arg(1)), s),
                    ElemOp::Binary(BinaryOp::And | BinaryOp::Or) => {
                        let u = unify(arg(0), arg(1));
                        (u == DType::Bool).then_some(())?;
                        (u, u, s)
                    }
                    ElemOp::Binary(_) => {
                        let u = unify(arg(0), arg(1));
                        is_float(u).then_some(())?;
                        (u, u, s)
                    }
                }
            }
        };
        dtype.push(d);
        operand.push(o);
        scalar.push(s);
    }
    Some(Typed { dtype, operand })
}

/// The vector element type the tree can run in: every input and the result have this one float
/// type, and every interior value has it or is bool (a lane mask). `None`: scalar code only.
pub fn vector_type(tree: &Tree, typed: &Typed, inputs: &[Tensor]) -> Option<DType> {
    let root = typed.dtype.last().copied()?;
    if !root.is_float() || inputs.iter().any(|t| t.dtype() != root) {
        return None;
    }
    let ok = |d: DType| d == root || d == DType::Bool;
    let all = tree.nodes.iter().enumerate().all(|(i, n)| match n {
        Node::Const(_) => true,
        _ => ok(typed.dtype[i]) && ok(typed.operand[i]),
    });
    all.then_some(root)
}

/// The compile-cache key: the tree's structure, constants and element types, which inputs are
/// broadcast along the innermost loop, and the vector type. Sizes are not part of it.
pub fn key(tree: &Tree, typed: &Typed, bcast: &[bool], vector: Option<DType>) -> String {
    let mut k = String::with_capacity(16 * tree.nodes.len());
    let _ = write!(k, "v{:?};", vector);
    for (i, n) in tree.nodes.iter().enumerate() {
        match n {
            Node::Leaf(j) => {
                let _ = write!(k, "L{j}{}{};", typed.dtype[i], if bcast[*j] { "b" } else { "" });
            }
            Node::Const(t) => {
                let bits = t.scalar_value_f64().unwrap_or(0.0).to_bits();
                let _ = write!(k, "C{}{bits:x};", t.dtype());
            }
            Node::Op { op, to, args } => {
                let _ = write!(k, "{}{:?}{}{}", op.name(), to, typed.dtype[i], typed.operand[i]);
                for a in args {
                    let _ = write!(k, ",{a}");
                }
                k.push(';');
            }
        }
    }
    k
}
