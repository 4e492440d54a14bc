//! The bytes that cross from the tracer's eBPF programs to user space, and the names both sides use.
//!
//! Every record starts with a [`RecordHeader`]; its `kind` says which record follows. Records are
//! `#[repr(C)]`, integers only, with explicit padding, so that the kernel side can write them into
//! ring-buffer memory field by field and user space can check the length before reading anything.
//! User space never trusts a kind or a flag straight from the kernel bytes: it reads the `u32` and
//! converts it with `TryFrom`, rejecting unknown values (see [`decode`] with the `user` feature).
#![no_std]

#[cfg(feature = "user")]
pub mod decode;

/// Names of maps and globals in the eBPF object.
pub mod names {
    pub const EVENTS: &str = "EVENTS";
    pub const TRACED_PIDS: &str = "TRACED_PIDS";
    pub const TRACED_REMOVALS: &str = "TRACED_REMOVALS";
    pub const TARGET_INODES: &str = "TARGET_INODES";
    pub const RESOLVED_IMAGES: &str = "RESOLVED_IMAGES";
    pub const LOST: &str = "LOST";
    pub const CONFIG: &str = "CONFIG";
    pub const INFLIGHT: &str = "INFLIGHT";
    pub const STREAMS: &str = "STREAMS";
    pub const USDT_SPECS: &str = "USDT_SPECS";
    pub const USER_EVENT_SCRATCH: &str = "USER_EVENT_SCRATCH";
    pub const TOP_FUNCTIONS: &str = "TOP_FUNCTIONS";
    pub const TOP_BY_PROCESS: &str = "TOP_BY_PROCESS";
    pub const TOP_STACKS: &str = "TOP_STACKS";
    pub const LAYOUTS: &str = "LAYOUTS";
    /// Each traced process's thread count (for `programs::SCHED_EXIT_1ARG`).
    pub const THREAD_COUNTS: &str = "THREAD_COUNTS";
    /// `-f 'FUNC if EXPR'`: each filtered function's compiled predicate ([`super::filter::Program`]).
    pub const FILTERS: &str = "FILTERS";
    /// Per function with a predicate, per CPU: calls seen and calls filtered out.
    pub const FILTER_COUNTS: &str = "FILTER_COUNTS";
    /// `--start-at`, `--stop-at`, `--depth`: each thread's gate ([`super::gate::Thread`]).
    pub const GATES: &str = "GATES";
    /// The role of each function with `cookie::GATE_ROLE` ([`super::gate::START`], ...).
    pub const GATE_ROLES: &str = "GATE_ROLES";
}

/// Names of the programs in the eBPF object.
pub mod programs {
    pub const CALL_ENTRY: &str = "call_entry";
    pub const CALL_RETURN: &str = "call_return";
    /// The same two, sleepable (Linux 6.0+), for probes whose cookie has `cookie::STRINGS`: they
    /// fault in a string's page that the non-faulting read could not reach.
    pub const CALL_ENTRY_SLEEPABLE: &str = "call_entry_s";
    pub const CALL_RETURN_SLEEPABLE: &str = "call_return_s";
    /// `tracer top`'s function programs: statistics in the kernel, no records.
    pub const TOP_ENTRY: &str = "top_entry";
    pub const TOP_RETURN: &str = "top_return";
    pub const SCHED_FORK: &str = "sched_fork";
    pub const SCHED_EXEC: &str = "sched_exec";
    /// `sched_process_exit(task, group_dead)`: the kernels whose tracepoint has `group_dead`.
    pub const SCHED_EXIT: &str = "sched_exit";
    /// `sched_process_exit(task)`: older kernels (6.1, 6.12), which derive `group_dead`.
    pub const SCHED_EXIT_1ARG: &str = "sched_exit_1arg";
    pub const IPC_SYS_ENTER: &str = "ipc_sys_enter";
    pub const IPC_SYS_EXIT: &str = "ipc_sys_exit";
    pub const SIGNAL_GENERATE: &str = "signal_generate";
    pub const SIGNAL_DELIVER: &str = "signal_deliver";
    /// A program's own events: the `tracer_events:event` USDT probe of the `tracer-events` crate
    /// and its C header.
    pub const USDT_EVENT: &str = "usdt_event";
    /// Any other USDT probe: its arguments, evaluated from the probe's argument spec.
    pub const USDT_PROBE: &str = "usdt_probe";
    /// The same, sleepable (Linux 6.0+), for breakpoints that read strings.
    pub const USDT_PROBE_SLEEPABLE: &str = "usdt_probe_s";
    /// A hardware watchpoint fired (a `perf_event` program on `PERF_TYPE_BREAKPOINT` events).
    pub const WATCH_HIT: &str = "watch_hit";

    /// Kernel raw tracepoints (`TP_PROTO` arguments, no tracefs needed) that the sched programs attach to.
    pub const SCHED_FORK_TP: &str = "sched_process_fork";
    pub const SCHED_EXEC_TP: &str = "sched_process_exec";
    pub const SCHED_EXIT_TP: &str = "sched_process_exit";
    pub const SIGNAL_GENERATE_TP: &str = "signal_generate";
    pub const SIGNAL_DELIVER_TP: &str = "signal_deliver";
    pub const SYS_ENTER_TP: &str = "sys_enter";
    pub const SYS_EXIT_TP: &str = "sys_exit";
}

