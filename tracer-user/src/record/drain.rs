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
        let cut = if stopping { u64::MAX } else { crate::assemble::clock::boot_now_ns() };
        pass.read(&mut ring)?;
        if !pass.hand_over(cut, tx) {
            // The receiver is gone: nobody wants the records any more.
            return Ok(());
        }
        if stopping {
            return Ok(());
        }
        // A record of `EVENTS` left for the next pass may be an exec that a stopped process waits
        // on: that pass comes at once.
        let wait = if pass.events_waiting { 0u16 } else { POLL_MS };
        match poll(&mut [PollFd::new(ring.as_fd(), PollFlags::POLLIN)], PollTimeout::from(wait)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// One thread's records are in `EVENTS` and in the call ring of whichever CPU it ran on, and user
/// space pairs its calls and returns, and ends its open calls at its exec or exit, in the order it
/// receives them. Each pass copies out what every ring holds, then hands over, sorted by
/// timestamp, the records stamped before the pass began (`cut`) and those an earlier pass copied
/// out; the others wait for the next pass.
///
/// Why that keeps each thread's order: a thread publishes a record (an atomic operation, in
/// `EVENTS` and in a call ring alike: visible to every CPU once done) before it reads the clock
/// for its next one. A record handed over is stamped before the cut (one an earlier pass copied
/// out was published, so stamped, before this cut too), so every record its thread wrote before
/// it was published before the cut, which is before this pass read any ring: it is handed over
/// in this pass or was in an earlier one, and it is stamped earlier. Neither a ring's order nor
/// `EVENTS`' is time order (a program can be preempted between its clock read and its write), so
/// no ring's order is relied on.
struct Pass {
    calls: CallRings,
    /// Per call ring: where the next record to copy out lies.
    tails: Vec<u64>,
    /// Records copied out and not handed over yet, in the order they were read; the first
    /// `earlier` by an earlier pass.
    held: Batch,
    earlier: usize,
    /// Per held record: its timestamp, and whether it came from `EVENTS`.
    stamps: Vec<(u64, bool)>,
    /// Whether a record from `EVENTS` was left for the next pass.
    events_waiting: bool,
}

impl Pass {
    fn new(calls: CallRings) -> Self {
        let tails = (0..calls.rings()).map(|ring| calls.tail(ring)).collect();
        Pass { calls, tails, held: Batch::default(), earlier: 0, stamps: Vec::new(), events_waiting: false }
    }

    /// Copies out what `EVENTS` and every call ring hold, giving the call rings' space back.
    fn read(&mut self, ring: &mut RingBuf<MapData>) -> io::Result<()> {
        while let Some(record) = ring.next() {
            self.hold(&record, timestamp(&record), true);
        }
        let Pass { calls, tails, held, stamps, .. } = self;
        for (r, tail) in tails.iter_mut().enumerate() {
            let head = calls.head(r);
            while *tail < head {
                let record = calls.record(r, *tail)?;
                held.push(record);
                stamps.push((timestamp(record), false));
                *tail += record.len() as u64;
            }
            // Copied out: the writer may use the space again.
            calls.set_tail(r, *tail);
        }
        Ok(())
    }

    fn hold(&mut self, record: &[u8], ts: u64, from_events: bool) {
        self.held.push(record);
        self.stamps.push((ts, from_events));
    }

    /// Hands over, in batches, the records stamped before `cut` and those read by an earlier
    /// pass, sorted by timestamp (ties in the order read); `false` if the receiver is gone.
    fn hand_over(&mut self, cut: u64, tx: &mpsc::Sender<Batch>) -> bool {
        let earlier = self.earlier;
        let mut now: Vec<usize> = (0..self.held.len()).filter(|&i| i < earlier || self.stamps[i].0 < cut).collect();
        now.sort_by_key(|&i| self.stamps[i].0);
        let mut batch = Batch::default();
        for i in now {
            batch.push(self.held.record(i));
            if batch.data.len() >= BATCH_BYTES && tx.blocking_send(std::mem::take(&mut batch)).is_err() {
                return false;
            }
        }
        let (mut rest, mut stamps) = (Batch::default(), Vec::new());
        for i in earlier..self.held.len() {
            if self.stamps[i].0 >= cut {
                rest.push(self.held.record(i));
                stamps.push(self.stamps[i]);
            }
        }
        self.events_waiting = stamps.iter().any(|&(_, from_events)| from_events);
        self.earlier = rest.len();
        (self.held, self.stamps) = (rest, stamps);
        batch.is_empty() || tx.blocking_send(batch).is_ok()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_too_short_for_a_timestamp_goes_at_once() {
        assert_eq!(timestamp(&[0; 8]), 0);
        let mut record = [0u8; 24];
        record[8..16].copy_from_slice(&1234u64.to_ne_bytes());
        assert_eq!(timestamp(&record), 1234);
    }
}
