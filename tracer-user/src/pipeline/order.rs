//! Putting events in time order before they are linked and written.
//!
//! Records reach user space in the order the kernel reserved them, which is each thread's own
//! order but not quite the global one: a send is stamped at its syscall's entry yet recorded at its
//! exit, after the receiver may already have recorded reading those bytes. Events wait here until
//! the trace has moved [`REORDER_WINDOW_NS`] past them, then leave in timestamp order (ties in
//! arrival order, so a thread's own order is kept). The window, and a cap on how many events wait,
//! bound the memory; a send that blocks in the kernel for longer than the window may leave the
//! receives of its first bytes unlinked.

use std::collections::VecDeque;

use crate::event::Event;

/// How far behind the newest event an event is held.
pub const REORDER_WINDOW_NS: u64 = 250_000_000;
/// Most events held at once; past it, the oldest leave early.
pub const MAX_HELD: usize = 1 << 20;

/// Events sorted by timestamp, ties in arrival order. Records come nearly sorted (only a send,
/// stamped at its syscall's entry, arrives late), so an event is placed by searching back from the
/// newest end: almost always one comparison.
pub struct Reorder {
    held: VecDeque<Event>,
    newest: u64,
    window_ns: u64,
    max_held: usize,
}

impl Default for Reorder {
    fn default() -> Self {
        Reorder::new(REORDER_WINDOW_NS, MAX_HELD)
    }
}

impl Reorder {
    pub fn new(window_ns: u64, max_held: usize) -> Self {
        Reorder { held: VecDeque::new(), newest: 0, window_ns, max_held }
    }

    pub fn push(&mut self, event: Event) {
        self.newest = self.newest.max(event.ts);
        // After every held event with a timestamp not above this one's: ties keep arrival order.
        let at = self.held.len() - self.held.iter().rev().take_while(|e| e.ts > event.ts).count();
        self.held.insert(at, event);
    }

    /// The oldest event, if the trace has moved a window past it (or too many wait).
    pub fn pop_ready(&mut self) -> Option<Event> {
        self.pop_older_than(self.newest.saturating_sub(self.window_ns))
    }

    /// The oldest event, if it is older than `cutoff` (or too many wait). With a cutoff from the
    /// clock, events leave even when no newer event comes.
    pub fn pop_older_than(&mut self, cutoff: u64) -> Option<Event> {
        let oldest = self.held.front()?;
        if oldest.ts < cutoff || self.held.len() > self.max_held { self.held.pop_front() } else { None }
    }

    /// Every event, oldest first (at the end of a trace).
    pub fn pop_any(&mut self) -> Option<Event> {
        self.held.pop_front()
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::test_events::thread_exit;

    fn drain(r: &mut Reorder) -> Vec<(u64, u32)> {
        std::iter::from_fn(|| r.pop_ready()).map(|e| (e.ts, e.tid)).collect()
    }

    #[test]
    fn events_leave_in_time_order_once_the_window_passed() {
        let mut r = Reorder::new(100, 1000);
        r.push(thread_exit(50, 1));
        r.push(thread_exit(20, 2));
        assert!(drain(&mut r).is_empty(), "nothing is a window old yet");
        r.push(thread_exit(140, 1));
        assert_eq!(drain(&mut r), [(20, 2)]);
        r.push(thread_exit(300, 1));
        assert_eq!(drain(&mut r), [(50, 1), (140, 1)]);
        r.push(thread_exit(250, 2));
        r.push(thread_exit(260, 3));
        r.push(thread_exit(255, 4));
        assert_eq!(std::iter::from_fn(|| r.pop_any()).map(|e| e.ts).collect::<Vec<_>>(), [250, 255, 260, 300]);
    }

    #[test]
    fn ties_keep_arrival_order() {
        let mut r = Reorder::new(0, 1000);
        for tid in [3, 1, 2] {
            r.push(thread_exit(10, tid));
        }
        let order: Vec<u32> = std::iter::from_fn(|| r.pop_any()).map(|e| e.tid).collect();
        assert_eq!(order, [3, 1, 2]);
    }

    #[test]
    fn the_cap_bounds_what_waits() {
        let mut r = Reorder::new(1_000_000, 2);
        for ts in [5, 1, 3] {
            r.push(thread_exit(ts, 1));
        }
        assert_eq!(drain(&mut r), [(1, 1)]);
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn a_clock_cutoff_releases_idle_events() {
        let mut r = Reorder::new(100, 1000);
        r.push(thread_exit(10, 1));
        assert!(r.pop_ready().is_none());
        assert_eq!(r.pop_older_than(11).map(|e| e.ts), Some(10));
    }
}
