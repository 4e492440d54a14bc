//! The running kernel and the programs loaded into it: what it offers ([`features`], and kernel
//! structure offsets from BTF in [`btf`]), loading the eBPF programs and their maps ([`loader`],
//! with uprobe-multi links in [`uprobe_multi`] or perf-event uprobes in [`uprobe_perf`], as the
//! features allow), the programs' own log ([`log`], `--debug-kernel`), and whether the processes
//! they trace still live ([`traced`]).

pub mod btf;
pub mod call_rings;
pub mod features;
pub mod loader;
pub mod log;
pub mod sites;
pub mod traced;
pub mod uprobe_multi;
pub mod uprobe_perf;