/// Declares a `#[repr(u32)]` enum whose numbers cross the kernel/user boundary, with the checked
/// conversion back from a number (`from_u32`, and `TryFrom<u32>` giving the unknown number as the
/// error) generated from the same list, so that the two cannot disagree.
macro_rules! numbered_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident { $($(#[$variant_meta:meta])* $variant:ident = $number:literal,)+ }
    ) => {
        $(#[$meta])*
        #[repr(u32)]
        pub enum $name { $($(#[$variant_meta])* $variant = $number,)+ }

        impl $name {
            /// The variant with this number, if any.
            pub const fn from_u32(number: u32) -> Option<$name> {
                match number {
                    $($number => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];
        }

        impl TryFrom<u32> for $name {
            type Error = u32;

            fn try_from(number: u32) -> Result<Self, u32> {
                Self::from_u32(number).ok_or(number)
            }
        }
    };
}

numbered_enum! {
    /// The kind of a record, as written in [`RecordHeader::kind`].
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum RecordKind {
        Call = 1,
        Return = 2,
        Fork = 3,
        Exec = 4,
        Exit = 5,
        /// A transfer on a socket or pipe ([`IpcRecord`]).
        Ipc = 6,
        Signal = 7,
        /// Entry into a probed Go function ([`GoCallRecord`]).
        GoCall = 8,
        /// A probed Go function reached one of its `ret` instructions ([`GoReturnRecord`]).
        GoReturn = 9,
        /// The payload of a program's own event ([`UserEventRecord`]).
        UserEvent = 10,
        /// The arguments of a USDT probe ([`UsdtRecord`]).
        Usdt = 11,
        /// A breakpoint (`-B FILE:LINE`) was reached: the locals in scope, evaluated as a USDT
        /// probe's arguments are ([`BreakRecord`]).
        Break = 12,
        /// A hardware watchpoint (`-w VARIABLE`) fired ([`WatchRecord`]).
        Watch = 13,
    }
}

numbered_enum! {
    /// Slots of the per-CPU `LOST` array: what the kernel side could not record, by cause. The
    /// first slots count ring-buffer reserve failures ([`LostSlot::ring_full`] says which kind
    /// goes where, exhaustively, so a new [`RecordKind`] cannot share another's counter); the
    /// others count things the kernel side had to give up on.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum LostSlot {
        /// The ring buffer was full at a call (C or Go).
        Call = 0,
        /// The ring buffer was full at a return (C or Go).
        Return = 1,
        /// The ring buffer was full at a fork or an exec.
        Spawn = 2,
        Exit = 3,
        Ipc = 4,
        Signal = 5,
        /// The ring buffer was full at a program's own event (`log`).
        Log = 6,
        Usdt = 7,
        /// A traced process forked, but the traced-pid map was full: the child is not traced.
        UntrackedChild = 8,
        /// A traced IPC syscall could not be remembered between entry and exit (map full).
        IpcInflight = 9,
        /// Messages of a `sendmmsg`/`recvmmsg` beyond the first [`MAX_MMSG`] (not recorded).
        IpcMmsgBeyondLimit = 10,
        /// `--capture-bytes`: a transfer's payload could not be read from the process's memory
        /// (the transfer is recorded, without its bytes).
        IpcPayloadUnreadable = 11,
        /// `tracer top`: a traced thread's call stack could not be kept (its map was full): its
        /// calls are not counted.
        TopThreadsFull = 12,
        /// `tracer top --by-process`: a (process, function) pair found its map full: not counted.
        TopKeysFull = 13,
        /// `tracer top`: calls nested deeper than [`top::MAX_DEPTH`] (the kernel gives them no
        /// return probe), counted but not timed.
        TopTooDeep = 14,
        /// `tracer top`: calls whose return never came (left by `longjmp` or an exception).
        TopNoReturn = 15,
        /// The ring buffer was full at a breakpoint (`-B`).
        Break = 16,
        /// The ring buffer was full at a watchpoint hit (`-w`).
        Watch = 17,
    }
}

impl LostSlot {
    /// Number of slots in the `LOST` map.
    pub const COUNT: u32 = Self::ALL.len() as u32;

    /// Where a record of this kind is counted when the ring buffer has no room for it.
    pub const fn ring_full(kind: RecordKind) -> LostSlot {
        match kind {
            RecordKind::Call | RecordKind::GoCall => LostSlot::Call,
            RecordKind::Return | RecordKind::GoReturn => LostSlot::Return,
            RecordKind::Fork | RecordKind::Exec => LostSlot::Spawn,
            RecordKind::Exit => LostSlot::Exit,
            RecordKind::Ipc => LostSlot::Ipc,
            RecordKind::Signal => LostSlot::Signal,
            RecordKind::UserEvent => LostSlot::Log,
            RecordKind::Usdt => LostSlot::Usdt,
            RecordKind::Break => LostSlot::Break,
            RecordKind::Watch => LostSlot::Watch,
        }
    }

    /// The name `trace_end.lost_events` gives the slot's count; `None` for `top`'s own slots,
    /// which `top` reports itself.
    pub const fn trace_name(self) -> Option<&'static str> {
        Some(match self {
            LostSlot::Call => "call",
            LostSlot::Return => "return",
            LostSlot::Spawn => "spawn",
            LostSlot::Exit => "exit",
            LostSlot::Ipc => "ipc",
            LostSlot::Signal => "signal",
            LostSlot::Log => "log",
            LostSlot::Usdt => "usdt",
            LostSlot::Break => "break",
            LostSlot::Watch => "watch",
            LostSlot::UntrackedChild => "untraced_children",
            LostSlot::IpcInflight => "ipc_untracked_syscalls",
            LostSlot::IpcMmsgBeyondLimit => "ipc_messages_beyond_limit",
            LostSlot::IpcPayloadUnreadable => "ipc_payload_unreadable",
            LostSlot::TopThreadsFull | LostSlot::TopKeysFull | LostSlot::TopTooDeep | LostSlot::TopNoReturn => {
                return None;
            }
        })
    }
}

// The slots index the `LOST` array: their numbers must be 0, 1, 2, ... in order.
const _: () = {
    let mut i = 0;
    while i < LostSlot::ALL.len() {
        assert!(LostSlot::ALL[i] as usize == i, "LostSlot numbers must run 0, 1, 2, ... with no gap");
        i += 1;
    }
};

/// Bits of [`Config::enabled_kinds`]: `1 << RecordKind as u32`.
pub const fn kind_bit(kind: RecordKind) -> u32 {
    1 << kind as u32
}

pub const COMM_LEN: usize = 16;
/// Bytes of an exec'd file name kept; longer names are cut (and the cut is visible: no NUL inside).
pub const FILENAME_LEN: usize = 256;

/// Common start of every record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordHeader {
    /// A [`RecordKind`] discriminant.
    pub kind: u32,
    pub _pad: u32,
    /// `bpf_ktime_get_boot_ns()`: CLOCK_BOOTTIME, nanoseconds.
    pub ts_boot_ns: u64,
    /// Process id (the kernel's tgid).
    pub pid: u32,
    /// Thread id (the kernel's pid).
    pub tid: u32,
}

/// Entry into a probed function.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallRecord {
    pub header: RecordHeader,
    /// The attach cookie: an index into user space's table of probed functions.
    pub cookie: u64,
    /// The six integer argument registers (x86-64 System V: rdi, rsi, rdx, rcx, r8, r9).
    pub args: [u64; 6],
    /// rsp at entry: where the return address lies. A return probed on the function's `ret`
    /// instruction sees the same value, which pairs the two (see `cookie::RET_SITE`).
    pub sp: u64,
}

/// Return from a probed function.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReturnRecord {
    pub header: RecordHeader,
    pub cookie: u64,
    /// rax.
    pub retval: u64,
    /// rdx: the second half of a 16-byte return value (a Rust `&str`'s length).
    pub rdx: u64,
    /// rsp at the probe: at a `ret` instruction (or a tail call's jump), the entry's `sp`; after a
    /// uretprobe, 8 bytes above it.
    pub sp: u64,
}

/// Strings read from the target's memory at a probe (calls at source level). A call or return
/// record whose cookie has [`cookie::STRINGS`] is followed by the strings its function's
/// [`ProbeLayoutBytes`] names, each a [`strings::HEADER`]-byte header (status, 0, length as
/// little-endian `u16`) and the bytes. User space's `debuginfo::layout` builds and parses these.
pub mod strings {
    /// Bytes of a function's layout (`debuginfo::layout::ProbeLayout::to_bytes`): version, count
    /// of entry strings, string size (`u16` LE), then [`MAX_STRINGS`] + 1 reads of 4 bytes (kind,
    /// pointer register, length register, 0): the entry strings, then the return value's.
    pub const LAYOUT_SIZE: usize = 4 + 4 * (MAX_STRINGS + 1);
    /// At most one string per argument register.
    pub const MAX_STRINGS: usize = 6;
    /// The largest `--string-size`.
    pub const MAX_STRING_SIZE: u16 = 4096;
    pub const HEADER: usize = 4;
    /// Read kinds.
    pub const KIND_NONE: u8 = 0;
    pub const KIND_C_STRING: u8 = 1;
    pub const KIND_SLICE: u8 = 2;
    /// Statuses.
    pub const COMPLETE: u8 = 0;
    pub const TRUNCATED: u8 = 1;
    pub const FAULT: u8 = 2;
    pub const NULL: u8 = 3;
    /// The scratch buffer a record with strings is built in (a per-CPU map value may not be
    /// larger than 32 KiB); the largest record, a call with six strings, is 24,680 bytes.
    pub const SCRATCH_SIZE: usize = 32768;
}

/// A function's string reads, the value of the kernel's `LAYOUTS` map (keyed by function index).
pub type ProbeLayoutBytes = [u8; strings::LAYOUT_SIZE];

/// Integer argument registers of Go's register ABI (amd64, Go 1.17+): rax, rbx, rcx, rdi, rsi,
/// r8, r9, r10, r11.
pub const GO_ARGS: usize = 9;

/// Entry into a probed Go function. Its probe sits after the prologue's stack-bound check, so a
/// call that first grows its stack (and re-enters the function from `runtime.morestack`) is
/// recorded once.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoCallRecord {
    pub header: RecordHeader,
    pub cookie: u64,
    /// The goroutine's id (`runtime.g.goid`), read from the `g` in r14.
    pub goid: u64,
    /// `g.stack.hi - rsp`: how deep in its goroutine's stack the call's return address lies. The
    /// runtime copies a growing stack whole, so this distance survives the move; the return of
    /// the same call has the same one.
    pub stack_depth: u64,
    /// See [`GO_ARGS`].
    pub args: [u64; GO_ARGS],
}

/// A probed Go function at one of its `ret` instructions (an ordinary uprobe there: a uretprobe
/// would replace the return address that Go's runtime reads when it walks and copies stacks).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoReturnRecord {
    pub header: RecordHeader,
    pub cookie: u64,
    pub goid: u64,
    /// As in [`GoCallRecord::stack_depth`]: equal to its call's.
    pub stack_depth: u64,
    /// rax.
    pub retval: u64,
}

