//! What a probe captures for one function, in two halves:
//!
//! - [`ProbeLayout`]: compact, fixed-size and versioned, for the kernel program, which finds it in
//!   a map keyed by the probe's cookie. It says only what costs work in the kernel: which string
//!   parameters (and string return value) to read from the target's memory, from which registers,
//!   and how many bytes at most. Registers themselves cost nothing to capture: a call record
//!   carries all six argument registers, a return record rax and rdx.
//! - [`FunctionLayout`]: the user-space side, per value: its name, its type and where its raw
//!   bits are in the capture ([`Source`]), which [`super::format`] turns into JSON.
//!
//! The raw capture is [`Registers`] plus, for each string read of the layout in order, a
//! [`CapturedString`]: a 4-byte header (status, reserved, length as little-endian `u16`) and the
//! bytes (see [`parse_strings`]). The kernel reads a C string with `bpf_probe_read_user_str` into
//! `string_size + 2` bytes (one more than kept, and the NUL) and marks it truncated when more than
//! `string_size` came before the NUL; a
//! `&str` has its length in a register, and is truncated when that exceeds `string_size`.

use std::sync::Arc;

use super::{
    Param, Signature,
    abi::{Place, Unknown},
    types::{Kind, Type},
};

pub const LAYOUT_VERSION: u8 = 1;
/// At most one string per argument register.
pub const MAX_STRINGS: usize = tracer_common::strings::MAX_STRINGS;
pub const DEFAULT_STRING_SIZE: u16 = 64;
/// The largest `--string-size`: six strings of it keep a call record within a few pages.
pub const MAX_STRING_SIZE: u16 = tracer_common::strings::MAX_STRING_SIZE;

/// A register a probe captures, numbered as the capture stores them: the argument registers in
/// argument order (a call record's `args`), then rax. At return, rdx (the second half of a
/// 16-byte return value) is in `Rdx`'s slot.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reg {
    Rdi = 0,
    Rsi = 1,
    Rdx = 2,
    Rcx = 3,
    R8 = 4,
    R9 = 5,
    Rax = 6,
}

impl Reg {
    pub const COUNT: usize = 7;

    /// From a DWARF x86-64 register number; `None` for registers that hold no argument or
    /// return value.
    pub fn from_dwarf(number: u16) -> Option<Reg> {
        Some(match number {
            0 => Reg::Rax,
            1 => Reg::Rdx,
            2 => Reg::Rcx,
            4 => Reg::Rsi,
            5 => Reg::Rdi,
            8 => Reg::R8,
            9 => Reg::R9,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Reg::Rdi => "rdi",
            Reg::Rsi => "rsi",
            Reg::Rdx => "rdx",
            Reg::Rcx => "rcx",
            Reg::R8 => "r8",
            Reg::R9 => "r9",
            Reg::Rax => "rax",
        }
    }
}

impl TryFrom<u8> for Reg {
    type Error = LayoutError;
    fn try_from(v: u8) -> Result<Reg, LayoutError> {
        [Reg::Rdi, Reg::Rsi, Reg::Rdx, Reg::Rcx, Reg::R8, Reg::R9, Reg::Rax]
            .get(v as usize)
            .copied()
            .ok_or(LayoutError::Register(v))
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    #[error("probe layout of {0} bytes, expected {expected}", expected = ProbeLayout::SIZE)]
    Size(usize),
    #[error("probe layout version {0}, expected {LAYOUT_VERSION}")]
    Version(u8),
    #[error("unknown register {0} in a probe layout")]
    Register(u8),
    #[error("unknown string kind {0} in a probe layout")]
    StringKind(u8),
    #[error("probe layout with {0} strings, at most {MAX_STRINGS}")]
    StringCount(u8),
    #[error("probe layout string size {0}, at most {MAX_STRING_SIZE}")]
    StringSize(u16),
}

#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StringKind {
    None = 0,
    /// NUL-terminated, its address in `ptr`.
    CString = 1,
    /// Address in `ptr`, length in `len` (Rust `&str`).
    Slice = 2,
}

impl TryFrom<u8> for StringKind {
    type Error = LayoutError;
    fn try_from(v: u8) -> Result<StringKind, LayoutError> {
        match v {
            0 => Ok(StringKind::None),
            1 => Ok(StringKind::CString),
            2 => Ok(StringKind::Slice),
            other => Err(LayoutError::StringKind(other)),
        }
    }
}

/// One string to read: a [`StringKind`] and [`Reg`] numbers.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StringRead {
    pub kind: u8,
    pub ptr: u8,
    pub len: u8,
    pub reserved: u8,
}

