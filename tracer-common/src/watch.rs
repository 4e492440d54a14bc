//! Hardware watchpoints (`-w VARIABLE`).

use crate::RecordHeader;

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
