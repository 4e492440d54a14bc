//! Pairing returns with calls, by where each call's return address lies on its stack: per thread
//! for native functions, whether their returns come from uretprobes ([`CallStacks`]) or from probes
//! on their exits ([`NativeStacks`]), and per goroutine for Go ([`GoroutineStacks`]). This is the
//! one place that decides which call a return ends; the return carries the answer as its call's
//! duration (`data::Return::call_start`), and the analyses nest calls by it (`analysis::slices`).
//!
//! A call and its return see the same position, so a return pairs with exactly its own call,
//! however deep the recursion and whatever records between the two were lost. Frames below the
//! position of a later call or return have ended (the stack grows down): their returns were lost,
//! or never ran (`longjmp`, an exception, a panic). How each kind of stack says so differs with
//! what its probes guarantee, as each type's documentation tells.
//!
//! The kernel gives a thread at most [`MAX_URETPROBE_DEPTH`] pending return probes: a call made
//! deeper than that has no return event at all ([`CallStacks`] models it, to count those calls).
//! Probes on exits and Go's `ret` probes have no such limit. When a thread replaces its program
//! (exec) or exits, every open call on it ends, in each kind of stack, as the kernel ends its
//! return probes then (`uprobe_free_utask`).

use std::collections::HashMap;

pub use tracer_common::MAX_URETPROBE_DEPTH;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Frame<K> {
    key: K,
    ts: u64,
    /// rsp at entry: the address of the return address the uretprobe replaced.
    sp: u64,
    /// Whether the kernel installed a return probe for this call.
    returns: bool,
}

#[derive(Debug)]
struct ThreadStack<K> {
    /// Outermost first; no frame lies below the next one's position.
    frames: Vec<Frame<K>>,
    /// Frames with `returns` set: the kernel's pending return probes for this thread.
    pending: usize,
}

impl<K> ThreadStack<K> {
    /// Drops the frames from `len` on: calls that ended without a return event.
    fn truncate(&mut self, len: usize) {
        self.pending -= self.frames[len..].iter().filter(|f| f.returns).count();
        self.frames.truncate(len);
    }

    /// Drops the frames below `sp`: they ended before a call or return there.
    fn drop_below(&mut self, sp: u64) {
        let live = self.frames.partition_point(|f| f.sp >= sp);
        self.truncate(live);
    }
}

/// The open calls of every thread whose returns come from uretprobes, paired by stack position: a
/// call records rsp at entry, its return 8 bytes above it (the return address was popped), as
/// [`tracer_common::ReturnRecord::entry_sp`] undoes.
///
/// A call or return at a position shows the frames below it ended. The kernel dropped their return
/// probes (as it does at a call, `cleanup_return_instances`, and at a return, `handle_trampoline`)
/// or ran them with the record lost (counted in `lost_events`): they are dropped here with no
/// event, and the analyses end them when a call around them returns (`no return event`). A frame
/// at the same position as a later call stays: a function that tail-jumped into a probed one,
/// whose return probe the kernel chains to the new call's (both returns come, innermost first).
#[derive(Debug)]
pub struct CallStacks<K> {
    threads: HashMap<u32, ThreadStack<K>>,
    return_probes: bool,
    /// Calls made beyond the uretprobe depth limit (they never get a return event).
    pub calls_without_return_probe: u64,
}

impl<K: PartialEq + Copy> CallStacks<K> {
    /// `return_probes`: whether return probes are attached at all (`--events` includes `return`).
    pub fn new(return_probes: bool) -> Self {
        CallStacks { threads: HashMap::new(), return_probes, calls_without_return_probe: 0 }
    }

