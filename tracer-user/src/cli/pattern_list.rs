//! `-f`, `-u`, `--start-at` and `--stop-at` take a pattern or a comma list of them
//! (`-f 'fib,main'`), as `-p` and `-e` take lists. A comma is part of its pattern when it is inside
//! parentheses, brackets, braces, a template's angle brackets or a quoted string, so that a C++
//! signature (`f(int, char)`, `std::map<int, int>::at`), a glob's alternatives (`{a,b}`) and a
//! predicate's string (`greet if name == "a,b"`) stay whole; in a predicate (after ` if `), `<`
//! and `>` compare and do not nest. A name with a comma outside all of those (C++'s
//! `operator,`) is matched by a glob instead (`'*::operator?'`).

/// One value of a pattern option: its patterns, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PatternList(pub Vec<String>);

/// Splits an option's value into its patterns (clap's value parser).
pub fn parse(text: &str) -> Result<PatternList, String> {
    let patterns = split(text);
    if patterns.iter().any(String::is_empty) {
        return Err(format!("'{text}' has an empty pattern (a comma with nothing on one side)"));
    }
    Ok(PatternList(patterns))
}

/// Every pattern of the option's values, in order.
pub fn flatten(lists: Vec<PatternList>) -> Vec<String> {
    lists.into_iter().flat_map(|list| list.0).collect()
}

fn split(text: &str) -> Vec<String> {
    let mut patterns = Vec::new();
    let (mut start, mut depth, mut quoted, mut escaped, mut predicate) = (0, 0u32, false, false, false);
    for (i, c) in text.char_indices() {
        if quoted {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => quoted = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => quoted = true,
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            '<' if !predicate => depth += 1,
            // Never below zero: `operator>` and `->` close nothing.
            '>' if !predicate => depth = depth.saturating_sub(1),
            ' ' if depth == 0 && text[i..].starts_with(" if ") => predicate = true,
            ',' if depth == 0 => {
                patterns.push(text[start..i].trim().to_string());
                (start, predicate) = (i + 1, false);
            }
            _ => {}
        }
    }
    patterns.push(text[start..].trim().to_string());
    patterns
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(text: &str) -> Vec<String> {
        parse(text).unwrap().0
    }

    #[test]
    fn a_comma_list_is_split_and_trimmed() {
        assert_eq!(list("fib"), ["fib"]);
        assert_eq!(list("fib,main, libc.so.6:malloc"), ["fib", "main", "libc.so.6:malloc"]);
    }

    #[test]
    fn commas_inside_a_signature_a_template_a_glob_or_a_string_stay() {
        assert_eq!(list("f(int, char),g"), ["f(int, char)", "g"]);
        assert_eq!(list("std::map<int, int>::at,h"), ["std::map<int, int>::at", "h"]);
        assert_eq!(list("{a,b}*"), ["{a,b}*"]);
        assert_eq!(
            list(r#"greet if name == "a,\"b" && n > 2,tick if n < 3"#),
            [r#"greet if name == "a,\"b" && n > 2"#, "tick if n < 3"]
        );
        assert_eq!(list("Foo::operator->,bar"), ["Foo::operator->", "bar"]);
    }

    #[test]
    fn an_empty_pattern_is_refused() {
        assert_eq!(parse("fib,").unwrap_err(), "'fib,' has an empty pattern (a comma with nothing on one side)");
        assert!(parse(",fib").is_err() && parse("").is_err());
    }
}
