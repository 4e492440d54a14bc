//! USDT probes: statically defined probes (`.note.stapsdt`) in the targets' executables and
//! libraries, and the program events of the `tracer-events` crate and its C header, which are
//! one such probe (`tracer_events:event`).
//!
//! The path of a probe: [`notes`] reads the probe sites of an ELF file (address, file offset,
//! semaphore, arguments) and [`args`] their argument specs; [`select`] picks the sites to attach
//! (every `tracer_events:event`, and those matching `-u PROVIDER:NAME` patterns) and prepares
//! for each the `tracer_common::UsdtSpec` the kernel evaluates its arguments with;
//! `loader::Kernel::attach_usdt` attaches them as uprobe-multi links that raise their
//! semaphores; [`decode`] turns the kernel's records back into a `log` event or a `usdt` event's
//! arguments (`crate::assemble` calls it). `crate::plan` selects them and `crate::record`
//! attaches them with everything else.

pub mod args;
pub mod decode;
pub mod notes;
pub mod select;
