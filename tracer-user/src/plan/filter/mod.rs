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

/// The predicates of one `-f` pattern: `FUNC if EXPR` (decided at the entry), `FUNC ret-if EXPR`
/// (decided at the return, on the return value `ret` and the entry's arguments), or both, in
/// that order.
#[derive(Clone, Debug, Default)]
pub struct Predicates {
    pub entry: Option<Predicate>,
    pub ret: Option<Predicate>,
}

impl Predicates {
    pub fn is_empty(&self) -> bool {
        self.entry.is_none() && self.ret.is_none()
    }
}

/// Where the keyword `word` starts in `text`: after whitespace, followed by whitespace, `(`, `!`
/// or the end, and outside a string literal.
fn keyword(text: &str, word: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut quoted = false;
    for i in 0..bytes.len() {
        match bytes[i] {
            b'"' if i == 0 || bytes[i - 1] != b'\\' => quoted = !quoted,
            _ if quoted || i == 0 => {}
            _ => {
                if bytes[i - 1].is_ascii_whitespace()
                    && bytes[i..].starts_with(word.as_bytes())
                    && bytes.get(i + word.len()).is_none_or(|c| c.is_ascii_whitespace() || *c == b'(' || *c == b'!')
                {
                    return Some(i);
                }
            }
        }
    }
    None
}

fn predicate(text: &str) -> Result<Predicate, FilterError> {
    let text = text.trim();
    let expr = parse::parse(text).map_err(|spot| FilterError::at(text, spot, None))?;
    Ok(Predicate { text: text.to_string(), expr })
}

/// Splits `-f` text into its function pattern and its predicates: ` if EXPR`, then
/// ` ret-if EXPR` (each keyword between spaces, or ending the text).
pub fn split(text: &str) -> Result<(&str, Predicates), FilterError> {
    let (head, ret) = match keyword(text, "ret-if") {
        Some(i) => (&text[..i], Some(predicate(&text[i + "ret-if".len()..])?)),
        None => (text, None),
    };
    let (pattern, entry) = match keyword(head, "if") {
        Some(i) => (&head[..i], Some(predicate(&head[i + 2..])?)),
        None => (head, None),
    };
    Ok((pattern.trim_end(), Predicates { entry, ret }))
}

impl Predicate {
    /// Compiles the predicate for `function`, whose parameters are `layout` (`None` without
    /// DWARF); `at_return` for a `ret-if` one.
    pub fn compile(
        &self,
        function: &str,
        layout: Option<&FunctionLayout>,
        at_return: bool,
    ) -> Result<Program, FilterError> {
        compile::compile(&self.expr, layout, at_return)
            .map_err(|spot| FilterError::at(&self.text, spot, Some(function)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_at_the_words_if_and_ret_if() {
        let (pattern, p) = split(r#"greet if name == "bob""#).unwrap();
        assert_eq!((pattern, p.entry.unwrap().text.as_str()), ("greet", r#"name == "bob""#));
        assert!(p.ret.is_none());
        let (pattern, p) = split("lib*:diff_*").unwrap();
        assert_eq!(pattern, "lib*:diff_*");
        assert!(p.is_empty());
        // `if` inside a name or a string is not the keyword.
        assert!(split("verify_iff").unwrap().1.is_empty());
        assert_eq!(split("f if(a)").unwrap().0, "f");
        assert_eq!(split(r#"f if s == " if ""#).unwrap().1.entry.unwrap().text, r#"s == " if ""#);
        let (pattern, p) = split("parse ret-if ret < 0").unwrap();
        assert_eq!((pattern, p.ret.unwrap().text.as_str()), ("parse", "ret < 0"));
        assert!(p.entry.is_none());
        let (pattern, p) = split("greet if loud ret-if ret < 0").unwrap();
        assert_eq!(
            (pattern, p.entry.unwrap().text.as_str(), p.ret.unwrap().text.as_str()),
            ("greet", "loud", "ret < 0")
        );
        assert!(split(r#"f if s == "a ret-if b""#).unwrap().1.ret.is_none());
    }

    #[test]
    fn errors_show_the_expression_with_a_caret() {
        let e = split("greet if times = 3").unwrap_err();
        assert_eq!(e.to_string(), "`=` is not a comparison: write `==`:\n  times = 3\n        ^");
        let e = split("greet if ").unwrap_err();
        assert!(e.to_string().starts_with("an expression is expected after `if`"), "{e}");
    }
}
