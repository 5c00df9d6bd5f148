//! Surface syntax: lexer, LALRPOP grammar, AST and the parse entry point with error recovery.

pub mod ast;
pub mod lexer;

use crate::diag::{Code, Diagnostic};
use crate::source::{FileId, Span};
use lalrpop_util::{lalrpop_mod, ParseError};
use lexer::Tok;

lalrpop_mod!(
    #[allow(clippy::all, clippy::pedantic, unused)]
    grammar,
    "/syntax/grammar.rs"
);

/// Deepest expression nesting the checker accepts (operators and calls, not just brackets).
pub const MAX_EXPR_DEPTH: usize = 1000;

/// Parses one file. Always returns a tree: items that could not be read become `ItemKind::Error`
/// and every problem is a diagnostic, so one run reports several syntax errors.
pub fn parse(file: FileId, src: &str) -> (ast::File, Vec<Diagnostic>) {
    let (tokens, mut diags) = lexer::lex(file, src);
    let mut recovered = Vec::new();
    let end = src.len();
    let result = grammar::FileParser::new().parse(file, &mut recovered, tokens.into_iter().map(Ok));
    for err in recovered {
        diags.push(parse_error(file, err.error, end));
    }
    let mut tree = match result {
        Ok(f) => f,
        Err(e) => {
            diags.push(parse_error(file, e, end));
            ast::File { items: vec![] }
        }
    };
    // Drop items nested too deeply for the checker's recursion; they are reported once.
    let mut kept = Vec::with_capacity(tree.items.len());
    for item in tree.items.drain(..) {
        if item_too_deep(&item) {
            diags.push(
                Diagnostic::error(
                    Code::E0106,
                    Span { end: item.span.start.saturating_add(1).min(item.span.end), ..item.span },
                    format!("expression nested more than {MAX_EXPR_DEPTH} levels deep"),
                )
                .label("in this item")
                .with_help("split the expression with `let` bindings"),
            );
            // Dropping a very deep tree recurses once per level; leaking it is cheaper and safe.
            std::mem::forget(item);
        } else {
            kept.push(item);
        }
    }
    tree.items = kept;
    (tree, diags)
}

fn describe(tok: &Tok) -> String {
    match tok {
        Tok::Semi => "end of statement".to_string(),
        Tok::Ident(s) => format!("identifier `{s}`"),
        Tok::Int(i) => format!("integer `{i}`"),
        Tok::Float(f) => format!("number `{f}`"),
        Tok::Str(_) => "string literal".to_string(),
        other => {
            let dbg = format!("{other:?}");
            format!("`{}`", token_text(other).unwrap_or(&dbg))
        }
    }
}

fn token_text(tok: &Tok) -> Option<&'static str> {
    use Tok::*;
    Some(match tok {
        Fn => "fn",
        Let => "let",
        Var => "var",
        Model => "model",
        Dim => "dim",
        Const => "const",
        Use => "use",
        Mesh => "mesh",
        Test => "test",
        If => "if",
        Else => "else",
        For => "for",
        In => "in",
        While => "while",
        Return => "return",
        Break => "break",
        Continue => "continue",
        True => "true",
        False => "false",
        LParen => "(",
        RParen => ")",
        LBracket => "[",
        RBracket => "]",
        LBrace => "{",
        RBrace => "}",
        Comma => ",",
        Dot => ".",
        DotDot => "..",
        Colon => ":",
        Arrow => "->",
        At => "@",
        Eq => "=",
        PlusEq => "+=",
        MinusEq => "-=",
        StarEq => "*=",
        SlashEq => "/=",
        EqEq => "==",
        Ne => "!=",
        Lt => "<",
        Le => "<=",
        Gt => ">",
        Ge => ">=",
        Plus => "+",
        Minus => "-",
        Star => "*",
        StarStar => "**",
        Slash => "/",
        Percent => "%",
        Bang => "!",
        AndAnd => "&&",
        OrOr => "||",
        Pipe => "|",
        _ => return None,
    })
}

fn expected_list(expected: &[String]) -> String {
    let mut names: Vec<String> = expected
        .iter()
        .map(|e| match e.as_str() {
            "\";\"" => "end of statement".to_string(),
            "Ident" => "a name".to_string(),
            "Int" => "an integer".to_string(),
            "Float" => "a number".to_string(),
            "Str" => "a string".to_string(),
            s => format!("`{}`", s.trim_matches('"')),
        })
        .collect();
    names.sort();
    names.dedup();
    if names.len() > 6 {
        names.truncate(6);
        names.push("…".to_string());
    }
    names.join(", ")
}

fn parse_error(file: FileId, e: ParseError<usize, Tok, ()>, end: usize) -> Diagnostic {
    match e {
        ParseError::UnrecognizedToken { token: (l, tok, r), expected } => {
            Diagnostic::error(Code::E0103, Span::new(file, l, r), format!("unexpected {}", describe(&tok)))
                .label(format!("expected {}", expected_list(&expected)))
        }
        ParseError::UnrecognizedEof { location, expected } => {
            Diagnostic::error(Code::E0104, Span::new(file, location.min(end), end), "unexpected end of file")
                .label(format!("expected {}", expected_list(&expected)))
        }
        ParseError::ExtraToken { token: (l, tok, r) } => {
            Diagnostic::error(Code::E0103, Span::new(file, l, r), format!("unexpected {}", describe(&tok)))
        }
        ParseError::InvalidToken { location } => {
            Diagnostic::error(Code::E0101, Span::new(file, location, location + 1), "invalid token")
        }
        ParseError::User { .. } => Diagnostic::error(Code::E0103, Span::new(file, 0, 0), "syntax error"),
    }
}

