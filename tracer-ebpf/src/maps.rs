//! Maps and configuration shared by every program, and the helpers that write records.

use aya_ebpf::{
    bindings::{BPF_F_MMAPABLE, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    cty::c_void,
    helpers::generated::{bpf_get_smp_processor_id, bpf_ringbuf_output},
    macros::map,
    maps::{Array, HashMap, PerCpuArray, RingBuf, ring_buf::RingBufEntry},
};
use tracer_common::{
    Config, InodeKey, LostSlot, ProbeLayoutBytes, RecordKind, call_rings, kind_bit, strings::SCRATCH_SIZE,
};

/// Set by user space at load time (`EbpfLoader::override_global`); read-only here.
// SAFETY: `Config` is integers only; all-zero is a valid value (and is replaced before load).
#[unsafe(no_mangle)]
pub static CONFIG: Config = unsafe { core::mem::zeroed() };

/// Every record goes here. User space sets the size (`--buffer-size`).
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 24, 0);

/// Per CPU, the ring calls and returns are written to (see `tracer_common::call_rings`). User
/// space sets `Config::call_rings` elements and maps the array to read it.
#[map]
pub static CALL_RINGS: Array<call_rings::CallRing> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// Process ids (tgids) being traced. Filled by user space for `--pid`, `--binary` and the launched
/// command, extended here on fork (following children) and on exec of a target binary, and
/// pruned here when a traced process's last thread exits.
#[map]
pub static TRACED_PIDS: HashMap<u32, u32> = HashMap::with_max_entries(32768, 0);

/// Each traced process's threads, where `sched_process_exit` has no `group_dead` (6.1, 6.12): set
/// to 1 for a process that starts being traced at fork or exec (one thread then), by user space
/// for one traced by pid (its threads then), raised as it creates threads and lowered as they
/// exit; the exit that takes it to 0 is the process's last. The exit tracepoint runs in the
/// order threads get there, which is the order the trace shows, so the last one is also last in
/// the trace (deriving it from `signal->live` instead would not be: a thread that
/// `pthread_join` already woke from can still be on its way out when the joiner exits).
#[map]
pub static THREAD_COUNTS: HashMap<u32, u64> = HashMap::with_max_entries(32768, 0);

/// How many times a process left `TRACED_PIDS`: slot 0 counted here (the exit of a traced
/// process's last thread), slot 1 by user space (each slot has one kind of writer, so neither
/// goes backwards). Their sum is the epoch that `TRACED_CACHE` entries are valid for.
#[map]
pub static TRACED_REMOVALS: Array<u64> = Array::with_max_entries(2, 0);

/// Per CPU, the last process found in `TRACED_PIDS` and the removal epoch (plus one, so that the
/// all-zero start matches nothing) it was found at: a probe hit in the same process again, the
/// common case, needs no hash lookup (which cost 65 ns a run here, against 150 ns for a whole
/// bpftrace `count()`). Additions never make an entry wrong; a removal moves the epoch on.
#[map]
static TRACED_CACHE: PerCpuArray<[u64; 2]> = PerCpuArray::with_max_entries(1, 0);

/// Executables given with `--binary`: a process that exec's one becomes traced.
#[map]
pub static TARGET_INODES: HashMap<InodeKey, u32> = HashMap::with_max_entries(64, 0);

/// Images (executables, and the interpreters of `#!` scripts) the function patterns were
/// resolved against, by user space: a traced process that execs any other is stopped for
/// resolution (see `sched::try_sched_exec`). Bounded: when full, user space stops adding, and an
/// image not in it is resolved again (once per exec).
#[map]
pub static RESOLVED_IMAGES: HashMap<InodeKey, u8> = HashMap::with_max_entries(1024, 0);

/// The string reads of each function whose probes read strings, keyed by function index (the
/// cookie's low 32 bits). Filled by user space at attach; looked up only when the cookie has
/// `cookie::STRINGS`.
#[map]
pub static LAYOUTS: HashMap<u32, ProbeLayoutBytes> = HashMap::with_max_entries(16384, 0);

