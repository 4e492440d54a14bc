//! Putting the probes in place: loading the eBPF programs and their maps ([`loader`], with
//! uprobe-multi links in [`uprobe_multi`] or perf-event uprobes in [`uprobe_perf`], as the
//! kernel's [`features`] allow, and kernel structure offsets from BTF in [`kernel_btf`]),
//! and launching a traced command stopped at its first instruction ([`launch`]; for the agent, as
//! a service manager would, [`detached`]).

pub mod detached;
pub mod features;
pub mod kernel_btf;
pub mod launch;
pub mod loader;
pub mod uprobe_multi;
pub mod uprobe_perf;
