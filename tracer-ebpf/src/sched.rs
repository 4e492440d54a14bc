//! Process lifecycle: raw tracepoints on fork, exec and exit. Raw tracepoints receive the
//! tracepoint's `TP_PROTO` arguments (task pointers), whose fields are read at offsets that user
//! space took from the running kernel's BTF; they also need no tracefs.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_probe_read_kernel_str_bytes, generated::bpf_send_signal},
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use tracer_common::{ExecRecord, ExecResolve, ExitRecord, ForkRecord, InodeKey, LostSlot, RecordKind};

use crate::maps::{
    RESOLVED_IMAGES, TARGET_INODES, THREAD_COUNTS, TRACED_PIDS, add_threads, config, count_lost, current_ids, emit,
    enabled, file_key, header, is_traced, read_kernel, reserve, submit_flags, untrace,
};

/// `sched_process_fork(struct task_struct *parent, struct task_struct *child)`, run by the parent.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn sched_fork(ctx: RawTracePointContext) -> i32 {
    try_sched_fork(&ctx).unwrap_or(0)
}

fn try_sched_fork(ctx: &RawTracePointContext) -> Result<i32, i64> {
    let (tgid, tid) = current_ids();
    if !is_traced(tgid) {
        return Ok(0);
    }
    let cfg = config();
    let child: *const u8 = ctx.arg(1);
    let child_pid: i32 = read_kernel(child, cfg.offsets.task_tgid)?;
    let child_tid: i32 = read_kernel(child, cfg.offsets.task_pid)?;
    let (child_pid, child_tid) = (child_pid as u32, child_tid as u32);
    let is_thread = child_pid == tgid;
    let mut followed = 0;
    if is_thread {
        add_threads(tgid, 1);
    } else if cfg.follow_children != 0 {
        // Added before the child first runs, so nothing it does escapes the trace.
        if TRACED_PIDS.insert(child_pid, 1, 0).is_ok() {
            followed = 1;
            let _ = THREAD_COUNTS.insert(child_pid, 1, 0);
        } else {
            count_lost(LostSlot::UntrackedChild);
        }
    }
    if !enabled(RecordKind::Fork) {
        return Ok(0);
    }
    emit(
        RecordKind::Fork,
        ForkRecord {
            header: header(RecordKind::Fork, tgid, tid),
            child_pid,
            child_tid,
            is_thread: is_thread as u32,
            followed,
            // The child's name is its parent's until it execs.
            comm: bpf_get_current_comm().unwrap_or_default(),
        },
    );
    Ok(0)
}

/// `sched_process_exec(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)`, run by
/// the task that exec'd, after its new image is in place.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn sched_exec(ctx: RawTracePointContext) -> i32 {
    try_sched_exec(&ctx).unwrap_or(0)
}

fn try_sched_exec(ctx: &RawTracePointContext) -> Result<i32, i64> {
    /// `SIGSTOP` on x86-64 (and every Linux architecture but alpha, mips, parisc and sparc).
    const SIGSTOP: u32 = 19;
    let (tgid, tid) = current_ids();
    let cfg = config();
    let bprm: *const u8 = ctx.arg(2);
    if !is_traced(tgid) {
        if cfg.has_target_inodes == 0 || !execs_target_binary(bprm, &cfg)? {
            return Ok(0);
        }
        if TRACED_PIDS.insert(tgid, 1, 0).is_err() {
            count_lost(LostSlot::UntrackedChild);
            return Ok(0);
        }
        // Exec leaves one thread.
        let _ = THREAD_COUNTS.insert(tgid, 1, 0);
    }
    // With function patterns, an image user space has not resolved them against yet stops the
    // process until it has (the probes are then in place before the image's first instruction).
    let image = if cfg.resolve_execs != 0 { image_key(bprm, cfg)? } else { InodeKey { dev: 0, ino: 0 } };
    let resolve = cfg.resolve_execs != 0 && RESOLVED_IMAGES.get_ptr(&image).is_none();
    if !resolve && !enabled(RecordKind::Exec) {
        return Ok(0);
    }
    let old_tid: u64 = ctx.arg(1);
    let filename: *const u8 = read_kernel(bprm, cfg.offsets.bprm_filename)?;
    // A process under ptrace (gdb, strace) is not stopped: its debugger would see the stop, and
    // gdb stops there. User space resolves its image as it runs.
    // (One whose flag cannot be read is taken for debugged: running on is the safe side.)
    let debugged = resolve && {
        let task: *const u8 = ctx.arg(0);
        read_kernel::<u32>(task, cfg.offsets.task_ptrace).map_or(true, |ptrace| ptrace != 0)
    };
    // Reserved before the process is stopped: one whose record user space will never see must
    // not be stopped (it would never be continued).
    let Some(mut entry) = reserve::<ExecRecord>(RecordKind::Exec) else {
        return Ok(0);
    };
    // Stamped before the stop, so that the stop's own signal records come after the exec in time,
    // the order user space hands records over in (`record/drain.rs`), and is told of the stop by
    // the exec before it meets them.
    let stamped = header(RecordKind::Exec, tgid, tid);
    // The signal is taken on the way back to user space, before the new image runs. A process
    // that could not be sent it runs on, resolved as it runs.
    // SAFETY: a helper without memory arguments; it signals the current process.
    let stop = || unsafe { bpf_send_signal(SIGSTOP) } == 0;
    let outcome = match (resolve, debugged) {
        (false, _) => ExecResolve::No,
        (true, false) if stop() => ExecResolve::Stopped,
        (true, _) => ExecResolve::Running,
    };
    // Fill in place: the record is larger than is wise to build on the 512-byte stack.
    let record = entry.as_mut_ptr();
    // SAFETY: `record` points at reserved ring-buffer memory of the right size and alignment; the
    // fields are written before submit, and the filename buffer is filled by the kernel helper.
    unsafe {
        (*record).header = stamped;
        (*record).old_tid = old_tid as u32;
        (*record).resolve = outcome as u32;
        (*record).dev = image.dev;
        (*record).ino = image.ino;
        (*record).comm = bpf_get_current_comm().unwrap_or_default();
        let name = &mut (*record).filename;
        if bpf_probe_read_kernel_str_bytes(filename, name).is_err() {
            name[0] = 0;
        }
    }
    entry.submit(submit_flags());
    Ok(0)
}

