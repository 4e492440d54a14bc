//! Events on the wire between an agent and a collector: postcard (compact varints, no field
//! names), with the strings that repeat on every event (function, module) numbered once per trace
//! and sent once per connection, referred to by number afterwards.
//!
//! The agent encodes each event once, when it is recorded ([`Encoder::encode`]): its outbox keeps
//! those bytes until the collector acknowledges them, and a batch on the wire is a run of them as
//! they are (no decoding, cloning or re-encoding on the way out).

use std::{collections::HashMap, sync::Arc};

use serde::{Deserialize, Serialize};

use crate::event::Event;

/// A batch of events, numbered: `first_seq` is the sequence number of the first (an agent numbers
/// every event of a trace, so that a resumed connection neither repeats nor skips any).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventBatch {
    pub first_seq: u64,
    /// Strings introduced by this batch: (number, text), numbered from 0 on each connection. At
    /// most [`MAX_STRINGS_PER_BATCH`] (decoding keeps one more, for [`Decoder::events`] to refuse).
    #[serde(deserialize_with = "strings_of_a_batch")]
    pub strings: Vec<(u32, String)>,
    /// The events, each a postcard `Event<u32>` (its names as numbers into the string table, its
    /// host the connection's), one after the other. A byte string on the wire (serde_bytes), so
    /// that it is copied as one block rather than byte by byte.
    #[serde(with = "serde_bytes")]
    pub events: Vec<u8>,
}

/// Strings one batch introduces, at most: each costs a `String` and its slot (32 bytes) however
/// short it is on the wire, so an 8 MiB frame of empty strings would otherwise decode into
/// hundreds of megabytes. An agent sends a resumed connection's table in batches of at most this
/// many.
pub const MAX_STRINGS_PER_BATCH: usize = 1 << 16;
/// Events in one batch, at most: an agent sends at most one outbox chunk
/// ([`super::outbox::CHUNK_BYTES`]) per batch, and no event is shorter than a few bytes; a
/// collector holds one batch's events at a time, about 300 bytes each.
pub const MAX_EVENTS_PER_BATCH: usize = super::outbox::CHUNK_BYTES / 2;
/// One string of the table (a function, module or provider name), at most.
pub const MAX_STRING_BYTES: usize = 64 << 10;
/// An agent's string table on one connection, at most (text, plus 32 bytes an entry): the only
/// thing a collector keeps of what an agent sends, besides the events it spills to disk.
pub const MAX_TABLE_BYTES: usize = 64 << 20;
/// One event's encoded bytes, at most: its strings (file names, payloads of at most 4 KiB,
/// parameters of at most 4 KiB each, log messages) fit many times over.
pub const MAX_EVENT_BYTES: usize = 1 << 20;
/// What an entry of the table costs besides its text.
const ENTRY_BYTES: usize = 32;

fn strings_of_a_batch<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<(u32, String)>, D::Error> {
    super::bounded::keep_at_most(d, MAX_STRINGS_PER_BATCH + 1)
}

/// Strings recently numbered, by address: a hit costs a pointer comparison instead of hashing the
/// text. The entries hold their strings, so an address cannot be reused by another string while
/// it is here.
const RECENT: usize = 4;

/// The sending side of a trace's string table: numbers names in order of first use, and encodes
/// events with their names as those numbers.
#[derive(Default)]
pub struct Encoder {
    numbers: HashMap<Arc<str>, u32>,
    strings: Vec<Arc<str>>,
    recent: Vec<(Arc<str>, u32)>,
    next_recent: usize,
}

impl Encoder {
    fn number(&mut self, s: Arc<str>) -> u32 {
        if let Some((_, n)) = self.recent.iter().find(|(r, _)| Arc::ptr_eq(r, &s)) {
            return *n;
        }
        let n = match self.numbers.get(&s) {
            Some(&n) => n,
            None => {
                let n = self.strings.len() as u32;
                self.numbers.insert(s.clone(), n);
                self.strings.push(s.clone());
                n
            }
        };
        if self.recent.len() < RECENT {
            self.recent.push((s, n));
        } else {
            self.recent[self.next_recent] = (s, n);
            self.next_recent = (self.next_recent + 1) % RECENT;
        }
        n
    }

