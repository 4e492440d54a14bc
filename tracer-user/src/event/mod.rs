//! The one event model every sink, exporter, analysis and the wire protocol speak.
//!
//! A trace is a [`TraceStart`], then [`Event`]s, then a [`TraceEnd`] ([`TraceItem`]). Each
//! event kind's fields are one struct in [`data`], collected in [`EventData`]; the model's serde
//! derives are the wire protocol's encoding (postcard), and [`json`] is the JSON lines encoding
//! (a `kind` first, then the head `ts, host, pid, tid`, then the kind's fields). A new kind or
//! field is one edit here, and every encoding follows.

pub mod data;
pub mod fast_line;
pub mod host;
pub mod json;
mod probe_paths;
#[cfg(test)]
pub(crate) mod test_events;
mod trace;

use std::{collections::HashSet, fmt, sync::Arc};

use serde::{Deserialize, Serialize};

pub use data::{ArgValue, Args, Channel, Level, LogType, MAX_ARGS, SignalId, SpawnHow, Syscall};
pub use trace::{
    ClockInfo, EndReason, FilterStats, HostEnd, HostInfo, HostLoss, IpcStats, KernelInfo, LossCause, TargetInfo,
    TraceEnd, TraceStart, UnmatchedFunctions, why_lost,
};

pub use probe_paths::{ProbePath, ProbePaths};

/// Sets `slot` to `value` unless it already holds that very string: a reader hands out one `Arc`
/// per distinct name, so a name slot that is reused event after event (a decoder's, a call
/// tracker's) is set without touching a reference count.
#[inline]
pub fn set_name(slot: &mut Arc<str>, value: &Arc<str>) {
    if !Arc::ptr_eq(slot, value) {
        *slot = value.clone();
    }
}

/// Version of the JSON lines format written in `trace_start.format_version`.
pub const FORMAT_VERSION: u32 = 1;

/// One event. Its serde derives are its wire form: the host is left out (a connection is one
/// host's); JSON lines write it through [`json::Line`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event<N = Arc<str>> {
    /// Nanoseconds since the Unix epoch.
    pub ts: u64,
    #[serde(skip)]
    pub host: Arc<str>,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    pub data: EventData<N>,
}

/// What happened, by kind. The variant names are the kinds' names (`call`, `return`, ...).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventData<N = Arc<str>> {
    Call(data::Call<N>),
    Return(data::Return<N>),
    Spawn(data::Spawn),
    Exit(data::Exit),
    Send(data::Send),
    Recv(data::Recv),
    Signal(data::Signal),
    Log(data::Log),
    Usdt(data::Usdt<N>),
    Break(data::Break),
    Watch(data::Watch),
}

/// One item of a trace: its start, an event, or its end (as a channel delivers it, or a line of a
/// JSON lines file).
#[derive(Clone, Debug, PartialEq)]
pub enum TraceItem {
    Start(Box<TraceStart>),
    Event(Event),
    End(TraceEnd),
}

/// The event kinds a user can select with `--events`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Call,
    Return,
    Spawn,
    Exit,
    Send,
    Recv,
    Signal,
    Log,
    Usdt,
    Break,
    Watch,
}

impl EventKind {
    pub const ALL: [EventKind; 11] = [
        EventKind::Call,
        EventKind::Return,
        EventKind::Spawn,
        EventKind::Exit,
        EventKind::Send,
        EventKind::Recv,
        EventKind::Signal,
        EventKind::Log,
        EventKind::Usdt,
        EventKind::Break,
        EventKind::Watch,
    ];
    /// What `--events ipc` stands for.
    pub const IPC: [EventKind; 3] = [EventKind::Send, EventKind::Recv, EventKind::Signal];

    pub fn name(self) -> &'static str {
        match self {
            EventKind::Call => "call",
            EventKind::Return => "return",
            EventKind::Spawn => "spawn",
            EventKind::Exit => "exit",
            EventKind::Send => "send",
            EventKind::Recv => "recv",
            EventKind::Signal => "signal",
            EventKind::Log => "log",
            EventKind::Usdt => "usdt",
            EventKind::Break => "break",
            EventKind::Watch => "watch",
        }
    }

    /// Parses one `--events` item: a kind, or `ipc` for send, recv and signal.
    pub fn parse_list_item(s: &str) -> Result<Vec<EventKind>, String> {
        if s == "ipc" {
            return Ok(EventKind::IPC.to_vec());
        }
        s.parse().map(|k| vec![k])
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for EventKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        EventKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| {
            let known: Vec<_> = EventKind::ALL.iter().map(|k| k.name()).collect();
            format!("unknown event kind '{s}' (known: {}, ipc)", known.join(", "))
        })
    }
}

