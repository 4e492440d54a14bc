//! IPC: the syscalls that move bytes through sockets and pipes, for traced processes.
//!
//! Without kprobes, the `sys_enter`/`sys_exit` raw tracepoints are the hooks (the per-syscall
//! tracepoints run BPF only on the CPU their perf event was opened on): at entry, the syscall
//! number is checked first, so other syscalls cost one comparison; the fd is resolved to its
//! kernel object (a socket or a pipe; anything else, regular files included, is ignored) and
//! remembered per thread; at exit, the bytes actually moved are recorded with what both ends need
//! to find each other: TCP sequence numbers, the tracer's byte positions for Unix streams and pipes,
//! addresses, inodes, and the first payload bytes of datagrams. Structure fields are read at
//! offsets user space took from the kernel's BTF.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{
        bpf_get_current_task, bpf_probe_read_kernel_buf, bpf_probe_read_user, bpf_probe_read_user_buf,
        generated::bpf_loop,
    },
    macros::{map, raw_tracepoint},
    maps::{HashMap, LruHashMap, PerCpuArray},
    programs::RawTracePointContext,
};
use tracer_common::{
    CAPTURE_BYTES_MAX, ChannelKind, Direction, HEAD_LEN, IpcRecord, IpcSyscall, KernelOffsets, LostSlot, MAX_MMSG,
    RecordKind, UNIX_PATH_LEN, ipc_flags,
};

use crate::maps::{
    config, count_lost, count_lost_by, current_ids, emit_bytes, enabled, header_at, is_traced, now, read_kernel,
};

const S_IFMT: u32 = 0o170000;
const S_IFIFO: u32 = 0o010000;
const S_IFSOCK: u32 = 0o140000;
const PIPEFS_MAGIC: u64 = 0x5049_5045;
const AF_UNIX: u16 = 1;
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
const SOCK_STREAM: u16 = 1;
const SOCK_DGRAM: u16 = 2;
const SOCK_SEQPACKET: u16 = 5;
const IPPROTO_TCP: u16 = 6;
const IPPROTO_UDP: u16 = 17;
const IPPROTO_UDPLITE: u16 = 136;
/// Receive flags (`recv(2)`).
const MSG_PEEK: u64 = 2;
const MSG_TRUNC: u64 = 0x20;
/// User memory is readable or not by whole pages.
const PAGE_SIZE: u64 = 4096;

/// User-space ABI of x86-64 (`struct msghdr`, `struct mmsghdr`, `struct iovec`).
const MSGHDR_NAME: u64 = 0;
const MSGHDR_IOV: u64 = 16;
const MSGHDR_IOVLEN: u64 = 24;
const IOVEC_SIZE: u64 = 16;
const IOVEC_LEN: u64 = 8;
const MMSGHDR_SIZE: u64 = 64;
const MMSGHDR_LEN: u64 = 56;

/// Pipe ring slots and socket-queue buffers summed to learn what a stream held when the tracer
/// first saw it; a fuller stream's positions are unknown (its transfers are never linked).
const MAX_PIPE_SLOTS: u32 = 16;
const MAX_QUEUED_SKBS: u32 = 64;
/// `iovec`s of a `recvmsg`/`recvmmsg` summed to learn its buffer's size (`MSG_TRUNC`); a message
/// with more has a size unknown, and is never marked truncated.
const MAX_IOVS: u64 = 8;

/// A traced IPC syscall between its entry and its exit.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct InFlight {
    nr: u32,
    channel: u32,
    /// The syscall's first argument: the file descriptor.
    fd: u64,
    /// Its second: the buffer, the `iovec` array, the `msghdr` or the `mmsghdr` array.
    data: u64,
    /// Its fifth: `sendto`'s and `recvfrom`'s `struct sockaddr`.
    addr: u64,
    entry_ts: u64,
    /// The `struct sock` (sockets) or `struct pipe_inode_info` (pipes).
    object: u64,
    /// Key of this transfer's stream in `STREAMS` (0: none).
    stream: u64,
    /// The pipe's inode number.
    ino: u64,
    /// A receive's flags (`MSG_*`: `recvfrom`'s and `recvmmsg`'s fourth argument, `recvmsg`'s third).
    flags: u64,
    /// `recvfrom`'s third argument: its buffer's size.
    len: u64,
}

/// Bytes that went into and out of one stream (a pipe, or the receiving side of a Unix stream
/// socket) since the tracer first saw it, counting what it held then as written.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct StreamPos {
    written: u64,
    read: u64,
    /// 0 when what the stream held at first sight could not be counted.
    valid: u64,
}

