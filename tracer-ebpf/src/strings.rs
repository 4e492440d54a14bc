//! Strings read from the target's memory at a probe, written after the probe's record: one way
//! for every probe that reads them (a function's parameters and return value, a breakpoint's
//! locals). A probe's reads are a layout (`tracer_common::ProbeLayoutBytes`): which values hold
//! a string's address (and a `&str`'s length), by their index in the `regs` the caller passes,
//! and how many bytes to keep.
//!
//! A sleepable program (`SLEEPABLE`) faults in a string's page that the fast, non-faulting read
//! could not reach (a page of `.rodata` the target has not touched yet) with
//! `bpf_copy_from_user`, which may sleep, then builds the record again with fast reads only, so
//! that nothing another program writes into this CPU's `SCRATCH` while this one sleeps can mix
//! into it.

use core::mem::size_of;

use aya_ebpf::{
    cty::c_void,
    helpers::generated::{self, bpf_loop},
};
use tracer_common::{
    LostSlot, ProbeLayoutBytes, RecordKind,
    strings::{self, HEADER, MAX_STRING_SIZE, MAX_STRINGS, SCRATCH_SIZE},
};

use crate::maps::{FAULTS, Faults, SCRATCH, STRING_END, count_lost, emit_bytes, opaque};

/// Writes `record` and the strings `layout` names (the entry strings, or the return value's when
/// `ret`) through the per-CPU scratch buffer. `regs` is indexed as the layout's register numbers
/// are: for a function, rdi, rsi, rdx, rcx, r8, r9, rax; for a breakpoint, its evaluated locals.
/// Without a layout (user space could not insert it) the record goes out without strings, and
/// user space marks each string unread. `SLEEPABLE`: the strings' pages that are not resident
/// are faulted in first (`fault_in`).
#[inline(always)]
pub fn with_strings<T: Copy, const N: usize, const SLEEPABLE: bool>(
    record: T,
    kind: RecordKind,
    layout: Option<&ProbeLayoutBytes>,
    regs: &[u64; N],
    ret: bool,
) -> Result<u32, i64> {
    let Some(buf) = SCRATCH.get_ptr_mut(0) else {
        count_lost(LostSlot::ring_full(kind));
        return Ok(0);
    };
    // SAFETY: a per-CPU map value; a program runs with migration disabled, so it stays this
    // CPU's even across a sleep (see `fault_in`).
    let buf = unsafe { &mut *buf };
    // SAFETY: a per-CPU map value, as `buf`.
    let mut faults = if SLEEPABLE { FAULTS.get_ptr_mut(0).map(|f| unsafe { &mut *f }) } else { None };
    let mut off = fill(buf, record, layout, regs, ret, faults.as_deref_mut());
    if let Some(faults) = faults
        && faults.count > 0
    {
        fault_in(faults);
        // Built again whole: while this program slept, another one on this CPU may have used
        // the buffer. No read below sleeps, so what is sent is this record's.
        off = fill(buf, record, layout, regs, ret, None);
    }
    if off > SCRATCH_SIZE {
        off = SCRATCH_SIZE;
    }
    // `off` bytes of the scratch buffer, bounded above.
    emit_bytes(kind, buf.as_ptr(), off as u64);
    Ok(0)
}

/// The string size of `layout` (`--string-size`), bounded.
#[inline(always)]
fn string_size(layout: &ProbeLayoutBytes) -> usize {
    let size = u16::from_le_bytes([layout[2], layout[3]]) as usize;
    if size > MAX_STRING_SIZE as usize { MAX_STRING_SIZE as usize } else { size }
}

/// Writes `record` and its strings into `buf` with the fast reads; returns the length. With
/// `faults`, each string that could not be read is noted there (its count first set to 0).
#[inline(always)]
fn fill<T: Copy, const N: usize>(
    buf: &mut [u8; SCRATCH_SIZE],
    record: T,
    layout: Option<&ProbeLayoutBytes>,
    regs: &[u64; N],
    ret: bool,
    mut faults: Option<&mut Faults>,
) -> usize {
    // SAFETY: the buffer is larger than any record; the write is unaligned-safe.
    unsafe { core::ptr::write_unaligned(buf.as_mut_ptr().cast::<T>(), record) };
    let mut off = size_of::<T>();
    if let Some(faults) = faults.as_deref_mut() {
        faults.count = 0;
    }
    if let Some(layout) = layout {
        let (first, count) = if ret { (MAX_STRINGS, 1) } else { (0, layout[1] as usize) };
        let count = if count > MAX_STRINGS { MAX_STRINGS } else { count };
        // A `bpf_loop` callback is verified once: the strings unrolled, each with its branches
        // (null, a C string or a slice, read or faulted, cut or whole), and twice in a sleepable
        // program, are more states than Linux 6.1's verifier explores. The offset the callback
        // writes at is kept in a map (`STRING_END`), so that every call of it starts from the same
        // state: call_entry's verification went from 377,286 processed instructions (1.4 s) to
        // 61,154 (0.18 s) on 6.18.
        let Some(end) = STRING_END.get_ptr_mut(0) else { return off };
        // SAFETY: a per-CPU map value, as `buf`.
        let end = unsafe { &mut *end };
        *end = off as u64;
        let mut reads = Reads { buf, end, layout, regs, first, size: string_size(layout), faults };
        // SAFETY: the callback gets `reads` back as its context, valid for the whole call.
        unsafe { bpf_loop(count as u32, read_one::<N> as *mut c_void, (&raw mut reads).cast(), 0) };
        off = *reads.end as usize;
    }
    off
}