impl StringRead {
    fn new(kind: StringKind, ptr: Reg, len: Option<Reg>) -> StringRead {
        StringRead { kind: kind as u8, ptr: ptr as u8, len: len.map_or(0, |r| r as u8), reserved: 0 }
    }

    fn validate(&self) -> Result<(), LayoutError> {
        if StringKind::try_from(self.kind)? != StringKind::None {
            Reg::try_from(self.ptr)?;
            Reg::try_from(self.len)?;
        }
        Ok(())
    }
}

/// The kernel's half of a function's layout (see the module's comment). Plain integers, no
/// padding: the map value that stage 2 of the kernel program reads.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeLayout {
    pub version: u8,
    /// How many of `entry` to read at the entry probe.
    pub entry_strings: u8,
    /// Bytes read per string at most.
    pub string_size: u16,
    pub entry: [StringRead; MAX_STRINGS],
    /// The return value, if it is a string (`kind` is `None` otherwise).
    pub ret: StringRead,
}

impl ProbeLayout {
    pub const SIZE: usize = tracer_common::strings::LAYOUT_SIZE;

    pub fn empty(string_size: u16) -> ProbeLayout {
        ProbeLayout {
            version: LAYOUT_VERSION,
            entry_strings: 0,
            string_size,
            entry: [StringRead::default(); MAX_STRINGS],
            ret: StringRead::default(),
        }
    }

    /// Whether the probes need to read anything beyond registers.
    pub fn reads_memory(&self) -> bool {
        self.entry_strings > 0 || self.ret.kind != StringKind::None as u8
    }

    pub fn to_bytes(&self) -> [u8; ProbeLayout::SIZE] {
        let mut out = [0u8; ProbeLayout::SIZE];
        out[0] = self.version;
        out[1] = self.entry_strings;
        out[2..4].copy_from_slice(&self.string_size.to_le_bytes());
        for (i, s) in self.entry.iter().chain(std::iter::once(&self.ret)).enumerate() {
            out[4 + 4 * i..8 + 4 * i].copy_from_slice(&[s.kind, s.ptr, s.len, s.reserved]);
        }
        out
    }

    /// Reads and checks a layout: its size, version, counts and every register and kind.
    pub fn from_bytes(bytes: &[u8]) -> Result<ProbeLayout, LayoutError> {
        if bytes.len() != ProbeLayout::SIZE {
            return Err(LayoutError::Size(bytes.len()));
        }
        if bytes[0] != LAYOUT_VERSION {
            return Err(LayoutError::Version(bytes[0]));
        }
        let read = |i: usize| StringRead {
            kind: bytes[4 + 4 * i],
            ptr: bytes[5 + 4 * i],
            len: bytes[6 + 4 * i],
            reserved: bytes[7 + 4 * i],
        };
        let layout = ProbeLayout {
            version: bytes[0],
            entry_strings: bytes[1],
            string_size: u16::from_le_bytes([bytes[2], bytes[3]]),
            entry: std::array::from_fn(read),
            ret: read(MAX_STRINGS),
        };
        if layout.entry_strings as usize > MAX_STRINGS {
            return Err(LayoutError::StringCount(layout.entry_strings));
        }
        if layout.string_size > MAX_STRING_SIZE {
            return Err(LayoutError::StringSize(layout.string_size));
        }
        for s in layout.entry.iter().chain(std::iter::once(&layout.ret)) {
            s.validate()?;
        }
        Ok(layout)
    }
}

/// Where a value's raw bits are in the capture.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    Reg(Reg),
    /// A 16-byte integer, low half first.
    RegPair(Reg, Reg),
    /// The `index`th captured string (its pointer in `ptr`, its length in `len` for `&str`).
    String {
        index: usize,
        ptr: Reg,
        len: Option<Reg>,
    },
    /// Not readable at the probe: why.
    Unreadable(String),
}

/// One parameter or return value: its name, type and source.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueLayout {
    pub name: String,
    pub ty: Arc<Type>,
    pub source: Source,
}

/// Both halves of a function's layout.
#[derive(Clone, Debug, PartialEq)]
pub struct FunctionLayout {
    pub params: Vec<ValueLayout>,
    pub ret: Option<ValueLayout>,
    pub probe: ProbeLayout,
}

