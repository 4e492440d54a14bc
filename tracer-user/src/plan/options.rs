//! The options of a trace and the errors of planning and starting it, which `record`, `top` and the
//! agent share.

use std::{collections::BTreeSet, ffi::OsString, path::PathBuf, time::Duration};

use tracer_common::CAPTURE_BYTES_MAX;

use super::{filter, ring_size};
use crate::{
    event::EventKind,
    event::host::{self, NameError},
    functions::symbols::SymbolError,
    kernel::btf::KernelBtfError,
    kernel::loader::LoadError,
    targets::TargetError,
    targets::launch::{LaunchError, Start},
    targets::modules::ModuleError,
};

/// Default `--max-probes`.
pub const DEFAULT_MAX_PROBES: usize = 4096;

#[derive(Clone, Debug)]
pub struct RecordOptions {
    pub pids: Vec<u32>,
    pub binaries: Vec<PathBuf>,
    /// The command to launch, program first; empty for none.
    pub command: Vec<OsString>,
    pub functions: Vec<String>,
    /// `-u [MODULE:]PROVIDER:NAME` patterns: USDT probes to trace besides the program events.
    pub usdt: Vec<String>,
    /// `-B FILE:LINE` / `-B FUNCTION+OFFSET` breakpoints.
    pub breaks: Vec<crate::breakpoints::spec::BreakSpec>,
    /// `-w VARIABLE[:r|w|rw]` / `-w ADDRESS:LENGTH` watchpoints.
    pub watches: Vec<crate::breakpoints::spec::WatchSpec>,
    pub events: BTreeSet<EventKind>,
    pub follow_children: bool,
    pub duration: Option<Duration>,
    /// `--buffer-size`: the kernel ring buffer's size; `None` fits it to the trace
    /// ([`ring_size`]).
    pub buffer_size: Option<u32>,
    pub max_probes: usize,
    /// Bytes read of each string parameter or return value at most (`--string-size`).
    pub string_size: u16,
    /// `--capture-bytes`: payload bytes kept from each send and receive (0: none; at most
    /// [`CAPTURE_BYTES_MAX`]).
    pub capture_bytes: u32,
    /// The host name written in every event (checked with [`host::check_name`]; default: this
    /// machine's host name).
    pub host: String,
    /// How the command starts: as the tracer's own child (`record`), or detached from it, as
    /// the user who asked (the agent).
    pub start: Start,
    /// `--debug-kernel`: the eBPF programs log their rare failures through aya-log, and the
    /// recording forwards those records to the `log` crate (target `tracer_ebpf::...`).
    pub debug_kernel: bool,
    /// `--attach`: how probes are attached, instead of the best the kernel has.
    pub attach: Option<crate::kernel::features::AttachMechanism>,
    /// `--returns`: how native returns are probed, instead of what the programs need
    /// (`functions::unwinding`).
    pub return_probes: Option<crate::functions::unwinding::ReturnProbes>,
    /// `--no-sleepable`: string reads never fault pages in, as on kernels without sleepable
    /// uprobes (tests and benches).
    pub no_sleepable: bool,
    /// `--min-duration`: only native calls that last at least this long are written, with their
    /// returns (decided in the kernel at the return: see `cookie::HOLD`); 0 for all.
    pub min_duration_ns: u64,
    /// `--min-duration-keep-children`: the calls inside a call long enough are written too;
    /// then the durations are decided in user space (`pipeline::keep_children`), not the kernel.
    pub keep_children: bool,
    /// `--start-at`: function patterns; on each thread, calls are written from its first entry
    /// into one of these on (decided in the kernel: see `tracer_common::gate`).
    pub start_at: Vec<String>,
    /// `--stop-at`: function patterns; a thread entering one stops writing calls until it enters
    /// a `--start-at` function.
    pub stop_at: Vec<String>,
    /// `--depth`: calls nested deeper than this many traced calls on a thread are not written.
    pub depth: Option<u32>,
}

impl Default for RecordOptions {
    fn default() -> Self {
        RecordOptions {
            pids: Vec::new(),
            binaries: Vec::new(),
            command: Vec::new(),
            functions: Vec::new(),
            usdt: Vec::new(),
            breaks: Vec::new(),
            watches: Vec::new(),
            events: EventKind::ALL.into_iter().collect(),
            follow_children: true,
            duration: None,
            buffer_size: None,
            max_probes: DEFAULT_MAX_PROBES,
            string_size: crate::debuginfo::layout::DEFAULT_STRING_SIZE,
            capture_bytes: 0,
            host: host::default_name(),
            start: Start::Inherit,
            debug_kernel: false,
            attach: None,
            return_probes: None,
            no_sleepable: false,
            min_duration_ns: 0,
            keep_children: false,
            start_at: Vec::new(),
            stop_at: Vec::new(),
            depth: None,
        }
    }
}

