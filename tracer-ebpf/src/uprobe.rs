//! Function entry and return: one program each, attached at every probed function. The attach
//! cookie is user space's index of the function and what kind of probe fired (see
//! `tracer_common::cookie`), so the record needs no symbol work and no map lookup here.
//!
//! Go functions never get a uretprobe (it replaces the return address on the stack, and Go's
//! runtime, walking and copying goroutine stacks, aborts on an address that belongs to no
//! function): their entry and each of their `ret` instructions get an ordinary uprobe, which all
//! run `call_entry`; the cookie tells which is which. Native functions of programs that unwind
//! stacks (C++ exceptions, Rust panics, `longjmp`) are probed the same way, on their `ret`
//! instructions and tail-call jumps (`cookie::RET_SITE`): an unwinder that meets a trampoline's
//! address where a return address should be aborts the program.
//!
//! A probe whose cookie has `cookie::STRINGS` also reads its function's string parameters (or
//! string return value) from the target's memory, as its layout in `LAYOUTS` says, and writes
//! them after the record (see `tracer_common::strings`); other probes look nothing up.
//!
//! Those probes run the sleepable variants of the same programs (`call_entry_s`, `call_return_s`)
//! where the kernel has them (Linux 6.0+), which fault in a string's page first (see `strings`).

use aya_ebpf::{
    EbpfContext as _,
    bindings::pt_regs,
    helpers::{bpf_probe_read_user, generated::bpf_get_attach_cookie},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{
    CallRecord, GoCallRecord, GoReturnRecord, ProbeLayoutBytes, RETURN_ADDRESS_BYTES, RecordKind, ReturnRecord, cookie,
};

use crate::maps::{LAYOUTS, current_ids, emit, header, is_traced};
use crate::{filter, gate, strings::with_strings};

#[uprobe]
pub fn call_entry(ctx: ProbeContext) -> u32 {
    try_call_entry::<false>(&ctx).unwrap_or(0)
}

/// `call_entry` for probes whose cookie has `cookie::STRINGS`, where sleepable uprobes exist.
#[uprobe(sleepable)]
pub fn call_entry_s(ctx: ProbeContext) -> u32 {
    try_call_entry::<true>(&ctx).unwrap_or(0)
}

fn try_call_entry<const SLEEPABLE: bool>(ctx: &ProbeContext) -> Result<u32, i64> {
    let (tgid, tid) = current_ids();
    if !is_traced(tgid) {
        return Ok(0);
    }
    // SAFETY: `bpf_get_attach_cookie` only reads the program's run context.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    if cookie::is_go(cookie) {
        // SAFETY: as below.
        let regs = unsafe { &*ctx.regs };
        return if cookie::is_go_return(cookie) {
            go_return(regs, cookie, tgid, tid)
        } else {
            go_call(regs, cookie, tgid, tid)
        };
    }
    // SAFETY: a uprobe's context is the user registers, readable in place.
    let regs = unsafe { &*ctx.regs };
    if cookie::is_ret_site(cookie) {
        return ret_site::<SLEEPABLE, true>(regs, cookie, tgid, tid);
    }
    let gated = cookie::is_gated(cookie);
    if gated && !gate::enter(cookie, tid, regs.rsp) {
        // Not written: nor is its return, which the gate answers for (an `ALSO_EXIT` one now).
        if cookie::is_also_exit(cookie) {
            return ret_site::<SLEEPABLE, false>(regs, cookie::exit_of(cookie), tgid, tid);
        }
        return Ok(0);
    }
    let arg = |n| ctx.arg::<u64>(n).unwrap_or(0);
    let args = [arg(0), arg(1), arg(2), arg(3), arg(4), arg(5)];
    if cookie::is_filtered(cookie) {
        let regs = [args[0], args[1], args[2], args[3], args[4], args[5], regs.rax];
        if !filter::passes(cookie::function(cookie), &regs, tid, regs_sp(ctx), !gated) {
            // Refused: nothing written, and its return (an `ALSO_EXIT` one too) is dropped.
            return Ok(0);
        }
    }
    let record = CallRecord { header: header(RecordKind::Call, tgid, tid), cookie, args, sp: regs.rsp };
    if cookie::is_held(cookie) {
        if cookie::is_also_exit(cookie) {
            // Its entry is its exit (a tail-call stub): it lasts no time and its return value is
            // not known, so it is refused here (one program holding both paths is too large for
            // 6.1's verifier).
            filter::refuse_now(cookie::function(cookie), !cookie::is_filtered(cookie) && !gated);
            if gated {
                gate::leave(cookie, tid, regs.rsp, false);
            }
            return Ok(0);
        }
        // Written by the return, if it passes.
        filter::hold(&record, tid, regs.rsp, !cookie::is_filtered(cookie) && !gated);
    } else if cookie::reads_strings(cookie) {
        let regs = [record.args[0], record.args[1], record.args[2], record.args[3], record.args[4], record.args[5], 0];
        with_strings::<_, 7, SLEEPABLE>(record, RecordKind::Call, layout(cookie), &regs, false)?;
    } else {
        emit(RecordKind::Call, record);
    }
    if cookie::is_also_exit(cookie) {
        return ret_site::<SLEEPABLE, false>(regs, cookie::exit_of(cookie), tgid, tid);
    }
    Ok(0)
}