/// The BPF cookie of a function probe: what the one shared program needs to know about the probe
/// that fired, so that the hot path reads no map.
///
/// Bits 0-31: the function's index in user space's table. Bit 32: a Go probe (read `g` from r14,
/// the goroutine id at the offset in bits 48-63, Go's argument registers). Bit 33: a Go return
/// (the probe is on a `ret` instruction). Bit 34: the probe reads strings (see [`strings`]): only
/// then does the program look the function's layout up.
pub mod cookie {
    pub const FUNCTION_MASK: u64 = 0xffff_ffff;
    pub const GO: u64 = 1 << 32;
    pub const GO_RETURN: u64 = 1 << 33;
    pub const STRINGS: u64 = 1 << 34;
    /// A native function's probe on one of its `ret` instructions (returns probed where they
    /// happen, so that no frame of the program holds a trampoline's address: see
    /// `record::resolve::unwinding` in user space): the probe writes a return record.
    pub const RET_SITE: u64 = 1 << 35;
    /// With `RET_SITE`: the probe is on a jump out of the function (a tail call), so the return
    /// value is the callee's, not known yet.
    pub const TAIL_CALL: u64 = 1 << 36;
    /// With `TAIL_CALL`: a conditional jump, an exit only when the flags say it is taken; its
    /// condition code (x86's, 0 `jo` .. 15 `jg`) is at `OPERAND_SHIFT`.
    pub const CONDITIONAL: u64 = 1 << 37;
    /// With `TAIL_CALL`: `jmp reg`, an exit only when the target is outside the function; the
    /// register (x86's number) is at `OPERAND_SHIFT`, the site's offset from the function's start
    /// at `SITE_SHIFT`, so the probe can say where the jump goes relative to the function.
    pub const INDIRECT: u64 = 1 << 38;
    /// On an entry probe: the function's first instruction is also one of its exits (`jmp other`
    /// as the whole body, an empty function's `ret`), described by the exit bits of this cookie
    /// (`TAIL_CALL`, `CONDITIONAL`, `INDIRECT` and theirs): one probe writes the call, then the
    /// return. (Two probes at one address would run in no set order.)
    pub const ALSO_EXIT: u64 = 1 << 39;
    /// The function has a predicate (`-f 'FUNC if EXPR'`): an entry probe evaluates it and drops
    /// the call when it fails; a return probe drops the return of a call its entry dropped.
    pub const FILTERED: u64 = 1 << 44;
    /// The call is decided at its return (`ret-if`, `--min-duration`): the entry probe holds its
    /// record in the kernel (`HELD`, by thread and entry stack pointer) instead of writing it, and
    /// the return probe writes both, or neither.
    pub const HOLD: u64 = 1 << 45;
    /// Triggers or `--depth` are on (`--start-at`, `--stop-at`, `--depth`): the entry probe asks
    /// its thread's gate (`GATES`, see `gate`) whether the call is written and opens it there; a
    /// return probe writes the return only if the gate says its call was written.
    pub const GATED: u64 = 1 << 46;
    /// With `GATED`: the function has a role in the `GATE_ROLES` map (a start or stop trigger,
    /// or no return probe), looked up by the entry probe.
    pub const GATE_ROLE: u64 = 1 << 47;
    pub const OPERAND_SHIFT: u32 = 40;
    pub const SITE_SHIFT: u32 = 48;
    pub const GOID_OFFSET_SHIFT: u32 = 48;