/// A short phrase for a place that cannot be read at the probe, or for why it is unknown.
fn unreadable(place: Result<&Place, &Unknown>) -> String {
    let place_name = |p: &Place| match p {
        Place::Reg(r) | Place::Reference(r) => r.name().to_string(),
        Place::RegPair(a, b) => format!("{}:{}", a.name(), b.name()),
        Place::Stack { offset, .. } => format!("stack+{offset}"),
        Place::Float => "xmm".into(),
        Place::PartlyFloat => "a register and xmm".into(),
        Place::Split => "a register and the stack".into(),
        Place::Nothing => "nothing".into(),
    };
    match place {
        Ok(Place::Float) => "in a floating-point register".into(),
        Ok(Place::PartlyFloat) => "partly in a floating-point register".into(),
        Ok(Place::Split) => "partly on the stack".into(),
        Ok(Place::Stack { spilled: true, .. }) => "on the stack: no integer register was left".into(),
        Ok(Place::Stack { spilled: false, .. }) => "passed in memory, on the stack".into(),
        Ok(Place::Reference(_)) => "passed by reference".into(),
        Ok(Place::Nothing) => "zero-sized: nothing is passed".into(),
        Ok(p @ (Place::Reg(_) | Place::RegPair(..))) => format!("in {}, which does not fit its type", place_name(p)),
        Err(Unknown::OptimizedOut) => "optimized out".into(),
        Err(Unknown::PartlyOptimizedOut) => "partly optimized out".into(),
        Err(Unknown::Expression) => "computed, not in a register".into(),
        Err(Unknown::FrameSlot) => "in a stack slot, not yet written at entry".into(),
        Err(Unknown::Conflict { abi, dwarf }) => {
            format!("DWARF says {}, the calling convention {}", place_name(dwarf), place_name(abi))
        }
        Err(Unknown::Type(why)) => why.clone(),
    }
}

/// The source of a value of type `ty` at `place`; a string read is added to `strings`.
fn source(ty: &Type, place: Result<&Place, &Unknown>, strings: &mut Vec<StringRead>, max: usize) -> Source {
    let mut string = |read: StringRead, ptr: Reg, len: Option<Reg>| {
        if strings.len() == max {
            return Source::Unreadable("more strings than a probe reads".into());
        }
        strings.push(read);
        Source::String { index: strings.len() - 1, ptr, len }
    };
    match (&ty.kind, place) {
        (Kind::CString, Ok(Place::Reg(r))) => string(StringRead::new(StringKind::CString, *r, None), *r, None),
        (Kind::RustStr, Ok(Place::RegPair(p, l))) => {
            string(StringRead::new(StringKind::Slice, *p, Some(*l)), *p, Some(*l))
        }
        (Kind::Float { .. }, Ok(Place::Float)) => Source::Unreadable(unreadable(place)),
        (Kind::Aggregate(a), Ok(Place::Reg(_) | Place::RegPair(..))) => {
            Source::Unreadable(format!("{} of {} bytes: members are not decoded", a.what.noun(), ty.size))
        }
        (Kind::Unknown { why }, _) => Source::Unreadable(format!("type {} is not modelled: {why}", ty.name)),
        (Kind::Int { .. }, Ok(Place::RegPair(a, b))) if ty.size == 16 => Source::RegPair(*a, *b),
        (Kind::Int { .. } | Kind::Bool | Kind::Char { .. } | Kind::Enum { .. } | Kind::Pointer, Ok(Place::Reg(r)))
            if ty.size <= 8 =>
        {
            Source::Reg(*r)
        }
        _ => Source::Unreadable(unreadable(place)),
    }
}

impl FunctionLayout {
    /// The layout of a function with this signature; strings bounded to `string_size` bytes
    /// (at most [`MAX_STRING_SIZE`]).
    pub fn new(signature: &Signature, string_size: u16) -> FunctionLayout {
        let mut probe = ProbeLayout::empty(string_size.min(MAX_STRING_SIZE));
        let mut strings = Vec::new();
        let params = keyed_names(&signature.params)
            .into_iter()
            .zip(&signature.params)
            .map(|(name, p)| ValueLayout {
                name,
                ty: p.ty.clone(),
                source: source(&p.ty, p.entry.as_ref(), &mut strings, MAX_STRINGS),
            })
            .collect();
        probe.entry_strings = strings.len() as u8;
        probe.entry[..strings.len()].copy_from_slice(&strings);
        let ret = signature.ret.as_ref().map(|r| {
            let mut ret_strings = Vec::new();
            let source = source(&r.ty, r.place.as_ref(), &mut ret_strings, 1);
            if let Some(read) = ret_strings.first() {
                probe.ret = *read;
            }
            ValueLayout { name: "return".into(), ty: r.ty.clone(), source }
        });
        FunctionLayout { params, ret, probe }
    }
}

