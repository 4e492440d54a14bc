//! The native trace format (`.trc`): compact, written as a stream, read back losslessly.
//!
//! A file is a header (the 8 bytes [`MAGIC`], then the format [`VERSION`] as a little-endian
//! `u32`), then batches. Each batch is framed as `payload length (u32 LE)`, `CRC-32 of the
//! payload (u32 LE)`, then the payload, whose first byte says what it holds:
//!
//! - [`START`] / [`END`]: the trace's `trace_start` / `trace_end` as its JSON line (once per
//!   trace, so their size does not matter, and they stay exactly what JSON lines say).
//! - [`EVENTS`]: the strings this batch adds to the file's string table (a count, then each as a
//!   length and UTF-8 bytes; numbered in order of appearance over the whole file), then a count of
//!   events and the events.
//!
//! An event starts with a tag byte: its kind (bits 0-2: call, return, or another kind), whether
//! its host changed (then the host's string number follows), whether it is on the same thread as
//! the previous event (else its pid and tid follow), whether a call or return names the same
//! function and module as the previous call or return (else their string numbers follow), whether
//! it has a goroutine, and whether a return has a duration. Then its timestamp as the zigzag
//! difference from the previous event's; a call's arguments as a length and a bit mask of the
//! registers that differ from the same thread's previous call in the batch, each as a zigzag
//! difference; a return's value zigzag-encoded (so that -1 is one byte) and its duration. The
//! other kinds (spawn, exit, send, recv, signal; rare) are their postcard encoding, as on the wire.
//! Integers are LEB128 varints. Every context (previous timestamp, thread, names, arguments) is
//! reset at each batch, so that a batch only needs the string table of those before it.
//!
//! The layout of calls and returns is written by hand rather than with postcard because the
//! savings come from context across events (time deltas, same thread, unchanged registers), which
//! a per-value encoding cannot see: a call or return costs 6-10 bytes instead of about 40.
//!
//! Writing buffers one batch (at most [`FLUSH_EVENTS`] events or about [`FLUSH_BYTES`] bytes, and
//! whatever [`Sink::flush`] asks for, which `record` calls on its flush interval), so memory does
//! not grow with the trace. A writer killed mid-batch leaves a short or corrupt last batch: the
//! reader stops there and says so ([`crate::trace::read::ItemReader::torn`]), losing that batch only. Every length,
//! count and string number read is checked against [`MAX_BATCH_BYTES`], [`MAX_STRING_BYTES`],
//! [`MAX_TABLE_BYTES`] and what the batch actually holds before it is used.

use std::{
    collections::HashMap,
    io::{self, BufWriter, Write},
    sync::Arc,
};

use crate::{
    event::{Args, Event, EventData, MAX_ARGS, TraceEnd, TraceStart, data, json::Line},
    sink::Sink,
};

/// The first bytes of a native trace (PNG-style: a non-ASCII byte, a name, a newline).
pub const MAGIC: &[u8; 8] = b"\x89TRACER\n";
/// Version of the native format, after the magic. 2: receives carry `peek` and `discarded`, returns
/// `unwound` and `tail_call` (their postcard encoding grew; a version 1 file is refused, not
/// misread). 3: `trace_end` carries `unmatched_functions`.
pub const VERSION: u32 = 3;

/// Payload kinds.
pub const START: u8 = 0;
pub const EVENTS: u8 = 1;
pub const END: u8 = 2;

/// A batch is written once it has this many events...
pub const FLUSH_EVENTS: usize = 8192;
/// ... or this many bytes.
pub const FLUSH_BYTES: usize = 1 << 20;
/// Largest payload a reader accepts (and a writer writes).
pub const MAX_BATCH_BYTES: usize = 64 << 20;
/// Longest string (a function, module or host name).
pub const MAX_STRING_BYTES: usize = 1 << 20;
/// Most bytes of strings a file's table may hold.
pub const MAX_TABLE_BYTES: usize = 256 << 20;

pub(crate) const KIND_MASK: u8 = 0b111;
pub(crate) const KIND_CALL: u8 = 0;
pub(crate) const KIND_RETURN: u8 = 1;
pub(crate) const KIND_OTHER: u8 = 2;
pub(crate) const NEW_HOST: u8 = 1 << 3;
pub(crate) const SAME_THREAD: u8 = 1 << 4;
pub(crate) const SAME_NAMES: u8 = 1 << 5;
pub(crate) const GOID: u8 = 1 << 6;
pub(crate) const DURATION: u8 = 1 << 7;

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

