//! Call slices from call and return events: the one reconstruction that every exporter and
//! analysis uses, so that a Chrome trace, a Perfetto trace, a flame graph and a report of the same
//! recording agree on every call's start, end and callers.
//!
//! - A return carries its call's duration (measured at record time), so its start is
//!   `ts - duration_ns`; it ends the open call that started exactly then. Recursion pairs exactly,
//!   as recorded, even when calls in between have no return.
//! - Calls that started inside a returning call and are still open never returned (their return
//!   was lost, or the kernel gave them no return probe): they end when it returns.
//! - A return whose call line is not in the trace (lost, or cut off) still places its slice; calls
//!   that started inside it become its callees.
//! - Calls still open when their thread exits, execs, or tracing stops end then.
//! - A return without a duration (its call was not seen at record time) has no slice.
//!
//! - Calls nest on their [`Track`]: their thread, or for Go code their goroutine, which may move
//!   between threads while a call is open (its call and return then name different threads).
//!   A goroutine's open calls end when its process exits or execs.
//!
//! Each track keeps at most [`MAX_DEPTH`] open calls, so that runaway recursion cannot grow
//! memory without bound: a call made deeper is not tracked, and its time stays in the call at the
//! cap (a flame graph shows it folded into that frame).

use crate::event::data;
use std::{io, sync::Arc};

pub use crate::event::Track;
use crate::event::{Args, Event, EventData, SpawnHow};

/// Most open calls tracked per track; deeper calls are folded into the call at this depth. Go
/// calls have no kernel depth limit (their returns come from probes on `ret` instructions), and
/// Go programs recurse deep: 512 keeps a 250-deep recursion whole, at a few dozen KiB per track
/// that deep.
pub const MAX_DEPTH: usize = 512;

/// An open call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub function: Arc<str>,
    pub module: Arc<str>,
    pub args: Args,
    /// Its parameters at source level (empty without DWARF).
    pub params: data::Params,
    /// Its return value at source level, once its return came with one.
    pub ret: Option<data::SourceValue>,
    /// When it started, Unix ns.
    pub start: u64,
    /// Time spent so far in traced callees that have ended.
    pub callee_ns: u64,
}

/// Why a slice ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// Its return event came.
    Returned {
        retval: u64,
    },
    /// A call that encloses it returned first: its own return was lost, or the kernel gave it no
    /// return probe (more than 64 probed calls deep).
    CallerReturned,
    ThreadExited,
    /// Its process replaced its program.
    Exec,
    TracingStopped,
}

impl Ending {
    /// Why a call that did not return ended, in words; `None` for a call that returned.
    pub fn unfinished_reason(self) -> Option<&'static str> {
        match self {
            Ending::Returned { .. } => None,
            Ending::CallerReturned => Some("no return event"),
            Ending::ThreadExited => Some("thread exited"),
            Ending::Exec => Some("exec"),
            Ending::TracingStopped => Some("tracing stopped"),
        }
    }
}

/// A call that ended.
#[derive(Debug)]
pub struct Slice<'a> {
    pub pid: u32,
    /// The thread of the event that ended it (a goroutine's call may have started on another).
    pub tid: u32,
    /// Where it nests: its thread, or its goroutine.
    pub track: Track,
    pub frame: &'a Frame,
    pub end: u64,
    pub ending: Ending,
    /// The calls still open around it, outermost first.
    pub callers: &'a [Frame],
    /// False when the call line was not in the trace: the return's duration placed the slice, and
    /// `frame.args` are zero.
    pub call_seen: bool,
}

impl Slice<'_> {
    pub fn duration(&self) -> u64 {
        self.end.saturating_sub(self.frame.start)
    }

    /// Time not spent in traced callees.
    pub fn self_ns(&self) -> u64 {
        self.duration().saturating_sub(self.frame.callee_ns)
    }

    /// 0 for a call with no traced caller.
    pub fn depth(&self) -> usize {
        self.callers.len()
    }
}