/// A transfer's record as it goes into the ring buffer: the record, then its captured payload.
#[repr(C)]
pub struct IpcBuffer {
    record: IpcRecord,
    payload: [u8; CAPTURE_BYTES_MAX],
}

/// One record assembled per CPU (4 KiB of payload is too much for the BPF stack), then copied
/// into the ring buffer at its actual length.
#[map]
pub static IPC_SCRATCH: PerCpuArray<IpcBuffer> = PerCpuArray::with_max_entries(1, 0);

#[map]
pub static INFLIGHT: HashMap<u32, InFlight> = HashMap::with_max_entries(16384, 0);

/// `--debug-kernel`: the first payload read that failed during this CPU's current syscall exit,
/// logged once the exit's records are out (see `log_pending_unreadable`).
#[map]
static UNREADABLE: PerCpuArray<Unreadable> = PerCpuArray::with_max_entries(1, 0);

/// A failed payload read waiting to be logged (`pending` non-zero).
#[repr(C)]
#[derive(Clone, Copy)]
struct Unreadable {
    pending: u64,
    tgid: u64,
    fd: u64,
    buf: u64,
    len: u64,
    err: i64,
}

#[map]
pub static STREAMS: LruHashMap<u64, StreamPos> = LruHashMap::with_max_entries(65536, 0);

fn read_user<T>(addr: u64) -> Result<T, i64> {
    // SAFETY: `bpf_probe_read_user` checks the address; a bad pointer is an error, not a fault.
    unsafe { bpf_probe_read_user(addr as *const T) }.map_err(|e| e as i64)
}

/// The `struct file` behind `fd` in the current task.
#[inline(always)]
fn fd_file(fd: i32, o: &KernelOffsets) -> Result<*const u8, i64> {
    if fd < 0 {
        return Err(-1);
    }
    // SAFETY: a helper without preconditions.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let files: *const u8 = read_kernel(task, o.task_files)?;
    let fdt: *const u8 = read_kernel(files, o.files_fdt)?;
    let max_fds: u32 = read_kernel(fdt, o.fdtable_max_fds)?;
    if fd as u32 >= max_fds {
        return Err(-1);
    }
    let fds: *const u8 = read_kernel(fdt, o.fdtable_fd)?;
    let file: *const u8 = read_kernel(fds, fd as u32 * 8)?;
    if file.is_null() { Err(-1) } else { Ok(file) }
}

/// Bytes waiting in a pipe.
#[inline(always)]
fn pipe_queued(pipe: *const u8, o: &KernelOffsets) -> Option<u64> {
    let head: u32 = read_kernel(pipe, o.pipe_head).ok()?;
    let tail: u32 = read_kernel(pipe, o.pipe_tail).ok()?;
    let ring_size: u32 = read_kernel(pipe, o.pipe_ring_size).ok()?;
    let bufs: *const u8 = read_kernel(pipe, o.pipe_bufs).ok()?;
    let used = head.wrapping_sub(tail);
    if used > MAX_PIPE_SLOTS || ring_size == 0 {
        return None;
    }
    let mut queued = 0u64;
    for i in 0..MAX_PIPE_SLOTS {
        if i >= used {
            break;
        }
        let slot = tail.wrapping_add(i) & (ring_size - 1);
        let len: u32 = read_kernel(bufs, slot * o.pipe_buffer_size + o.pipe_buffer_len).ok()?;
        queued += len as u64;
    }
    Some(queued)
}

/// Bytes waiting in a Unix stream socket's receive queue (what `FIONREAD` would say).
#[inline(always)]
fn unix_queued(sk: *const u8, o: &KernelOffsets) -> Option<u64> {
    let head = sk.wrapping_add(o.sock_receive_queue as usize);
    let mut skb: *const u8 = read_kernel(head, o.skb_next).ok()?;
    let mut queued = 0u64;
    for _ in 0..MAX_QUEUED_SKBS {
        if skb == head {
            return Some(queued);
        }
        let len: u32 = read_kernel(skb, o.skb_len).ok()?;
        let consumed: u32 = read_kernel(skb, o.skb_cb + o.unix_skb_consumed).ok()?;
        queued += len.saturating_sub(consumed) as u64;
        skb = read_kernel(skb, o.skb_next).ok()?;
    }
    None
}

