//! Events on the wire between an agent and a collector: postcard (compact varints, no field
//! names), with the strings that repeat on every event (function, module) sent once per connection
//! and referred to by number afterwards.

use std::{collections::HashMap, net::SocketAddr, sync::Arc};

use serde::{Deserialize, Serialize};

use crate::event::{Args, Channel, Event, EventData, SignalId, SpawnHow, Syscall};

/// `Channel` without serde's internal tagging, which postcard cannot read back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireChannel {
    Tcp(SocketAddr, SocketAddr),
    Udp(SocketAddr, SocketAddr),
    UnixStream { id: u64, to: u64, path: Option<String> },
    UnixDgram { id: Option<u64>, path: Option<String> },
    Pipe(u64),
    Fifo(u64, Option<String>),
}

impl From<&Channel> for WireChannel {
    fn from(c: &Channel) -> WireChannel {
        match c.clone() {
            Channel::Tcp { src, dst } => WireChannel::Tcp(src, dst),
            Channel::Udp { src, dst } => WireChannel::Udp(src, dst),
            Channel::UnixStream { id, to, path } => WireChannel::UnixStream { id, to, path },
            Channel::UnixDgram { id, path } => WireChannel::UnixDgram { id, path },
            Channel::Pipe { id } => WireChannel::Pipe(id),
            Channel::Fifo { id, path } => WireChannel::Fifo(id, path),
        }
    }
}

impl From<WireChannel> for Channel {
    fn from(c: WireChannel) -> Channel {
        match c {
            WireChannel::Tcp(src, dst) => Channel::Tcp { src, dst },
            WireChannel::Udp(src, dst) => Channel::Udp { src, dst },
            WireChannel::UnixStream { id, to, path } => Channel::UnixStream { id, to, path },
            WireChannel::UnixDgram { id, path } => Channel::UnixDgram { id, path },
            WireChannel::Pipe(id) => Channel::Pipe { id },
            WireChannel::Fifo(id, path) => Channel::Fifo { id, path },
        }
    }
}

/// An event as sent: strings as numbers into the connection's string table, the host implied by
/// the connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireEvent {
    pub ts: u64,
    pub pid: u32,
    pub tid: u32,
    pub data: WireData,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireData {
    Call {
        function: u32,
        module: u32,
        args: Args,
        goid: Option<u64>,
    },
    Return {
        function: u32,
        module: u32,
        retval: u64,
        duration_ns: Option<u64>,
        goid: Option<u64>,
    },
    Spawn {
        parent_pid: u32,
        child_pid: u32,
        child_tid: u32,
        how: SpawnHow,
        comm: String,
        filename: Option<String>,
    },
    Exit {
        exit_code: Option<i32>,
        signal: Option<i32>,
        thread: bool,
        comm: String,
    },
    Send {
        channel: WireChannel,
        fd: i32,
        bytes: u64,
        syscall: Syscall,
        syscall_ns: u64,
        seq: Option<u64>,
        digest: Option<u64>,
    },
    Recv {
        channel: WireChannel,
        fd: i32,
        bytes: u64,
        syscall: Syscall,
        syscall_ns: u64,
        seq: Option<u64>,
        digest: Option<u64>,
    },
    Signal {
        signal: i32,
        sender_pid: u32,
        target_pid: u32,
        target_tid: u32,
        delivered: bool,
        group: bool,
        queued: bool,
    },
}

/// A batch of events, numbered: `first_seq` is the sequence number of the first (an agent numbers
/// every event of a trace, so that a resumed connection neither repeats nor skips any).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventBatch {
    pub first_seq: u64,
    /// Strings introduced by this batch: (number, text).
    pub strings: Vec<(u32, String)>,
    pub events: Vec<WireEvent>,
}

/// The sending side of a connection's string table.
#[derive(Default)]
pub struct Encoder {
    numbers: HashMap<Arc<str>, u32>,
}

impl Encoder {
    /// Forgets every string (a new connection starts a new table).
    pub fn reset(&mut self) {
        self.numbers.clear();
    }

    fn number(&mut self, s: &Arc<str>, new: &mut Vec<(u32, String)>) -> u32 {
        if let Some(&n) = self.numbers.get(s) {
            return n;
        }
        let n = self.numbers.len() as u32;
        self.numbers.insert(s.clone(), n);
        new.push((n, s.to_string()));
        n
    }