/// The string reads of the function a cookie names (see `strings`).
#[inline(always)]
fn layout(cookie: u64) -> Option<&'static ProbeLayoutBytes> {
    // SAFETY: a map value, read in place; user space never removes a layout while probes run.
    LAYOUTS.get_ptr(cookie::function(cookie)).map(|l| unsafe { &*l })
}

/// The running goroutine's id and how deep `rsp` is in its stack (`g.stack.hi - rsp`). Go keeps
/// `g` in r14 (ABIInternal, Go 1.17+); `g.stack` is its first field (`lo`, `hi`). A read that
/// faults (r14 is not a `g` here) gives zeros, never an error that would lose the record.
#[inline(always)]
fn goroutine(regs: &pt_regs, cookie: u64) -> (u64, u64) {
    let g = regs.r14 as *const u8;
    // SAFETY: `bpf_probe_read_user` checks the address; a bad one is an error, not a fault.
    let goid =
        unsafe { bpf_probe_read_user(g.wrapping_add(cookie::goid_offset(cookie) as usize).cast::<u64>()) }.unwrap_or(0);
    // SAFETY: as above.
    let stack_hi = unsafe { bpf_probe_read_user(g.wrapping_add(8).cast::<u64>()) }.unwrap_or(0);
    (goid, stack_hi.wrapping_sub(regs.rsp))
}

#[inline(always)]
fn go_call(regs: &pt_regs, cookie: u64, tgid: u32, tid: u32) -> Result<u32, i64> {
    let (goid, stack_depth) = goroutine(regs, cookie);
    emit(
        RecordKind::GoCall,
        GoCallRecord {
            header: header(RecordKind::GoCall, tgid, tid),
            cookie,
            goid,
            stack_depth,
            args: [regs.rax, regs.rbx, regs.rcx, regs.rdi, regs.rsi, regs.r8, regs.r9, regs.r10, regs.r11],
        },
    );
    Ok(0)
}

#[inline(always)]
fn go_return(regs: &pt_regs, cookie: u64, tgid: u32, tid: u32) -> Result<u32, i64> {
    let (goid, stack_depth) = goroutine(regs, cookie);
    emit(
        RecordKind::GoReturn,
        GoReturnRecord { header: header(RecordKind::GoReturn, tgid, tid), cookie, goid, stack_depth, retval: regs.rax },
    );
    Ok(0)
}

/// A native function's return, probed on its `ret` instruction (or a tail call's jump): the
/// record a uretprobe would write, with rsp, which still points at the return address the entry
/// saw.
#[inline(always)]
/// `HELD`: the cookie may have `cookie::HOLD` (not so for an `ALSO_EXIT` entry's exit).
fn ret_site<const SLEEPABLE: bool, const HELD: bool>(
    regs: &pt_regs,
    cookie: u64,
    tgid: u32,
    tid: u32,
) -> Result<u32, i64> {
    if cookie::is_conditional(cookie) && !cookie::condition_holds(cookie::operand(cookie), regs.eflags) {
        return Ok(0);
    }
    // At a `ret` (or a tail call's jump) rsp is the entry's.
    if cookie::is_gated(cookie) && !gate::leave(cookie, tid, regs.rsp, cookie::is_indirect(cookie)) {
        return Ok(0);
    }
    if cookie::is_filtered(cookie) && filter::refused(tid, regs.rsp) {
        return Ok(0);
    }
    let mut retval = regs.rax;
    if cookie::is_indirect(cookie) {
        // Where `jmp reg` goes, from the function's start: user space knows the function's extent
        // and drops the jumps that stay inside (a switch's jump table).
        let start = regs.rip.wrapping_sub(cookie::site(cookie));
        retval = register(regs, cookie::operand(cookie)).wrapping_sub(start);
    }
    // At a tail call the value in rax is not the function's: the callee has not run yet (a
    // `ret-if` on it sees rax as it is).
    if HELD && cookie::is_held(cookie) && !release_entry(cookie, tid, regs.rsp, retval) {
        return Ok(0);
    }
    let record =
        ReturnRecord { header: header(RecordKind::Return, tgid, tid), cookie, retval, rdx: regs.rdx, sp: regs.rsp };
    submit_return::<SLEEPABLE>(record, cookie::reads_strings(cookie) && !cookie::is_tail_call(cookie))
}

