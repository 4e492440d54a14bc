//! The two clocks a tracing loop waits on (`record`'s and `top`'s): the end of `--duration`, and
//! the tick on which it checks whether its targets are gone.

use std::time::Duration;

use tokio::time::{Instant, Interval, MissedTickBehavior};

/// How often liveness of the targets is checked.
const TICK: Duration = Duration::from_millis(50);

/// The liveness tick: every 50 ms, a tick missed while the loop was busy delayed, not bunched.
pub fn liveness_tick() -> Interval {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tick
}

/// When `--duration` ends, fixed at the start. [`Deadline::reached`] is made anew in each turn of
/// a `select!` loop and completes at the same instant each time; without a duration, never.
#[derive(Clone, Copy, Debug)]
pub struct Deadline(Option<Instant>);

impl Deadline {
    /// `duration` from now; `None`: no end.
    pub fn after(duration: Option<Duration>) -> Self {
        Self(duration.map(|d| Instant::now() + d))
    }

    pub async fn reached(self) {
        match self.0 {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }
}
