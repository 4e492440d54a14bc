//! pcapng (`.pcapng`): every traced message as a packet that Wireshark and tshark read, written
//! with the `pcap-file` crate (the maintained Rust pcap/pcapng reader and writer; its 2.0 release
//! builds with our compilers) and packet headers built with `etherparse`.
//!
//! - One section; per host, one interface per link type it uses (pcapng gives each interface
//!   one link type), named `HOST` (Ethernet), `HOST/unix+pipes` and `HOST/events`, all with
//!   nanosecond timestamps (`if_tsresol` = 9).
//! - TCP and UDP messages: `LINKTYPE_ETHERNET` frames with synthesized Ethernet (locally
//!   administered MACs), IPv4 or IPv6 and TCP or UDP headers carrying the real addresses, ports
//!   and TCP sequence numbers (TCP: PSH|ACK, the acknowledgment being the other direction's next
//!   byte as far as this trace saw it). The frame's captured bytes are the headers and the
//!   `--capture-bytes` payload; its original length counts every byte the syscall moved, so a cut
//!   payload shows as a short capture, not as a smaller message. The IPv4 header checksum is
//!   right; TCP and UDP checksums are right when the whole payload was captured and 0 otherwise
//!   (Wireshark does not check them by default). A message longer than fits an IP packet is
//!   split into segments of [`MAX_SEGMENT`] bytes.
//! - Each direction once: a send, or a receive whose sender was not traced (no `flow_ids`).
//! - Unix sockets and pipes: `LINKTYPE_USER0` (147) packets: the channel as one JSON object and a
//!   newline, then the captured payload.
//! - With `--pcap-events`, every other event: `LINKTYPE_USER1` (148) packets holding the event's
//!   JSON line, so the capture holds the whole trace in time order.
//! - Every packet has a comment (`opt_comment`): `host=H pid=P tid=T comm=C function=F flow=ID`
//!   (`function` is the thread's innermost traced call, `-` when none; `flow` the send's
//!   `flow_id`, or a receive's first).

use std::{
    borrow::Cow,
    collections::HashMap,
    io::{self, BufWriter, Write},
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use etherparse::{EtherType, Ethernet2Header, IpNumber, Ipv4Header, Ipv6FlowLabel, Ipv6Header, TcpHeader, UdpHeader};
use pcap_file::{
    DataLink,
    pcapng::{
        PcapNgWriter,
        blocks::{
            enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption},
            interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption},
        },
    },
};

use crate::{
    analysis::processes,
    event::{
        Event, EventData, TraceEnd, TraceStart, data,
        json::{Json, Line},
    },
    sink::Sink,
};

/// Most payload bytes in one synthesized IP packet (a larger message becomes several segments).
pub const MAX_SEGMENT: u64 = 65_000;
/// Locally administered MAC addresses: the sending end, the receiving end.
const SRC_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const DST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

/// The link types this writer uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Link {
    Ethernet,
    /// Unix sockets and pipes (`LINKTYPE_USER0`).
    Local,
    /// Other events as JSON lines (`LINKTYPE_USER1`).
    Events,
}

impl Link {
    fn data_link(self) -> DataLink {
        match self {
            Link::Ethernet => DataLink::ETHERNET,
            Link::Local => DataLink::USER0,
            Link::Events => DataLink::USER1,
        }
    }

    fn interface_name(self, host: &str) -> String {
        match self {
            Link::Ethernet => host.to_string(),
            Link::Local => format!("{host}/unix+pipes"),
            Link::Events => format!("{host}/events"),
        }
    }
}

pub struct PcapngWriter<W: Write> {
    out: Option<PcapNgWriter<BufWriter<W>>>,
    pending: Option<W>,
    /// Write the events that are not messages too (`--pcap-events`).
    all_events: bool,
    interfaces: HashMap<(Arc<str>, Link), u32>,
    comms: HashMap<(Arc<str>, u32), String>,
    /// Each thread's open traced calls, innermost last.
    stacks: HashMap<(Arc<str>, u32), Vec<Arc<str>>>,
    /// Per TCP direction (src, dst): the sequence number after the last byte seen.
    next_seq: HashMap<(SocketAddr, SocketAddr), u32>,
}

