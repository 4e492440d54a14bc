//! `tracer`'s user space: everything between the kernel's ring buffer and the files users open.
//!
//! The path of an event: [`targets`] and [`symbols`] decide what to probe, [`loader`] attaches the
//! eBPF programs, [`drain`] reads the ring buffer, [`assemble`] turns records into [`event::Event`]s
//! on the Unix clock ([`clock`]), and a [`sink::Sink`] (a file format from [`export`], a channel, a
//! callback) takes them. [`record`] ties these together; [`cli`] is the command line. [`analysis`]
//! turns a trace into call slices, flame graphs, reports and call sequences.

pub mod analysis;
pub mod assemble;
pub mod call_stack;
pub mod channels;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod debuginfo;
pub mod disasm;
pub mod drain;
pub mod errors;
pub mod event;
pub mod export;
pub mod flows;
pub mod golang;
pub mod host;
pub mod kernel_btf;
pub mod launch;
pub mod loader;
pub mod modules;
pub mod order;
pub mod pipeline;
pub mod placement;
pub mod record;
pub mod sink;
pub mod symbols;
pub mod targets;
pub mod top;
pub mod uprobe_multi;
pub mod usdt;
