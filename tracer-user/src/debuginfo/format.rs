//! Raw captures to JSON values, by type:
//!
//! - integers as numbers, signed or unsigned by their type, of their width (the register's upper
//!   bits are ignored: the ABIs leave them undefined); 128-bit ones as numbers when they fit in
//!   64 bits, else as a decimal string;
//! - `bool` as `true`/`false` (a byte other than 0 or 1 as its number);
//! - `char` as a one-character string: C's when ASCII (another byte as its number), Rust's and
//!   `char16_t`/`char32_t` when a Unicode scalar value;
//! - enums by enumerator name, or the number when none matches;
//! - pointers as `"0x…"`;
//! - strings as strings (invalid UTF-8 replaced by U+FFFD); a null `char *` as `null`; a string
//!   longer than the bound as `{"string": first bytes, "truncated": true}` (a `&str` with its full
//!   `"length"`);
//! - anything that cannot be read as `{"unreadable": why}`.

use serde_json::{Value, json};

use super::{
    layout::{CapturedString, FunctionLayout, Registers, Source, StringStatus, ValueLayout},
    types::{Kind, Type},
};

/// The `params` of a call: every parameter, in declaration order. (A list, not a
/// `serde_json::Map`, which sorts its keys unless serde_json's `preserve_order` is on.)
pub fn format_params(layout: &FunctionLayout, regs: &Registers, strings: &[CapturedString]) -> Vec<(String, Value)> {
    layout.params.iter().map(|p| (p.name.clone(), format_value(p, regs, strings))).collect()
}

/// The `ret` value of a return, if the function returns one.
pub fn format_return(layout: &FunctionLayout, regs: &Registers, string: Option<&CapturedString>) -> Option<Value> {
    let ret = layout.ret.as_ref()?;
    Some(format_value(ret, regs, string.map(std::slice::from_ref).unwrap_or_default()))
}

pub fn unreadable(why: &str) -> Value {
    json!({ "unreadable": why })
}

/// One value from its source in the capture.
pub fn format_value(v: &ValueLayout, regs: &Registers, strings: &[CapturedString]) -> Value {
    match &v.source {
        Source::Unreadable(why) => unreadable(why),
        Source::Reg(r) => scalar(&v.ty, regs.get(*r)),
        Source::RegPair(lo, hi) => wide_int(&v.ty, regs.get(*lo), regs.get(*hi)),
        Source::String { index, ptr, len } => match strings.get(*index) {
            Some(s) => string(s, regs.get(*ptr), len.map(|l| regs.get(l))),
            None => unreadable("string not captured"),
        },
    }
}

/// The low `size` bytes of a register, sign-extended when `signed`.
fn int_bits(bits: u64, size: u64, signed: bool) -> i128 {
    let width = (size.clamp(1, 8) * 8) as u32;
    let v = if width == 64 { bits } else { bits & ((1u64 << width) - 1) };
    if signed {
        let shift = 64 - width;
        (((v << shift) as i64) >> shift) as i128
    } else {
        v as i128
    }
}

fn number(v: i128) -> Value {
    if let Ok(u) = u64::try_from(v) {
        Value::from(u)
    } else if let Ok(i) = i64::try_from(v) {
        Value::from(i)
    } else {
        Value::String(v.to_string())
    }
}

/// A scalar value (integer, bool, char, enum, pointer) of `ty` from the low bytes of `bits`.
pub fn scalar(ty: &Type, bits: u64) -> Value {
    match &ty.kind {
        Kind::Int { signed } => number(int_bits(bits, ty.size, *signed)),
        Kind::Bool => match bits & 0xff {
            0 => Value::Bool(false),
            1 => Value::Bool(true),
            other => Value::from(other),
        },
        Kind::Char { unicode: false, signed } => {
            let byte = int_bits(bits, 1, false) as u8;
            if byte.is_ascii() {
                Value::String(char::from(byte).to_string())
            } else {
                number(int_bits(bits, 1, *signed))
            }
        }
        Kind::Char { unicode: true, .. } => {
            let v = int_bits(bits, ty.size, false) as u32;
            match char::from_u32(v) {
                Some(c) => Value::String(c.to_string()),
                None => Value::from(v),
            }
        }
        Kind::Enum { signed, enumerators } => {
            let v = int_bits(bits, ty.size, *signed);
            match enumerators.iter().find(|e| e.value == v) {
                Some(e) => Value::String(e.name.clone()),
                None => number(v),
            }
        }
        Kind::Pointer | Kind::CString => Value::String(format!("{bits:#x}")),
        _ => unreadable("not a scalar"),
    }
}