    /// Opens a call whose entry saw rsp `sp`.
    pub fn call(&mut self, tid: u32, key: K, sp: u64, ts: u64) {
        if !self.return_probes {
            return;
        }
        let stack = self.threads.entry(tid).or_insert_with(|| ThreadStack { frames: Vec::new(), pending: 0 });
        // The kernel checks its depth before it drops gone frames: the same here when their
        // returns were lost (it ran them), but a longjmp that skipped probed frames near the
        // limit may cost this call a probe the count here does not miss.
        stack.drop_below(sp);
        let returns = stack.pending < MAX_URETPROBE_DEPTH;
        if returns {
            stack.pending += 1;
        } else {
            self.calls_without_return_probe += 1;
        }
        stack.frames.push(Frame { key, ts, sp, returns });
    }

    /// The duration of the call a return ends, its entry having seen rsp `entry_sp`, or `None` if
    /// that call was not seen.
    pub fn ret(&mut self, tid: u32, key: K, entry_sp: u64, ts: u64) -> Option<u64> {
        let stack = self.threads.get_mut(&tid)?;
        stack.drop_below(entry_sp);
        // At its position: the returning call, under the calls it tail-jumped into whose own
        // returns were lost. None there (its call record was lost, or it began before tracing):
        // the frames stay for their own returns.
        let at = stack.frames.iter().rposition(|f| f.sp == entry_sp && f.key == key && f.returns)?;
        let frame = stack.frames[at];
        stack.truncate(at);
        Some(ts.saturating_sub(frame.ts))
    }

    /// Forgets the calls of a thread that exited or replaced its program.
    pub fn thread_ended(&mut self, tid: u32) {
        self.threads.remove(&tid);
    }

    /// Number of calls currently open on `tid`.
    pub fn depth(&self, tid: u32) -> usize {
        self.threads.get(&tid).map_or(0, |s| s.frames.len())
    }
}

