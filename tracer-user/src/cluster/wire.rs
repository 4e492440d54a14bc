//! Events on the wire between an agent and a collector: postcard (compact varints, no field
//! names), with the strings that repeat on every event (function, module) sent once per connection
//! and referred to by number afterwards.

use std::{collections::HashMap, sync::Arc};

use serde::{Deserialize, Serialize};

use crate::event::Event;

/// A batch of events, numbered: `first_seq` is the sequence number of the first (an agent numbers
/// every event of a trace, so that a resumed connection neither repeats nor skips any).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventBatch {
    pub first_seq: u64,
    /// Strings introduced by this batch: (number, text).
    pub strings: Vec<(u32, String)>,
    /// The events, their names as numbers into the connection's string table (their host is the
    /// connection's).
    pub events: Vec<Event<u32>>,
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

    /// Encodes events as a batch starting at `first_seq`. Flow links are not sent: the collector
    /// links flows across hosts itself.
    pub fn batch<'a>(&mut self, first_seq: u64, events: impl IntoIterator<Item = &'a Event>) -> EventBatch {
        let mut strings = Vec::new();
        let events = events
            .into_iter()
            .map(|e| {
                let mut e = e.clone();
                e.data.clear_flow_links();
                let Ok(wire) = e.map_names(|name| Ok::<_, std::convert::Infallible>(self.number(&name, &mut strings)));
                wire
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
                let mut e = w.map_names(|n| self.string(n))?;
                e.host = host.clone();
                Ok(e)
            })
            .collect()
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
        let batch = Encoder::default().batch(0, &sent);
        let bytes = postcard::to_stdvec(&batch).unwrap();
        let received = Decoder::default().events(&"h".into(), postcard::from_bytes(&bytes).unwrap()).unwrap();
        assert_eq!(received, sent);
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
        // A call without source-level values (those cross as JSON text).
        let mut call = events("h")[0].clone();
        if let EventData::Call(c) = &mut call.data {
            (c.params, c.file, c.line) = (Default::default(), None, None);
        }
        let sent: Vec<Event> = (0..1000).map(|_| call.clone()).collect();
        let mut encoder = Encoder::default();
        encoder.batch(0, &sent[..1]);
        let bytes = postcard::to_stdvec(&encoder.batch(1, &sent)).unwrap();
        assert!(bytes.len() < 1000 * 24, "{} bytes for 1000 calls", bytes.len());
    }
}