impl super::types::AggregateKind {
    pub fn noun(self) -> &'static str {
        match self {
            super::types::AggregateKind::Struct => "a struct",
            super::types::AggregateKind::Union => "a union",
            super::types::AggregateKind::Array => "an array",
            super::types::AggregateKind::CharArray => "a char array",
            super::types::AggregateKind::RustEnum => "an enum",
        }
    }
}

/// The keys of the `params` object: each parameter's name, `argN` for an unnamed one (N counts
/// from 0 in declaration order), and `name#N` for a repeated name.
fn keyed_names(params: &[Param]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let name = match p.name.as_deref() {
                None | Some("") | Some("_") => format!("arg{i}"),
                Some(n) => n.to_string(),
            };
            if seen.insert(name.clone()) { name } else { format!("{name}#{i}") }
        })
        .collect()
}

/// The registers a probe captured, indexed by [`Reg`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Registers(pub [u64; Reg::COUNT]);

impl Registers {
    /// At entry: a call record's six argument registers.
    pub fn at_entry(args: [u64; 6]) -> Registers {
        let mut r = [0; Reg::COUNT];
        r[..6].copy_from_slice(&args);
        Registers(r)
    }

    /// At return: rax and rdx.
    pub fn at_return(rax: u64, rdx: u64) -> Registers {
        let mut r = [0; Reg::COUNT];
        r[Reg::Rax as usize] = rax;
        r[Reg::Rdx as usize] = rdx;
        Registers(r)
    }

    pub fn get(&self, reg: Reg) -> u64 {
        self.0[reg as usize]
    }
}

#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StringStatus {
    /// All of it (a C string up to its NUL, a `&str` of its full length).
    Complete = 0,
    /// Its first `string_size` bytes.
    Truncated = 1,
    /// The read faulted (an invalid pointer, or memory not paged in): no bytes.
    Fault = 2,
    /// The pointer was null: not read.
    Null = 3,
}

impl TryFrom<u8> for StringStatus {
    type Error = CaptureError;
    fn try_from(v: u8) -> Result<StringStatus, CaptureError> {
        match v {
            0 => Ok(StringStatus::Complete),
            1 => Ok(StringStatus::Truncated),
            2 => Ok(StringStatus::Fault),
            3 => Ok(StringStatus::Null),
            other => Err(CaptureError::Status(other)),
        }
    }
}

/// One captured string, borrowed from the record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CapturedString<'a> {
    pub status: StringStatus,
    pub bytes: &'a [u8],
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CaptureError {
    #[error("captured string {index} is cut off: {needed} bytes needed, {left} left")]
    Truncated { index: usize, needed: usize, left: usize },
    #[error("captured string {index} has {len} bytes, more than the layout's {max}")]
    TooLong { index: usize, len: usize, max: usize },
    #[error("unknown captured string status {0}")]
    Status(u8),
    #[error("captured string {index} has status {status:?} but {len} bytes")]
    BytesWithoutString { index: usize, status: StringStatus, len: usize },
    #[error("{0} bytes after the last captured string")]
    Trailing(usize),
}

const STRING_HEADER: usize = 4;

/// Appends one captured string as the kernel writes it.
pub fn encode_string(status: StringStatus, bytes: &[u8], out: &mut Vec<u8>) {
    let len = u16::try_from(bytes.len()).expect("a captured string is at most MAX_STRING_SIZE bytes");
    out.extend_from_slice(&[status as u8, 0]);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Reads `count` captured strings from a record's tail, checking every length against the
/// bytes there and against the layout's bound before reading, and that nothing is left over.
pub fn parse_strings<'a>(
    string_size: u16,
    count: usize,
    mut tail: &'a [u8],
) -> Result<Vec<CapturedString<'a>>, CaptureError> {
    let mut out = Vec::with_capacity(count);
    for index in 0..count {
        let Some((header, rest)) = tail.split_first_chunk::<STRING_HEADER>() else {
            return Err(CaptureError::Truncated { index, needed: STRING_HEADER, left: tail.len() });
        };
        let status = StringStatus::try_from(header[0])?;
        let len = u16::from_le_bytes([header[2], header[3]]) as usize;
        if len > string_size as usize {
            return Err(CaptureError::TooLong { index, len, max: string_size as usize });
        }
        if len > 0 && matches!(status, StringStatus::Fault | StringStatus::Null) {
            return Err(CaptureError::BytesWithoutString { index, status, len });
        }
        if rest.len() < len {
            return Err(CaptureError::Truncated { index, needed: len, left: rest.len() });
        }
        let (bytes, rest) = rest.split_at(len);
        out.push(CapturedString { status, bytes });
        tail = rest;
    }
    if !tail.is_empty() {
        return Err(CaptureError::Trailing(tail.len()));
    }
    Ok(out)
}
