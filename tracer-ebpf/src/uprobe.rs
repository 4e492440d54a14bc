//! Function entry and return: one program each, attached at every probed function. The attach
//! cookie is user space's index of the function and what kind of probe fired (see
//! `tracer_common::cookie`), so the record needs no symbol work and no map lookup here.
//!
//! Go functions never get a uretprobe (it replaces the return address on the stack, and Go's
//! runtime, walking and copying goroutine stacks, aborts on an address that belongs to no
//! function): their entry and each of their `ret` instructions get an ordinary uprobe, which all
//! run `call_entry`; the cookie tells which is which.

use aya_ebpf::{
    EbpfContext as _,
    bindings::pt_regs,
    helpers::{bpf_probe_read_user, generated::bpf_get_attach_cookie},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{CallRecord, GoCallRecord, GoReturnRecord, RecordKind, ReturnRecord, cookie};

use crate::maps::{EVENTS, count_lost, current_ids, header, is_traced, submit_flags};

#[uprobe]
pub fn call_entry(ctx: ProbeContext) -> u32 {
    try_call_entry(&ctx).unwrap_or(0)
}

fn try_call_entry(ctx: &ProbeContext) -> Result<u32, i64> {
    let (tgid, tid) = current_ids();
    if !is_traced(tgid) {
        return Ok(0);
    }
    // SAFETY: `bpf_get_attach_cookie` only reads the program's run context.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    if cookie::is_go(cookie) {
        // SAFETY: a uprobe's context is the user registers, readable in place.
        let regs = unsafe { &*ctx.regs };
        return if cookie::is_go_return(cookie) {
            go_return(regs, cookie, tgid, tid)
        } else {
            go_call(regs, cookie, tgid, tid)
        };
    }
    let Some(mut entry) = EVENTS.reserve::<CallRecord>(0) else {
        count_lost(RecordKind::Call as u32);
        return Ok(0);
    };
    let arg = |n| ctx.arg::<u64>(n).unwrap_or(0);
    entry.write(CallRecord {
        header: header(RecordKind::Call, tgid, tid),
        cookie,
        args: [arg(0), arg(1), arg(2), arg(3), arg(4), arg(5)],
    });
    entry.submit(submit_flags());
    Ok(0)
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
    let Some(mut entry) = EVENTS.reserve::<GoCallRecord>(0) else {
        count_lost(RecordKind::GoCall as u32);
        return Ok(0);
    };
    entry.write(GoCallRecord {
        header: header(RecordKind::GoCall, tgid, tid),
        cookie,
        goid,
        stack_depth,
        args: [regs.rax, regs.rbx, regs.rcx, regs.rdi, regs.rsi, regs.r8, regs.r9, regs.r10, regs.r11],
    });
    entry.submit(submit_flags());
    Ok(0)
}

#[inline(always)]
fn go_return(regs: &pt_regs, cookie: u64, tgid: u32, tid: u32) -> Result<u32, i64> {
    let (goid, stack_depth) = goroutine(regs, cookie);
    let Some(mut entry) = EVENTS.reserve::<GoReturnRecord>(0) else {
        count_lost(RecordKind::GoReturn as u32);
        return Ok(0);
    };
    entry.write(GoReturnRecord {
        header: header(RecordKind::GoReturn, tgid, tid),
        cookie,
        goid,
        stack_depth,
        retval: regs.rax,
    });
    entry.submit(submit_flags());
    Ok(0)
}

#[uretprobe]
pub fn call_return(ctx: RetProbeContext) -> u32 {
    try_call_return(&ctx).unwrap_or(0)
}

fn try_call_return(ctx: &RetProbeContext) -> Result<u32, i64> {
    let (tgid, tid) = current_ids();
    if !is_traced(tgid) {
        return Ok(0);
    }
    let Some(mut entry) = EVENTS.reserve::<ReturnRecord>(0) else {
        count_lost(RecordKind::Return as u32);
        return Ok(0);
    };
    // SAFETY: as in `try_call_entry`.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    entry.write(ReturnRecord { header: header(RecordKind::Return, tgid, tid), cookie, retval: ctx.ret::<u64>() });
    entry.submit(submit_flags());
    Ok(0)
}
