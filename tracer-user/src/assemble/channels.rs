//! From the kernel's IPC records to events: which channel a transfer went through, named so that
//! both ends agree, and what the flow matcher needs to link them.

use crate::event::data;
use std::{
    collections::{HashMap, hash_map::RandomState},
    hash::{BuildHasher as _, Hasher as _},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket},
    path::PathBuf,
};

use tracer_common::{ChannelKind, Direction, IpcRecord, IpcSyscall, decode::c_bytes, ipc_flags};

use crate::event::{Channel, EventData, Syscall};

const AF_INET: u16 = 2;

impl From<IpcSyscall> for Syscall {
    fn from(s: IpcSyscall) -> Syscall {
        match s {
            IpcSyscall::Read => Syscall::Read,
            IpcSyscall::Write => Syscall::Write,
            IpcSyscall::Readv => Syscall::Readv,
            IpcSyscall::Writev => Syscall::Writev,
            IpcSyscall::Sendto => Syscall::Sendto,
            IpcSyscall::Recvfrom => Syscall::Recvfrom,
            IpcSyscall::Sendmsg => Syscall::Sendmsg,
            IpcSyscall::Recvmsg => Syscall::Recvmsg,
            IpcSyscall::Sendmmsg => Syscall::Sendmmsg,
            IpcSyscall::Recvmmsg => Syscall::Recvmmsg,
        }
    }
}

/// A datagram's fingerprint: FNV-1a over its length and first payload bytes. Stable across
/// builds and hosts (both ends of a cross-host link must compute the same).
pub fn digest(bytes: u64, head: &[u8]) -> u64 {
    let mut h = fnv::FnvHasher::default();
    h.write(&bytes.to_le_bytes());
    h.write(head);
    h.finish()
}

fn ip(family: u16, raw: &[u8; 16]) -> IpAddr {
    if family == AF_INET {
        IpAddr::V4(Ipv4Addr::new(raw[0], raw[1], raw[2], raw[3]))
    } else {
        let v6 = Ipv6Addr::from(*raw);
        // IPv4-mapped addresses are how a dual-stack socket sees an IPv4 peer; name it as such so
        // that an IPv4 peer names the same endpoint.
        v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
    }
}

/// Unix socket paths: abstract names (leading NUL) are written `@name`, as `ss` does.
fn unix_path(raw: &[u8], len: u32) -> Option<String> {
    let raw = &raw[..(len as usize).min(raw.len())];
    match raw.first() {
        None => None,
        Some(0) => {
            let name = &raw[1..];
            let end = name.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
            Some(format!("@{}", String::from_utf8_lossy(&name[..end])))
        }
        Some(_) => Some(String::from_utf8_lossy(c_bytes(raw)).into_owned()),
    }
}

/// Resolves what the kernel record cannot say by itself, with caches.
#[derive(Default)]
pub struct ChannelResolver {
    /// Turns kernel addresses into identifiers: stable within a trace, meaningless outside it
    /// (a trace file must not reveal where the kernel keeps its objects).
    kernel_ids: RandomState,
    /// The source address the kernel picks for an unbound UDP socket sending to a destination.
    sources: HashMap<IpAddr, Option<IpAddr>>,
    /// FIFO inode numbers to their paths.
    fifo_paths: HashMap<u64, String>,
}

impl ChannelResolver {
    /// The local address a socket bound to the wildcard address sends from, as the routing table
    /// picks it: what the receiver will see as the source. Found by connecting a throwaway UDP
    /// socket (no packet is sent) in the tracer's own network namespace, the target's too when
    /// the tracer runs beside it.
    fn source_for(&mut self, dst: IpAddr) -> Option<IpAddr> {
        *self.sources.entry(dst).or_insert_with(|| {
            let bind: SocketAddr = match dst {
                IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
                IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
            };
            let socket = UdpSocket::bind(bind).ok()?;
            socket.connect((dst, 9)).ok()?;
            socket.local_addr().ok().map(|a| a.ip())
        })
    }

    /// The path of a FIFO, from the file descriptor that used it if it still names the same
    /// inode. Best effort (the descriptor may be closed by the time the record is read); once
    /// found, a FIFO keeps its path for every later event, at both ends.
    fn fifo_path(&mut self, pid: u32, fd: i32, ino: u64) -> Option<String> {
        if let Some(path) = self.fifo_paths.get(&ino) {
            return Some(path.clone());
        }
        use std::os::unix::fs::MetadataExt as _;
        let path: PathBuf = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok()?;
        if std::fs::metadata(&path).ok()?.ino() != ino {
            return None;
        }
        let path = path.display().to_string();
        self.fifo_paths.insert(ino, path.clone());
        Some(path)
    }