    /// Encodes events as a batch starting at `first_seq`. Flow ids are not sent: the collector
    /// links flows across hosts itself.
    pub fn batch<'a>(&mut self, first_seq: u64, events: impl IntoIterator<Item = &'a Event>) -> EventBatch {
        let mut strings = Vec::new();
        let events = events
            .into_iter()
            .map(|e| WireEvent {
                ts: e.ts,
                pid: e.pid,
                tid: e.tid,
                data: match &e.data {
                    EventData::Call { function, module, args, goid } => WireData::Call {
                        function: self.number(function, &mut strings),
                        module: self.number(module, &mut strings),
                        args: *args,
                        goid: *goid,
                    },
                    EventData::Return { function, module, retval, duration_ns, goid } => WireData::Return {
                        function: self.number(function, &mut strings),
                        module: self.number(module, &mut strings),
                        retval: *retval,
                        duration_ns: *duration_ns,
                        goid: *goid,
                    },
                    EventData::Spawn { parent_pid, child_pid, child_tid, how, comm, filename } => WireData::Spawn {
                        parent_pid: *parent_pid,
                        child_pid: *child_pid,
                        child_tid: *child_tid,
                        how: *how,
                        comm: comm.clone(),
                        filename: filename.clone(),
                    },
                    EventData::Exit { exit_code, signal, thread, comm } => {
                        WireData::Exit { exit_code: *exit_code, signal: *signal, thread: *thread, comm: comm.clone() }
                    }
                    EventData::Send { channel, fd, bytes, syscall, syscall_ns, seq, digest, .. } => WireData::Send {
                        channel: channel.into(),
                        fd: *fd,
                        bytes: *bytes,
                        syscall: *syscall,
                        syscall_ns: *syscall_ns,
                        seq: *seq,
                        digest: *digest,
                    },
                    EventData::Recv { channel, fd, bytes, syscall, syscall_ns, seq, digest, .. } => WireData::Recv {
                        channel: channel.into(),
                        fd: *fd,
                        bytes: *bytes,
                        syscall: *syscall,
                        syscall_ns: *syscall_ns,
                        seq: *seq,
                        digest: *digest,
                    },
                    EventData::Signal {
                        signal, sender_pid, target_pid, target_tid, delivered, group, queued, ..
                    } => WireData::Signal {
                        signal: signal.number,
                        sender_pid: *sender_pid,
                        target_pid: *target_pid,
                        target_tid: *target_tid,
                        delivered: *delivered,
                        group: *group,
                        queued: *queued,
                    },
                },
            })
            .collect();
        EventBatch { first_seq, strings, events }
    }
}

/// The receiving side of a connection's string table.
#[derive(Default)]
pub struct Decoder {
    strings: Vec<Arc<str>>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("string number {0} was never defined")]
    UnknownString(u32),
    #[error("string number {got} defined out of order (expected {expected})")]
    StringOutOfOrder { got: u32, expected: u32 },
}

impl Decoder {
    pub fn reset(&mut self) {
        self.strings.clear();
    }

    fn string(&self, n: u32) -> Result<Arc<str>, WireError> {
        self.strings.get(n as usize).cloned().ok_or(WireError::UnknownString(n))
    }

