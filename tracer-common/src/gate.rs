/// Gated calls a thread may have open: a call nested deeper is not written (the kernel gives
/// no return probe past these either).
pub const MAX_OPEN: usize = crate::MAX_URETPROBE_DEPTH;
const _: () = assert!(MAX_OPEN.is_power_of_two() && MAX_OPEN <= 64);
/// Threads with a gate at once (the `GATES` LRU map's size): past it the least recently used
/// thread's gate is dropped, and that thread starts again as a new one would.
pub const MAX_THREADS: u32 = 8192;

/// [`Thread::state`]: as a new thread starts (recording, unless some `--start-at` was given),
/// recording, not recording.
pub const INITIAL: u32 = 0;
pub const ON: u32 = 1;
pub const OFF: u32 = 2;

/// Roles of a function (the `GATE_ROLES` map's values, by function index): entering a start
/// function turns its thread's recording on (the call is written), a stop function off (the
/// call is not).
pub const START: u8 = 1;
pub const STOP: u8 = 2;
/// The function has no return probe: its calls are decided but never opened.
pub const NO_RETURN: u8 = 4;

/// One thread's gate; all zeros is a new thread's.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thread {
    pub state: u32,
    /// Calls open, innermost last.
    pub open: u32,
    /// Bit i: the open call i was written.
    pub written: u64,
    /// The stack pointer at each open call's entry.
    pub sp: [u64; MAX_OPEN],
}