/// The state `read_one` works on: one string read a call. Passed by reference: a BPF function
/// takes at most five arguments.
struct Reads<'a, const N: usize> {
    buf: &'a mut [u8; SCRATCH_SIZE],
    /// Where the next string goes (in `STRING_END`).
    end: &'a mut u64,
    layout: &'a ProbeLayoutBytes,
    regs: &'a [u64; N],
    /// The layout's first read: 0, or `MAX_STRINGS` for the return value's.
    first: usize,
    size: usize,
    faults: Option<&'a mut Faults>,
}

/// `bpf_loop` callback: reads string `index` of the layout after the others; stops at the first
/// read the layout does not have.
extern "C" fn read_one<const N: usize>(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `Reads` that `fill` passed to `bpf_loop`.
    let reads = unsafe { &mut *ctx.cast::<Reads<'_, N>>() };
    if index as usize >= MAX_STRINGS {
        return 1;
    }
    // Each index is checked right where it is used (`opaque`): the verifier does not follow a
    // bound the compiler proved on a copy, and an index the compiler cannot prove in bounds would
    // leave a call to the panic handler, which no BPF program may have.
    let at = opaque(4 + 4 * (reads.first as u64 + index)) as usize;
    if at > strings::LAYOUT_SIZE - 3 {
        return 1;
    }
    let (read, ptr, len) = (reads.layout[at], opaque(reads.layout[at + 1] as u64), opaque(reads.layout[at + 2] as u64));
    if read == strings::KIND_NONE || ptr >= N as u64 || len >= N as u64 {
        return 1;
    }
    let (value, length) = (reads.regs[ptr as usize], reads.regs[len as usize]);
    *reads.end =
        read_string(reads.buf, *reads.end as usize, read, value, length, reads.size, reads.faults.as_deref_mut())
            as u64;
    0
}

/// Faults in the pages of the strings in `faults`, one byte of each with `bpf_copy_from_user`,
/// which takes the page fault a uprobe's fast reads cannot (as `strace` or a debugger reading
/// the same string would); this may sleep. Failures are ignored (a page past a string's end may
/// not exist): the reads that follow say what could not be read.
#[inline(always)]
fn fault_in(faults: &Faults) {
    let mut byte = 0u8;
    for i in 0..MAX_STRINGS {
        if i as u64 >= faults.count {
            break;
        }
        let end = faults.at[i].saturating_add(faults.bytes[i]);
        let mut page = faults.at[i];
        // At most MAX_STRING_SIZE + 2 bytes: three pages.
        for _ in 0..3 {
            if page >= end {
                break;
            }
            // SAFETY: one byte into a stack variable; the helper checks the user address.
            unsafe {
                generated::bpf_copy_from_user((&raw mut byte).cast::<c_void>(), 1, page as *const c_void);
            }
            page = (page & !(PAGE_SIZE - 1)) + PAGE_SIZE;
        }
    }
}

/// Notes in `faults` (if any) that `bytes` at `ptr` could not be read.
#[inline(always)]
fn note_fault(faults: Option<&mut Faults>, ptr: u64, bytes: u64) {
    if let Some(faults) = faults {
        let i = faults.count as usize;
        if i < MAX_STRINGS {
            faults.at[i] = ptr;
            faults.bytes[i] = bytes;
            faults.count = i as u64 + 1;
        }
    }
}

/// x86-64's page size.
const PAGE_SIZE: u64 = 4096;

/// Reads one string at `ptr` (a NUL-terminated one, or `len` bytes of a slice) into `buf` at
/// `off`, after its header, at most `size` bytes; returns the offset after it.
#[inline(always)]
fn read_string(
    buf: &mut [u8; SCRATCH_SIZE],
    off: usize,
    kind: u8,
    ptr: u64,
    len: u64,
    size: usize,
    faults: Option<&mut Faults>,
) -> usize {
    // Never true (six strings of the largest size fit); it bounds the offset for the verifier.
    if off > SCRATCH_SIZE - HEADER - MAX_STRING_SIZE as usize - 2 {
        return off;
    }
    let dst = buf[off + HEADER..].as_mut_ptr().cast::<c_void>();
    let (status, n) = if ptr == 0 {
        (strings::NULL, 0)
    } else if kind == strings::KIND_C_STRING {
        // Room for one byte more than `size` and the NUL: a string that fills it is longer than
        // `size` (one of exactly `size` bytes ends with its NUL inside).
        let room = opaque(size as u64 + 2);
        if room > MAX_STRING_SIZE as u64 + 2 {
            return off;
        }
        // SAFETY: `room` bytes at `dst` are in the buffer (checked above); the helper checks the
        // user address.
        let got = unsafe { generated::bpf_probe_read_user_str(dst, room as u32, ptr as *const c_void) };
        if got < 1 {
            note_fault(faults, ptr, room);
            (strings::FAULT, 0)
        } else if got as usize - 1 > size {
            (strings::TRUNCATED, size)
        } else {
            (strings::COMPLETE, got as usize - 1)
        }
    } else {
        let (status, n) =
            if len > size as u64 { (strings::TRUNCATED, size) } else { (strings::COMPLETE, len as usize) };
        let n = opaque(n as u64) as usize;
        if n > MAX_STRING_SIZE as usize {
            return off;
        }
        // SAFETY: as above, `n <= MAX_STRING_SIZE`.
        let got = unsafe { generated::bpf_probe_read_user(dst, n as u32, ptr as *const c_void) };
        if got < 0 {
            note_fault(faults, ptr, n as u64);
            (strings::FAULT, 0)
        } else {
            (status, n)
        }
    };
    let n16 = (n as u16).to_le_bytes();
    buf[off] = status;
    buf[off + 1] = 0;
    buf[off + 2] = n16[0];
    buf[off + 3] = n16[1];
    off + HEADER + n
}
