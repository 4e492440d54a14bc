//! Reading the ring buffer without blocking the runtime: wait for readiness, then take at most a
//! batch of records before yielding.

use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;

pub struct RingDrain {
    fd: AsyncFd<RingBuf<MapData>>,
}

impl RingDrain {
    pub fn new(ring: RingBuf<MapData>) -> std::io::Result<RingDrain> {
        // SAFETY: the ring buffer owns its map's file descriptor, which stays open and the same
        // until the `RingBuf` is dropped, which only happens with this `AsyncFd`.
        let fd = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(RingDrain { fd })
    }

    /// Waits until the kernel has committed records, then passes up to `max` of them to `each`.
    /// Returns how many were passed.
    pub async fn next_batch<E>(
        &mut self,
        max: usize,
        each: impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<usize, DrainError<E>> {
        let mut guard = self.fd.readable_mut().await.map_err(DrainError::Io)?;
        let (n, exhausted) = take(guard.get_inner_mut(), max, each)?;
        if exhausted {
            // Only clear readiness once the buffer was seen empty: wake-ups are edge-triggered.
            guard.clear_ready();
        }
        Ok(n)
    }

    /// Passes up to `max` records that are ready now, without waiting.
    pub fn poll_batch<E>(&mut self, max: usize, each: impl FnMut(&[u8]) -> Result<(), E>) -> Result<usize, E> {
        take(self.fd.get_mut(), max, each).map(|(n, _)| n).map_err(|e| match e {
            DrainError::Sink(e) => e,
            DrainError::Io(_) => unreachable!("take does no I/O of its own"),
        })
    }
}

#[derive(Debug)]
pub enum DrainError<E> {
    Io(std::io::Error),
    Sink(E),
}

fn take<E>(
    ring: &mut RingBuf<MapData>,
    max: usize,
    mut each: impl FnMut(&[u8]) -> Result<(), E>,
) -> Result<(usize, bool), DrainError<E>> {
    let mut n = 0;
    while n < max {
        let Some(item) = ring.next() else { return Ok((n, true)) };
        each(&item).map_err(DrainError::Sink)?;
        n += 1;
    }
    Ok((n, false))
}