/// Starts counting a stream's bytes, if not counting yet: `queued` (what the stream holds now)
/// runs only then, since it walks the kernel's queue.
#[inline(always)]
fn init_stream(key: u64, queued: impl FnOnce() -> Option<u64>) {
    if STREAMS.get_ptr(key).is_some() {
        return;
    }
    let pos = match queued() {
        Some(q) => StreamPos { written: q, read: 0, valid: 1 },
        None => StreamPos { written: 0, read: 0, valid: 0 },
    };
    // BPF_NOEXIST: the other end may have started it meanwhile; its count stands.
    let _ = STREAMS.insert(key, pos, 1);
}

/// An atomic fetch-and-add (BPF v3 `BPF_ATOMIC | BPF_FETCH`). The BPF target declares no
/// compare-and-swap, so `core` offers no `AtomicU64::fetch_add`; the intrinsic lowers to the same
/// instruction. The ordering must be `SeqCst`: LLVM 22 lowers a relaxed one to the add without
/// fetch and hands back the operand as if it were the old value.
///
/// # Safety
/// `counter` must be valid for reads and writes.
#[inline(always)]
unsafe fn fetch_add(counter: *mut u64, value: u64) -> u64 {
    // SAFETY: forwarded from the caller.
    unsafe { core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::SeqCst }>(counter, value) }
}

/// Adds `bytes` to a stream's count; returns the position of the first of them.
#[inline(always)]
fn advance_stream(key: u64, send: bool, bytes: u64) -> Option<u64> {
    let pos = STREAMS.get_ptr_mut(key)?;
    // SAFETY: a pointer into a map value, valid for this program run; the counters are updated
    // atomically because both ends of a stream may run at once on different CPUs.
    unsafe {
        if (*pos).valid == 0 {
            return None;
        }
        let counter = if send { &raw mut (*pos).written } else { &raw mut (*pos).read };
        Some(fetch_add(counter, bytes))
    }
}

/// `sys_enter(struct pt_regs *regs, long id)`, run by every thread entering any syscall.
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn ipc_sys_enter(ctx: RawTracePointContext) -> i32 {
    try_sys_enter(&ctx).unwrap_or(0)
}

fn try_sys_enter(ctx: &RawTracePointContext) -> Result<i32, i64> {
    let nr: i64 = ctx.arg(1);
    let Some(syscall) = IpcSyscall::from_number(nr as u64) else { return Ok(0) };
    let (tgid, tid) = current_ids();
    if !is_traced(tgid) || !enabled(RecordKind::Ipc) {
        return Ok(0);
    }
    let cfg = config();
    let o = &cfg.offsets;
    // The arguments used, from the user registers (x86-64: di, si, dx, r10, r8, r9).
    let regs: *const u8 = ctx.arg(0);
    let fd: u64 = read_kernel(regs, o.regs_di)?;
    let data: u64 = read_kernel(regs, o.regs_si)?;
    let addr: u64 = read_kernel(regs, o.regs_r8)?;
    let (flags, len): (u64, u64) = match syscall {
        IpcSyscall::Recvfrom => (read_kernel(regs, o.regs_r10)?, read_kernel(regs, o.regs_dx)?),
        IpcSyscall::Recvmmsg => (read_kernel(regs, o.regs_r10)?, 0),
        IpcSyscall::Recvmsg => (read_kernel(regs, o.regs_dx)?, 0),
        _ => (0, 0),
    };
    let file = fd_file(fd as i32, o)?;
    let inode: *const u8 = read_kernel(file, o.file_inode)?;
    let mode: u16 = read_kernel(inode, o.inode_mode)?;
    let ino: u64 = read_kernel(inode, o.inode_ino)?;
    let send = matches!(syscall.direction(), Direction::Send);
    let (channel, object, stream) = match mode as u32 & S_IFMT {
        S_IFIFO => {
            let pipe: *const u8 = read_kernel(file, o.file_private_data)?;
            let sb: *const u8 = read_kernel(inode, o.inode_sb)?;
            let magic: u64 = read_kernel(sb, o.sb_magic)?;
            init_stream(pipe as u64, || pipe_queued(pipe, o));
            let kind = if magic == PIPEFS_MAGIC { ChannelKind::Pipe } else { ChannelKind::Fifo };
            (kind, pipe as u64, pipe as u64)
        }
        S_IFSOCK => {
            let socket: *const u8 = read_kernel(file, o.file_private_data)?;
            let sk: *const u8 = read_kernel(socket, o.socket_sk)?;
            let family: u16 = read_kernel(sk, o.sock_family)?;
            let ty: u16 = read_kernel(sk, o.sock_type)?;
            let protocol: u16 = read_kernel(sk, o.sock_protocol)?;
            match (family, ty) {
                (AF_INET | AF_INET6, SOCK_STREAM) if protocol == IPPROTO_TCP => (ChannelKind::Tcp, sk as u64, 0),
                (AF_INET | AF_INET6, SOCK_DGRAM) if protocol == IPPROTO_UDP || protocol == IPPROTO_UDPLITE => {
                    (ChannelKind::Udp, sk as u64, 0)
                }
                (AF_UNIX, SOCK_STREAM) => {
                    // Positions count the bytes of one direction, kept by its receiving socket.
                    let receiver: *const u8 = if send { read_kernel(sk, o.unix_peer)? } else { sk };
                    if !receiver.is_null() {
                        init_stream(receiver as u64, || unix_queued(receiver, o));
                    }
                    (ChannelKind::UnixStream, sk as u64, receiver as u64)
                }
                (AF_UNIX, SOCK_DGRAM | SOCK_SEQPACKET) => (ChannelKind::UnixDgram, sk as u64, 0),
                _ => return Ok(0),
            }
        }
        // Regular files, terminals, eventfds...: not IPC.
        _ => return Ok(0),
    };
    let state = InFlight {
        nr: nr as u32,
        channel: channel as u32,
        fd,
        data,
        addr,
        entry_ts: now(),
        object,
        stream,
        ino,
        flags,
        len,
    };
    if INFLIGHT.insert(tid, state, 0).is_err() {
        count_lost(LostSlot::IpcInflight);
    }
    Ok(0)
}