pub(crate) fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

/// What each batch's events are encoded against; reset at every batch.
#[derive(Default)]
pub(crate) struct Context {
    pub(crate) ts: u64,
    pub(crate) host: Option<u32>,
    pub(crate) thread: Option<(u32, u32)>,
    pub(crate) names: Option<(u32, u32)>,
    pub(crate) args: ThreadArgs,
}

/// Each thread's registers at its last call, which its next call is encoded against.
///
/// Asked at every call: the last thread's are found without hashing (calls come in long runs on
/// one thread), others through an FNV map of tids (not chosen by an attacker of this map: a trace
/// holds few threads, and a hostile one only slows its own reading).
#[derive(Default)]
pub(crate) struct ThreadArgs {
    slots: fnv::FnvHashMap<u32, usize>,
    values: Vec<[u64; MAX_ARGS]>,
    last: Option<(u32, usize)>,
}

impl ThreadArgs {
    pub(crate) fn of(&mut self, tid: u32) -> &mut [u64; MAX_ARGS] {
        let slot = match self.last {
            Some((t, slot)) if t == tid => slot,
            _ => {
                let next = self.values.len();
                let slot = *self.slots.entry(tid).or_insert(next);
                if slot == next {
                    self.values.push([0; MAX_ARGS]);
                }
                self.last = Some((tid, slot));
                slot
            }
        };
        &mut self.values[slot]
    }
}

/// Writes a trace in the native format.
pub struct NativeWriter<W: Write> {
    out: BufWriter<W>,
    header_written: bool,
    numbers: HashMap<Arc<str>, u32>,
    table_bytes: usize,
    new_strings: Vec<u8>,
    new_count: u64,
    events: Vec<u8>,
    event_count: u64,
    context: Context,
}

impl<W: Write> NativeWriter<W> {
    pub fn new(out: W) -> Self {
        NativeWriter {
            out: BufWriter::with_capacity(1 << 20, out),
            header_written: false,
            numbers: HashMap::new(),
            table_bytes: 0,
            new_strings: Vec::new(),
            new_count: 0,
            events: Vec::with_capacity(FLUSH_BYTES + 4096),
            event_count: 0,
            context: Context::default(),
        }
    }

