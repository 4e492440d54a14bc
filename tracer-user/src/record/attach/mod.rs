//! Putting the probes in place: loading the eBPF programs and their maps ([`loader`], with
//! uprobe-multi links in [`uprobe_multi`] and kernel structure offsets from BTF in [`kernel_btf`]),
//! and launching a traced command stopped at its first instruction ([`launch`]).

pub mod detached;
pub mod kernel_btf;
pub mod launch;
pub mod loader;
pub mod uprobe_multi;