    /// Decodes a batch from `host`; a batch naming a string it never defined is rejected whole.
    pub fn events(&mut self, host: &Arc<str>, batch: EventBatch) -> Result<Vec<Event>, WireError> {
        for (n, s) in batch.strings {
            if n as usize != self.strings.len() {
                return Err(WireError::StringOutOfOrder { got: n, expected: self.strings.len() as u32 });
            }
            self.strings.push(Arc::from(s));
        }
        batch
            .events
            .into_iter()
            .map(|w| {
                let data = match w.data {
                    WireData::Call { function, module, args, goid } => {
                        EventData::Call { function: self.string(function)?, module: self.string(module)?, args, goid }
                    }
                    WireData::Return { function, module, retval, duration_ns, goid } => EventData::Return {
                        function: self.string(function)?,
                        module: self.string(module)?,
                        retval,
                        duration_ns,
                        goid,
                    },
                    WireData::Spawn { parent_pid, child_pid, child_tid, how, comm, filename } => {
                        EventData::Spawn { parent_pid, child_pid, child_tid, how, comm, filename }
                    }
                    WireData::Exit { exit_code, signal, thread, comm } => {
                        EventData::Exit { exit_code, signal, thread, comm }
                    }
                    WireData::Send { channel, fd, bytes, syscall, syscall_ns, seq, digest } => EventData::Send {
                        channel: channel.into(),
                        fd,
                        bytes,
                        syscall,
                        flow_id: 0,
                        syscall_ns,
                        seq,
                        digest,
                    },
                    WireData::Recv { channel, fd, bytes, syscall, syscall_ns, seq, digest } => EventData::Recv {
                        channel: channel.into(),
                        fd,
                        bytes,
                        syscall,
                        flow_ids: Vec::new(),
                        syscall_ns,
                        seq,
                        digest,
                    },
                    WireData::Signal { signal, sender_pid, target_pid, target_tid, delivered, group, queued } => {
                        EventData::Signal {
                            signal: SignalId::new(signal),
                            sender_pid,
                            target_pid,
                            target_tid,
                            delivered,
                            flow_id: None,
                            group,
                            queued,
                        }
                    }
                };
                Ok(Event { ts: w.ts, host: host.clone(), pid: w.pid, tid: w.tid, data })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(host: &str) -> Vec<Event> {
        let ev = |data| Event { ts: 10, host: host.into(), pid: 1, tid: 2, data };
        vec![
            ev(EventData::Call {
                function: "fib".into(),
                module: "/bin/app".into(),
                args: [1, 2, 3, 4, 5, 6].into(),
                goid: None,
            }),
            ev(EventData::Return {
                function: "fib".into(),
                module: "/bin/app".into(),
                retval: 8,
                duration_ns: Some(4),
                goid: None,
            }),
            ev(EventData::Call {
                function: "main.work".into(),
                module: "/bin/gof".into(),
                args: [1, 2, 3, 4, 5, 6, 7, 8, 9].into(),
                goid: Some(18),
            }),
            ev(EventData::Return {
                function: "main.work".into(),
                module: "/bin/gof".into(),
                retval: 2,
                duration_ns: Some(5),
                goid: Some(18),
            }),
            ev(EventData::Spawn {
                parent_pid: 1,
                child_pid: 3,
                child_tid: 3,
                how: SpawnHow::Fork,
                comm: "app".into(),
                filename: None,
            }),
            ev(EventData::Exit { exit_code: None, signal: Some(9), thread: false, comm: "app".into() }),
            ev(EventData::Send {
                channel: Channel::Tcp { src: "10.0.0.1:1".parse().unwrap(), dst: "10.0.0.2:2".parse().unwrap() },
                fd: 3,
                bytes: 100,
                syscall: Syscall::Write,
                flow_id: 0,
                syscall_ns: 5,
                seq: Some(77),
                digest: None,
            }),
            ev(EventData::Recv {
                channel: Channel::UnixDgram { id: None, path: Some("/s".into()) },
                fd: 4,
                bytes: 9,
                syscall: Syscall::Recvmsg,
                flow_ids: vec![],
                syscall_ns: 5,
                seq: None,
                digest: Some(99),
            }),
            ev(EventData::Signal {
                signal: SignalId::new(10),
                sender_pid: 1,
                target_pid: 3,
                target_tid: 3,
                delivered: false,
                flow_id: None,
                group: true,
                queued: true,
            }),
        ]
    }

    #[test]
    fn round_trips_through_postcard_with_each_string_sent_once() {
        let sent = events("h");
        let mut encoder = Encoder::default();
        let batch = encoder.batch(42, &sent);
        assert_eq!(
            batch.strings,
            [
                (0, "fib".to_string()),
                (1, "/bin/app".to_string()),
                (2, "main.work".to_string()),
                (3, "/bin/gof".to_string())
            ]
        );
        let bytes = postcard::to_stdvec(&batch).unwrap();
        let again = encoder.batch(49, &sent[..2]);
        assert!(again.strings.is_empty(), "strings already sent are not sent again");
        let mut decoder = Decoder::default();
        let host: Arc<str> = "h".into();
        let received = decoder.events(&host, postcard::from_bytes(&bytes).unwrap()).unwrap();
        assert_eq!(received, sent);
        assert_eq!(decoder.events(&host, again).unwrap(), sent[..2]);
    }

    #[test]
    fn undefined_strings_are_rejected() {
        let mut encoder = Encoder::default();
        let mut batch = encoder.batch(0, &events("h")[..1]);
        batch.strings.clear();
        assert_eq!(Decoder::default().events(&"h".into(), batch).unwrap_err(), WireError::UnknownString(0));
        let mut batch = Encoder::default().batch(0, &events("h")[..1]);
        batch.strings[0].0 = 5;
        assert!(matches!(Decoder::default().events(&"h".into(), batch), Err(WireError::StringOutOfOrder { .. })));
    }

    #[test]
    fn a_call_costs_a_few_dozen_bytes() {
        let sent: Vec<Event> = (0..1000).map(|_| events("h")[0].clone()).collect();
        let mut encoder = Encoder::default();
        encoder.batch(0, &sent[..1]);
        let bytes = postcard::to_stdvec(&encoder.batch(1, &sent)).unwrap();
        assert!(bytes.len() < 1000 * 24, "{} bytes for 1000 calls", bytes.len());
    }
}
