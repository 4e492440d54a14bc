//! An agent's numbered events, kept until the collector acknowledges them.
//!
//! Every event of a trace gets the next sequence number. The collector acknowledges what it has
//! safely received; the rest stays here, so that after a dropped connection the collector can say
//! where to resume and receives every event once. While no collector is connected the outbox keeps
//! filling up to its bounds; beyond them the oldest unacknowledged events are dropped and counted,
//! and a resuming collector is told exactly which sequence numbers are gone.
//!
//! Events are kept encoded, as the wire sends them ([`Encoder::encode`]: a call is about 20 bytes
//! where an `Event` in memory is about 300), in chunks of up to [`CHUNK_BYTES`], each with the
//! offset of every event in it, so that sending from any sequence number is a slice of a chunk.
//! Two bounds: `max_events` (`--buffer-events`) and `max_bytes` (`--buffer-bytes`, the encoded
//! bytes kept, [`DEFAULT_MAX_BYTES`] unless said); the memory held is those bytes, 4 more per
//! event for its offset, and at most one chunk whose oldest events were dropped but whose block is
//! not freed yet.

use std::{collections::VecDeque, sync::Arc};

use super::wire::Encoder;
use crate::event::Event;

/// Encoded bytes a chunk holds at most (past it, the next event starts a new chunk): a chunk is
/// the most one frame carries.
pub const CHUNK_BYTES: usize = 256 << 10;
/// Encoded bytes the outbox keeps at most by default (`--buffer-bytes`): 10 million calls.
pub const DEFAULT_MAX_BYTES: usize = 256 << 20;
/// The least `--buffer-bytes` an agent takes: four chunks.
pub const LEAST_MAX_BYTES: usize = 4 * CHUNK_BYTES;

struct Chunk {
    /// Sequence number of the chunk's event 0.
    first_seq: u64,
    /// Where each event starts in `bytes`.
    starts: Vec<u32>,
    bytes: Vec<u8>,
    /// Events before this one were acknowledged or dropped.
    live: usize,
}

impl Chunk {
    fn end_seq(&self) -> u64 {
        self.first_seq + self.starts.len() as u64
    }

    fn start_of(&self, index: usize) -> usize {
        self.starts.get(index).map_or(self.bytes.len(), |&s| s as usize)
    }
}

pub struct Outbox {
    chunks: VecDeque<Chunk>,
    /// Sequence number of the oldest event kept (the next one if none is).
    base: u64,
    next_seq: u64,
    /// Encoded bytes of the events kept.
    bytes: usize,
    max_events: usize,
    max_bytes: usize,
    chunk_bytes: usize,
    encoder: Encoder,
    peak: Occupancy,
}

/// How full the outbox was at its fullest, and what its bounds dropped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Occupancy {
    pub events: u64,
    pub bytes: usize,
    /// Events dropped because `max_events` (`--buffer-events`) were kept.
    pub dropped_at_max_events: u64,
    /// Events dropped because `max_bytes` (`--buffer-bytes`) were kept.
    pub dropped_at_max_bytes: u64,
}

/// What a collector resuming at some sequence number gets next.
#[derive(Debug, PartialEq)]
pub struct Pending<'a> {
    /// Sequence numbers that were dropped before the collector got them: (first, count).
    pub gap: Option<(u64, u64)>,
    /// Sequence number of the first event in `events`.
    pub first_seq: u64,
    /// How many events `events` holds.
    pub count: u64,
    /// The events, encoded (at most one chunk's worth).
    pub events: &'a [u8],
    /// The trace's string table so far (every name the events refer to).
    pub strings: &'a [Arc<str>],
}

impl Outbox {
    pub fn new(max_events: usize, max_bytes: usize) -> Outbox {
        Outbox::with_bounds(max_events, max_bytes, CHUNK_BYTES)
    }

    fn with_bounds(max_events: usize, max_bytes: usize, chunk_bytes: usize) -> Outbox {
        Outbox {
            chunks: VecDeque::new(),
            base: 0,
            next_seq: 0,
            bytes: 0,
            max_events: max_events.max(1),
            max_bytes,
            chunk_bytes,
            encoder: Encoder::default(),
            peak: Occupancy::default(),
        }
    }

