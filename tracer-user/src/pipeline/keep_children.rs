//! `--min-duration D --min-duration-keep-children`: only the calls that last at least `D` are
//! written, each with the calls made inside it, decided here, in user space, before the events
//! are put in time order.
//!
//! The kernel cannot decide this alone: a call's children return before it does, so whether
//! they are written is known only at their caller's return. Holding them in the kernel would
//! need a buffer per thread in a map, which no verifier bound keeps small; so with this option
//! the kernel writes the held functions' calls as they come (predicates still decided there) and
//! this stage holds them, per thread:
//!
//! - each open call of a held function (native, with a return probe) is a frame holding its
//!   entry and the complete subtrees (entry, held children, return) of its children that were
//!   too short to be written on their own;
//! - at a return, a call that lasted `D` is written at once with everything its frame holds; a
//!   shorter one moves, with what it holds, into its caller's frame, or is dropped if no call
//!   is open around it (or its caller's frame has no room);
//! - a thread holds at most [`MAX_HELD`] events. When an event needs room past that, the held
//!   children of the thread's outermost open call are dropped first (the oldest events), then
//!   the next call's, and so on; what still does not fit is dropped. Every call dropped so is
//!   counted in `trace_end.filters.<fn>.children_dropped`: it was short, and its caller may
//!   later turn out long enough to keep it. The entries of open calls are never dropped for
//!   room: a call whose entry finds none (the thread has `MAX_HELD` calls open) is counted in
//!   `entries_lost` at its return (it cannot be written without its entry).
//!
//! Calls of functions not held (Go, no return probe, found in images exec'd later) and every
//! other event pass straight through. A call still open when its thread exits, or at the end of
//! the trace, or left by `longjmp`/an exception (its return never came), is dropped with what it
//! holds, as the kernel drops a held entry whose return never comes.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
};

use crate::event::{Event, EventData};

/// Most events held per thread (entries of open calls and their held children): at a few
/// hundred bytes an event, about 4 MiB per thread at most.
pub const MAX_HELD: usize = 16_384;

/// What this stage decided about one function's calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Calls seen.
    pub seen: u64,
    /// Calls written: long enough, or inside a call that was.
    pub written: u64,
    /// Calls not written: too short, and in no call that was long enough (or left without a
    /// return, or still open at the end). `seen = written + filtered_out` plus the calls whose
    /// entry had no room (in `entries_lost`) and those still undecided.
    pub filtered_out: u64,
    /// Of `filtered_out`, short calls inside an open call that were dropped for room (see the
    /// module's documentation).
    pub children_dropped: u64,
    /// Returns whose call was not held (it began before tracing, or had no room): dropped.
    pub entries_lost: u64,
}

struct Frame {
    function: Arc<str>,
    /// The call's time, which its return's `duration_ns` leads back to.
    ts: u64,
    /// `None` when there was no room for it.
    entry: Option<Event>,
    /// Complete subtrees of short children, in order.
    body: Vec<Event>,
}

#[derive(Default)]
struct Thread {
    pid: u32,
    open: Vec<Frame>,
    /// Events held in `open` (entries and bodies).
    held: usize,
}

pub struct KeepChildren {
    min_ns: u64,
    max_held: usize,
    /// The event names of the functions held.
    functions: HashSet<Arc<str>>,
    threads: HashMap<u32, Thread>,
    counts: BTreeMap<Arc<str>, Counts>,
}

impl KeepChildren {
    pub fn new(min_ns: u64, functions: impl IntoIterator<Item = Arc<str>>) -> Self {
        Self::with_room(min_ns, functions, MAX_HELD)
    }

    pub fn with_room(min_ns: u64, functions: impl IntoIterator<Item = Arc<str>>, max_held: usize) -> Self {
        let functions: HashSet<Arc<str>> = functions.into_iter().collect();
        let counts = functions.iter().map(|f| (f.clone(), Counts::default())).collect();
        KeepChildren { min_ns, max_held, functions, threads: HashMap::new(), counts }
    }

    /// What was decided, per function (every held function, decided on or not).
    pub fn counts(&self) -> &BTreeMap<Arc<str>, Counts> {
        &self.counts
    }

