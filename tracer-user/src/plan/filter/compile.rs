//! Type-checks a parsed predicate against one function's parameters (their DWARF types and where
//! each is at entry) and compiles it into the kernel's branching program
//! (`tracer_common::filter::Program`).

use std::sync::Arc;

use tracer_common::filter::{self, ACCEPT, MAX_OPS, Op, Program, REJECT, STR_MATCH, STRING_BYTES, STRING_WORDS};

use super::parse::{CmpOp, Expr, Literal, Spot};
use crate::debuginfo::{
    layout::{FunctionLayout, Reg, Source},
    types::{Kind, Type},
};

/// Argument registers in order (`arg0`..`arg5`).
const ARG_REGS: [Reg; 6] = [Reg::Rdi, Reg::Rsi, Reg::Rdx, Reg::Rcx, Reg::R8, Reg::R9];

/// What a name in the predicate stands for.
enum Value {
    Integer { reg: Reg, signed: bool, bytes: u64, what: String, enumerators: Option<Arc<Type>>, boolean: bool },
    CString { reg: Reg, what: String },
}

/// Compiles `expr` for a function whose parameters are `layout` (`None`: no DWARF, only
/// `arg0`..`arg5` and `ret`, as signed 64-bit integers). `at_return`: a `ret-if` predicate, run
/// at the return on the entry's argument registers and the return value (`ret`, in rax).
pub fn compile(expr: &Expr, layout: Option<&FunctionLayout>, at_return: bool) -> Result<Program, Spot> {
    let mut c = Compiler { layout, at_return, ops: Vec::new(), labels: Vec::new() };
    c.emit(expr, Target::Accept, Target::Reject)?;
    let mut program = Program { len: c.ops.len() as u32, ..Program::default() };
    let resolve = |t: Target, labels: &[usize]| match t {
        Target::Accept => ACCEPT,
        Target::Reject => REJECT,
        Target::Label(l) => labels[l] as u8,
    };
    for (i, (op, on_true, on_false)) in c.ops.iter().enumerate() {
        let mut op = *op;
        op.on_true = resolve(*on_true, &c.labels);
        op.on_false = resolve(*on_false, &c.labels);
        program.ops[i] = op;
    }
    Ok(program)
}

#[derive(Clone, Copy)]
enum Target {
    Accept,
    Reject,
    Label(usize),
}

struct Compiler<'a> {
    layout: Option<&'a FunctionLayout>,
    at_return: bool,
    ops: Vec<(Op, Target, Target)>,
    /// Each label's op index, once placed (only ever after every op that jumps to it).
    labels: Vec<usize>,
}

