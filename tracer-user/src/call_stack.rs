//! Pairing returns with calls, per thread, the way the kernel pairs them.
//!
//! A uretprobe hijacks the return address when the function is entered, so returns arrive exactly
//! in reverse order of the calls that got a return probe. The kernel gives a thread at most
//! [`MAX_URETPROBE_DEPTH`] pending return probes: a call made deeper than that has no return event
//! at all. The stack models that, so that in deep recursion a return is paired with the call it
//! really belongs to, not with the innermost call of the same function.

use std::collections::HashMap;

/// The kernel's `MAX_URETPROBE_DEPTH` (include/linux/uprobes.h).
pub const MAX_URETPROBE_DEPTH: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Frame<K> {
    key: K,
    ts: u64,
    /// Whether the kernel installed a return probe for this call.
    returns: bool,
}

#[derive(Debug)]
struct ThreadStack<K> {
    frames: Vec<Frame<K>>,
    /// Frames with `returns` set: the kernel's pending return probes for this thread.
    pending: usize,
}

/// The open calls of every thread.
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

    pub fn call(&mut self, tid: u32, key: K, ts: u64) {
        if !self.return_probes {
            return;
        }
        let stack = self.threads.entry(tid).or_insert_with(|| ThreadStack { frames: Vec::new(), pending: 0 });
        let returns = stack.pending < MAX_URETPROBE_DEPTH;
        if returns {
            stack.pending += 1;
        } else {
            self.calls_without_return_probe += 1;
        }
        stack.frames.push(Frame { key, ts, returns });
    }

    /// The duration of the call this return ends, or `None` if that call was not seen.
    pub fn ret(&mut self, tid: u32, key: K, ts: u64) -> Option<u64> {
        let stack = self.threads.get_mut(&tid)?;
        // The innermost call that got a return probe is the one returning. Calls above it that had
        // none (past the depth limit) ended without a return event.
        let top = stack.frames.iter().rposition(|f| f.returns)?;
        if stack.frames[top].key != key {
            // Not the call we expected: the call record was lost, or the call began before
            // tracing did. Leave the stack alone.
            return None;
        }
        let frame = stack.frames[top];
        stack.frames.truncate(top);
        stack.pending -= 1;
        Some(ts.saturating_sub(frame.ts))
    }

    pub fn thread_exited(&mut self, tid: u32) {
        self.threads.remove(&tid);
    }

    /// Number of calls currently open on `tid`.
    pub fn depth(&self, tid: u32) -> usize {
        self.threads.get(&tid).map_or(0, |s| s.frames.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_nested_calls() {
        let mut s = CallStacks::new(true);
        s.call(1, 'a', 10);
        s.call(1, 'b', 20);
        assert_eq!(s.ret(1, 'b', 25), Some(5));
        assert_eq!(s.ret(1, 'a', 40), Some(30));
        assert_eq!(s.depth(1), 0);
    }

    #[test]
    fn threads_are_independent() {
        let mut s = CallStacks::new(true);
        s.call(1, 'a', 10);
        s.call(2, 'a', 12);
        assert_eq!(s.ret(1, 'a', 20), Some(10));
        assert_eq!(s.ret(2, 'a', 30), Some(18));
    }

    #[test]
    fn unseen_calls_have_no_duration() {
        let mut s = CallStacks::new(true);
        assert_eq!(s.ret(1, 'a', 5), None);
        s.call(1, 'a', 10);
        // A return for a function whose call was lost does not disturb the open call.
        assert_eq!(s.ret(1, 'b', 11), None);
        assert_eq!(s.ret(1, 'a', 12), Some(2));
    }

    #[test]
    fn deep_recursion_pairs_with_the_probed_frame() {
        let mut s = CallStacks::new(true);
        let depth = MAX_URETPROBE_DEPTH + 10;
        for i in 0..depth {
            s.call(1, 'f', i as u64);
        }
        assert_eq!(s.calls_without_return_probe, 10);
        // The kernel delivers returns for the outer 64 frames only, innermost probed first: the
        // first return belongs to the call at depth 63 (ts 63), not to the innermost call.
        let first_return_ts = 1_000;
        assert_eq!(s.ret(1, 'f', first_return_ts), Some(first_return_ts - 63));
        assert_eq!(s.depth(1), 63);
        for i in (0..63).rev() {
            assert_eq!(s.ret(1, 'f', 2_000), Some(2_000 - i));
        }
        assert_eq!(s.depth(1), 0);
    }

    #[test]
    fn without_return_probes_nothing_is_tracked() {
        let mut s = CallStacks::new(false);
        s.call(1, 'a', 1);
        assert_eq!(s.depth(1), 0);
        assert_eq!(s.ret(1, 'a', 2), None);
    }

    #[test]
    fn thread_exit_forgets_open_calls() {
        let mut s = CallStacks::new(true);
        s.call(1, 'a', 1);
        s.thread_exited(1);
        assert_eq!(s.ret(1, 'a', 2), None);
    }
}
