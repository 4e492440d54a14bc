//! The predicate language's syntax: a hand-written recursive-descent parser (the grammar is a
//! dozen lines; a parser crate would be larger than it).
//!
//! ```text
//! expr       := and ("||" and)*
//! and        := unary ("&&" unary)*
//! unary      := "!" unary | "(" expr ")" | comparison
//! comparison := NAME (("==" | "!=" | "<" | "<=" | ">" | ">=" | "=~") literal)?
//! literal    := INTEGER | "-" INTEGER | "true" | "false" | NAME | STRING
//! ```
//!
//! A NAME alone tests the value against zero. Integers are decimal or `0x` hexadecimal; a NAME
//! literal is an enumerator; a STRING is in double quotes with `\"`, `\\`, `\n` and `\t` escapes.
//! Every node keeps the byte offset it starts at, for errors.

/// A parse or type error at byte `at` of the expression.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spot {
    pub at: usize,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    /// `=~ "prefix*"`
    Matches,
}

impl CmpOp {
    pub fn text(self) -> &'static str {
        match self {
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
            CmpOp::Matches => "=~",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Literal {
    Int(i128),
    Bool(bool),
    /// An enumerator's name.
    Name(String),
    String(Vec<u8>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expr {
    Or(Box<Expr>, Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    /// A NAME alone: true when not zero.
    Truthy {
        name: String,
        at: usize,
    },
    Compare {
        name: String,
        at: usize,
        op: CmpOp,
        literal: Literal,
        literal_at: usize,
    },
}

/// Parses a whole expression.
pub fn parse(text: &str) -> Result<Expr, Spot> {
    let mut p = Parser { text: text.as_bytes(), pos: 0 };
    p.skip_space();
    if p.pos == p.text.len() {
        return Err(p.error("an expression is expected after `if`"));
    }
    let expr = p.or()?;
    p.skip_space();
    if p.pos != p.text.len() {
        return Err(p.error("`&&`, `||` or the end of the expression is expected here"));
    }
    Ok(expr)
}

/// Deepest nesting of `(` and `!` accepted: a bound on the recursion for any input.
const MAX_NESTING: usize = 32;

struct Parser<'a> {
    text: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn error(&self, message: impl Into<String>) -> Spot {
        Spot { at: self.pos, message: message.into() }
    }

    fn skip_space(&mut self) {
        while self.pos < self.text.len() && self.text[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }

    fn eat(&mut self, token: &str) -> bool {
        self.skip_space();
        if self.text[self.pos..].starts_with(token.as_bytes()) {
            self.pos += token.len();
            true
        } else {
            false
        }
    }

    fn or(&mut self) -> Result<Expr, Spot> {
        self.or_at(0)
    }

    fn or_at(&mut self, depth: usize) -> Result<Expr, Spot> {
        let mut left = self.and(depth)?;
        while self.eat("||") {
            let right = self.and(depth)?;
            left = Expr::Or(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn and(&mut self, depth: usize) -> Result<Expr, Spot> {
        let mut left = self.unary(depth)?;
        while self.eat("&&") {
            let right = self.unary(depth)?;
            left = Expr::And(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn unary(&mut self, depth: usize) -> Result<Expr, Spot> {
        self.skip_space();
        if depth >= MAX_NESTING {
            return Err(self.error(format!("nested more than {MAX_NESTING} deep")));
        }
        if self.text[self.pos..].starts_with(b"!") && !self.text[self.pos..].starts_with(b"!=") {
            self.pos += 1;
            return Ok(Expr::Not(Box::new(self.unary(depth + 1)?)));
        }
        if self.eat("(") {
            let inner = self.or_at(depth + 1)?;
            if !self.eat(")") {
                return Err(self.error("`)` is expected here"));
            }
            return Ok(inner);
        }
        self.comparison()
    }

    fn name(&mut self) -> Option<(String, usize)> {
        self.skip_space();
        let start = self.pos;
        let first = *self.text.get(self.pos)?;
        if !(first.is_ascii_alphabetic() || first == b'_') {
            return None;
        }
        while self.pos < self.text.len() && (self.text[self.pos].is_ascii_alphanumeric() || self.text[self.pos] == b'_')
        {
            self.pos += 1;
        }
        Some((String::from_utf8_lossy(&self.text[start..self.pos]).into_owned(), start))
    }

    fn comparison(&mut self) -> Result<Expr, Spot> {
        let Some((name, at)) = self.name() else {
            return Err(self.error("a parameter name, `!` or `(` is expected here"));
        };
        self.skip_space();
        // Longest operators first.
        let ops = [
            ("==", CmpOp::Eq),
            ("!=", CmpOp::Ne),
            ("<=", CmpOp::Le),
            (">=", CmpOp::Ge),
            ("=~", CmpOp::Matches),
            ("<", CmpOp::Lt),
            (">", CmpOp::Gt),
        ];
        let Some(&(_, op)) = ops.iter().find(|(text, _)| self.text[self.pos..].starts_with(text.as_bytes())) else {
            if self.text[self.pos..].starts_with(b"=") {
                return Err(self.error("`=` is not a comparison: write `==`"));
            }
            return Ok(Expr::Truthy { name, at });
        };
        self.pos += op.text().len();
        self.skip_space();
        let literal_at = self.pos;
        let literal = self.literal()?;
        Ok(Expr::Compare { name, at, op, literal, literal_at })
    }

    fn literal(&mut self) -> Result<Literal, Spot> {
        let rest = &self.text[self.pos..];
        match rest.first() {
            Some(b'"') => self.string(),
            Some(b'-') | Some(b'0'..=b'9') => self.integer(),
            _ => match self.name() {
                Some((n, _)) if n == "true" => Ok(Literal::Bool(true)),
                Some((n, _)) if n == "false" => Ok(Literal::Bool(false)),
                Some((n, _)) => Ok(Literal::Name(n)),
                None => Err(self.error("a number, `true`, `false`, an enumerator or a \"string\" is expected here")),
            },
        }
    }

    fn integer(&mut self) -> Result<Literal, Spot> {
        let start = self.pos;
        let negative = self.text[self.pos] == b'-';
        if negative {
            self.pos += 1;
        }
        let hex = self.text[self.pos..].starts_with(b"0x") || self.text[self.pos..].starts_with(b"0X");
        if hex {
            self.pos += 2;
        }
        let digits_start = self.pos;
        while self.pos < self.text.len() && self.text[self.pos].is_ascii_alphanumeric() {
            self.pos += 1;
        }
        let digits = std::str::from_utf8(&self.text[digits_start..self.pos]).unwrap_or("");
        let parsed = i128::from_str_radix(digits, if hex { 16 } else { 10 }).ok().filter(|v| *v <= u64::MAX as i128);
        match parsed {
            Some(v) if !digits.is_empty() => Ok(Literal::Int(if negative { -v } else { v })),
            _ => Err(Spot { at: start, message: "not a number this tracer reads (a 64-bit decimal or 0x hex)".into() }),
        }
    }

    fn string(&mut self) -> Result<Literal, Spot> {
        let start = self.pos;
        self.pos += 1;
        let mut out = Vec::new();
        loop {
            let Some(&c) = self.text.get(self.pos) else {
                return Err(Spot { at: start, message: "this string has no closing `\"`".into() });
            };
            self.pos += 1;
            match c {
                b'"' => return Ok(Literal::String(out)),
                b'\\' => {
                    let escaped = match self.text.get(self.pos) {
                        Some(b'"') => b'"',
                        Some(b'\\') => b'\\',
                        Some(b'n') => b'\n',
                        Some(b't') => b'\t',
                        _ => return Err(self.error("unknown escape: use \\\", \\\\, \\n or \\t")),
                    };
                    self.pos += 1;
                    out.push(escaped);
                }
                0 => return Err(Spot { at: self.pos - 1, message: "a string cannot hold a NUL byte".into() }),
                c => out.push(c),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmp(name: &str, at: usize, op: CmpOp, literal: Literal, literal_at: usize) -> Expr {
        Expr::Compare { name: name.into(), at, op, literal, literal_at }
    }

    #[test]
    fn parses_precedence_and_literals() {
        let e = parse(r#"name == "bob" || times > 0 && !loud"#).unwrap();
        let expected = Expr::Or(
            Box::new(cmp("name", 0, CmpOp::Eq, Literal::String(b"bob".to_vec()), 8)),
            Box::new(Expr::And(
                Box::new(cmp("times", 17, CmpOp::Gt, Literal::Int(0), 25)),
                Box::new(Expr::Not(Box::new(Expr::Truthy { name: "loud".into(), at: 31 }))),
            )),
        );
        assert_eq!(e, expected);
        assert_eq!(parse("(a<-0x10)").unwrap(), cmp("a", 1, CmpOp::Lt, Literal::Int(-16), 3));
        assert_eq!(parse("c != GREEN").unwrap(), cmp("c", 0, CmpOp::Ne, Literal::Name("GREEN".into()), 5));
        assert_eq!(parse("b==false").unwrap(), cmp("b", 0, CmpOp::Eq, Literal::Bool(false), 3));
        assert_eq!(
            parse(r#"s =~ "a\"\\*""#).unwrap(),
            cmp("s", 0, CmpOp::Matches, Literal::String(br#"a"\*"#.to_vec()), 5)
        );
    }

    #[test]
    fn errors_point_at_the_spot() {
        let at = |text: &str| parse(text).unwrap_err().at;
        assert_eq!(at("name = 3"), 5);
        assert_eq!(at("a == "), 5);
        assert_eq!(at("a == 1 b"), 7);
        assert_eq!(at("(a == 1"), 7);
        assert_eq!(at(r#"a == "x"#), 5);
        assert_eq!(at("a == 99999999999999999999999"), 5);
        assert_eq!(at("&& a"), 0);
        assert_eq!(at(""), 0);
        assert_eq!(at("a > 0x"), 4);
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowed() {
        let deep = format!("{}a{}", "(".repeat(100), ")".repeat(100));
        assert!(parse(&deep).unwrap_err().message.contains("nested"));
        assert!(parse(&"!".repeat(10_000)).is_err());
    }

    /// Random input (a fixed-seed generator, so a failure repeats): never a panic, and every
    /// error's spot is inside the text or at its end.
    #[test]
    fn random_input_never_panics() {
        let alphabet: &[&str] = &[
            "a", "b_1", " ", "(", ")", "!", "&&", "||", "==", "!=", "<", "<=", ">", "=~", "=", "\"", "\\", "0x", "-",
            "7", "é", "&", "|", "true", "\0",
        ];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            let mut text = String::new();
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            for _ in 0..(state % 24) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                text.push_str(alphabet[(state % alphabet.len() as u64) as usize]);
            }
            if let Err(spot) = parse(&text) {
                assert!(spot.at <= text.len(), "{text:?}: {spot:?}");
                assert!(!spot.message.is_empty());
            }
        }
    }
}
