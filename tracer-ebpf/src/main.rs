//! The tracer's kernel side: one uprobe/uretprobe pair for every probed function (told apart by the
//! attach cookie), raw tracepoints for process lifecycle and signals, syscall tracepoints for
//! IPC, and two USDT programs (a program's own events, and any other probe's arguments). Every program is a thin wrapper around
//! a `try_` function; records go into one ring buffer, and a record that does not fit is counted
//! in the per-CPU `LOST` array under its kind, never dropped silently.
#![no_std]
#![no_main]
// For `atomic_xadd` (see `ipc::fetch_add`); the eBPF build already needs an unstable `-Z build-std`.
#![feature(core_intrinsics)]
// For `maps::opaque` (an empty `asm!`, libbpf's `barrier_var`).
#![feature(asm_experimental_arch)]
#![allow(internal_features)]

mod filter;
mod gate;
mod ipc;
mod maps;
mod sched;
mod signal;
mod strings;
mod top;
mod uprobe;
mod usdt;
mod watch;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any reachable panic, so this is never called in a loaded program.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
