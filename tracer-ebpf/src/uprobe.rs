//! Function entry and return: one program each, attached at every probed function. The attach
//! cookie is user space's index of the function, so the record needs no symbol work here.

use aya_ebpf::{
    EbpfContext as _,
    helpers::generated::bpf_get_attach_cookie,
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{CallRecord, RecordKind, ReturnRecord};

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
    let Some(mut entry) = EVENTS.reserve::<CallRecord>(0) else {
        count_lost(RecordKind::Call as u32);
        return Ok(0);
    };
    // SAFETY: `bpf_get_attach_cookie` only reads the program's run context.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let arg = |n| ctx.arg::<u64>(n).unwrap_or(0);
    entry.write(CallRecord {
        header: header(RecordKind::Call, tgid, tid),
        cookie,
        args: [arg(0), arg(1), arg(2), arg(3), arg(4), arg(5)],
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