/// `sys_exit(struct pt_regs *regs, long ret)`, run by every thread leaving any syscall.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn ipc_sys_exit(ctx: RawTracePointContext) -> i32 {
    try_sys_exit(&ctx).unwrap_or(0)
}

fn try_sys_exit(ctx: &RawTracePointContext) -> Result<i32, i64> {
    let (tgid, tid) = current_ids();
    let Some(state) = INFLIGHT.get_ptr(tid) else { return Ok(0) };
    // SAFETY: a map value of this thread, copied out before it is removed.
    let state = unsafe { *state };
    let _ = INFLIGHT.remove(tid);
    let ret: i64 = ctx.arg(1);
    if ret <= 0 {
        return Ok(0);
    }
    let Some(syscall) = IpcSyscall::from_u32(state.nr) else { return Ok(0) };
    let exit_ts = now();
    match syscall {
        IpcSyscall::Sendmmsg | IpcSyscall::Recvmmsg => {
            // `ret` messages went through; each `mmsghdr` says how many bytes its one moved. A
            // `bpf_loop` callback is verified once, where an unrolled loop would be verified per
            // message (hundreds of milliseconds at load).
            let messages = (ret as u32).min(MAX_MMSG);
            let each = Transfer { state: &state, tgid, tid, exit_ts, bytes: 0, index: 0, msghdr: 0 };
            // SAFETY: the callback gets `each` back as its context, valid for the whole call, and
            // only reads it.
            unsafe {
                bpf_loop(messages, emit_message as *mut c_void, (&raw const each).cast_mut().cast(), 0);
            }
            if ret > MAX_MMSG as i64 {
                count_lost_by(LostSlot::IpcMmsgBeyondLimit, ret as u64 - MAX_MMSG as u64);
            }
        }
        _ => {
            // One call site for every other syscall: the verifier walks `emit` once per call site.
            let msghdr = if matches!(syscall, IpcSyscall::Sendmsg | IpcSyscall::Recvmsg) { state.data } else { 0 };
            emit(&Transfer { state: &state, tgid, tid, exit_ts, bytes: ret as u64, index: 0, msghdr });
        }
    }
    if config().debug != 0 {
        log_pending_unreadable();
    }
    Ok(0)
}

/// `bpf_loop` callback: records message `index` of a `sendmmsg`/`recvmmsg`.
extern "C" fn emit_message(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `Transfer` that `try_sys_exit` passed to `bpf_loop`.
    let t = unsafe { &*ctx.cast::<Transfer>() };
    let hdr = t.state.data + index * MMSGHDR_SIZE;
    let Ok(len) = read_user::<u32>(hdr + MMSGHDR_LEN) else { return 1 };
    // This message's transfer on the callback's own stack: written into the caller's, each call
    // would leave the verifier a new caller state, and Linux 6.7+ verifies a callback until its
    // states repeat.
    emit(&Transfer { bytes: len as u64, index: index as u32, msghdr: hdr, ..*t });
    0
}

