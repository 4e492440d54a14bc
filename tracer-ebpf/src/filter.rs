//! Predicates on calls (`-f 'FUNC if EXPR'`), run by the entry probe of a function whose cookie has
//! `cookie::FILTERED` before anything is written: a bounded interpreter over the branching
//! program user space compiled (see `tracer_common::filter`). A call it refuses is remembered by
//! (thread, entry stack pointer) until its return probe, which then drops the return too; calls
//! nested inside it are probed and decided on their own.

use aya_ebpf::{
    cty::c_void,
    helpers::generated,
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray},
};
use tracer_common::filter::{
    ACCEPT, Counts, EQ, GE, GT, LE, LT, MAX_OPS, NE, OpenKey, Program, REJECT, STR_MATCH, STRING_BYTES, STRING_WORDS,
};

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

/// Whether the call of `function` with these argument registers (rdi, rsi, rdx, rcx, r8, r9, rax)
/// passes its predicate; a refused one is remembered (thread `tid`, entry stack pointer `sp`) so
/// that its return is dropped. Counted either way. A function without a predicate in the map
/// passes (user space inserts every predicate before attaching).
#[inline(always)]
pub fn passes(function: u32, regs: &[u64; 7], tid: u32, sp: u64) -> bool {
    // SAFETY: a map value, read in place; user space never changes a predicate while probes run.
    let Some(program) = FILTERS.get_ptr(function).map(|p| unsafe { &*p }) else {
        return true;
    };
    let pass = run(program, regs);
    // SAFETY: a per-CPU map value; a program runs on one CPU from start to end.
    let counts = FILTER_COUNTS.get_ptr_mut(function).map(|c| unsafe { &mut *c });
    if let Some(c) = counts {
        c.seen += 1;
        if !pass {
            c.filtered += 1;
        }
    }
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
