//! Triggers and depth (`--start-at`, `--stop-at`, `--depth`), decided here at each entry of a
//! function whose cookie has `cookie::GATED`, before anything is written: each thread's gate (see
//! `tracer_common::gate`) says whether the thread records, and holds its open gated calls by entry
//! stack pointer with whether each was written; the return probe asks it whether to write.
//!
//! The gates are in an LRU map of `gate::MAX_THREADS` threads (528 bytes each), removed when a
//! thread exits: past the bound, the least recently used thread's gate is dropped, and that
//! thread starts again as a new one would (the returns of its calls open then are dropped and
//! counted as `returns_unmatched`).

use aya_ebpf::{
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray},
};
use tracer_common::{
    cookie,
    gate::{INITIAL, MAX_OPEN, MAX_THREADS, NO_RETURN, OFF, ON, START, STOP, Thread},
};

use crate::{
    filter::FILTER_COUNTS,
    maps::{config, opaque},
};

/// Each thread's gate, by thread id.
#[map]
static GATES: LruHashMap<u32, Thread> = LruHashMap::with_max_entries(MAX_THREADS, 0);

/// The role of each function whose cookie has `cookie::GATE_ROLE` (`gate::START`, `STOP`,
/// `NO_RETURN`), by function index; filled by user space before the probes are attached.
#[map]
pub static GATE_ROLES: HashMap<u32, u8> = HashMap::with_max_entries(16384, 0);

/// A new thread's gate to insert from (too big for the BPF stack): all zeros, never written.
#[map]
static ZERO_GATE: PerCpuArray<Thread> = PerCpuArray::with_max_entries(1, 0);

/// The gate of thread `tid`, a new one if it has none.
#[inline(always)]
fn thread(tid: u32) -> Option<&'static mut Thread> {
    if let Some(t) = GATES.get_ptr_mut(&tid) {
        // SAFETY: the thread's own map value (only its probes touch it), valid for this run.
        return Some(unsafe { &mut *t });
    }
    let zero = ZERO_GATE.get_ptr(0)?;
    // SAFETY: a per-CPU map value that is never written: all zeros.
    GATES.insert(&tid, unsafe { &*zero }, 0).ok()?;
    // SAFETY: as above.
    GATES.get_ptr_mut(&tid).map(|t| unsafe { &mut *t })
}

/// The stack pointer of the innermost open call, if any.
#[inline(always)]
fn innermost(t: &Thread) -> Option<u64> {
    let open = t.open as usize;
    if open == 0 {
        return None;
    }
    // Never past MAX_OPEN (a power of two); the mask bounds the register the access uses, which
    // verifiers before 6.8 need (see `top::top_frame`).
    Some(t.sp[(open - 1) & (MAX_OPEN - 1)])
}

/// Forgets the open calls whose entry stack pointer is at or below `sp`: their returns never
/// came (`longjmp`, an exception), as a live caller's return address is always above its
/// callee's.
#[inline(never)]
fn drop_unwound(t: &mut Thread, sp: u64) {
    for _ in 0..MAX_OPEN {
        match innermost(t) {
            Some(open) if open <= sp => t.open -= 1,
            _ => break,
        }
    }
}

