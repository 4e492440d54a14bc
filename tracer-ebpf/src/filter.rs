//! Predicates on calls (`-f 'FUNC if EXPR'`), run by the entry probe of a function whose cookie has
//! `cookie::FILTERED` before anything is written: a bounded interpreter over the branching
//! program user space compiled (see `tracer_common::filter`). A call it refuses is remembered by
//! (thread, entry stack pointer) until its return probe, which then drops the return too; calls
//! nested inside it are probed and decided on their own.
//!
//! A call decided at its return (`cookie::HOLD`: a `ret-if` predicate, `--min-duration`) has its
//! entry record held here, in `HELD` by (thread, entry stack pointer), instead of written; the
//! return probe takes it back, decides, and writes both or neither. The map is bounded (LRU): a
//! held entry pushed out for room is counted at its return (`Counts::entries_lost`).

use aya_ebpf::{
    cty::c_void,
    helpers::generated,
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray},
};
use tracer_common::{
    CallRecord,
    filter::{
        ACCEPT, Counts, EQ, GE, GT, LE, LT, MAX_OPS, NE, OpenKey, Program, REJECT, STR_MATCH, STRING_BYTES,
        STRING_WORDS, ret_key,
    },
};

use crate::maps::{config, now};

/// Each filtered function's predicate, keyed by function index; filled by user space before the
/// probes are attached.
#[map]
pub static FILTERS: HashMap<u32, Program> = HashMap::with_max_entries(16384, 0);

/// Per function (index), per CPU: calls seen and refused. User space sets the size to the number
/// of probed functions.
#[map]
pub static FILTER_COUNTS: PerCpuArray<Counts> = PerCpuArray::with_max_entries(1, 0);

/// Refused calls whose return has not come yet. LRU: a call left by `longjmp` or an exception
/// never returns, and its entry ages out instead of filling the map.
#[map]
static REFUSED_OPEN: LruHashMap<OpenKey, u8> = LruHashMap::with_max_entries(65536, 0);

/// Entries of calls decided at their return, by (thread, entry stack pointer): at most this many
/// open at once over all threads (88 bytes each). LRU, for the same reason as `REFUSED_OPEN`.
#[map]
static HELD: LruHashMap<OpenKey, CallRecord> = LruHashMap::with_max_entries(16384, 0);

/// Holds `record` (entered with stack pointer `sp` on thread `tid`) until its return decides;
/// `count`: the call was not counted as seen yet (it has no entry predicate).
#[inline(always)]
pub fn hold(record: &CallRecord, tid: u32, sp: u64, count: bool) {
    let function = tracer_common::cookie::function(record.cookie);
    let key = OpenKey { tid, _pad: 0, sp };
    let held = HELD.insert(&key, record, 0).is_ok();
    // SAFETY: a per-CPU map value; a program runs on one CPU from start to end.
    if let Some(c) = FILTER_COUNTS.get_ptr_mut(function).map(|c| unsafe { &mut *c }) {
        if count {
            c.seen += 1;
        }
        if !held {
            c.entries_lost += 1;
        }
    }
}

/// Counts a held call refused at its entry (it cannot be held: see `uprobe::try_call_entry`);
/// `count`: as in `hold`.
#[inline(always)]
pub fn refuse_now(function: u32, count: bool) {
    // SAFETY: as in `hold`.
    if let Some(c) = FILTER_COUNTS.get_ptr_mut(function).map(|c| unsafe { &mut *c }) {
        if count {
            c.seen += 1;
        }
        c.filtered += 1;
    }
}

/// The held entry of the call returning now (entered with `entry_sp` on thread `tid`) if the
/// call is to be written: it lasted `--min-duration` and its return value `retval` passes the
/// function's `ret-if` predicate (run on the entry's argument registers and `retval` as rax).
/// Counted otherwise: refused, or its entry gone.
#[inline(always)]
pub fn release(function: u32, tid: u32, entry_sp: u64, retval: u64) -> Option<CallRecord> {
    let key = OpenKey { tid, _pad: 0, sp: entry_sp };
    // SAFETY: a map value copied out at once; only this thread's probes use this key.
    let held = HELD.get_ptr(&key).map(|r| unsafe { *r });
    let _ = HELD.remove(&key);
    // SAFETY: as in `hold`.
    let counts = FILTER_COUNTS.get_ptr_mut(function).map(|c| unsafe { &mut *c });
    let Some(record) = held else {
        if let Some(c) = counts {
            c.entries_lost += 1;
        }
        return None;
    };
    let long_enough = now().wrapping_sub(record.header.ts_boot_ns) >= config().min_duration_ns;
    // SAFETY: as in `passes`.
    let pass = long_enough
        && match FILTERS.get_ptr(ret_key(function)).map(|p| unsafe { &*p }) {
            None => true,
            Some(program) => {
                let a = record.args;
                run(program, &[a[0], a[1], a[2], a[3], a[4], a[5], retval])
            }
        };
    if !pass {
        if let Some(c) = counts {
            c.filtered += 1;
        }
        return None;
    }
    Some(record)
}

