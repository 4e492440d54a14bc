//! Call slices from call and return events: the one reconstruction that every exporter and
//! analysis uses, so that a Chrome trace, a Perfetto trace, a flame graph and a report of the same
//! recording agree on every call's start, end and callers.
//!
//! - Calls are paired once, when they are recorded (`assemble::pairing`, by stack position): a
//!   return carries the result as its call's duration, so its call began at
//!   [`data::Return::call_start`], and it ends the open call of its function that started exactly
//!   then. Nothing here decides which call a return ends: the trace keeps no stack positions, and
//!   this only finds the call the recording paired. Recursion pairs exactly, as recorded, even
//!   when calls in between have no return.
//! - Calls that started inside a returning call and are still open never returned (their return
//!   was lost, the kernel gave them no return probe, or a `longjmp` left them): they end when it
//!   returns, as the recording dropped them from its stack then.
//! - A return whose call line is not in the trace (lost, or cut off) still places its slice; calls
//!   that started inside it become its callees.
//! - Calls still open when their thread exits, execs, or tracing stops end then (the recording
//!   ends them at exit and exec too).
//! - A return without a duration (its call was not seen at record time) has no slice.
//!
//! - Calls nest on their [`Track`]: their thread, or for Go code their goroutine, which may move
//!   between threads while a call is open (its call and return then name different threads).
//!   A goroutine's open calls end when its process exits or execs.
//!
//! Each track keeps at most [`MAX_DEPTH`] open calls, so that runaway recursion cannot grow
//! memory without bound: a call made deeper is not tracked, and its time stays in the call at the
//! cap (a flame graph shows it folded into that frame). That is a reader's bound, not a pairing
//! rule: the recording pairs deeper calls (its only depth limit is the kernel's for uretprobes,
//! [`MAX_URETPROBE_DEPTH`](crate::assemble::pairing::MAX_URETPROBE_DEPTH)).

use crate::event::data;
use std::{collections::VecDeque, sync::Arc};

pub use crate::event::Track;
use crate::event::{Args, Event, EventData, SpawnHow, set_name};

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
    /// Where its function is defined (DWARF), when its call said.
    pub file: Option<Arc<str>>,
    pub line: Option<u32>,
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
    /// return probe (deeper than [`crate::assemble::pairing::MAX_URETPROBE_DEPTH`] probed calls).
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

/// A track's open calls, outermost first.
///
/// The frames of ended calls stay in the vector, past `open`, for the next calls to overwrite:
/// a frame is large (two names, nine registers, source-level values), and building one, moving it
/// in, and dropping it again at every call was a fifth of `report`'s time; overwriting its fields
/// in place, a name that is already the same `Arc` (the same function called again at the same
/// depth, the common case) is not even touched.
#[derive(Debug, Default)]
struct Frames {
    slots: Vec<Frame>,
    /// How many of `slots` are open calls.
    open: usize,
}

impl Frames {
    fn len(&self) -> usize {
        self.open
    }

    fn as_slice(&self) -> &[Frame] {
        &self.slots[..self.open]
    }

    /// Opens a call on top.
    fn push(&mut self, call: &data::Call, start: u64) {
        let data::Call { function, module, args, params, file, line, .. } = call;
        match self.slots.get_mut(self.open) {
            Some(f) => {
                set_name(&mut f.function, function);
                set_name(&mut f.module, module);
                f.args = *args;
                // Empty but for source-level calls: not even a call to clone nothing.
                if !(f.params.is_empty() && params.is_empty()) {
                    f.params.0.clone_from(&params.0);
                }
                f.ret = None;
                f.file.clone_from(file);
                f.line = *line;
                f.start = start;
                f.callee_ns = 0;
            }
            None => self.slots.push(Frame {
                function: function.clone(),
                module: module.clone(),
                args: *args,
                params: params.clone(),
                ret: None,
                file: file.clone(),
                line: *line,
                start,
                callee_ns: 0,
            }),
        }
        self.open += 1;
    }

