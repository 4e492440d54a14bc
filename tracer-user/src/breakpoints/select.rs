//! Resolving `-B` and `-w` against the executable's DWARF: the breakpoints' addresses, file
//! offsets and locals (as USDT argument specs the kernel evaluates), the watched variables'
//! addresses and types.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use object::{Object as _, ObjectSegment as _};
use tracer_common::{ProbeLayoutBytes, RecordKind, USDT_MAX_ARGS, UsdtArgKind, UsdtArgSpec, UsdtSpec};

use super::{
    BreakpointError,
    spec::{BreakSpec, WatchSpec, WatchTarget},
};
use crate::kernel::sites::Access;
use crate::{
    debuginfo::{
        DebugInfo, DebugSearch,
        layout::{MAX_STRING_SIZE, MAX_STRINGS, ProbeLayout, StringKind, StringRead},
        source_map::{CallFrames, Local, LocalPlace, SourceMap},
        types::{AggregateKind, Kind, Type},
    },
    usdt::{
        args::{ArgSpec, Location, Register},
        select::{RegisterOffsets, arg_spec},
    },
};

/// How a local's value is read at a breakpoint.
#[derive(Clone, Debug, PartialEq)]
pub enum LocalRead {
    /// The record's argument at this index (evaluated by the kernel).
    Arg(usize),
    /// Known without reading (a constant the compiler folded in).
    Bits(u64),
    /// The string at the address in the record's argument `arg`: the record's `index`th string.
    String { arg: usize, index: usize },
    /// `"optimized_out"`: DWARF has no location for it here.
    OptimizedOut,
    /// Shown as `{"unreadable": why}`.
    Unreadable(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct LocalSlot {
    pub name: String,
    pub ty: Arc<Type>,
    pub read: LocalRead,
}

/// One breakpoint address: what its records are decoded with.
#[derive(Clone, Debug, PartialEq)]
pub struct BreakSite {
    pub function: Option<Arc<str>>,
    pub file: Arc<str>,
    pub line: u32,
    pub module: Arc<str>,
    pub locals: Vec<LocalSlot>,
    /// How many strings follow its records, each of at most `string_size` bytes.
    pub strings: usize,
    pub string_size: u16,
}

/// One breakpoint probe to attach: where, and the spec of its locals.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakProbe {
    pub path: PathBuf,
    pub file_offset: u64,
    pub spec: UsdtSpec,
}

/// A watched variable.
#[derive(Clone, Debug, PartialEq)]
pub struct WatchVariable {
    pub name: Arc<str>,
    /// Its link-time address in the executable, or (`absolute`) the address in the process.
    pub address: u64,
    pub absolute: bool,
    pub len: u8,
    pub access: Access,
    pub ty: Arc<Type>,
}

/// Where the executable's code goes when loaded: whether it is position-independent, and its
/// first segment's link-time address (what the load bias is taken from).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExeLayout {
    pub pie: bool,
    pub first_vaddr: u64,
}

/// Everything resolved.
#[derive(Debug, Default)]
pub struct Selection {
    pub exe: PathBuf,
    pub layout: ExeLayout,
    /// Probes and sites in the same order (a site's index is its probe's).
    pub break_probes: Vec<BreakProbe>,
    pub break_sites: Vec<BreakSite>,
    pub watches: Vec<WatchVariable>,
    /// The executable's line table: where a watchpoint's writing instruction is.
    pub source_map: Arc<SourceMap>,
    /// Things the user should know: locals that cannot be read.
    pub warnings: Vec<String>,
}

impl Selection {
    pub fn is_empty(&self) -> bool {
        self.break_probes.is_empty() && self.watches.is_empty()
    }
}

/// How the kernel reads a local.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reading {
    /// As one integer of this many bytes (1 to 8).
    Scalar(u8),
    /// A `char *`: the pointer, then the string it points at.
    StringAt,
    /// A `char[N]`: its address, then the string it holds.
    StringIn,
}

fn reading(ty: &Type) -> Option<Reading> {
    match &ty.kind {
        Kind::CString if ty.size == 8 => Some(Reading::StringAt),
        Kind::Aggregate(a) if a.what == AggregateKind::CharArray => Some(Reading::StringIn),
        Kind::Int { .. } | Kind::Bool | Kind::Char { .. } | Kind::Enum { .. } | Kind::Pointer
            if (1..=8).contains(&ty.size) =>
        {
            Some(Reading::Scalar(ty.size as u8))
        }
        _ => None,
    }
}