    /// The cookie of a C (System V) probe: the function index alone.
    pub const fn plain(function: u32) -> u64 {
        function as u64
    }

    /// The cookie of a Go probe: entry, or a `ret` instruction when `ret`.
    pub const fn go(function: u32, ret: bool, goid_offset: u16) -> u64 {
        function as u64 | GO | if ret { GO_RETURN } else { 0 } | (goid_offset as u64) << GOID_OFFSET_SHIFT
    }

    pub const fn function(cookie: u64) -> u32 {
        (cookie & FUNCTION_MASK) as u32
    }

    /// The cookie of a native function's probe on a `ret` instruction (`tail`: on a jump out).
    pub const fn ret_site(function: u32, tail: bool) -> u64 {
        function as u64 | RET_SITE | if tail { TAIL_CALL } else { 0 }
    }

    /// The cookie of a native function's probe on a conditional jump out.
    pub const fn ret_site_if(function: u32, condition: u8) -> u64 {
        ret_site(function, true) | CONDITIONAL | ((condition & 0xf) as u64) << OPERAND_SHIFT
    }

    /// The cookie of a native function's probe on `jmp reg`, `site` bytes after its start.
    pub const fn ret_site_to(function: u32, register: u8, site: u16) -> u64 {
        ret_site(function, true) | INDIRECT | ((register & 0xf) as u64) << OPERAND_SHIFT | (site as u64) << SITE_SHIFT
    }

    /// An entry probe's cookie that also stands for the exit `exit` (a `ret_site*` cookie) at the
    /// same instruction.
    pub const fn with_exit(entry: u64, exit: u64) -> u64 {
        entry | ALSO_EXIT | (exit & (TAIL_CALL | CONDITIONAL | INDIRECT | 0xf << OPERAND_SHIFT | 0xffff << SITE_SHIFT))
    }

    pub const fn is_also_exit(cookie: u64) -> bool {
        cookie & ALSO_EXIT != 0
    }

    /// The exit cookie an `ALSO_EXIT` entry cookie carries (without strings to read: its return
    /// value, if any, is read by no layout).
    pub const fn exit_of(entry: u64) -> u64 {
        (entry & !(ALSO_EXIT | STRINGS)) | RET_SITE
    }

    pub const fn is_conditional(cookie: u64) -> bool {
        cookie & CONDITIONAL != 0
    }

    pub const fn is_indirect(cookie: u64) -> bool {
        cookie & INDIRECT != 0
    }

    /// A conditional jump's condition code, or an indirect jump's register.
    pub const fn operand(cookie: u64) -> u8 {
        ((cookie >> OPERAND_SHIFT) & 0xf) as u8
    }

    /// An indirect jump's offset from its function's start.
    pub const fn site(cookie: u64) -> u64 {
        cookie >> SITE_SHIFT
    }

    /// Whether x86 condition `code` holds under `flags` (rflags).
    pub const fn condition_holds(code: u8, flags: u64) -> bool {
        let cf = flags & 1 != 0;
        let pf = flags & (1 << 2) != 0;
        let zf = flags & (1 << 6) != 0;
        let sf = flags & (1 << 7) != 0;
        let of = flags & (1 << 11) != 0;
        let base = match code >> 1 {
            0 => of,
            1 => cf,
            2 => zf,
            3 => cf || zf,
            4 => sf,
            5 => pf,
            6 => sf != of,
            _ => zf || sf != of,
        };
        base != (code & 1 != 0)
    }

    pub const fn is_ret_site(cookie: u64) -> bool {
        cookie & RET_SITE != 0
    }

    pub const fn is_tail_call(cookie: u64) -> bool {
        cookie & TAIL_CALL != 0
    }

    pub const fn is_go(cookie: u64) -> bool {
        cookie & GO != 0
    }

    pub const fn is_go_return(cookie: u64) -> bool {
        cookie & GO_RETURN != 0
    }

    pub const fn is_filtered(cookie: u64) -> bool {
        cookie & FILTERED != 0
    }

    pub const fn is_held(cookie: u64) -> bool {
        cookie & HOLD != 0
    }

    pub const fn is_gated(cookie: u64) -> bool {
        cookie & GATED != 0
    }

    pub const fn has_gate_role(cookie: u64) -> bool {
        cookie & GATE_ROLE != 0
    }

    pub const fn reads_strings(cookie: u64) -> bool {
        cookie & STRINGS != 0
    }

    pub const fn goid_offset(cookie: u64) -> u32 {
        (cookie >> GOID_OFFSET_SHIFT) as u32
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn conditions_read_the_flags_as_the_cpu_does() {
            const CF: u64 = 1;
            const ZF: u64 = 1 << 6;
            const SF: u64 = 1 << 7;
            const OF: u64 = 1 << 11;
            // je/jne (4/5), jb (2), jbe (6), jl (12), jle (14), jg (15), jo (0).
            assert!(condition_holds(4, ZF) && !condition_holds(5, ZF) && condition_holds(5, 0));
            assert!(condition_holds(2, CF) && !condition_holds(3, CF));
            assert!(condition_holds(6, ZF) && condition_holds(6, CF) && condition_holds(7, 0));
            assert!(condition_holds(12, SF) && !condition_holds(12, SF | OF) && condition_holds(13, SF | OF));
            assert!(condition_holds(14, ZF) && condition_holds(15, SF | OF) && !condition_holds(15, ZF));
            assert!(condition_holds(0, OF) && condition_holds(1, 0));
        }

        #[test]
        fn ret_site_cookies_keep_their_parts() {
            let c = ret_site_to(77, 13, 0x1234);
            assert!(is_ret_site(c) && is_tail_call(c) && is_indirect(c) && !is_conditional(c) && !is_go(c));
            assert_eq!((function(c), operand(c), site(c)), (77, 13, 0x1234));
            let c = ret_site_if(5, 15);
            assert!(is_conditional(c) && !is_indirect(c));
            assert_eq!((function(c), operand(c)), (5, 15));
            assert!(!is_tail_call(ret_site(5, false)));
            // An entry that is also a tail call through rax, 0 bytes in.
            let entry = with_exit(plain(9) | STRINGS, ret_site_to(9, 0, 0));
            assert!(is_also_exit(entry) && !is_ret_site(entry));
            assert_eq!(exit_of(entry), ret_site_to(9, 0, 0));
        }
    }
}

