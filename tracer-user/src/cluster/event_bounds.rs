//! What a collector takes from an agent as an event of its host: pids a Linux host can have, and
//! timestamps within the trace. An event outside them is no host's: taken, a pid of 2^22 or more
//! would land in another host's range of the visual exports ([`crate::export::hosts`]), and a
//! timestamp near `u64::MAX` would wrap when clocks are corrected. The agent that sends one ends
//! its host's part of the trace ([`super::reconnect`]).

use std::time::{Duration, Instant};

use crate::event::{Event, EventData, TargetInfo, TraceStart, data};

/// Linux pids and thread ids are below `PID_MAX_LIMIT` (2^22).
pub const PID_MAX_LIMIT: u32 = 1 << 22;
/// How far an event's timestamp may lie outside its trace's window on the agent's clock (before
/// the trace's start, or after the agent's now as the collector reckons it): what a clock that
/// steps, or a record read late, may account for.
pub const MAX_CLOCK_STRAY: Duration = Duration::from_secs(60);
/// Clock drift allowed on top, per unit of time elapsed (a thousand times a real clock's).
const DRIFT_PER_SECOND: f64 = 0.5;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BoundError {
    #[error("event #{seq} names pid or thread id {pid}: Linux ids are below 2^22 (PID_MAX_LIMIT)")]
    Pid { seq: u64, pid: u32 },
    #[error("the trace's start names pid {pid}: Linux ids are below 2^22 (PID_MAX_LIMIT)")]
    StartPid { pid: u32 },
    #[error(
        "event #{seq} is stamped {ts} ns, outside the trace's window on the agent's clock ({from} to {to} ns, {} s allowed either side)",
        MAX_CLOCK_STRAY.as_secs()
    )]
    Timestamp { seq: u64, ts: u64, from: u64, to: u64 },
    #[error("events arrived before the trace's start")]
    NoStart,
}

/// A trace's window on its agent's clock: from its start, as the agent stamped it, to the
/// agent's now, as the collector reckons it from the time since the start arrived.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub start_ns: u64,
    pub arrived: Instant,
}

impl Window {
    /// The timestamps an event may have now.
    pub fn bounds(&self) -> (u64, u64) {
        let elapsed = self.arrived.elapsed();
        let stray = MAX_CLOCK_STRAY + elapsed.mul_f64(DRIFT_PER_SECOND);
        let stray = stray.as_nanos() as u64;
        let from = self.start_ns.saturating_sub(stray);
        let to = self.start_ns.saturating_add(elapsed.as_nanos() as u64).saturating_add(stray);
        (from, to)
    }
}

/// Every process and thread id an event names.
fn ids(event: &Event) -> impl Iterator<Item = u32> {
    let mut ids = vec![event.pid, event.tid];
    match &event.data {
        EventData::Spawn(data::Spawn { parent_pid, child_pid, child_tid, .. }) => {
            ids.extend([*parent_pid, *child_pid, *child_tid])
        }
        EventData::Signal(data::Signal { sender_pid, target_pid, target_tid, .. }) => {
            ids.extend([*sender_pid, *target_pid, *target_tid])
        }
        _ => {}
    }
    ids.into_iter()
}

/// Checks event number `seq` of a host against the ids a host can have and `bounds` (from
/// [`Window::bounds`], taken once per batch).
pub fn check(event: &Event, seq: u64, (from, to): (u64, u64)) -> Result<(), BoundError> {
    if let Some(pid) = ids(event).find(|&id| id >= PID_MAX_LIMIT) {
        return Err(BoundError::Pid { seq, pid });
    }
    if !(from..=to).contains(&event.ts) {
        return Err(BoundError::Timestamp { seq, ts: event.ts, from, to });
    }
    Ok(())
}

/// Checks the pids a trace's start names.
pub fn check_start(start: &TraceStart) -> Result<(), BoundError> {
    for target in &start.targets {
        let pid = match target {
            TargetInfo::Process { pid, .. } | TargetInfo::Command { pid, .. } => *pid,
            TargetInfo::Binary { .. } => continue,
        };
        if pid >= PID_MAX_LIMIT {
            return Err(BoundError::StartPid { pid });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(pid: u32, ts: u64) -> Event {
        Event {
            ts,
            host: "h".into(),
            pid,
            tid: pid,
            data: EventData::Exit(data::Exit { exit_code: Some(0), signal: None, thread: false, comm: "a".into() }),
        }
    }

    #[test]
    fn ids_and_timestamps_a_host_cannot_have_are_refused() {
        let start = 1_700_000_000_000_000_000;
        let window = Window { start_ns: start, arrived: Instant::now() };
        let bounds = window.bounds();
        assert_eq!(check(&exit((1 << 22) - 1, start + 5), 3, bounds), Ok(()));
        assert_eq!(
            check(&exit(1 << 22, start), 3, bounds).unwrap_err().to_string(),
            "event #3 names pid or thread id 4194304: Linux ids are below 2^22 (PID_MAX_LIMIT)"
        );
        let mut spawn = exit(10, start);
        spawn.data = EventData::Spawn(data::Spawn {
            parent_pid: 10,
            child_pid: u32::MAX,
            child_tid: 11,
            how: crate::event::SpawnHow::Fork,
            comm: "a".into(),
            filename: None,
        });
        assert_eq!(check(&spawn, 0, bounds), Err(BoundError::Pid { seq: 0, pid: u32::MAX }));
        assert!(check(&exit(1, start - 59_000_000_000), 0, bounds).is_ok(), "within the stray allowed");
        assert!(matches!(check(&exit(1, u64::MAX - 5), 7, bounds), Err(BoundError::Timestamp { seq: 7, .. })));
        assert!(matches!(check(&exit(1, start - 61_000_000_000), 7, bounds), Err(BoundError::Timestamp { .. })));
    }
}