/// One transfer to record. Passed by reference: a BPF function takes at most five arguments.
struct Transfer<'a> {
    state: &'a InFlight,
    tgid: u32,
    tid: u32,
    exit_ts: u64,
    bytes: u64,
    /// Which message of a multi-message syscall.
    index: u32,
    /// The `struct msghdr` in user memory (0 for read/write/readv/writev/sendto/recvfrom).
    msghdr: u64,
}

/// The inode number of a socket (its `socket_alloc`'s inode), 0 if unknown.
#[inline(always)]
fn socket_ino(sk: *const u8, o: &KernelOffsets) -> u64 {
    if sk.is_null() {
        return 0;
    }
    let Ok(socket) = read_kernel::<*const u8>(sk, o.sock_socket) else { return 0 };
    if socket.is_null() {
        return 0;
    }
    read_kernel(socket, o.socket_inode + o.inode_ino).unwrap_or(0)
}

/// The first payload buffer: where the data of this syscall (or message) starts in user memory,
/// and how many of its bytes that buffer holds at most (the vectored syscalls: the first `iovec`'s
/// length; the bytes beyond it are in the next buffers, which are not read).
#[inline(always)]
fn payload(state: &InFlight, r: &IpcRecord, msghdr: u64) -> (u64, u64) {
    let iov = match syscall(r) {
        Some(IpcSyscall::Read | IpcSyscall::Write | IpcSyscall::Sendto | IpcSyscall::Recvfrom) => {
            return (state.data, u64::MAX);
        }
        Some(IpcSyscall::Readv | IpcSyscall::Writev) => state.data,
        _ => read_user(msghdr + MSGHDR_IOV).unwrap_or(0),
    };
    if iov == 0 {
        return (0, 0);
    }
    (read_user(iov).unwrap_or(0), read_user(iov + IOVEC_LEN).unwrap_or(0))
}

/// The size of a receive's buffer: `recvfrom`'s length, or the sum of a message's `iovec`
/// lengths (`u64::MAX` when unknown: more than [`MAX_IOVS`] of them, or unreadable).
#[inline(always)]
fn buffer_size(state: &InFlight, r: &IpcRecord, msghdr: u64) -> u64 {
    match syscall(r) {
        Some(IpcSyscall::Recvfrom) => state.len,
        Some(IpcSyscall::Recvmsg | IpcSyscall::Recvmmsg) => {
            let Ok(iov) = read_user::<u64>(msghdr + MSGHDR_IOV) else { return u64::MAX };
            let Ok(count) = read_user::<u64>(msghdr + MSGHDR_IOVLEN) else { return u64::MAX };
            if count > MAX_IOVS {
                return u64::MAX;
            }
            let mut size = 0u64;
            for i in 0..MAX_IOVS {
                if i >= count {
                    break;
                }
                let Ok(len) = read_user::<u64>(iov + i * IOVEC_SIZE + IOVEC_LEN) else { return u64::MAX };
                size = size.saturating_add(len);
            }
            size
        }
        _ => u64::MAX,
    }
}

/// The user-space address (`struct sockaddr`) a datagram went to or came from, 0 if none.
#[inline(always)]
fn message_address(state: &InFlight, r: &IpcRecord, msghdr: u64) -> u64 {
    match syscall(r) {
        Some(IpcSyscall::Sendto | IpcSyscall::Recvfrom) => state.addr,
        Some(IpcSyscall::Sendmsg | IpcSyscall::Recvmsg | IpcSyscall::Sendmmsg | IpcSyscall::Recvmmsg) => {
            read_user(msghdr + MSGHDR_NAME).unwrap_or(0)
        }
        _ => 0,
    }
}

/// Copies a Unix socket's bound path (`sun_path`); returns its length.
#[inline(always)]
fn unix_path(sk: *const u8, o: &KernelOffsets, out: &mut [u8; UNIX_PATH_LEN]) -> u32 {
    if sk.is_null() {
        return 0;
    }
    let Ok(addr) = read_kernel::<*const u8>(sk, o.unix_addr) else { return 0 };
    if addr.is_null() {
        return 0;
    }
    let Ok(len) = read_kernel::<i32>(addr, o.unix_address_len) else { return 0 };
    // `len` counts `sun_family` (2 bytes) and the path.
    let path_len = (len - 2).clamp(0, UNIX_PATH_LEN as i32) as u32;
    // SAFETY: a checked kernel read into a buffer of the stated size.
    let name = addr.wrapping_add(o.unix_address_name as usize + 2);
    if unsafe { bpf_probe_read_kernel_buf(name, out) }.is_err() {
        return 0;
    }
    path_len
}

