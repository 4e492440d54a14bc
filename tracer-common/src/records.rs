//! The records of calls, returns, processes, signals and a program's own events, and their kinds.

numbered_enum! {
    /// The kind of a record, as written in [`RecordHeader::kind`].
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum RecordKind {
        Call = 1,
        Return = 2,
        Fork = 3,
        Exec = 4,
        Exit = 5,
        /// A transfer on a socket or pipe ([`IpcRecord`](crate::IpcRecord)).
        Ipc = 6,
        Signal = 7,
        /// Entry into a probed Go function ([`GoCallRecord`]).
        GoCall = 8,
        /// A probed Go function reached one of its `ret` instructions ([`GoReturnRecord`]).
        GoReturn = 9,
        /// The payload of a program's own event ([`UserEventRecord`]).
        UserEvent = 10,
        /// The arguments of a USDT probe ([`UsdtRecord`](crate::UsdtRecord)).
        Usdt = 11,
        /// A breakpoint (`-B FILE:LINE`) was reached: the locals in scope, evaluated as a USDT
        /// probe's arguments are ([`BreakRecord`](crate::BreakRecord)).
        Break = 12,
        /// A hardware watchpoint (`-w VARIABLE`) fired ([`WatchRecord`](crate::WatchRecord)).
        Watch = 13,
    }
}

/// Bits of [`Config::enabled_kinds`](crate::Config::enabled_kinds): `1 << RecordKind as u32`.
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

/// Bytes a `ret` pops: a uretprobe's return sees rsp this far above its entry's.
pub const RETURN_ADDRESS_BYTES: u64 = 8;

impl ReturnRecord {
    /// rsp at its call's entry (the position user space pairs the two by).
    pub const fn entry_sp(&self) -> u64 {
        if crate::cookie::is_ret_site(self.cookie) { self.sp } else { self.sp.wrapping_sub(RETURN_ADDRESS_BYTES) }
    }
}

/// Strings read from the target's memory at a probe (calls at source level). A call or return
/// record whose cookie has [`cookie::STRINGS`](crate::cookie::STRINGS) is followed by the strings its function's
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
    /// Whether user space is to resolve the function patterns against the new image (`dev`,
    /// `ino`), and whether the process waits for it: an [`ExecResolve`].
    pub resolve: u32,
    /// The new image's file (the interpreter's for a `#!` script), as in [`InodeKey`](crate::InodeKey); 0 when
    /// not read (no function patterns).
    pub dev: u64,
    pub ino: u64,
    pub comm: [u8; COMM_LEN],
    /// NUL-terminated unless the name was cut.
    pub filename: [u8; FILENAME_LEN],
}

numbered_enum! {
    /// What an [`ExecRecord`] asks of user space.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum ExecResolve {
        /// Nothing: the image is resolved already, or there are no function patterns.
        No = 0,
        /// The kernel stopped the process (`SIGSTOP`, taken before the new image's first
        /// instruction): user space resolves the image, attaches its probes, then continues it
        /// (`SIGCONT`).
        Stopped = 1,
        /// The process runs on (it is under `ptrace`, whose tracer would see the stop, or the
        /// signal could not be sent): user space resolves the image and attaches its probes as
        /// soon as it reads this, and calls made before then are missed.
        Running = 2,
    }
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
