//! Signals sent to or by traced processes, and their delivery: raw tracepoints on
//! `signal_generate` and `signal_deliver`.

use aya_ebpf::{macros::raw_tracepoint, programs::RawTracePointContext};
use tracer_common::{RecordKind, SignalRecord};

use crate::maps::{config, current_ids, emit, enabled, header, is_traced, read_kernel};

/// `SEND_SIG_NOINFO` and `SEND_SIG_PRIV` are small integers passed instead of a siginfo pointer.
fn siginfo(ptr: u64) -> Option<*const u8> {
    (ptr > 4096).then_some(ptr as *const u8)
}

/// `signal_generate(int sig, struct kernel_siginfo *info, struct task_struct *task, int group,
/// int result)`, run by the sender.
#[raw_tracepoint(tracepoint = "signal_generate")]
pub fn signal_generate(ctx: RawTracePointContext) -> i32 {
    try_generate(&ctx).unwrap_or(0)
}

fn try_generate(ctx: &RawTracePointContext) -> Result<i32, i64> {
    if !enabled(RecordKind::Signal) {
        return Ok(0);
    }
    let (tgid, tid) = current_ids();
    let o = &config().offsets;
    let task: *const u8 = ctx.arg(2);
    let target_pid: i32 = read_kernel(task, o.task_tgid)?;
    let target_tid: i32 = read_kernel(task, o.task_pid)?;
    if !is_traced(tgid) && !is_traced(target_pid as u32) {
        return Ok(0);
    }
    let code = siginfo(ctx.arg(1)).map_or(0, |info| read_kernel::<i32>(info, o.siginfo_code).unwrap_or(0));
    emit(
        RecordKind::Signal,
        SignalRecord {
            header: header(RecordKind::Signal, tgid, tid),
            signal: ctx.arg::<u64>(0) as u32,
            delivered: 0,
            target_pid: target_pid as u32,
            target_tid: target_tid as u32,
            code,
            si_pid: 0,
            group: ctx.arg::<u64>(3) as u32,
            result: ctx.arg::<u64>(4) as u32,
        },
    );
    Ok(0)
}

/// `signal_deliver(int sig, struct kernel_siginfo *info, struct k_sigaction *ka)`, run by the
/// thread that takes the signal.
#[raw_tracepoint(tracepoint = "signal_deliver")]
pub fn signal_deliver(ctx: RawTracePointContext) -> i32 {
    try_deliver(&ctx).unwrap_or(0)
}

fn try_deliver(ctx: &RawTracePointContext) -> Result<i32, i64> {
    let (tgid, tid) = current_ids();
    if !is_traced(tgid) || !enabled(RecordKind::Signal) {
        return Ok(0);
    }
    let o = &config().offsets;
    let (code, si_pid) = match siginfo(ctx.arg(1)) {
        Some(info) => (
            read_kernel::<i32>(info, o.siginfo_code).unwrap_or(0),
            read_kernel::<i32>(info, o.siginfo_pid).unwrap_or(0) as u32,
        ),
        None => (0, 0),
    };
    emit(
        RecordKind::Signal,
        SignalRecord {
            header: header(RecordKind::Signal, tgid, tid),
            signal: ctx.arg::<u64>(0) as u32,
            delivered: 1,
            target_pid: tgid,
            target_tid: tid,
            code,
            si_pid,
            group: 0,
            result: 0,
        },
    );
    Ok(0)
}
