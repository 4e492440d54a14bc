/// Ops in one program: a predicate with more comparisons is refused by user space.
pub const MAX_OPS: usize = 16;
/// Jump targets that end the program.
pub const ACCEPT: u8 = 0xfe;
pub const REJECT: u8 = 0xff;
/// Bytes of a string argument read for a comparison (the last is the read's NUL), so a string
/// literal has at most `STRING_BYTES - 2` bytes: a longer argument then differs from it at
/// byte `STRING_BYTES - 2`, which the read keeps.
pub const STRING_BYTES: usize = 32;
pub const STRING_WORDS: usize = STRING_BYTES / 8;

/// Comparisons ([`Op::kind`]). The integer ones compare the register, cut to its type's
/// width and extended by its sign ([`Op::shift`], [`Op::signed`]), with `value[0]`.
pub const EQ: u8 = 1;
pub const NE: u8 = 2;
pub const LT: u8 = 3;
pub const LE: u8 = 4;
pub const GT: u8 = 5;
pub const GE: u8 = 6;
/// The register points at a C string: the first [`STRING_BYTES`] bytes read (zeros after its
/// NUL), masked word by word with `mask`, equal `value`. Equality masks the literal and its
/// NUL, a prefix (`=~ "ab*"`) the literal alone. A read that fails (NULL, unmapped) is false.
pub const STR_MATCH: u8 = 7;

/// One comparison and where to go next.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Op {
    pub kind: u8,
    /// The register, numbered as the layouts' (rdi, rsi, rdx, rcx, r8, r9, rax): 0..=6.
    pub reg: u8,
    /// 1: compare as signed.
    pub signed: u8,
    /// 64 minus the value's width in bits: shifted out and back in (arithmetically when
    /// signed) to cut the register to the value.
    pub shift: u8,
    /// The next op when the comparison holds, or [`ACCEPT`]/[`REJECT`]; always after this one.
    pub on_true: u8,
    pub on_false: u8,
    pub _pad: [u8; 2],
    pub value: [u64; STRING_WORDS],
    pub mask: [u64; STRING_WORDS],
}

/// A function's predicate: the value of the `FILTERS` map, keyed by function index.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Program {
    /// Ops in use (at most [`MAX_OPS`]); the program starts at op 0.
    pub len: u32,
    pub _pad: u32,
    pub ops: [Op; MAX_OPS],
}

/// Per function, per CPU (the `FILTER_COUNTS` array, indexed by function).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Entries the predicate was evaluated on.
    pub seen: u64,
    /// Of those, the ones it refused (their returns are dropped too).
    pub filtered: u64,
    /// Refused calls whose return could not be remembered for dropping (the per-thread map
    /// was full): their returns were written, unpaired.
    pub returns_not_dropped: u64,
    /// Calls decided at their return (`cookie::HOLD`) whose held entry was gone by then
    /// (evicted from the bounded `HELD` map for lack of room, or the call began before
    /// tracing did): neither the call nor its return was written.
    pub entries_lost: u64,
    /// Of `filtered`, the calls refused because their thread was not recording (`--start-at`,
    /// `--stop-at`).
    pub by_trigger: u64,
    /// Of `filtered`, the calls refused for nesting deeper than `--depth` (or than
    /// [`crate::gate::MAX_OPEN`]).
    pub by_depth: u64,
    /// Returns of a gated function whose call its thread's gate did not hold open (the call
    /// began before tracing did, or the thread's gate was evicted): dropped.
    pub returns_unmatched: u64,
}

/// The `FILTERS` key of a function's return predicate (`ret-if`); its entry predicate is
/// keyed by the function index alone.
pub const fn ret_key(function: u32) -> u32 {
    function | 1 << 31
}

/// Key of the kernel's set of refused calls still open: the thread and the stack pointer at
/// entry (where the return address is), which the return probe sees again.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct OpenKey {
    pub tid: u32,
    pub _pad: u32,
    pub sp: u64,
}
