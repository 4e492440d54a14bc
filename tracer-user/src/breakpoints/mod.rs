//! Breakpoints (`-B FILE:LINE`, `-B FUNCTION+OFFSET`) and hardware watchpoints (`-w VARIABLE`,
//! `-w ADDRESS:LENGTH`).
//!
//! The path of a breakpoint: [`spec`] parses the option; [`select`] finds its addresses in the
//! executable's line table (`crate::debuginfo::source_map`) and the locals in scope at each, and
//! turns them into USDT-style probes (`tracer_common::UsdtSpec` with `record_kind` `Break`: the
//! kernel's `usdt_probe` program evaluates each local as it would a USDT argument); [`decode`]
//! types the values back by DWARF.
//!
//! The path of a watchpoint: [`select`] finds the variable's address and type in DWARF;
//! [`hardware`] says where it is in each process and opens a `PERF_TYPE_BREAKPOINT` perf event
//! on each of its threads (inherited by the threads and children they create), with the
//! `watch_hit` program attached; [`decode`] types the value read after the access and says which
//! function and line made it.

pub mod decode;
pub mod hardware;
pub mod select;
pub mod spec;

use std::path::PathBuf;

use tracer_common::MAX_WATCHPOINTS;

use crate::debuginfo::{DebugInfoError, source_map::LineError};

#[derive(Debug, thiserror::Error)]
pub enum BreakpointError {
    #[error("-B '{0}': expected FILE:LINE or FUNCTION+OFFSET")]
    BadBreak(String),
    #[error(
        "-w '{0}': expected VARIABLE, VARIABLE:r, VARIABLE:w, VARIABLE:rw or ADDRESS:LENGTH (a length of 1, 2, 4 or 8)"
    )]
    BadWatch(String),
    #[error(
        "{0} variables to watch: x86-64 has {MAX_WATCHPOINTS} debug registers per thread, so at most {MAX_WATCHPOINTS} can be watched"
    )]
    TooManyWatches(usize),
    #[error("-B and -w need one executable to look names up in: a command, or --pid")]
    NoExecutable,
    #[error("-B and -w look lines and variables up in DWARF, and {0} has none (build it with -g)")]
    NoDebugInfo(PathBuf),
    /// The line's own sentence (no source: it would say it twice).
    #[error("-B: {0}")]
    Line(LineError),
    #[error("-B: no function named '{name}' in {path}")]
    NoFunction { name: String, path: PathBuf },
    #[error("-w: no global or static variable named '{name}' in the DWARF of {path}")]
    NoVariable { name: String, path: PathBuf },
    #[error("-w: variable '{name}' is {size} bytes; a watchpoint covers 1, 2, 4 or 8 aligned bytes")]
    BadSize { name: String, size: u64 },
    #[error("-B: {0} has no code in a loadable segment")]
    NotLoaded(String),
    #[error("cannot read {path}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is not an ELF file ({reason})")]
    NotElf { path: PathBuf, reason: String },
    #[error(transparent)]
    DebugInfo(#[from] DebugInfoError),
}