impl<W: Write> PcapngWriter<W> {
    pub fn new(out: W, all_events: bool) -> Self {
        PcapngWriter {
            out: None,
            pending: Some(out),
            all_events,
            interfaces: HashMap::new(),
            comms: HashMap::new(),
            stacks: HashMap::new(),
            next_seq: HashMap::new(),
        }
    }

    fn writer(&mut self) -> io::Result<&mut PcapNgWriter<BufWriter<W>>> {
        if self.out.is_none() {
            let out = self.pending.take().ok_or_else(|| io::Error::other("the pcapng output is gone"))?;
            self.out = Some(PcapNgWriter::new(BufWriter::with_capacity(1 << 20, out)).map_err(pcap_error)?);
        }
        Ok(self.out.as_mut().expect("just set"))
    }

    fn interface(&mut self, host: &Arc<str>, link: Link) -> io::Result<u32> {
        if let Some(&id) = self.interfaces.get(&(host.clone(), link)) {
            return Ok(id);
        }
        let id = self.interfaces.len() as u32;
        let idb = InterfaceDescriptionBlock {
            linktype: link.data_link(),
            snaplen: 0,
            options: vec![
                InterfaceDescriptionOption::IfName(Cow::Owned(link.interface_name(host))),
                InterfaceDescriptionOption::IfTsResol(9),
            ],
        };
        self.writer()?.write_pcapng_block(idb).map_err(pcap_error)?;
        self.interfaces.insert((host.clone(), link), id);
        Ok(id)
    }

    fn packet(&mut self, e: &Event, link: Link, data: &[u8], original_len: u64, comment: String) -> io::Result<()> {
        let interface_id = self.interface(&e.host, link)?;
        let epb = EnhancedPacketBlock {
            interface_id,
            timestamp: Duration::from_nanos(e.ts),
            original_len: original_len.min(u32::MAX as u64) as u32,
            data: Cow::Borrowed(data),
            options: vec![EnhancedPacketOption::Comment(Cow::Owned(comment))],
        };
        self.writer()?.write_pcapng_block(epb).map_err(pcap_error)?;
        Ok(())
    }

    fn comment(&self, e: &Event, flow: Option<u64>) -> String {
        let key = (e.host.clone(), e.pid);
        let comm = self.comms.get(&key).map_or("-", String::as_str);
        let function = self.stacks.get(&(e.host.clone(), e.tid)).and_then(|s| s.last()).map_or("-", |f| f);
        let flow = flow.map_or_else(|| "-".to_string(), |f| f.to_string());
        format!("host={} pid={} tid={} comm={comm} function={function} flow={flow}", e.host, e.pid, e.tid)
    }

    /// Remembers what the comments need: each process's name, each thread's innermost call.
    fn follow(&mut self, e: &Event) {
        if let Some((pid, comm)) = processes::named_by(e) {
            self.comms.insert((e.host.clone(), pid), comm.to_string());
        }
        match &e.data {
            EventData::Call(c) => self.stacks.entry((e.host.clone(), e.tid)).or_default().push(c.function.clone()),
            EventData::Return(r) => {
                if let Some(stack) = self.stacks.get_mut(&(e.host.clone(), e.tid))
                    && let Some(at) = stack.iter().rposition(|f| *f == r.function)
                {
                    stack.truncate(at);
                }
            }
            EventData::Exit(_) => {
                self.stacks.remove(&(e.host.clone(), e.tid));
            }
            _ => {}
        }
    }