    fn frame(&mut self, payload: &[u8]) -> io::Result<()> {
        if payload.len() > MAX_BATCH_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a batch of {} bytes is more than the native format allows", payload.len()),
            ));
        }
        if !self.header_written {
            self.out.write_all(MAGIC)?;
            self.out.write_all(&VERSION.to_le_bytes())?;
            self.header_written = true;
        }
        self.out.write_all(&(payload.len() as u32).to_le_bytes())?;
        self.out.write_all(&crc32fast::hash(payload).to_le_bytes())?;
        self.out.write_all(payload)
    }

    fn json_batch(&mut self, kind: u8, line: Line) -> io::Result<()> {
        let mut payload = vec![kind];
        serde_json::to_writer(&mut payload, &line)?;
        self.frame(&payload)
    }

    fn number(&mut self, s: &Arc<str>) -> io::Result<u32> {
        if let Some(&n) = self.numbers.get(s) {
            return Ok(n);
        }
        if s.len() > MAX_STRING_BYTES || self.table_bytes + s.len() > MAX_TABLE_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a name of {} bytes does not fit the native format's string table", s.len()),
            ));
        }
        let n = self.numbers.len() as u32;
        self.numbers.insert(s.clone(), n);
        self.table_bytes += s.len();
        put_varint(&mut self.new_strings, s.len() as u64);
        self.new_strings.extend_from_slice(s.as_bytes());
        self.new_count += 1;
        Ok(n)
    }

    /// Writes the batch of events buffered so far, if any.
    fn write_batch(&mut self) -> io::Result<()> {
        if self.event_count == 0 && self.new_count == 0 {
            return Ok(());
        }
        let mut payload = Vec::with_capacity(self.new_strings.len() + self.events.len() + 21);
        payload.push(EVENTS);
        put_varint(&mut payload, self.new_count);
        payload.extend_from_slice(&self.new_strings);
        put_varint(&mut payload, self.event_count);
        payload.extend_from_slice(&self.events);
        self.frame(&payload)?;
        self.new_strings.clear();
        self.new_count = 0;
        self.events.clear();
        self.event_count = 0;
        self.context = Context::default();
        Ok(())
    }

    fn encode(&mut self, e: &Event) -> io::Result<()> {
        let compact = Compact::of(&e.data);
        let mut tag = match compact {
            Some(Compact::Call { .. }) => KIND_CALL,
            Some(Compact::Return { .. }) => KIND_RETURN,
            None => KIND_OTHER,
        };
        let host = self.number(&e.host)?;
        let names = match compact {
            Some(Compact::Call { function, module, .. } | Compact::Return { function, module, .. }) => {
                Some((self.number(function)?, self.number(module)?))
            }
            None => None,
        };
        // The other kinds, and calls and returns with source-level values: postcard, as on the
        // wire.
        let other = match compact {
            Some(_) => None,
            None => Some(e.data.clone().map_names(|name| self.number(&name))?),
        };
        let new_host = self.context.host != Some(host);
        if new_host {
            tag |= NEW_HOST;
        }
        let same_thread = self.context.thread == Some((e.pid, e.tid));
        if same_thread {
            tag |= SAME_THREAD;
        }
        let same_names = names.is_some() && names == self.context.names;
        if same_names {
            tag |= SAME_NAMES;
        }
        let goid = match compact {
            Some(Compact::Call { goid, .. } | Compact::Return { goid, .. }) => goid,
            None => None,
        };
        if goid.is_some() {
            tag |= GOID;
        }
        if let Some(Compact::Return { duration_ns: Some(_), .. }) = compact {
            tag |= DURATION;
        }
        let out = &mut self.events;
        out.push(tag);
        if new_host {
            put_varint(out, host as u64);
        }
        put_varint(out, zigzag(e.ts.wrapping_sub(self.context.ts) as i64));
        if !same_thread {
            put_varint(out, e.pid as u64);
            put_varint(out, e.tid as u64);
        }
        if let (Some((function, module)), false) = (names, same_names) {
            put_varint(out, function as u64);
            put_varint(out, module as u64);
        }
        match compact {
            Some(Compact::Call { args, .. }) => {
                let prev = self.context.args.of(e.tid);
                let args = args.as_slice();
                let mut mask = 0u64;
                for (i, (&v, p)) in args.iter().zip(prev.iter()).enumerate() {
                    if v != *p {
                        mask |= 1 << i;
                    }
                }
                put_varint(out, (mask << 4) | args.len() as u64);
                for (i, (&v, p)) in args.iter().zip(prev.iter_mut()).enumerate() {
                    if mask & (1 << i) != 0 {
                        put_varint(out, zigzag(v.wrapping_sub(*p) as i64));
                        *p = v;
                    }
                }
            }
            Some(Compact::Return { retval, duration_ns, .. }) => {
                put_varint(out, zigzag(retval as i64));
                if let Some(d) = duration_ns {
                    put_varint(out, d);
                }
            }
            None => {}
        }
        if let Some(g) = goid {
            put_varint(out, g);
        }
        if let Some(wire) = other {
            postcard::to_io(&wire, &mut *out).map_err(io::Error::other)?;
        }
        self.context.ts = e.ts;
        self.context.host = Some(host);
        self.context.thread = Some((e.pid, e.tid));
        if names.is_some() {
            self.context.names = names;
        }
        self.event_count += 1;
        Ok(())
    }
}

/// What the compact layout writes of a plain call or return ([`EventData::is_plain_call`]); a
/// call or return with values from DWARF (parameters, file, line, typed return), or marked
/// `unwound` or `tail_call`, is rare next to the register-only stream this layout is for, and
/// takes the general encoding.
#[derive(Clone, Copy)]
enum Compact<'a> {
    Call { function: &'a Arc<str>, module: &'a Arc<str>, args: &'a Args, goid: Option<u64> },
    Return { function: &'a Arc<str>, module: &'a Arc<str>, retval: u64, duration_ns: Option<u64>, goid: Option<u64> },
}