/// Writes one transfer's record. Not inlined: the multi-message loop calls it many times.
#[inline(never)]
fn emit(t: &Transfer) {
    let Transfer { state, tgid, tid, exit_ts, bytes, index, msghdr } = *t;
    let Ok(channel) = ChannelKind::try_from(state.channel) else { return };
    let send = matches!(IpcSyscall::from_u32(state.nr).map(IpcSyscall::direction), Some(Direction::Send));
    let Some(buffer) = IPC_SCRATCH.get_ptr_mut(0) else { return };
    let cfg = config();
    let o = &cfg.offsets;
    let sk = state.object as *const u8;
    // SAFETY: this CPU's scratch record (programs do not migrate while they run); the record is
    // zeroed before a reference to it is made, and an all-zero record is valid.
    let (r, captured): (&mut IpcRecord, &mut [u8; CAPTURE_BYTES_MAX]) = unsafe {
        let record = &raw mut (*buffer).record;
        record.write_bytes(0, 1);
        (&mut *record, &mut (*buffer).payload)
    };
    // A send is stamped at its entry, a receive at its exit: bytes cannot arrive before they
    // leave, so a linked receive never precedes its send.
    r.header = header_at(RecordKind::Ipc, tgid, tid, if send { state.entry_ts } else { exit_ts });
    r.direction = if send { Direction::Send as u32 } else { Direction::Recv as u32 };
    r.channel = state.channel;
    r.syscall = state.nr;
    r.fd = state.fd as i32;
    r.bytes = bytes;
    r.syscall_ns = exit_ts.saturating_sub(state.entry_ts);
    r.msg_index = index;
    r.received = bytes;
    // A peek copies bytes but leaves them queued: the stream's position must not move, or the
    // receive that reads them afterwards would be placed past them.
    if !send && state.flags & MSG_PEEK != 0 {
        r.flags |= ipc_flags::PEEK;
    }
    // From here on the syscall, the direction, the channel and whether this is a peek are read
    // back from the record (`reread`), not carried from above.

    match channel {
        ChannelKind::Tcp | ChannelKind::Udp => {
            let family: u16 = read_kernel(sk, o.sock_family).unwrap_or(0);
            r.family = family;
            r.local_port = read_kernel(sk, o.sock_num).unwrap_or(0);
            r.remote_port = u16::from_be(read_kernel(sk, o.sock_dport).unwrap_or(0));
            if family == AF_INET {
                let local: [u8; 4] = read_kernel(sk, o.sock_rcv_saddr).unwrap_or([0; 4]);
                let remote: [u8; 4] = read_kernel(sk, o.sock_daddr).unwrap_or([0; 4]);
                r.local_addr[..4].copy_from_slice(&local);
                r.remote_addr[..4].copy_from_slice(&remote);
            } else {
                r.local_addr = read_kernel(sk, o.sock_v6_rcv_saddr).unwrap_or([0; 16]);
                r.remote_addr = read_kernel(sk, o.sock_v6_daddr).unwrap_or([0; 16]);
            }
            if matches!(channel, ChannelKind::Tcp) {
                // After the syscall the socket's counter has moved past these bytes.
                let seq_offset = if sends(r) { o.tcp_write_seq } else { o.tcp_copied_seq };
                if !peeks(r)
                    && !matches!(syscall(r), Some(IpcSyscall::Sendmmsg | IpcSyscall::Recvmmsg))
                    && let Ok(seq) = read_kernel::<u32>(sk, seq_offset)
                {
                    r.stream_pos = seq.wrapping_sub(bytes as u32) as u64;
                    r.pos_valid = 1;
                }
            } else {
                if r.remote_port == 0 {
                    // Unconnected: the peer is the message's address.
                    let addr = message_address(state, r, msghdr);
                    if addr != 0 && read_user::<u16>(addr).unwrap_or(0) == family {
                        r.remote_port = u16::from_be(read_user(addr + 2).unwrap_or(0));
                        if family == AF_INET {
                            let a: [u8; 4] = read_user(addr + 4).unwrap_or([0; 4]);
                            r.remote_addr[..4].copy_from_slice(&a);
                        } else {
                            r.remote_addr = read_user(addr + 8).unwrap_or([0; 16]);
                        }
                    }
                }
            }
        }
        ChannelKind::UnixStream => {
            let peer: *const u8 = read_kernel(sk, o.unix_peer).unwrap_or(core::ptr::null());
            r.local_ino = socket_ino(sk, o);
            r.peer_ino = socket_ino(peer, o);
            r.local_sk = sk as u64;
            r.peer_sk = peer as u64;
            // The conversation's name: whichever end is bound (a server's accepted socket shares
            // the listener's path; the client is usually unbound), so both ends report the same.
            r.path_len = unix_path(sk, o, &mut r.path);
            if r.path_len == 0 {
                r.path_len = unix_path(peer, o, &mut r.path);
            }
            if index == 0
                && !peeks(r)
                && state.stream != 0
                && let Some(pos) = advance_stream(state.stream, sends(r), bytes)
            {
                r.stream_pos = pos;
                r.pos_valid = 1;
            }
        }
        ChannelKind::UnixDgram => {
            let peer: *const u8 = read_kernel(sk, o.unix_peer).unwrap_or(core::ptr::null());
            r.local_ino = socket_ino(sk, o);
            r.peer_ino = socket_ino(peer, o);
            let send = sends(r);
            if send && peer.is_null() {
                // Unconnected: the destination is the message's address.
                let addr = message_address(state, r, msghdr);
                // SAFETY: a checked user-memory read into a buffer of the stated size.
                if addr != 0
                    && read_user::<u16>(addr).unwrap_or(0) == AF_UNIX
                    && unsafe { bpf_probe_read_user_buf((addr + 2) as *const u8, &mut r.path) }.is_ok()
                {
                    r.path_len = UNIX_PATH_LEN as u32;
                }
            } else {
                r.path_len = unix_path(if send { peer } else { sk }, o, &mut r.path);
            }
        }
        ChannelKind::Pipe | ChannelKind::Fifo => {
            r.local_ino = state.ino;
            if let Some(pos) = advance_stream(state.stream, sends(r), bytes) {
                r.stream_pos = pos;
                r.pos_valid = 1;
            }
        }
    }
    // Datagrams: once here rather than in each arm above, so the verifier walks it once.
    if matches!(ChannelKind::try_from(reread(&r.channel)), Ok(ChannelKind::Udp | ChannelKind::UnixDgram)) {
        truncation(r, state, msghdr);
        read_head(r, payload(state, r, msghdr).0, r.received);
    }
    if cfg.capture_bytes != 0 {
        r.capturing = 1;
        let (buf, first_len) = payload(state, r, msghdr);
        let want = r.received.min(first_len).min(cfg.capture_bytes as u64);
        r.captured_len = capture(captured, buf, want, tgid, state.fd);
    }
    let size = size_of::<IpcRecord>() as u64 + (r.captured_len as u64 & (CAPTURE_BYTES_MAX as u64 * 2 - 1));
    let size = if size > size_of::<IpcBuffer>() as u64 { size_of::<IpcBuffer>() as u64 } else { size };
    // `buffer` holds at least `size` bytes (bounded just above).
    emit_bytes(RecordKind::Ipc, buffer.cast::<u8>(), size);
}