/// Where a record with strings is built before `bpf_ringbuf_output` copies it (a ring-buffer
/// reservation must have a constant size).
#[map]
pub static SCRATCH: PerCpuArray<[u8; SCRATCH_SIZE]> = PerCpuArray::with_max_entries(1, 0);

/// The strings a sleepable program's fast read could not reach, to fault in (see
/// `strings::with_strings`). Kept in a map, not in registers: the verifier then sees the count as
/// an unknown number, instead of following each string's outcome as a separate path.
#[map]
pub static FAULTS: PerCpuArray<Faults> = PerCpuArray::with_max_entries(1, 0);

/// Where the next string goes in `SCRATCH` while `strings::fill` reads them, one per `bpf_loop`
/// call. Kept in a map, not on the stack: the verifier then sees it as an unknown offset, bounded
/// where it is used, and each call of the loop's callback is the same state (on the stack, each
/// call's offset is a new range, and Linux 6.7+, which verifies a callback until its states
/// repeat, went through hundreds of thousands of instructions).
#[map]
pub static STRING_END: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Where a record's unreadable strings are: `count` of them, each at `at[i]` for `bytes[i]`.
#[repr(C)]
pub struct Faults {
    pub count: u64,
    pub at: [u64; tracer_common::strings::MAX_STRINGS],
    pub bytes: [u64; tracer_common::strings::MAX_STRINGS],
}

/// Per-CPU counts of records that could not be written, indexed by [`LostSlot`].
#[map]
pub static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(LostSlot::COUNT, 0);

/// The configuration, read in place (it is a few hundred bytes: too much to copy onto the BPF
/// stack in every program).
#[inline(always)]
pub fn config() -> &'static Config {
    // SAFETY: a global that user space fixed before load. The address goes through
    // `read_volatile`, so the compiler cannot tell which object it points to and fold the all-zero
    // initialiser into the field reads.
    unsafe { &*core::ptr::read_volatile(&(&raw const CONFIG)) }
}

#[inline(always)]
pub fn enabled(kind: RecordKind) -> bool {
    config().enabled_kinds & kind_bit(kind) != 0
}

/// Flags for `submit`: wake the reader only once enough is waiting (see `Config::wakeup_bytes`).
#[inline(always)]
pub fn submit_flags() -> u64 {
    if EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= config().wakeup_bytes {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

/// Room in the ring for one `T`, or `None` with the record counted lost under `kind` (the ring is
/// full). For a record filled in place; [`emit`] writes one built already.
#[inline(always)]
pub fn reserve<T: 'static>(kind: RecordKind) -> Option<RingBufEntry<T>> {
    let entry = EVENTS.reserve::<T>(0);
    if entry.is_none() {
        count_lost(LostSlot::ring_full(kind));
    }
    entry
}

/// Writes `record` into the ring, or counts it lost under `kind`.
#[inline(always)]
pub fn emit<T: 'static>(kind: RecordKind, record: T) {
    // Decided at compile time: `kind` is a constant at every call.
    if call_rings::record_size(kind as u32) == Some(size_of::<T>()) && emit_to_call_ring(&record) {
        return;
    }
    if let Some(mut entry) = reserve::<T>(kind) {
        // A `memcpy` of a constant size, which LLVM turns into a few 8-byte loads and stores;
        // `entry.write(record)` could come out as a call to `memmove`, a loop of single bytes
        // (`call_entry` spent about 55 ns a run in it, a quarter of its time).
        // SAFETY: a fresh reservation of `size_of::<T>()` bytes, 8-aligned, and a local: disjoint.
        unsafe { core::ptr::copy_nonoverlapping(&raw const record, entry.as_mut_ptr(), 1) };
        entry.submit(submit_flags());
    }
}