impl<'a> Compact<'a> {
    fn of(event: &'a EventData) -> Option<Compact<'a>> {
        if !event.is_plain_call() {
            return None;
        }
        // Every field is named (no `..`): a field added to `Call` or `Return` does not compile
        // here until this layout writes it (and the reader reads it) or `is_plain_call` sends
        // events that carry it to the general encoding.
        match event {
            EventData::Call(data::Call { function, module, args, goid, params: _, file: _, line: _ }) => {
                Some(Compact::Call { function, module, args, goid: *goid })
            }
            EventData::Return(data::Return {
                function,
                module,
                retval,
                duration_ns,
                goid,
                ret: _,
                unwound: _,
                tail_call: _,
            }) => Some(Compact::Return { function, module, retval: *retval, duration_ns: *duration_ns, goid: *goid }),
            _ => None,
        }
    }
}

impl<W: Write> Sink for NativeWriter<W> {
    fn begin(&mut self, start: &TraceStart) -> io::Result<()> {
        self.json_batch(START, Line::Start(start))
    }
    fn event(&mut self, event: &Event) -> io::Result<()> {
        self.encode(event)?;
        if self.event_count as usize >= FLUSH_EVENTS || self.events.len() >= FLUSH_BYTES {
            self.write_batch()?;
        }
        Ok(())
    }
    fn end(&mut self, end: &TraceEnd) -> io::Result<()> {
        self.write_batch()?;
        self.json_batch(END, Line::End(end))?;
        self.out.flush()
    }
    fn flush(&mut self) -> io::Result<()> {
        self.write_batch()?;
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        event::{Channel, SignalId, SpawnHow, Syscall, TraceItem, test_events},
        trace::read::{
            ItemReader, ReadError, Replayed,
            native::{NativeReader, is_native},
            replay,
        },
    };

    /// One event of every kind, on two hosts and several threads, with the values that stress
    /// the encoding: time going backwards, every bit of a register set, -1 returned, no duration.
    fn every_kind() -> Vec<Event> {
        use test_events::*;
        let ev = |ts, data| event_on("h2", ts, 7, 8, data);
        vec![
            call(1_000, 1, "f"),
            call(1_100, 1, "g"),
            ret(1_200, 1, "g", Some(100)),
            ret(1_150, 1, "f", None),
            call(1_300, 2, "f"),
            go_call(1_400, 3, 18, "main.work"),
            go_ret(1_500, 3, 18, "main.work", 100),
            event_on(
                "h2",
                u64::MAX,
                u32::MAX,
                u32::MAX,
                EventData::Return(data::Return {
                    function: "".into(),
                    module: "/bin/ünï".into(),
                    retval: u64::MAX,
                    duration_ns: Some(u64::MAX),
                    goid: Some(0),
                    ret: None,
                    unwound: None,
                    tail_call: None,
                }),
            ),
            ev(
                0,
                EventData::Call(data::Call {
                    function: "h".into(),
                    module: "m".into(),
                    args: [u64::MAX; 9].into(),
                    goid: None,
                    params: data::Params::default(),
                    file: None,
                    line: None,
                }),
            ),
            ev(
                5,
                EventData::Call(data::Call {
                    function: "h".into(),
                    module: "m".into(),
                    args: Args::default(),
                    goid: None,
                    params: data::Params::default(),
                    file: None,
                    line: None,
                }),
            ),
            ev(
                6,
                EventData::Spawn(data::Spawn {
                    parent_pid: 1,
                    child_pid: 3,
                    child_tid: 4,
                    how: SpawnHow::Exec,
                    comm: "app".into(),
                    filename: Some("/bin/app".into()),
                }),
            ),
            ev(7, EventData::Exit(data::Exit { exit_code: None, signal: Some(9), thread: false, comm: "app".into() })),
            ev(
                8,
                EventData::Send(data::Send {
                    channel: Channel::Tcp { src: "[::1]:1".parse().unwrap(), dst: "10.0.0.2:2".parse().unwrap() },
                    fd: -1,
                    bytes: 100,
                    syscall: Syscall::Sendmmsg,
                    flow_id: 12,
                    syscall_ns: 5,
                    seq: Some(77),
                    digest: None,
                    payload: None,
                    payload_truncated: None,
                }),
            ),
            ev(
                9,
                EventData::Recv(data::Recv {
                    channel: Channel::UnixStream { id: 1, to: 2, path: Some("/s".into()) },
                    fd: 4,
                    bytes: 9,
                    syscall: Syscall::Recvmsg,
                    flow_ids: vec![12, 13],
                    syscall_ns: 5,
                    seq: Some(1),
                    digest: Some(99),
                    payload: None,
                    payload_truncated: None,
                    peek: false,
                    discarded: None,
                }),
            ),
            ev(
                10,
                EventData::Signal(data::Signal {
                    signal: SignalId::new(10),
                    sender_pid: 1,
                    target_pid: 3,
                    target_tid: 3,
                    delivered: true,
                    flow_id: Some(4),
                    group: true,
                    queued: false,
                }),
            ),
        ]
    }