/// At the return of a held call (`cookie::HOLD`): whether it passes, its entry then written
/// (with its strings, read now through the entry's pointers, without faulting pages in: the
/// sleepable variant made the entry program too large for 6.1's verifier).
#[inline(always)]
fn release_entry(cookie: u64, tid: u32, entry_sp: u64, retval: u64) -> bool {
    let Some(record) = filter::release(cookie::function(cookie), tid, entry_sp, retval) else {
        return false;
    };
    if cookie::reads_strings(record.cookie) {
        let a = record.args;
        let regs = [a[0], a[1], a[2], a[3], a[4], a[5], 0];
        let _ = with_strings::<_, 7, false>(record, RecordKind::Call, layout(record.cookie), &regs, false);
    } else {
        emit(RecordKind::Call, record);
    }
    true
}

/// Writes a return record, with the return value's string when `strings` (its layout in the
/// cookie's function).
#[inline(always)]
fn submit_return<const SLEEPABLE: bool>(record: ReturnRecord, strings: bool) -> Result<u32, i64> {
    if strings {
        let regs = [0, 0, record.rdx, 0, 0, 0, record.retval];
        return with_strings::<_, 7, SLEEPABLE>(record, RecordKind::Return, layout(record.cookie), &regs, true);
    }
    emit(RecordKind::Return, record);
    Ok(0)
}

/// rsp at a probe.
#[inline(always)]
fn regs_sp(ctx: &ProbeContext) -> u64 {
    // SAFETY: a uprobe's context is the user registers, readable in place.
    unsafe { (*ctx.regs).rsp }
}

/// A general register by its x86 number.
#[inline(always)]
fn register(regs: &pt_regs, n: u8) -> u64 {
    match n {
        0 => regs.rax,
        1 => regs.rcx,
        2 => regs.rdx,
        3 => regs.rbx,
        4 => regs.rsp,
        5 => regs.rbp,
        6 => regs.rsi,
        7 => regs.rdi,
        8 => regs.r8,
        9 => regs.r9,
        10 => regs.r10,
        11 => regs.r11,
        12 => regs.r12,
        13 => regs.r13,
        14 => regs.r14,
        _ => regs.r15,
    }
}

#[uretprobe]
pub fn call_return(ctx: RetProbeContext) -> u32 {
    try_call_return::<false>(&ctx).unwrap_or(0)
}

/// `call_return` for probes whose cookie has `cookie::STRINGS`, where sleepable uprobes exist.
#[uretprobe(sleepable)]
pub fn call_return_s(ctx: RetProbeContext) -> u32 {
    try_call_return::<true>(&ctx).unwrap_or(0)
}

fn try_call_return<const SLEEPABLE: bool>(ctx: &RetProbeContext) -> Result<u32, i64> {
    let (tgid, tid) = current_ids();
    if !is_traced(tgid) {
        return Ok(0);
    }
    // SAFETY: as in `try_call_entry`.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    // SAFETY: a uretprobe's context is the user registers, readable in place.
    let (rdx, sp) = unsafe { ((*ctx.regs).rdx, (*ctx.regs).rsp) };
    // After a uretprobe, rsp is above the entry's by the return address, which `ret` popped.
    let entry_sp = sp.wrapping_sub(RETURN_ADDRESS_BYTES);
    if cookie::is_gated(cookie) && !gate::leave(cookie, tid, entry_sp, false) {
        return Ok(0);
    }
    if cookie::is_filtered(cookie) && filter::refused(tid, entry_sp) {
        return Ok(0);
    }
    let retval = ctx.ret::<u64>();
    if cookie::is_held(cookie) && !release_entry(cookie, tid, entry_sp, retval) {
        return Ok(0);
    }
    let record = ReturnRecord { header: header(RecordKind::Return, tgid, tid), cookie, retval, rdx, sp };
    submit_return::<SLEEPABLE>(record, cookie::reads_strings(cookie))
}