    /// Sequence number the next event will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Whether every event has been acknowledged.
    pub fn is_empty(&self) -> bool {
        self.base == self.next_seq
    }

    /// The outbox at its fullest so far.
    pub fn peak(&self) -> Occupancy {
        self.peak
    }

    /// Numbers and keeps `event`, stamped `ts`; drops the oldest events if a bound is passed.
    pub fn push(&mut self, event: &Event, ts: u64) {
        let full = self.chunks.back().is_none_or(|c| c.bytes.len() >= self.chunk_bytes);
        if full {
            self.chunks.push_back(Chunk {
                first_seq: self.next_seq,
                starts: Vec::new(),
                bytes: Vec::with_capacity(self.chunk_bytes + 1024),
                live: 0,
            });
        }
        let chunk = self.chunks.back_mut().expect("a chunk was just made");
        chunk.starts.push(chunk.bytes.len() as u32);
        self.bytes += self.encoder.encode(event, ts, &mut chunk.bytes);
        self.next_seq += 1;
        // The newest event stays, whatever its size.
        while self.next_seq - self.base > 1
            && (self.next_seq - self.base > self.max_events as u64 || self.bytes > self.max_bytes)
        {
            if self.next_seq - self.base > self.max_events as u64 {
                self.peak.dropped_at_max_events += 1;
            } else {
                self.peak.dropped_at_max_bytes += 1;
            }
            self.drop_oldest();
        }
        let now = self.next_seq - self.base;
        if now > self.peak.events {
            self.peak.events = now;
        }
        self.peak.bytes = self.peak.bytes.max(self.bytes);
    }

    fn drop_oldest(&mut self) {
        let Some(chunk) = self.chunks.front_mut() else { return };
        self.bytes -= chunk.start_of(chunk.live + 1) - chunk.start_of(chunk.live);
        chunk.live += 1;
        self.base += 1;
        if chunk.live == chunk.starts.len() {
            self.chunks.pop_front();
        }
    }

    /// Forgets everything before `next_seq` (received by the collector).
    pub fn ack(&mut self, next_seq: u64) {
        let next_seq = next_seq.min(self.next_seq);
        while let Some(chunk) = self.chunks.front_mut()
            && self.base < next_seq
        {
            if chunk.end_seq() <= next_seq {
                self.bytes -= chunk.bytes.len() - chunk.start_of(chunk.live);
                self.base = chunk.end_seq();
                self.chunks.pop_front();
            } else {
                let to = (next_seq - chunk.first_seq) as usize;
                self.bytes -= chunk.start_of(to) - chunk.start_of(chunk.live);
                chunk.live = to;
                self.base = next_seq;
            }
        }
    }

    /// The events from `from` on, to the end of the chunk holding `from`, with the gap if some of
    /// them are gone.
    pub fn pending(&self, from: u64) -> Pending<'_> {
        let gap = (from < self.base).then(|| (from, self.base - from));
        let first_seq = from.max(self.base);
        let strings = self.encoder.strings();
        let index = self.chunks.partition_point(|c| c.end_seq() <= first_seq);
        let Some(chunk) = self.chunks.get(index).filter(|c| c.first_seq <= first_seq) else {
            return Pending { gap, first_seq, count: 0, events: &[], strings };
        };
        let at = (first_seq - chunk.first_seq) as usize;
        Pending {
            gap,
            first_seq,
            count: chunk.end_seq() - first_seq,
            events: &chunk.bytes[chunk.start_of(at)..],
            strings,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        cluster::wire::{Decoder, batch},
        event::test_events::thread_exit,
    };

    fn ev(ts: u64) -> Event {
        thread_exit(ts, 1)
    }

    /// What a fresh connection decodes from `p`.
    fn ts(p: &Pending) -> Vec<u64> {
        let b = batch(p.first_seq, p.strings, 0, p.events);
        let events = Decoder::default().events(&"h".into(), b).unwrap();
        assert_eq!(events.len() as u64, p.count);
        events.iter().map(|e| e.ts).collect()
    }

    /// Every event from `from` on, chunk after chunk.
    fn all_from(o: &Outbox, mut from: u64) -> (Option<(u64, u64)>, Vec<u64>) {
        let first = o.pending(from);
        let mut got = Vec::new();
        from = first.first_seq;
        loop {
            let p = o.pending(from);
            if p.count == 0 {
                return (first.gap, got);
            }
            got.extend(ts(&p));
            from = p.first_seq + p.count;
        }
    }

