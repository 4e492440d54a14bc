//! The per-CPU rings that calls and returns are written to.
//!
//! A call or return is the one record a traced program pays for on every call, so it does not go
//! through the shared BPF ring buffer (`EVENTS`), whose reservation takes a lock and whose
//! reserve, query and submit were about 60 ns of a program's 220 (docs/performance.md). Each CPU
//! has a ring of its own (up to [`MAX_RINGS`]) in one memory-mapped array (`CALL_RINGS`, an
//! element per ring) that the program writes with plain stores after an atomic exchange, and that
//! user space reads through the same mapping.
//!
//! Layout of an element: `head` at [`HEAD`] and the writers' claim at [`CLAIM`] (one cache
//! line), `tail` at [`TAIL`] (another), the records from [`DATA`]. Both positions count bytes and only grow; a record lies at `DATA + (position &
//! (DATA_BYTES - 1))` and is written whole even where it runs past `DATA_BYTES`, into the
//! [`SLACK`] bytes after it, so that neither side ever splits one.
//! - The writer claims the ring by exchanging the claim word for 1, writes the record, publishes
//!   it by exchanging `head` for the new position, and stores 0 in the claim. A writer that gets 1
//!   back (another task is in the middle of a write: one it preempted on this CPU, or one on a CPU
//!   that shares the ring) or finds the ring full writes to `EVENTS` instead: nothing is lost that
//!   `EVENTS` has room for. `head` is always a position: user space can read up to it at any time.
//! - User space reads from `tail` up to `head`, then stores the new `tail`.
//!
//! A record's length follows from its kind ([`record_size`]): only fixed-size records are written
//! here.

use crate::{CallRecord, GoCallRecord, GoReturnRecord, RecordKind, ReturnRecord};

/// Most rings: CPUs past the 64th share them (CPU `c` writes to ring `c % rings`; the claim is
/// atomic across CPUs too), so that their memory stays within 64 MiB on any machine.
pub const MAX_RINGS: u32 = 64;
/// Bytes of records a ring holds (a power of two).
pub const DATA_BYTES: usize = 1 << 20;
/// Offset of the writer's position.
pub const HEAD: usize = 0;
/// Offset of the writers' claim: 1 while one is writing a record.
pub const CLAIM: usize = 8;
/// Offset of the reader's position.
pub const TAIL: usize = 64;
/// Offset of the records.
pub const DATA: usize = 128;
/// Room past `DATA_BYTES` for a record that starts near its end: at least the longest record.
pub const SLACK: usize = 128;
/// Bytes of one CPU's element of the array.
pub const ELEMENT_BYTES: usize = DATA + DATA_BYTES + SLACK;

/// One CPU's ring, as the array's element type (its fields are reached by the offsets above).
#[repr(C)]
pub struct CallRing {
    pub bytes: [u8; ELEMENT_BYTES],
}

/// The length of a record of kind `kind` in a ring, or `None` for a kind never written there.
pub const fn record_size(kind: u32) -> Option<usize> {
    match RecordKind::from_u32(kind) {
        Some(RecordKind::Call) => Some(size_of::<CallRecord>()),
        Some(RecordKind::Return) => Some(size_of::<ReturnRecord>()),
        Some(RecordKind::GoCall) => Some(size_of::<GoCallRecord>()),
        Some(RecordKind::GoReturn) => Some(size_of::<GoReturnRecord>()),
        _ => None,
    }
}

const _: () = assert!(DATA_BYTES.is_power_of_two() && DATA_BYTES.is_multiple_of(8));
const _: () = assert!(size_of::<CallRecord>() <= SLACK && size_of::<ReturnRecord>() <= SLACK);
const _: () = assert!(size_of::<GoCallRecord>() <= SLACK && size_of::<GoReturnRecord>() <= SLACK);
const _: () = assert!(size_of::<CallRecord>().is_multiple_of(8) && size_of::<ReturnRecord>().is_multiple_of(8));
const _: () = assert!(size_of::<GoCallRecord>().is_multiple_of(8) && size_of::<GoReturnRecord>().is_multiple_of(8));