/// `sched_process_fork`: a traced process created a process or a thread. The header names the parent.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForkRecord {
    pub header: RecordHeader,
    /// The child's process id (equal to the parent's for a thread).
    pub child_pid: u32,
    /// The child's thread id.
    pub child_tid: u32,
    /// 1 when the child is a thread of the parent's process, 0 for a new process.
    pub is_thread: u32,
    /// 1 when the child was added to the traced set (a process while following children).
    pub followed: u32,
    pub comm: [u8; COMM_LEN],
}

/// `sched_process_exec`: a traced process (or one that just became traced by exec'ing a target
/// binary) replaced its program.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecRecord {
    pub header: RecordHeader,
    /// The thread id before exec (differs from the header's tid when a non-leader thread exec'd).
    pub old_tid: u32,
    /// 1: the kernel stopped the process (`SIGSTOP`, taken before the new image's first
    /// instruction) for user space to resolve the function patterns against the new image
    /// (`dev`, `ino`); user space continues it (`SIGCONT`) once the probes are attached.
    pub stopped: u32,
    /// The new image's file (the interpreter's for a `#!` script), as in [`InodeKey`]; 0 when
    /// not read (no function patterns).
    pub dev: u64,
    pub ino: u64,
    pub comm: [u8; COMM_LEN],
    /// NUL-terminated unless the name was cut.
    pub filename: [u8; FILENAME_LEN],
}

/// `sched_process_exit`: a thread of a traced process exited.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitRecord {
    pub header: RecordHeader,
    /// The kernel's `task_struct.exit_code`: `status << 8`, or the killing signal in the low 7 bits
    /// (bit 7 set when it dumped core).
    pub exit_code: u32,
    /// 1 when this was the last thread of the process.
    pub group_dead: u32,
    pub comm: [u8; COMM_LEN],
}

/// Messages of one `sendmmsg`/`recvmmsg` recorded, each as its own record.
pub const MAX_MMSG: u32 = 16;
/// Payload bytes kept from the start of each datagram, to tell datagrams apart.
pub const HEAD_LEN: usize = 16;
/// Bytes of a Unix socket path (`sun_path`).
pub const UNIX_PATH_LEN: usize = 108;
/// Most payload bytes `--capture-bytes` copies from one transfer (a power of two: the eBPF side
/// bounds lengths with a mask).
pub const CAPTURE_BYTES_MAX: usize = 4096;

numbered_enum! {
    /// Which way an [`IpcRecord`] moved bytes.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Direction {
        Send = 1,
        Recv = 2,
    }
}

numbered_enum! {
    /// What kind of kernel object an [`IpcRecord`] went through.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum ChannelKind {
        Tcp = 1,
        Udp = 2,
        UnixStream = 3,
        /// Unix datagram and seqpacket sockets.
        UnixDgram = 4,
        Pipe = 5,
        Fifo = 6,
    }
}

numbered_enum! {
    /// The syscalls that move IPC data, by x86-64 number.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum IpcSyscall {
        Read = 0,
        Write = 1,
        Readv = 19,
        Writev = 20,
        Sendto = 44,
        Recvfrom = 45,
        Sendmsg = 46,
        Recvmsg = 47,
        Recvmmsg = 299,
        Sendmmsg = 307,
    }
}

impl IpcSyscall {
    /// The IPC syscall with this number (as the syscall tracepoints give it), if it is one.
    pub const fn from_number(nr: u64) -> Option<IpcSyscall> {
        if nr > u32::MAX as u64 { None } else { IpcSyscall::from_u32(nr as u32) }
    }

    pub const fn direction(self) -> Direction {
        match self {
            IpcSyscall::Write
            | IpcSyscall::Writev
            | IpcSyscall::Sendto
            | IpcSyscall::Sendmsg
            | IpcSyscall::Sendmmsg => Direction::Send,
            IpcSyscall::Read
            | IpcSyscall::Readv
            | IpcSyscall::Recvfrom
            | IpcSyscall::Recvmsg
            | IpcSyscall::Recvmmsg => Direction::Recv,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            IpcSyscall::Read => "read",
            IpcSyscall::Write => "write",
            IpcSyscall::Readv => "readv",
            IpcSyscall::Writev => "writev",
            IpcSyscall::Sendto => "sendto",
            IpcSyscall::Recvfrom => "recvfrom",
            IpcSyscall::Sendmsg => "sendmsg",
            IpcSyscall::Recvmsg => "recvmsg",
            IpcSyscall::Recvmmsg => "recvmmsg",
            IpcSyscall::Sendmmsg => "sendmmsg",
        }
    }
}