/// What the tracker reports, in the order it learns it.
#[derive(Debug)]
pub enum CallEvent<'a> {
    /// A call started (its call line). Calls past the depth cap are not reported.
    Begin { pid: u32, tid: u32, track: Track, frame: &'a Frame, depth: usize },
    /// A call ended. A slice whose call line was missing has no `Begin`.
    End(Slice<'a>),
}

#[derive(Debug, Default)]
struct ThreadCalls {
    frames: Vec<Frame>,
    /// Calls open inside the top frame past the depth cap.
    hidden: u64,
    /// The thread of the last call or return on this track (a goroutine's, for slices that end
    /// without an event of their own).
    last_tid: u32,
}

/// The open calls of every track, turned into slices as they end.
#[derive(Debug)]
pub struct CallTracker {
    /// Looked up at every call and return: FNV, several times faster than SipHash on this key.
    threads: fnv::FnvHashMap<(u32, Track), ThreadCalls>,
    max_depth: usize,
}

impl Default for CallTracker {
    fn default() -> Self {
        CallTracker::new(MAX_DEPTH)
    }
}

impl CallTracker {
    /// A tracker keeping at most `max_depth` (at least 1) open calls per thread.
    pub fn new(max_depth: usize) -> Self {
        CallTracker { threads: fnv::FnvHashMap::default(), max_depth: max_depth.max(1) }
    }

    /// Follows one event; `on` hears of each call that begins or ends because of it.
    pub fn event(&mut self, e: &Event, on: &mut dyn FnMut(CallEvent)) {
        let at = At { pid: e.pid, tid: e.tid, track: e.track() };
        match &e.data {
            EventData::Call(data::Call { function, module, args, params, .. }) => {
                let max_depth = self.max_depth;
                let thread = self.threads.entry((e.pid, at.track)).or_default();
                thread.last_tid = e.tid;
                if thread.frames.len() >= max_depth {
                    thread.hidden += 1;
                    return;
                }
                thread.frames.push(Frame {
                    function: function.clone(),
                    module: module.clone(),
                    args: *args,
                    params: params.clone(),
                    ret: None,
                    start: e.ts,
                    callee_ns: 0,
                });
                let depth = thread.frames.len() - 1;
                on(CallEvent::Begin { pid: e.pid, tid: e.tid, track: at.track, frame: &thread.frames[depth], depth });
            }
            EventData::Return(data::Return { function, module, retval, duration_ns, ret, .. }) => {
                // Without a duration the call was not seen: there is no slice.
                let Some(duration) = duration_ns else { return };
                let start = e.ts.saturating_sub(*duration);
                let max_depth = self.max_depth;
                let thread = self.threads.entry((e.pid, at.track)).or_default();
                thread.last_tid = e.tid;
                let ret = Return { function, module, start, end: e.ts, retval: *retval, value: ret.as_ref() };
                thread.ret(at, ret, max_depth, on);
            }
            EventData::Exit(data::Exit { thread, .. }) => {
                if let Some(mut calls) = self.threads.remove(&(e.pid, Track::Thread(e.tid))) {
                    calls.close_above(at, 0, e.ts, Ending::ThreadExited, on);
                }
                if !*thread {
                    // The process is gone: so are its goroutines.
                    self.close_process(e.pid, e.ts, Ending::ThreadExited, on);
                }
            }
            EventData::Spawn(data::Spawn { how: SpawnHow::Exec, .. }) => {
                // The old program's calls never return, on any thread or goroutine of the process.
                self.close_process(e.pid, e.ts, Ending::Exec, on);
            }
            _ => {}
        }
    }

    /// The calls open on a track, outermost first.
    pub fn open_calls(&self, pid: u32, track: Track) -> &[Frame] {
        self.threads.get(&(pid, track)).map_or(&[], |t| t.frames.as_slice())
    }

    /// Ends every open call of a process, track by track in order.
    fn close_process(&mut self, pid: u32, ts: u64, ending: Ending, on: &mut dyn FnMut(CallEvent)) {
        let mut tracks: Vec<(u32, Track)> = self.threads.keys().filter(|k| k.0 == pid).copied().collect();
        tracks.sort_unstable();
        for key in tracks {
            if let Some(mut calls) = self.threads.remove(&key) {
                calls.close_all(pid, key.1, ts, ending, on);
            }
        }
    }

    /// Ends every open call at `ts` (tracing stopped), track by track in (pid, track) order.
    pub fn finish(&mut self, ts: u64, on: &mut dyn FnMut(CallEvent)) {
        let mut threads: Vec<((u32, Track), ThreadCalls)> = self.threads.drain().collect();
        threads.sort_unstable_by_key(|(k, _)| *k);
        for ((pid, track), mut thread) in threads {
            thread.close_all(pid, track, ts, Ending::TracingStopped, on);
        }
    }
}

/// Where the event that ends a slice happened.
#[derive(Clone, Copy, Debug)]
struct At {
    pid: u32,
    tid: u32,
    track: Track,
}

/// Something that turns call slices into output, owning the tracker that makes them.
pub trait CallSink {
    fn tracker(&mut self) -> &mut CallTracker;
    /// Hears of a call that begins or ends. After an error, nothing more is heard.
    fn on_call(&mut self, c: CallEvent) -> io::Result<()>;
}

/// Follows one event with the sink's tracker, handing the sink what begins and ends.
pub fn follow_event(sink: &mut impl CallSink, e: &Event) -> io::Result<()> {
    follow(sink, |tracker, on| tracker.event(e, on))
}

/// Ends every open call at `ts` (tracing stopped), handing the sink the slices.
pub fn follow_end(sink: &mut impl CallSink, ts: u64) -> io::Result<()> {
    follow(sink, |tracker, on| tracker.finish(ts, on))
}

fn follow<S: CallSink>(sink: &mut S, step: impl FnOnce(&mut CallTracker, &mut dyn FnMut(CallEvent))) -> io::Result<()> {
    // The tracker is moved out for the step, so that the callback can borrow the sink.
    let mut tracker = std::mem::take(sink.tracker());
    let mut result = Ok(());
    step(&mut tracker, &mut |c| {
        if result.is_ok() {
            result = sink.on_call(c);
        }
    });
    *sink.tracker() = tracker;
    result
}

struct Return<'a> {
    function: &'a Arc<str>,
    module: &'a Arc<str>,
    start: u64,
    end: u64,
    retval: u64,
    value: Option<&'a data::SourceValue>,
}