    /// Takes `event`, and passes on (to `out`) what is decided.
    pub fn push(&mut self, event: Event, out: &mut impl FnMut(Event)) {
        match &event.data {
            EventData::Call(c) if c.goid.is_none() && self.functions.contains(&c.function) => {
                let (function, ts) = (c.function.clone(), event.ts);
                self.count(&function).seen += 1;
                let thread = self.threads.entry(event.tid).or_default();
                thread.pid = event.pid;
                let entry = make_room(thread, 1, self.max_held, &mut self.counts).then_some(event);
                thread.held += entry.is_some() as usize;
                thread.open.push(Frame { function, ts, entry, body: Vec::new() });
            }
            EventData::Return(r) if r.goid.is_none() && self.functions.contains(&r.function) => {
                let function = r.function.clone();
                let start = r.call_start(event.ts);
                let duration = r.duration_ns.unwrap_or(0);
                self.ret(event, &function, start, duration, out);
            }
            EventData::Exit(x) => {
                let (pid, tid, thread) = (event.pid, event.tid, x.thread);
                out(event);
                let gone: Vec<u32> = match thread {
                    true => vec![tid],
                    false => self.threads.iter().filter(|(_, t)| t.pid == pid).map(|(&tid, _)| tid).collect(),
                };
                for tid in gone {
                    if let Some(t) = self.threads.remove(&tid) {
                        self.drop_frames(t.open);
                    }
                }
            }
            _ => out(event),
        }
    }

    /// The trace is over: calls still open are dropped.
    pub fn finish(&mut self) {
        let threads: Vec<Thread> = self.threads.drain().map(|(_, t)| t).collect();
        for t in threads {
            self.drop_frames(t.open);
        }
    }

    fn ret(
        &mut self,
        event: Event,
        function: &Arc<str>,
        start: Option<u64>,
        duration: u64,
        out: &mut impl FnMut(Event),
    ) {
        let Some(thread) = self.threads.get_mut(&event.tid) else {
            self.count(function).entries_lost += 1;
            return;
        };
        let found = start.and_then(|ts| thread.open.iter().rposition(|f| f.ts == ts && f.function == *function));
        let Some(at) = found else {
            self.count(function).entries_lost += 1;
            return;
        };
        // Calls opened inside this one whose returns never came.
        let abandoned = thread.open.split_off(at + 1);
        let frame = thread.open.pop().expect("found above");
        let freed = abandoned.iter().chain([&frame]).map(|f| f.entry.is_some() as usize + f.body.len()).sum::<usize>();
        thread.held -= freed;
        let has_caller = !thread.open.is_empty();
        self.drop_frames(abandoned);
        let Some(entry) = frame.entry else {
            // No room was left for its entry: it cannot be written; its children are dropped.
            self.count(function).entries_lost += 1;
            self.dropped(&frame.body, true);
            return;
        };
        let mut subtree = Vec::with_capacity(frame.body.len() + 2);
        subtree.push(entry);
        subtree.extend(frame.body);
        subtree.push(event);
        if duration >= self.min_ns {
            for e in subtree {
                if let EventData::Call(c) = &e.data {
                    let f = c.function.clone();
                    self.count(&f).written += 1;
                }
                out(e);
            }
            return;
        }
        if !has_caller {
            self.dropped(&subtree, false);
            return;
        }
        let thread = self.threads.get_mut(&subtree[0].tid).expect("open above");
        if make_room(thread, subtree.len(), self.max_held, &mut self.counts) {
            thread.held += subtree.len();
            thread.open.last_mut().expect("a caller is open").body.extend(subtree);
        } else {
            self.dropped(&subtree, true);
        }
    }

    /// Drops frames whose returns never came, with what they hold.
    fn drop_frames(&mut self, frames: Vec<Frame>) {
        for f in frames {
            self.count(&f.function).filtered_out += 1;
            self.dropped(&f.body, false);
        }
    }

    /// Counts the calls in dropped events; `for_room`: dropped for lack of room.
    fn dropped(&mut self, events: &[Event], for_room: bool) {
        count_dropped(&mut self.counts, events, for_room);
    }

    fn count(&mut self, function: &Arc<str>) -> &mut Counts {
        self.counts.entry(function.clone()).or_default()
    }
}

fn count_dropped(counts: &mut BTreeMap<Arc<str>, Counts>, events: &[Event], for_room: bool) {
    for e in events {
        if let EventData::Call(c) = &e.data {
            let counts = counts.entry(c.function.clone()).or_default();
            counts.filtered_out += 1;
            counts.children_dropped += for_room as u64;
        }
    }
}

