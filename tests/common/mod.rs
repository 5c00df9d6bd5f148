//! Helpers shared by the integration tests (each test file that needs one says `mod common;`).

/// Equal outputs up to float rounding: the same words, and numbers within 1e-5 relative (a
/// sharded sum adds in another order than one process does).
pub fn same_up_to_rounding(a: &str, b: &str) -> bool {
    let split = |s: &str| -> Vec<String> {
        s.split(|c: char| c.is_whitespace() || "[](),".contains(c))
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect()
    };
    let (wa, wb) = (split(a), split(b));
    wa.len() == wb.len()
        && wa.iter().zip(&wb).all(|(x, y)| match (x.parse::<f64>(), y.parse::<f64>()) {
            (Ok(p), Ok(q)) => (p - q).abs() <= 1e-5 * p.abs().max(q.abs()) + 1e-6,
            _ => x == y,
        })
}