/// Whether the call of `function` with these argument registers (rdi, rsi, rdx, rcx, r8, r9, rax)
/// passes its predicate; a refused one is remembered (thread `tid`, entry stack pointer `sp`) so
/// that its return is dropped. Counted either way (as seen only when `count`: a gated call was
/// counted by its gate). A function without a predicate in the map passes (user space inserts
/// every predicate before attaching).
#[inline(always)]
pub fn passes(function: u32, regs: &[u64; 7], tid: u32, sp: u64, count: bool) -> bool {
    let pass = evaluate(function, regs, count);
    if !pass {
        let key = OpenKey { tid, _pad: 0, sp };
        if REFUSED_OPEN.insert(&key, &0, 0).is_err()
            && let Some(c) = FILTER_COUNTS.get_ptr_mut(function)
        {
            // SAFETY: as above.
            unsafe { (*c).returns_not_dropped += 1 };
        }
    }
    pass
}

/// Whether the call of `function` with these argument registers passes its predicate, counted
/// (as seen only when `count`), without remembering a refused one: `tracer top`, whose return
/// program finds no frame for a call its entry did not push, needs nothing more.
#[inline(always)]
pub fn evaluate(function: u32, regs: &[u64; 7], count: bool) -> bool {
    // SAFETY: a map value, read in place; user space never changes a predicate while probes run.
    let Some(program) = FILTERS.get_ptr(function).map(|p| unsafe { &*p }) else {
        return true;
    };
    let pass = run(program, regs);
    // SAFETY: a per-CPU map value; a program runs on one CPU from start to end.
    if let Some(c) = FILTER_COUNTS.get_ptr_mut(function).map(|c| unsafe { &mut *c }) {
        if count {
            c.seen += 1;
        }
        if !pass {
            c.filtered += 1;
        }
    }
    pass
}

/// Whether the return whose call entered with stack pointer `entry_sp` on thread `tid` belongs to
/// a refused call (then forgotten: the caller drops the return).
#[inline(always)]
pub fn refused(tid: u32, entry_sp: u64) -> bool {
    let key = OpenKey { tid, _pad: 0, sp: entry_sp };
    if REFUSED_OPEN.get_ptr(&key).is_none() {
        return false;
    }
    let _ = REFUSED_OPEN.remove(&key);
    true
}

/// Runs `program`: at most `MAX_OPS` steps, each jumping forward.
#[inline(always)]
fn run(program: &Program, regs: &[u64; 7]) -> bool {
    let mut pc: usize = 0;
    for _ in 0..MAX_OPS {
        let Some(op) = program.ops.get(pc) else { return false };
        let Some(&raw) = regs.get(op.reg as usize) else { return false };
        let holds = if op.kind == STR_MATCH {
            string_matches(raw, &op.value, &op.mask)
        } else {
            let shift = (op.shift & 63) as u64;
            let x = raw << shift;
            if op.signed != 0 {
                let (x, v) = ((x as i64) >> shift, op.value[0] as i64);
                compare(op.kind, x.cmp(&v))
            } else {
                compare(op.kind, (x >> shift).cmp(&op.value[0]))
            }
        };
        let next = if holds { op.on_true } else { op.on_false };
        match next {
            ACCEPT => return true,
            REJECT => return false,
            // Forward only: user space compiles it so, and a backward jump ends the program here.
            n if (n as usize) <= pc => return false,
            n => pc = n as usize,
        }
    }
    false
}

#[inline(always)]
fn compare(kind: u8, order: core::cmp::Ordering) -> bool {
    use core::cmp::Ordering::*;
    match kind {
        EQ => order == Equal,
        NE => order != Equal,
        LT => order == Less,
        LE => order != Greater,
        GT => order == Greater,
        GE => order != Less,
        _ => false,
    }
}

/// Whether the C string at `ptr`, its first `STRING_BYTES` bytes (zeros after its NUL) masked with
/// `mask`, equals `value`.
#[inline(always)]
fn string_matches(ptr: u64, value: &[u64; STRING_WORDS], mask: &[u64; STRING_WORDS]) -> bool {
    if ptr == 0 {
        return false;
    }
    let mut buf = [0u64; STRING_WORDS];
    // SAFETY: `STRING_BYTES` bytes into a stack buffer of that size; the helper checks the user
    // address and NUL-terminates what it copies.
    let got = unsafe {
        generated::bpf_probe_read_user_str(buf.as_mut_ptr().cast::<c_void>(), STRING_BYTES as u32, ptr as *const c_void)
    };
    if got < 1 {
        return false;
    }
    let mut equal = true;
    for i in 0..STRING_WORDS {
        equal &= buf[i] & mask[i] == value[i];
    }
    equal
}