impl Compiler<'_> {
    fn label(&mut self) -> usize {
        self.labels.push(usize::MAX);
        self.labels.len() - 1
    }

    fn place(&mut self, label: usize) {
        self.labels[label] = self.ops.len();
    }

    /// Emits ops that go to `t` when `expr` holds and to `f` when not.
    fn emit(&mut self, expr: &Expr, t: Target, f: Target) -> Result<(), Spot> {
        match expr {
            Expr::Or(a, b) => {
                let next = self.label();
                self.emit(a, t, Target::Label(next))?;
                self.place(next);
                self.emit(b, t, f)
            }
            Expr::And(a, b) => {
                let next = self.label();
                self.emit(a, Target::Label(next), f)?;
                self.place(next);
                self.emit(b, t, f)
            }
            Expr::Not(a) => self.emit(a, f, t),
            Expr::Truthy { name, at } => {
                let op = match self.value(name, *at)? {
                    Value::Integer { reg, signed, bytes, .. } => int_op(filter::NE, reg, signed, bytes, 0),
                    Value::CString { what, .. } => {
                        return Err(Spot {
                            at: *at,
                            message: format!("`{name}` is a string ({what}): compare it with a \"string\""),
                        });
                    }
                };
                self.push(op, t, f, *at)
            }
            Expr::Compare { name, at, op, literal, literal_at } => {
                let value = self.value(name, *at)?;
                let (op, negated) = comparison(name, value, *op, literal, *literal_at)?;
                if negated { self.push(op, f, t, *at) } else { self.push(op, t, f, *at) }
            }
        }
    }

    fn push(&mut self, op: Op, t: Target, f: Target, at: usize) -> Result<(), Spot> {
        if self.ops.len() == MAX_OPS {
            return Err(Spot { at, message: format!("more than {MAX_OPS} comparisons, the most one predicate holds") });
        }
        self.ops.push((op, t, f));
        Ok(())
    }

    fn value(&self, name: &str, at: usize) -> Result<Value, Spot> {
        let spot = |message: String| Spot { at, message };
        if name == "ret" {
            if !self.at_return {
                return Err(spot(
                    "`ret` is the return value, not known when the call is decided (at its entry): use `ret-if`".into(),
                ));
            }
            return match self.layout {
                None => Ok(Value::Integer {
                    reg: Reg::Rax,
                    signed: true,
                    bytes: 8,
                    what: "a 64-bit register".into(),
                    enumerators: None,
                    boolean: false,
                }),
                Some(FunctionLayout { ret: None, .. }) => Err(spot("`ret`: this function returns nothing".into())),
                Some(FunctionLayout { ret: Some(r), .. }) => match &r.source {
                    Source::Reg(Reg::Rax) | Source::String { ptr: Reg::Rax, len: None, .. } => {
                        typed(&r.ty, Reg::Rax, &r.source).map_err(spot)
                    }
                    _ => Err(spot(format!("`ret` is a {}: not comparable", r.ty.name))),
                },
            };
        }
        let by_position = name.strip_prefix("arg").and_then(|n| n.parse::<usize>().ok());
        if let Some(n) = by_position {
            let Some(&reg) = ARG_REGS.get(n) else {
                return Err(spot(format!("`{name}`: arguments by position are arg0 to arg5")));
            };
            // Typed as the parameter DWARF puts in that register, if any.
            let param = self.layout.and_then(|l| {
                l.params.iter().find(|p| match &p.source {
                    Source::Reg(r) => *r == reg,
                    Source::String { ptr, len: None, .. } => *ptr == reg,
                    _ => false,
                })
            });
            return Ok(match param {
                Some(p) => typed(&p.ty, reg, &p.source).map_err(spot)?,
                None => Value::Integer {
                    reg,
                    signed: true,
                    bytes: 8,
                    what: "a 64-bit register".into(),
                    enumerators: None,
                    boolean: false,
                },
            });
        }
        let Some(layout) = self.layout else {
            return Err(spot(format!(
                "`{name}` is not known: this function has no DWARF parameters (build with -g), so name its arguments arg0 to arg5"
            )));
        };
        let Some(param) = layout.params.iter().find(|p| p.name == name) else {
            let names: Vec<&str> = layout.params.iter().map(|p| p.name.as_str()).collect();
            let known = if names.is_empty() { "it has none".to_string() } else { names.join(", ") };
            return Err(spot(format!("no parameter `{name}` ({known})")));
        };
        let reg = match &param.source {
            Source::Reg(r) => *r,
            Source::String { ptr, len: None, .. } => *ptr,
            Source::String { .. } => {
                return Err(spot(format!("`{name}` is a {}: only C strings are compared", param.ty.name)));
            }
            Source::RegPair(..) => {
                return Err(spot(format!("`{name}` is a 16-byte {}: not comparable", param.ty.name)));
            }
            Source::Unreadable(why) => return Err(spot(format!("`{name}` cannot be read at entry: {why}"))),
        };
        typed(&param.ty, reg, &param.source).map_err(spot)
    }
}

fn typed(ty: &Arc<Type>, reg: Reg, source: &Source) -> Result<Value, String> {
    let what = ty.name.clone();
    let integer = |signed: bool, enumerators: Option<Arc<Type>>, boolean: bool| Value::Integer {
        reg,
        signed,
        bytes: ty.size.clamp(1, 8),
        what: what.clone(),
        enumerators,
        boolean,
    };
    Ok(match &ty.kind {
        Kind::Int { signed } | Kind::Char { signed, .. } => integer(*signed, None, false),
        Kind::Bool => integer(false, None, true),
        Kind::Enum { signed, .. } => integer(*signed, Some(ty.clone()), false),
        Kind::Pointer => integer(false, None, false),
        Kind::CString if matches!(source, Source::String { .. } | Source::Reg(_)) => {
            Value::CString { reg, what: what.clone() }
        }
        _ => return Err(format!("a {what} cannot be compared (integers, bools, enums, pointers and C strings can)")),
    })
}

