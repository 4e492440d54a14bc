//! `tracer top`: per-function statistics kept here, in the kernel, instead of a record per call.
//!
//! The entry program pushes the call's start (time, stack pointer, function) on its thread's
//! stack; the return program pops it and adds the duration to the function's count, total and
//! log-linear histogram (`tracer_common::top`). The counters are shared by all CPUs and updated
//! with atomic adds: per-CPU copies of a 4 KiB histogram per function would cost megabytes per
//! CPU. Everything that could not be counted is counted in `LOST` under a `TOP_*` slot.
//!
//! A return is matched to its call by the stack pointer (the uretprobe runs after `ret`, so it
//! sees the entry's stack pointer plus 8; a probe on the `ret` itself, for programs that unwind,
//! sees the entry's): calls left by `longjmp` or an exception, whose returns never come, are found
//! and dropped from the stack (counted as `no_return`) at the next call or return above them.

use aya_ebpf::{
    EbpfContext as _,
    bindings::BPF_F_NO_PREALLOC,
    helpers::generated::{bpf_get_attach_cookie, bpf_ktime_get_ns},
    macros::{map, uprobe, uretprobe},
    maps::{Array, HashMap, PerCpuArray},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{
    LostSlot, RETURN_ADDRESS_BYTES, cookie,
    top::{self, Frame, Key, MAX_DEPTH, Stack, Stats},
};

use crate::maps::{config, count_lost, current_ids, is_traced, opaque};

/// Statistics per function, indexed by the cookie's function index (user space sizes it to the
/// number of probed functions).
#[map]
pub static TOP_FUNCTIONS: Array<Stats> = Array::with_max_entries(1, 0);

/// Statistics per process and function, with `--by-process`.
#[map]
pub static TOP_BY_PROCESS: HashMap<Key, Stats> = HashMap::with_max_entries(16384, BPF_F_NO_PREALLOC);

/// Each traced thread's open calls, by thread id; removed when the thread exits.
#[map]
pub static TOP_STACKS: HashMap<u32, Stack> = HashMap::with_max_entries(16384, BPF_F_NO_PREALLOC);

/// Zeroed values to insert from (too big for the BPF stack).
#[map]
static TOP_ZERO_STACK: PerCpuArray<Stack> = PerCpuArray::with_max_entries(1, 0);
#[map]
static TOP_ZERO_STATS: PerCpuArray<Stats> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn add(counter: &mut u64, value: u64) {
    // SAFETY: a pointer into a map value, valid for this program run; other CPUs update the same
    // counters, hence the atomic add.
    unsafe { core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(counter, value) };
}

/// The statistics of `function` (of process `tgid` with `--by-process`), created on first use.
#[inline(always)]
fn stats(tgid: u32, function: u32) -> Option<&'static mut Stats> {
    if config().top_by_process == 0 {
        // SAFETY: a map value, valid for this program run.
        return TOP_FUNCTIONS.get_ptr_mut(function).map(|p| unsafe { &mut *p });
    }
    let key = Key { pid: tgid, function };
    if let Some(p) = TOP_BY_PROCESS.get_ptr_mut(&key) {
        // SAFETY: as above.
        return Some(unsafe { &mut *p });
    }
    let zero = TOP_ZERO_STATS.get_ptr(0)?;
    // SAFETY: a per-CPU map value that is never written: all zeros.
    if TOP_BY_PROCESS.insert(&key, unsafe { &*zero }, 0).is_err() {
        count_lost(LostSlot::TopKeysFull);
        return None;
    }
    // SAFETY: as above.
    TOP_BY_PROCESS.get_ptr_mut(&key).map(|p| unsafe { &mut *p })
}

#[uprobe]
pub fn top_entry(ctx: ProbeContext) -> u32 {
    try_top_entry(&ctx).unwrap_or(0)
}

fn try_top_entry(ctx: &ProbeContext) -> Result<u32, i64> {
    // SAFETY: `bpf_get_attach_cookie` only reads the program's run context.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    if cookie::is_ret_site(cookie) {
        // SAFETY: a uprobe's context is the user registers, readable in place.
        return top_exit(unsafe { &*ctx.regs }, cookie);
    }
    let (tgid, tid) = current_ids();
    let stack = match TOP_STACKS.get_ptr_mut(&tid) {
        Some(stack) => stack,
        None => {
            if !is_traced(tgid) {
                return Ok(0);
            }
            let Some(zero) = TOP_ZERO_STACK.get_ptr(0) else { return Ok(0) };
            // SAFETY: a per-CPU map value that is never written: all zeros.
            if TOP_STACKS.insert(&tid, unsafe { &*zero }, 0).is_err() {
                count_lost(LostSlot::TopThreadsFull);
                return Ok(0);
            }
            match TOP_STACKS.get_ptr_mut(&tid) {
                Some(stack) => stack,
                None => return Ok(0),
            }
        }
    };
    let function = cookie::function(cookie);
    // SAFETY: the thread's own stack entry (only this thread's programs touch it), valid for this
    // program run.
    let stack = unsafe { &mut *stack };
    // SAFETY: a uprobe's context is the user registers, readable in place.
    let sp = unsafe { (*ctx.regs).rsp };
    // Open calls at or below this one's return address were left by `longjmp` or an exception
    // (a live caller's return address is always above its callee's): their returns never come.
    drop_unwound(stack, sp);
    // `--start-at`, `--stop-at`, `--depth`: a call not timed is not pushed, so its return finds
    // no frame of its own and is not timed either.
    if cookie::is_gated(cookie) && !crate::gate::top_times(&mut stack.gate, cookie, stack.depth) {
        return Ok(0);
    }
    // `-f 'FUNC if EXPR'`: a refused call is not counted and not pushed, so its return finds no
    // frame of its own and is not timed either (as for the gate above).
    if cookie::is_filtered(cookie) {
        // SAFETY: as above.
        let r = unsafe { &*ctx.regs };
        if !crate::filter::evaluate(function, &[r.rdi, r.rsi, r.rdx, r.rcx, r.r8, r.r9, r.rax], true) {
            return Ok(0);
        }
    }
    let Some(stats) = stats(tgid, function) else { return Ok(0) };
    // With `--min-duration` a call is counted at its return, if it lasted that long.
    if config().min_duration_ns == 0 {
        add(&mut stats.calls, 1);
    }
    let depth = stack.depth as usize;
    if depth >= MAX_DEPTH {
        // The kernel gives no return probe past its limit either: counted, not timed.
        count_lost(LostSlot::TopTooDeep);
        return Ok(0);
    }
    // The mask, on a value the compiler cannot see is below MAX_DEPTH already, bounds the very
    // register the access uses: 6.1's verifier loses the check above on the copy it is made on.
    let frame = &mut stack.frames[opaque(depth as u64) as usize & (MAX_DEPTH - 1)];
    // SAFETY: a helper without preconditions.
    *frame = Frame { ts: unsafe { bpf_ktime_get_ns() }, sp, function, _pad: 0 };
    stack.depth = depth as u32 + 1;
    Ok(0)
}