    fn message(&mut self, e: &Event) -> io::Result<bool> {
        let (channel, bytes, flow, payload) = match &e.data {
            EventData::Send(s) => (&s.channel, s.bytes, Some(s.flow_id), s.payload.as_ref()),
            // A receive whose sender was traced is already in the capture, as that send; a peek's
            // bytes are in it as the receive that follows.
            // A datagram cut by `MSG_TRUNC` was whole on the wire.
            EventData::Recv(r) if r.flow_ids.is_empty() && !r.peek => {
                (&r.channel, r.bytes + r.discarded.unwrap_or(0), None, r.payload.as_ref())
            }
            EventData::Recv(_) => return Ok(true),
            _ => return Ok(false),
        };
        let seq = match &e.data {
            EventData::Send(s) => s.seq,
            EventData::Recv(r) => r.seq,
            _ => None,
        };
        let captured: &[u8] = payload.map_or(&[], |p| &p.0);
        let comment = self.comment(e, flow);
        match channel {
            data::Channel::Tcp { src, dst } | data::Channel::Udp { src, dst } => {
                let tcp = matches!(channel, data::Channel::Tcp { .. });
                let first = match (tcp, seq) {
                    (true, Some(seq)) => seq as u32,
                    (true, None) => self.next_seq.get(&(*src, *dst)).copied().unwrap_or(0),
                    (false, _) => 0,
                };
                let mut offset = 0u64;
                loop {
                    let len = (bytes - offset).min(MAX_SEGMENT);
                    let data_start = (offset as usize).min(captured.len());
                    let data_end = ((offset + len) as usize).min(captured.len());
                    let seq = first.wrapping_add(offset as u32);
                    let ack = self.next_seq.get(&(*dst, *src)).copied();
                    let frame = frame(*src, *dst, tcp.then_some((seq, ack)), len, &captured[data_start..data_end])?;
                    let headers = frame.len() as u64 - (data_end - data_start) as u64;
                    self.packet(e, Link::Ethernet, &frame, headers + len, comment.clone())?;
                    if tcp {
                        self.next_seq.insert((*src, *dst), seq.wrapping_add(len as u32));
                    }
                    offset += len;
                    if offset >= bytes {
                        break;
                    }
                }
            }
            _ => {
                let mut data = serde_json::to_vec(&Json(channel)).map_err(io::Error::other)?;
                data.push(b'\n');
                let header = data.len() as u64;
                data.extend_from_slice(captured);
                self.packet(e, Link::Local, &data, header + bytes, comment)?;
            }
        }
        Ok(true)
    }
}

/// An Ethernet frame carrying `len` payload bytes from `src` to `dst`, of which `captured` (the
/// first ones) are included; TCP when `tcp` gives (seq, ack), UDP otherwise.
fn frame(
    src: SocketAddr,
    dst: SocketAddr,
    tcp: Option<(u32, Option<u32>)>,
    len: u64,
    captured: &[u8],
) -> io::Result<Vec<u8>> {
    let whole = captured.len() as u64 == len;
    let transport_len = len + if tcp.is_some() { TcpHeader::MIN_LEN as u64 } else { UdpHeader::LEN as u64 };
    let protocol = if tcp.is_some() { IpNumber::TCP } else { IpNumber::UDP };
    let mut out = Vec::with_capacity(128 + captured.len());
    let (src_ip, dst_ip) = match (src.ip(), dst.ip()) {
        (IpAddr::V6(s), d) => (s, to_v6(d)),
        (s, IpAddr::V6(d)) => (to_v6(s), d),
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            Ethernet2Header { source: SRC_MAC, destination: DST_MAC, ether_type: EtherType::IPV4 }.write(&mut out)?;
            let mut ip = Ipv4Header::new(transport_len as u16, 64, protocol, s.octets(), d.octets())
                .map_err(io::Error::other)?;
            ip.header_checksum = ip.calc_header_checksum();
            ip.write(&mut out)?;
            match tcp {
                Some((seq, ack)) => {
                    let mut h = tcp_header(src.port(), dst.port(), seq, ack);
                    if whole {
                        h.checksum = h.calc_checksum_ipv4(&ip, captured).map_err(io::Error::other)?;
                    }
                    h.write(&mut out)?;
                }
                None => {
                    let mut h = udp_header(src.port(), dst.port(), transport_len);
                    if whole {
                        h.checksum = h.calc_checksum_ipv4(&ip, captured).map_err(io::Error::other)?;
                    }
                    h.write(&mut out)?;
                }
            }
            out.extend_from_slice(captured);
            return Ok(out);
        }
    };
    Ethernet2Header { source: SRC_MAC, destination: DST_MAC, ether_type: EtherType::IPV6 }.write(&mut out)?;
    let ip = Ipv6Header {
        traffic_class: 0,
        flow_label: Ipv6FlowLabel::ZERO,
        payload_length: transport_len as u16,
        next_header: protocol,
        hop_limit: 64,
        source: src_ip.octets(),
        destination: dst_ip.octets(),
    };
    ip.write(&mut out)?;
    match tcp {
        Some((seq, ack)) => {
            let mut h = tcp_header(src.port(), dst.port(), seq, ack);
            if whole {
                h.checksum = h.calc_checksum_ipv6(&ip, captured).map_err(io::Error::other)?;
            }
            h.write(&mut out)?;
        }
        None => {
            let mut h = udp_header(src.port(), dst.port(), transport_len);
            if whole {
                h.checksum = h.calc_checksum_ipv6(&ip, captured).map_err(io::Error::other)?;
            }
            h.write(&mut out)?;
        }
    }
    out.extend_from_slice(captured);
    Ok(out)
}

