/// Calls a thread may have open before the kernel stops giving them return probes.
pub const MAX_DEPTH: usize = crate::MAX_URETPROBE_DEPTH;
// The eBPF return program masks its index with `MAX_DEPTH - 1`.
const _: () = assert!(MAX_DEPTH.is_power_of_two());
/// Sub-buckets per power of two of the latency histogram: a bucket is at most 1/16 = 6.25%
/// wide, so its midpoint is within 3.2% of any value in it.
pub const SUB_BITS: u32 = 4;
pub const SUB: u64 = 1 << SUB_BITS;
/// Values at or above `2^MAX_EXP` ns (68.7 s) share the last bucket.
pub const MAX_EXP: u32 = 36;
/// Buckets: one per nanosecond below [`SUB`], then [`SUB`] per power of two.
pub const BUCKETS: usize = SUB as usize + (MAX_EXP - SUB_BITS) as usize * SUB as usize;

/// The histogram bucket of a duration (log-linear: exponent, then the next four bits).
#[inline(always)]
pub const fn bucket(ns: u64) -> usize {
    if ns < SUB {
        return ns as usize;
    }
    // floor(log2(ns)) by halving, without a loop or `leading_zeros` (BPF has no clz).
    let mut x = ns;
    let mut exp = 0u32;
    if x >= 1 << 32 {
        x >>= 32;
        exp += 32;
    }
    if x >= 1 << 16 {
        x >>= 16;
        exp += 16;
    }
    if x >= 1 << 8 {
        x >>= 8;
        exp += 8;
    }
    if x >= 1 << 4 {
        x >>= 4;
        exp += 4;
    }
    if x >= 1 << 2 {
        x >>= 2;
        exp += 2;
    }
    if x >= 1 << 1 {
        exp += 1;
    }
    if exp >= MAX_EXP {
        return BUCKETS - 1;
    }
    let sub = (ns >> (exp - SUB_BITS)) & (SUB - 1);
    SUB as usize + (exp - SUB_BITS) as usize * SUB as usize + sub as usize
}

/// The durations a bucket holds: `[low, high)` nanoseconds.
pub const fn bucket_range(index: usize) -> (u64, u64) {
    if index < SUB as usize {
        return (index as u64, index as u64 + 1);
    }
    let i = (index - SUB as usize) as u64;
    let exp = SUB_BITS as u64 + i / SUB;
    let width = 1u64 << (exp - SUB_BITS as u64);
    let low = (1u64 << exp) + (i % SUB) * width;
    if index == BUCKETS - 1 { (low, u64::MAX) } else { (low, low + width) }
}

/// What the kernel keeps per function (or per process and function): updated atomically.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stats {
    /// Entries.
    pub calls: u64,
    /// Returns, each timed into `total_ns` and the histogram.
    pub returns: u64,
    pub total_ns: u64,
    pub histogram: [u64; BUCKETS],
}

/// Key of the by-process statistics.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub pid: u32,
    pub function: u32,
}

/// An open call of a thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    pub ts: u64,
    /// The stack pointer at entry (it points at the return address); the uretprobe sees
    /// it 8 bytes higher.
    pub sp: u64,
    pub function: u32,
    pub _pad: u32,
}

/// A thread's open calls, innermost last.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stack {
    pub depth: u32,
    /// The thread's recording state for `--start-at`/`--stop-at` ([`crate::gate::INITIAL`],
    /// `ON`, `OFF`).
    pub gate: u32,
    pub frames: [Frame; MAX_DEPTH],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log_linear_and_contiguous() {
        let mut previous_high = 0;
        for i in 0..BUCKETS {
            let (low, high) = bucket_range(i);
            assert_eq!(low, previous_high, "bucket {i}");
            assert!(high > low);
            if i >= SUB as usize && i < BUCKETS - 1 {
                assert!((high - low) * SUB <= low, "bucket {i} is at most 1/16 of its low bound wide");
            }
            assert_eq!(bucket(low), i);
            if i < BUCKETS - 1 {
                assert_eq!(bucket(high - 1), i);
            }
            previous_high = high;
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        // 500 µs falls in a bucket 2^14 ns wide (3.1% of it).
        let (low, high) = bucket_range(bucket(500_000));
        assert!(low <= 500_000 && 500_000 < high && high - low == 1 << 14, "{low}..{high}");
    }
}
