//! Who may wait to authenticate with an agent, and who makes room for whom.
//!
//! Connections that have not proved themselves yet are bounded in all
//! ([`MAX_UNAUTHENTICATED`]) and per source ([`MAX_PER_SOURCE`]: a uid on the Unix socket, as
//! the kernel names it, an IP address over TCP), so that one user or one address cannot take
//! every place. A newcomer over either bound makes room by closing the oldest connection (of its
//! own source, when that source is full) that has not yet sent a valid hello: one that has
//! started a real handshake is never closed for a newer one, and when there is no idle
//! connection to close, the newcomer is refused instead. Whoever is closed or refused is told
//! why, in a refusal frame ([`super::session::refuse`]).

use std::{collections::VecDeque, fmt, net::IpAddr};

use tokio::sync::oneshot;

/// Connections that have not proved themselves yet, at most.
pub const MAX_UNAUTHENTICATED: usize = 64;
/// Of those, from one source, at most.
pub const MAX_PER_SOURCE: usize = 8;

/// Where a connection comes from, as far as the bounds are concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// A Unix socket peer's uid (`SO_PEERCRED`).
    Uid(u32),
    /// A TCP peer's address.
    Ip(IpAddr),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Uid(uid) => write!(f, "uid {uid}"),
            Source::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

struct Waiting {
    id: u64,
    source: Source,
    /// It sent a valid hello: it is authenticating, not idling.
    started: bool,
    /// Tells its task to close it, and why.
    evict: oneshot::Sender<Refused>,
}

/// The connections waiting to authenticate, oldest first.
#[derive(Default)]
pub struct Admission {
    waiting: VecDeque<Waiting>,
}

/// Why a connection is closed before it authenticates: what its peer is told.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("uid {uid} is neither root nor in group {group}")]
    NotInGroup { uid: u32, group: String },
    #[error("uid {0} is not root")]
    NotRoot(u32),
    #[error("{MAX_PER_SOURCE} connections from {0} are authenticating already: try again when one is done")]
    SourceBusy(Source),
    #[error("{MAX_UNAUTHENTICATED} connections are authenticating already: try again when one is done")]
    Busy,
    #[error("closed to make room for a newer connection: this one had not said hello yet")]
    Evicted,
}

impl Admission {
    /// Admits connection `id` from `source`, closing an idle one if a bound is reached (through
    /// its `evict` channel); `Err`: refused, and why. `evict` is how this connection will be
    /// told, if it is closed for another.
    pub fn admit(&mut self, id: u64, source: Source, evict: oneshot::Sender<Refused>) -> Result<(), Refused> {
        let own = self.waiting.iter().filter(|w| w.source == source).count();
        if own >= MAX_PER_SOURCE {
            if !self.evict_oldest_idle(|w| w.source == source) {
                return Err(Refused::SourceBusy(source));
            }
        } else if self.waiting.len() >= MAX_UNAUTHENTICATED && !self.evict_oldest_idle(|_| true) {
            return Err(Refused::Busy);
        }
        self.waiting.push_back(Waiting { id, source, started: false, evict });
        Ok(())
    }

    /// Closes the oldest connection that has not said hello, to free its descriptor; whether
    /// there was one.
    pub fn evict_any_idle(&mut self) -> bool {
        self.evict_oldest_idle(|_| true)
    }

    fn evict_oldest_idle(&mut self, of: impl Fn(&Waiting) -> bool) -> bool {
        let Some(i) = self.waiting.iter().position(|w| !w.started && of(w)) else { return false };
        let w = self.waiting.remove(i).expect("found");
        let _ = w.evict.send(Refused::Evicted);
        true
    }

    /// Connection `id` sent a valid hello: from now on only its handshake's deadline ends it.
    pub fn started(&mut self, id: u64) {
        if let Some(w) = self.waiting.iter_mut().find(|w| w.id == id) {
            w.started = true;
        }
    }

    /// Connection `id` authenticated, failed, or was closed.
    pub fn done(&mut self, id: u64) {
        self.waiting.retain(|w| w.id != id);
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admit(a: &mut Admission, id: u64, source: Source) -> (Result<(), Refused>, oneshot::Receiver<Refused>) {
        let (tx, rx) = oneshot::channel();
        (a.admit(id, source, tx), rx)
    }

    #[test]
    fn a_source_over_its_share_makes_room_among_its_own_idle_connections_or_is_refused() {
        let mut a = Admission::default();
        let nobody = Source::Uid(65534);
        let mut told = Vec::new();
        for id in 0..MAX_PER_SOURCE as u64 {
            let (r, rx) = admit(&mut a, id, nobody);
            assert_eq!(r, Ok(()));
            told.push(rx);
        }
        // Root's connection waits beside them.
        let (r, mut root) = admit(&mut a, 100, Source::Uid(0));
        assert_eq!(r, Ok(()));
        // A ninth from nobody closes nobody's oldest idle one, never root's.
        let (r, _) = admit(&mut a, 8, nobody);
        assert_eq!(r, Ok(()));
        assert_eq!(told[0].try_recv().unwrap(), Refused::Evicted);
        assert!(root.try_recv().is_err(), "root's connection stays");
        // Once all of nobody's have said hello, nobody's next is refused, and nobody is closed.
        for id in 1..=8 {
            a.started(id);
        }
        let (r, _) = admit(&mut a, 9, nobody);
        assert_eq!(
            r.unwrap_err().to_string(),
            "8 connections from uid 65534 are authenticating already: try again when one is done"
        );
        assert!(told[1].try_recv().is_err(), "a started handshake is never closed for a newer connection");
        assert_eq!(a.len(), 9);
        a.done(3);
        assert_eq!(admit(&mut a, 10, nobody).0, Ok(()));
    }

    #[test]
    fn when_every_place_is_taken_by_started_handshakes_a_newcomer_is_refused() {
        let mut a = Admission::default();
        let mut told = Vec::new();
        for id in 0..MAX_UNAUTHENTICATED as u64 {
            let ip = IpAddr::from([10, 0, (id / 8) as u8, 1]);
            let (r, rx) = admit(&mut a, id, Source::Ip(ip));
            assert_eq!(r, Ok(()));
            told.push(rx);
        }
        a.started(0);
        // A newcomer from elsewhere closes the oldest idle one: the second, since the first has
        // said hello.
        let (r, _) = admit(&mut a, 64, Source::Ip(IpAddr::from([10, 1, 0, 1])));
        assert_eq!(r, Ok(()));
        assert!(told[0].try_recv().is_err());
        assert_eq!(told[1].try_recv().unwrap(), Refused::Evicted);
        for id in 0..=64 {
            a.started(id);
        }
        let (r, _) = admit(&mut a, 65, Source::Ip(IpAddr::from([10, 2, 0, 1])));
        assert_eq!(r.unwrap_err().to_string(), "64 connections are authenticating already: try again when one is done");
        assert!(!a.evict_any_idle(), "none idle");
    }
}
