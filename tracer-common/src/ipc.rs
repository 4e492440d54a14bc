//! Transfers on sockets and pipes.

use crate::RecordHeader;

/// Messages of one `sendmmsg`/`recvmmsg` recorded, each as its own record.
pub const MAX_MMSG: u32 = 16;

/// Payload bytes kept from the start of each datagram, to tell datagrams apart.
pub const HEAD_LEN: usize = 16;

/// Bytes of a Unix socket path (`sun_path`).
pub const UNIX_PATH_LEN: usize = 108;

/// Most payload bytes `--capture-bytes` copies from one transfer (a power of two: the eBPF side
/// bounds lengths with a mask).
pub const CAPTURE_BYTES_MAX: usize = 4096;

numbered_enum! {
    /// Which way an [`IpcRecord`] moved bytes.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Direction {
        Send = 1,
        Recv = 2,
    }
}

numbered_enum! {
    /// What kind of kernel object an [`IpcRecord`] went through.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum ChannelKind {
        Tcp = 1,
        Udp = 2,
        UnixStream = 3,
        /// Unix datagram and seqpacket sockets.
        UnixDgram = 4,
        Pipe = 5,
        Fifo = 6,
    }
}

numbered_enum! {
    /// The syscalls that move IPC data, by x86-64 number.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum IpcSyscall {
        Read = 0,
        Write = 1,
        Readv = 19,
        Writev = 20,
        Sendto = 44,
        Recvfrom = 45,
        Sendmsg = 46,
        Recvmsg = 47,
        Recvmmsg = 299,
        Sendmmsg = 307,
    }
}

impl IpcSyscall {
    /// The IPC syscall with this number (as the syscall tracepoints give it), if it is one.
    pub const fn from_number(nr: u64) -> Option<IpcSyscall> {
        if nr > u32::MAX as u64 { None } else { IpcSyscall::from_u32(nr as u32) }
    }

    pub const fn direction(self) -> Direction {
        match self {
            IpcSyscall::Write
            | IpcSyscall::Writev
            | IpcSyscall::Sendto
            | IpcSyscall::Sendmsg
            | IpcSyscall::Sendmmsg => Direction::Send,
            IpcSyscall::Read
            | IpcSyscall::Readv
            | IpcSyscall::Recvfrom
            | IpcSyscall::Recvmsg
            | IpcSyscall::Recvmmsg => Direction::Recv,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            IpcSyscall::Read => "read",
            IpcSyscall::Write => "write",
            IpcSyscall::Readv => "readv",
            IpcSyscall::Writev => "writev",
            IpcSyscall::Sendto => "sendto",
            IpcSyscall::Recvfrom => "recvfrom",
            IpcSyscall::Sendmsg => "sendmsg",
            IpcSyscall::Recvmsg => "recvmsg",
            IpcSyscall::Recvmmsg => "recvmmsg",
            IpcSyscall::Sendmmsg => "sendmmsg",
        }
    }
}

/// One data transfer on a socket or pipe by a traced thread: one per syscall that moved bytes, or
/// one per message of `sendmmsg`/`recvmmsg`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcRecord {
    /// `ts_boot_ns` is the syscall's entry for a send, its exit for a receive.
    pub header: RecordHeader,
    /// A [`Direction`].
    pub direction: u32,
    /// A [`ChannelKind`].
    pub channel: u32,
    /// An [`IpcSyscall`] number.
    pub syscall: u32,
    pub fd: i32,
    /// Bytes moved (by this message, for the multi-message syscalls).
    pub bytes: u64,
    pub syscall_ns: u64,
    /// Position of the first byte in its stream: the TCP sequence number (32 bits), or for Unix
    /// streams and pipes the tracer's own count of the bytes that went through.
    pub stream_pos: u64,
    /// 1 when `stream_pos` is meaningful.
    pub pos_valid: u32,
    /// Which message of `sendmmsg`/`recvmmsg` (0 otherwise).
    pub msg_index: u32,
    /// AF_INET or AF_INET6 for TCP/UDP.
    pub family: u16,
    pub local_port: u16,
    pub remote_port: u16,
    pub _pad: u16,
    /// IPv4 addresses take the first 4 bytes. For unconnected UDP the remote address is the
    /// message's (destination of a send, source of a receive); zero when unknown.
    pub local_addr: [u8; 16],
    pub remote_addr: [u8; 16],
    /// Unix sockets: this socket's inode; pipes and FIFOs: the pipe's inode.
    pub local_ino: u64,
    /// Unix sockets: the connected peer's inode (0 when not connected).
    pub peer_ino: u64,
    /// Unix streams: the kernel's `struct sock` of this end and of its peer. Unlike inodes they
    /// exist for the whole connection (a server's socket has no inode until `accept`, a closed
    /// one loses it), so they identify the stream at both ends; user space never writes them out
    /// as they are.
    pub local_sk: u64,
    pub peer_sk: u64,
    /// The first bytes of the payload (datagrams tell each other apart by them).
    pub head: [u8; HEAD_LEN],
    pub head_len: u32,
    /// Length of `path`, 0 when there is none.
    pub path_len: u32,
    /// Unix sockets: a bound address (`sun_path`; abstract names start with a NUL): for streams,
    /// whichever end is bound; for datagrams, the receiving end's.
    pub path: [u8; UNIX_PATH_LEN],
    /// `--capture-bytes`: payload bytes that follow the record in the ring buffer (the first of
    /// the transfer's, at most [`CAPTURE_BYTES_MAX`]), so its length is
    /// `size_of::<IpcRecord>() + captured_len`.
    pub captured_len: u32,
    /// 1 when payload capture was on for this transfer (then `captured_len < received` means cut).
    pub capturing: u32,
    /// [`ipc_flags`].
    pub flags: u32,
    /// Bytes that reached the program's buffer: `bytes`, unless [`ipc_flags::TRUNCATED`].
    pub received: u64,
}

/// Bits of [`IpcRecord::flags`].
pub mod ipc_flags {
    /// A receive with `MSG_PEEK`: the bytes were copied but left in the queue (the stream's
    /// position did not move; a later receive reads them again).
    pub const PEEK: u32 = 1;
    /// A datagram receive with `MSG_TRUNC` whose message was longer than the buffer: `bytes` is
    /// the message's length (what the syscall returned), `received` what fit in the buffer; the
    /// rest was discarded.
    pub const TRUNCATED: u32 = 2;
}
