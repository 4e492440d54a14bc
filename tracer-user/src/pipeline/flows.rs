//! Linking each receive to the sends whose bytes it consumed, and each signal's generation to its
//! delivery, from what the kernel recorded: exact, never guessed from timing.
//!
//! - Streams (TCP, Unix streams, pipes): bytes are placed by their position in the stream (the TCP
//!   sequence number, or the tracer's byte count) and a receive is linked to every send whose
//!   range it overlaps, so one send read by three receives, or three sends read by one, are all
//!   linked. TCP sequence numbers mean a trace that starts mid-connection links from its first
//!   byte; Unix streams and pipes count from what they held when the tracer first saw them.
//! - Datagrams (UDP, Unix datagram): each datagram is one link, matched at its receiving end by
//!   length and first payload bytes (and sender, when the receiver asked for it), in order;
//!   datagrams never received (dropped, or read by an untraced process) are skipped over. A
//!   receive that did not ask for the sender's address takes the send's channel, so that both
//!   name the same src and dst.
//! - Signals: the kernel queues a signal for one thread or for the whole process and a thread
//!   takes its own first: delivery pops the thread's queue, then the process's.
//!
//! Events must come in time order (see [`crate::pipeline::order`]): a send is stamped at its syscall's entry
//! and a receive at its exit, so a send always precedes the receives of its bytes.

use crate::event::data;
use std::{
    collections::{HashMap, VecDeque},
    net::SocketAddr,
    sync::Arc,
};

use crate::event::{Channel, Event, EventData, IpcStats};

/// Sends remembered per stream or datagram flow while waiting to be read; the oldest go first.
const MAX_PENDING_PER_FLOW: usize = 4096;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum FlowKey {
    /// TCP: the endpoints name the stream on every host that sees it. UDP: the receiving end
    /// does. Loopback endpoints are only meaningful within one host.
    Inet { host: Option<Arc<str>>, src: Option<SocketAddr>, dst: SocketAddr },
    /// Unix sockets and pipes: kernel objects of one host. `id` names the receiving end.
    Local { host: Arc<str>, kind: u8, id: u64, path: Option<String> },
}

fn inet_key(host: &Arc<str>, src: Option<SocketAddr>, dst: SocketAddr) -> FlowKey {
    let local_only = dst.ip().is_loopback() || src.is_some_and(|s| s.ip().is_loopback());
    FlowKey::Inet { host: local_only.then(|| host.clone()), src, dst }
}

fn flow_key(host: &Arc<str>, channel: &Channel) -> FlowKey {
    let local = |kind: u8, id: u64, path: Option<String>| FlowKey::Local { host: host.clone(), kind, id, path };
    match channel {
        Channel::Tcp { src, dst } => inet_key(host, Some(*src), *dst),
        Channel::Udp { dst, .. } => inet_key(host, None, *dst),
        Channel::UnixStream { to, .. } => local(1, *to, None),
        Channel::UnixDgram { id, path } => local(2, id.unwrap_or(0), path.clone()),
        Channel::Pipe { id } | Channel::Fifo { id, .. } => local(3, *id, None),
    }
}

/// Sends of one stream, by byte range.
#[derive(Default)]
struct Stream {
    /// TCP only: the last position seen, to widen 32-bit sequence numbers.
    last: Option<u64>,
    sends: VecDeque<(u64, u64, u64)>,
}

impl Stream {
    /// A 64-bit position for a 32-bit TCP sequence number: the one nearest the last position.
    fn widen(&mut self, seq: u64) -> u64 {
        let pos = match self.last {
            None => seq + (1 << 32),
            Some(last) => {
                let delta = (seq as u32).wrapping_sub(last as u32) as i32 as i64;
                (last as i64 + delta) as u64
            }
        };
        self.last = Some(pos);
        pos
    }
}

/// Where the kernel queues a signal: (host, thread or process id, signal number).
type SignalQueue = (Arc<str>, u32, i32);
/// A generated signal waiting for delivery: (flow id, sender).
type PendingSignal = (u64, u32);

/// A datagram sent and not received yet.
struct Datagram {
    digest: u64,
    flow: u64,
    channel: Channel,
}

/// The sending end of a UDP channel, if known (a receive that did not ask knows none).
fn udp_source(channel: &Channel) -> Option<SocketAddr> {
    match channel {
        Channel::Udp { src, .. } if !src.ip().is_unspecified() => Some(*src),
        _ => None,
    }
}