/// A field of the record being written, read back from its map value. The verifier knows nothing
/// of what a map value holds, so a branch on a field read back does not tie what follows to the
/// path that set it. Carried in registers, the syscall, the direction, the channel and the peek
/// flag were constants known on each path, every later test of them was decided by that path, and
/// the verifier then kept the paths apart: it walked the rest of `emit` once per combination
/// (`ipc_sys_exit`: 564k instructions processed on Linux 6.18, seconds of start-up at load).
#[inline(always)]
fn reread<T: Copy>(field: &T) -> T {
    // SAFETY: a reference is valid for reads; volatile, so that the compiler does not reuse the
    // value it wrote.
    unsafe { core::ptr::read_volatile(field) }
}

#[inline(always)]
fn syscall(r: &IpcRecord) -> Option<IpcSyscall> {
    IpcSyscall::from_u32(reread(&r.syscall))
}

#[inline(always)]
fn sends(r: &IpcRecord) -> bool {
    reread(&r.direction) == Direction::Send as u32
}

#[inline(always)]
fn peeks(r: &IpcRecord) -> bool {
    reread(&r.flags) & ipc_flags::PEEK != 0
}

/// A datagram receive with `MSG_TRUNC` returns the message's length even where it exceeds the
/// buffer: what fit is what the program received, the rest was discarded.
#[inline(always)]
fn truncation(r: &mut IpcRecord, state: &InFlight, msghdr: u64) {
    if sends(r) || state.flags & MSG_TRUNC == 0 {
        return;
    }
    let size = buffer_size(state, r, msghdr);
    if r.bytes > size {
        r.received = size;
        r.flags |= ipc_flags::TRUNCATED;
    }
}