/// One data transfer on a socket or pipe by a traced thread: one per syscall that moved bytes, or
/// one per message of `sendmmsg`/`recvmmsg`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcRecord {
    /// `ts_boot_ns` is the syscall's entry for a send, its exit for a receive.
    pub header: RecordHeader,
    /// A [`Direction`].
    pub direction: u32,
    /// A [`ChannelKind`].
    pub channel: u32,
    /// An [`IpcSyscall`] number.
    pub syscall: u32,
    pub fd: i32,
    /// Bytes moved (by this message, for the multi-message syscalls).
    pub bytes: u64,
    pub syscall_ns: u64,
    /// Position of the first byte in its stream: the TCP sequence number (32 bits), or for Unix
    /// streams and pipes the tracer's own count of the bytes that went through.
    pub stream_pos: u64,
    /// 1 when `stream_pos` is meaningful.
    pub pos_valid: u32,
    /// Which message of `sendmmsg`/`recvmmsg` (0 otherwise).
    pub msg_index: u32,
    /// AF_INET or AF_INET6 for TCP/UDP.
    pub family: u16,
    pub local_port: u16,
    pub remote_port: u16,
    pub _pad: u16,
    /// IPv4 addresses take the first 4 bytes. For unconnected UDP the remote address is the
    /// message's (destination of a send, source of a receive); zero when unknown.
    pub local_addr: [u8; 16],
    pub remote_addr: [u8; 16],
    /// Unix sockets: this socket's inode; pipes and FIFOs: the pipe's inode.
    pub local_ino: u64,
    /// Unix sockets: the connected peer's inode (0 when not connected).
    pub peer_ino: u64,
    /// Unix streams: the kernel's `struct sock` of this end and of its peer. Unlike inodes they
    /// exist for the whole connection (a server's socket has no inode until `accept`, a closed
    /// one loses it), so they identify the stream at both ends; user space never writes them out
    /// as they are.
    pub local_sk: u64,
    pub peer_sk: u64,
    /// The first bytes of the payload (datagrams tell each other apart by them).
    pub head: [u8; HEAD_LEN],
    pub head_len: u32,
    /// Length of `path`, 0 when there is none.
    pub path_len: u32,
    /// Unix sockets: a bound address (`sun_path`; abstract names start with a NUL): for streams,
    /// whichever end is bound; for datagrams, the receiving end's.
    pub path: [u8; UNIX_PATH_LEN],
    /// `--capture-bytes`: payload bytes that follow the record in the ring buffer (the first of
    /// the transfer's, at most [`CAPTURE_BYTES_MAX`]), so its length is
    /// `size_of::<IpcRecord>() + captured_len`.
    pub captured_len: u32,
    /// 1 when payload capture was on for this transfer (then `captured_len < received` means cut).
    pub capturing: u32,
    /// [`ipc_flags`].
    pub flags: u32,
    /// Bytes that reached the program's buffer: `bytes`, unless [`ipc_flags::TRUNCATED`].
    pub received: u64,
}

/// Bits of [`IpcRecord::flags`].
pub mod ipc_flags {
    /// A receive with `MSG_PEEK`: the bytes were copied but left in the queue (the stream's
    /// position did not move; a later receive reads them again).
    pub const PEEK: u32 = 1;
    /// A datagram receive with `MSG_TRUNC` whose message was longer than the buffer: `bytes` is
    /// the message's length (what the syscall returned), `received` what fit in the buffer; the
    /// rest was discarded.
    pub const TRUNCATED: u32 = 2;
}

/// `signal:signal_generate` (a signal sent to, or by, a traced process) and
/// `signal:signal_deliver` (a signal delivered to a traced thread). The header names the current
/// thread: the sender at generation, the receiver at delivery.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SignalRecord {
    pub header: RecordHeader,
    pub signal: u32,
    /// 0 at generation, 1 at delivery.
    pub delivered: u32,
    pub target_pid: u32,
    pub target_tid: u32,
    /// `siginfo.si_code` (0 when the kernel passed no siginfo).
    pub code: i32,
    /// `siginfo.si_pid`: the sender, as the receiver sees it (delivery only; 0 if unknown).
    pub si_pid: u32,
    /// Generation: 1 for a process-wide signal, 0 for one aimed at a thread.
    pub group: u32,
    /// Generation: the kernel's `TRACE_SIGNAL_*` result; 0 means queued for delivery.
    pub result: u32,
}

/// Most payload bytes of one program event copied from the program's memory; the rest of a longer
/// payload is cut, and the record says so ([`user_event_flags::TRUNCATED`]).
pub const USER_EVENT_PAYLOAD_MAX: usize = 4096;

/// Bits of [`UserEventRecord::flags`].
pub mod user_event_flags {
    /// The program passed more than [`super::USER_EVENT_PAYLOAD_MAX`] bytes: only that many follow.
    pub const TRUNCATED: u32 = 1;
    /// The payload's address or length could not be read, or its memory could not be (no bytes
    /// follow).
    pub const READ_FAILED: u32 = 2;
}

/// A program's own event (a `tracer_events:event` USDT probe fired with a pointer to an encoded
/// payload and its length). In the ring buffer the record is followed by `copied_len` payload
/// bytes, so its length is `size_of::<UserEventRecord>() + copied_len`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserEventRecord {
    pub header: RecordHeader,
    /// The attach cookie: an index into user space's table of probes.
    pub cookie: u64,
    /// The length the program passed.
    pub payload_len: u64,
    /// Payload bytes that follow (at most [`USER_EVENT_PAYLOAD_MAX`]).
    pub copied_len: u32,
    /// [`user_event_flags`].
    pub flags: u32,
}

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
    /// The [`RecordKind`] the probe writes: `Usdt`, or `Break` for a breakpoint (whose
    /// "arguments" are the locals in scope, located by DWARF). 0 means `Usdt`.
    pub record_kind: u32,
    pub args: [UsdtArgSpec; USDT_MAX_ARGS],
    /// A breakpoint's string reads, in a function's layout ([`strings`]) whose register numbers
    /// index `args`: the strings at the addresses its `char *` and `char[N]` locals hold, written
    /// after the record. All zero (no strings) for a USDT probe.
    pub strings: ProbeLayoutBytes,
    pub _pad: [u8; 4],
}

/// A breakpoint's record: the locals in scope at its address, each evaluated from its spec as a
/// USDT argument is (the `usdt_probe` program writes both), followed by the strings its spec's
/// `strings` names, as a call record is by its function's.
pub type BreakRecord = UsdtRecord;

/// Most watchpoints at once: x86-64 has four debug address registers per thread.
pub const MAX_WATCHPOINTS: usize = 4;

/// Bits of [`WatchRecord::flags`].
pub mod watch_flags {
    /// The watched bytes could not be read after the access (`value` is 0).
    pub const READ_FAILED: u32 = 1;
}

/// A hardware watchpoint fired: a traced thread accessed a watched variable.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchRecord {
    pub header: RecordHeader,
    /// The watched address (the perf event's `bp_addr`): which watchpoint fired.
    pub address: u64,
    /// The instruction pointer when the debug trap was taken: x86 data breakpoints trap after
    /// the access, so this is the instruction after the one that accessed the variable. Always
    /// the program's own: accesses the kernel makes (exec clearing `.bss`, a system call filling
    /// the variable) are not recorded.
    pub ip: u64,
    /// The eight bytes at `address` read after the access (user space keeps the variable's size).
    pub value: u64,
    /// [`watch_flags`].
    pub flags: u32,
    pub _pad: u32,
}

