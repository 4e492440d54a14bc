//! USDT probes (`.note.stapsdt`): a program's own events, and any statically defined probe.
//!
//! Both programs are attached by user space as uprobe-multi links whose cookie indexes
//! `USDT_SPECS`: where each argument of that probe lives (a constant, a register, or memory at a
//! register plus an offset), prepared from the probe's argument spec. The links also carry the
//! probes' semaphore offsets, so the kernel bumps each semaphore while we are attached and the
//! program skips its formatting when nobody listens.
//!
//! - `usdt_event`: the `tracer_events:event` probe of the `tracer-events` crate and its C header,
//!   fired with a pointer to one encoded payload and its length. The payload is copied from the
//!   program's memory into the ring buffer after the record, at most `USER_EVENT_PAYLOAD_MAX`
//!   bytes (a longer one is cut and flagged), through a per-CPU scratch record so that the ring
//!   holds only the bytes there are.
//! - `usdt_probe`: every other probe: up to `USDT_MAX_ARGS` arguments, evaluated and
//!   sign- or zero-extended as their specs say. Breakpoints (`-B FILE:LINE`) use it too: their
//!   spec's `record_kind` is `Break` and their arguments are the locals DWARF locates there; the
//!   strings their `char *` and `char[N]` locals point at follow the record, read as a call's
//!   string parameters are (`strings`), by the sleepable `usdt_probe_s` where the kernel has it.

use core::ffi::c_void;

use aya_ebpf::{
    EbpfContext as _,
    bindings::pt_regs,
    helpers::generated::{bpf_get_attach_cookie, bpf_loop, bpf_probe_read_kernel, bpf_probe_read_user},
    macros::{map, uprobe},
    maps::{Array, PerCpuArray},
    programs::ProbeContext,
};
use tracer_common::{
    RecordKind, USDT_MAX_ARGS, USDT_NO_REGISTER, USER_EVENT_PAYLOAD_MAX, UsdtArgKind, UsdtArgSpec, UsdtRecord,
    UsdtSpec, UserEventRecord, user_event_flags,
};

use crate::{
    maps::{current_ids, emit, emit_bytes, enabled, header, is_traced},
    strings::with_strings,
};

/// Argument specs by attach cookie. User space sizes it to the probes it attaches.
#[map]
pub static USDT_SPECS: Array<UsdtSpec> = Array::with_max_entries(1, 0);

/// A program event as it goes into the ring buffer: the record, then the payload.
#[repr(C)]
pub struct UserEventBuffer {
    record: UserEventRecord,
    payload: [u8; USER_EVENT_PAYLOAD_MAX],
}

/// One event being assembled per CPU: 4 KiB is too much for the BPF stack.
#[map]
pub static USER_EVENT_SCRATCH: PerCpuArray<UserEventBuffer> = PerCpuArray::with_max_entries(1, 0);

/// The probe's cookie (its index in user space's table and in `USDT_SPECS`).
#[inline(always)]
fn cookie(ctx: &ProbeContext) -> u64 {
    // SAFETY: `bpf_get_attach_cookie` only reads the program's run context.
    unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }
}

/// A register of the probed thread, at a `struct pt_regs` offset.
#[inline(always)]
fn register(ctx: &ProbeContext, offset: u32) -> Option<u64> {
    if offset as usize > size_of::<pt_regs>() - size_of::<u64>() {
        return None;
    }
    let mut value: u64 = 0;
    // SAFETY: `ctx.regs` points to the probed thread's saved registers; the offset stays inside
    // them (checked above), and `bpf_probe_read_kernel` checks the address anyway.
    let ret = unsafe {
        bpf_probe_read_kernel(
            (&raw mut value).cast(),
            size_of::<u64>() as u32,
            ctx.regs.cast::<u8>().wrapping_add(offset as usize).cast(),
        )
    };
    (ret == 0).then_some(value)
}

/// Evaluates one argument: its low `size` bytes, extended to 64 bits by its sign when signed.
#[inline(always)]
fn evaluate(ctx: &ProbeContext, spec: &UsdtArgSpec) -> Option<u64> {
    let size = spec.size;
    if size == 0 || size > 8 {
        return None;
    }
    let raw = match UsdtArgKind::from_u32(spec.kind) {
        Some(UsdtArgKind::Const) => spec.value as u64,
        Some(UsdtArgKind::Register) => register(ctx, spec.reg)?,
        Some(UsdtArgKind::Memory) => {
            let mut address = register(ctx, spec.reg)?.wrapping_add(spec.value as u64);
            if spec.index_reg != USDT_NO_REGISTER {
                address = address.wrapping_add(register(ctx, spec.index_reg)?.wrapping_mul(spec.scale as u64));
            }
            let mut value: u64 = 0;
            // SAFETY: reads `size` (1..=8) bytes of the probed process's memory into `value`;
            // `bpf_probe_read_user` checks the address, a bad one is an error, not a fault.
            let ret = unsafe { bpf_probe_read_user((&raw mut value).cast(), size, address as *const _) };
            if ret != 0 {
                return None;
            }
            // Little-endian: the `size` bytes read are the low bytes of `value`.
            value
        }
        Some(UsdtArgKind::Address) => register(ctx, spec.reg)?.wrapping_add(spec.value as u64),
        Some(UsdtArgKind::Unsupported) | None => return None,
    };
    let shift = 64 - 8 * size;
    Some(if spec.signed != 0 {
        ((raw.wrapping_shl(shift) as i64).wrapping_shr(shift)) as u64
    } else {
        raw.wrapping_shl(shift).wrapping_shr(shift)
    })
}