    fn write(events: &[Event], end: bool, flush_every: Option<usize>) -> Vec<u8> {
        let mut out = Vec::new();
        let mut w = NativeWriter::new(&mut out);
        w.begin(&test_events::start(500)).unwrap();
        for (i, e) in events.iter().enumerate() {
            w.event(e).unwrap();
            if flush_every.is_some_and(|n| (i + 1) % n == 0) {
                w.flush().unwrap();
            }
        }
        if end {
            w.end(&test_events::end(2_000)).unwrap();
        } else {
            w.flush().unwrap();
        }
        drop(w);
        out
    }

    fn read(bytes: &[u8]) -> (Result<Vec<TraceItem>, ReadError>, Option<String>) {
        let mut r = NativeReader::new(bytes);
        let items = r.by_ref().collect();
        (items, r.torn())
    }

    #[test]
    fn round_trips_every_kind() {
        let events = every_kind();
        for flush in [None, Some(1), Some(3)] {
            let bytes = write(&events, true, flush);
            assert!(is_native(&bytes));
            let (items, torn) = read(&bytes);
            let mut expected = vec![TraceItem::Start(Box::new(test_events::start(500)))];
            expected.extend(events.iter().cloned().map(TraceItem::Event));
            expected.push(TraceItem::End(test_events::end(2_000)));
            assert_eq!(items.unwrap(), expected, "flushing every {flush:?}");
            assert_eq!(torn, None);
        }
    }

    /// Calls and returns with values from DWARF take the general encoding, and come back whole,
    /// as do captured payloads.
    #[test]
    fn source_level_calls_and_payloads_round_trip() {
        let ev = |ts, data| test_events::event_on("h2", ts, 7, 8, data);
        let events = vec![
            ev(
                7,
                EventData::Call(data::Call {
                    function: "greet".into(),
                    module: "/bin/app".into(),
                    args: [1, 3].into(),
                    goid: None,
                    params: data::Params(vec![
                        ("name".into(), data::SourceValue(serde_json::json!("alice"))),
                        ("times".into(), data::SourceValue(serde_json::json!(3))),
                    ]),
                    file: Some("src/greet.c".into()),
                    line: Some(12),
                }),
            ),
            ev(
                8,
                EventData::Return(data::Return {
                    function: "greet".into(),
                    module: "/bin/app".into(),
                    retval: 0,
                    duration_ns: Some(1),
                    goid: None,
                    ret: Some(data::SourceValue(serde_json::json!({"string": "ok", "truncated": true}))),
                    unwound: None,
                    tail_call: None,
                }),
            ),
            ev(
                8,
                EventData::Return(data::Return {
                    function: "level2".into(),
                    module: "/bin/app".into(),
                    retval: 0,
                    duration_ns: Some(7),
                    goid: None,
                    ret: None,
                    unwound: Some(true),
                    tail_call: None,
                }),
            ),
            ev(
                8,
                EventData::Return(data::Return {
                    function: "tail".into(),
                    module: "/bin/app".into(),
                    retval: 0,
                    duration_ns: Some(3),
                    goid: None,
                    ret: None,
                    unwound: None,
                    tail_call: Some(true),
                }),
            ),
            ev(
                9,
                EventData::Send(data::Send {
                    channel: Channel::Tcp { src: "10.0.0.1:1".parse().unwrap(), dst: "10.0.0.2:2".parse().unwrap() },
                    fd: 3,
                    bytes: 100,
                    syscall: Syscall::Sendto,
                    flow_id: 1,
                    syscall_ns: 5,
                    seq: Some(77),
                    digest: None,
                    payload: Some(data::Payload(b"GET / HTTP/1.1\r\n\0\xff".to_vec())),
                    payload_truncated: Some(true),
                }),
            ),
        ];
        let (items, torn) = read(&write(&events, true, None));
        let items = items.unwrap();
        assert_eq!(items[1..events.len() + 1], events.iter().cloned().map(TraceItem::Event).collect::<Vec<_>>()[..]);
        assert_eq!(torn, None);
    }