fn wide_int(ty: &Type, lo: u64, hi: u64) -> Value {
    match ty.kind {
        Kind::Int { signed: true } => number((((hi as u128) << 64) | lo as u128) as i128),
        Kind::Int { signed: false } => {
            let v = ((hi as u128) << 64) | lo as u128;
            i128::try_from(v).map_or_else(|_| Value::String(v.to_string()), number)
        }
        _ => unreadable("not a 16-byte integer"),
    }
}

/// Bytes as text: UTF-8, with anything invalid (and a multi-byte character cut by the bound)
/// replaced by U+FFFD.
fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A captured string: complete, truncated (with the full `length` of a `&str`), null, or
/// unreadable at `ptr`.
pub fn string(s: &CapturedString, ptr: u64, len: Option<u64>) -> Value {
    match s.status {
        StringStatus::Complete => Value::String(text(s.bytes)),
        StringStatus::Truncated => {
            let mut v = json!({ "string": text(s.bytes), "truncated": true });
            if let Some(len) = len {
                v["length"] = Value::from(len);
            }
            v
        }
        StringStatus::Null => Value::Null,
        StringStatus::Fault => unreadable(&format!("memory at {ptr:#x} could not be read")),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::debuginfo::{
        layout::{CaptureError, Reg, encode_string, parse_strings},
        types::{Aggregate, AggregateKind, Enumerator},
    };

    fn ty(name: &str, size: u64, kind: Kind) -> Arc<Type> {
        Arc::new(Type { name: name.into(), size, kind })
    }

    fn reg(name: &str, ty: Arc<Type>, r: Reg) -> ValueLayout {
        ValueLayout { name: name.into(), ty, source: Source::Reg(r) }
    }

    fn one(v: &ValueLayout, bits: u64) -> Value {
        let mut regs = Registers::default();
        if let Source::Reg(r) = v.source {
            regs.0[r as usize] = bits;
        }
        format_value(v, &regs, &[])
    }

    #[test]
    fn integers_follow_their_type_width_and_sign() {
        let i8t = reg("a", ty("signed char", 1, Kind::Int { signed: true }), Reg::Rdi);
        let u8t = reg("a", ty("unsigned char", 1, Kind::Int { signed: false }), Reg::Rdi);
        let i16t = reg("a", ty("short", 2, Kind::Int { signed: true }), Reg::Rdi);
        let i32t = reg("a", ty("int", 4, Kind::Int { signed: true }), Reg::Rdi);
        let u32t = reg("a", ty("unsigned int", 4, Kind::Int { signed: false }), Reg::Rdi);
        let i64t = reg("a", ty("long", 8, Kind::Int { signed: true }), Reg::Rdi);
        let u64t = reg("a", ty("unsigned long", 8, Kind::Int { signed: false }), Reg::Rdi);
        // Upper bits that the ABI leaves undefined are ignored.
        assert_eq!(one(&i8t, 0xdead_beef_ffff_fffb), json!(-5));
        assert_eq!(one(&u8t, 0xdead_beef_ffff_ffc8), json!(200));
        assert_eq!(one(&i16t, 0x1234_fed4), json!(-300));
        assert_eq!(one(&i32t, 0xffff_ffff_fffe_ee90), json!(-70000));
        assert_eq!(one(&i32t, 0x7fff_ffff), json!(i32::MAX));
        assert_eq!(one(&u32t, 0xaaaa_aaaa_ee6b_2800), json!(4_000_000_000u32));
        assert_eq!(one(&i64t, (-5_000_000_000i64) as u64), json!(-5_000_000_000i64));
        assert_eq!(one(&i64t, i64::MIN as u64), json!(i64::MIN));
        assert_eq!(one(&u64t, u64::MAX), json!(u64::MAX));
    }

    #[test]
    fn wide_integers_are_numbers_when_they_fit_and_decimal_strings_otherwise() {
        let i128t = ValueLayout {
            name: "v".into(),
            ty: ty("__int128", 16, Kind::Int { signed: true }),
            source: Source::RegPair(Reg::Rdi, Reg::Rsi),
        };
        let u128t = ValueLayout { ty: ty("u128", 16, Kind::Int { signed: false }), ..i128t.clone() };
        let f = |v: &ValueLayout, lo: u64, hi: u64| format_value(v, &Registers::at_entry([lo, hi, 0, 0, 0, 0]), &[]);
        assert_eq!(f(&i128t, 2, 1), json!("18446744073709551618"));
        assert_eq!(f(&i128t, (-7i64) as u64, u64::MAX), json!(-7));
        assert_eq!(f(&i128t, 0, 1 << 63), json!(i128::MIN.to_string()));
        assert_eq!(f(&u128t, u64::MAX, u64::MAX), json!(u128::MAX.to_string()));
        assert_eq!(f(&u128t, 9, 0), json!(9));
    }

    #[test]
    fn bools_chars_enums_and_pointers() {
        let b = reg("b", ty("bool", 1, Kind::Bool), Reg::Rsi);
        assert_eq!(one(&b, 0xff00), json!(false));
        assert_eq!(one(&b, 0x1), json!(true));
        assert_eq!(one(&b, 0x7), json!(7), "not a bool: the number, not a guess");

        let c = reg("c", ty("char", 1, Kind::Char { signed: true, unicode: false }), Reg::Rdi);
        assert_eq!(one(&c, 0x4141), json!("A"));
        assert_eq!(one(&c, 0), json!("\u{0}"));
        assert_eq!(one(&c, 0xe9), json!(-23), "a byte of a multi-byte character: its number");
        let rc = reg("c", ty("char", 4, Kind::Char { signed: false, unicode: true }), Reg::Rdi);
        assert_eq!(one(&rc, 'é' as u64), json!("é"));
        assert_eq!(one(&rc, '🦀' as u64), json!("🦀"));
        assert_eq!(one(&rc, 0xd800), json!(0xd800), "a surrogate is no char");

        let enumerators: Arc<[Enumerator]> = Arc::from(vec![
            Enumerator { name: "LOW".into(), value: -1 },
            Enumerator { name: "MID".into(), value: 0 },
            Enumerator { name: "HIGH".into(), value: 1 },
        ]);
        let e = reg("lv", ty("enum level", 4, Kind::Enum { signed: true, enumerators }), Reg::Rdi);
        assert_eq!(one(&e, 0xffff_ffff), json!("LOW"));
        assert_eq!(one(&e, 1), json!("HIGH"));
        assert_eq!(one(&e, 5), json!(5));
        let flags: Arc<[Enumerator]> = Arc::from(vec![Enumerator { name: "BIG".into(), value: 200 }]);
        let u = reg("s", ty("Size", 1, Kind::Enum { signed: false, enumerators: flags }), Reg::Rdi);
        assert_eq!(one(&u, 0x1_00c8), json!("BIG"));

        let p = reg("p", ty("void *", 8, Kind::Pointer), Reg::R9);
        assert_eq!(one(&p, 0x7ffd_1234_5678), json!("0x7ffd12345678"));
        assert_eq!(one(&p, 0), json!("0x0"));
    }

    fn string_layout(kind: Kind) -> FunctionLayout {
        FunctionLayout {
            params: vec![ValueLayout {
                name: "name".into(),
                ty: ty("const char *", 8, kind),
                source: Source::String { index: 0, ptr: Reg::Rsi, len: Some(Reg::Rdx) },
            }],
            ret: None,
            probe: crate::debuginfo::layout::ProbeLayout::empty(8),
        }
    }

    #[test]
    fn strings_complete_truncated_null_and_faulted() {
        let layout = string_layout(Kind::CString);
        let regs = Registers::at_entry([0, 0x5000, 20, 0, 0, 0]);
        let f = |status, bytes: &[u8]| format_params(&layout, &regs, &[CapturedString { status, bytes }])[0].1.clone();
        assert_eq!(f(StringStatus::Complete, b"alice"), json!("alice"));
        assert_eq!(f(StringStatus::Complete, b""), json!(""));
        assert_eq!(
            f(StringStatus::Truncated, b"abcdefgh"),
            json!({"string": "abcdefgh", "truncated": true, "length": 20})
        );
        assert_eq!(f(StringStatus::Null, b""), Value::Null);
        assert_eq!(f(StringStatus::Fault, b""), json!({"unreadable": "memory at 0x5000 could not be read"}));
        // A multi-byte character cut by the bound, and bytes that are not UTF-8.
        assert_eq!(f(StringStatus::Truncated, &"abcdefé".as_bytes()[..7])["string"], json!("abcdef\u{fffd}"));
        assert_eq!(f(StringStatus::Complete, b"a\xffb"), json!("a\u{fffd}b"));
    }

    #[test]
    fn captured_strings_are_parsed_with_every_length_checked() {
        let mut tail = Vec::new();
        encode_string(StringStatus::Complete, b"alice", &mut tail);
        encode_string(StringStatus::Null, b"", &mut tail);
        encode_string(StringStatus::Truncated, b"12345678", &mut tail);
        let parsed = parse_strings(8, 3, &tail).unwrap();
        assert_eq!(parsed[0], CapturedString { status: StringStatus::Complete, bytes: b"alice" });
        assert_eq!(parsed[1].status, StringStatus::Null);
        assert_eq!(parsed[2].bytes, b"12345678");

        // Cut anywhere: an error, never a read past the end.
        for cut in 0..tail.len() {
            assert!(parse_strings(8, 3, &tail[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(parse_strings(8, 2, &tail), Err(CaptureError::Trailing(12)));
        assert_eq!(parse_strings(4, 1, &tail), Err(CaptureError::TooLong { index: 0, len: 5, max: 4 }));
        let mut bad = tail.clone();
        bad[0] = 9;
        assert_eq!(parse_strings(8, 3, &bad), Err(CaptureError::Status(9)));
        let mut lying = Vec::new();
        encode_string(StringStatus::Fault, b"x", &mut lying);
        assert!(matches!(parse_strings(8, 1, &lying), Err(CaptureError::BytesWithoutString { .. })));
        // A length far beyond the record.
        assert!(matches!(
            parse_strings(u16::MAX, 1, &[0, 0, 0xff, 0xff, b'a']),
            Err(CaptureError::Truncated { needed: 65535, left: 1, .. })
        ));
    }

    #[test]
    fn unreadable_values_say_why() {
        let v = ValueLayout {
            name: "d".into(),
            ty: ty("double", 8, Kind::Float { x87: false }),
            source: Source::Unreadable("in a floating-point register".into()),
        };
        assert_eq!(format_value(&v, &Registers::default(), &[]), json!({"unreadable": "in a floating-point register"}));
        let missing = ValueLayout {
            name: "s".into(),
            ty: ty("&str", 16, Kind::RustStr),
            source: Source::String { index: 3, ptr: Reg::Rdi, len: Some(Reg::Rsi) },
        };
        assert_eq!(format_value(&missing, &Registers::default(), &[]), json!({"unreadable": "string not captured"}));
        let agg = Kind::Aggregate(Aggregate { what: AggregateKind::Struct, leaves: None, align: 8, nontrivial: false });
        let s = reg("s", ty("struct pair", 8, agg), Reg::Rdi);
        assert_eq!(one(&s, 1), json!({"unreadable": "not a scalar"}));
    }
}
