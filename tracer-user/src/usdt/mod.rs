//! USDT probes: statically defined probes (`.note.stapsdt`) in the targets' executables and
//! libraries, and the program events of the `tracer-events` crate and its C header, which are
//! one such probe (`tracer_events:event`).
//!
//! The path of a probe: [`notes`] reads the probe sites of an ELF file (address, file offset,
//! semaphore, arguments) and [`args`] their argument specs; [`select`] picks the sites to attach
//! (every `tracer_events:event`, and those matching `-u PROVIDER:NAME` patterns) and prepares
//! for each the `tracer_common::UsdtSpec` the kernel evaluates its arguments with;
//! `loader::Kernel::attach_usdt` attaches them as uprobe-multi links that raise their
//! semaphores; [`decode`] turns the kernel's records back into a program event or a probe's
//! arguments. [`debug`] is `tracer debug-usdt`, which prints those decoded records until the
//! `log` and `usdt` events reach the event model.

pub mod args;
pub mod debug;
pub mod decode;
pub mod notes;
pub mod select;
