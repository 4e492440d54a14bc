//! `tracer`'s user space: everything between the kernel's ring buffer and the files users open.
//!
//! The modules follow the path of an event:
//! - [`plan`]: what to trace, resolved and checked before anything is attached: the targets
//!   ([`targets`]: processes, executables, a command and how it is launched, modules), their
//!   functions ([`functions`]: symbols, probe placement, returns), USDT probes ([`usdt`]) and
//!   breakpoints ([`breakpoints`]), read from what a binary says about itself ([`debuginfo`]: DWARF).
//!   [`record`], [`top`] and the agent each start from a plan.
//! - [`record`]: load and attach the plan's probes into the running kernel ([`kernel`]: features,
//!   BTF, loader, uprobe-multi), and drain the ring buffer ([`record::drain`]).
//! - [`assemble`]: kernel records become [`event::Event`]s: the Unix clock ([`assemble::clock`]),
//!   returns paired with calls ([`assemble::pairing`]), IPC channels and signals
//!   ([`assemble::channels`]).
//! - [`pipeline`]: events in time order ([`pipeline::order`]), receives linked to sends
//!   ([`pipeline::flows`]), filtered to the kinds asked for.
//! - [`event`]: the one event model and its JSON lines encoding; [`sink::Sink`] is where a trace goes,
//!   and [`output_file`] how its file is made (private, never through another user's link or file).
//! - [`export`]: file formats and OTLP; [`trace::read`]: a recorded trace read back, whatever its
//!   format; [`analysis`]: call slices, flame stacks, reports, call
//!   listings; [`cluster`]: agents, the collector and the protocol between them; [`top`]: live
//!   statistics aggregated in the kernel; [`view`]: the trace as a page in the browser, recorded or
//!   live.
//!
//! The library never prints: the `tracer` binary (`src/main.rs`, `src/cli/`) owns the command line
//! and decides what reaches the terminal.

pub mod analysis;
pub mod assemble;
pub mod breakpoints;
pub mod cluster;
pub mod debuginfo;
pub mod errors;
pub mod event;
pub mod export;
pub mod functions;
pub mod kernel;
pub mod mapped_file;
pub mod output_file;
pub mod pipeline;
pub mod plan;
pub mod printable;
pub mod record;
pub mod sink;
pub mod targets;
pub mod top;
pub mod trace;
pub mod usdt;
pub mod view;
