//! USDT probes (and breakpoints, read as they are): their records and argument specs.

use crate::{ProbeLayoutBytes, RecordHeader};

/// Most arguments a USDT probe has (`<sys/sdt.h>` allows 12).
pub const USDT_MAX_ARGS: usize = 12;

/// The arguments of one USDT probe hit, each evaluated from its spec ([`UsdtArgSpec`]): the low
/// `size` bytes, sign-extended to 64 bits when the spec says signed.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsdtRecord {
    pub header: RecordHeader,
    /// The attach cookie: an index into user space's table of probes (and of `USDT_SPECS`).
    pub cookie: u64,
    /// How many of `args` the probe has.
    pub arg_count: u32,
    /// Bit `i` set: argument `i` could not be evaluated (its memory could not be read, or its spec
    /// is one the tracer does not support); its value is 0.
    pub failed_args: u32,
    pub args: [u64; USDT_MAX_ARGS],
}

numbered_enum! {
    /// Where a USDT argument lives, as [`UsdtArgSpec::kind`] says.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum UsdtArgKind {
        /// Not evaluated (a spec the tracer does not support): reported as failed.
        Unsupported = 0,
        /// The constant `value` (`$5`).
        Const = 1,
        /// A register (`%rdi`).
        Register = 2,
        /// Memory at `reg + index_reg * scale + value` (`-12(%rbp)`, `8(%rax,%rbx,4)`, and
        /// `sym(%rip)` resolved to an offset from the probe's address).
        Memory = 3,
        /// The address `reg + value` itself, not read: where a breakpoint's `char[N]` local is
        /// (its string is read from there, see [`UsdtSpec::strings`]).
        Address = 4,
    }
}

/// `index_reg` of a memory operand without an index register.
pub const USDT_NO_REGISTER: u32 = u32::MAX;

/// How to evaluate one USDT argument, prepared by user space from the argument spec in the
/// probe's ELF note. Registers are byte offsets into the kernel's `struct pt_regs` (from BTF).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsdtArgSpec {
    /// A [`UsdtArgKind`].
    pub kind: u32,
    /// Size of the value in bytes: 1, 2, 4 or 8.
    pub size: u32,
    /// 1: sign-extend the value from `size` bytes.
    pub signed: u32,
    /// `struct pt_regs` offset of the register, or of a memory operand's base register.
    pub reg: u32,
    /// `struct pt_regs` offset of a memory operand's index register, or [`USDT_NO_REGISTER`].
    pub index_reg: u32,
    /// A memory operand's index scale: 1, 2, 4 or 8.
    pub scale: u32,
    /// The constant, or a memory operand's displacement.
    pub value: i64,
}

/// Value of the `USDT_SPECS` array, indexed by attach cookie: every argument of one probe.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsdtSpec {
    pub arg_count: u32,
    /// The [`RecordKind`](crate::RecordKind) the probe writes: `Usdt`, or `Break` for a breakpoint (whose
    /// "arguments" are the locals in scope, located by DWARF). 0 means `Usdt`.
    pub record_kind: u32,
    pub args: [UsdtArgSpec; USDT_MAX_ARGS],
    /// A breakpoint's string reads, in a function's layout ([`crate::strings`]) whose register
    /// numbers index `args`: the strings at the addresses its `char *` and `char[N]` locals hold,
    /// written after the record. All zero (no strings) for a USDT probe.
    pub strings: ProbeLayoutBytes,
    pub _pad: [u8; 4],
}

/// A breakpoint's record: the locals in scope at its address, each evaluated from its spec as a
/// USDT argument is (the `usdt_probe` program writes both), followed by the strings its spec's
/// `strings` names, as a call record is by its function's.
pub type BreakRecord = UsdtRecord;
