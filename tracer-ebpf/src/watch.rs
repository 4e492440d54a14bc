//! Hardware watchpoints (`-w VARIABLE`): user space opens a `PERF_TYPE_BREAKPOINT` perf event on
//! each traced thread (inherited by the threads and children it creates) and attaches this
//! program to it. x86 data breakpoints trap after the access, so the program reads the value the
//! access left, and the instruction pointer it sees is the instruction after the one that made it.

use aya_ebpf::{helpers::generated::bpf_probe_read_user, macros::perf_event, programs::PerfEventContext};
use tracer_common::{LostSlot, RecordKind, WatchRecord, watch_flags};

use crate::maps::{EVENTS, count_lost, current_ids, enabled, header, is_traced, submit_flags};

/// The lowest kernel address on x86-64: an `ip` at or above it means the trap came from kernel
/// mode: the kernel accessed the variable on the program's behalf (exec clearing `.bss` byte by
/// byte, a system call filling it). Those are not the program's accesses and are left out.
const KERNEL_START: u64 = 0xffff_8000_0000_0000;

#[perf_event]
pub fn watch_hit(ctx: PerfEventContext) -> u32 {
    try_watch_hit(&ctx).unwrap_or(0)
}

/// Reads `N` bytes at `address` into the low bytes of a `u64`.
#[inline(always)]
fn read_user<const N: u32>(address: u64) -> Option<u64> {
    let mut value: u64 = 0;
    // SAFETY: reads N (at most 8) bytes of the traced process's memory into `value`;
    // `bpf_probe_read_user` checks the address, a bad one is an error, not a fault.
    let ret = unsafe { bpf_probe_read_user((&raw mut value).cast(), N, address as *const _) };
    (ret == 0).then_some(value)
}

fn try_watch_hit(ctx: &PerfEventContext) -> Result<u32, i64> {
    let (tgid, tid) = current_ids();
    if !enabled(RecordKind::Watch) || !is_traced(tgid) {
        return Ok(0);
    }
    // SAFETY: `ctx.ctx` is the kernel's `bpf_perf_event_data` for this event; the verifier turns
    // these field loads into reads of the sample (`addr` is the breakpoint's address) and of the
    // registers at the trap.
    let (address, ip) = unsafe { ((*ctx.ctx).addr, (*ctx.ctx).regs.rip) };
    if ip >= KERNEL_START {
        return Ok(0);
    }
    // A variable may end a few bytes before an unmapped page: read less when eight bytes fail.
    let (value, flags) = match read_user::<8>(address)
        .or_else(|| read_user::<4>(address))
        .or_else(|| read_user::<2>(address))
        .or_else(|| read_user::<1>(address))
    {
        Some(value) => (value, 0),
        None => (0, watch_flags::READ_FAILED),
    };
    let record = WatchRecord { header: header(RecordKind::Watch, tgid, tid), address, ip, value, flags, _pad: 0 };
    let Some(mut entry) = EVENTS.reserve::<WatchRecord>(0) else {
        count_lost(LostSlot::ring_full(RecordKind::Watch));
        return Ok(0);
    };
    entry.write(record);
    entry.submit(submit_flags());
    Ok(0)
}