/// Key of the `TARGET_INODES` map: a process that exec's a file with this device and inode
/// becomes traced (`--binary`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct InodeKey {
    /// The kernel's `dev_t` encoding: `major << 20 | minor`.
    pub dev: u64,
    pub ino: u64,
}

/// Byte offsets of kernel structure fields, read from the running kernel's BTF at start-up.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    pub task_pid: u32,
    pub task_tgid: u32,
    pub task_exit_code: u32,
    /// `task_struct.signal`, `signal_struct.flags` and `.group_exit_code`: a process ended by
    /// `exit_group` or a fatal signal has its status there, whichever thread exits last.
    pub task_signal: u32,
    pub signal_flags: u32,
    pub signal_group_exit_code: u32,
    pub bprm_file: u32,
    pub bprm_filename: u32,
    pub file_inode: u32,
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub sb_dev: u32,
    // IPC: from an fd to its file and the object behind it.
    pub task_files: u32,
    pub files_fdt: u32,
    pub fdtable_fd: u32,
    pub fdtable_max_fds: u32,
    pub file_private_data: u32,
    pub inode_mode: u32,
    pub sb_magic: u32,
    pub socket_sk: u32,
    /// Offset of the socket's inode from the `struct socket` (`socket_alloc.vfs_inode`).
    pub socket_inode: u32,
    pub sock_family: u32,
    pub sock_num: u32,
    pub sock_dport: u32,
    pub sock_rcv_saddr: u32,
    pub sock_daddr: u32,
    pub sock_v6_rcv_saddr: u32,
    pub sock_v6_daddr: u32,
    pub sock_type: u32,
    pub sock_protocol: u32,
    pub sock_socket: u32,
    pub sock_receive_queue: u32,
    pub tcp_write_seq: u32,
    pub tcp_copied_seq: u32,
    pub unix_peer: u32,
    pub unix_addr: u32,
    pub unix_address_len: u32,
    pub unix_address_name: u32,
    pub skb_next: u32,
    pub skb_len: u32,
    pub skb_cb: u32,
    pub unix_skb_consumed: u32,
    pub pipe_head: u32,
    pub pipe_tail: u32,
    pub pipe_ring_size: u32,
    pub pipe_bufs: u32,
    pub pipe_buffer_len: u32,
    pub pipe_buffer_size: u32,
    pub siginfo_code: u32,
    pub siginfo_pid: u32,
    // The syscall arguments the IPC programs use (the first five: di, si, dx, r10, r8), in the
    // user registers (`struct pt_regs`).
    pub regs_di: u32,
    pub regs_si: u32,
    pub regs_dx: u32,
    pub regs_r10: u32,
    pub regs_r8: u32,
    /// `task_struct.mm` and `mm_struct.exe_file`: the image a process runs (for watchpoints).
    pub task_mm: u32,
    pub mm_exe_file: u32,
}

/// Read-only configuration of the eBPF programs, set by user space at load time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Which records to emit: [`kind_bit`] of each enabled [`RecordKind`].
    pub enabled_kinds: u32,
    /// 1: a child of a traced process is traced (added on fork, in the kernel).
    pub follow_children: u32,
    /// 1: the `TARGET_INODES` map has entries (`--binary`), so exec looks the new file up.
    pub has_target_inodes: u32,
    /// 1: `tracer top --by-process`: statistics per process and function, not per function.
    pub top_by_process: u32,
    /// Records do not wake the reader up (it polls) until this many bytes wait in the ring: a
    /// wake-up per record costs the traced program more than the record itself.
    pub wakeup_bytes: u64,
    /// `--capture-bytes`: payload bytes copied from each IPC transfer (0: none), at most
    /// [`CAPTURE_BYTES_MAX`].
    pub capture_bytes: u32,
    /// 1: `--debug-kernel`: the programs' rare failure paths log a line through aya-log.
    pub debug: u32,
    /// `--min-duration`: a call whose cookie has `cookie::HOLD` is written only if it lasted at
    /// least this long (0: any duration).
    pub min_duration_ns: u64,
    /// `--depth`: a `cookie::GATED` call nested deeper than this many open gated calls on its
    /// thread is not written (0: any depth up to [`gate::MAX_OPEN`]).
    pub max_depth: u32,
    /// 1: some `--start-at` was given, so a thread starts not recording (see [`gate::Thread`]).
    pub start_off: u32,
    /// 1: function patterns were given: a traced process that execs an image not yet in
    /// `RESOLVED_IMAGES` is stopped until user space has resolved the patterns against it.
    pub resolve_execs: u32,
    pub _pad0: u32,
    /// With `-w`: the executable the watched variables were found in. A hit in a process that
    /// runs another image (it exec'd one after the watchpoints were opened, which survive exec)
    /// is not the variable's and is dropped. All zero: no such check.
    pub watch_image: InodeKey,
    pub offsets: KernelOffsets,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are `#[repr(C)]`, made only of integers and integer arrays, with the
    // padding spelled out as fields, so every bit pattern is a valid value.
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::InodeKey {}
    unsafe impl aya::Pod for super::UsdtSpec {}
    unsafe impl aya::Pod for super::top::Stats {}
    unsafe impl aya::Pod for super::top::Key {}
    unsafe impl aya::Pod for super::filter::Program {}
    unsafe impl aya::Pod for super::filter::Counts {}
}

/// Predicates on calls (`-f 'FUNC if EXPR'`), compiled by user space (`record::filter`) into a
/// branching program that the entry probe runs before anything is written: each op compares one
/// argument register with a constant and jumps forward to another op, or ends with
/// [`filter::ACCEPT`] or [`filter::REJECT`]. Jumps only go forward, so a program ends after at
/// most [`filter::MAX_OPS`] steps; `&&`, `||` and `!` are jumps, so no stack is needed.
pub mod filter {
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
}