fn int_op(kind: u8, reg: Reg, signed: bool, bytes: u64, value: i128) -> Op {
    let mut op = Op { kind, reg: reg as u8, signed: signed as u8, shift: (64 - 8 * bytes) as u8, ..Op::default() };
    op.value[0] = value as i64 as u64;
    op
}

/// The op for one comparison, and whether its outcome is to be negated (a string's `!=` is its
/// `==` with the jumps swapped).
fn comparison(name: &str, value: Value, op: CmpOp, literal: &Literal, literal_at: usize) -> Result<(Op, bool), Spot> {
    let spot = |message: String| Spot { at: literal_at, message };
    match value {
        Value::CString { reg, what } => {
            let Literal::String(bytes) = literal else {
                return Err(spot(format!("`{name}` is a string ({what}): compare it with a \"string\"")));
            };
            let (bytes, prefix) = match op {
                CmpOp::Eq | CmpOp::Ne => (bytes.as_slice(), false),
                CmpOp::Matches => match bytes.strip_suffix(b"*") {
                    Some(p) if !p.contains(&b'*') => (p, true),
                    _ => return Err(spot("`=~` takes a prefix ending in one `*`, as in \"ali*\"".into())),
                },
                _ => {
                    return Err(Spot {
                        at: literal_at,
                        message: format!("strings compare with ==, != and =~, not {}", op.text()),
                    });
                }
            };
            if bytes.len() > STRING_BYTES - 2 {
                return Err(spot(format!("strings compared in the kernel are at most {} bytes", STRING_BYTES - 2)));
            }
            let mut padded = [0u8; STRING_BYTES];
            padded[..bytes.len()].copy_from_slice(bytes);
            // Equality takes the NUL too, so a longer string differs.
            let compared = if prefix { bytes.len() } else { bytes.len() + 1 };
            let mut op_out = Op { kind: STR_MATCH, reg: reg as u8, ..Op::default() };
            for w in 0..STRING_WORDS {
                let word = |b: &[u8]| u64::from_le_bytes(b[8 * w..8 * w + 8].try_into().unwrap_or([0; 8]));
                let mut mask_bytes = [0u8; STRING_BYTES];
                mask_bytes[..compared].fill(0xff);
                op_out.value[w] = word(&padded);
                op_out.mask[w] = word(&mask_bytes);
            }
            Ok((op_out, op == CmpOp::Ne))
        }
        Value::Integer { reg, signed, bytes, what, enumerators, boolean } => {
            let kind = match op {
                CmpOp::Eq => filter::EQ,
                CmpOp::Ne => filter::NE,
                CmpOp::Lt => filter::LT,
                CmpOp::Le => filter::LE,
                CmpOp::Gt => filter::GT,
                CmpOp::Ge => filter::GE,
                CmpOp::Matches => return Err(spot(format!("`=~` compares strings; `{name}` is a {what}"))),
            };
            let number = match literal {
                Literal::Int(v) if !boolean => *v,
                Literal::Int(v) if *v == 0 || *v == 1 => *v,
                Literal::Int(_) => return Err(spot(format!("`{name}` is a {what}: compare it with true or false"))),
                Literal::Bool(b) if boolean => *b as i128,
                Literal::Bool(_) => return Err(spot(format!("`{name}` is a {what}, not a bool"))),
                Literal::String(_) => return Err(spot(format!("`{name}` is a {what}, not a string"))),
                Literal::Name(n) => match enumerators.as_deref().map(|t| &t.kind) {
                    Some(Kind::Enum { enumerators, .. }) => match enumerators.iter().find(|e| &e.name == n) {
                        Some(e) => e.value,
                        None => {
                            let names: Vec<&str> = enumerators.iter().map(|e| e.name.as_str()).collect();
                            return Err(spot(format!("`{n}` is not a value of {what} ({})", names.join(", "))));
                        }
                    },
                    _ => return Err(spot(format!("`{n}` is not a value: `{name}` is a {what}, not an enum"))),
                },
            };
            let bits = 8 * bytes as u32;
            let (low, high) =
                if signed { (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1) } else { (0, (1i128 << bits) - 1) };
            if number < low || number > high {
                return Err(spot(format!("{number} is outside the range of `{name}` ({what}: {low} to {high})")));
            }
            Ok((int_op(kind, reg, signed, bytes, number), false))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{super::parse::parse, *};
    use crate::debuginfo::{
        layout::{ProbeLayout, ValueLayout},
        types::Enumerator,
    };

    fn ty(name: &str, size: u64, kind: Kind) -> Arc<Type> {
        Arc::new(Type { name: name.into(), size, kind })
    }

    /// `greet(const char *name, int times, bool loud, enum colour c)`.
    fn greet() -> FunctionLayout {
        let colour = Kind::Enum {
            signed: false,
            enumerators: vec![
                Enumerator { name: "RED".into(), value: 0 },
                Enumerator { name: "GREEN".into(), value: 1 },
                Enumerator { name: "BLUE".into(), value: 2 },
            ]
            .into(),
        };
        let p = |name: &str, ty: Arc<Type>, source: Source| ValueLayout { name: name.into(), ty, source };
        FunctionLayout {
            params: vec![
                p("name", ty("const char *", 8, Kind::CString), Source::String { index: 0, ptr: Reg::Rdi, len: None }),
                p("times", ty("int", 4, Kind::Int { signed: true }), Source::Reg(Reg::Rsi)),
                p("loud", ty("_Bool", 1, Kind::Bool), Source::Reg(Reg::Rdx)),
                p("c", ty("enum colour", 4, colour), Source::Reg(Reg::Rcx)),
            ],
            ret: None,
            probe: ProbeLayout::empty(64),
        }
    }

    /// The kernel's interpreter, in user space: the same steps as `tracer-ebpf/src/filter.rs`.
    fn run(p: &Program, regs: [u64; 7], string: &[u8]) -> bool {
        let mut pc = 0usize;
        for _ in 0..MAX_OPS {
            let op = &p.ops[pc];
            let raw = regs[op.reg as usize];
            let holds = if op.kind == STR_MATCH {
                let mut buf = [0u8; STRING_BYTES];
                let n = string.len().min(STRING_BYTES - 1);
                buf[..n].copy_from_slice(&string[..n]);
                (0..STRING_WORDS)
                    .all(|w| u64::from_le_bytes(buf[8 * w..8 * w + 8].try_into().unwrap()) & op.mask[w] == op.value[w])
            } else {
                let shift = op.shift as u64 & 63;
                let order = if op.signed != 0 {
                    (((raw << shift) as i64) >> shift).cmp(&(op.value[0] as i64))
                } else {
                    ((raw << shift) >> shift).cmp(&op.value[0])
                };
                use std::cmp::Ordering::*;
                match op.kind {
                    filter::EQ => order == Equal,
                    filter::NE => order != Equal,
                    filter::LT => order == Less,
                    filter::LE => order != Greater,
                    filter::GT => order == Greater,
                    filter::GE => order != Less,
                    _ => unreachable!(),
                }
            };
            let next = if holds { op.on_true } else { op.on_false };
            match next {
                ACCEPT => return true,
                REJECT => return false,
                n => {
                    assert!(n as usize > pc, "jumps go forward");
                    pc = n as usize;
                }
            }
        }
        panic!("ran past MAX_OPS");
    }

    fn check(text: &str, regs: [u64; 7], string: &[u8]) -> bool {
        run(&compile(&parse(text).unwrap(), Some(&greet()), false).unwrap(), regs, string)
    }

    #[test]
    fn integers_follow_their_dwarf_width_and_sign() {
        // times = -1 in esi, garbage in the upper half of rsi.
        let regs = [0, 0xdead_beef_ffff_ffff, 1, 2, 0, 0, 0];
        assert!(check("times < 0", regs, b""));
        assert!(check("arg1 < 0", regs, b""));
        assert!(check("times == -1", regs, b""));
        assert!(!check("times > 0 && loud", regs, b""));
        assert!(check("loud && c == BLUE", regs, b""));
        assert!(check("c == GREEN || c == BLUE", regs, b""));
        assert!(!check("c == GREEN || c == RED", regs, b""));
        assert!(check("!(c == RED) && (times != 0 || loud == false)", regs, b""));
        // loud's upper bytes are not part of it.
        assert!(!check("loud", [0, 0, 0x100, 0, 0, 0, 0], b""));
    }

    #[test]
    fn strings_compare_whole_or_by_prefix() {
        let regs = [0x1000, 0, 0, 0, 0, 0, 0];
        assert!(check(r#"name == "bob""#, regs, b"bob"));
        assert!(!check(r#"name == "bob""#, regs, b"bobby"));
        assert!(!check(r#"name == "bob""#, regs, b"bo"));
        assert!(check(r#"name != "bob""#, regs, b"alice"));
        assert!(check(r#"name =~ "bo*""#, regs, b"bobby"));
        assert!(check(r#"name =~ "*""#, regs, b""));
        assert!(!check(r#"name =~ "bob*""#, regs, b"bo"));
        // A literal of the longest length against a longer argument.
        let long = "x".repeat(STRING_BYTES - 2);
        assert!(check(&format!("name == \"{long}\""), regs, long.as_bytes()));
        assert!(!check(&format!("name == \"{long}\""), regs, format!("{long}yyyy").as_bytes()));
    }

    #[test]
    fn type_errors_name_the_problem_at_the_spot() {
        let err = |text: &str| compile(&parse(text).unwrap(), Some(&greet()), false).unwrap_err();
        let e = err("name > 3");
        assert_eq!(e.at, 7);
        assert!(e.message.contains("is a string"), "{}", e.message);
        let e = err("nmae == 1");
        assert_eq!((e.at, e.message.as_str()), (0, "no parameter `nmae` (name, times, loud, c)"));
        assert!(err("c == PURPLE").message.contains("RED, GREEN, BLUE"));
        assert!(err("times == 3000000000").message.contains("outside the range"));
        assert!(err("loud == 2").message.contains("true or false"));
        assert!(err("times =~ \"a*\"").message.contains("compares strings"));
        assert!(err("name =~ \"a*b\"").message.contains("prefix"));
        assert!(err("ret == 0").message.contains("return value"));
        assert!(err("arg7 == 0").message.contains("arg0 to arg5"));
        let many = vec!["times == 1"; MAX_OPS + 1].join(" || ");
        assert!(err(&many).message.contains("comparisons"));
        // Without DWARF only positions work.
        let e = compile(&parse("times > 0").unwrap(), None, false).unwrap_err();
        assert!(e.message.contains("arg0 to arg5"));
        let p = compile(&parse("arg1 < 0").unwrap(), None, false).unwrap();
        assert!(run(&p, [0, u64::MAX, 0, 0, 0, 0, 0], b""));
        assert!(!run(&p, [0, 0xffff_ffff, 0, 0, 0, 0, 0], b""));
    }

    #[test]
    fn ret_if_reads_the_return_value_by_its_dwarf_type() {
        let mut layout = greet();
        let compiled = |text: &str, layout: Option<&FunctionLayout>| compile(&parse(text).unwrap(), layout, true);
        assert!(compiled("ret < 0", Some(&layout)).unwrap_err().message.contains("returns nothing"));
        layout.ret = Some(ValueLayout {
            name: String::new(),
            ty: ty("int", 4, Kind::Int { signed: true }),
            source: Source::Reg(Reg::Rax),
        });
        let p = compiled("ret < 0 && loud", Some(&layout)).unwrap();
        // -2 as an int in eax, garbage above; loud in rdx (the entry's).
        assert!(run(&p, [0, 0, 1, 0, 0, 0, 0xdead_beef_ffff_fffe], b""));
        assert!(!run(&p, [0, 0, 0, 0, 0, 0, 0xffff_fffe], b""));
        assert!(!run(&p, [0, 0, 1, 0, 0, 0, 2], b""));
        // Without DWARF, a 64-bit signed register.
        let p = compiled("ret == -1", None).unwrap();
        assert!(run(&p, [0, 0, 0, 0, 0, 0, u64::MAX], b""));
    }
}