    /// Places a call below the open calls from `pos` on.
    fn insert(&mut self, pos: usize, frame: Frame) {
        // One ended frame fewer, so that the vector never holds more than the most calls ever
        // open at once.
        if self.slots.len() > self.open {
            self.slots.pop();
        }
        self.slots.insert(pos, frame);
        self.open += 1;
    }

    /// Ends the top call (its frame stays, to be overwritten).
    fn pop(&mut self) {
        self.open -= 1;
    }

    fn last(&self) -> Option<&Frame> {
        self.as_slice().last()
    }

    fn last_mut(&mut self) -> Option<&mut Frame> {
        self.slots[..self.open].last_mut()
    }

    /// Drops every frame, keeping the memory (for the next track in this slot).
    fn clear(&mut self) {
        self.slots.clear();
        self.open = 0;
    }
}

#[derive(Debug, Default)]
struct ThreadCalls {
    frames: Frames,
    /// Calls open inside the top frame past the depth cap.
    hidden: u64,
    /// The thread of the last call or return on this track (a goroutine's, for slices that end
    /// without an event of their own).
    last_tid: u32,
}

type Key = (u32, Track);

/// Where a track's open calls are in [`CallTracker::tracks`].
type Slot = usize;

/// The open calls of every track, turned into slices as they end.
///
/// [`CallTracker::event`] and [`CallTracker::finish`] return what begins and ends, for the
/// caller to iterate ([`Calls`]); nothing is called back.
///
/// Tracks live in a slab ([`CallTracker::tracks`], a forgotten track's slot reused), found by key
/// once per event (the last one remembered: calls come in long runs on one thread); what the
/// event then does names the slot, so it hashes nothing more.
#[derive(Debug)]
pub struct CallTracker {
    tracks: Vec<ThreadCalls>,
    /// FNV: several times faster than SipHash on this key.
    slots: fnv::FnvHashMap<Key, Slot>,
    /// Slots of forgotten tracks.
    free: Vec<Slot>,
    /// The track of the last event, and its slot.
    last: Option<(Key, Slot)>,
    max_depth: usize,
    /// What the event being followed still has to do, planned when it comes and done as
    /// [`Calls`] is iterated (kept here so that following an event allocates nothing).
    ops: VecDeque<Op>,
}

impl Default for CallTracker {
    fn default() -> Self {
        CallTracker::new(MAX_DEPTH)
    }
}

/// One step of what an event does to the open calls.
#[derive(Debug)]
enum Op {
    /// Report the call at `depth` of a track as begun.
    Begin { key: Key, slot: Slot, tid: u32, depth: usize },
    /// End the top frame of a track, once or while more than `keep` frames are open; the top
    /// frame takes `ret` (its return value at source level) as it ends.
    Pop {
        slot: Slot,
        at: At,
        keep: usize,
        once: bool,
        end: u64,
        ending: Ending,
        call_seen: bool,
        /// Boxed, as the inserted frame: rare, and the ops are moved at every event.
        ret: Option<Box<data::SourceValue>>,
    },
    /// Place a call whose call line is missing.
    Insert { slot: Slot, pos: usize, frame: Box<Frame> },
    /// Forget a track (its thread exited, or its process ended).
    Remove { key: Key, slot: Slot },
}

impl CallTracker {
    /// A tracker keeping at most `max_depth` (at least 1) open calls per thread.
    pub fn new(max_depth: usize) -> Self {
        CallTracker {
            tracks: Vec::new(),
            slots: fnv::FnvHashMap::default(),
            free: Vec::new(),
            last: None,
            max_depth: max_depth.max(1),
            ops: VecDeque::new(),
        }
    }

    /// The slot of a track, made if it has none.
    fn slot(&mut self, key: Key) -> Slot {
        if let Some((k, slot)) = self.last
            && k == key
        {
            return slot;
        }
        let slot = match self.slots.get(&key) {
            Some(&slot) => slot,
            None => {
                let slot = self.free.pop().unwrap_or_else(|| {
                    self.tracks.push(ThreadCalls::default());
                    self.tracks.len() - 1
                });
                self.slots.insert(key, slot);
                slot
            }
        };
        self.last = Some((key, slot));
        slot
    }