#[derive(Default)]
pub struct FlowMatcher {
    next_flow: u64,
    streams: HashMap<FlowKey, Stream>,
    datagrams: HashMap<FlowKey, VecDeque<Datagram>>,
    /// Signals queued for one thread, and for a whole process.
    thread_signals: HashMap<SignalQueue, VecDeque<PendingSignal>>,
    process_signals: HashMap<SignalQueue, VecDeque<PendingSignal>>,
    pub stats: IpcStats,
}

fn push_bounded<T>(queue: &mut VecDeque<T>, item: T) {
    if queue.len() == MAX_PENDING_PER_FLOW {
        queue.pop_front();
    }
    queue.push_back(item);
}

impl FlowMatcher {
    fn new_flow(&mut self) -> u64 {
        self.next_flow += 1;
        self.next_flow
    }

    /// Assigns flow ids to a send, receive or signal event (others pass untouched).
    pub fn process(&mut self, event: &mut Event) {
        let host = event.host.clone();
        match &mut event.data {
            EventData::Send(data::Send { channel, bytes, flow_id, seq, digest, .. }) => {
                self.stats.sends += 1;
                *flow_id = self.new_flow();
                let key = flow_key(&host, channel);
                if let Some(seq) = *seq {
                    let tcp = matches!(channel, Channel::Tcp { .. });
                    let stream = self.streams.entry(key).or_default();
                    let start = if tcp { stream.widen(seq) } else { seq };
                    push_bounded(&mut stream.sends, (start, start + *bytes, *flow_id));
                } else if let Some(digest) = *digest {
                    let datagram = Datagram { digest, flow: *flow_id, channel: channel.clone() };
                    push_bounded(self.datagrams.entry(key).or_default(), datagram);
                }
            }
            // A peek leaves its bytes for the receive that follows: that one is their link (nor
            // is it counted among the receives, linked or not).
            EventData::Recv(data::Recv { peek: true, .. }) => {}
            EventData::Recv(data::Recv { channel, bytes, flow_ids, seq, digest, .. }) => {
                self.stats.recvs += 1;
                let key = flow_key(&host, channel);
                if let Some(seq) = *seq {
                    let tcp = matches!(channel, Channel::Tcp { .. });
                    if let Some(stream) = self.streams.get_mut(&key) {
                        let start = if tcp { stream.widen(seq) } else { seq };
                        let end = start + *bytes;
                        // Sends wholly before this receive were read already (or never will be).
                        while stream.sends.front().is_some_and(|&(_, send_end, _)| send_end <= start) {
                            stream.sends.pop_front();
                        }
                        flow_ids.extend(
                            stream
                                .sends
                                .iter()
                                .take_while(|&&(send_start, _, _)| send_start < end)
                                .filter(|&&(_, send_end, _)| send_end > start)
                                .map(|&(_, _, flow)| flow),
                        );
                    }
                } else if let Some(digest) = *digest
                    && let Some(queue) = self.datagrams.get_mut(&key)
                {
                    let source = udp_source(channel);
                    let found = queue
                        .iter()
                        .position(|d| d.digest == digest && (source.is_none() || source == udp_source(&d.channel)));
                    if let Some(i) = found {
                        flow_ids.push(queue[i].flow);
                        if source.is_none() && matches!(channel, Channel::Udp { .. }) {
                            *channel = queue[i].channel.clone();
                        }
                        // Datagrams of that sender sent before this one and not received yet never
                        // will be here.
                        let sender = udp_source(&queue[i].channel);
                        let mut index = 0;
                        queue.retain(|d| {
                            let keep = index > i || (index < i && udp_source(&d.channel) != sender);
                            index += 1;
                            keep
                        });
                    }
                }
                if flow_ids.is_empty() {
                    self.stats.unlinked_recvs += 1;
                } else {
                    self.stats.linked_recvs += 1;
                }
            }
            EventData::Signal(data::Signal {
                signal,
                sender_pid,
                target_pid,
                target_tid,
                delivered,
                flow_id,
                group,
                queued,
            }) => {
                let sig = signal.number;
                if !*delivered {
                    if *queued {
                        let id = self.new_flow();
                        *flow_id = Some(id);
                        let queue = if *group {
                            self.process_signals.entry((host, *target_pid, sig)).or_default()
                        } else {
                            self.thread_signals.entry((host, *target_tid, sig)).or_default()
                        };
                        push_bounded(queue, (id, *sender_pid));
                    }
                } else {
                    let taken = self
                        .thread_signals
                        .get_mut(&(host.clone(), *target_tid, sig))
                        .and_then(VecDeque::pop_front)
                        .or_else(|| {
                            self.process_signals.get_mut(&(host, *target_pid, sig)).and_then(VecDeque::pop_front)
                        });
                    if let Some((id, sender)) = taken {
                        *flow_id = Some(id);
                        *sender_pid = sender;
                        self.stats.linked_signals += 1;
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::event::{SignalId, Syscall};

    pub(crate) fn tcp() -> Channel {
        Channel::Tcp { src: "10.0.0.1:40000".parse().unwrap(), dst: "10.0.0.2:80".parse().unwrap() }
    }

    pub(crate) fn send(host: &str, channel: Channel, bytes: u64, seq: Option<u64>, digest: Option<u64>) -> Event {
        Event {
            ts: 0,
            host: host.into(),
            pid: 1,
            tid: 1,
            data: EventData::Send(data::Send {
                channel,
                fd: 3,
                bytes,
                syscall: Syscall::Write,
                flow_id: 0,
                syscall_ns: 0,
                seq,
                digest,
                payload: None,
                payload_truncated: None,
            }),
        }
    }

    pub(crate) fn recv(host: &str, channel: Channel, bytes: u64, seq: Option<u64>, digest: Option<u64>) -> Event {
        Event {
            ts: 0,
            host: host.into(),
            pid: 2,
            tid: 2,
            data: EventData::Recv(data::Recv {
                channel,
                fd: 4,
                bytes,
                syscall: Syscall::Read,
                flow_ids: vec![],
                syscall_ns: 0,
                seq,
                digest,
                payload: None,
                payload_truncated: None,
                peek: false,
                discarded: None,
            }),
        }
    }

    fn flow_of(e: &Event) -> u64 {
        match &e.data {
            EventData::Send(data::Send { flow_id, .. }) => *flow_id,
            _ => panic!("not a send"),
        }
    }

    fn links(e: &Event) -> Vec<u64> {
        match &e.data {
            EventData::Recv(data::Recv { flow_ids, .. }) => flow_ids.clone(),
            _ => panic!("not a receive"),
        }
    }

    /// Runs events through a matcher; returns them.
    fn run(m: &mut FlowMatcher, events: Vec<Event>) -> Vec<Event> {
        events
            .into_iter()
            .map(|mut e| {
                m.process(&mut e);
                e
            })
            .collect()
    }

    #[test]
    fn one_send_read_by_three_receives() {
        let mut m = FlowMatcher::default();
        let out = run(
            &mut m,
            vec![
                send("a", tcp(), 300, Some(1000), None),
                recv("b", tcp(), 100, Some(1000), None),
                recv("b", tcp(), 100, Some(1100), None),
                recv("b", tcp(), 100, Some(1200), None),
            ],
        );
        let id = flow_of(&out[0]);
        assert_eq!([links(&out[1]), links(&out[2]), links(&out[3])], [vec![id], vec![id], vec![id]]);
        assert_eq!((m.stats.linked_recvs, m.stats.unlinked_recvs), (3, 0));
    }

    #[test]
    fn three_sends_read_by_one_receive() {
        let mut m = FlowMatcher::default();
        let out = run(
            &mut m,
            vec![
                send("a", tcp(), 10, Some(0), None),
                send("a", tcp(), 20, Some(10), None),
                send("a", tcp(), 30, Some(30), None),
                recv("b", tcp(), 60, Some(0), None),
            ],
        );
        assert_eq!(links(&out[3]), [flow_of(&out[0]), flow_of(&out[1]), flow_of(&out[2])]);
    }

    #[test]
    fn chunk_sizes_that_straddle() {
        // Writer: 3 x 100 bytes; reader: 150 + 150.
        let pipe = Channel::Pipe { id: 9 };
        let mut m = FlowMatcher::default();
        let out = run(
            &mut m,
            vec![
                send("h", pipe.clone(), 100, Some(0), None),
                send("h", pipe.clone(), 100, Some(100), None),
                send("h", pipe.clone(), 100, Some(200), None),
                recv("h", pipe.clone(), 150, Some(0), None),
                recv("h", pipe.clone(), 150, Some(150), None),
            ],
        );
        let (a, b, c) = (flow_of(&out[0]), flow_of(&out[1]), flow_of(&out[2]));
        assert_eq!(links(&out[3]), [a, b]);
        assert_eq!(links(&out[4]), [b, c]);
    }

    #[test]
    fn tcp_sequence_numbers_wrap() {
        let mut m = FlowMatcher::default();
        let near_end = u32::MAX as u64 - 49;
        let out = run(
            &mut m,
            vec![
                send("a", tcp(), 100, Some(near_end), None),
                // The receive's sequence number has wrapped past zero.
                recv("b", tcp(), 50, Some(near_end + 50 - (1 << 32)), None),
            ],
        );
        assert_eq!(links(&out[1]), [flow_of(&out[0])]);
    }

    #[test]
    fn a_trace_that_starts_mid_stream_links_what_it_saw() {
        let mut m = FlowMatcher::default();
        // Bytes 0..500 were sent before tracing; the receive reads old and new bytes.
        let out = run(&mut m, vec![send("a", tcp(), 100, Some(500), None), recv("b", tcp(), 200, Some(400), None)]);
        assert_eq!(links(&out[1]), [flow_of(&out[0])]);
        // A receive of only old bytes links to nothing.
        let out = run(&mut m, vec![recv("b", tcp(), 50, Some(100), None)]);
        assert!(links(&out[0]).is_empty());
        assert_eq!(m.stats.unlinked_recvs, 1);
    }

    #[test]
    fn a_peeked_datagram_is_left_for_the_receive_that_reads_it() {
        let mut m = FlowMatcher::default();
        let dgram = Channel::Udp { src: "10.0.0.1:1".parse().unwrap(), dst: "10.0.0.2:2".parse().unwrap() };
        let mut peek = recv("b", dgram.clone(), 10, None, Some(7));
        let EventData::Recv(r) = &mut peek.data else { unreachable!() };
        r.peek = true;
        let out =
            run(&mut m, vec![send("a", dgram.clone(), 10, None, Some(7)), peek, recv("b", dgram, 10, None, Some(7))]);
        assert!(links(&out[1]).is_empty());
        assert_eq!(links(&out[2]), [flow_of(&out[0])]);
        assert_eq!((m.stats.recvs, m.stats.linked_recvs, m.stats.unlinked_recvs), (1, 1, 0));
    }

    #[test]
    fn a_receive_with_no_traced_send() {
        let mut m = FlowMatcher::default();
        let out = run(&mut m, vec![recv("b", tcp(), 10, Some(0), None)]);
        assert!(links(&out[0]).is_empty());
        let dgram = Channel::Udp { src: "10.0.0.1:1".parse().unwrap(), dst: "10.0.0.2:2".parse().unwrap() };
        let out = run(&mut m, vec![recv("b", dgram, 10, None, Some(7))]);
        assert!(links(&out[0]).is_empty());
        assert_eq!(m.stats.unlinked_recvs, 2);
    }

    #[test]
    fn datagrams_match_one_to_one_and_skip_lost_ones() {
        let udp = Channel::Udp { src: "10.0.0.1:1".parse().unwrap(), dst: "10.0.0.2:2".parse().unwrap() };
        let mut m = FlowMatcher::default();
        let out = run(
            &mut m,
            vec![
                send("a", udp.clone(), 10, None, Some(1)),
                send("a", udp.clone(), 10, None, Some(2)),
                send("a", udp.clone(), 10, None, Some(3)),
                // Datagram 2 was dropped.
                recv("b", udp.clone(), 10, None, Some(1)),
                recv("b", udp.clone(), 10, None, Some(3)),
                recv("b", udp.clone(), 10, None, Some(2)),
            ],
        );
        assert_eq!(links(&out[3]), [flow_of(&out[0])]);
        assert_eq!(links(&out[4]), [flow_of(&out[2])]);
        assert!(links(&out[5]).is_empty(), "a datagram is linked once");
    }

    #[test]
    fn udp_receives_that_did_not_ask_for_the_sender_take_its_channel() {
        let sent = Channel::Udp { src: "10.0.0.1:1".parse().unwrap(), dst: "10.0.0.2:2".parse().unwrap() };
        let other = Channel::Udp { src: "10.0.0.3:3".parse().unwrap(), dst: "10.0.0.2:2".parse().unwrap() };
        let unknown = Channel::Udp { src: "0.0.0.0:0".parse().unwrap(), dst: "10.0.0.2:2".parse().unwrap() };
        let mut m = FlowMatcher::default();
        let out = run(
            &mut m,
            vec![
                send("a", sent.clone(), 10, None, Some(1)),
                send("c", other.clone(), 10, None, Some(5)),
                recv("b", unknown, 10, None, Some(1)),
                // A receive that names its sender only matches that sender's datagrams.
                recv("b", other.clone(), 10, None, Some(1)),
                recv("b", other.clone(), 10, None, Some(5)),
            ],
        );
        assert_eq!(links(&out[2]), [flow_of(&out[0])]);
        let EventData::Recv(data::Recv { channel, .. }) = &out[2].data else { panic!() };
        assert_eq!(*channel, sent);
        assert!(links(&out[3]).is_empty());
        assert_eq!(links(&out[4]), [flow_of(&out[1])], "another sender's datagram stays queued");
    }

    #[test]
    fn loopback_flows_stay_on_their_host() {
        let lo = Channel::Tcp { src: "127.0.0.1:1".parse().unwrap(), dst: "127.0.0.1:2".parse().unwrap() };
        let mut m = FlowMatcher::default();
        let out = run(&mut m, vec![send("a", lo.clone(), 10, Some(0), None), recv("b", lo.clone(), 10, Some(0), None)]);
        assert!(links(&out[1]).is_empty());
        let out = run(&mut m, vec![recv("a", lo, 10, Some(0), None)]);
        assert_eq!(links(&out[0]).len(), 1);
    }

    #[test]
    fn unix_stream_directions_are_separate() {
        let a_to_b = Channel::UnixStream { id: 5, to: 6, path: None };
        let b_to_a = Channel::UnixStream { id: 5, to: 5, path: None };
        let mut m = FlowMatcher::default();
        let out = run(
            &mut m,
            vec![
                send("h", a_to_b.clone(), 10, Some(0), None),
                send("h", b_to_a.clone(), 10, Some(0), None),
                recv("h", b_to_a, 10, Some(0), None),
                recv("h", a_to_b, 10, Some(0), None),
            ],
        );
        assert_eq!(links(&out[2]), [flow_of(&out[1])]);
        assert_eq!(links(&out[3]), [flow_of(&out[0])]);
    }

    #[test]
    fn unix_datagrams_by_path_or_by_socket() {
        let named = Channel::UnixDgram { id: None, path: Some("/tmp/d".into()) };
        let unnamed = Channel::UnixDgram { id: Some(77), path: None };
        let mut m = FlowMatcher::default();
        let out = run(
            &mut m,
            vec![
                send("h", named.clone(), 4, None, Some(9)),
                send("h", unnamed.clone(), 4, None, Some(9)),
                recv("h", named, 4, None, Some(9)),
                recv("h", unnamed, 4, None, Some(9)),
            ],
        );
        assert_eq!(links(&out[2]), [flow_of(&out[0])]);
        assert_eq!(links(&out[3]), [flow_of(&out[1])]);
    }

    fn signal(tid: u32, delivered: bool, group: bool, queued: bool) -> Event {
        Event {
            ts: 0,
            host: "h".into(),
            pid: if delivered { 20 } else { 10 },
            tid: if delivered { tid } else { 10 },
            data: EventData::Signal(data::Signal {
                signal: SignalId::new(10),
                sender_pid: if delivered { 0 } else { 10 },
                target_pid: 20,
                target_tid: tid,
                delivered,
                flow_id: None,
                group,
                queued,
            }),
        }
    }

    fn signal_flow(e: &Event) -> Option<u64> {
        match &e.data {
            EventData::Signal(data::Signal { flow_id, .. }) => *flow_id,
            _ => panic!(),
        }
    }

    #[test]
    fn signals_link_generation_to_delivery() {
        let mut m = FlowMatcher::default();
        let out = run(
            &mut m,
            vec![
                signal(20, false, true, true),
                // Already pending: not queued, so not linked.
                signal(20, false, true, false),
                // A thread-directed one for thread 21 is taken first by thread 21.
                signal(21, false, false, true),
                signal(21, true, false, true),
                signal(21, true, false, true),
            ],
        );
        assert_eq!(signal_flow(&out[1]), None);
        assert_eq!(signal_flow(&out[3]), signal_flow(&out[2]));
        assert_eq!(signal_flow(&out[4]), signal_flow(&out[0]), "then the process-wide one");
        let EventData::Signal(data::Signal { sender_pid, .. }) = &out[4].data else { panic!() };
        assert_eq!(*sender_pid, 10, "the delivery names the sender");
        assert_eq!(m.stats.linked_signals, 2);
    }
}
