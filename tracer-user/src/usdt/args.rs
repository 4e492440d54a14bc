//! USDT argument specs: where a probe's arguments are at the probe instruction.
//!
//! The note of a probe lists its arguments as assembler operands, each prefixed by its size and
//! sign, as the compiler chose them (`<sys/sdt.h>` passes each argument to `asm` with the
//! constraint `nor`): `8@%rdi` (an unsigned 8-byte register), `-4@-12(%rbp)` (a signed 4-byte
//! value in memory), `-4@$5` (a constant), `8@counter(%rip)` (a global, PC-relative),
//! `2@8(%rax,%rbx,2)` (memory with an index register). x86-64 AT&T syntax only.

/// An x86-64 general-purpose register (any of its widths: `%rdi`, `%edi`, `%di`, `%dil` are `Di`),
/// or the instruction pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Register {
    Ax,
    Bx,
    Cx,
    Dx,
    Si,
    Di,
    Bp,
    Sp,
    R8,
    R9,
    R10,
    R11,
    R12,
    R13,
    R14,
    R15,
    Ip,
}

impl Register {
    /// The field of the kernel's `struct pt_regs` (x86-64) that holds this register.
    pub fn pt_regs_field(self) -> &'static str {
        match self {
            Register::Ax => "ax",
            Register::Bx => "bx",
            Register::Cx => "cx",
            Register::Dx => "dx",
            Register::Si => "si",
            Register::Di => "di",
            Register::Bp => "bp",
            Register::Sp => "sp",
            Register::R8 => "r8",
            Register::R9 => "r9",
            Register::R10 => "r10",
            Register::R11 => "r11",
            Register::R12 => "r12",
            Register::R13 => "r13",
            Register::R14 => "r14",
            Register::R15 => "r15",
            Register::Ip => "ip",
        }
    }

    /// The register of a DWARF register number (x86-64 psABI), if a general one or rip (16, the
    /// return address column, is the probed instruction's address at a probe).
    pub fn from_dwarf(number: u16) -> Option<Register> {
        Some(match number {
            0 => Register::Ax,
            1 => Register::Dx,
            2 => Register::Cx,
            3 => Register::Bx,
            4 => Register::Si,
            5 => Register::Di,
            6 => Register::Bp,
            7 => Register::Sp,
            8 => Register::R8,
            9 => Register::R9,
            10 => Register::R10,
            11 => Register::R11,
            12 => Register::R12,
            13 => Register::R13,
            14 => Register::R14,
            15 => Register::R15,
            16 => Register::Ip,
            _ => return None,
        })
    }

    /// The register an AT&T name (without `%`) means. The high-byte registers (`%ah`..`%dh`) are
    /// not supported: they are not the low bytes of their register.
    fn parse(name: &str) -> Option<Register> {
        const LEGACY: [(&str, Register); 8] = [
            ("ax", Register::Ax),
            ("bx", Register::Bx),
            ("cx", Register::Cx),
            ("dx", Register::Dx),
            ("si", Register::Si),
            ("di", Register::Di),
            ("bp", Register::Bp),
            ("sp", Register::Sp),
        ];
        const NUMBERED: [Register; 8] = [
            Register::R8,
            Register::R9,
            Register::R10,
            Register::R11,
            Register::R12,
            Register::R13,
            Register::R14,
            Register::R15,
        ];
        if name == "rip" {
            return Some(Register::Ip);
        }
        let numbered = name
            .strip_prefix('r')
            .map(|rest| rest.split_at(rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len())));
        if let Some((digits, suffix)) = numbered
            && !digits.is_empty()
        {
            let n: usize = digits.parse().ok()?;
            return match (n, suffix) {
                (8..=15, "" | "d" | "w" | "b" | "l") => Some(NUMBERED[n - 8]),
                _ => None,
            };
        }
        // rax, eax, ax; rsi, esi, si, sil; al (the low byte of ax: "a" + "l").
        let base = name.strip_prefix('r').or_else(|| name.strip_prefix('e')).unwrap_or(name);
        if let Some(&(_, r)) = LEGACY.iter().find(|(n, _)| *n == base) {
            return Some(r);
        }
        let low_byte = match name {
            "al" => "ax",
            "bl" => "bx",
            "cl" => "cx",
            "dl" => "dx",
            "sil" => "si",
            "dil" => "di",
            "bpl" => "bp",
            "spl" => "sp",
            _ => return None,
        };
        LEGACY.iter().find(|(n, _)| *n == low_byte).map(|&(_, r)| r)
    }
}

/// Where an argument's value is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// `$5`
    Const(i64),
    /// `%rdi`
    Register(Register),
    /// `-12(%rbp)`, `(%rax)`, `8(%rax,%rbx,4)`: `base + index * scale + offset`.
    Memory { base: Register, index: Option<(Register, u8)>, offset: i64 },
    /// `counter(%rip)`, `table+8(%rip)`: the address of a symbol of the probe's file, plus an
    /// offset. Evaluated as PC-relative memory once the symbol's address is known.
    Symbol { name: String, offset: i64 },
}