/// A local's slot and, when the kernel reads it, its argument spec (and, for a string, the
/// index of that argument in `strings`, the breakpoint's string reads).
fn local_slot(
    local: Local,
    args: &mut Vec<UsdtArgSpec>,
    strings: &mut Vec<usize>,
    regs: &RegisterOffsets,
) -> LocalSlot {
    let Local { name, ty, place } = local;
    let unreadable = |why: &str| LocalRead::Unreadable(why.to_string());
    let read = match (place, reading(&ty)) {
        (LocalPlace::OptimizedOut, _) => LocalRead::OptimizedOut,
        (LocalPlace::Unsupported(why), _) => LocalRead::Unreadable(why),
        (_, None) => unreadable(
            "not a scalar or a string (only integers, chars, enums, pointers and strings are read at breakpoints)",
        ),
        (LocalPlace::Const(value), Some(Reading::Scalar(_))) => LocalRead::Bits(value as u64),
        (LocalPlace::Const(_), Some(_)) => unreadable("a string whose address the compiler folded in"),
        (LocalPlace::Register(_), Some(Reading::StringIn)) => unreadable("a char array kept in registers"),
        (_, Some(_)) if args.len() == USDT_MAX_ARGS => unreadable("more locals in scope than a breakpoint reads"),
        (_, Some(Reading::StringAt | Reading::StringIn)) if strings.len() == MAX_STRINGS => {
            unreadable("more strings in scope than a breakpoint reads")
        }
        (place, Some(reading)) => {
            let location = match place {
                LocalPlace::Register(r) => Register::from_dwarf(r).map(Location::Register),
                LocalPlace::Memory { register, offset } => {
                    Register::from_dwarf(register).map(|base| Location::Memory { base, index: None, offset })
                }
                _ => None,
            };
            match location {
                Some(location) => {
                    let size = if let Reading::Scalar(size) = reading { size } else { 8 };
                    let mut spec = arg_spec(&ArgSpec { size, signed: false, location }, regs);
                    if reading == Reading::StringIn {
                        // The array's bytes are the string: its address is what the read starts at.
                        spec.kind = UsdtArgKind::Address as u32;
                    }
                    args.push(spec);
                    let arg = args.len() - 1;
                    if reading == Reading::Scalar(size) {
                        LocalRead::Arg(arg)
                    } else {
                        strings.push(arg);
                        LocalRead::String { arg, index: strings.len() - 1 }
                    }
                }
                None => unreadable("in a register the kernel does not save"),
            }
        }
    };
    LocalSlot { name, ty, read }
}

/// A breakpoint's string reads in a probe layout whose "registers" are its evaluated locals.
fn string_reads(strings: &[usize], string_size: u16) -> ProbeLayoutBytes {
    if strings.is_empty() {
        return [0; tracer_common::strings::LAYOUT_SIZE];
    }
    let mut layout = ProbeLayout::empty(string_size.min(MAX_STRING_SIZE));
    layout.entry_strings = strings.len() as u8;
    for (read, &arg) in layout.entry.iter_mut().zip(strings) {
        *read = StringRead { kind: StringKind::CString as u8, ptr: arg as u8, len: 0, reserved: 0 };
    }
    layout.to_bytes()
}

/// The file offset of a link-time address, from the `PT_LOAD` segments.
fn file_offset(file: &object::File, address: u64) -> Option<u64> {
    file.segments().find_map(|s| {
        let (offset, size) = s.file_range();
        let start = s.address();
        (address >= start && address - start < size).then(|| address - start + offset)
    })
}