/// Writes `record` into this CPU's call ring, unless the ring is full or another task on this CPU
/// is in the middle of a write to it (the program can be preempted: `uprobe_multi` programs run
/// with migration disabled, not preemption). The protocol is in `tracer_common::call_rings`.
#[inline(always)]
fn emit_to_call_ring<T: 'static>(record: &T) -> bool {
    use core::intrinsics::{AtomicOrdering::SeqCst, atomic_xchg};
    // SAFETY: a helper without arguments.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let rings = config().call_rings;
    if rings == 0 {
        return false;
    }
    let Some(ring) = CALL_RINGS.get_ptr_mut(cpu % rings) else { return false };
    let ring = ring.cast::<u8>();
    // SAFETY: `head` and `tail` lie at 8-aligned offsets inside the element; the record's bytes
    // at `DATA + (head & (DATA_BYTES - 1))`, at most `SLACK` long, end inside it too.
    unsafe {
        let claim_at = ring.add(call_rings::CLAIM).cast::<u64>();
        // The claim: one atomic exchange (another task on this CPU can run this between any two
        // instructions here, and finds it taken).
        if atomic_xchg::<u64, { SeqCst }>(claim_at, 1) != 0 {
            return false;
        }
        let head_at = ring.add(call_rings::HEAD).cast::<u64>();
        let head = core::ptr::read_volatile(head_at);
        let tail = core::ptr::read_volatile(ring.add(call_rings::TAIL).cast::<u64>());
        let size = size_of::<T>() as u64;
        let fits = head.wrapping_sub(tail).wrapping_add(size) <= call_rings::DATA_BYTES as u64;
        if fits {
            let at = ring.add(call_rings::DATA + (head as usize & (call_rings::DATA_BYTES - 1)));
            // As in `emit`: a constant-size copy, which LLVM expands into 8-byte stores.
            core::ptr::copy_nonoverlapping(record, at.cast::<T>(), 1);
            // Publishes the record. An atomic operation, not a plain store: it keeps the record's
            // stores before it, and it is visible to every CPU before this thread reads the clock
            // for its next record, which the drain's ordering relies on (`record/drain.rs`,
            // `Pass`). A plain store measured 4-5 ns a run less.
            atomic_xchg::<u64, { SeqCst }>(head_at, head + size);
        }
        // Ends the claim: after the exchange above, for the compiler and for the CPU (x86-64
        // keeps stores in order).
        core::ptr::write_volatile(claim_at, 0);
        fits
    }
}

/// Copies `len` bytes at `data` (a record and what follows it, built in a buffer because its
/// length is known only now) into the ring, or counts the record lost under `kind`. The caller
/// bounds `len` by the buffer's size right before the call (the verifier checks it here).
#[inline(always)]
pub fn emit_bytes(kind: RecordKind, data: *const u8, len: u64) {
    // SAFETY: `len` bytes at `data` are readable (the caller's bound); the helper copies them.
    let written = unsafe {
        bpf_ringbuf_output(
            (&raw const EVENTS).cast_mut().cast::<c_void>(),
            data.cast_mut().cast::<c_void>(),
            len,
            submit_flags(),
        )
    };
    if written < 0 {
        count_lost(LostSlot::ring_full(kind));
    }
}

/// Whether `tgid` is traced: from this CPU's `TRACED_CACHE` when it still holds, else from
/// `TRACED_PIDS` (then cached).
#[inline(always)]
pub fn is_traced(tgid: u32) -> bool {
    // The epoch is read before the lookup: a removal between the two moves it past the one
    // cached, so an entry cached from a lookup that raced a removal is never used.
    let epoch = removals(0).wrapping_add(removals(1)).wrapping_add(1);
    let cache = TRACED_CACHE.get_ptr_mut(0);
    if let Some(c) = cache {
        // SAFETY: a per-CPU map value; programs do not migrate while they run.
        let c = unsafe { &*c };
        if c[0] == tgid as u64 && c[1] == epoch {
            return true;
        }
    }
    if TRACED_PIDS.get_ptr(tgid).is_none() {
        return false;
    }
    if let Some(c) = cache {
        // SAFETY: as above.
        unsafe { *c = [tgid as u64, epoch] };
    }
    true
}

#[inline(always)]
fn removals(slot: u32) -> u64 {
    match TRACED_REMOVALS.get_ptr(slot) {
        // SAFETY: a map value; the other CPUs' atomic adds are read whole (aligned u64).
        Some(p) => unsafe { core::ptr::read_volatile(p) },
        None => 0,
    }
}