/// True when some expression in the item nests deeper than `MAX_EXPR_DEPTH`. The walk itself
/// stops at that depth, so it cannot overflow the stack.
fn item_too_deep(item: &ast::Item) -> bool {
    use ast::ItemKind::*;
    // Types and dimensions nest without brackets too (`fn() -> fn() -> …`, `- - - 1`, `1 + 1 + …`).
    item.annotations.iter().any(|a| a.args.iter().any(|a| expr_deep(&a.value, 0)))
        || match &item.kind {
            Fn(f) => {
                f.params.iter().any(|p| param_deep(p, 0))
                    || f.ret.as_ref().is_some_and(|t| type_deep(t, 0))
                    || block_deep(&f.body, 0)
            }
            Const { ty, value, .. } => ty.as_ref().is_some_and(|t| type_deep(t, 0)) || expr_deep(value, 0),
            Model(m) => {
                m.fields.iter().any(|f| type_deep(&f.ty, 0) || f.init.as_ref().is_some_and(|e| expr_deep(e, 0)))
            }
            Test { body, .. } => block_deep(body, 0),
            Dim { value, .. } => dim_deep(value, 0),
            Mesh { axes, .. } => axes.iter().any(|(_, d)| dim_deep(d, 0)),
            Use(_) | Error => false,
        }
}

fn param_deep(p: &ast::Param, d: usize) -> bool {
    p.ty.as_ref().is_some_and(|t| type_deep(t, d)) || p.default.as_ref().is_some_and(|e| expr_deep(e, d))
}

fn type_deep(t: &ast::TypeExpr, d: usize) -> bool {
    use ast::TypeKind::*;
    if d > MAX_EXPR_DEPTH {
        return true;
    }
    let d = d + 1;
    match &t.kind {
        Named { args, .. } => args.iter().flatten().any(|a| match a {
            ast::DimArg::Dim { dim, .. } => dim_deep(dim, d),
            ast::DimArg::Rest(_) => false,
            ast::DimArg::Type(t) => type_deep(t, d),
        }),
        Tuple(ts) => ts.iter().any(|t| type_deep(t, d)),
        Fn { params, ret } => params.iter().any(|t| type_deep(t, d)) || type_deep(ret, d),
        Stack { elem, len } => {
            type_deep(elem, d)
                || match &**len {
                    ast::DimArg::Dim { dim, .. } => dim_deep(dim, d),
                    ast::DimArg::Rest(_) => false,
                    ast::DimArg::Type(t) => type_deep(t, d),
                }
        }
        Error => false,
    }
}

fn dim_deep(e: &ast::DimExpr, d: usize) -> bool {
    use ast::DimKind::*;
    if d > MAX_EXPR_DEPTH {
        return true;
    }
    match &e.kind {
        Int(_) | Var(_) | Infer | Error => false,
        Bin(_, a, b) => dim_deep(a, d + 1) || dim_deep(b, d + 1),
        Neg(a) => dim_deep(a, d + 1),
    }
}

fn block_deep(b: &ast::Block, d: usize) -> bool {
    use ast::StmtKind::*;
    b.stmts.iter().any(|s| match &s.kind {
        Let { ty, value, .. } | Var { ty, value, .. } => {
            ty.as_ref().is_some_and(|t| type_deep(t, d + 1)) || expr_deep(value, d + 1)
        }
        Expr(value) => expr_deep(value, d + 1),
        Assign { target, value, .. } => expr_deep(target, d + 1) || expr_deep(value, d + 1),
        Return(Some(e)) => expr_deep(e, d + 1),
        Return(None) | Break | Continue | Error => false,
    })
}

fn expr_deep(e: &ast::Expr, d: usize) -> bool {
    use ast::ExprKind::*;
    if d > MAX_EXPR_DEPTH {
        return true;
    }
    let d = d + 1;
    match &e.kind {
        Int(_) | Float(_) | Bool(_) | Str(_) | Name(_) | Wild | Error => false,
        Tuple(es) | List(es) => es.iter().any(|e| expr_deep(e, d)),
        Unary(_, a) | Field(a, _) | TupleIndex(a, _, _) | StackModel(a, _) => expr_deep(a, d),
        Binary(_, a, b) => expr_deep(a, d) || expr_deep(b, d),
        Call(f, args) => expr_deep(f, d) || args.iter().any(|a| expr_deep(&a.value, d)),
        Index(a, args) => {
            expr_deep(a, d)
                || args.iter().any(|a| match a {
                    ast::IndexArg::Expr(e) | ast::IndexArg::Named { value: e, .. } => expr_deep(e, d),
                    s @ ast::IndexArg::Slice { .. } => s.slice_parts().any(|e| expr_deep(e, d)),
                })
        }
        Closure { params, body } => params.iter().any(|p| param_deep(p, d)) || expr_deep(body, d),
        Block(b) => block_deep(b, d),
        If { cond, then, els } => {
            expr_deep(cond, d) || block_deep(then, d) || els.as_ref().is_some_and(|e| expr_deep(e, d))
        }
        For { iter, body, .. } => {
            (match iter {
                ast::ForIter::Range(a, b) => expr_deep(a, d) || expr_deep(b, d),
                ast::ForIter::Expr(a) => expr_deep(a, d),
            }) || block_deep(body, d)
        }
        While { cond, body } => expr_deep(cond, d) || block_deep(body, d),
    }
}
