//! Whether an interrupted start-up may still walk away. Until [`Recording::start`] marks its targets
//! as traced, nothing in the kernel stops any process, and a start interrupted by Ctrl-C can exit
//! at once. From then on a traced process that execs an unresolved image is stopped until tracer
//! continues it (`record/follow.rs`), so a start that got there must end as a recording, whose end
//! continues them: exiting instead would leave a `-p` target, or a child of it, stopped.
//!
//! [`Recording::start`]: crate::record::Recording::start

use std::sync::atomic::{AtomicU8, Ordering};

use crate::plan::RecordError;

const OPEN: u8 = 0;
const ABANDONED: u8 = 1;
const COMMITTED: u8 = 2;

/// Decided once, by whichever comes first: the start reaching its targets ([`StartGate::commit`])
/// or the caller giving up on it ([`StartGate::abandon`]).
#[derive(Debug, Default)]
pub struct StartGate(AtomicU8);

impl StartGate {
    /// The start is about to trace its targets: `Err(Abandoned)` if the caller gave up first (then
    /// nothing is traced), else it is committed and the caller waits for its recording.
    pub(crate) fn commit(&self) -> Result<(), RecordError> {
        match self.0.compare_exchange(OPEN, COMMITTED, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Ok(()),
            Err(_) => Err(RecordError::Abandoned),
        }
    }

    /// Gives up on the start: `true` if it had not traced anything and now never will (exit at
    /// once); `false` if it is committed: wait for its recording and end that.
    pub fn abandon(&self) -> bool {
        match self.0.compare_exchange(OPEN, ABANDONED, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => true,
            Err(state) => state == ABANDONED,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_decision_holds() {
        let gate = StartGate::default();
        assert!(gate.abandon());
        assert!(matches!(gate.commit(), Err(RecordError::Abandoned)));
        assert!(gate.abandon());

        let gate = StartGate::default();
        gate.commit().unwrap();
        assert!(!gate.abandon());
    }
}
