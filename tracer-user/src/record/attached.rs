//! The programs attached and the drain of their ring buffer, held as one from the start's commit
//! point (see [`StartGate`](super::StartGate)) to the recording's end. From that point a traced
//! process that execs an unresolved image may be stopped by the kernel (`record/follow.rs`), and
//! only its exec record, somewhere in the ring, says so. However start-up or the recording is
//! left (its normal end, an error returned after the commit point, a recording dropped before it
//! ran, a panic), ending this detaches the programs first, so that nothing is stopped after, then
//! reads what the ring still holds and continues every process stopped there.

use tokio::sync::mpsc::error::TryRecvError;

use super::{
    drain::{Batch, RingDrain},
    follow::{ExecToResolve, continue_process},
};
use crate::kernel::loader::Kernel;

/// How long the drop waits between looks at the drain thread's queue while it finishes its last
/// pass over the ring.
const FINISH_POLL: std::time::Duration = std::time::Duration::from_millis(1);

pub(crate) struct Attached {
    /// `None` once detached.
    kernel: Option<Kernel>,
    /// `None` once joined.
    drain: Option<RingDrain>,
}

impl Attached {
    pub fn new(kernel: Kernel, drain: RingDrain) -> Attached {
        Attached { kernel: Some(kernel), drain: Some(drain) }
    }

    /// The programs, until [`Attached::detach`].
    pub fn kernel(&mut self) -> &mut Kernel {
        self.kernel.as_mut().expect("used before the detach")
    }

    /// The programs loaded (for `record -v`); none once detached.
    pub fn loaded_programs(&self) -> &[&'static str] {
        self.kernel.as_ref().map_or(&[], Kernel::loaded_programs)
    }

    /// Stops tracing and detaches the programs (no process is stopped after this), and asks the
    /// drain for a last pass over the ring.
    pub fn detach(&mut self) {
        if let Some(mut kernel) = self.kernel.take() {
            kernel.stop_tracing();
        }
        if let Some(drain) = &self.drain {
            drain.finish();
        }
    }

    /// The next batch of records; `None` once detached and drained. Too late to attach anything
    /// after the detach: the processes stopped in a batch handed out then are continued here.
    pub async fn recv(&mut self) -> Option<Batch> {
        let batch = self.drain.as_mut()?.recv().await?;
        if self.kernel.is_none() {
            continue_stopped(&batch);
        }
        Some(batch)
    }

    /// Waits for the drain thread, once detached and drained, and reports its error.
    pub fn join(&mut self) -> std::io::Result<()> {
        self.drain.take().map_or(Ok(()), RingDrain::join)
    }
}

impl Drop for Attached {
    /// Left without its end: detach, then continue the processes stopped in what the ring still
    /// holds (waiting for the drain thread's last pass, a few milliseconds).
    fn drop(&mut self) {
        self.detach();
        let Some(drain) = &mut self.drain else { return };
        loop {
            match drain.try_recv() {
                Ok(batch) => continue_stopped(&batch),
                Err(TryRecvError::Empty) => std::thread::sleep(FINISH_POLL),
                Err(TryRecvError::Disconnected) => break,
            }
        }
    }
}

fn continue_stopped(batch: &Batch) {
    for stop in batch.records().filter_map(ExecToResolve::of).filter(|s| s.stopped) {
        continue_process(stop.pid);
    }
}