    /// The slot of a track that has one.
    fn existing(&self, key: Key) -> Option<Slot> {
        match self.last {
            Some((k, slot)) if k == key => Some(slot),
            _ => self.slots.get(&key).copied(),
        }
    }

    /// Forgets a track; its slot (and its frames' memory) goes to the next new track.
    fn remove(&mut self, key: Key, slot: Slot) {
        self.slots.remove(&key);
        let t = &mut self.tracks[slot];
        t.frames.clear();
        t.hidden = 0;
        t.last_tid = 0;
        self.free.push(slot);
        if self.last.is_some_and(|(k, _)| k == key) {
            self.last = None;
        }
    }

    /// Follows one event: the calls that begin or end because of it, in order, for the caller to
    /// iterate.
    pub fn event(&mut self, e: &Event) -> Calls<'_> {
        self.ops.clear();
        let at = At { pid: e.pid, tid: e.tid, track: e.track() };
        let key = (e.pid, at.track);
        match &e.data {
            EventData::Call(call) => {
                let max_depth = self.max_depth;
                let slot = self.slot(key);
                let thread = &mut self.tracks[slot];
                thread.last_tid = e.tid;
                if thread.frames.len() >= max_depth {
                    thread.hidden += 1;
                } else {
                    thread.frames.push(call, e.ts);
                    let depth = thread.frames.len() - 1;
                    self.ops.push_back(Op::Begin { key, slot, tid: e.tid, depth });
                }
            }
            EventData::Return(r) => {
                // A return whose call was not seen when it was recorded has no slice.
                if let Some(start) = r.call_start(e.ts) {
                    let data::Return { function, module, retval, ret, .. } = r;
                    let ret = Return { function, module, start, end: e.ts, retval: *retval, value: ret.as_ref() };
                    self.plan_return(key, at, ret);
                }
            }
            EventData::Exit(data::Exit { thread, .. }) => {
                let own = (e.pid, Track::Thread(e.tid));
                if let Some(slot) = self.existing(own) {
                    self.plan_close(own, slot, at, e.ts, Ending::ThreadExited);
                }
                if !*thread {
                    // The process is gone: so are its goroutines.
                    self.plan_close_process(e.pid, Some(own), e.ts, Ending::ThreadExited);
                }
            }
            EventData::Spawn(data::Spawn { how: SpawnHow::Exec, .. }) => {
                // The old program's calls never return, on any thread or goroutine of the process.
                self.plan_close_process(e.pid, None, e.ts, Ending::Exec);
            }
            _ => {}
        }
        Calls { tracker: self, ended: None }
    }

    /// The calls open on a track, outermost first.
    pub fn open_calls(&self, pid: u32, track: Track) -> &[Frame] {
        self.existing((pid, track)).map_or(&[], |slot| self.tracks[slot].frames.as_slice())
    }

    /// Ends every open call at `ts` (tracing stopped), track by track in (pid, track) order.
    pub fn finish(&mut self, ts: u64) -> Calls<'_> {
        self.ops.clear();
        let mut keys: Vec<(Key, Slot)> = self.slots.iter().map(|(k, s)| (*k, *s)).collect();
        keys.sort_unstable();
        for (key, slot) in keys {
            let at = self.track_end(key, slot);
            self.plan_close(key, slot, at, ts, Ending::TracingStopped);
        }
        Calls { tracker: self, ended: None }
    }

    /// Where a track's calls end without an event of their own: on its thread, or for a goroutine
    /// on the thread it last ran on.
    fn track_end(&self, key: Key, slot: Slot) -> At {
        let tid = match key.1 {
            Track::Thread(t) => t,
            Track::Goroutine(_) => self.tracks[slot].last_tid,
        };
        At { pid: key.0, tid, track: key.1 }
    }

    /// Ends every frame of a track as not returned, then forgets it.
    fn plan_close(&mut self, key: Key, slot: Slot, at: At, end: u64, ending: Ending) {
        self.ops.push_back(Op::Pop { slot, at, keep: 0, once: false, end, ending, call_seen: true, ret: None });
        self.ops.push_back(Op::Remove { key, slot });
    }

    /// Ends every open call of a process (but `except`'s, planned already), track by track in order.
    fn plan_close_process(&mut self, pid: u32, except: Option<Key>, ts: u64, ending: Ending) {
        let mut keys: Vec<(Key, Slot)> =
            self.slots.iter().filter(|(k, _)| k.0 == pid && Some(**k) != except).map(|(k, s)| (*k, *s)).collect();
        keys.sort_unstable();
        for (key, slot) in keys {
            let at = self.track_end(key, slot);
            self.plan_close(key, slot, at, ts, ending);
        }
    }

    fn plan_return(&mut self, key: Key, at: At, ret: Return) {
        let max_depth = self.max_depth;
        let slot = self.slot(key);
        let thread = &mut self.tracks[slot];
        thread.last_tid = at.tid;
        // Frames are in start order: those at `pos` and above started inside the returning call.
        let frames = thread.frames.as_slice();
        let pos = frames.partition_point(|f| f.start <= ret.start);
        let matched = pos > 0 && {
            let f = &frames[pos - 1];
            // Readers hand out one `Arc` per name: comparing addresses first spares the bytes.
            f.start == ret.start && (Arc::ptr_eq(&f.function, ret.function) || f.function == *ret.function)
        };
        let top = matched && pos == thread.frames.len();
        let end = ret.end;
        let pop = |keep, once, ending, call_seen, ret| Op::Pop { slot, at, keep, once, end, ending, call_seen, ret };
        let target = if matched {
            pos - 1
        } else if pos == thread.frames.len() && thread.frames.len() >= max_depth {
            // A call past the cap returned: its time is already the top frame's.
            thread.hidden = thread.hidden.saturating_sub(1);
            return;
        } else {
            // The call line is missing: its return still places the slice, around the calls that
            // started after it.
            if thread.frames.len() >= max_depth {
                self.ops.push_back(pop(0, true, Ending::CallerReturned, true, None));
            }
            let frame = Box::new(Frame {
                function: ret.function.clone(),
                module: ret.module.clone(),
                args: Args::default(),
                params: data::Params::default(),
                ret: None,
                file: None,
                line: None,
                start: ret.start,
                callee_ns: 0,
            });
            self.ops.push_back(Op::Insert { slot, pos, frame });
            pos
        };
        // Calls that started inside it and are still open never returned: they end first (none
        // when it is the top frame, the common case).
        if !top {
            self.ops.push_back(pop(target + 1, false, Ending::CallerReturned, true, None));
        }
        let returned = Ending::Returned { retval: ret.retval };
        self.ops.push_back(pop(0, true, returned, matched, ret.value.map(|v| Box::new(v.clone()))));
    }
}

