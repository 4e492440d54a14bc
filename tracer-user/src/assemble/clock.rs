//! Kernel timestamps to Unix time.
//!
//! The eBPF programs stamp records with `bpf_ktime_get_boot_ns()`, i.e. `CLOCK_BOOTTIME`: monotonic,
//! the same on every CPU, and still counting across suspend. User space converts to nanoseconds
//! since the Unix epoch by adding `CLOCK_REALTIME - CLOCK_BOOTTIME`, measured once at start-up: it
//! reads BOOTTIME, REALTIME, BOOTTIME in quick succession several times and keeps the reading with
//! the narrowest bracket, whose half-width is the stated uncertainty. One offset serves the whole
//! trace, so durations and ordering within a trace are exactly the kernel's, even if NTP steps the
//! wall clock mid-trace.

use nix::time::{ClockId, clock_gettime};

use crate::event::ClockInfo;

const SAMPLES: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BootClock {
    /// `CLOCK_REALTIME - CLOCK_BOOTTIME`, nanoseconds.
    offset_ns: i64,
    uncertainty_ns: u64,
}

/// Now, on the clock the programs stamp records with.
pub fn boot_now_ns() -> u64 {
    now_ns(ClockId::CLOCK_BOOTTIME) as u64
}

fn now_ns(clock: ClockId) -> i64 {
    let t = clock_gettime(clock).expect("CLOCK_BOOTTIME and CLOCK_REALTIME exist on every Linux kernel we run on");
    t.tv_sec() * 1_000_000_000 + t.tv_nsec()
}

impl BootClock {
    /// Measures the offset now.
    pub fn calibrate() -> Self {
        (0..SAMPLES)
            .map(|_| {
                let before = now_ns(ClockId::CLOCK_BOOTTIME);
                let real = now_ns(ClockId::CLOCK_REALTIME);
                let after = now_ns(ClockId::CLOCK_BOOTTIME);
                let width = (after - before).max(0) as u64;
                BootClock { offset_ns: real - (before + (after - before) / 2), uncertainty_ns: width.div_ceil(2) }
            })
            .min_by_key(|c| c.uncertainty_ns)
            .expect("SAMPLES > 0")
    }

    /// A clock with a known offset (for tests and for traces read back from a file).
    pub fn with_offset(offset_ns: i64) -> Self {
        BootClock { offset_ns, uncertainty_ns: 0 }
    }

    /// A kernel `CLOCK_BOOTTIME` stamp as nanoseconds since the Unix epoch.
    pub fn to_unix_ns(&self, boot_ns: u64) -> u64 {
        (boot_ns as i64).saturating_add(self.offset_ns).max(0) as u64
    }

    /// The current time as the kernel would stamp it, in Unix nanoseconds.
    pub fn now_unix_ns(&self) -> u64 {
        self.to_unix_ns(now_ns(ClockId::CLOCK_BOOTTIME) as u64)
    }

    pub fn info(&self) -> ClockInfo {
        ClockInfo {
            source: "CLOCK_BOOTTIME (bpf_ktime_get_boot_ns)".to_string(),
            offset_ns: self.offset_ns,
            uncertainty_ns: self.uncertainty_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_with_the_offset() {
        let c = BootClock::with_offset(1_000);
        assert_eq!(c.to_unix_ns(5), 1_005);
    }

    #[test]
    fn calibrated_clock_agrees_with_realtime() {
        let c = BootClock::calibrate();
        let real = now_ns(ClockId::CLOCK_REALTIME) as u64;
        let ours = c.now_unix_ns();
        // Both were read within a few microseconds of each other.
        assert!(ours.abs_diff(real) < 50_000_000, "boot clock {ours} vs realtime {real}");
        assert!(c.info().uncertainty_ns < 1_000_000);
    }
}