#[uprobe]
pub fn usdt_event(ctx: ProbeContext) -> u32 {
    try_usdt_event(&ctx).unwrap_or(0)
}

fn try_usdt_event(ctx: &ProbeContext) -> Result<u32, i64> {
    let (tgid, tid) = current_ids();
    if !enabled(RecordKind::UserEvent) || !is_traced(tgid) {
        return Ok(0);
    }
    let header = header(RecordKind::UserEvent, tgid, tid);
    let cookie = cookie(ctx);
    let Some(buffer) = USER_EVENT_SCRATCH.get_ptr_mut(0) else { return Ok(0) };
    // SAFETY: this CPU's scratch record; programs do not migrate while they run.
    let buffer = unsafe { &mut *buffer };
    let args = USDT_SPECS
        .get(cookie as u32)
        .filter(|spec| spec.arg_count >= 2)
        .and_then(|spec| Some((evaluate(ctx, &spec.args[0])?, evaluate(ctx, &spec.args[1])?)));
    let (mut flags, mut copied, mut payload_len) = (0, 0u32, 0u64);
    match args {
        Some((address, len)) => {
            payload_len = len;
            copied = if len > USER_EVENT_PAYLOAD_MAX as u64 {
                flags |= user_event_flags::TRUNCATED;
                USER_EVENT_PAYLOAD_MAX as u32
            } else {
                len as u32
            };
            // SAFETY: copies `copied` (at most the buffer's size) bytes of the probed process's
            // memory; `bpf_probe_read_user` checks the address.
            let ret = unsafe { bpf_probe_read_user(buffer.payload.as_mut_ptr().cast(), copied, address as *const _) };
            if ret != 0 {
                flags |= user_event_flags::READ_FAILED;
                copied = 0;
            }
        }
        None => flags |= user_event_flags::READ_FAILED,
    }
    buffer.record = UserEventRecord { header, cookie, payload_len, copied_len: copied, flags };
    let size = size_of::<UserEventRecord>() as u64 + (copied as u64 & (USER_EVENT_PAYLOAD_MAX as u64 * 2 - 1));
    let size = if size > size_of::<UserEventBuffer>() as u64 { size_of::<UserEventBuffer>() as u64 } else { size };
    // `buffer` holds at least `size` bytes (bounded just above).
    emit_bytes(RecordKind::UserEvent, (buffer as *const UserEventBuffer).cast::<u8>(), size);
    Ok(0)
}

#[uprobe]
pub fn usdt_probe(ctx: ProbeContext) -> u32 {
    try_usdt_probe::<false>(&ctx).unwrap_or(0)
}

/// `usdt_probe` for breakpoints that read strings, where sleepable uprobes exist: a string's page
/// the target has not touched yet is faulted in (see `strings`).
#[uprobe(sleepable)]
pub fn usdt_probe_s(ctx: ProbeContext) -> u32 {
    try_usdt_probe::<true>(&ctx).unwrap_or(0)
}

fn try_usdt_probe<const SLEEPABLE: bool>(ctx: &ProbeContext) -> Result<u32, i64> {
    let (tgid, tid) = current_ids();
    let cookie = cookie(ctx);
    let spec = USDT_SPECS.get(cookie as u32);
    // A breakpoint is a USDT probe whose arguments are the locals in scope: its spec says so.
    let kind = match spec {
        Some(spec) if spec.record_kind == RecordKind::Break as u32 => RecordKind::Break,
        _ => RecordKind::Usdt,
    };
    if !enabled(kind) || !is_traced(tgid) {
        return Ok(0);
    }
    let header = header(kind, tgid, tid);
    let mut record = UsdtRecord { header, cookie, arg_count: 0, failed_args: 0, args: [0; USDT_MAX_ARGS] };
    if let Some(spec) = spec {
        let count = if spec.arg_count as usize > USDT_MAX_ARGS { USDT_MAX_ARGS as u32 } else { spec.arg_count };
        record.arg_count = count;
        // A `bpf_loop` callback is verified once; an unrolled loop over twelve arguments, each
        // with its branches, is more than the verifier explores.
        let mut each = Arguments { regs: ctx.regs, spec, record: &mut record };
        // SAFETY: the callback gets `each` back as its context, valid for the whole call.
        unsafe { bpf_loop(count, evaluate_one as *mut c_void, (&raw mut each).cast(), 0) };
        // A breakpoint's `char *` and `char[N]` locals: the strings at the addresses evaluated.
        if spec.strings[1] > 0 {
            return with_strings::<_, USDT_MAX_ARGS, SLEEPABLE>(record, kind, Some(&spec.strings), &record.args, false);
        }
    }
    emit(kind, record);
    Ok(0)
}

/// The state `evaluate_one` works on. Passed by reference: a BPF function takes at most five
/// arguments.
struct Arguments<'a> {
    regs: *mut pt_regs,
    spec: &'a UsdtSpec,
    record: &'a mut UsdtRecord,
}

/// `bpf_loop` callback: evaluates argument `index` into the record, or marks it failed.
extern "C" fn evaluate_one(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `Arguments` that `try_usdt_probe` passed to `bpf_loop`.
    let each = unsafe { &mut *ctx.cast::<Arguments<'_>>() };
    let i = index as usize;
    if i >= USDT_MAX_ARGS {
        return 1;
    }
    match evaluate(&ProbeContext { regs: each.regs }, &each.spec.args[i]) {
        Some(value) => each.record.args[i] = value,
        None => each.record.failed_args |= 1 << i,
    }
    0
}
