//! An agent's numbered events, kept until the collector acknowledges them.
//!
//! Every event of a trace gets the next sequence number. The collector acknowledges what it has
//! safely received; the rest stays here, so that after a dropped connection the collector can say
//! where to resume and receives every event once. While no collector is connected the outbox keeps
//! filling up to its bound; beyond it the oldest unacknowledged events are dropped and counted,
//! and a resuming collector is told exactly which sequence numbers are gone.

use std::collections::VecDeque;

use crate::event::Event;

pub struct Outbox {
    /// Sequence number of `events[0]`.
    base: u64,
    events: VecDeque<Event>,
    max: usize,
}

/// What a collector resuming at some sequence number gets.
#[derive(Debug, PartialEq)]
pub struct Pending<'a> {
    /// Sequence numbers that were dropped before the collector got them: (first, count).
    pub gap: Option<(u64, u64)>,
    /// Sequence number of the first event in `events`.
    pub first_seq: u64,
    pub events: Vec<&'a Event>,
}

impl Outbox {
    pub fn new(max: usize) -> Outbox {
        Outbox { base: 0, events: VecDeque::new(), max: max.max(1) }
    }

    /// Sequence number the next event will get.
    pub fn next_seq(&self) -> u64 {
        self.base + self.events.len() as u64
    }

    /// Whether every event has been acknowledged.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    pub fn push(&mut self, event: Event) {
        if self.events.len() == self.max {
            self.events.pop_front();
            self.base += 1;
        }
        self.events.push_back(event);
    }

    /// Forgets everything before `next_seq` (received by the collector).
    pub fn ack(&mut self, next_seq: u64) {
        while self.base < next_seq && self.events.pop_front().is_some() {
            self.base += 1;
        }
    }

    /// Up to `limit` events from `from` on, with the gap if some of them are gone.
    pub fn pending(&self, from: u64, limit: usize) -> Pending<'_> {
        let gap = (from < self.base).then(|| (from, self.base - from));
        let first_seq = from.max(self.base);
        let skip = (first_seq - self.base) as usize;
        Pending { gap, first_seq, events: self.events.iter().skip(skip).take(limit).collect() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::test_events::thread_exit;

    fn ev(ts: u64) -> Event {
        thread_exit(ts, 1)
    }

    fn ts(p: &Pending) -> Vec<u64> {
        p.events.iter().map(|e| e.ts).collect()
    }

    #[test]
    fn resumes_where_the_collector_left_off() {
        let mut o = Outbox::new(10);
        for t in 0..5 {
            o.push(ev(t));
        }
        assert_eq!(o.next_seq(), 5);
        let p = o.pending(0, 3);
        assert_eq!((p.gap, p.first_seq, ts(&p)), (None, 0, vec![0, 1, 2]));
        o.ack(2);
        let p = o.pending(2, 100);
        assert_eq!((p.gap, p.first_seq, ts(&p)), (None, 2, vec![2, 3, 4]));
        assert!(o.pending(5, 100).events.is_empty());
    }

    #[test]
    fn overflow_is_dropped_oldest_first_and_reported() {
        let mut o = Outbox::new(3);
        for t in 0..7 {
            o.push(ev(t));
        }
        let p = o.pending(1, 100);
        assert_eq!(p.gap, Some((1, 3)), "events 1, 2, 3 were dropped");
        assert_eq!((p.first_seq, ts(&p)), (4, vec![4, 5, 6]));
        assert_eq!(o.next_seq(), 7);
    }
}