/// The calls that begin and end because of one event (or the end of tracing), in order.
///
/// A lending iterator (`while let Some(c) = calls.next()`): each [`CallEvent`] borrows the open
/// calls around it, so the next one comes once it is let go. Dropping `Calls` early still does
/// the rest of the event's work, unreported.
pub struct Calls<'t> {
    tracker: &'t mut CallTracker,
    /// The track whose top frame is the last slice reported, with its end: the frame stays in
    /// place while the slice borrows it (a frame is large: not moving it is a tenth of
    /// `report`'s time), and is dropped, its time going to its caller's callee time, when the
    /// next step is asked for.
    ended: Option<(Slot, u64)>,
}

/// What a step of [`Calls`] found, before it is borrowed into a [`CallEvent`].
enum Step {
    Begin { key: Key, slot: Slot, tid: u32, depth: usize },
    End { slot: Slot, at: At, end: u64, ending: Ending, call_seen: bool },
}

impl Calls<'_> {
    /// The next call that begins or ends; `None` once the event's work is done.
    #[allow(clippy::should_implement_trait)] // a lending iterator: each item borrows the iterator
    pub fn next(&mut self) -> Option<CallEvent<'_>> {
        self.credit_caller();
        Some(match self.step()? {
            Step::Begin { key, slot, tid, depth } => {
                let frame = &self.tracker.tracks[slot].frames.as_slice()[depth];
                CallEvent::Begin { pid: key.0, tid, track: key.1, frame, depth }
            }
            Step::End { slot, at, end, ending, call_seen } => {
                let (frame, callers) = self.tracker.tracks[slot]
                    .frames
                    .as_slice()
                    .split_last()
                    .expect("a step that ends a call keeps its frame");
                CallEvent::End(Slice {
                    pid: at.pid,
                    tid: at.tid,
                    track: at.track,
                    frame,
                    end,
                    ending,
                    callers,
                    call_seen,
                })
            }
        })
    }

    /// The last slice's frame goes, and its time to its caller's callee time, once the slice has
    /// been seen.
    fn credit_caller(&mut self) {
        if let Some((slot, end)) = self.ended.take() {
            let frames = &mut self.tracker.tracks[slot].frames;
            let Some(ended) = frames.last() else { return };
            let duration = end.saturating_sub(ended.start);
            frames.pop();
            if let Some(caller) = frames.last_mut() {
                caller.callee_ns += duration;
            }
        }
    }

    /// Runs ops until one has something to report.
    fn step(&mut self) -> Option<Step> {
        loop {
            match self.tracker.ops.pop_front()? {
                Op::Begin { key, slot, tid, depth } => return Some(Step::Begin { key, slot, tid, depth }),
                Op::Insert { slot, pos, frame } => {
                    self.tracker.tracks[slot].frames.insert(pos, *frame);
                }
                Op::Remove { key, slot } => self.tracker.remove(key, slot),
                Op::Pop { slot, at, keep, once, end, ending, call_seen, ret } => {
                    let thread = &mut self.tracker.tracks[slot];
                    if thread.frames.len() <= keep {
                        continue;
                    }
                    let Some(frame) = thread.frames.last_mut() else { continue };
                    // Hidden calls were inside the top frame: they end with it.
                    thread.hidden = 0;
                    if let Some(ret) = ret {
                        frame.ret = Some(*ret);
                    }
                    if !once {
                        // More frames above `keep` may follow.
                        self.tracker.ops.push_front(Op::Pop {
                            slot,
                            at,
                            keep,
                            once,
                            end,
                            ending,
                            call_seen,
                            ret: None,
                        });
                    }
                    self.ended = Some((slot, end));
                    return Some(Step::End { slot, at, end, ending, call_seen });
                }
            }
        }
    }
}

impl Drop for Calls<'_> {
    fn drop(&mut self) {
        while self.next().is_some() {}
    }
}

/// Where the event that ends a slice happened.
#[derive(Clone, Copy, Debug)]
struct At {
    pid: u32,
    tid: u32,
    track: Track,
}

struct Return<'a> {
    function: &'a Arc<str>,
    module: &'a Arc<str>,
    start: u64,
    end: u64,
    retval: u64,
    value: Option<&'a data::SourceValue>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::test_events::{call, ev, go_call, go_ret, ret};

    /// Hands `on` each call that begins or ends.
    fn each(mut calls: Calls, mut on: impl FnMut(CallEvent)) {
        while let Some(c) = calls.next() {
            on(c);
        }
    }

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
            each(tracker.event(e), &mut on);
        }
        each(tracker.finish(end), &mut on);
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
            each(tracker.event(&e), &mut on);
        }
        each(tracker.finish(900), &mut on);
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
            each(tracker.event(e), |c| {
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
            each(tracker.event(&e), |c| {
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