/// The (device, inode) of the file being exec'd: for a `#!` script, its interpreter's (binfmt_script
/// has replaced `bprm->file` by then).
#[inline(always)]
fn image_key(bprm: *const u8, cfg: &tracer_common::Config) -> Result<InodeKey, i64> {
    file_key(read_kernel(bprm, cfg.offsets.bprm_file)?, cfg)
}

/// Whether the file being exec'd is one of the `--binary` targets (same device and inode).
#[inline(always)]
fn execs_target_binary(bprm: *const u8, cfg: &tracer_common::Config) -> Result<bool, i64> {
    let key = image_key(bprm, cfg)?;
    Ok(TARGET_INODES.get_ptr(&key).is_some())
}

/// `sched_process_exit(struct task_struct *p, bool group_dead)`, run by the exiting thread: the
/// tracepoint as kernels since 6.16 have it.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_exit(ctx: RawTracePointContext) -> i32 {
    try_sched_exit(&ctx, true).unwrap_or(0)
}

/// `sched_process_exit(struct task_struct *p)`: the tracepoint of older kernels (6.1, 6.12), whose
/// `group_dead` is derived from the process's thread count (see `THREAD_COUNTS`). A separate program because a raw tracepoint
/// program that reads an argument the tracepoint lacks is refused at attach.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_exit_1arg(ctx: RawTracePointContext) -> i32 {
    try_sched_exit(&ctx, false).unwrap_or(0)
}

/// The status a process's parent will see (`wait_task_zombie`): the group's exit code when it
/// ended by `exit_group` or a fatal signal (`SIGNAL_GROUP_EXIT`), else its last thread's own.
/// Read here because the last thread to exit need not be the one that called `exit_group`.
#[inline(always)]
fn process_status(task: *const u8) -> Result<i32, i64> {
    /// `SIGNAL_GROUP_EXIT` in `include/linux/sched/signal.h`, unchanged since 2.6.
    const SIGNAL_GROUP_EXIT: u32 = 0x4;
    let o = &config().offsets;
    let signal: *const u8 = read_kernel(task, o.task_signal)?;
    let flags: u32 = read_kernel(signal, o.signal_flags)?;
    if flags & SIGNAL_GROUP_EXIT != 0 {
        read_kernel(signal, o.signal_group_exit_code)
    } else {
        read_kernel(task, o.task_exit_code)
    }
}

fn try_sched_exit(ctx: &RawTracePointContext, has_group_dead: bool) -> Result<i32, i64> {
    let (tgid, tid) = current_ids();
    if !is_traced(tgid) {
        return Ok(0);
    }
    let task: *const u8 = ctx.arg(0);
    // Without the argument, the exit that takes the process's thread count to 0 is its last.
    let group_dead =
        if has_group_dead { (ctx.arg::<u64>(1) & 0xff) != 0 } else { add_threads(tgid, u64::MAX) == Some(1) };
    crate::top::forget_thread(tid);
    crate::gate::forget_thread(tid);
    if enabled(RecordKind::Exit) {
        let exit_code =
            if group_dead { process_status(task) } else { read_kernel(task, config().offsets.task_exit_code) };
        let exit_code: i32 = exit_code.unwrap_or(0);
        emit(
            RecordKind::Exit,
            ExitRecord {
                header: header(RecordKind::Exit, tgid, tid),
                exit_code: exit_code as u32,
                group_dead: group_dead as u32,
                comm: bpf_get_current_comm().unwrap_or_default(),
            },
        );
    }
    if group_dead {
        untrace(tgid);
    }
    Ok(0)
}