/// Adds `delta` (two's complement to subtract) to `tgid`'s thread count; returns the count before,
/// or `None` when the process has none.
#[inline(always)]
pub fn add_threads(tgid: u32, delta: u64) -> Option<u64> {
    let count = THREAD_COUNTS.get_ptr_mut(tgid)?;
    // SAFETY: a map value, valid for this program run; threads of one process exit and start on
    // several CPUs at once, hence the atomic add.
    Some(unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::SeqCst }>(count, delta)
    })
}

/// Removes `tgid` from the traced set (its last thread exited).
#[inline(always)]
pub fn untrace(tgid: u32) {
    let _ = TRACED_PIDS.remove(tgid);
    let _ = THREAD_COUNTS.remove(tgid);
    if let Some(p) = TRACED_REMOVALS.get_ptr_mut(0) {
        // SAFETY: a map value; exits on other CPUs add to it at the same time, hence atomically.
        unsafe { core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(p, 1) };
    }
}

#[inline(always)]
pub fn count_lost(slot: LostSlot) {
    count_lost_by(slot, 1);
}

#[inline(always)]
pub fn count_lost_by(slot: LostSlot, n: u64) {
    if let Some(counter) = LOST.get_ptr_mut(slot as u32) {
        // SAFETY: a per-CPU slot; programs do not migrate while they run.
        unsafe { *counter += n };
    }
}

/// `v`, hidden from the optimizer (libbpf's `barrier_var`), so that a bound checked after this
/// stays in the code, on the register that is then used. The verifiers of 6.1 and 6.12 do not
/// follow a bound the compiler proved on a copy, or through a `min`: a length passed to a helper
/// must be checked right there.
#[inline(always)]
pub fn opaque(mut v: u64) -> u64 {
    // SAFETY: a move of a register to itself; it only makes `v` unknown to the compiler.
    unsafe { core::arch::asm!("{0} = {0}", inout(reg) v, options(nomem, nostack)) };
    v
}

/// The current task's (tgid, tid).
#[inline(always)]
pub fn current_ids() -> (u32, u32) {
    let pid_tgid = aya_ebpf::helpers::bpf_get_current_pid_tgid();
    ((pid_tgid >> 32) as u32, pid_tgid as u32)
}

/// The clock every record is stamped with (`CLOCK_BOOTTIME`).
#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: a helper without preconditions.
    unsafe { aya_ebpf::helpers::generated::bpf_ktime_get_boot_ns() }
}

/// A record header stamped now.
#[inline(always)]
pub fn header(kind: RecordKind, tgid: u32, tid: u32) -> tracer_common::RecordHeader {
    header_at(kind, tgid, tid, now())
}

/// A record header stamped `ts_boot_ns`.
#[inline(always)]
pub fn header_at(kind: RecordKind, tgid: u32, tid: u32, ts_boot_ns: u64) -> tracer_common::RecordHeader {
    tracer_common::RecordHeader { kind: kind as u32, _pad: 0, ts_boot_ns, pid: tgid, tid }
}

/// The (device, inode) of a `struct file`: what `TARGET_INODES`, `RESOLVED_IMAGES` and
/// `Config::watch_image` hold.
#[inline(always)]
pub fn file_key(file: *const u8, cfg: &Config) -> Result<InodeKey, i64> {
    let o = &cfg.offsets;
    let inode: *const u8 = read_kernel(file, o.file_inode)?;
    let ino: u64 = read_kernel(inode, o.inode_ino)?;
    let sb: *const u8 = read_kernel(inode, o.inode_sb)?;
    let dev: u32 = read_kernel(sb, o.sb_dev)?;
    Ok(InodeKey { dev: dev as u64, ino })
}

/// Reads a `T` at `base + offset` in kernel memory.
#[inline(always)]
pub fn read_kernel<T>(base: *const u8, offset: u32) -> Result<T, i64> {
    // SAFETY: `bpf_probe_read_kernel` checks the address; a bad pointer is an error, not a fault.
    unsafe { aya_ebpf::helpers::bpf_probe_read_kernel(base.wrapping_add(offset as usize).cast::<T>()) }
        .map_err(|e| e as i64)
}
