//! `tracer calls`: each thread's calls in the order they were made, as an indented tree with start
//! time and duration, like a debugger's replay. Go calls are shown per goroutine (a goroutine moves
//! between threads).
//!
//! A call's line is written once its outermost shown caller has ended (only then are all the
//! durations inside it known), so memory holds one outermost call's tree per thread.
//!
//! What the program said or did at a point (`log` and `usdt` events, breakpoints, watchpoints,
//! and each IPC send and receive) is printed inline, one level below the call open on its thread
//! when it happened, or on its own outside any call. Events nest in their thread's calls, not a
//! goroutine's. A receive names the process and thread that sent what it read (the sends are
//! remembered for that, the latest [`MAX_REMEMBERED_SENDS`]).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    io::{self, Write},
    sync::Arc,
};

use globset::GlobMatcher;

use super::{
    processes::ProcessNames,
    slices::{self, CallEvent, CallTracker, Calls, Ending, Slice, Track},
    stats::human_ns,
};
use crate::{
    event::{Event, EventData, TraceEnd, TraceStart, data},
    sink::Sink,
};

/// Sends remembered to name the sender of the receives that read them; the oldest go first.
pub const MAX_REMEMBERED_SENDS: usize = 65_536;

/// Which calls to show.
#[derive(Clone, Debug, Default)]
pub struct CallFilter {
    pub pid: Option<u32>,
    pub tid: Option<u32>,
    /// Show the calls of matching functions, with their callees.
    pub function: Option<GlobMatcher>,
    /// Hide calls shorter than this (and so their callees).
    pub min_duration_ns: u64,
    /// Show calls at most this many levels below the outermost call shown.
    pub max_depth: Option<usize>,
}

#[derive(Debug)]
struct Line {
    start: u64,
    depth: usize,
    what: What,
}

#[derive(Debug)]
enum What {
    Call {
        function: Arc<str>,
        duration: u64,
        ending: Ending,
    },
    /// A `log` or `usdt` event, as printed.
    Said(String),
}

/// Who sent a message: its host, process and thread.
#[derive(Clone, Debug)]
struct Sender {
    host: Arc<str>,
    pid: u32,
    tid: u32,
}

/// A transfer in one line: `send 256 B on pipe 1234 (write)`, `recv 300 B on pipe 1234 (read)
/// from ipc (41) thread 41`, with the captured bytes when there are (`"GET /"`, `…` when cut).
fn transfer(e: &Event, senders: &BTreeMap<u64, Sender>, names: &ProcessNames) -> Option<String> {
    let payload = |payload: &Option<data::Payload>, truncated: Option<bool>| match payload {
        Some(p) => format!(" {:?}{}", String::from_utf8_lossy(&p.0), if truncated == Some(true) { "…" } else { "" }),
        None => String::new(),
    };
    match &e.data {
        EventData::Send(s) => Some(format!(
            "send {} B on {} ({}){}",
            s.bytes,
            s.channel.text(),
            s.syscall.name(),
            payload(&s.payload, s.payload_truncated)
        )),
        EventData::Recv(r) => {
            let mut from: Vec<String> = Vec::new();
            for sender in r.flow_ids.iter().filter_map(|id| senders.get(id)) {
                let mut who = format!("{} thread {}", names.label(sender.pid), sender.tid);
                if sender.host != e.host {
                    who += &format!(" on {}", sender.host);
                }
                if !from.contains(&who) {
                    from.push(who);
                }
            }
            let from = if from.is_empty() { String::new() } else { format!(" from {}", from.join(", ")) };
            let peek = if r.peek { " peek" } else { "" };
            Some(format!(
                "recv{peek} {} B on {} ({}){from}{}",
                r.bytes,
                r.channel.text(),
                r.syscall.name(),
                payload(&r.payload, r.payload_truncated)
            ))
        }
        _ => None,
    }
}

/// A program's event in one line: `log info [source] message {data}`, `usdt provider:name(args)`,
/// `break fixture.c:12 {i = 3}`, `watch counter = 6 by bump (fixture.c:12)`; `None` for events
/// that are not what a program said or did at a source line.
fn said(data: &EventData) -> Option<String> {
    match data {
        EventData::Log(log) => {
            let mut text = format!("log {}", log.level.name());
            if let Some(source) = &log.source {
                text += &format!(" [{source}]");
            }
            text += &format!(" {}", log.message);
            if !log.data.is_null() {
                text += &format!(" {}", log.data);
            }
            Some(text)
        }
        EventData::Usdt(u) => Some(format!("usdt {}:{}({})", u.provider, u.name, u.args_text())),
        EventData::Break(b) => Some(format!("{} {{{}}}", b.title(), b.locals_text())),
        EventData::Watch(w) => Some(format!("{} by {}", w.title(), w.place_text())),
        _ => None,
    }
}

