//! Hardware watchpoints (`-w VARIABLE`): user space opens a `PERF_TYPE_BREAKPOINT` perf event on
//! each traced thread (inherited by the threads and children it creates) and attaches this
//! program to it. x86 data breakpoints trap after the access, so the program reads the value the
//! access left, and the instruction pointer it sees is the instruction after the one that made it.
//!
//! A hit in a process that no longer runs the executable the variables were found in is dropped:
//! the perf events survive exec (and an inherited one cannot be closed for one process alone),
//! but in the new image the address is some other variable's or nothing's.
//!
//! A hit during a single-step that repeats the thread's last report is left out: QEMU's emulated
//! CPU (TCG, the test VMs) recomputes DR6 at every single-step trap from a per-watchpoint "hit"
//! flag that stays set after the access that raised it (`helper_single_step` calls
//! `check_hw_breakpoints(env, true)`), so the single-step of a uprobe's displaced instruction
//! (a `-B` breakpoint, a `-f` function's entry) reports the earlier access again, with the same
//! value and an instruction pointer in the uprobe area. Real CPUs set a DR6 breakpoint bit at a
//! single-step only when the stepped instruction made the access.

use aya_ebpf::{
    helpers::generated::{bpf_get_current_task, bpf_probe_read_user},
    macros::{map, perf_event},
    maps::LruHashMap,
    programs::PerfEventContext,
};
use tracer_common::{RecordKind, WatchRecord, watch_flags};

use crate::maps::{config, current_ids, emit, enabled, file_key, header, is_traced, read_kernel};

/// The lowest kernel address on x86-64: an `ip` at or above it means the trap came from kernel
/// mode: the kernel accessed the variable on the program's behalf (exec clearing `.bss` byte by
/// byte, a system call filling it). Those are not the program's accesses and are left out.
const KERNEL_START: u64 = 0xffff_8000_0000_0000;

/// The trap flag in RFLAGS: set in the registers of a trap taken while single-stepping.
const EFLAGS_TF: u64 = 1 << 8;

/// A thread and a watched address.
#[repr(C)]
struct WatchKey {
    tid: u32,
    _pad: u32,
    address: u64,
}

/// The value each thread's last reported hit of each watched address found. Least recently used
/// entries go first: a forgotten one can only let an emulator's repeat through, never hide a hit.
#[map]
static LAST_HIT: LruHashMap<WatchKey, u64> = LruHashMap::with_max_entries(16384, 0);

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

/// Whether the current process runs the executable the watched variables were found in
/// (`Config::watch_image`; always, when it is not set).
#[inline(always)]
fn runs_watched_image() -> Result<bool, i64> {
    let cfg = config();
    if cfg.watch_image.ino == 0 {
        return Ok(true);
    }
    // SAFETY: a helper without arguments; the task pointer is only read through
    // `bpf_probe_read_kernel`.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let mm: *const u8 = read_kernel(task, cfg.offsets.task_mm)?;
    let exe: *const u8 = read_kernel(mm, cfg.offsets.mm_exe_file)?;
    let image = file_key(exe, cfg)?;
    Ok(image.dev == cfg.watch_image.dev && image.ino == cfg.watch_image.ino)
}

fn try_watch_hit(ctx: &PerfEventContext) -> Result<u32, i64> {
    let (tgid, tid) = current_ids();
    if !enabled(RecordKind::Watch) || !is_traced(tgid) {
        return Ok(0);
    }
    // SAFETY: `ctx.ctx` is the kernel's `bpf_perf_event_data` for this event; the verifier turns
    // these field loads into reads of the sample (`addr` is the breakpoint's address) and of the
    // registers at the trap.
    let (address, ip, eflags) = unsafe { ((*ctx.ctx).addr, (*ctx.ctx).regs.rip, (*ctx.ctx).regs.eflags) };
    if ip >= KERNEL_START || !runs_watched_image()? {
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
    let key = WatchKey { tid, _pad: 0, address };
    // SAFETY: the value is a plain u64 copied out at once.
    let repeat = eflags & EFLAGS_TF != 0 && unsafe { LAST_HIT.get(&key) } == Some(&value);
    if repeat {
        return Ok(0);
    }
    // A full map evicts its least recently used entry; an insert fails only under memory pressure,
    // which at worst lets a repeat through.
    let _ = LAST_HIT.insert(&key, &value, 0);
    let record = WatchRecord { header: header(RecordKind::Watch, tgid, tid), address, ip, value, flags, _pad: 0 };
    emit(RecordKind::Watch, record);
    Ok(0)
}
