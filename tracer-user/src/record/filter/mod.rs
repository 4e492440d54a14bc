//! Predicates in function patterns (`-f 'greet if name == "bob" && times > 0'`): parsed here,
//! type-checked against each matched function's DWARF parameters and compiled into the kernel's
//! branching program ([`compile`]), which the entry probe runs before anything is written (see
//! `tracer-ebpf/src/filter.rs`).

pub mod compile;
pub mod parse;

use tracer_common::filter::Program;

use crate::debuginfo::layout::FunctionLayout;

/// A predicate the user wrote, parsed.
#[derive(Clone, Debug)]
pub struct Predicate {
    /// The expression as written (after `if`).
    pub text: String,
    expr: parse::Expr,
}

/// An expression refused: one sentence, then the expression with a caret under the spot.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{message}{in_function}:\n  {text}\n  {caret}^", caret = " ".repeat(*column))]
pub struct FilterError {
    pub message: String,
    /// `" (in greet)"` for a type error, empty for syntax.
    pub in_function: String,
    pub text: String,
    pub column: usize,
}

impl FilterError {
    fn at(text: &str, spot: parse::Spot, function: Option<&str>) -> FilterError {
        let column = text.get(..spot.at).map_or(spot.at, |s| s.chars().count());
        FilterError {
            message: spot.message,
            in_function: function.map(|f| format!(" (in {f})")).unwrap_or_default(),
            text: text.to_string(),
            column,
        }
    }
}

/// Splits `-f` text into its function pattern and its predicate, at the first ` if ` (the word
/// `if` between spaces, or ending the text).
pub fn split(text: &str) -> Result<(&str, Option<Predicate>), FilterError> {
    let bytes = text.as_bytes();
    let found = (1..bytes.len().saturating_sub(1)).find(|&i| {
        bytes[i - 1].is_ascii_whitespace()
            && bytes[i..].starts_with(b"if")
            && bytes.get(i + 2).is_none_or(|c| c.is_ascii_whitespace() || *c == b'(' || *c == b'!')
    });
    let Some(i) = found else { return Ok((text, None)) };
    let pattern = text[..i].trim_end();
    let expr_text = text[i + 2..].trim();
    let expr = parse::parse(expr_text).map_err(|spot| FilterError::at(expr_text, spot, None))?;
    Ok((pattern, Some(Predicate { text: expr_text.to_string(), expr })))
}

impl Predicate {
    /// Compiles the predicate for `function`, whose parameters are `layout` (`None` without
    /// DWARF).
    pub fn compile(&self, function: &str, layout: Option<&FunctionLayout>) -> Result<Program, FilterError> {
        compile::compile(&self.expr, layout).map_err(|spot| FilterError::at(&self.text, spot, Some(function)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_at_the_word_if() {
        let (pattern, p) = split(r#"greet if name == "bob""#).unwrap();
        assert_eq!((pattern, p.unwrap().text.as_str()), ("greet", r#"name == "bob""#));
        let (pattern, p) = split("lib*:diff_*").unwrap();
        assert_eq!(pattern, "lib*:diff_*");
        assert!(p.is_none());
        // `if` inside a name is not the keyword.
        assert!(split("verify_iff").unwrap().1.is_none());
        assert_eq!(split("f if(a)").unwrap().0, "f");
    }

    #[test]
    fn errors_show_the_expression_with_a_caret() {
        let e = split("greet if times = 3").unwrap_err();
        assert_eq!(e.to_string(), "`=` is not a comparison: write `==`:\n  times = 3\n        ^");
        let e = split("greet if ").unwrap_err();
        assert!(e.to_string().starts_with("an expression is expected after `if`"), "{e}");
    }
}
