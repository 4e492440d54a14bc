//! How large the kernel's ring buffer is: what `--buffer-size` says, or a size fitted to what the
//! trace records and to the CPUs that write it; never more than a share of the host's memory.
//!
//! The ring only has to hold what arrives while the drain is not reading (a scheduling delay, a
//! slow write of the output): the drain empties it continuously. Its cost is the size itself,
//! locked in the kernel, and twice the size in the recorder's resident set, since the kernel maps
//! the data pages twice into the reader (so that a record that wraps is contiguous). A fixed
//! 64 MiB made a trace of `/bin/true` a 197 MiB process; the sizes below keep the common cases
//! small and leave the rest to `--buffer-size`, which the loss message names.

use super::RecordError;

/// The share of the host's memory one ring buffer may take at most (1/16: 1 GiB of 16 GiB): the
/// kernel locks it in, and a request (from `record` or a collector) must not make a root service
/// take the host's memory.
pub const BUFFER_SHARE_OF_MEMORY: u64 = 16;

/// Per CPU, when records can come as fast as the traced code runs (function or USDT probes, IPC
/// events): 4 MiB holds about 45,000 call records, some 20 ms of a tight loop through an
/// optimized probe.
const PER_CPU_FAST: u64 = 4 << 20;
/// Per CPU, for process events alone (spawns, exits, signals): a record per process or signal.
const PER_CPU_PROCESSES: u64 = 512 << 10;
/// The fitted size stays within these (a power of two either way).
const FITTED_MIN: u64 = 1 << 20;
const FITTED_MAX: u64 = 64 << 20;

/// What the trace writes into the ring, as far as its size is concerned.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    /// Records can come as fast as the traced code runs: function or USDT probes are attached,
    /// or IPC events are on.
    pub fast: bool,
    /// CPUs that may write records.
    pub cpus: u64,
}

/// `--buffer-size`, checked: a power of two of at least a page, within the memory bound.
pub fn checked(size: u32) -> Result<u32, RecordError> {
    if !size.is_power_of_two() || size < 4096 {
        return Err(RecordError::BadBufferSize(size));
    }
    check_buffer_size(size, mem_total())?;
    Ok(size)
}

/// The size fitted to `load` on this host.
pub fn fitted_here(load: Load) -> u32 {
    fitted(load, mem_total())
}

/// The size fitted to `load`: per CPU, rounded up to a power of two, within
/// [`FITTED_MIN`]..=[`FITTED_MAX`] and the memory bound.
fn fitted(load: Load, mem_total: u64) -> u32 {
    let per_cpu = if load.fast { PER_CPU_FAST } else { PER_CPU_PROCESSES };
    let size = per_cpu.saturating_mul(load.cpus.max(1)).next_power_of_two().clamp(FITTED_MIN, FITTED_MAX);
    let bound = largest_allowed(mem_total).max(4096);
    size.min(bound) as u32
}

/// The CPUs that write records: the online ones (not the possible ones, which some clouds
/// declare by the hundred).
pub fn cpus() -> u64 {
    aya::util::online_cpus().map_or(1, |cpus| cpus.len() as u64)
}

/// The host's memory (`MemTotal` of `/proc/meminfo`), in bytes; `u64::MAX` if unreadable (then no
/// bound is known, and the kernel's own limits decide).
fn mem_total() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .map_or(u64::MAX, |kb| kb.saturating_mul(1024))
}

/// The largest power of two within [`BUFFER_SHARE_OF_MEMORY`]th of `mem_total` (0 below a page).
fn largest_allowed(mem_total: u64) -> u64 {
    let bound = mem_total / BUFFER_SHARE_OF_MEMORY;
    if bound >= 4096 { 1u64 << bound.ilog2() } else { 0 }
}

/// Refuses a ring buffer of more than [`BUFFER_SHARE_OF_MEMORY`]th of `mem_total`.
fn check_buffer_size(size: u32, mem_total: u64) -> Result<(), RecordError> {
    if u64::from(size) <= mem_total / BUFFER_SHARE_OF_MEMORY {
        return Ok(());
    }
    // The largest power of two within the bound, what the user can give instead.
    Err(RecordError::BufferTooLarge { size, mem_total, max: largest_allowed(mem_total) })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn the_ring_buffer_takes_at_most_a_sixteenth_of_the_memory() {
        assert!(check_buffer_size(1 << 30, 16 * GIB).is_ok());
        let err = check_buffer_size(1 << 31, 16 * GIB).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--buffer-size 2048 MiB is more than 1/16 of this host's memory (16.0 GiB): at most 1024 MiB here"
        );
        // 23.5 GiB: a sixteenth is 1.47 GiB, the largest power of two within it 1 GiB.
        let err = check_buffer_size(1 << 31, 47 * GIB / 2).unwrap_err();
        assert!(err.to_string().ends_with("(23.5 GiB): at most 1024 MiB here"), "{err}");
        assert!(check_buffer_size(1 << 31, u64::MAX).is_ok(), "no bound known");
    }

    #[test]
    fn the_fitted_size_follows_what_is_traced_and_the_cpus() {
        let size = |fast, cpus, mem| fitted(Load { fast, cpus }, mem) >> 10;
        // Calls or IPC: 4 MiB a CPU, rounded up to a power of two, at most 64 MiB.
        assert_eq!(size(true, 1, 24 * GIB), 4 << 10);
        assert_eq!(size(true, 2, 24 * GIB), 8 << 10);
        assert_eq!(size(true, 3, 24 * GIB), 16 << 10);
        assert_eq!(size(true, 64, 24 * GIB), 64 << 10);
        // Process events alone: 512 KiB a CPU, at least 1 MiB, at most 64 MiB.
        assert_eq!(size(false, 1, 24 * GIB), 1 << 10);
        assert_eq!(size(false, 8, 24 * GIB), 4 << 10);
        assert_eq!(size(false, 1024, 24 * GIB), 64 << 10);
        // A small host: never beyond a sixteenth of its memory (512 MiB: 32 MiB).
        assert_eq!(size(true, 64, GIB / 2), 32 << 10);
        assert_eq!(size(true, 0, 24 * GIB), 4 << 10, "an unknown CPU count counts as one");
    }
}
