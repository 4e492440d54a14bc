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
    pub const TARGET_INODES: &str = "TARGET_INODES";
    pub const LOST: &str = "LOST";
    pub const CONFIG: &str = "CONFIG";
}

/// Names of the programs in the eBPF object.
pub mod programs {
    pub const CALL_ENTRY: &str = "call_entry";
    pub const CALL_RETURN: &str = "call_return";
    pub const SCHED_FORK: &str = "sched_fork";
    pub const SCHED_EXEC: &str = "sched_exec";
    pub const SCHED_EXIT: &str = "sched_exit";

    /// Kernel raw tracepoints (`TP_PROTO` arguments, no tracefs needed) that the sched programs attach to.
    pub const SCHED_FORK_TP: &str = "sched_process_fork";
    pub const SCHED_EXEC_TP: &str = "sched_process_exec";
    pub const SCHED_EXIT_TP: &str = "sched_process_exit";
}

/// The kind of a record, as written in [`RecordHeader::kind`]. The discriminant doubles as the slot
/// of the per-CPU lost-event counters.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RecordKind {
    Call = 1,
    Return = 2,
    Fork = 3,
    Exec = 4,
    Exit = 5,
}

impl RecordKind {
    pub const ALL: [RecordKind; 5] =
        [RecordKind::Call, RecordKind::Return, RecordKind::Fork, RecordKind::Exec, RecordKind::Exit];
}

impl TryFrom<u32> for RecordKind {
    type Error = u32;

    fn try_from(value: u32) -> Result<Self, u32> {
        Ok(match value {
            1 => RecordKind::Call,
            2 => RecordKind::Return,
            3 => RecordKind::Fork,
            4 => RecordKind::Exec,
            5 => RecordKind::Exit,
            other => return Err(other),
        })
    }
}

/// Slots of the `LOST` per-CPU array. Slots 1..=13 count ring-buffer reserve failures per
/// [`RecordKind`]; the others count things the kernel side had to give up on.
pub mod lost_slot {
    /// A traced process forked, but the traced-pid map was full: the child is not traced.
    pub const UNTRACKED_CHILD: u32 = 14;
    /// Number of slots in the `LOST` map.
    pub const COUNT: u32 = 16;
}

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
}

/// Return from a probed function.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReturnRecord {
    pub header: RecordHeader,
    pub cookie: u64,
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
    pub _pad: u32,
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

/// Key of the `TARGET_INODES` map: a process that exec's a file with this device and inode
/// becomes traced (`--binary`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
    pub bprm_file: u32,
    pub bprm_filename: u32,
    pub file_inode: u32,
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub sb_dev: u32,
    pub _pad: u32,
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
    pub _pad: u32,
    /// Records do not wake the reader up (it polls) until this many bytes wait in the ring: a
    /// wake-up per record costs the traced program more than the record itself.
    pub wakeup_bytes: u64,
    pub offsets: KernelOffsets,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are `#[repr(C)]`, made only of integers and integer arrays, with the
    // padding spelled out as fields, so every bit pattern is a valid value.
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::InodeKey {}
}