/// Where a call runs, as call stacks and exports see it: a thread, or a goroutine (which moves
/// between threads, so its calls nest on it and not on any thread).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Track {
    Thread(u32),
    Goroutine(u64),
}

impl<N> Event<N> {
    /// The same event with its names mapped (to and from the wire's string table, or from names
    /// borrowed from a JSON line).
    pub fn map_names<M, E>(self, f: impl FnMut(N) -> Result<M, E>) -> Result<Event<M>, E> {
        Ok(Event { ts: self.ts, host: self.host, pid: self.pid, tid: self.tid, data: self.data.map_names(f)? })
    }
}

impl Event {
    /// The track of a call or return: its goroutine for Go code (goid 0, a thread's own system
    /// stack, stays with the thread), else its thread. Other events are on their thread.
    pub fn track(&self) -> Track {
        match &self.data {
            EventData::Call(data::Call { goid: Some(goid), .. })
            | EventData::Return(data::Return { goid: Some(goid), .. })
                if *goid != 0 =>
            {
                Track::Goroutine(*goid)
            }
            _ => Track::Thread(self.tid),
        }
    }
}

impl<N> EventData<N> {
    pub fn kind(&self) -> EventKind {
        match self {
            EventData::Call(_) => EventKind::Call,
            EventData::Return(_) => EventKind::Return,
            EventData::Spawn(_) => EventKind::Spawn,
            EventData::Exit(_) => EventKind::Exit,
            EventData::Send(_) => EventKind::Send,
            EventData::Recv(_) => EventKind::Recv,
            EventData::Signal(_) => EventKind::Signal,
            EventData::Log(_) => EventKind::Log,
            EventData::Usdt(_) => EventKind::Usdt,
            EventData::Break(_) => EventKind::Break,
            EventData::Watch(_) => EventKind::Watch,
        }
    }

    /// A call or return with nothing but what the registers and the clock gave: no value from
    /// DWARF (parameters, file, line, typed return) and no `unwound` or `tail_call` mark. Nearly
    /// every event of a trace is one; the JSON line writer ([`fast_line`]) and the native
    /// format's compact layout take only these, and leave the rest to serde and postcard.
    ///
    /// Every field is named (no `..`): a field added to `Call` or `Return` does not compile here
    /// until it is decided whether a plain call may carry it.
    pub fn is_plain_call(&self) -> bool {
        match self {
            EventData::Call(data::Call { function: _, module: _, args: _, goid: _, params, file, line }) => {
                params.is_empty() && file.is_none() && line.is_none()
            }
            EventData::Return(data::Return {
                function: _,
                module: _,
                retval: _,
                duration_ns: _,
                goid: _,
                ret,
                unwound,
                tail_call,
            }) => ret.is_none() && unwound.is_none() && tail_call.is_none(),
            _ => false,
        }
    }

    /// The one place that knows which fields are names.
    pub fn map_names<M, E>(self, mut f: impl FnMut(N) -> Result<M, E>) -> Result<EventData<M>, E> {
        Ok(match self {
            EventData::Call(c) => EventData::Call(data::Call {
                function: f(c.function)?,
                module: f(c.module)?,
                args: c.args,
                goid: c.goid,
                params: c.params,
                file: c.file,
                line: c.line,
            }),
            EventData::Return(r) => EventData::Return(data::Return {
                function: f(r.function)?,
                module: f(r.module)?,
                retval: r.retval,
                duration_ns: r.duration_ns,
                goid: r.goid,
                ret: r.ret,
                unwound: r.unwound,
                tail_call: r.tail_call,
            }),
            EventData::Spawn(s) => EventData::Spawn(s),
            EventData::Exit(e) => EventData::Exit(e),
            EventData::Send(s) => EventData::Send(s),
            EventData::Recv(r) => EventData::Recv(r),
            EventData::Signal(s) => EventData::Signal(s),
            EventData::Log(l) => EventData::Log(l),
            EventData::Usdt(u) => EventData::Usdt(data::Usdt {
                provider: f(u.provider)?,
                name: f(u.name)?,
                module: f(u.module)?,
                args: u.args,
            }),
            EventData::Break(b) => EventData::Break(b),
            EventData::Watch(w) => EventData::Watch(w),
        })
    }