fn to_v6(ip: IpAddr) -> std::net::Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

fn tcp_header(src: u16, dst: u16, seq: u32, ack: Option<u32>) -> TcpHeader {
    let mut h = TcpHeader::new(src, dst, seq, 65535);
    h.psh = true;
    if let Some(ack) = ack {
        h.ack = true;
        h.acknowledgment_number = ack;
    }
    h
}

fn udp_header(src: u16, dst: u16, length: u64) -> UdpHeader {
    UdpHeader { source_port: src, destination_port: dst, length: length.min(u16::MAX as u64) as u16, checksum: 0 }
}

fn pcap_error(e: pcap_file::PcapError) -> io::Error {
    match e {
        pcap_file::PcapError::IoError(e) => e,
        other => io::Error::other(other),
    }
}

impl<W: Write> Sink for PcapngWriter<W> {
    fn begin(&mut self, start: &TraceStart) -> io::Result<()> {
        let host: Arc<str> = start.host.as_str().into();
        for (pid, comm) in start.targets.iter().filter_map(processes::target_name) {
            self.comms.insert((host.clone(), pid), comm);
        }
        self.writer()?;
        Ok(())
    }

    fn event(&mut self, event: &Event) -> io::Result<()> {
        if !self.message(event)? && self.all_events {
            let mut line = serde_json::to_vec(&Line::Event(event)).map_err(io::Error::other)?;
            line.push(b'\n');
            let comment = self.comment(event, None);
            let len = line.len() as u64;
            self.packet(event, Link::Events, &line, len, comment)?;
        }
        self.follow(event);
        Ok(())
    }

    fn end(&mut self, _end: &TraceEnd) -> io::Result<()> {
        self.writer()?.get_mut().flush()
    }

    fn flush(&mut self) -> io::Result<()> {
        self.writer()?.get_mut().flush()
    }
}

#[cfg(test)]
mod tests {
    use etherparse::{NetSlice, SlicedPacket, TransportSlice};
    use pcap_file::pcapng::{Block, PcapNgReader};

    use super::*;
    use crate::event::test_events::{call, end, ev, start};

    fn tcp_send(ts: u64, src: &str, dst: &str, seq: u64, payload: &[u8], bytes: u64) -> Event {
        ev(
            ts,
            1,
            1,
            EventData::Send(data::Send {
                channel: data::Channel::Tcp { src: src.parse().unwrap(), dst: dst.parse().unwrap() },
                fd: 3,
                bytes,
                syscall: data::Syscall::Write,
                flow_id: 9,
                syscall_ns: 0,
                seq: Some(seq),
                digest: None,
                payload: Some(data::Payload(payload.to_vec())),
                payload_truncated: Some((payload.len() as u64) < bytes),
            }),
        )
    }

    /// Writes `events` and reads the capture back: (interfaces, packets).
    fn capture(
        events: &[Event],
        all: bool,
    ) -> (Vec<InterfaceDescriptionBlock<'static>>, Vec<EnhancedPacketBlock<'static>>) {
        let mut out = Vec::new();
        {
            let mut w = PcapngWriter::new(&mut out, all);
            w.begin(&start(1)).unwrap();
            for e in events {
                w.event(e).unwrap();
            }
            w.end(&end(2)).unwrap();
        }
        let mut reader = PcapNgReader::new(&out[..]).unwrap();
        let (mut idbs, mut epbs) = (Vec::new(), Vec::new());
        while let Some(block) = reader.next_block() {
            match block.unwrap() {
                Block::InterfaceDescription(i) => idbs.push(i.into_owned()),
                Block::EnhancedPacket(p) => epbs.push(p.into_owned()),
                _ => {}
            }
        }
        (idbs, epbs)
    }

    fn comment(p: &EnhancedPacketBlock) -> String {
        p.options
            .iter()
            .find_map(|o| match o {
                EnhancedPacketOption::Comment(c) => Some(c.to_string()),
                _ => None,
            })
            .unwrap()
    }

