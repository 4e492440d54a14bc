//! The one USDT probe every event goes through: `tracer_events:event`, with its semaphore.
//!
//! A USDT probe is a no-op instruction in the code and an ELF note (`.note.stapsdt`) that says
//! where it is, what its arguments are (`8@%rdi 8@%rsi`: the payload's address and length) and
//! where its semaphore is: a 16-bit counter in the `.probes` section that the kernel increments
//! for every tracer attached (uprobe `ref_ctr_offset`) and decrements when it detaches. So
//! [`listening`] is one load and compare, and everything else (formatting, encoding, the probe)
//! happens only while a tracer is attached.
//!
//! Written here rather than with the `probe` crate's `probe_lazy!` (which has semaphores too)
//! for two reasons. `probe_lazy!` gives each call site a semaphore of its own, while
//! [`listening`] must read the very counter of the probe that will fire. And the probe
//! instruction here is a 5-byte nop, which Linux 6.18 turns into a call to its uprobe trampoline
//! instead of a breakpoint trap (about 20 times cheaper on this VM); such a call pushes a return
//! address below the stack pointer, so the stack pointer is first moved past the 128-byte red
//! zone, where the compiler may keep live data, and restored after.

use std::sync::atomic::{AtomicU16, Ordering};

/// The semaphore. An explicit section keeps it out of `.bss`: the kernel can only bump a counter
/// that is backed by the file (`.probes` is `PROGBITS`, like `<sys/sdt.h>`'s).
#[unsafe(link_section = ".probes")]
#[used]
static SEMAPHORE: AtomicU16 = AtomicU16::new(0);

/// Whether a tracer is attached to this program's events (the semaphore is not zero).
#[inline(always)]
pub fn listening() -> bool {
    SEMAPHORE.load(Ordering::Relaxed) != 0
}

/// Fires the probe with one encoded payload. Kept out of line so that the probe has one site (and
/// its callers stay small).
#[inline(never)]
pub(crate) fn fire(payload: &[u8]) {
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    // SAFETY: the asm only moves the stack pointer down and back up around a nop (leaving the
    // registers and flags as they were), and adds an ELF note in a non-allocated section. Without
    // `nomem` the compiler has written the payload to memory before it, where the tracer reads it.
    unsafe {
        std::arch::asm!(
            "lea -128(%rsp), %rsp",
            "990: .byte 0x0f, 0x1f, 0x44, 0x00, 0x00",
            "lea 128(%rsp), %rsp",
            ".pushsection .note.stapsdt, \"\", \"note\"",
            ".balign 4",
            ".4byte 992f-991f, 994f-993f, 3",
            "991: .asciz \"stapsdt\"",
            "992: .balign 4",
            "993: .8byte 990b",
            ".8byte _.stapsdt.base",
            ".8byte {semaphore}",
            ".asciz \"tracer_events\"",
            ".asciz \"event\"",
            ".asciz \"8@{address} 8@{len}\"",
            "994: .balign 4",
            ".popsection",
            // The base `.stapsdt.base` tells a reader how far a prelinker moved the file.
            ".ifndef _.stapsdt.base",
            ".pushsection .stapsdt.base, \"aGR\", \"progbits\", .stapsdt.base, comdat",
            ".weak _.stapsdt.base",
            ".hidden _.stapsdt.base",
            "_.stapsdt.base: .space 1",
            ".size _.stapsdt.base, 1",
            ".popsection",
            ".endif",
            address = in(reg) payload.as_ptr(),
            len = in(reg) payload.len(),
            semaphore = sym SEMAPHORE,
            options(att_syntax, readonly, preserves_flags),
        );
    }
    #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
    let _ = payload;
}