    /// Forgets the links between events that flow linking made (a send's `flow_id`, a receive's
    /// `flow_ids`, a signal's `flow_id`): a collector drops what an agent sends in their place,
    /// as it links flows across hosts itself.
    pub fn clear_flow_links(&mut self) {
        match self {
            EventData::Send(s) => s.flow_id = 0,
            EventData::Recv(r) => r.flow_ids.clear(),
            EventData::Signal(s) => s.flow_id = None,
            EventData::Call(_)
            | EventData::Return(_)
            | EventData::Spawn(_)
            | EventData::Exit(_)
            | EventData::Log(_)
            | EventData::Usdt(_)
            | EventData::Break(_)
            | EventData::Watch(_) => {}
        }
    }
}

/// Interns the strings that repeat on every line (host, function, module), so that a reader
/// allocates each once.
#[derive(Default)]
pub struct Interner {
    strings: HashSet<Arc<str>>,
}

impl Interner {
    pub fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(found) = self.strings.get(s) {
            return found.clone();
        }
        let new: Arc<str> = Arc::from(s);
        self.strings.insert(new.clone());
        new
    }
}
#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn event(data: EventData) -> Event {
        Event { ts: 1_700_000_000_000_000_123, host: "h1".into(), pid: 10, tid: 11, data }
    }

    fn to_line(e: &Event) -> String {
        serde_json::to_string(&json::Line::Event(e)).unwrap()
    }

    fn parse(line: &str) -> Result<TraceItem, String> {
        json::parse_line(line, &mut Interner::default()).map_err(|e| e.to_string())
    }

    fn round_trip(e: &Event) -> Event {
        match parse(&to_line(e)).unwrap() {
            TraceItem::Event(e) => e,
            other => panic!("not an event: {other:?}"),
        }
    }

    #[test]
    fn call_line_has_contract_fields_in_order() {
        let e = event(EventData::Call(data::Call {
            function: "fib".into(),
            module: "/bin/x".into(),
            args: [1, 2, 3, 4, 5, u64::MAX].into(),
            goid: None,
            params: Default::default(),
            file: None,
            line: None,
        }));
        assert_eq!(
            to_line(&e),
            r#"{"kind":"call","ts":1700000000000000123,"host":"h1","pid":10,"tid":11,"function":"fib","module":"/bin/x","args":[1,2,3,4,5,18446744073709551615]}"#
        );
        assert_eq!(round_trip(&e), e);
        assert_eq!(e.track(), Track::Thread(11));
    }

    #[test]
    fn go_calls_carry_nine_arguments_and_their_goroutine() {
        let e = event(EventData::Call(data::Call {
            function: "main.work".into(),
            module: "/bin/gof".into(),
            args: [1, 2, 3, 4, 5, 6, 7, 8, 9].into(),
            goid: Some(18),
            params: Default::default(),
            file: None,
            line: None,
        }));
        let line = to_line(&e);
        assert!(line.ends_with(r#""args":[1,2,3,4,5,6,7,8,9],"goid":18}"#), "{line}");
        assert_eq!(round_trip(&e), e);
        assert_eq!(e.track(), Track::Goroutine(18));
        let r = event(EventData::Return(data::Return {
            function: "main.work".into(),
            module: "/bin/gof".into(),
            retval: 3,
            duration_ns: Some(9),
            goid: Some(0),
            ret: None,
            unwound: None,
            tail_call: None,
        }));
        assert!(to_line(&r).ends_with(r#""duration_ns":9,"goid":0}"#));
        assert_eq!(round_trip(&r), r);
        assert_eq!(r.track(), Track::Thread(11), "goid 0 is the thread's own system stack");
        let ten = r#"{"kind":"call","ts":1,"host":"h","pid":1,"tid":1,"function":"f","module":"m","args":[0,0,0,0,0,0,0,0,0,0]}"#;
        assert!(parse(ten).is_err(), "at most nine arguments");
    }

    #[test]
    fn log_and_usdt_lines_have_their_fields_in_order() {
        let e = event(EventData::Log(data::Log {
            log_type: LogType::Trace,
            level: Level::Info,
            source: None,
            message: "hi".into(),
            function: Some("run".into()),
            file: Some("a.c".into()),
            line: Some(7),
            spans: vec![],
            data: serde_json::json!({"n": 5}),
            truncated: false,
        }));
        assert_eq!(
            to_line(&e),
            r#"{"kind":"log","ts":1700000000000000123,"host":"h1","pid":10,"tid":11,"type":"trace","level":"info","message":"hi","function":"run","file":"a.c","line":7,"spans":[],"data":{"n":5},"truncated":false}"#
        );
        assert_eq!(round_trip(&e), e);
        // Without a source, function, file or line (a `print` from a program built without
        // them), a line has none of the four, and the wire still carries all four.
        let bare = event(EventData::Log(data::Log {
            log_type: LogType::Log,
            level: Level::Warn,
            source: None,
            message: "bare".into(),
            function: None,
            file: None,
            line: None,
            spans: vec![],
            data: serde_json::Value::Null,
            truncated: false,
        }));
        assert_eq!(
            to_line(&bare),
            r#"{"kind":"log","ts":1700000000000000123,"host":"h1","pid":10,"tid":11,"type":"log","level":"warn","message":"bare","spans":[],"data":null,"truncated":false}"#
        );
        assert_eq!(round_trip(&bare), bare);
        let wire = postcard::to_stdvec(&bare.data).unwrap();
        assert_eq!(postcard::from_bytes::<EventData>(&wire).unwrap(), bare.data);
        let u = event(EventData::Usdt(data::Usdt {
            provider: "p".into(),
            name: "n".into(),
            module: "/m".into(),
            args: vec![Some(ArgValue::Signed(-1)), Some(ArgValue::Unsigned(u64::MAX)), None],
        }));
        assert!(
            to_line(&u).ends_with(r#""provider":"p","name":"n","module":"/m","args":[-1,18446744073709551615,null]}"#)
        );
        assert_eq!(round_trip(&u), u);
    }

    #[test]
    fn return_keeps_null_duration() {
        let e = event(EventData::Return(data::Return {
            function: "f".into(),
            module: "m".into(),
            retval: 7,
            duration_ns: None,
            goid: None,
            ret: None,
            unwound: None,
            tail_call: None,
        }));
        let line = to_line(&e);
        assert!(line.ends_with(r#""retval":7,"duration_ns":null}"#), "{line}");
        assert_eq!(round_trip(&e), e);
        let e = event(EventData::Return(data::Return {
            function: "f".into(),
            module: "m".into(),
            retval: 7,
            duration_ns: Some(5),
            goid: None,
            ret: None,
            unwound: None,
            tail_call: None,
        }));
        assert_eq!(round_trip(&e), e);
    }

    #[test]
    fn spawn_and_exit_round_trip() {
        for e in [
            event(EventData::Spawn(data::Spawn {
                parent_pid: 1,
                child_pid: 2,
                child_tid: 2,
                how: SpawnHow::Exec,
                comm: "ls".into(),
                filename: Some("/bin/ls".into()),
            })),
            event(EventData::Spawn(data::Spawn {
                parent_pid: 1,
                child_pid: 1,
                child_tid: 3,
                how: SpawnHow::Thread,
                comm: "a".into(),
                filename: None,
            })),
            event(EventData::Exit(data::Exit { exit_code: None, signal: Some(9), thread: false, comm: "a".into() })),
            event(EventData::Exit(data::Exit { exit_code: Some(3), signal: None, thread: true, comm: "a".into() })),
        ] {
            assert_eq!(round_trip(&e), e);
        }
        let line = to_line(&event(EventData::Exit(data::Exit {
            exit_code: None,
            signal: Some(9),
            thread: false,
            comm: "a".into(),
        })));
        assert!(line.contains(r#""exit_code":null,"signal":9,"thread":false"#), "{line}");
    }

    #[test]
    fn ipc_events_round_trip() {
        let tcp = Channel::Tcp { src: "127.0.0.1:5000".parse().unwrap(), dst: "[::1]:80".parse().unwrap() };
        let send = event(EventData::Send(data::Send {
            channel: tcp.clone(),
            fd: 3,
            bytes: 10,
            syscall: Syscall::Sendto,
            flow_id: 7,
            syscall_ns: 1500,
            seq: Some(1000),
            digest: None,
            payload: None,
            payload_truncated: None,
        }));
        let line = to_line(&send);
        assert!(
            line.contains(r#""channel":{"type":"tcp","src":"127.0.0.1:5000","dst":"[::1]:80"},"fd":3,"bytes":10,"syscall":"sendto","flow_id":7"#),
            "{line}"
        );
        assert_eq!(round_trip(&send), send);
        let recv = event(EventData::Recv(data::Recv {
            channel: Channel::UnixStream { id: 99, to: 100, path: Some("/tmp/s".into()) },
            fd: 4,
            bytes: 10,
            syscall: Syscall::Read,
            flow_ids: vec![7, 8],
            syscall_ns: 20,
            seq: Some(5),
            digest: None,
            payload: None,
            payload_truncated: None,
            peek: false,
            discarded: None,
        }));
        let line = to_line(&recv);
        assert!(line.contains(r#""flow_id":7,"flow_ids":[7,8]"#), "{line}");
        // A receive that is neither a peek nor cut says neither.
        assert!(!line.contains("peek") && !line.contains("discarded"), "{line}");
        assert_eq!(round_trip(&recv), recv);
        let mut peek = recv.clone();
        let EventData::Recv(r) = &mut peek.data else { unreachable!() };
        (r.peek, r.flow_ids, r.seq) = (true, vec![], None);
        let line = to_line(&peek);
        assert!(line.ends_with(r#""seq":null,"digest":null,"peek":true}"#), "{line}");
        assert_eq!(round_trip(&peek), peek);
        let mut cut = recv.clone();
        let EventData::Recv(r) = &mut cut.data else { unreachable!() };
        r.discarded = Some(60);
        let line = to_line(&cut);
        assert!(line.ends_with(r#""discarded":60}"#), "{line}");
        assert_eq!(round_trip(&cut), cut);
        let unlinked = event(EventData::Recv(data::Recv {
            channel: Channel::Pipe { id: 5 },
            fd: 0,
            bytes: 1,
            syscall: Syscall::Readv,
            flow_ids: vec![],
            syscall_ns: 0,
            seq: None,
            digest: Some(77),
            payload: None,
            payload_truncated: None,
            peek: false,
            discarded: None,
        }));
        assert!(to_line(&unlinked).contains(r#""flow_id":null,"flow_ids":[]"#));
        assert_eq!(round_trip(&unlinked), unlinked);
        let sig = event(EventData::Signal(data::Signal {
            signal: SignalId::new(10),
            sender_pid: 1,
            target_pid: 2,
            target_tid: 2,
            delivered: true,
            flow_id: Some(3),
            group: false,
            queued: true,
        }));
        let line = to_line(&sig);
        assert!(line.contains(r#""signal":{"number":10,"name":"SIGUSR1"}"#), "{line}");
        assert_eq!(round_trip(&sig), sig);
    }

    #[test]
    fn payloads_are_base64_in_json_and_absent_when_capture_is_off() {
        let send = |payload: Option<&[u8]>, truncated| {
            event(EventData::Send(data::Send {
                channel: Channel::Pipe { id: 5 },
                fd: 1,
                bytes: 6,
                syscall: Syscall::Write,
                flow_id: 1,
                syscall_ns: 0,
                seq: None,
                digest: None,
                payload: payload.map(|p| data::Payload(p.to_vec())),
                payload_truncated: truncated,
            }))
        };
        let off = send(None, None);
        let line = to_line(&off);
        assert!(!line.contains("payload"), "{line}");
        assert_eq!(round_trip(&off), off);
        let cut = send(Some(b"hel\0"), Some(true));
        let line = to_line(&cut);
        assert!(line.contains(r#""payload":"aGVsAA==","payload_truncated":true"#), "{line}");
        assert_eq!(round_trip(&cut), cut);
        // Postcard (the wire) carries the raw bytes (and the host per batch, not per event).
        let wire: Event = postcard::from_bytes(&postcard::to_allocvec(&cut).unwrap()).unwrap();
        assert_eq!(wire.data, cut.data);
        // Capture on, nothing read: an empty payload is still said.
        let empty = send(Some(b""), Some(true));
        assert!(to_line(&empty).contains(r#""payload":"","payload_truncated":true"#));
        assert_eq!(round_trip(&empty), empty);
    }

    #[test]
    fn signal_names() {
        assert_eq!(SignalId::new(9).name, "SIGKILL");
        assert_eq!(SignalId::new(libc::SIGRTMIN() + 2).name, "SIGRTMIN+2");
    }

    #[test]
    fn missing_fields_are_named() {
        let err = parse(r#"{"kind":"call","ts":1,"host":"h","pid":1,"tid":1,"module":"m","args":[0,0,0,0,0,0]}"#);
        assert_eq!(err.unwrap_err(), "missing field `function`");
        assert!(parse(r#"{"kind":"bogus"}"#).is_err());
    }

    #[test]
    fn trace_start_and_end_carry_their_kind() {
        let end = TraceEnd {
            ts: 5,
            reason: EndReason::CommandExited,
            events_written: 3,
            lost_events: BTreeMap::from([("call".to_string(), 0)]),
            calls_without_return_probe: 0,
            command_exit_code: Some(0),
            ipc: IpcStats::default(),
            hosts: Vec::new(),
            filters: Default::default(),
            unmatched_functions: None,
            execs_probed_late: None,
        };
        let line = serde_json::to_string(&json::Line::End(&end)).unwrap();
        assert!(line.starts_with(r#"{"kind":"trace_end","ts":5,"reason":"command_exited""#), "{line}");
        assert_eq!(parse(&line).unwrap(), TraceItem::End(end));
    }

    /// A hand-edited line need not put `kind` (or a channel's `type`) first.
    #[test]
    fn lines_in_any_field_order_are_read() {
        let send = event(EventData::Send(data::Send {
            channel: Channel::Fifo { id: 3, path: Some("/f".into()) },
            fd: 3,
            bytes: 10,
            syscall: Syscall::Write,
            flow_id: 7,
            syscall_ns: 1,
            seq: None,
            digest: None,
            payload: None,
            payload_truncated: None,
        }));
        let text = r#"{"ts":1700000000000000123,"host":"h1","pid":10,"tid":11,"channel":{"id":3,"path":"/f","type":"fifo"},"fd":3,"bytes":10,"syscall":"write","flow_id":7,"syscall_ns":1,"kind":"send"}"#;
        assert_eq!(parse(text).unwrap(), TraceItem::Event(send));
        assert_eq!(parse(r#"{"ts":1}"#).unwrap_err(), "a line needs a `kind`");
    }

    /// The wire sends the model's own serde form: start and end typed, names as they are.
    #[test]
    fn start_and_end_round_trip_through_postcard() {
        let mut start = test_events::start(5);
        start.probe_paths.moved.insert("f".into(), 4);
        start.targets.push(TargetInfo::Command { pid: 2, argv: vec!["a".into()], exe: "/a".into() });
        let bytes = postcard::to_stdvec(&start).unwrap();
        assert_eq!(postcard::from_bytes::<TraceStart>(&bytes).unwrap(), start);
        let mut end = test_events::end(6);
        end.hosts.push(HostEnd {
            name: "h".into(),
            complete: false,
            reason: None,
            events: 1,
            command_exit_code: None,
            lost: vec![HostLoss { cause: LossCause::Gap, detail: "d".into() }],
        });
        let bytes = postcard::to_stdvec(&end).unwrap();
        assert_eq!(postcard::from_bytes::<TraceEnd>(&bytes).unwrap(), end);
        let line = serde_json::to_string(&json::Line::Start(&start)).unwrap();
        assert!(
            line.contains(r#""targets":[{"type":"process","pid":1,"comm":"app","exe":"/bin/app"},{"type":"command""#),
            "{line}"
        );
        assert!(line.contains(r#""moved":{"f":4}"#), "{line}");
        assert_eq!(parse(&line).unwrap(), TraceItem::Start(Box::new(start)));
    }

    #[test]
    fn interner_shares_strings() {
        let mut i = Interner::default();
        let a = i.intern("x");
        let b = i.intern("x");
        assert!(Arc::ptr_eq(&a, &b));
    }
}