    #[test]
    fn resumes_where_the_collector_left_off() {
        let mut o = Outbox::new(10, DEFAULT_MAX_BYTES);
        for t in 0..5 {
            o.push(&ev(0), t);
        }
        assert_eq!(o.next_seq(), 5);
        let p = o.pending(0);
        assert_eq!((p.gap, p.first_seq, ts(&p)), (None, 0, vec![0, 1, 2, 3, 4]));
        o.ack(2);
        let p = o.pending(2);
        assert_eq!((p.gap, p.first_seq, ts(&p)), (None, 2, vec![2, 3, 4]));
        assert_eq!(o.pending(5).count, 0);
        o.ack(5);
        assert!(o.is_empty());
        assert_eq!(o.peak(), Occupancy { events: 5, bytes: o.peak().bytes, ..Default::default() });
    }

    #[test]
    fn overflow_is_dropped_oldest_first_and_reported() {
        let mut o = Outbox::new(3, DEFAULT_MAX_BYTES);
        for t in 0..7 {
            o.push(&ev(0), t);
        }
        let p = o.pending(1);
        assert_eq!(p.gap, Some((1, 3)), "events 1, 2, 3 were dropped");
        assert_eq!((p.first_seq, ts(&p)), (4, vec![4, 5, 6]));
        assert_eq!(o.next_seq(), 7);
        assert_eq!((o.peak().events, o.peak().dropped_at_max_events, o.peak().dropped_at_max_bytes), (3, 4, 0));
    }

    #[test]
    fn resuming_in_the_middle_of_an_encoded_chunk_gets_exactly_the_rest() {
        // Chunks of about 4 events: a resume point inside one, another on a chunk's boundary.
        let size = {
            let mut one = Outbox::new(1, DEFAULT_MAX_BYTES);
            one.push(&ev(0), 1_000_000);
            one.peak().bytes
        };
        let mut o = Outbox::with_bounds(100, usize::MAX, 3 * size);
        for t in 1_000_000..1_000_010 {
            o.push(&ev(0), t);
        }
        assert!(o.chunks.len() >= 3, "{} chunks", o.chunks.len());
        let boundary = o.chunks[1].first_seq;
        for from in [0, 1, 2, 5, boundary, 9, 10] {
            let (gap, got) = all_from(&o, from);
            assert_eq!(gap, None);
            assert_eq!(got, (1_000_000 + from..1_000_010).collect::<Vec<_>>(), "resuming at {from}");
        }
        // Acknowledged up to the middle of a chunk: a resume from before that is a gap.
        o.ack(5);
        let (gap, got) = all_from(&o, 3);
        assert_eq!(gap, Some((3, 2)));
        assert_eq!(got, (1_000_005..1_000_010).collect::<Vec<_>>());
        // Dropped from the middle of a chunk by the bound.
        let mut o = Outbox::with_bounds(6, usize::MAX, 3 * size);
        for t in 0..10 {
            o.push(&ev(0), t);
        }
        let (gap, got) = all_from(&o, 0);
        assert_eq!((gap, got), (Some((0, 4)), (4..10).collect()));
    }

    #[test]
    fn the_byte_bound_drops_oldest_first_and_keeps_the_newest() {
        let mut o = Outbox::with_bounds(1000, 100, 40);
        for t in 0..50 {
            o.push(&ev(0), t);
        }
        assert!(o.bytes <= 100 && o.peak().bytes <= 100, "{} bytes kept", o.bytes);
        let (gap, got) = all_from(&o, 0);
        let kept = got.len() as u64;
        assert!(kept > 1);
        assert_eq!(gap, Some((0, 50 - kept)));
        assert_eq!((o.peak().dropped_at_max_events, o.peak().dropped_at_max_bytes), (0, 50 - kept));
        assert_eq!(got, (50 - kept..50).collect::<Vec<_>>());
        // One event larger than the bound is still kept (and sent).
        let mut o = Outbox::with_bounds(1000, 1, 40);
        o.push(&ev(0), 7);
        assert_eq!(all_from(&o, 0), (None, vec![7]));
    }
}
