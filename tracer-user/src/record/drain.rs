//! Emptying the kernel's ring buffer on a thread of its own.
//!
//! The kernel drops (and counts) a record when the ring buffer is full, so the ring must be
//! emptied as fast as records arrive, even while the sink is busy turning earlier ones into JSON.
//! A dedicated thread copies records out in batches into a bounded queue; the caller turns them
//! into events at its own pace. A burst thus lands in user memory (up to [`QUEUE_BYTES`]) instead
//! of being lost; only a sink that stays slower than the target for longer than that makes the
//! ring fill up again.

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
}

pub struct RingDrain {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<io::Result<()>>>,
    batches: mpsc::Receiver<Batch>,
}

impl RingDrain {
    pub fn spawn(ring: RingBuf<MapData>) -> io::Result<RingDrain> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, batches) = mpsc::channel(QUEUE_BYTES / BATCH_BYTES);
        let thread = std::thread::Builder::new().name("ring-drain".into()).spawn({
            let stop = stop.clone();
            move || drain_loop(ring, &stop, &tx)
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

fn drain_loop(mut ring: RingBuf<MapData>, stop: &AtomicBool, tx: &mpsc::Sender<Batch>) -> io::Result<()> {
    loop {
        // Read the flag before the pass: a stop requested after the programs were detached is
        // followed by one complete pass over what they wrote.
        let stopping = stop.load(Ordering::Acquire);
        loop {
            let mut batch = Batch::default();
            while batch.data.len() < BATCH_BYTES {
                let Some(record) = ring.next() else { break };
                batch.push(&record);
            }
            if batch.is_empty() {
                break;
            }
            if tx.blocking_send(batch).is_err() {
                // The receiver is gone: nobody wants the records any more.
                return Ok(());
            }
        }
        if stopping {
            return Ok(());
        }
        match poll(&mut [PollFd::new(ring.as_fd(), PollFlags::POLLIN)], PollTimeout::from(POLL_MS)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}
