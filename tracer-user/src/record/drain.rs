//! Emptying the kernel's rings on a thread of its own.
//!
//! The programs write calls and returns to per-CPU call rings ([`CallRings`]) and every other
//! record, and the calls a full call ring turns away, to the shared ring buffer (`EVENTS`). The
//! kernel drops (and counts) a record when both are full, so they must be emptied as fast as
//! records arrive, even while the sink is busy turning earlier ones into JSON. A dedicated thread
//! copies records out in batches, merged in time order ([`Pass`]), into a bounded queue; the
//! caller turns them into events at its own pace. A burst thus lands in user memory (up to
//! [`QUEUE_BYTES`]) instead of being lost; only a sink that stays slower than the target for
//! longer than that makes the rings fill up again.

use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    io,
    os::fd::AsFd as _,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
};

use aya::maps::{MapData, RingBuf};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use tokio::sync::mpsc;

use crate::kernel::call_rings::CallRings;

/// Bytes of records per batch handed over.
const BATCH_BYTES: usize = 1 << 20;
/// Most bytes of records waiting in user memory.
pub const QUEUE_BYTES: usize = 512 << 20;
/// How long the thread sleeps in `poll` between passes. The programs wake it only when the ring
/// fills past a threshold (a wake-up per record would cost the traced program dearly), so this
/// bounds the delay of a trickle of events.
const POLL_MS: u16 = 5;

/// Records copied out of the ring buffer, back to back.
#[derive(Default)]
pub struct Batch {
    data: Vec<u8>,
    bounds: Vec<(u32, u32)>,
}

impl Batch {
    pub fn records(&self) -> impl Iterator<Item = &[u8]> {
        self.bounds.iter().map(|&(start, end)| &self.data[start as usize..end as usize])
    }

    pub fn len(&self) -> usize {
        self.bounds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bounds.is_empty()
    }

    fn push(&mut self, record: &[u8]) {
        let start = self.data.len() as u32;
        self.data.extend_from_slice(record);
        self.bounds.push((start, self.data.len() as u32));
    }

    fn record(&self, index: usize) -> &[u8] {
        let (start, end) = self.bounds[index];
        &self.data[start as usize..end as usize]
    }

    /// Forgets the first `n` records.
    fn drop_first(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        if n == self.bounds.len() {
            self.data.clear();
            self.bounds.clear();
            return;
        }
        let offset = self.bounds[n].0;
        self.data.drain(..offset as usize);
        self.bounds.drain(..n);
        for bound in &mut self.bounds {
            *bound = (bound.0 - offset, bound.1 - offset);
        }
    }
}

pub struct RingDrain {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<io::Result<()>>>,
    batches: mpsc::Receiver<Batch>,
}

impl RingDrain {
    pub fn spawn(ring: RingBuf<MapData>, calls: CallRings) -> io::Result<RingDrain> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, batches) = mpsc::channel(QUEUE_BYTES / BATCH_BYTES);
        let thread = std::thread::Builder::new().name("ring-drain".into()).spawn({
            let stop = stop.clone();
            move || drain_loop(ring, calls, &stop, &tx)
        })?;
        Ok(RingDrain { stop, thread: Some(thread), batches })
    }

    /// The next batch; `None` once [`RingDrain::finish`] was called and everything was handed over.
    pub async fn recv(&mut self) -> Option<Batch> {
        self.batches.recv().await
    }

    /// The next batch if one is waiting, without blocking (for a caller outside the runtime).
    pub fn try_recv(&mut self) -> Result<Batch, mpsc::error::TryRecvError> {
        self.batches.try_recv()
    }

    /// Asks the thread to take what the ring still holds and stop. Call it after the programs are
    /// detached, then [`recv`](Self::recv) until `None`.
    pub fn finish(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Waits for the thread and reports its error, if it had one.
    pub fn join(mut self) -> io::Result<()> {
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(io::Error::other("the ring-buffer drain thread panicked")),
            None => Ok(()),
        }
    }
}

