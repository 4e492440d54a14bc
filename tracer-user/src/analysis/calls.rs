//! `tracer calls`: each thread's calls in the order they were made, as an indented tree with start
//! time and duration, like a debugger's replay. Go calls are shown per goroutine (a goroutine moves
//! between threads).
//!
//! A call's line is written once its outermost shown caller has ended (only then are all the
//! durations inside it known), so memory holds one outermost call's tree per thread.

use std::{
    collections::HashMap,
    io::{self, Write},
    sync::Arc,
};

use globset::GlobMatcher;

use super::{
    call_tree::{self, CallEvent, CallSink, CallTracker, Ending, Slice, Track},
    processes::ProcessNames,
    stats::human_ns,
};
use crate::{
    event::{Event, TraceEnd, TraceStart},
    sink::Sink,
};

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
    function: Arc<str>,
    duration: u64,
    ending: Ending,
}

/// Writes call trees as the trace goes; a [`Sink`].
pub struct CallPrinter<W: Write> {
    out: W,
    filter: CallFilter,
    tracker: CallTracker,
    names: ProcessNames,
    origin: u64,
    /// Lines waiting for their outermost shown call to end, per track.
    pending: HashMap<(u32, Track), Vec<Line>>,
    last_thread: Option<(u32, Track)>,
}

impl<W: Write> CallPrinter<W> {
    pub fn new(out: W, filter: CallFilter) -> Self {
        CallPrinter {
            out,
            filter,
            tracker: CallTracker::default(),
            names: ProcessNames::default(),
            origin: 0,
            pending: HashMap::new(),
            last_thread: None,
        }
    }

    /// The depth of the outermost caller (or the call itself) that the function filter shows.
    fn shown_from(&self, slice: &Slice) -> Option<usize> {
        let Some(pattern) = &self.filter.function else { return Some(0) };
        slice
            .callers
            .iter()
            .map(|f| &f.function)
            .chain([&slice.frame.function])
            .position(|f| pattern.is_match(f.as_ref()))
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
            let note = match l.ending.unfinished_reason() {
                Some(why) => format!("  (did not return: {why})"),
                None => String::new(),
            };
            writeln!(
                self.out,
                "{sign}{}.{:09} {:>9}  {:indent$}{}{note}",
                offset / 1_000_000_000,
                offset % 1_000_000_000,
                human_ns(l.duration),
                "",
                l.function,
                indent = 2 * l.depth
            )?;
        }
        Ok(())
    }
}

impl<W: Write> CallSink for CallPrinter<W> {
    fn tracker(&mut self) -> &mut CallTracker {
        &mut self.tracker
    }

    fn on_call(&mut self, c: CallEvent) -> io::Result<()> {
        let CallEvent::End(slice) = c else { return Ok(()) };
        if self.filter.pid.is_some_and(|p| p != slice.pid) || self.filter.tid.is_some_and(|t| t != slice.tid) {
            return Ok(());
        }
        let Some(base) = self.shown_from(&slice) else { return Ok(()) };
        let depth = slice.depth() - base;
        if slice.duration() < self.filter.min_duration_ns || self.filter.max_depth.is_some_and(|max| depth > max) {
            return Ok(());
        }
        let key = (slice.pid, slice.track);
        let line = Line {
            start: slice.frame.start,
            depth,
            function: slice.frame.function.clone(),
            duration: slice.duration(),
            ending: slice.ending,
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
        self.origin = start.ts;
        self.names.begin(start);
        Ok(())
    }

    fn event(&mut self, e: &Event) -> io::Result<()> {
        self.names.event(e);
        call_tree::follow_event(self, e)
    }

    fn end(&mut self, end: &TraceEnd) -> io::Result<()> {
        call_tree::follow_end(self, end.ts)?;
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        event::test_events::{call, ret},
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
}
