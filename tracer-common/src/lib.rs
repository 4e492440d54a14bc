//! The bytes that cross from the tracer's eBPF programs to user space, and the names both sides use.
//!
//! Every record starts with a [`RecordHeader`]; its `kind` says which record follows. Records are
//! `#[repr(C)]`, integers only, with explicit padding, so that the kernel side can write them into
//! ring-buffer memory field by field and user space can check the length before reading anything.
//! User space never trusts a kind or a flag straight from the kernel bytes: it reads the `u32` and
//! converts it with `TryFrom`, rejecting unknown values (see [`decode`] with the `user` feature).
#![no_std]

#[cfg(feature = "user")]
pub mod decode;

/// Declares a `#[repr(u32)]` enum whose numbers cross the kernel/user boundary, with the checked
/// conversion back from a number (`from_u32`, and `TryFrom<u32>` giving the unknown number as the
/// error) generated from the same list, so that the two cannot disagree.
macro_rules! numbered_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident { $($(#[$variant_meta:meta])* $variant:ident = $number:literal,)+ }
    ) => {
        $(#[$meta])*
        #[repr(u32)]
        pub enum $name { $($(#[$variant_meta])* $variant = $number,)+ }

        impl $name {
            /// The variant with this number, if any.
            pub const fn from_u32(number: u32) -> Option<$name> {
                match number {
                    $($number => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];
        }

        impl TryFrom<u32> for $name {
            type Error = u32;

            fn try_from(number: u32) -> Result<Self, u32> {
                Self::from_u32(number).ok_or(number)
            }
        }
    };
}

/// The kernel's `MAX_URETPROBE_DEPTH` (include/linux/uprobes.h): a thread with this many return
/// probes pending gets none for a deeper call. The per-thread stacks of open calls (the gates',
/// `tracer top`'s, user space's pairing) are this deep, one definition for all.
pub const MAX_URETPROBE_DEPTH: usize = 64;

mod records;
pub use records::*;
pub mod call_rings;
mod lost;
pub use lost::*;
mod ipc;
pub use ipc::*;
mod usdt;
pub use usdt::*;
mod watch;
pub use watch::*;
mod config;
pub use config::*;

/// The BPF cookie of a function probe: what the one shared program needs to know about the probe
/// that fired, so that the hot path reads no map.
///
/// Bits 0-31: the function's index in user space's table. Bit 32: a Go probe (read `g` from r14,
/// the goroutine id at the offset in bits 48-63, Go's argument registers). Bit 33: a Go return
/// (the probe is on a `ret` instruction). Bit 34: the probe reads strings (see [`strings`]): only
/// then does the program look the function's layout up.
pub mod cookie;
/// Predicates on calls (`-f 'FUNC if EXPR'`), compiled by user space (`plan::filter`) into a
/// branching program that the entry probe runs before anything is written: each op compares one
/// argument register with a constant and jumps forward to another op, or ends with
/// [`filter::ACCEPT`] or [`filter::REJECT`]. Jumps only go forward, so a program ends after at
/// most [`filter::MAX_OPS`] steps; `&&`, `||` and `!` are jumps, so no stack is needed.
pub mod filter;
/// Triggers and depth (`--start-at`, `--stop-at`, `--depth`): each thread's gate, kept in the
/// kernel's `GATES` map by thread id, says whether the thread records and which gated calls are
/// open on it, by the stack pointer at their entry (where the return address is), each with
/// whether it was written. A return is matched to its call by that stack pointer, so a call that
/// was written gets its return written and one that was not gets none, however the thread's state
/// changed in between; calls left by `longjmp` or an exception are dropped from the gate at the
/// next call or return above them (as `tracer top`'s stacks are).
pub mod gate;
/// Names of maps and globals in the eBPF object.
pub mod names;
/// Names of the programs in the eBPF object.
pub mod programs;
/// `tracer top`: per-function statistics kept in the kernel (no records).
pub mod top;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are `#[repr(C)]`, made only of integers and integer arrays, with the
    // padding spelled out as fields, so every bit pattern is a valid value.
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::InodeKey {}
    unsafe impl aya::Pod for super::UsdtSpec {}
    unsafe impl aya::Pod for super::top::Stats {}
    unsafe impl aya::Pod for super::top::Key {}
    unsafe impl aya::Pod for super::filter::Program {}
    unsafe impl aya::Pod for super::filter::Counts {}
}