    #[test]
    fn tcp_messages_are_frames_with_the_real_addresses_ports_and_sequence_numbers() {
        let events = [
            call(10, 1, "handle"),
            tcp_send(1_700_000_000_123_456_789, "10.0.0.1:5000", "10.0.0.2:80", 4_294_967_290, b"GET /", 5),
            tcp_send(1_700_000_000_123_456_800, "[::1]:6000", "[::1]:443", 7, b"abc", 100),
        ];
        let (idbs, packets) = capture(&events, false);
        assert_eq!(idbs.len(), 1);
        assert_eq!(idbs[0].linktype, DataLink::ETHERNET);
        assert!(idbs[0].options.contains(&InterfaceDescriptionOption::IfTsResol(9)));
        assert!(idbs[0].options.contains(&InterfaceDescriptionOption::IfName(Cow::Borrowed("h"))));
        assert_eq!(packets.len(), 2);
        assert_eq!(packets[0].timestamp, Duration::from_nanos(1_700_000_000_123_456_789));
        assert_eq!(comment(&packets[0]), "host=h pid=1 tid=1 comm=app function=handle flow=9");

        let v4 = SlicedPacket::from_ethernet(&packets[0].data).unwrap();
        let Some(NetSlice::Ipv4(ip)) = v4.net else { panic!("{v4:?}") };
        assert_eq!(ip.header().source(), [10, 0, 0, 1]);
        assert_eq!(ip.header().destination(), [10, 0, 0, 2]);
        assert_eq!(ip.header().header_checksum(), ip.header().to_header().calc_header_checksum());
        let Some(TransportSlice::Tcp(tcp)) = v4.transport else { panic!() };
        assert_eq!((tcp.source_port(), tcp.destination_port(), tcp.sequence_number()), (5000, 80, 4_294_967_290));
        assert_eq!(tcp.payload(), b"GET /");
        // The whole payload is there: the checksum is right.
        assert_eq!(tcp.checksum(), tcp.to_header().calc_checksum_ipv4(&ip.header().to_header(), b"GET /").unwrap());
        assert_eq!(packets[0].original_len as usize, packets[0].data.len());

        // Cut: 3 of 100 bytes captured, the IP length and the original length count all 100.
        assert_eq!(packets[1].original_len as usize, packets[1].data.len() + 97);
        let ipv6 = etherparse::Ipv6Header::from_slice(&packets[1].data[14..]).unwrap().0;
        assert_eq!(ipv6.payload_length, 20 + 100);
        assert_eq!(ipv6.source, "::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
    }

    #[test]
    fn linked_receives_are_left_out_and_other_events_go_to_their_own_interface_on_request() {
        let recv = |flow_ids: Vec<u64>| {
            ev(
                20,
                1,
                1,
                EventData::Recv(data::Recv {
                    channel: data::Channel::Pipe { id: 4 },
                    fd: 0,
                    bytes: 2,
                    syscall: data::Syscall::Read,
                    flow_ids,
                    syscall_ns: 0,
                    seq: Some(0),
                    digest: None,
                    payload: Some(data::Payload(b"hi".to_vec())),
                    payload_truncated: Some(false),
                    peek: false,
                    discarded: None,
                }),
            )
        };
        let events = [call(10, 1, "main"), recv(vec![3]), recv(vec![])];
        let (idbs, packets) = capture(&events, false);
        assert_eq!(idbs.len(), 1);
        assert_eq!(idbs[0].linktype, DataLink::USER0);
        assert_eq!(packets.len(), 1, "the linked receive's bytes are its send's packet");
        assert_eq!(&packets[0].data[..], b"{\"type\":\"pipe\",\"id\":4}\nhi");
        assert_eq!(comment(&packets[0]), "host=h pid=1 tid=1 comm=app function=main flow=-");

        let (idbs, packets) = capture(&events, true);
        assert_eq!(idbs.iter().map(|i| i.linktype).collect::<Vec<_>>(), [DataLink::USER1, DataLink::USER0]);
        assert_eq!(packets.len(), 2);
        let line: serde_json::Value = serde_json::from_slice(&packets[0].data).unwrap();
        assert_eq!((line["kind"].as_str(), line["function"].as_str()), (Some("call"), Some("main")));
    }
}