    #[test]
    fn batches_are_bounded() {
        let events: Vec<Event> = (0..FLUSH_EVENTS as u64 * 2 + 5).map(|i| test_events::call(i * 10, 1, "f")).collect();
        let bytes = write(&events, true, None);
        let mut r = NativeReader::new(&bytes[..]);
        assert_eq!(r.by_ref().count(), events.len() + 2);
        // start, three of events, end.
        assert_eq!(r.batches(), 5);
    }

    /// Cut anywhere, a trace reads as the batches before the cut and says the rest is torn.
    #[test]
    fn a_torn_tail_loses_only_its_last_batch() {
        let events = every_kind();
        let bytes = write(&events, false, Some(4));
        let whole = read(&bytes).0.unwrap();
        // Where each batch ends.
        let mut ends = vec![12];
        while *ends.last().unwrap() < bytes.len() {
            let at = *ends.last().unwrap();
            ends.push(at + 8 + u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize);
        }
        assert_eq!(ends.len(), 6, "a header, a start and four batches of events");
        for cut in 12..bytes.len() {
            let (items, torn) = read(&bytes[..cut]);
            let items = items.unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
            assert_eq!(items[..], whole[..items.len()], "cut at {cut}");
            // What the whole batches before the cut hold, and nothing of the one cut.
            let last_whole = *ends.iter().rfind(|&&end| end <= cut).unwrap();
            assert_eq!(items.len(), read(&bytes[..last_whole]).0.unwrap().len(), "cut at {cut}");
            assert_eq!(torn.is_some(), last_whole != cut, "cut at {cut}");
            if torn.is_some() {
                assert!(torn.as_deref().unwrap().contains("cut short"), "{torn:?}");
            }
        }
        let r = NativeReader::new(&bytes[..bytes.len() - 1]);
        let mut sink = crate::export::jsonl::JsonlWriter::new(Vec::new());
        let replayed = replay(r, &mut sink).unwrap();
        assert_eq!(
            replayed,
            Replayed { events: 12, end_missing: true, torn: Some("batch 5 is cut short (88 of 89 bytes)".into()) }
        );
    }

    #[test]
    fn a_corrupt_batch_ends_the_trace_there() {
        let bytes = write(&every_kind(), true, Some(4));
        let mut bad = bytes.clone();
        let n = bad.len();
        bad[n - 3] ^= 0x40;
        let (items, torn) = read(&bad);
        assert_eq!(items.unwrap().len(), every_kind().len() + 1);
        assert_eq!(torn.as_deref(), Some("batch 6 fails its checksum"));
    }

    /// A batch with a valid checksum but lying contents is an error naming the batch.
    fn framed(payload: &[u8]) -> Vec<u8> {
        let mut bytes = write(&[], false, None);
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        bytes.extend_from_slice(payload);
        bytes
    }

    fn error_of(payload: &[u8]) -> String {
        read(&framed(payload)).0.unwrap_err().to_string()
    }