    /// Appends `event` to `out`, stamped `ts` (the agent's clock, skewed in tests); returns its
    /// length.
    pub fn encode(&mut self, event: &Event, ts: u64, out: &mut Vec<u8>) -> usize {
        let mut e = event.clone();
        e.ts = ts;
        let Ok(wire) = e.map_names(|name| Ok::<_, std::convert::Infallible>(self.number(name)));
        let before = out.len();
        postcard::to_io(&wire, &mut *out).expect("writing to a Vec cannot fail");
        out.len() - before
    }

    /// Every string numbered so far, by number.
    pub fn strings(&self) -> &[Arc<str>] {
        &self.strings
    }
}

/// The receiving side of a connection's string table.
#[derive(Default)]
pub struct Decoder {
    strings: Vec<Arc<str>>,
    /// What `strings` holds, as [`MAX_TABLE_BYTES`] counts it.
    table_bytes: usize,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("string number {0} was never defined")]
    UnknownString(u32),
    #[error("string number {got} defined out of order (expected {expected})")]
    StringOutOfOrder { got: u32, expected: u32 },
    #[error("malformed event: {0}")]
    Malformed(String),
    #[error("a batch introduces more than {MAX_STRINGS_PER_BATCH} strings")]
    TooManyStrings,
    #[error("string number {number} is {len} bytes long, more than {MAX_STRING_BYTES}")]
    StringTooLong { number: u32, len: usize },
    #[error("the agent's string table would exceed {} MiB", MAX_TABLE_BYTES >> 20)]
    TableTooLarge,
    #[error("a batch holds more than {MAX_EVENTS_PER_BATCH} events")]
    TooManyEvents,
    #[error("event #{index} of a batch is {len} bytes long, more than {MAX_EVENT_BYTES}")]
    EventTooLong { index: usize, len: usize },
}

impl WireError {
    /// Whether the agent sent more than a collector holds (rather than bytes that make no sense).
    pub fn is_bound(&self) -> bool {
        matches!(
            self,
            WireError::TooManyStrings
                | WireError::StringTooLong { .. }
                | WireError::TableTooLarge
                | WireError::TooManyEvents
                | WireError::EventTooLong { .. }
        )
    }
}

impl Decoder {
    pub fn reset(&mut self) {
        self.strings = Vec::new();
        self.table_bytes = 0;
    }

    fn string(&self, n: u32) -> Result<Arc<str>, WireError> {
        self.strings.get(n as usize).cloned().ok_or(WireError::UnknownString(n))
    }

    /// Decodes a batch from `host`; a batch naming a string it never defined, whose bytes are
    /// not whole events, or that breaks a bound (strings, the table, events, an event's length) is
    /// rejected whole.
    pub fn events(&mut self, host: &Arc<str>, batch: EventBatch) -> Result<Vec<Event>, WireError> {
        if batch.strings.len() > MAX_STRINGS_PER_BATCH {
            return Err(WireError::TooManyStrings);
        }
        for (n, s) in batch.strings {
            if n as usize != self.strings.len() {
                return Err(WireError::StringOutOfOrder { got: n, expected: self.strings.len() as u32 });
            }
            if s.len() > MAX_STRING_BYTES {
                return Err(WireError::StringTooLong { number: n, len: s.len() });
            }
            self.table_bytes += s.len() + ENTRY_BYTES;
            if self.table_bytes > MAX_TABLE_BYTES {
                return Err(WireError::TableTooLarge);
            }
            self.strings.push(Arc::from(s));
        }
        let mut rest = &batch.events[..];
        let mut events = Vec::new();
        while !rest.is_empty() {
            if events.len() == MAX_EVENTS_PER_BATCH {
                return Err(WireError::TooManyEvents);
            }
            let (w, tail): (Event<u32>, _) =
                postcard::take_from_bytes(rest).map_err(|e| WireError::Malformed(e.to_string()))?;
            let len = rest.len() - tail.len();
            if len > MAX_EVENT_BYTES {
                return Err(WireError::EventTooLong { index: events.len(), len });
            }
            rest = tail;
            let mut e = w.map_names(|n| self.string(n))?;
            e.host = host.clone();
            // The collector makes the trace's flow links, across hosts: links an agent made for
            // its own OTLP exporter are not the trace's, nor is anything an agent says in their
            // place.
            e.data.clear_flow_links();
            events.push(e);
        }
        Ok(events)
    }
}