impl ThreadCalls {
    /// Pops the top frame and reports it ended; its time goes to its caller's callee time.
    fn close_top(&mut self, at: At, end: u64, ending: Ending, call_seen: bool, on: &mut dyn FnMut(CallEvent)) {
        let Some(frame) = self.frames.pop() else { return };
        // Hidden calls were inside the top frame: they end with it.
        self.hidden = 0;
        let slice = Slice {
            pid: at.pid,
            tid: at.tid,
            track: at.track,
            frame: &frame,
            end,
            ending,
            callers: &self.frames,
            call_seen,
        };
        let duration = slice.duration();
        on(CallEvent::End(slice));
        if let Some(caller) = self.frames.last_mut() {
            caller.callee_ns += duration;
        }
    }

    /// Ends, as not returned, every frame of the track (a goroutine's on the thread it last ran on).
    fn close_all(&mut self, pid: u32, track: Track, end: u64, ending: Ending, on: &mut dyn FnMut(CallEvent)) {
        let tid = match track {
            Track::Thread(t) => t,
            Track::Goroutine(_) => self.last_tid,
        };
        self.close_above(At { pid, tid, track }, 0, end, ending, on);
    }

    /// Ends, as not returned, the frames from index `keep` up.
    fn close_above(&mut self, at: At, keep: usize, end: u64, ending: Ending, on: &mut dyn FnMut(CallEvent)) {
        while self.frames.len() > keep {
            self.close_top(at, end, ending, true, on);
        }
    }