    /// The event for an IPC record, with `flow_id`s left for the [`crate::pipeline::flows::FlowMatcher`].
    pub fn ipc_event(&mut self, pid: u32, r: &IpcRecord, captured: &[u8]) -> Option<EventData> {
        let direction = Direction::try_from(r.direction).ok()?;
        let kind = ChannelKind::try_from(r.channel).ok()?;
        let syscall: Syscall = IpcSyscall::from_u32(r.syscall)?.into();
        let send = direction == Direction::Send;
        let mut digest_of = None;
        let channel = match kind {
            ChannelKind::Tcp | ChannelKind::Udp => {
                let local_ip = ip(r.family, &r.local_addr);
                let remote = SocketAddr::new(ip(r.family, &r.remote_addr), r.remote_port);
                let local_ip = if local_ip.is_unspecified() && !remote.ip().is_unspecified() {
                    self.source_for(remote.ip()).unwrap_or(local_ip)
                } else {
                    local_ip
                };
                let local = SocketAddr::new(local_ip, r.local_port);
                let (src, dst) = if send { (local, remote) } else { (remote, local) };
                if kind == ChannelKind::Tcp {
                    Channel::Tcp { src, dst }
                } else {
                    digest_of = Some(());
                    Channel::Udp { src, dst }
                }
            }
            ChannelKind::UnixStream => {
                let both = if r.peer_sk == 0 { r.local_sk } else { r.local_sk.min(r.peer_sk) };
                let to = if send { r.peer_sk } else { r.local_sk };
                let (id, to) = (self.kernel_ids.hash_one(both), self.kernel_ids.hash_one(to));
                Channel::UnixStream { id, to, path: unix_path(&r.path, r.path_len) }
            }
            ChannelKind::UnixDgram => {
                let path = unix_path(&r.path, r.path_len);
                let receiver = if send { r.peer_ino } else { r.local_ino };
                digest_of = Some(());
                Channel::UnixDgram { id: if path.is_none() { Some(receiver) } else { None }, path }
            }
            ChannelKind::Pipe => Channel::Pipe { id: r.local_ino },
            ChannelKind::Fifo => Channel::Fifo { id: r.local_ino, path: self.fifo_path(pid, r.fd, r.local_ino) },
        };
        let seq = (r.pos_valid != 0).then_some(r.stream_pos);
        let digest = digest_of.map(|()| digest(r.bytes, &r.head[..(r.head_len as usize).min(r.head.len())]));
        let peek = r.flags & ipc_flags::PEEK != 0;
        // What reached the program: less than the syscall returned for a datagram cut by
        // `MSG_TRUNC`, whose digest is still of the whole message (as its send's is).
        let truncated = !send && r.flags & ipc_flags::TRUNCATED != 0 && r.received < r.bytes;
        let received = if truncated { r.received } else { r.bytes };
        let capturing = r.capturing != 0;
        let payload = capturing.then(|| data::Payload(captured.to_vec()));
        let payload_truncated = capturing.then_some((captured.len() as u64) < received);
        Some(if send {
            EventData::Send(data::Send {
                channel,
                fd: r.fd,
                bytes: r.bytes,
                syscall,
                flow_id: 0,
                syscall_ns: r.syscall_ns,
                seq,
                digest,
                payload,
                payload_truncated,
            })
        } else {
            EventData::Recv(data::Recv {
                channel,
                fd: r.fd,
                bytes: received,
                syscall,
                flow_ids: Vec::new(),
                syscall_ns: r.syscall_ns,
                // A peek's bytes are read again later: it has no place in the stream.
                seq: if peek { None } else { seq },
                digest,
                payload,
                payload_truncated,
                peek,
                discarded: truncated.then(|| r.bytes - r.received),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::{RecordHeader, RecordKind};

    use super::*;

    fn record(kind: ChannelKind, direction: Direction) -> IpcRecord {
        // SAFETY: an all-zero IpcRecord is valid.
        let mut r: IpcRecord = unsafe { std::mem::zeroed() };
        r.header = RecordHeader { kind: RecordKind::Ipc as u32, _pad: 0, ts_boot_ns: 1, pid: 10, tid: 10 };
        r.channel = kind as u32;
        r.direction = direction as u32;
        r.syscall = IpcSyscall::Sendto as u32;
        r.fd = 3;
        r.bytes = 5;
        r
    }

    #[test]
    fn tcp_ends_name_the_same_channel() {
        let mut send = record(ChannelKind::Tcp, Direction::Send);
        send.family = AF_INET;
        send.local_addr[..4].copy_from_slice(&[127, 0, 0, 1]);
        send.remote_addr[..4].copy_from_slice(&[127, 0, 0, 1]);
        send.local_port = 40000;
        send.remote_port = 8080;
        send.stream_pos = 1000;
        send.pos_valid = 1;
        let mut recv = send;
        recv.direction = Direction::Recv as u32;
        recv.syscall = IpcSyscall::Read as u32;
        (recv.local_port, recv.remote_port) = (8080, 40000);
        let mut resolver = ChannelResolver::default();
        let Some(EventData::Send(data::Send { channel: a, seq, .. })) = resolver.ipc_event(10, &send, &[]) else {
            panic!()
        };
        let Some(EventData::Recv(data::Recv { channel: b, syscall, .. })) = resolver.ipc_event(11, &recv, &[]) else {
            panic!()
        };
        assert_eq!(a, b);
        assert_eq!(a, Channel::Tcp { src: "127.0.0.1:40000".parse().unwrap(), dst: "127.0.0.1:8080".parse().unwrap() });
        assert_eq!(seq, Some(1000));
        assert_eq!(syscall, Syscall::Read);
    }

    #[test]
    fn ipv4_mapped_peers_read_as_ipv4() {
        let mut raw = [0u8; 16];
        raw[10] = 0xff;
        raw[11] = 0xff;
        raw[12..].copy_from_slice(&[10, 0, 0, 1]);
        assert_eq!(ip(10, &raw), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!(ip(10, &Ipv6Addr::LOCALHOST.octets()), IpAddr::V6(Ipv6Addr::LOCALHOST));
    }

    #[test]
    fn unbound_udp_senders_get_their_routed_source() {
        let mut send = record(ChannelKind::Udp, Direction::Send);
        send.family = AF_INET;
        send.local_port = 5555;
        send.remote_addr[..4].copy_from_slice(&[127, 0, 0, 1]);
        send.remote_port = 9999;
        send.head[..5].copy_from_slice(b"hello");
        send.head_len = 5;
        let Some(EventData::Send(data::Send { channel, digest: d, seq, .. })) =
            ChannelResolver::default().ipc_event(1, &send, &[])
        else {
            panic!()
        };
        assert_eq!(
            channel,
            Channel::Udp { src: "127.0.0.1:5555".parse().unwrap(), dst: "127.0.0.1:9999".parse().unwrap() }
        );
        assert_eq!(d, Some(digest(5, b"hello")));
        assert_eq!(seq, None);
    }

    #[test]
    fn digests_tell_datagrams_apart() {
        assert_ne!(digest(5, b"hello"), digest(5, b"hellp"));
        assert_ne!(digest(5, b"hello"), digest(6, b"hello"));
        assert_eq!(digest(5, b"hello"), digest(5, b"hello"));
    }

    #[test]
    fn unix_paths() {
        let mut raw = [0u8; 108];
        raw[..9].copy_from_slice(b"/tmp/sock");
        assert_eq!(unix_path(&raw, 10), Some("/tmp/sock".to_string()));
        let mut abs = [0u8; 108];
        abs[1..5].copy_from_slice(b"name");
        assert_eq!(unix_path(&abs, 5), Some("@name".to_string()));
        assert_eq!(unix_path(&raw, 0), None);
    }

    #[test]
    fn unix_stream_ends_share_ids_that_hide_kernel_addresses() {
        let mut a = record(ChannelKind::UnixStream, Direction::Send);
        (a.local_sk, a.peer_sk) = (0xffff_8880_0000_1000, 0xffff_8880_0000_2000);
        let mut b = record(ChannelKind::UnixStream, Direction::Recv);
        (b.local_sk, b.peer_sk) = (a.peer_sk, a.local_sk);
        let mut c = record(ChannelKind::UnixStream, Direction::Send);
        (c.local_sk, c.peer_sk) = (a.peer_sk, a.local_sk);
        let mut resolver = ChannelResolver::default();
        let Some(EventData::Send(data::Send { channel: ca, .. })) = resolver.ipc_event(1, &a, &[]) else { panic!() };
        let Some(EventData::Recv(data::Recv { channel: cb, .. })) = resolver.ipc_event(1, &b, &[]) else { panic!() };
        let Some(EventData::Send(data::Send { channel: cc, .. })) = resolver.ipc_event(1, &c, &[]) else { panic!() };
        assert_eq!(ca, cb, "a send and its receive name the same channel");
        let (Channel::UnixStream { id: ida, to: toa, .. }, Channel::UnixStream { id: idc, to: toc, .. }) = (&ca, &cc)
        else {
            panic!()
        };
        assert_eq!(ida, idc, "both directions are one conversation");
        assert_ne!(toa, toc, "told apart by their receiving ends");
        assert!(![a.local_sk, a.peer_sk].contains(ida) && ![a.local_sk, a.peer_sk].contains(toa));
    }
}