/// `--capture-bytes`: copies the first `want` bytes at `buf` in user memory; returns how many were
/// copied. Memory that cannot be read is counted ([`LostSlot::IpcPayloadUnreadable`]): the
/// transfer is recorded without its bytes.
#[inline(always)]
fn capture(out: &mut [u8; CAPTURE_BYTES_MAX], buf: u64, want: u64, tgid: u32, fd: u64) -> u32 {
    if want == 0 {
        return 0;
    }
    let len = if want > CAPTURE_BYTES_MAX as u64 { CAPTURE_BYTES_MAX as u32 } else { want as u32 };
    // SAFETY: copies `len` (at most the buffer's size) bytes of the traced process's memory;
    // `bpf_probe_read_user` checks the address, a bad one is an error, not a fault.
    let ret = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(out.as_mut_ptr().cast(), len, buf as *const c_void)
    };
    if buf == 0 || ret != 0 {
        count_lost(LostSlot::IpcPayloadUnreadable);
        if config().debug != 0 {
            note_unreadable(tgid, fd, buf, len, ret);
        }
        return 0;
    }
    len
}

/// `--debug-kernel`: keeps the first failed payload read of this syscall exit for
/// `log_pending_unreadable`. Logging right here, on every path through `emit` (three callers, each
/// channel kind), made the verifier walk aya-log's code once per path: over its million
/// instructions. Later failures of the same exit (a `sendmmsg`'s other messages) are counted, not
/// logged.
#[inline(always)]
fn note_unreadable(tgid: u32, fd: u64, buf: u64, len: u32, err: i64) {
    if let Some(slot) = UNREADABLE.get_ptr_mut(0) {
        // SAFETY: a per-CPU map value; programs do not migrate while they run.
        let slot = unsafe { &mut *slot };
        if slot.pending == 0 {
            *slot = Unreadable { pending: 1, tgid: tgid as u64, fd, buf, len: len as u64, err };
        }
    }
}

/// `--debug-kernel`: logs the failed payload read `note_unreadable` kept, if any, and clears it.
#[inline(never)]
fn log_pending_unreadable() {
    let Some(slot) = UNREADABLE.get_ptr_mut(0) else { return };
    // SAFETY: as in `note_unreadable`.
    let slot = unsafe { &mut *slot };
    if slot.pending == 0 {
        return;
    }
    slot.pending = 0;
    log_unreadable(slot.tgid as u32, slot.fd, slot.buf, slot.len as u32, slot.err);
}

/// `--debug-kernel`: says which payload read failed. Out of line, so the path without the flag
/// carries none of aya-log's code.
#[inline(never)]
fn log_unreadable(tgid: u32, fd: u64, buf: u64, len: u32, err: i64) {
    // aya-log-ebpf 0.2 ignores the context argument (it writes to its own ring, AYA_LOGS); the
    // callers here run inside a `bpf_loop` callback that has no context to pass.
    aya_log_ebpf::warn!(
        &(),
        "ipc payload unreadable: pid {} fd {} address {:x} length {} error {}",
        tgid,
        fd,
        buf,
        len,
        err
    );
}

/// Copies up to `HEAD_LEN` payload bytes from user memory into the record.
#[inline(always)]
fn read_head(r: &mut IpcRecord, buf: u64, bytes: u64) {
    if buf == 0 {
        return;
    }
    let want = if bytes < HEAD_LEN as u64 { bytes as u32 } else { HEAD_LEN as u32 };
    // SAFETY: a checked user-memory read into a buffer of the stated size.
    if unsafe { bpf_probe_read_user_buf(buf as *const u8, &mut r.head) }.is_ok() {
        r.head_len = want;
        return;
    }
    // Fewer than HEAD_LEN readable bytes (a short buffer at the end of a page): what of the first
    // `want` is readable, all of it or the part in its first page (reads fail by whole pages). Two
    // reads of a bounded variable length, where a byte-by-byte loop was verified per iteration.
    let in_page = (PAGE_SIZE - (buf & (PAGE_SIZE - 1))) as u32;
    for len in [want, want.min(in_page)] {
        let len = len & (HEAD_LEN as u32 * 2 - 1);
        if len == 0 || len > HEAD_LEN as u32 {
            return;
        }
        // SAFETY: copies `len` (at most the head's size) bytes; `bpf_probe_read_user` checks the
        // address, a bad one is an error, not a fault.
        let ret = unsafe {
            aya_ebpf::helpers::generated::bpf_probe_read_user(r.head.as_mut_ptr().cast(), len, buf as *const c_void)
        };
        if ret == 0 {
            r.head_len = len;
            return;
        }
    }
}