    fn ret(&mut self, at: At, ret: Return, max_depth: usize, on: &mut dyn FnMut(CallEvent)) {
        // Frames are in start order: those at `pos` and above started inside the returning call.
        let pos = self.frames.partition_point(|f| f.start <= ret.start);
        let matched = pos > 0 && {
            let f = &self.frames[pos - 1];
            f.start == ret.start && f.function == *ret.function
        };
        let target = if matched {
            pos - 1
        } else if pos == self.frames.len() && self.frames.len() >= max_depth {
            // A call past the cap returned: its time is already the top frame's.
            self.hidden = self.hidden.saturating_sub(1);
            return;
        } else {
            // The call line is missing: its return still places the slice, around the calls that
            // started after it.
            if self.frames.len() >= max_depth {
                self.close_top(at, ret.end, Ending::CallerReturned, true, on);
            }
            let frame = Frame {
                function: ret.function.clone(),
                module: ret.module.clone(),
                args: Args::default(),
                params: data::Params::default(),
                ret: None,
                start: ret.start,
                callee_ns: 0,
            };
            self.frames.insert(pos, frame);
            pos
        };
        self.close_above(at, target + 1, ret.end, Ending::CallerReturned, on);
        self.frames[target].ret = ret.value.cloned();
        self.close_top(at, ret.end, Ending::Returned { retval: ret.retval }, matched, on);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::test_events::{call, ev, go_call, go_ret, ret};

    /// (function, start, end, depth, returned, call_seen, self_ns) of each slice, in end order.
    type Row = (String, u64, u64, usize, bool, bool, u64);

    fn slices(max_depth: usize, events: &[Event], end: u64) -> (Vec<Row>, usize) {
        let mut rows = Vec::new();
        let mut begins = 0;
        let mut on = |c: CallEvent| match c {
            CallEvent::Begin { .. } => begins += 1,
            CallEvent::End(s) => rows.push((
                s.frame.function.to_string(),
                s.frame.start,
                s.end,
                s.depth(),
                matches!(s.ending, Ending::Returned { .. }),
                s.call_seen,
                s.self_ns(),
            )),
        };
        let mut tracker = CallTracker::new(max_depth);
        for e in events {
            tracker.event(e, &mut on);
        }
        tracker.finish(end, &mut on);
        (rows, begins)
    }

    fn row(f: &str, start: u64, end: u64, depth: usize, returned: bool, seen: bool, self_ns: u64) -> Row {
        (f.to_string(), start, end, depth, returned, seen, self_ns)
    }

    #[test]
    fn nested_calls_and_self_time() {
        let (rows, begins) = slices(
            MAX_DEPTH,
            &[
                call(100, 1, "outer"),
                call(200, 1, "inner"),
                ret(250, 1, "inner", Some(50)),
                call(300, 1, "inner"),
                ret(400, 1, "inner", Some(100)),
                ret(1100, 1, "outer", Some(1000)),
            ],
            2000,
        );
        assert_eq!(begins, 3);
        assert_eq!(
            rows,
            vec![
                row("inner", 200, 250, 1, true, true, 50),
                row("inner", 300, 400, 1, true, true, 100),
                row("outer", 100, 1100, 0, true, true, 850),
            ]
        );
    }

    #[test]
    fn a_return_ends_the_calls_that_started_inside_it() {
        // f(f(f())) where the innermost call has no return: the middle one's return ends it.
        let (rows, _) = slices(
            MAX_DEPTH,
            &[
                call(100, 1, "f"),
                call(200, 1, "f"),
                call(300, 1, "f"),
                ret(400, 1, "f", Some(200)),
                ret(500, 1, "f", Some(400)),
            ],
            1000,
        );
        assert_eq!(
            rows,
            vec![
                row("f", 300, 400, 2, false, true, 100),
                row("f", 200, 400, 1, true, true, 100),
                row("f", 100, 500, 0, true, true, 200)
            ]
        );
    }

    #[test]
    fn a_missing_call_line_is_placed_by_its_duration_around_later_calls() {
        // a's call line was lost; b started inside it and lost its return.
        let (rows, begins) = slices(
            MAX_DEPTH,
            &[call(100, 1, "main"), call(500, 1, "b"), ret(900, 1, "a", Some(600)), ret(1000, 1, "main", Some(900))],
            2000,
        );
        assert_eq!(begins, 2);
        assert_eq!(
            rows,
            vec![
                row("b", 500, 900, 2, false, true, 400),
                row("a", 300, 900, 1, true, false, 200),
                row("main", 100, 1000, 0, true, true, 300),
            ]
        );
    }

    #[test]
    fn returns_without_duration_are_ignored() {
        let (rows, _) =
            slices(MAX_DEPTH, &[call(100, 1, "a"), ret(150, 1, "b", None), ret(300, 1, "a", Some(200))], 1000);
        assert_eq!(rows, vec![row("a", 100, 300, 0, true, true, 200)]);
    }

    #[test]
    fn open_calls_end_at_exit_exec_and_stop() {
        let exit = ev(
            500,
            1,
            2,
            EventData::Exit(data::Exit { exit_code: Some(0), signal: None, thread: true, comm: "w".into() }),
        );
        let exec = ev(
            600,
            1,
            1,
            EventData::Spawn(data::Spawn {
                parent_pid: 1,
                child_pid: 1,
                child_tid: 1,
                how: SpawnHow::Exec,
                comm: "new".into(),
                filename: None,
            }),
        );
        let mut ends = Vec::new();
        let mut tracker = CallTracker::default();
        let mut on = |c: CallEvent| {
            if let CallEvent::End(s) = c {
                ends.push((s.frame.function.to_string(), s.end, s.ending));
            }
        };
        for e in [call(100, 2, "worker"), call(110, 1, "old_main"), exit, exec, call(700, 1, "new_main")] {
            tracker.event(&e, &mut on);
        }
        tracker.finish(900, &mut on);
        assert_eq!(
            ends,
            vec![
                ("worker".to_string(), 500, Ending::ThreadExited),
                ("old_main".to_string(), 600, Ending::Exec),
                ("new_main".to_string(), 900, Ending::TracingStopped),
            ]
        );
    }

    #[test]
    fn recursion_past_the_cap_folds_into_the_frame_at_the_cap() {
        // r recurses 5 deep with a cap of 3: the two deepest calls are not tracked; the deepest
        // ones' returns fold into the frame at the cap, whose self time holds their time.
        let mut events: Vec<Event> = (0..5).map(|i| call(100 + 10 * i, 1, "r")).collect();
        for i in (0..5).rev() {
            let end = 200 + 10 * (4 - i);
            events.push(ret(end, 1, "r", Some(end - (100 + 10 * i))));
        }
        let (rows, begins) = slices(3, &events, 1000);
        assert_eq!(begins, 3);
        assert_eq!(
            rows,
            vec![
                row("r", 120, 220, 2, true, true, 100),
                row("r", 110, 230, 1, true, true, 20),
                row("r", 100, 240, 0, true, true, 20)
            ]
        );
    }

    #[test]
    fn goroutines_nest_on_themselves_whatever_thread_they_run_on() {
        // Goroutine 5 calls outer on thread 1, blocks inside inner, and returns on thread 2,
        // while goroutine 6 runs a call on thread 1 in between.
        let events = [
            go_call(100, 1, 5, "outer"),
            go_call(110, 1, 5, "inner"),
            go_call(120, 1, 6, "other"),
            go_ret(130, 1, 6, "other", 10),
            go_ret(300, 2, 5, "inner", 190),
            go_ret(310, 2, 5, "outer", 210),
        ];
        let mut ends = Vec::new();
        let mut tracker = CallTracker::default();
        for e in &events {
            tracker.event(e, &mut |c| {
                if let CallEvent::End(s) = c {
                    ends.push((s.frame.function.to_string(), s.track, s.tid, s.depth(), s.frame.start, s.end));
                }
            });
        }
        assert_eq!(
            ends,
            vec![
                ("other".to_string(), Track::Goroutine(6), 1, 0, 120, 130),
                ("inner".to_string(), Track::Goroutine(5), 2, 1, 110, 300),
                ("outer".to_string(), Track::Goroutine(5), 2, 0, 100, 310),
            ]
        );
        // A goroutine's open calls end with its process.
        let mut tracker = CallTracker::default();
        let mut ended = Vec::new();
        let exit = ev(
            500,
            1,
            1,
            EventData::Exit(data::Exit { exit_code: Some(0), signal: None, thread: false, comm: "g".into() }),
        );
        for e in [go_call(100, 3, 5, "blocked"), exit] {
            tracker.event(&e, &mut |c| {
                if let CallEvent::End(s) = c {
                    ended.push((s.frame.function.to_string(), s.end, s.ending));
                }
            });
        }
        assert_eq!(ended, vec![("blocked".to_string(), 500, Ending::ThreadExited)]);
    }

    #[test]
    fn threads_are_independent() {
        let (rows, _) = slices(
            MAX_DEPTH,
            &[call(100, 1, "a"), call(150, 2, "b"), ret(300, 1, "a", Some(200)), ret(400, 2, "b", Some(250))],
            1000,
        );
        assert_eq!(rows, vec![row("a", 100, 300, 0, true, true, 200), row("b", 150, 400, 0, true, true, 250)]);
    }
}