/// Resolves `breaks` and `watches` in the executable at `exe`.
pub fn select(
    exe: &Path,
    breaks: &[BreakSpec],
    watches: &[WatchSpec],
    regs: &RegisterOffsets,
    string_size: u16,
) -> Result<Selection, BreakpointError> {
    if watches.len() > tracer_common::MAX_WATCHPOINTS {
        return Err(BreakpointError::TooManyWatches(watches.len()));
    }
    let mut selection = Selection { exe: exe.to_owned(), ..Selection::default() };
    if breaks.is_empty() && watches.is_empty() {
        return Ok(selection);
    }
    let data = crate::mapped_file::MappedFile::open(exe)
        .map_err(|source| BreakpointError::Read { path: exe.to_owned(), source })?;
    let file = object::File::parse(&*data)
        .map_err(|e| BreakpointError::NotElf { path: exe.to_owned(), reason: e.to_string() })?;
    selection.layout = ExeLayout {
        pie: file.kind() == object::ObjectKind::Dynamic,
        first_vaddr: file.segments().map(|s| s.address()).min().unwrap_or(0),
    };
    let needs_dwarf = !breaks.is_empty() || watches.iter().any(|w| matches!(w.target, WatchTarget::Variable(_)));
    let found = DebugInfo::find(exe, &data, &DebugSearch::default())?;
    let info = match found.info {
        Some(info) => Some(info),
        None if needs_dwarf => return Err(BreakpointError::NoDebugInfo(exe.to_owned())),
        None => None,
    };
    let source_map = match &info {
        Some(info) => info.source_map()?,
        None => SourceMap::default(),
    };
    let module: Arc<str> = Arc::from(exe.to_string_lossy());

    for w in watches {
        let variable = match &w.target {
            WatchTarget::Variable(name) => {
                let info = info.as_ref().expect("DWARF is required for variables");
                let global = info
                    .global(name)?
                    .ok_or_else(|| BreakpointError::NoVariable { name: name.clone(), path: exe.to_owned() })?;
                let len = match global.ty.size {
                    1 | 2 | 4 | 8 if global.address % global.ty.size == 0 => global.ty.size as u8,
                    size => return Err(BreakpointError::BadSize { name: name.clone(), size }),
                };
                WatchVariable {
                    name: Arc::from(name.as_str()),
                    address: global.address,
                    absolute: false,
                    len,
                    access: w.access,
                    ty: global.ty,
                }
            }
            WatchTarget::Address { address, len } => WatchVariable {
                name: Arc::from(format!("{address:#x}")),
                address: *address,
                absolute: true,
                len: *len,
                access: w.access,
                ty: Arc::new(Type {
                    name: format!("uint{}_t", u32::from(*len) * 8),
                    size: u64::from(*len),
                    kind: Kind::Int { signed: false },
                }),
            },
        };
        selection.watches.push(variable);
    }

    let mut addresses: Vec<(u64, Arc<str>, u32)> = Vec::new();
    for b in breaks {
        match b {
            BreakSpec::Line { file: wanted, line } => {
                for address in source_map.addresses_of(wanted, *line).map_err(BreakpointError::Line)? {
                    let file = source_map.line_at(address).map_or_else(|| Arc::from(wanted.as_str()), |(f, _)| f);
                    addresses.push((address, file, *line));
                }
            }
            BreakSpec::Offset { function, offset } => {
                let start = source_map
                    .function_start(function)
                    .ok_or_else(|| BreakpointError::NoFunction { name: function.clone(), path: exe.to_owned() })?;
                let address = start + offset;
                let (file, line) = source_map.line_at(address).unwrap_or_else(|| (Arc::from("?"), 0));
                addresses.push((address, file, line));
            }
        }
    }
    if !addresses.is_empty() {
        let info = info.as_ref().expect("DWARF is required for breakpoints");
        let frames = CallFrames::new(&file);
        let pcs: Vec<u64> = addresses.iter().map(|(a, _, _)| *a).collect();
        let locals = info.locals_at(&pcs, frames.as_ref())?;
        for ((address, file_name, line), locals) in addresses.into_iter().zip(locals) {
            let file_offset = file_offset(&file, address)
                .ok_or_else(|| BreakpointError::NotLoaded(format!("{file_name}:{line} ({address:#x})")))?;
            let (mut args, mut strings) = (Vec::new(), Vec::new());
            let locals: Vec<LocalSlot> =
                locals.unwrap_or_default().into_iter().map(|l| local_slot(l, &mut args, &mut strings, regs)).collect();
            for l in &locals {
                if let LocalRead::Unreadable(why) = &l.read {
                    selection.warnings.push(format!("-B {file_name}:{line}: '{}' cannot be read: {why}", l.name));
                }
            }
            let mut spec = UsdtSpec {
                arg_count: args.len() as u32,
                record_kind: RecordKind::Break as u32,
                strings: string_reads(&strings, string_size),
                ..UsdtSpec::default()
            };
            for (slot, arg) in spec.args.iter_mut().zip(&args) {
                *slot = *arg;
            }
            debug_assert!(spec.args.iter().skip(args.len()).all(|a| a.kind == UsdtArgKind::Unsupported as u32));
            selection.break_probes.push(BreakProbe { path: exe.to_owned(), file_offset, spec });
            selection.break_sites.push(BreakSite {
                function: source_map.function_at(address),
                file: file_name,
                line,
                module: module.clone(),
                locals,
                strings: strings.len(),
                string_size: string_size.min(MAX_STRING_SIZE),
            });
        }
    }
    selection.source_map = Arc::new(source_map);
    Ok(selection)
}