/// One argument: its size in bytes (1, 2, 4 or 8), whether it is signed, and where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgSpec {
    pub size: u8,
    pub signed: bool,
    pub location: Location,
}

/// An argument the tracer cannot evaluate (the probe still fires; this argument is reported as
/// not read).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("argument '{text}': {reason}")]
pub struct ArgError {
    pub text: String,
    pub reason: ArgReason,
}

/// Why an argument cannot be evaluated; each names the part of the argument it is about.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArgReason {
    #[error("size {0} is not 1, 2, 4 or 8 bytes")]
    Size(i64),
    #[error("'{0}' is not a register")]
    NotARegister(String),
    #[error("register '{0}' is not supported")]
    Register(String),
    #[error("'{0}' is not a displacement")]
    Displacement(String),
    #[error("'{0}' is not an integer constant")]
    Constant(String),
    #[error("'{0}' is not an operand this tracer reads")]
    Operand(String),
    #[error("'{0}' has no closing ')'")]
    Unclosed(String),
    #[error("'{0}' has no base register")]
    NoBase(String),
    #[error("'{0}' is not a scale (1, 2, 4 or 8)")]
    Scale(String),
    #[error("'{0}' has too many parts")]
    TooManyParts(String),
    #[error("'{0}': a symbol is only supported relative to %rip (a link-time address)")]
    SymbolOffRip(String),
    #[error("'{0}': a numeric offset from %rip depends on an instruction the note does not have")]
    NumberOffRip(String),
    #[error("symbol '{0}' is not in the file's symbol tables")]
    UnknownSymbol(String),
}

/// A decimal or `0x` hexadecimal integer, possibly negative.
fn parse_int(text: &str) -> Option<i64> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let magnitude = match digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok()?,
        None if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => digits.parse::<u64>().ok()?,
        None => return None,
    };
    // Constants are 64-bit patterns: `$0xffffffffffffffff` is -1.
    Some(if negative { (magnitude as i64).wrapping_neg() } else { magnitude as i64 })
}

fn register(text: &str) -> Result<Register, ArgReason> {
    let name = text.strip_prefix('%').ok_or_else(|| ArgReason::NotARegister(text.into()))?;
    Register::parse(name).ok_or_else(|| ArgReason::Register(text.into()))
}

/// A displacement: a number, or a symbol with an optional `+N`/`-N`.
enum Displacement {
    Number(i64),
    Symbol(String, i64),
}

fn displacement(text: &str) -> Result<Displacement, ArgReason> {
    if text.is_empty() {
        return Ok(Displacement::Number(0));
    }
    if let Some(n) = parse_int(text) {
        return Ok(Displacement::Number(n));
    }
    // `sym`, `sym+8`, `sym-8`: split at the last sign that follows the name.
    let split = text.char_indices().skip(1).filter(|&(_, c)| c == '+' || c == '-').map(|(i, _)| i).last();
    let (name, offset) = match split {
        Some(i) => match parse_int(&text[i..]) {
            Some(offset) => (&text[..i], offset),
            None => (text, 0),
        },
        None => (text, 0),
    };
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$' | '@');
    if name.is_empty() || !name.chars().all(valid) || name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(ArgReason::Displacement(text.into()));
    }
    Ok(Displacement::Symbol(name.to_string(), offset))
}

fn location(operand: &str) -> Result<Location, ArgReason> {
    if let Some(imm) = operand.strip_prefix('$') {
        return parse_int(imm).map(Location::Const).ok_or_else(|| ArgReason::Constant(operand.into()));
    }
    if operand.starts_with('%') {
        return register(operand).map(Location::Register);
    }
    let open = operand.find('(').ok_or_else(|| ArgReason::Operand(operand.into()))?;
    let inner = operand[open + 1..].strip_suffix(')').ok_or_else(|| ArgReason::Unclosed(operand.into()))?;
    let disp = displacement(&operand[..open])?;
    let parts: Vec<&str> = inner.split(',').map(str::trim).collect();
    let base = match parts[0] {
        "" => return Err(ArgReason::NoBase(operand.into())),
        b => register(b)?,
    };
    let index = match parts.as_slice() {
        [_] => None,
        [_, i] | [_, i, ""] => Some((register(i)?, 1)),
        [_, i, s] => match s.parse::<u8>() {
            Ok(scale @ (1 | 2 | 4 | 8)) => Some((register(i)?, scale)),
            _ => return Err(ArgReason::Scale(s.to_string())),
        },
        _ => return Err(ArgReason::TooManyParts(operand.into())),
    };
    match (disp, base, index) {
        (Displacement::Symbol(name, offset), Register::Ip, None) => Ok(Location::Symbol { name, offset }),
        (Displacement::Symbol(..), _, _) => Err(ArgReason::SymbolOffRip(operand.into())),
        (Displacement::Number(_), Register::Ip, _) => Err(ArgReason::NumberOffRip(operand.into())),
        (Displacement::Number(offset), base, index) => Ok(Location::Memory { base, index, offset }),
    }
}