/// A batch for a connection that has been sent `strings[..sent]` already: the rest of the
/// strings, and `events` (bytes from [`Encoder::encode`]) starting at `first_seq`.
pub fn batch(first_seq: u64, strings: &[Arc<str>], sent: usize, events: &[u8]) -> EventBatch {
    EventBatch {
        first_seq,
        strings: strings.iter().enumerate().skip(sent).map(|(n, s)| (n as u32, s.to_string())).collect(),
        events: events.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Channel, EventData, SignalId, SpawnHow, Syscall, data};

    fn events(host: &str) -> Vec<Event> {
        let ev = |data| Event { ts: 10, host: host.into(), pid: 1, tid: 2, data };
        vec![
            ev(EventData::Call(data::Call {
                function: "fib".into(),
                module: "/bin/app".into(),
                args: [1, 2, 3, 4, 5, 6].into(),
                goid: None,
                // Source-level values cross as JSON text, in declaration order.
                params: data::Params(vec![
                    ("n".into(), data::SourceValue(serde_json::json!(1))),
                    ("name".into(), data::SourceValue(serde_json::json!({"string": "al", "truncated": true}))),
                    ("a".into(), data::SourceValue(serde_json::json!(null))),
                ]),
                file: Some("src/fib.c".into()),
                line: Some(12),
            })),
            ev(EventData::Return(data::Return {
                function: "fib".into(),
                module: "/bin/app".into(),
                retval: 8,
                duration_ns: Some(4),
                goid: None,
                ret: Some(data::SourceValue(serde_json::json!(-8))),
                unwound: None,
                tail_call: None,
            })),
            ev(EventData::Call(data::Call {
                function: "main.work".into(),
                module: "/bin/gof".into(),
                args: [1, 2, 3, 4, 5, 6, 7, 8, 9].into(),
                goid: Some(18),
                params: Default::default(),
                file: None,
                line: None,
            })),
            ev(EventData::Return(data::Return {
                function: "main.work".into(),
                module: "/bin/gof".into(),
                retval: 2,
                duration_ns: Some(5),
                goid: Some(18),
                ret: None,
                unwound: None,
                tail_call: None,
            })),
            ev(EventData::Spawn(data::Spawn {
                parent_pid: 1,
                child_pid: 3,
                child_tid: 3,
                how: SpawnHow::Fork,
                comm: "app".into(),
                filename: None,
            })),
            ev(EventData::Exit(data::Exit { exit_code: None, signal: Some(9), thread: false, comm: "app".into() })),
            ev(EventData::Send(data::Send {
                channel: Channel::Tcp { src: "10.0.0.1:1".parse().unwrap(), dst: "10.0.0.2:2".parse().unwrap() },
                fd: 3,
                bytes: 100,
                syscall: Syscall::Write,
                flow_id: 0,
                syscall_ns: 5,
                seq: Some(77),
                digest: None,
                payload: None,
                payload_truncated: None,
            })),
            ev(EventData::Recv(data::Recv {
                channel: Channel::UnixDgram { id: None, path: Some("/s".into()) },
                fd: 4,
                bytes: 9,
                syscall: Syscall::Recvmsg,
                flow_ids: vec![],
                syscall_ns: 5,
                seq: None,
                digest: Some(99),
                payload: None,
                payload_truncated: None,
                peek: false,
                discarded: None,
            })),
            ev(EventData::Signal(data::Signal {
                signal: SignalId::new(10),
                sender_pid: 1,
                target_pid: 3,
                target_tid: 3,
                delivered: false,
                flow_id: None,
                group: true,
                queued: true,
            })),
        ]
    }

    /// Encodes `events` (their own timestamps) with `encoder`.
    fn encode(encoder: &mut Encoder, events: &[Event]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for e in events {
            encoder.encode(e, e.ts, &mut bytes);
        }
        bytes
    }

    #[test]
    fn round_trips_through_postcard_with_each_string_sent_once() {
        let sent = events("h");
        let mut encoder = Encoder::default();
        let bytes = encode(&mut encoder, &sent);
        let first = batch(42, encoder.strings(), 0, &bytes);
        assert_eq!(
            first.strings,
            [
                (0, "fib".to_string()),
                (1, "/bin/app".to_string()),
                (2, "main.work".to_string()),
                (3, "/bin/gof".to_string())
            ]
        );
        let wire = postcard::to_stdvec(&first).unwrap();
        let sent_strings = encoder.strings().len();
        let bytes = encode(&mut encoder, &sent[..2]);
        let again = batch(49, encoder.strings(), sent_strings, &bytes);
        assert!(again.strings.is_empty(), "strings already sent are not sent again");
        let mut decoder = Decoder::default();
        let host: Arc<str> = "h".into();
        let received = decoder.events(&host, postcard::from_bytes(&wire).unwrap()).unwrap();
        assert_eq!(received, sent);
        assert_eq!(decoder.events(&host, again).unwrap(), sent[..2]);
    }

    #[test]
    fn links_an_agent_sends_are_dropped_on_arrival() {
        // An agent with an OTLP exporter links its own flows; the collector links the trace's.
        let unlinked = events("h");
        let mut linked = unlinked.clone();
        for e in &mut linked {
            match &mut e.data {
                EventData::Send(s) => s.flow_id = 7,
                EventData::Recv(r) => r.flow_ids = vec![7, 8],
                EventData::Signal(s) => s.flow_id = Some(9),
                _ => {}
            }
        }
        assert_ne!(linked, unlinked);
        let mut encoder = Encoder::default();
        let bytes = encode(&mut encoder, &linked);
        let received = Decoder::default().events(&"h".into(), batch(0, encoder.strings(), 0, &bytes)).unwrap();
        assert_eq!(received, unlinked);
    }

    #[test]
    fn log_and_usdt_events_round_trip() {
        let ev = |data| Event { ts: 5, host: "h".into(), pid: 1, tid: 2, data };
        let sent = vec![
            ev(EventData::Log(data::Log {
                log_type: data::LogType::Log,
                level: data::Level::Warn,
                source: Some("app::db".into()),
                message: "slow".into(),
                function: None,
                file: Some("src/db.rs".into()),
                line: Some(12),
                spans: vec!["outer".into()],
                data: serde_json::json!({"rows": 3, "peer": "a", "list": [1, -2]}),
                truncated: false,
            })),
            ev(EventData::Usdt(data::Usdt {
                provider: "fixture".into(),
                name: "loop".into(),
                module: "/bin/app".into(),
                args: vec![Some(data::ArgValue::Signed(-3)), Some(data::ArgValue::Unsigned(u64::MAX)), None],
            })),
        ];
        let mut encoder = Encoder::default();
        let bytes = encode(&mut encoder, &sent);
        let bytes = postcard::to_stdvec(&batch(0, encoder.strings(), 0, &bytes)).unwrap();
        let received = Decoder::default().events(&"h".into(), postcard::from_bytes(&bytes).unwrap()).unwrap();
        assert_eq!(received, sent);
    }

    #[test]
    fn undefined_strings_are_rejected() {
        let mut encoder = Encoder::default();
        let bytes = encode(&mut encoder, &events("h")[..1]);
        let mut b = batch(0, encoder.strings(), 0, &bytes);
        b.strings.clear();
        assert_eq!(Decoder::default().events(&"h".into(), b).unwrap_err(), WireError::UnknownString(0));
        let mut b = batch(0, encoder.strings(), 0, &bytes);
        b.strings[0].0 = 5;
        assert!(matches!(Decoder::default().events(&"h".into(), b), Err(WireError::StringOutOfOrder { .. })));
    }

    #[test]
    fn bytes_that_are_not_whole_events_are_rejected() {
        let mut encoder = Encoder::default();
        let bytes = encode(&mut encoder, &events("h")[..2]);
        let b = batch(0, encoder.strings(), 0, &bytes[..bytes.len() - 1]);
        assert!(matches!(Decoder::default().events(&"h".into(), b), Err(WireError::Malformed(_))));
    }

    #[test]
    fn what_an_agent_can_make_a_collector_hold_is_bounded() {
        let host: Arc<str> = "h".into();
        // A frame of empty strings: one byte more than the bound is kept, and refused.
        let empties = EventBatch {
            first_seq: 0,
            strings: (0..MAX_STRINGS_PER_BATCH as u32 * 4).map(|n| (n, String::new())).collect(),
            events: Vec::new(),
        };
        let bytes = postcard::to_stdvec(&empties).unwrap();
        let decoded: EventBatch = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(decoded.strings.len(), MAX_STRINGS_PER_BATCH + 1);
        assert_eq!(Decoder::default().events(&host, decoded).unwrap_err(), WireError::TooManyStrings);
        let long =
            EventBatch { first_seq: 0, strings: vec![(0, "x".repeat(MAX_STRING_BYTES + 1))], events: Vec::new() };
        assert_eq!(
            Decoder::default().events(&host, long).unwrap_err().to_string(),
            "string number 0 is 65537 bytes long, more than 65536"
        );
        // The table, over batches: 64 MiB of text and entries, then refused.
        let mut decoder = Decoder::default();
        let mut next = 0u32;
        let err = loop {
            let strings = (0..64).map(|i| (next + i, "s".repeat(MAX_STRING_BYTES - 32))).collect();
            next += 64;
            match decoder.events(&host, EventBatch { first_seq: 0, strings, events: Vec::new() }) {
                Ok(_) => assert!(next < 2048, "the table grows past its bound"),
                Err(e) => break e,
            }
        };
        assert_eq!(err.to_string(), "the agent's string table would exceed 64 MiB");
        assert!(err.is_bound());
        assert_eq!(next, 1024 + 64, "64 MiB is 1024 strings of 64 KiB");
        // Too many events in one batch.
        let mut encoder = Encoder::default();
        let mut exit = events("h")[5].clone();
        exit.ts = 0;
        let one = encode(&mut encoder, &[exit]);
        let many = one.repeat(MAX_EVENTS_PER_BATCH + 1);
        let b = batch(0, encoder.strings(), 0, &many);
        assert_eq!(Decoder::default().events(&host, b).unwrap_err(), WireError::TooManyEvents);
        let b = batch(0, encoder.strings(), 0, &one.repeat(MAX_EVENTS_PER_BATCH));
        assert_eq!(Decoder::default().events(&host, b).unwrap().len(), MAX_EVENTS_PER_BATCH);
    }

    #[test]
    fn a_call_costs_a_few_dozen_bytes() {
        // A call without source-level values (those cross as JSON text).
        let mut call = events("h")[0].clone();
        if let EventData::Call(c) = &mut call.data {
            (c.params, c.file, c.line) = (Default::default(), None, None);
        }
        let sent: Vec<Event> = (0..1000).map(|_| call.clone()).collect();
        let mut encoder = Encoder::default();
        encode(&mut encoder, &sent[..1]);
        let sent_strings = encoder.strings().len();
        let bytes = encode(&mut encoder, &sent);
        let bytes = postcard::to_stdvec(&batch(1, encoder.strings(), sent_strings, &bytes)).unwrap();
        assert!(bytes.len() < 1000 * 24, "{} bytes for 1000 calls", bytes.len());
    }
}