/// Makes room for `needed` more events on `thread`, which may hold `max_held`, by dropping held
/// children, the outermost call's first; whether there is room now.
fn make_room(thread: &mut Thread, needed: usize, max_held: usize, counts: &mut BTreeMap<Arc<str>, Counts>) -> bool {
    for frame in thread.open.iter_mut() {
        if thread.held + needed <= max_held {
            break;
        }
        let body = std::mem::take(&mut frame.body);
        thread.held -= body.len();
        count_dropped(counts, &body, true);
    }
    thread.held + needed <= max_held
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::test_events::{call, ret, thread_exit};

    /// `(kind, function, ts)` of each event passed on, `c` for a call, `r` for a return.
    fn through(stage: &mut KeepChildren, events: Vec<Event>) -> Vec<(char, String, u64)> {
        let mut out = Vec::new();
        for e in events {
            stage.push(e, &mut |e: Event| out.push(e));
        }
        stage.finish();
        out.iter()
            .map(|e| match &e.data {
                EventData::Call(c) => ('c', c.function.to_string(), e.ts),
                EventData::Return(r) => ('r', r.function.to_string(), e.ts),
                _ => ('x', String::new(), e.ts),
            })
            .collect()
    }

    fn stage(max_held: usize) -> KeepChildren {
        KeepChildren::with_room(100, ["main", "tick", "slow"].map(Arc::from), max_held)
    }

    fn counts(stage: &KeepChildren, f: &str) -> (u64, u64, u64, u64, u64) {
        let c = &stage.counts()[f];
        (c.seen, c.written, c.filtered_out, c.children_dropped, c.entries_lost)
    }

    /// main (0..500) calls tick (10..20), tick (30..40), slow (50..250) which calls tick
    /// (60..70); then, outside main, tick (600..610).
    fn shape() -> Vec<Event> {
        vec![
            call(0, 1, "main"),
            call(10, 1, "tick"),
            ret(20, 1, "tick", Some(10)),
            call(30, 1, "tick"),
            ret(40, 1, "tick", Some(10)),
            call(50, 1, "slow"),
            call(60, 1, "tick"),
            ret(70, 1, "tick", Some(10)),
            ret(250, 1, "slow", Some(200)),
            ret(500, 1, "main", Some(500)),
            call(600, 1, "tick"),
            ret(610, 1, "tick", Some(10)),
        ]
    }

    #[test]
    fn a_long_call_is_written_with_the_calls_inside_it() {
        let mut s = stage(MAX_HELD);
        let out = through(&mut s, shape());
        let order: Vec<(char, &str, u64)> = out.iter().map(|(k, f, ts)| (*k, f.as_str(), *ts)).collect();
        // slow is written at its return, with its tick; main at its own, with the rest.
        assert_eq!(
            order,
            [
                ('c', "slow", 50),
                ('c', "tick", 60),
                ('r', "tick", 70),
                ('r', "slow", 250),
                ('c', "main", 0),
                ('c', "tick", 10),
                ('r', "tick", 20),
                ('c', "tick", 30),
                ('r', "tick", 40),
                ('r', "main", 500),
            ]
        );
        assert_eq!(counts(&s, "tick"), (4, 3, 1, 0, 0));
        assert_eq!(counts(&s, "main"), (1, 1, 0, 0, 0));
        assert_eq!(counts(&s, "slow"), (1, 1, 0, 0, 0));
    }

    #[test]
    fn past_the_bound_the_outermost_calls_children_go_first_and_are_counted() {
        // Room for main's entry, slow's, and one 2-event subtree: the first tick moves into
        // main, the second takes its place; slow's tick then needs room, and main's goes.
        let mut s = stage(4);
        let out = through(&mut s, shape());
        let calls: Vec<(&str, u64)> =
            out.iter().filter(|(k, _, _)| *k == 'c').map(|(_, f, ts)| (f.as_str(), *ts)).collect();
        assert_eq!(calls, [("slow", 50), ("tick", 60), ("main", 0)]);
        assert_eq!(counts(&s, "tick"), (4, 1, 3, 2, 0));
    }

    #[test]
    fn open_calls_are_dropped_at_a_thread_exit_and_unseen_calls_returns_are_counted() {
        let mut s = stage(MAX_HELD);
        let out = through(
            &mut s,
            vec![
                ret(5, 1, "tick", Some(10)),
                call(10, 2, "main"),
                call(20, 2, "tick"),
                ret(30, 2, "tick", Some(10)),
                thread_exit(40, 2),
                ret(50, 2, "main", Some(40)),
            ],
        );
        assert_eq!(out, [('x', String::new(), 40)]);
        assert_eq!(counts(&s, "tick"), (1, 0, 1, 0, 1));
        assert_eq!(counts(&s, "main"), (1, 0, 1, 0, 1));
    }
}