    #[test]
    fn lying_batches_are_rejected() {
        assert_eq!(error_of(&[]), "batch 2: an empty batch");
        assert_eq!(error_of(&[9]), "batch 2: unknown batch kind 9");
        assert_eq!(error_of(&[EVENTS, 0xff, 0xff, 0xff, 0x7f]), "batch 2: 268435455 strings claimed in 0 bytes");
        assert_eq!(error_of(&[EVENTS, 1, 0xff, 0xff, 0x7f]), "batch 2: a string of 2097151 bytes, more than 1048576");
        assert_eq!(error_of(&[EVENTS, 1, 5, b'a']), "batch 2: a string runs past its batch");
        assert_eq!(error_of(&[EVENTS, 1, 2, 0xff, 0xfe, 0]), "batch 2: a string is not UTF-8");
        assert_eq!(error_of(&[EVENTS, 0, 100, 0]), "batch 2: 100 events claimed in 1 bytes");
        assert_eq!(error_of(&[EVENTS, 0, 1, NEW_HOST, 3, 0]), "batch 2: string number 3 was never defined");
        assert_eq!(error_of(&[EVENTS, 1, 1, b'h', 1, 0, 0]), "batch 2: an event names no host");
        assert_eq!(
            error_of(&[EVENTS, 1, 1, b'h', 1, NEW_HOST | SAME_THREAD, 0, 0]),
            "batch 2: an event on the same thread as none"
        );
        let tagged = |tag: u8, rest: &[u8]| [&[EVENTS, 1, 1, b'h', 1, NEW_HOST | tag, 0, 0, 1, 1][..], rest].concat();
        let with = |rest: &[u8]| tagged(0, rest);
        assert_eq!(error_of(&with(&[0xff; 11])), "batch 2: a number is longer than 64 bits");
        let pid = [EVENTS, 1, 1, b'h', 1, NEW_HOST, 0, 0, 0x80, 0x80, 0x80, 0x80, 0x10];
        assert_eq!(error_of(&pid), "batch 2: a pid 4294967296 is more than 32 bits");
        assert_eq!(error_of(&tagged(SAME_NAMES, &[])), "batch 2: a call with the same names as none");
        assert_eq!(error_of(&with(&[0, 0, 0x1a])), "batch 2: argument spec 0x1a is out of range");
        assert_eq!(error_of(&with(&[0, 0, 0x21])), "batch 2: argument spec 0x21 is out of range");
        assert_eq!(error_of(&with(&[0, 0, 0, 0])), "batch 2: 1 bytes after the last event");
        let other = [EVENTS, 1, 1, b'h', 1, NEW_HOST | KIND_OTHER, 0, 0, 1, 1];
        let call = EventData::<u32>::Call(data::Call {
            function: 0,
            module: 0,
            args: Args::default(),
            goid: None,
            params: data::Params::default(),
            file: None,
            line: None,
        });
        let call = postcard::to_stdvec(&call).unwrap();
        assert_eq!(error_of(&[&other[..], &call].concat()), "batch 2: a call or return encoded as another kind");
        assert!(error_of(&[&other[..], &[9]].concat()).starts_with("batch 2: an event does not decode"));
        assert_eq!(error_of(&[START, b'{']), "batch 2: EOF while parsing an object at line 1 column 1");
        let end = serde_json::to_vec(&Line::End(&test_events::end(1))).unwrap();
        assert_eq!(error_of(&[&[START], &end[..]].concat()), "batch 2: its JSON line is not of the batch's kind");
    }

    #[test]
    fn headers_and_frames_are_checked() {
        assert!(matches!(read(b"").0, Err(ReadError::Empty)));
        assert_eq!(
            read(b"\x89TRACER\n\x01\0\0\0").0.unwrap_err().to_string(),
            "not a native trace: native format version 1, this tracer reads 3"
        );
        assert_eq!(
            read(b"\x89TRACE").0.unwrap_err().to_string(),
            "not a native trace: it does not start with the native magic"
        );
        let mut huge = write(&[], false, None);
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        huge.extend_from_slice(&[0; 4]);
        let (items, torn) = read(&huge);
        assert_eq!(items.unwrap().len(), 1);
        assert_eq!(torn.unwrap(), "batch 2 claims 4294967295 bytes, more than 67108864");
    }

    /// The goal set by uftrace: at most 16 bytes an event on a call/return stream.
    #[test]
    fn a_call_or_return_costs_a_few_bytes() {
        let mut events = Vec::new();
        for i in 0..1000u64 {
            let ts = i * 1_000;
            let mut c = test_events::call(ts, 1 + (i % 2) as u32, if i % 3 == 0 { "f" } else { "g" });
            if let EventData::Call(call) = &mut c.data {
                call.args = [i % 7, 0x7ffd_1234_5678, 3, 0, 0, u64::MAX].into();
            }
            events.push(c);
            events.push(test_events::ret(ts + 300, 1 + (i % 2) as u32, "f", Some(300)));
        }
        let bytes = write(&events, false, None);
        let per_event = bytes.len() as f64 / events.len() as f64;
        assert!(per_event < 10.0, "{per_event} bytes an event");
    }
}