#[uretprobe]
pub fn top_return(ctx: RetProbeContext) -> u32 {
    try_top_return(&ctx).unwrap_or(0)
}

fn try_top_return(ctx: &RetProbeContext) -> Result<u32, i64> {
    // SAFETY: a helper without preconditions; read first, so the program's own time is not in it.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: as in `try_top_entry`.
    let sp = unsafe { (*ctx.regs).rsp };
    // The uretprobe runs after `ret` popped the return address.
    pop_return(now, sp.wrapping_sub(RETURN_ADDRESS_BYTES), false)
}

/// A return probed where it happens (see `uprobe.rs`): on a `ret`, or on a jump out of the
/// function, where rsp still points at the return address.
#[inline(always)]
fn top_exit(regs: &aya_ebpf::bindings::pt_regs, cookie: u64) -> Result<u32, i64> {
    // SAFETY: as in `try_top_return`.
    let now = unsafe { bpf_ktime_get_ns() };
    if cookie::is_conditional(cookie) && !cookie::condition_holds(cookie::operand(cookie), regs.eflags) {
        return Ok(0);
    }
    // `jmp reg` may be a switch within the function: without the function's extent here, it
    // counts as the exit only when the frame is torn down (rsp back at the return address).
    pop_return(now, regs.rsp, cookie::is_indirect(cookie))
}

/// Ends the call whose return address is at `return_address`, if this thread's stack holds it;
/// calls below it whose returns never came are dropped (and counted), unless `exact`.
#[inline(always)]
fn pop_return(now: u64, return_address: u64, exact: bool) -> Result<u32, i64> {
    let (tgid, tid) = current_ids();
    let Some(stack) = TOP_STACKS.get_ptr_mut(&tid) else { return Ok(0) };
    // SAFETY: as in `try_top_entry`.
    let stack = unsafe { &mut *stack };
    if !exact {
        // Calls below the returning one whose returns never came.
        drop_unwound(stack, return_address.wrapping_sub(1));
    }
    let Some(frame) = top_frame(stack) else { return Ok(0) };
    if frame.sp != return_address {
        // A return of a call this stack does not hold (deeper than MAX_DEPTH), or, `exact`, a
        // jump within the function.
        return Ok(0);
    }
    stack.depth -= 1;
    let ns = now.saturating_sub(frame.ts);
    let min_duration_ns = config().min_duration_ns;
    if ns < min_duration_ns {
        return Ok(0);
    }
    let Some(stats) = stats(tgid, frame.function) else { return Ok(0) };
    if min_duration_ns != 0 {
        add(&mut stats.calls, 1);
    }
    add(&mut stats.returns, 1);
    add(&mut stats.total_ns, ns);
    let bucket = top::bucket(ns);
    if let Some(slot) = stats.histogram.get_mut(bucket) {
        add(slot, 1);
    }
    Ok(0)
}

/// The innermost open call.
#[inline(always)]
fn top_frame(stack: &Stack) -> Option<Frame> {
    let depth = stack.depth as usize;
    if depth == 0 {
        return None;
    }
    // `top_entry` never pushes past MAX_DEPTH (a power of two), so the mask changes nothing; it
    // bounds the very register the access uses, which verifiers before 6.8 need (they lose a
    // bound checked on a copy, and cannot use `depth != 0` as a lower bound).
    Some(stack.frames[(depth - 1) & (MAX_DEPTH - 1)])
}

/// Drops (and counts) the open calls whose return address is at or below `sp`: dead frames,
/// left by `longjmp` or an exception.
#[inline(always)]
fn drop_unwound(stack: &mut Stack, sp: u64) {
    for _ in 0..MAX_DEPTH {
        match top_frame(stack) {
            Some(frame) if frame.sp <= sp => {
                stack.depth -= 1;
                count_lost(LostSlot::TopNoReturn);
            }
            _ => break,
        }
    }
}

/// Forgets an exiting thread's stack (called from `sched_process_exit`).
#[inline(always)]
pub fn forget_thread(tid: u32) {
    let _ = TOP_STACKS.remove(&tid);
}