impl RecordOptions {
    /// Whether calls are decided by their thread's gate: `--start-at`, `--stop-at`, `--depth`.
    pub fn gated(&self) -> bool {
        !self.start_at.is_empty() || !self.stop_at.is_empty() || self.depth.is_some()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("tracer must run as root (it loads eBPF programs into the kernel)")]
    NotRoot,
    #[error("nothing to trace: give --pid, --binary, or a command after --")]
    NoTargets,
    /// The caller gave up on the start before it traced anything (`record::StartGate` decides it).
    #[error("start-up was abandoned before anything was traced")]
    Abandoned,
    #[error(transparent)]
    HostName(#[from] NameError),
    #[error(
        "tracer must run in the initial pid namespace: the kernel reports the pids of that namespace, so in another one it would trace the wrong processes or none (run it on the host, or in a container with --pid=host)"
    )]
    NotInitialPidNamespace,
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Symbols(#[from] SymbolError),
    #[error(transparent)]
    Module(#[from] ModuleError),
    #[error("function pattern '{pattern}' matches nothing in {modules}{}", suggest(.suggestions))]
    NoMatch { pattern: String, modules: String, suggestions: Vec<String> },
    #[error(
        "{count} functions would be probed, more than --max-probes ({max}); narrow the selection with -f (e.g. -f 'app::*')"
    )]
    TooManyProbes { count: usize, max: usize },
    #[error("no function of {modules} is defined in a source file matching '{glob}': {available}")]
    NoSourceMatch { glob: String, modules: String, available: String },
    #[error("bad predicate in -f")]
    Filter(#[from] filter::FilterError),
    #[error("-f '... if ...': {0} is a Go function; predicates are evaluated on native (C, C++, Rust) functions only")]
    FilterOnGo(String),
    #[error(
        "-f '... ret-if ...' and --min-duration decide a call at its return, but {0} has no return probe here (see the warning above); leave it out or use `if`"
    )]
    HeldWithoutReturn(String),
    #[error("-f '... ret-if ...' and --min-duration decide calls at their returns: --events must include return")]
    HeldWithoutReturnEvents,
    #[error("--start-at, --stop-at and --depth match each call to its return: --events must include return")]
    GateWithoutReturnEvents,
    #[error("{option} '{pattern}' matches no function in {modules}")]
    NoTriggerMatch { option: &'static str, pattern: String, modules: String },
    #[error("--depth must be between 1 (only the outermost traced calls) and {max}, got {0}", max = tracer_common::gate::MAX_OPEN)]
    BadDepth(u32),
    #[error("--functions needs call or return events, but --events has neither")]
    FunctionsWithoutCallEvents,
    #[error("--capture-bytes is at most {CAPTURE_BYTES_MAX}, got {0}")]
    CaptureBytesTooLarge(u32),
    #[error("--string-size must be between 1 and {max}, got {0}", max = crate::debuginfo::layout::MAX_STRING_SIZE)]
    BadStringSize(u16),
    #[error("--buffer-size must be a power of two multiple of the page size (4 KiB), got {0}")]
    BadBufferSize(u32),
    #[error(
        "--buffer-size {} MiB is more than 1/{} of this host's memory ({:.1} GiB): at most {} MiB here",
        .size >> 20, ring_size::BUFFER_SHARE_OF_MEMORY, *.mem_total as f64 / (1u64 << 30) as f64, .max >> 20
    )]
    BufferTooLarge { size: u32, mem_total: u64, max: u64 },
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    KernelBtf(#[from] KernelBtfError),
    #[error(transparent)]
    Kernel(#[from] crate::kernel::features::KernelError),
    #[error("no function could be probed: {0}")]
    NoProbeAttached(String),
    #[error(transparent)]
    Usdt(#[from] crate::usdt::select::SelectError),
    #[error(transparent)]
    Breakpoint(#[from] crate::breakpoints::BreakpointError),
    #[error("-B needs break events and -w watch events, but --events does not have them")]
    BreakpointsWithoutEvents,
    #[error("-w cannot watch on this machine: {0}")]
    NoHardwareBreakpoints(String),
    #[error("--usdt needs usdt events, but --events does not have them")]
    UsdtWithoutUsdtEvents,
    #[error("cannot probe the Go functions of {0}")]
    GoRefused(String),
    #[error("writing the trace failed")]
    Output(#[from] std::io::Error),
}

fn suggest(suggestions: &[String]) -> String {
    if suggestions.is_empty() { String::new() } else { format!("; did you mean {}?", suggestions.join(", ")) }
}

/// Checks that the process can load eBPF programs.
pub fn check_root() -> Result<(), RecordError> {
    if nix::unistd::geteuid().is_root() { Ok(()) } else { Err(RecordError::NotRoot) }
}

/// The inode of the initial pid namespace (`PROC_PID_INIT_INO` in the kernel's `proc_ns.h`).
const INITIAL_PID_NAMESPACE: u64 = 0xEFFF_FFFC;

/// The trace's pids are the initial pid namespace's (what `bpf_get_current_pid_tgid` and the
/// sched tracepoints report), and so are the pids the user gives and the tracer launches: a
/// tracer in another pid namespace would compare numbers from two namespaces.
pub fn check_pid_namespace() -> Result<(), RecordError> {
    use std::os::unix::fs::MetadataExt as _;
    match std::fs::metadata("/proc/self/ns/pid") {
        Ok(m) if m.ino() != INITIAL_PID_NAMESPACE => Err(RecordError::NotInitialPidNamespace),
        // Without /proc/self/ns (very old kernels, no procfs) there is nothing to tell.
        _ => Ok(()),
    }
}
