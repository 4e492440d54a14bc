//! What the eBPF programs are attached to, as the loader takes it: a function's probe, a USDT
//! site, a hardware watchpoint. The stages above (functions/, usdt/, breakpoints/) decide them;
//! the kernel layer only attaches them, so these types live here, below both.

use std::path::PathBuf;

use tracer_common::UsdtSpec;

/// One probe: a uprobe, or a uretprobe, at an offset of a file. A function has one or more (a Go
/// function one at its entry and one on each `ret`, all ordinary uprobes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeSpec {
    /// The ELF file.
    pub path: PathBuf,
    pub file_offset: u64,
    /// The function's index in user space's table and what kind of probe this is
    /// (`tracer_common::cookie`), delivered back in every record.
    pub cookie: u64,
    /// A uretprobe (`call_return`); otherwise a uprobe (`call_entry`).
    pub ret: bool,
}

/// Which eBPF program a site is attached to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UsdtProgram {
    /// `tracer_events:event`: its payload is copied.
    Event,
    /// Any other probe: its arguments are evaluated.
    Probe,
}

/// One probe site to attach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsdtProbe {
    pub path: PathBuf,
    pub file_offset: u64,
    /// File offset of the semaphore the kernel raises while attached; 0 for none.
    pub semaphore_offset: u64,
    /// Index in the [`ProbeTable`](crate::usdt::select::ProbeTable) and in the kernel's `USDT_SPECS`.
    pub cookie: u64,
    pub program: UsdtProgram,
    pub spec: UsdtSpec,
}

/// One watchpoint to open: a thread, and what to watch in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watchpoint {
    pub tid: u32,
    pub address: u64,
    pub len: u8,
    pub access: Access,
}

/// What accesses a watchpoint catches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Write,
    /// x86 has no read-only data breakpoint: `r` catches reads and writes, as `rw` does.
    Read,
    ReadWrite,
}