/// A call as its source reads, `greet(name="alice", times=3) = 0`, when it has parameters or a
/// return value at source level; else its function's name alone.
fn source_level(frame: &slices::Frame) -> Arc<str> {
    if frame.params.is_empty() && frame.ret.is_none() {
        return frame.function.clone();
    }
    let params: Vec<String> = frame.params.0.iter().map(|(k, v)| format!("{k}={}", v.0)).collect();
    let ret = frame.ret.as_ref().map(|r| format!(" = {}", r.0)).unwrap_or_default();
    Arc::from(format!("{}({}){ret}", frame.function, params.join(", ")))
}

/// Writes call trees as the trace goes; a [`Sink`].
pub struct CallPrinter<W: Write> {
    tracker: CallTracker,
    printer: Printer<W>,
    /// The processes and threads the trace has events of, to tell a `--pid` or `--tid` that is
    /// not in it (the last one remembered, so that a run of one thread's events costs no lookup).
    pids: BTreeSet<u32>,
    tids: BTreeSet<u32>,
    last: Option<(u32, u32)>,
    /// The latest sends, by flow id: who sent them.
    senders: BTreeMap<u64, Sender>,
}

/// A `--pid` or `--tid` of [`CallFilter`] that no event of the trace has.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotInTrace {
    #[error("pid {pid} is not in the trace (its processes are {})", listing(.present))]
    Pid { pid: u32, present: Vec<u32> },
    #[error("thread {tid} is not in the trace (its threads are {})", listing(.present))]
    Tid { tid: u32, present: Vec<u32> },
}

/// At most ten ids, then how many more.
fn listing(ids: &[u32]) -> String {
    let shown: Vec<String> = ids.iter().take(10).map(u32::to_string).collect();
    match ids.len() {
        0 => "none".to_string(),
        n if n > 10 => format!("{} and {} more", shown.join(", "), n - 10),
        _ => shown.join(", "),
    }
}

/// What the call trees are written with: everything but the open calls.
struct Printer<W: Write> {
    out: W,
    filter: CallFilter,
    names: ProcessNames,
    origin: u64,
    /// Lines waiting for their outermost shown call to end, per track.
    pending: HashMap<(u32, Track), Vec<Line>>,
    last_thread: Option<(u32, Track)>,
}

impl<W: Write> CallPrinter<W> {
    pub fn new(out: W, filter: CallFilter) -> Self {
        CallPrinter {
            tracker: CallTracker::default(),
            printer: Printer {
                out,
                filter,
                names: ProcessNames::default(),
                origin: 0,
                pending: HashMap::new(),
                last_thread: None,
            },
            pids: BTreeSet::new(),
            tids: BTreeSet::new(),
            last: None,
            senders: BTreeMap::new(),
        }
    }

    /// Once the trace is read: the `--pid` or `--tid` asked for that the trace has no event of.
    pub fn not_in_trace(&self) -> Option<NotInTrace> {
        if let Some(pid) = self.printer.filter.pid.filter(|p| !self.pids.contains(p)) {
            return Some(NotInTrace::Pid { pid, present: self.pids.iter().copied().collect() });
        }
        let tid = self.printer.filter.tid.filter(|t| !self.tids.contains(t))?;
        Some(NotInTrace::Tid { tid, present: self.tids.iter().copied().collect() })
    }
}

