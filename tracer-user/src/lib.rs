//! `tracer`'s user space: everything between the kernel's ring buffer and the files users open.
//!
//! The modules follow the path of an event:
//! - [`record`]: resolve what to trace ([`record::resolve`]: targets, modules, symbols, probe
//!   placement), put the probes in place ([`record::attach`]: loader, uprobe-multi, kernel BTF,
//!   launch), and drain the ring buffer ([`record::drain`]). [`debuginfo`] (DWARF) and [`usdt`]
//!   (`.note.stapsdt`) read what a binary says about its functions and probes.
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
pub mod mapped_file;
pub mod output_file;
pub mod pipeline;
pub mod record;
pub mod sink;
pub mod top;
pub mod trace;
pub mod usdt;
pub mod view;