/// Parses one argument (`-4@-12(%rbp)`). Without a size prefix an argument is an unsigned 8-byte
/// value (the oldest notes have none).
pub fn parse_arg(text: &str) -> Result<ArgSpec, ArgError> {
    let error = |reason: ArgReason| ArgError { text: text.to_string(), reason };
    let (size, signed, operand) = match text.split_once('@') {
        // `@` can only separate a size from the operand when what precedes it is a number.
        Some((size, operand)) if parse_int(size).is_some() => {
            let n = parse_int(size).expect("checked");
            match n.unsigned_abs() {
                s @ (1 | 2 | 4 | 8) => (s as u8, n < 0, operand),
                _ => return Err(error(ArgReason::Size(n))),
            }
        }
        _ => (8, false, text),
    };
    let location = location(operand).map_err(error)?;
    Ok(ArgSpec { size, signed, location })
}

/// Parses a note's argument string (space-separated arguments), each on its own.
pub fn parse_args(text: &str) -> Vec<Result<ArgSpec, ArgError>> {
    text.split_ascii_whitespace().map(parse_arg).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> ArgSpec {
        parse_arg(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn registers_of_every_width() {
        for (text, size, signed, reg) in [
            ("8@%rdi", 8, false, Register::Di),
            ("-4@%eax", 4, true, Register::Ax),
            ("2@%si", 2, false, Register::Si),
            ("-1@%dil", 1, true, Register::Di),
            ("1@%al", 1, false, Register::Ax),
            ("8@%r8", 8, false, Register::R8),
            ("-4@%r9d", 4, true, Register::R9),
            ("2@%r10w", 2, false, Register::R10),
            ("1@%r15b", 1, false, Register::R15),
            ("8@%rsp", 8, false, Register::Sp),
            ("4@%ebp", 4, false, Register::Bp),
            ("-8@%rbx", 8, true, Register::Bx),
        ] {
            assert_eq!(ok(text), ArgSpec { size, signed, location: Location::Register(reg) }, "{text}");
        }
    }

    #[test]
    fn memory_constants_and_symbols() {
        assert_eq!(
            ok("-4@-12(%rbp)"),
            ArgSpec {
                size: 4,
                signed: true,
                location: Location::Memory { base: Register::Bp, index: None, offset: -12 }
            }
        );
        assert_eq!(ok("8@(%rax)").location, Location::Memory { base: Register::Ax, index: None, offset: 0 });
        assert_eq!(ok("8@-80(%rbx)").location, Location::Memory { base: Register::Bx, index: None, offset: -80 });
        assert_eq!(
            ok("2@8(%rax,%rbx,2)").location,
            Location::Memory { base: Register::Ax, index: Some((Register::Bx, 2)), offset: 8 }
        );
        assert_eq!(
            ok("4@0x10(%r12,%rcx)").location,
            Location::Memory { base: Register::R12, index: Some((Register::Cx, 1)), offset: 16 }
        );
        assert_eq!(ok("-4@$5").location, Location::Const(5));
        assert_eq!(ok("-4@$-3").location, Location::Const(-3));
        assert_eq!(ok("8@$0xffffffffffffffff").location, Location::Const(-1));
        assert_eq!(ok("-4@counter(%rip)").location, Location::Symbol { name: "counter".into(), offset: 0 });
        assert_eq!(ok("8@table+8(%rip)").location, Location::Symbol { name: "table".into(), offset: 8 });
        assert_eq!(ok("1@flag.0-1(%rip)").location, Location::Symbol { name: "flag.0".into(), offset: -1 });
        // No size: an unsigned 8-byte value.
        assert_eq!(ok("%rsi"), ArgSpec { size: 8, signed: false, location: Location::Register(Register::Si) });
    }

    #[test]
    fn a_whole_note_string() {
        let args = parse_args("8@%rdx 8@-80(%rbx)  -4@$7");
        assert_eq!(args.len(), 3);
        assert!(args.iter().all(Result::is_ok), "{args:?}");
        assert!(parse_args("").is_empty());
    }

    #[test]
    fn says_what_it_does_not_support() {
        for (text, reason) in [
            ("3@%rax", "size 3 is not 1, 2, 4 or 8 bytes"),
            ("1@%ah", "register '%ah' is not supported"),
            ("8@%xmm0", "register '%xmm0' is not supported"),
            ("8@16(%rip)", "'16(%rip)': a numeric offset from %rip depends on an instruction the note does not have"),
            ("8@sym(%rax)", "'sym(%rax)': a symbol is only supported relative to %rip (a link-time address)"),
            ("8@(,%rax,4)", "'(,%rax,4)' has no base register"),
            ("8@4(%rax,%rbx,3)", "'3' is not a scale (1, 2, 4 or 8)"),
            ("-4@$x", "'$x' is not an integer constant"),
            ("8@4(%rax", "'4(%rax' has no closing ')'"),
        ] {
            let error = parse_arg(text).unwrap_err();
            assert_eq!((error.text.as_str(), error.reason.to_string()), (text, reason.to_string()), "{text}");
        }
    }
}