impl<W: Write> Printer<W> {
    /// The depth of the outermost of `frames` (callers, outermost first, then the call itself)
    /// that the function filter shows.
    fn shown_from<'a>(&self, mut frames: impl Iterator<Item = &'a Arc<str>>) -> Option<usize> {
        let Some(pattern) = &self.filter.function else { return Some(0) };
        frames.position(|f| pattern.is_match(f.as_ref()))
    }

    /// Places a program's event in its thread's open call (`open`, outermost first), or prints it
    /// when no call is open.
    fn said(&mut self, e: &Event, text: String, open: &[slices::Frame]) -> io::Result<()> {
        if self.filter.pid.is_some_and(|p| p != e.pid) || self.filter.tid.is_some_and(|t| t != e.tid) {
            return Ok(());
        }
        let track = Track::Thread(e.tid);
        let depth = open.len();
        let Some(base) = self.shown_from(open.iter().map(|f| &f.function)) else { return Ok(()) };
        let depth = depth - base;
        // Below the deepest level shown, like a call there.
        if self.filter.max_depth.is_some_and(|max| depth > max) {
            return Ok(());
        }
        let key = (e.pid, track);
        self.pending.entry(key).or_default().push(Line { start: e.ts, depth, what: What::Said(text) });
        if depth == 0 {
            let lines = self.pending.remove(&key).unwrap_or_default();
            self.write_tree(key, lines)?;
        }
        Ok(())
    }

    fn write_tree(&mut self, (pid, track): (u32, Track), mut lines: Vec<Line>) -> io::Result<()> {
        if self.last_thread != Some((pid, track)) {
            match track {
                Track::Thread(tid) => writeln!(self.out, "{}, thread {tid}:", self.names.label(pid))?,
                Track::Goroutine(goid) => writeln!(self.out, "{}, goroutine {goid}:", self.names.label(pid))?,
            }
            self.last_thread = Some((pid, track));
        }
        // Slices end innermost first; a tree reads in start order, callers before callees.
        lines.sort_by_key(|l| (l.start, l.depth));
        for l in lines {
            let offset = l.start as i128 - self.origin as i128;
            let sign = if offset < 0 { "-" } else { "+" };
            let offset = offset.unsigned_abs();
            let (duration, text) = match l.what {
                What::Call { function, duration, ending } => {
                    let note = match ending.unfinished_reason() {
                        Some(why) => format!("  (did not return: {why})"),
                        None => String::new(),
                    };
                    (human_ns(duration), format!("{function}{note}"))
                }
                What::Said(text) => (String::new(), text),
            };
            writeln!(
                self.out,
                "{sign}{}.{:09} {duration:>9}  {:indent$}{text}",
                offset / 1_000_000_000,
                offset % 1_000_000_000,
                "",
                indent = 2 * l.depth
            )?;
        }
        Ok(())
    }

    /// Writes each call that ended, once its tree is complete.
    fn calls(&mut self, mut calls: Calls) -> io::Result<()> {
        while let Some(c) = calls.next() {
            if let CallEvent::End(slice) = c {
                self.slice(&slice)?;
            }
        }
        Ok(())
    }

    fn slice(&mut self, slice: &Slice) -> io::Result<()> {
        if self.filter.pid.is_some_and(|p| p != slice.pid) || self.filter.tid.is_some_and(|t| t != slice.tid) {
            return Ok(());
        }
        let Some(base) = self.shown_from(slice.callers.iter().map(|f| &f.function).chain([&slice.frame.function]))
        else {
            return Ok(());
        };
        let depth = slice.depth() - base;
        let key = (slice.pid, slice.track);
        if slice.duration() < self.filter.min_duration_ns || self.filter.max_depth.is_some_and(|max| depth > max) {
            // A hidden call hides what was said inside it (its callees are hidden already).
            let start = slice.frame.start;
            if let Some(lines) = self.pending.get_mut(&key) {
                lines.retain(|l| l.start < start || l.depth <= depth);
            }
            return Ok(());
        }
        let line = Line {
            start: slice.frame.start,
            depth,
            what: What::Call { function: source_level(slice.frame), duration: slice.duration(), ending: slice.ending },
        };
        self.pending.entry(key).or_default().push(line);
        if depth == 0 {
            let lines = self.pending.remove(&key).unwrap_or_default();
            self.write_tree(key, lines)?;
        }
        Ok(())
    }
}

impl<W: Write> Sink for CallPrinter<W> {
    fn begin(&mut self, start: &TraceStart) -> io::Result<()> {
        self.printer.origin = start.ts;
        self.printer.names.begin(start);
        Ok(())
    }

    fn event(&mut self, e: &Event) -> io::Result<()> {
        if self.last != Some((e.pid, e.tid)) {
            self.pids.insert(e.pid);
            self.tids.insert(e.tid);
            self.last = Some((e.pid, e.tid));
        }
        self.printer.names.event(e);
        if let EventData::Send(send) = &e.data {
            if self.senders.len() >= MAX_REMEMBERED_SENDS {
                self.senders.pop_first();
            }
            self.senders.insert(send.flow_id, Sender { host: e.host.clone(), pid: e.pid, tid: e.tid });
        }
        match said(&e.data).or_else(|| transfer(e, &self.senders, &self.printer.names)) {
            Some(text) => self.printer.said(e, text, self.tracker.open_calls(e.pid, Track::Thread(e.tid))),
            None => self.printer.calls(self.tracker.event(e)),
        }
    }

