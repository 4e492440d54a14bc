//! The status line of long work (`record`, `collect`): while it runs and stderr is a terminal,
//! one line on stderr says how far it has got (elapsed time, events per second over the last
//! second, events so far, lost so far), redrawn about once a second and cleared when the work
//! ends, so that the final summary lines stand alone. When stderr is not a terminal (a log
//! file, a test, a pipe) nothing is written. A message written while the line is drawn erases it
//! first ([`erase`]); the next redraw brings it back below the message.

use std::{
    future::Future,
    io::{IsTerminal as _, Write as _},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

const REDRAW_EVERY: Duration = Duration::from_secs(1);
/// Back to the start of the line and erase it (ANSI CSI EL 0): what every redraw starts with and
/// what is left when the work ends.
pub const CLEAR: &str = "\r\x1b[K";

/// Whether a status line is on the terminal now (there is one stderr, so one status line).
static DRAWN: AtomicBool = AtomicBool::new(false);

/// What a message written to stderr starts with: [`CLEAR`] if a status line is drawn (which it
/// then no longer is), else nothing.
pub fn erase() -> &'static str {
    if DRAWN.swap(false, Ordering::Relaxed) { CLEAR } else { "" }
}

/// Writes one message line to stderr, the status line erased first.
pub fn say(message: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{}{message}", erase());
}

/// Runs `work`, and meanwhile, on a terminal, redraws a status line from `counts` (events so
/// far, lost so far); `noun` says what happened to the events ("written", "received").
pub async fn with_status<T>(noun: &str, counts: impl Fn() -> (u64, u64), work: impl Future<Output = T>) -> T {
    if !std::io::stderr().is_terminal() {
        return work.await;
    }
    tokio::pin!(work);
    let started = Instant::now();
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + REDRAW_EVERY, REDRAW_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut last_events, mut last_at) = (0, started);
    let result = loop {
        tokio::select! {
            result = &mut work => break result,
            _ = ticks.tick() => {
                let (events, lost) = counts();
                let now = Instant::now();
                let rate = events.saturating_sub(last_events) as f64 / now.duration_since(last_at).as_secs_f64().max(1e-3);
                (last_events, last_at) = (events, now);
                // A status line that cannot be written is not worth stopping the work for.
                let _ = write!(std::io::stderr().lock(), "{CLEAR}{}", line(now - started, rate, events, noun, lost));
                DRAWN.store(true, Ordering::Relaxed);
            }
        }
    };
    let _ = write!(std::io::stderr(), "{}", erase());
    result
}

fn line(elapsed: Duration, rate: f64, events: u64, noun: &str, lost: u64) -> String {
    format!("tracer: {} s, {rate:.0} events/s, {events} events {noun}, {lost} lost", elapsed.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_elapsed_rate_events_and_lost() {
        assert_eq!(
            line(Duration::from_millis(3400), 1234.6, 5000, "written", 7),
            "tracer: 3 s, 1235 events/s, 5000 events written, 7 lost"
        );
    }
}