/// Whose stack a Go call is on: a goroutine (ids are unique within a process), or, for goid 0
/// (a thread's own `g0` or signal stack, where the scheduler and cgo run), the thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum GoStackId {
    Goroutine(u64),
    System(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct GoFrame<K> {
    key: K,
    ts: u64,
    /// `g.stack.hi - rsp` at entry: where the call's return address lies in its stack.
    stack_depth: u64,
}

/// The open Go calls of every goroutine. A goroutine moves between threads while a call is open,
/// so pairing by thread would be wrong; and its stack moves when it grows, so the position of a
/// call is measured from the stack's top (`g.stack.hi - rsp`), which a copy keeps. A call and its
/// return see the same position, so a return pairs with exactly its own call however deep the
/// recursion (there is no depth limit: the probes are on `ret` instructions, not uretprobes).
/// Calls that left no return (unwound by a panic, or left by a tail jump) are dropped as soon as
/// a later call or return at their position or above shows that their frame is gone.
#[derive(Debug)]
pub struct GoroutineStacks<K> {
    stacks: HashMap<(u32, GoStackId), Vec<GoFrame<K>>>,
    track: bool,
}

impl<K: PartialEq + Copy> GoroutineStacks<K> {
    /// `track`: whether return probes are attached at all.
    pub fn new(track: bool) -> Self {
        GoroutineStacks { stacks: HashMap::new(), track }
    }

    fn id(goid: u64, tid: u32) -> GoStackId {
        if goid == 0 { GoStackId::System(tid) } else { GoStackId::Goroutine(goid) }
    }

    pub fn call(&mut self, pid: u32, tid: u32, goid: u64, key: K, stack_depth: u64, ts: u64) {
        if !self.track {
            return;
        }
        let stack = self.stacks.entry((pid, Self::id(goid, tid))).or_default();
        // Frames at this position or deeper have ended: this call is reusing their stack.
        let live = stack.partition_point(|f| f.stack_depth < stack_depth);
        stack.truncate(live);
        stack.push(GoFrame { key, ts, stack_depth });
    }

    /// The duration of the call this return ends, or `None` if that call was not seen.
    pub fn ret(&mut self, pid: u32, tid: u32, goid: u64, key: K, stack_depth: u64, ts: u64) -> Option<u64> {
        let id = (pid, Self::id(goid, tid));
        let stack = self.stacks.get_mut(&id)?;
        let at = stack.partition_point(|f| f.stack_depth < stack_depth);
        let frame = stack.get(at).copied();
        // Whatever the outcome, nothing at this position or deeper is still open.
        stack.truncate(at);
        if stack.is_empty() {
            self.stacks.remove(&id);
        }
        let frame = frame?;
        (frame.stack_depth == stack_depth && frame.key == key).then(|| ts.saturating_sub(frame.ts))
    }

    /// Forgets the calls a thread had open on its own system stack.
    pub fn thread_exited(&mut self, pid: u32, tid: u32) {
        self.stacks.remove(&(pid, GoStackId::System(tid)));
    }

    /// Forgets every open call of a process.
    pub fn process_exited(&mut self, pid: u32) {
        self.stacks.retain(|(p, _), _| *p != pid);
    }

    /// Number of calls currently open on a goroutine.
    pub fn depth(&self, pid: u32, goid: u64) -> usize {
        self.stacks.get(&(pid, GoStackId::Goroutine(goid))).map_or(0, Vec::len)
    }
}

/// An open native call that has ended without a return of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unwound<K> {
    pub key: K,
    pub tid: u32,
    pub ts: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct NativeFrame<K> {
    key: K,
    ts: u64,
    /// rsp at entry: the address of the call's return address.
    sp: u64,
}

/// The open calls of native functions whose returns are probed where they happen (each `ret` and
/// jump out, see `functions::unwinding`), per thread, paired by stack position: a return
/// sees the rsp its call saw at entry. The stack grows down, so a call or return at a position
/// above an open call's means that call's frame is gone: left by unwinding (an exception, a
/// panic, `longjmp`), which runs no `ret` of it. Such calls come back as [`Unwound`], to be given
/// their return at that moment, so that every call has exactly one return. There is no depth
/// limit.
#[derive(Debug)]
pub struct NativeStacks<K> {
    threads: HashMap<u32, Vec<NativeFrame<K>>>,
}

impl<K: PartialEq + Copy> Default for NativeStacks<K> {
    fn default() -> Self {
        NativeStacks { threads: HashMap::new() }
    }
}

impl<K: PartialEq + Copy> NativeStacks<K> {
    /// Opens a call at `sp`; the calls whose frames it shows gone (at `sp` or deeper) are pushed
    /// on `unwound`, innermost first.
    pub fn call(&mut self, tid: u32, key: K, sp: u64, ts: u64, unwound: &mut Vec<Unwound<K>>) {
        let frames = self.threads.entry(tid).or_default();
        Self::pop_while(frames, tid, |f| f.sp <= sp, unwound);
        frames.push(NativeFrame { key, ts, sp });
    }

    /// The duration of the call a return at `sp` ends, or `None` if that call was not seen; the
    /// calls deeper than it that are still open are pushed on `unwound`, innermost first.
    pub fn ret(&mut self, tid: u32, key: K, sp: u64, ts: u64, unwound: &mut Vec<Unwound<K>>) -> Option<u64> {
        let frames = self.threads.get_mut(&tid)?;
        Self::pop_while(frames, tid, |f| f.sp < sp, unwound);
        let top = frames.last().copied()?;
        if top.sp != sp {
            return None;
        }
        frames.pop();
        if top.key != key {
            // A call whose record was lost, then another function's return at its position.
            unwound.push(Unwound { key: top.key, tid, ts: top.ts });
            return None;
        }
        Some(ts.saturating_sub(top.ts))
    }

    /// Ends every open call of a thread that exited or replaced its program, innermost first.
    pub fn thread_ended(&mut self, tid: u32, unwound: &mut Vec<Unwound<K>>) {
        if let Some(mut frames) = self.threads.remove(&tid) {
            Self::pop_while(&mut frames, tid, |_| true, unwound);
        }
    }

    fn pop_while(
        frames: &mut Vec<NativeFrame<K>>,
        tid: u32,
        gone: impl Fn(&NativeFrame<K>) -> bool,
        unwound: &mut Vec<Unwound<K>>,
    ) {
        while let Some(f) = frames.last().copied().filter(|f| gone(f)) {
            frames.pop();
            unwound.push(Unwound { key: f.key, tid, ts: f.ts });
        }
    }

    /// Number of calls currently open on `tid`.
    pub fn depth(&self, tid: u32) -> usize {
        self.threads.get(&tid).map_or(0, Vec::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_calls_pair_by_stack_position_and_unwound_frames_are_told() {
        let mut s = NativeStacks::default();
        let mut unwound = Vec::new();
        // main (sp 1000) calls a (900), which calls b (800), which calls c (700).
        s.call(1, 'm', 1000, 0, &mut unwound);
        s.call(1, 'a', 900, 10, &mut unwound);
        s.call(1, 'b', 800, 20, &mut unwound);
        s.call(1, 'c', 700, 30, &mut unwound);
        assert_eq!(s.ret(1, 'c', 700, 35, &mut unwound), Some(5));
        // b throws; a catches it and returns: b's frame went without a ret.
        assert_eq!(s.ret(1, 'a', 900, 50, &mut unwound), Some(40));
        assert_eq!(unwound, [Unwound { key: 'b', tid: 1, ts: 20 }]);
        unwound.clear();
        // main calls a again at the same position after a longjmp out of a's callee d.
        s.call(1, 'a', 900, 60, &mut unwound);
        s.call(1, 'd', 850, 61, &mut unwound);
        s.call(1, 'a', 900, 70, &mut unwound);
        assert_eq!(unwound, [Unwound { key: 'd', tid: 1, ts: 61 }, Unwound { key: 'a', tid: 1, ts: 60 }]);
        unwound.clear();
        // Recursion has no depth limit.
        for i in 0..1000u64 {
            s.call(2, 'f', 100_000 - 16 * i, i, &mut unwound);
        }
        for i in (0..1000u64).rev() {
            assert_eq!(s.ret(2, 'f', 100_000 - 16 * i, 5000, &mut unwound), Some(5000 - i));
        }
        assert!(unwound.is_empty());
        // The thread exits with main and a open.
        s.thread_ended(1, &mut unwound);
        assert_eq!(unwound, [Unwound { key: 'a', tid: 1, ts: 70 }, Unwound { key: 'm', tid: 1, ts: 0 }]);
        assert_eq!(s.depth(1), 0);
    }

    #[test]
    fn go_calls_pair_per_goroutine_across_threads() {
        let mut s = GoroutineStacks::new(true);
        // Goroutine 7 calls a (depth 100) on thread 1, then b (depth 200), which returns on
        // thread 2; goroutine 8 runs meanwhile on thread 1.
        s.call(1, 1, 7, 'a', 100, 10);
        s.call(1, 1, 7, 'b', 200, 20);
        s.call(1, 1, 8, 'a', 100, 25);
        assert_eq!(s.ret(1, 2, 7, 'b', 200, 50), Some(30));
        assert_eq!(s.ret(1, 1, 8, 'a', 100, 60), Some(35));
        assert_eq!(s.ret(1, 2, 7, 'a', 100, 70), Some(60));
        assert_eq!(s.depth(1, 7), 0);
    }

    #[test]
    fn go_recursion_has_no_depth_limit() {
        let mut s = GoroutineStacks::new(true);
        for i in 0..1000u64 {
            s.call(1, 1, 5, 'f', 100 + 64 * i, i);
        }
        assert_eq!(s.depth(1, 5), 1000);
        for i in (0..1000u64).rev() {
            assert_eq!(s.ret(1, 1, 5, 'f', 100 + 64 * i, 5000), Some(5000 - i), "level {i}");
        }
    }

    #[test]
    fn go_frames_that_left_no_return_are_dropped() {
        let mut s = GoroutineStacks::new(true);
        // f(100) calls g(200), which panics; f recovers and returns: g's frame is gone.
        s.call(1, 1, 3, 'f', 100, 1);
        s.call(1, 1, 3, 'g', 200, 2);
        assert_eq!(s.ret(1, 1, 3, 'f', 100, 9), Some(8));
        assert_eq!(s.depth(1, 3), 0);
        // h leaves by a tail jump to k, which takes its place (same position) and returns.
        s.call(1, 1, 3, 'h', 100, 10);
        s.call(1, 1, 3, 'k', 100, 11);
        assert_eq!(s.depth(1, 3), 1);
        assert_eq!(s.ret(1, 1, 3, 'k', 100, 15), Some(4));
        // A return whose call was not seen disturbs nothing shallower.
        s.call(1, 1, 3, 'f', 100, 20);
        assert_eq!(s.ret(1, 1, 3, 'x', 300, 21), None);
        assert_eq!(s.ret(1, 1, 3, 'f', 100, 22), Some(2));
    }

    #[test]
    fn goid_zero_is_per_thread() {
        let mut s = GoroutineStacks::new(true);
        s.call(1, 1, 0, 'a', 100, 1);
        s.call(1, 2, 0, 'a', 100, 2);
        assert_eq!(s.ret(1, 1, 0, 'a', 100, 5), Some(4));
        assert_eq!(s.ret(1, 2, 0, 'a', 100, 7), Some(5));
        s.call(1, 1, 0, 'a', 100, 1);
        s.thread_exited(1, 1);
        assert_eq!(s.ret(1, 1, 0, 'a', 100, 5), None);
        s.call(1, 1, 9, 'a', 100, 1);
        s.process_exited(1);
        assert_eq!(s.depth(1, 9), 0);
    }

    #[test]
    fn pairs_nested_calls() {
        let mut s = CallStacks::new(true);
        s.call(1, 'a', 1000, 10);
        s.call(1, 'b', 900, 20);
        assert_eq!(s.ret(1, 'b', 900, 25), Some(5));
        assert_eq!(s.ret(1, 'a', 1000, 40), Some(30));
        assert_eq!(s.depth(1), 0);
    }

    #[test]
    fn threads_are_independent() {
        let mut s = CallStacks::new(true);
        s.call(1, 'a', 1000, 10);
        s.call(2, 'a', 1000, 12);
        assert_eq!(s.ret(1, 'a', 1000, 20), Some(10));
        assert_eq!(s.ret(2, 'a', 1000, 30), Some(18));
    }

    #[test]
    fn unseen_calls_have_no_duration() {
        let mut s = CallStacks::new(true);
        assert_eq!(s.ret(1, 'a', 1000, 5), None);
        s.call(1, 'a', 1000, 10);
        // A return whose call was lost, deeper or at the same position, does not disturb the
        // open call.
        assert_eq!(s.ret(1, 'b', 900, 11), None);
        assert_eq!(s.ret(1, 'b', 1000, 11), None);
        assert_eq!(s.ret(1, 'a', 1000, 12), Some(2));
    }

    #[test]
    fn a_lost_return_leaves_the_calls_around_it_paired() {
        let mut s = CallStacks::new(true);
        // main calls f, which recurses twice; the innermost f's return record is lost.
        s.call(1, 'm', 1000, 0);
        s.call(1, 'f', 900, 10);
        s.call(1, 'f', 800, 20);
        s.call(1, 'f', 700, 30);
        // The middle f returns: its own call, not the innermost one of the same function.
        assert_eq!(s.ret(1, 'f', 800, 50), Some(30));
        assert_eq!(s.depth(1), 2);
        // A sibling g at the position of the lost one.
        s.call(1, 'g', 800, 60);
        assert_eq!(s.ret(1, 'g', 800, 65), Some(5));
        // The lost return's probe ran: with m and f open, 62 more calls get one, the next none.
        for i in 0..62 {
            s.call(1, 'h', 800 - 8 * i, 66);
        }
        assert_eq!(s.calls_without_return_probe, 0);
        s.call(1, 'h', 100, 67);
        assert_eq!(s.calls_without_return_probe, 1);
        // The outer calls, their own durations.
        assert_eq!(s.ret(1, 'f', 900, 70), Some(60));
        assert_eq!(s.ret(1, 'm', 1000, 90), Some(90));
        assert_eq!(s.depth(1), 0);
    }

    #[test]
    fn frames_left_by_longjmp_are_dropped_at_the_next_call_or_return_above_them() {
        let mut s = CallStacks::new(true);
        // a (sp 900) sets a jump buffer and calls b, which calls c; c longjmps back into a: the
        // kernel runs neither return probe. a calls d where b was, and returns.
        s.call(1, 'a', 900, 10);
        s.call(1, 'b', 800, 20);
        s.call(1, 'c', 700, 30);
        s.call(1, 'd', 800, 40);
        assert_eq!(s.depth(1), 3, "b stays below d: a tail jump from b into d shares its position");
        assert_eq!(s.ret(1, 'd', 800, 45), Some(5));
        assert_eq!(s.ret(1, 'a', 900, 50), Some(40));
        assert_eq!(s.depth(1), 0);
        // Again, straight out of the jump into a's return.
        s.call(1, 'a', 900, 60);
        s.call(1, 'b', 800, 61);
        s.call(1, 'c', 700, 62);
        assert_eq!(s.ret(1, 'a', 900, 70), Some(10));
        assert_eq!(s.depth(1), 0);
    }

    #[test]
    fn tail_jumps_chain_at_one_position() {
        let mut s = CallStacks::new(true);
        // a tail-jumps into b: both entries see the same rsp, and the kernel returns b, then a.
        s.call(1, 'a', 900, 10);
        s.call(1, 'b', 900, 20);
        assert_eq!(s.ret(1, 'b', 900, 30), Some(10));
        assert_eq!(s.ret(1, 'a', 900, 30), Some(20));
        // b's return lost: a's still pairs, and b goes with it.
        s.call(1, 'a', 900, 40);
        s.call(1, 'b', 900, 41);
        assert_eq!(s.ret(1, 'a', 900, 50), Some(10));
        assert_eq!(s.depth(1), 0);
    }

    #[test]
    fn deep_recursion_pairs_with_the_probed_frame() {
        let mut s = CallStacks::new(true);
        let depth = MAX_URETPROBE_DEPTH as u64 + 10;
        let sp = |i: u64| 100_000 - 16 * i;
        for i in 0..depth {
            s.call(1, 'f', sp(i), i);
        }
        assert_eq!(s.calls_without_return_probe, 10);
        // The kernel delivers returns for the outer 64 frames only, innermost probed first: the
        // first return belongs to the call at depth 63 (ts 63), not to the innermost call.
        let first_return_ts = 1_000;
        assert_eq!(s.ret(1, 'f', sp(63), first_return_ts), Some(first_return_ts - 63));
        assert_eq!(s.depth(1), 63);
        for i in (0..63).rev() {
            assert_eq!(s.ret(1, 'f', sp(i), 2_000), Some(2_000 - i));
        }
        assert_eq!(s.depth(1), 0);
    }

    #[test]
    fn without_return_probes_nothing_is_tracked() {
        let mut s = CallStacks::new(false);
        s.call(1, 'a', 1000, 1);
        assert_eq!(s.depth(1), 0);
        assert_eq!(s.ret(1, 'a', 1000, 2), None);
    }

    #[test]
    fn a_thread_that_ends_forgets_its_open_calls() {
        let mut s = CallStacks::new(true);
        s.call(1, 'a', 1000, 1);
        s.thread_ended(1);
        assert_eq!(s.ret(1, 'a', 1000, 2), None);
    }
}