/// Triggers and depth (`--start-at`, `--stop-at`, `--depth`): each thread's gate, kept in the
/// kernel's `GATES` map by thread id, says whether the thread records and which gated calls are
/// open on it, by the stack pointer at their entry (where the return address is), each with
/// whether it was written. A return is matched to its call by that stack pointer, so a call that
/// was written gets its return written and one that was not gets none, however the thread's state
/// changed in between; calls left by `longjmp` or an exception are dropped from the gate at the
/// next call or return above them (as `tracer top`'s stacks are).
pub mod gate {
    /// Gated calls a thread may have open: a call nested deeper is not written (the kernel gives
    /// no return probe past 64 nested ones either).
    pub const MAX_OPEN: usize = 64;
    const _: () = assert!(MAX_OPEN.is_power_of_two() && MAX_OPEN <= 64);
    /// Threads with a gate at once (the `GATES` LRU map's size): past it the least recently used
    /// thread's gate is dropped, and that thread starts again as a new one would.
    pub const MAX_THREADS: u32 = 8192;

    /// [`Thread::state`]: as a new thread starts (recording, unless some `--start-at` was given),
    /// recording, not recording.
    pub const INITIAL: u32 = 0;
    pub const ON: u32 = 1;
    pub const OFF: u32 = 2;

    /// Roles of a function (the `GATE_ROLES` map's values, by function index): entering a start
    /// function turns its thread's recording on (the call is written), a stop function off (the
    /// call is not).
    pub const START: u8 = 1;
    pub const STOP: u8 = 2;
    /// The function has no return probe: its calls are decided but never opened.
    pub const NO_RETURN: u8 = 4;

    /// One thread's gate; all zeros is a new thread's.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Thread {
        pub state: u32,
        /// Calls open, innermost last.
        pub open: u32,
        /// Bit i: the open call i was written.
        pub written: u64,
        /// The stack pointer at each open call's entry.
        pub sp: [u64; MAX_OPEN],
    }
}

/// `tracer top`: per-function statistics kept in the kernel (no records).
pub mod top {
    /// Calls a thread may have open before the kernel stops giving them return probes (its
    /// `MAX_URETPROBE_DEPTH`).
    pub const MAX_DEPTH: usize = 64;
    // The eBPF return program masks its index with `MAX_DEPTH - 1`.
    const _: () = assert!(MAX_DEPTH.is_power_of_two());
    /// Sub-buckets per power of two of the latency histogram: a bucket is at most 1/16 = 6.25%
    /// wide, so its midpoint is within 3.2% of any value in it.
    pub const SUB_BITS: u32 = 4;
    pub const SUB: u64 = 1 << SUB_BITS;
    /// Values at or above `2^MAX_EXP` ns (68.7 s) share the last bucket.
    pub const MAX_EXP: u32 = 36;
    /// Buckets: one per nanosecond below [`SUB`], then [`SUB`] per power of two.
    pub const BUCKETS: usize = SUB as usize + (MAX_EXP - SUB_BITS) as usize * SUB as usize;

    /// The histogram bucket of a duration (log-linear: exponent, then the next four bits).
    #[inline(always)]
    pub const fn bucket(ns: u64) -> usize {
        if ns < SUB {
            return ns as usize;
        }
        // floor(log2(ns)) by halving, without a loop or `leading_zeros` (BPF has no clz).
        let mut x = ns;
        let mut exp = 0u32;
        if x >= 1 << 32 {
            x >>= 32;
            exp += 32;
        }
        if x >= 1 << 16 {
            x >>= 16;
            exp += 16;
        }
        if x >= 1 << 8 {
            x >>= 8;
            exp += 8;
        }
        if x >= 1 << 4 {
            x >>= 4;
            exp += 4;
        }
        if x >= 1 << 2 {
            x >>= 2;
            exp += 2;
        }
        if x >= 1 << 1 {
            exp += 1;
        }
        if exp >= MAX_EXP {
            return BUCKETS - 1;
        }
        let sub = (ns >> (exp - SUB_BITS)) & (SUB - 1);
        SUB as usize + (exp - SUB_BITS) as usize * SUB as usize + sub as usize
    }

    /// The durations a bucket holds: `[low, high)` nanoseconds.
    pub const fn bucket_range(index: usize) -> (u64, u64) {
        if index < SUB as usize {
            return (index as u64, index as u64 + 1);
        }
        let i = (index - SUB as usize) as u64;
        let exp = SUB_BITS as u64 + i / SUB;
        let width = 1u64 << (exp - SUB_BITS as u64);
        let low = (1u64 << exp) + (i % SUB) * width;
        if index == BUCKETS - 1 { (low, u64::MAX) } else { (low, low + width) }
    }

    /// What the kernel keeps per function (or per process and function): updated atomically.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Stats {
        /// Entries.
        pub calls: u64,
        /// Returns, each timed into `total_ns` and the histogram.
        pub returns: u64,
        pub total_ns: u64,
        pub histogram: [u64; BUCKETS],
    }

    /// Key of the by-process statistics.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct Key {
        pub pid: u32,
        pub function: u32,
    }

    /// An open call of a thread.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Frame {
        pub ts: u64,
        /// The stack pointer at entry (it points at the return address); the uretprobe sees
        /// it 8 bytes higher.
        pub sp: u64,
        pub function: u32,
        pub _pad: u32,
    }

    /// A thread's open calls, innermost last.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Stack {
        pub depth: u32,
        /// The thread's recording state for `--start-at`/`--stop-at` ([`crate::gate::INITIAL`],
        /// `ON`, `OFF`).
        pub gate: u32,
        pub frames: [Frame; MAX_DEPTH],
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn buckets_are_log_linear_and_contiguous() {
            let mut previous_high = 0;
            for i in 0..BUCKETS {
                let (low, high) = bucket_range(i);
                assert_eq!(low, previous_high, "bucket {i}");
                assert!(high > low);
                if i >= SUB as usize && i < BUCKETS - 1 {
                    assert!((high - low) * SUB <= low, "bucket {i} is at most 1/16 of its low bound wide");
                }
                assert_eq!(bucket(low), i);
                if i < BUCKETS - 1 {
                    assert_eq!(bucket(high - 1), i);
                }
                previous_high = high;
            }
            assert_eq!(bucket(u64::MAX), BUCKETS - 1);
            // 500 µs falls in a bucket 2^14 ns wide (3.1% of it).
            let (low, high) = bucket_range(bucket(500_000));
            assert!(low <= 500_000 && 500_000 < high && high - low == 1 << 14, "{low}..{high}");
        }
    }
}