/// Whether the call of `cookie`'s function entering now on thread `tid` with stack pointer `sp`
/// is written; the call is opened on the thread's gate (unless the function has no return
/// probe) and counted (seen; filtered by trigger or by depth).
#[inline(never)]
pub fn enter(cookie: u64, tid: u32, sp: u64) -> bool {
    let function = cookie::function(cookie);
    // SAFETY: a per-CPU map value; a program runs on one CPU from start to end.
    let counts = FILTER_COUNTS.get_ptr_mut(function).map(|c| unsafe { &mut *c });
    let Some(t) = thread(tid) else {
        // No room even after eviction (never with an LRU map): written, as without gates.
        return true;
    };
    // A sibling called at the same stack pointer would still find an earlier call open there
    // only if its return was never seen; a tail call's callee shares its caller's, and both stay.
    drop_unwound(t, sp.wrapping_sub(1));
    let role = role(cookie);
    let recording = recording(&mut t.state, role);
    let config = config();
    let open = t.open as usize;
    let too_deep = open >= MAX_OPEN || (config.max_depth != 0 && open >= config.max_depth as usize);
    let write = recording && !too_deep;
    if role & NO_RETURN == 0 && open < MAX_OPEN {
        let i = opaque(open as u64) as usize & (MAX_OPEN - 1);
        t.sp[i] = sp;
        if write {
            t.written |= 1 << i;
        } else {
            t.written &= !(1 << i);
        }
        t.open = open as u32 + 1;
    }
    if let Some(c) = counts {
        c.seen += 1;
        if !write {
            c.filtered += 1;
            if recording {
                c.by_depth += 1;
            } else {
                c.by_trigger += 1;
            }
        }
    }
    write
}

/// The role of `cookie`'s function (`gate::START`, ...).
#[inline(always)]
fn role(cookie: u64) -> u8 {
    if !cookie::has_gate_role(cookie) {
        return 0;
    }
    // SAFETY: a map value read at once; user space never changes it while probes run.
    GATE_ROLES.get_ptr(cookie::function(cookie)).map_or(0, |r| unsafe { *r })
}

/// Whether a thread in `state` records once it has entered a function of `role` (its state then).
#[inline(always)]
fn recording(state: &mut u32, role: u8) -> bool {
    if role & START != 0 {
        *state = ON;
    } else if role & STOP != 0 {
        *state = OFF;
    }
    match *state {
        INITIAL => config().start_off == 0,
        s => s == ON,
    }
}

/// `tracer top`: whether the call of `cookie`'s function entering now on a thread whose
/// recording state is `state` and which has `timed` calls open (its stack in `top`) is timed.
/// Its depth is that of the calls being timed: a call not timed is not on the stack.
#[inline(always)]
pub fn top_times(state: &mut u32, cookie: u64, timed: u32) -> bool {
    let recording = recording(state, role(cookie));
    let max_depth = config().max_depth;
    recording && (max_depth == 0 || timed < max_depth)
}

/// Whether the call of `cookie`'s function that entered with stack pointer `entry_sp` on thread
/// `tid`, returning now, was written; it is closed on the thread's gate. A call the gate does not
/// hold (it began before tracing did, or nested past `MAX_OPEN`, or the gate was evicted) was
/// not written. `maybe_inside`: the probe is on a `jmp reg` that may stay inside the function
/// (a switch): the call is closed only if `entry_sp` is its own, and nothing is counted.
#[inline(never)]
pub fn leave(cookie: u64, tid: u32, entry_sp: u64, maybe_inside: bool) -> bool {
    let found = match GATES.get_ptr_mut(&tid) {
        // SAFETY: as in `thread`.
        Some(t) => close(unsafe { &mut *t }, entry_sp, maybe_inside),
        None => None,
    };
    match found {
        Some(written) => written,
        None if maybe_inside => false,
        None => {
            if let Some(c) = FILTER_COUNTS.get_ptr_mut(cookie::function(cookie)) {
                // SAFETY: as in `enter`.
                unsafe { (*c).returns_unmatched += 1 };
            }
            false
        }
    }
}

/// Closes the call opened at `entry_sp` on `t`: whether it was written, or `None` when not open.
#[inline(always)]
fn close(t: &mut Thread, entry_sp: u64, exact: bool) -> Option<bool> {
    if !exact {
        // Calls inside this one whose returns never came.
        drop_unwound(t, entry_sp.wrapping_sub(1));
    }
    if innermost(t)? != entry_sp {
        return None;
    }
    let i = (t.open as usize - 1) & (MAX_OPEN - 1);
    t.open -= 1;
    Some(t.written & (1 << i) != 0)
}

/// Forgets an exiting thread's gate (called from `sched_process_exit`).
#[inline(always)]
pub fn forget_thread(tid: u32) {
    let _ = GATES.remove(&tid);
}