fn drain_loop(
    mut ring: RingBuf<MapData>,
    calls: CallRings,
    stop: &AtomicBool,
    tx: &mpsc::Sender<Batch>,
) -> io::Result<()> {
    let mut pass = Pass::new(calls);
    test_delay();
    loop {
        // Read the flag before the pass: a stop requested after the programs were detached is
        // followed by one complete pass over what they wrote.
        let stopping = stop.load(Ordering::Acquire);
        let cut = if stopping { u64::MAX } else { boot_ns()? };
        while let Some(record) = ring.next() {
            pass.events.push(&record);
        }
        if !pass.hand_over(cut, tx)? {
            // The receiver is gone: nobody wants the records any more.
            return Ok(());
        }
        if stopping {
            return Ok(());
        }
        // A record of `EVENTS` left for the next pass may be an exec that a stopped process waits
        // on: that pass comes at once.
        let wait = if pass.events_waiting() { 0u16 } else { POLL_MS };
        match poll(&mut [PollFd::new(ring.as_fd(), PollFlags::POLLIN)], PollTimeout::from(wait)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// One thread's records are in `EVENTS` and in the call ring of whichever CPU it ran on, and user
/// space pairs its calls and returns, and ends its open calls at its exec or exit, in the order it
/// receives them: each pass hands the records over merged by timestamp, and only those stamped
/// before the pass began (`cut`).
///
/// Why that keeps each thread's order: a thread publishes a record (an atomic operation, in
/// `EVENTS` and in a call ring alike: visible to every CPU once done) before it reads the clock
/// for its next one. A record handed over is stamped before the cut, so every record its thread
/// wrote before it was published before the cut, which is before this pass looked at any ring: it
/// is in this pass (or was in an earlier one), and stamped earlier. A record stamped after the cut
/// waits: in its ring (a call ring's tail stays before it) or in `events`.
struct Pass {
    calls: CallRings,
    /// Records taken out of `EVENTS` and not handed over yet, in the ring's order.
    events: Batch,
    /// Of which the first `handed` were handed over, and the first `seen` were read by an earlier
    /// pass.
    handed: usize,
    seen: usize,
    /// Per call ring: the next record to hand over, and the head an earlier pass saw.
    tails: Vec<u64>,
    seen_heads: Vec<u64>,
}

impl Pass {
    fn new(calls: CallRings) -> Self {
        let tails: Vec<u64> = (0..calls.rings()).map(|ring| calls.tail(ring)).collect();
        Pass { seen_heads: tails.clone(), tails, calls, events: Batch::default(), handed: 0, seen: 0 }
    }

    fn events_waiting(&self) -> bool {
        self.handed < self.events.len()
    }

    /// Hands over, in batches, the records stamped before `cut` (and any an earlier pass saw
    /// already: they were stamped before this cut, unless their timestamp is wrong, and then
    /// waiting would not help), merged by timestamp. `false` if the receiver is gone.
    fn hand_over(&mut self, cut: u64, tx: &mpsc::Sender<Batch>) -> io::Result<bool> {
        let heads: Vec<u64> =
            (0..self.calls.rings()).map(|ring| self.calls.head(ring).unwrap_or(self.seen_heads[ring])).collect();
        // Source 0 is `EVENTS`, source 1 + r call ring r; ties go to the lower source.
        let mut next = BinaryHeap::new();
        for source in 0..=heads.len() {
            if let Some(ts) = self.next_ts(source, &heads, cut)? {
                next.push(Reverse((ts, source)));
            }
        }
        let mut batch = Batch::default();
        while let Some(Reverse((_, source))) = next.pop() {
            if source == 0 {
                batch.push(self.events.record(self.handed));
                self.handed += 1;
            } else {
                let (ring, at) = (source - 1, self.tails[source - 1]);
                let record = self.calls.record(ring, at)?.1;
                batch.push(record);
                self.tails[ring] = at + record.len() as u64;
            }
            if let Some(ts) = self.next_ts(source, &heads, cut)? {
                next.push(Reverse((ts, source)));
            }
            if batch.data.len() >= BATCH_BYTES && !self.send(std::mem::take(&mut batch), tx) {
                return Ok(false);
            }
        }
        self.seen_heads = heads;
        self.events.drop_first(self.handed);
        self.handed = 0;
        self.seen = self.events.len();
        Ok(batch.is_empty() || self.send(batch, tx))
    }

    /// The timestamp of `source`'s next record, if it is to be handed over in this pass.
    fn next_ts(&self, source: usize, heads: &[u64], cut: u64) -> io::Result<Option<u64>> {
        let (ts, seen) = if source == 0 {
            if self.handed == self.events.len() {
                return Ok(None);
            }
            (timestamp(self.events.record(self.handed)), self.handed < self.seen)
        } else {
            let (ring, at) = (source - 1, self.tails[source - 1]);
            if at >= heads[ring] {
                return Ok(None);
            }
            (self.calls.record(ring, at)?.0, at < self.seen_heads[ring])
        };
        Ok((seen || ts < cut).then_some(ts))
    }

    /// Gives the call rings' space back (their records are copied into `batch`), then sends it.
    fn send(&self, batch: Batch, tx: &mpsc::Sender<Batch>) -> bool {
        for (ring, &tail) in self.tails.iter().enumerate() {
            self.calls.set_tail(ring, tail);
        }
        tx.blocking_send(batch).is_ok()
    }
}

/// A record's `RecordHeader::ts_boot_ns`, or 0 (hand it over now) for one too short to have one.
fn timestamp(record: &[u8]) -> u64 {
    const AT: usize = std::mem::offset_of!(tracer_common::RecordHeader, ts_boot_ns);
    record.get(AT..AT + 8).map_or(0, |b| u64::from_ne_bytes(b.try_into().expect("8 bytes")))
}

/// A test-only hook: with `TRACER_TEST_DRAIN_DELAY_MS` set, the drain starts that late, so that a
/// test can fill the call rings and see the records past them go to `EVENTS` and still come out
/// in order (`tests/tests/record.rs`). Not an option: nothing but that test has a use for it.
fn test_delay() {
    if let Some(ms) = std::env::var("TRACER_TEST_DRAIN_DELAY_MS").ok().and_then(|v| v.parse().ok()) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// Now, on the clock the programs stamp records with (`bpf_ktime_get_boot_ns`).
fn boot_ns() -> io::Result<u64> {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)?;
    Ok(now.tv_sec() as u64 * 1_000_000_000 + now.tv_nsec() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(records: &[&[u8]]) -> Batch {
        let mut b = Batch::default();
        for r in records {
            b.push(r);
        }
        b
    }

    #[test]
    fn dropping_the_first_records_keeps_the_rest_whole() {
        let mut b = batch(&[b"one", b"three", b"xy"]);
        b.drop_first(1);
        assert_eq!(b.records().collect::<Vec<_>>(), [&b"three"[..], b"xy"]);
        b.drop_first(0);
        assert_eq!(b.len(), 2);
        b.drop_first(2);
        assert!(b.is_empty() && b.data.is_empty());
    }

    #[test]
    fn a_record_too_short_for_a_timestamp_goes_at_once() {
        assert_eq!(timestamp(&[0; 8]), 0);
        let mut record = [0u8; 24];
        record[8..16].copy_from_slice(&1234u64.to_ne_bytes());
        assert_eq!(timestamp(&record), 1234);
    }
}