    fn end(&mut self, end: &TraceEnd) -> io::Result<()> {
        self.printer.calls(self.tracker.finish(end.ts))?;
        self.printer.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::ArgValue;
    use crate::{
        event::test_events::{call, log, ret, usdt},
        event::test_events::{end, start},
    };

    fn print(filter: CallFilter, events: &[Event]) -> String {
        let mut out = Vec::new();
        let mut p = CallPrinter::new(&mut out, filter);
        p.begin(&start(1_000)).unwrap();
        for e in events {
            p.event(e).unwrap();
        }
        p.end(&end(10_000)).unwrap();
        drop(p);
        String::from_utf8(out).unwrap()
    }

    /// A `--pid` or `--tid` that no event has is told, with the ones there are.
    #[test]
    fn a_pid_or_thread_not_in_the_trace_is_told() {
        let seen = |filter: CallFilter| {
            let mut p = CallPrinter::new(Vec::new(), filter);
            p.begin(&start(1_000)).unwrap();
            for e in trace() {
                p.event(&e).unwrap();
            }
            p.end(&end(10_000)).unwrap();
            p.not_in_trace()
        };
        assert_eq!(seen(CallFilter { pid: Some(1), tid: Some(2), ..CallFilter::default() }), None);
        let missing = seen(CallFilter { pid: Some(424242), ..CallFilter::default() }).unwrap();
        assert_eq!(missing.to_string(), "pid 424242 is not in the trace (its processes are 1)");
        let missing = seen(CallFilter { tid: Some(3), ..CallFilter::default() }).unwrap();
        assert_eq!(missing.to_string(), "thread 3 is not in the trace (its threads are 1, 2)");
        assert_eq!(listing(&(1..=12).collect::<Vec<_>>()), "1, 2, 3, 4, 5, 6, 7, 8, 9, 10 and 2 more");
    }

    fn trace() -> Vec<Event> {
        vec![
            call(1_100, 1, "main"),
            call(1_200, 1, "parse"),
            call(1_300, 1, "lex"),
            ret(1_400, 1, "lex", Some(100)),
            ret(1_500, 1, "parse", Some(300)),
            call(1_600, 2, "worker"),
            ret(5_600, 2, "worker", Some(4_000)),
            call(1_700, 1, "run"),
            ret(3_700, 1, "run", Some(2_000)),
        ]
    }

    #[test]
    fn trees_in_call_order_with_unfinished_calls() {
        assert_eq!(
            print(CallFilter::default(), &trace()),
            "\
app (1), thread 2:
+0.000000600   4.00 µs  worker
app (1), thread 1:
+0.000000100   8.90 µs  main  (did not return: tracing stopped)
+0.000000200    300 ns    parse
+0.000000300    100 ns      lex
+0.000000700   2.00 µs    run
"
        );
    }

    fn said() -> Vec<Event> {
        use crate::event::Level;
        vec![
            log(1_050, 1, Level::Warn, Some("app::db"), "starting", serde_json::json!({"n": 1})),
            call(1_100, 1, "main"),
            log(1_150, 1, Level::Info, None, "hello", serde_json::Value::Null),
            call(1_200, 1, "parse"),
            usdt(1_250, 1, "fixture", "tick", vec![Some(ArgValue::Signed(-2)), Some(ArgValue::Unsigned(7)), None]),
            ret(1_500, 1, "parse", Some(300)),
            call(1_600, 1, "lex"),
            log(1_650, 1, Level::Error, None, "in lex", serde_json::Value::Null),
            ret(1_700, 1, "lex", Some(100)),
            // Another thread's event does not nest in thread 1's calls.
            log(1_800, 2, Level::Debug, Some("worker"), "idle", serde_json::Value::Null),
            ret(1_900, 1, "main", Some(800)),
        ]
    }

    #[test]
    fn program_events_sit_inline_below_the_open_call() {
        assert_eq!(
            print(CallFilter::default(), &said()),
            "\
app (1), thread 1:
+0.000000050            log warn [app::db] starting {\"n\":1}
app (1), thread 2:
+0.000000800            log debug [worker] idle
app (1), thread 1:
+0.000000100    800 ns  main
+0.000000150              log info hello
+0.000000200    300 ns    parse
+0.000000250                usdt fixture:tick(-2, 7, ?)
+0.000000600    100 ns    lex
+0.000000650                log error in lex
"
        );
    }

    #[test]
    fn program_events_follow_the_filters_of_their_calls() {
        let only = |f: CallFilter| print(f, &said());
        let glob = |g: &str| Some(globset::Glob::new(g).unwrap().compile_matcher());
        // Inside `parse` and its callees only, one level below it.
        assert_eq!(
            only(CallFilter { function: glob("parse"), ..CallFilter::default() }),
            "app (1), thread 1:\n+0.000000200    300 ns  parse\n+0.000000250              usdt fixture:tick(-2, 7, ?)\n"
        );
        // A hidden call hides what was said in it; what was said in a shown one stays.
        let long = only(CallFilter { min_duration_ns: 200, ..CallFilter::default() });
        assert!(long.contains("parse") && long.contains("tick") && long.contains("hello"), "{long}");
        assert!(!long.contains("lex"), "{long}");
        // Said one level below `main`: at depth 1, as its callees are.
        let shallow = only(CallFilter { max_depth: Some(1), ..CallFilter::default() });
        assert!(shallow.contains("hello") && !shallow.contains("tick"), "{shallow}");
        let thread2 = only(CallFilter { tid: Some(2), ..CallFilter::default() });
        assert_eq!(thread2, "app (1), thread 2:\n+0.000000800            log debug [worker] idle\n");
    }

    #[test]
    fn filters() {
        let only = |f: CallFilter| print(f, &trace());
        let glob = |g: &str| Some(globset::Glob::new(g).unwrap().compile_matcher());
        assert_eq!(
            only(CallFilter { function: glob("p*"), ..CallFilter::default() }),
            "app (1), thread 1:\n+0.000000200    300 ns  parse\n+0.000000300    100 ns    lex\n"
        );
        assert_eq!(
            only(CallFilter { tid: Some(2), ..CallFilter::default() }),
            "app (1), thread 2:\n+0.000000600   4.00 µs  worker\n"
        );
        let shallow = only(CallFilter { pid: Some(1), tid: Some(1), max_depth: Some(1), ..CallFilter::default() });
        assert!(!shallow.contains("lex") && shallow.contains("parse"), "{shallow}");
        let long = only(CallFilter { min_duration_ns: 2_000, ..CallFilter::default() });
        assert!(long.contains("run") && !long.contains("parse"), "{long}");
        assert_eq!(only(CallFilter { pid: Some(9), ..CallFilter::default() }), "");
    }

    /// Sends and receives sit inline like what a program said; a receive names its sender.
    #[test]
    fn sends_and_receives_sit_inline_and_a_receive_names_its_sender() {
        use crate::event::{
            Channel,
            data::{Payload, Recv, Send, Syscall},
            test_events::ev,
        };
        let channel = Channel::UnixStream { id: 9, to: 10, path: Some("<b>x</b>.sock".into()) };
        let send = Send {
            channel: channel.clone(),
            fd: 3,
            bytes: 5,
            syscall: Syscall::Write,
            flow_id: 77,
            syscall_ns: 0,
            seq: Some(0),
            digest: None,
            payload: Some(Payload(b"hi\n<a".to_vec())),
            payload_truncated: Some(true),
        };
        let recv = Recv {
            channel,
            fd: 4,
            bytes: 5,
            syscall: Syscall::Recvfrom,
            flow_ids: vec![77],
            syscall_ns: 0,
            seq: Some(0),
            digest: None,
            payload: None,
            payload_truncated: None,
            peek: false,
            discarded: None,
        };
        let events = [
            call(1_100, 1, "main"),
            ev(1_200, 1, 1, EventData::Send(send)),
            ev(1_300, 1, 2, EventData::Recv(recv)),
            ret(1_900, 1, "main", Some(800)),
        ];
        assert_eq!(
            print(CallFilter::default(), &events),
            "\
app (1), thread 2:
+0.000000300            recv 5 B on unix stream <b>x</b>.sock (recvfrom) from app (1) thread 1
app (1), thread 1:
+0.000000100    800 ns  main
+0.000000200              send 5 B on unix stream <b>x</b>.sock (write) \"hi\\n<a\"…
"
        );
        assert_eq!(serde_json::to_value(Syscall::Recvmmsg).unwrap(), Syscall::Recvmmsg.name());
    }
}
