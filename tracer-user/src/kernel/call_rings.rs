//! Reading the per-CPU rings that the programs write calls and returns to (the protocol is in
//! [`tracer_common::call_rings`]): the array map is mapped into this process once, and each
//! ring's records are read in place between the positions the two sides publish.

use std::{
    io,
    os::fd::{AsRawFd as _, BorrowedFd},
    sync::atomic::{AtomicU64, Ordering},
};

use tracer_common::call_rings::{DATA, DATA_BYTES, ELEMENT_BYTES, HEAD, MAX_RINGS, TAIL, record_size};

/// How many call rings a recording has (`Config::call_rings`): one per CPU, up to
/// [`MAX_RINGS`].
pub fn count() -> u32 {
    // Without the number, one ring that every CPU shares is still correct.
    aya::util::nr_cpus().map_or(1, |n| (n as u32).clamp(1, MAX_RINGS))
}

/// Every ring, mapped.
pub struct CallRings {
    map: memmap2::MmapRaw,
    rings: usize,
}

impl CallRings {
    /// Maps the `CALL_RINGS` array of `rings` elements behind `fd`.
    pub fn map(fd: BorrowedFd<'_>, rings: usize) -> io::Result<CallRings> {
        // An array's elements lie back to back, each rounded up to 8 bytes, from the first page.
        let len = (rings * ELEMENT_BYTES.next_multiple_of(8)).next_multiple_of(page_size());
        let map = memmap2::MmapOptions::new().len(len).map_raw(fd.as_raw_fd())?;
        Ok(CallRings { map, rings })
    }

    pub fn rings(&self) -> usize {
        self.rings
    }

    fn element(&self, ring: usize) -> *mut u8 {
        assert!(ring < self.rings);
        // SAFETY: inside the mapping (its length covers `rings` elements).
        unsafe { self.map.as_mut_ptr().add(ring * ELEMENT_BYTES.next_multiple_of(8)) }
    }

    fn position(&self, ring: usize, at: usize) -> &AtomicU64 {
        // SAFETY: an 8-aligned u64 inside the element, which the mapping keeps alive as long as
        // `self`; the kernel side only reads and writes it whole (atomically, or aligned stores).
        unsafe { &*self.element(ring).add(at).cast::<AtomicU64>() }
    }

    /// What ring `ring`'s writer has published: the position past its last whole record.
    pub fn head(&self, ring: usize) -> u64 {
        self.position(ring, HEAD).load(Ordering::Acquire)
    }

    /// What was read of ring `ring`.
    pub fn tail(&self, ring: usize) -> u64 {
        self.position(ring, TAIL).load(Ordering::Relaxed)
    }

    /// Hands the records before `tail` back to the writer.
    pub fn set_tail(&self, ring: usize, tail: u64) {
        self.position(ring, TAIL).store(tail, Ordering::Release);
    }

    /// The record at `position` in ring `ring` (below its [`head`](Self::head)); an error for
    /// bytes that are no record written there.
    pub fn record(&self, ring: usize, position: u64) -> io::Result<&[u8]> {
        let start = DATA + (position as usize & (DATA_BYTES - 1));
        // SAFETY: `start` is below `DATA + DATA_BYTES`, so its 4 bytes are inside the element;
        // published (below the head), so the writer leaves them alone until the tail passes them.
        let kind = unsafe { self.element(ring).add(start).cast::<u32>().read_unaligned() };
        let len = record_size(kind)
            .ok_or_else(|| io::Error::other(format!("call ring {ring}: no record of kind {kind} is written there")))?;
        // SAFETY: as above; a record is at most `SLACK` bytes, so it ends inside the element.
        Ok(unsafe { std::slice::from_raw_parts(self.element(ring).add(start), len) })
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}
