//! Span and trace ids, made of the events rather than drawn.

use std::hash::Hasher as _;

use siphasher::sip128::Hasher128 as _;

use crate::event::Track;

/// Where span and trace ids come from: a pure function of a key and the identity of the event
/// a span is made of, so that two programs reading the same events (an agent that exports its
/// host's spans, and the collector that receives the same events and adds the cross-host links)
/// make the same ids. The hash is SipHash-1-3 with a 128-bit key (crate `siphasher`): specified
/// and stable, unlike std's `DefaultHasher`, whose output may change between Rust releases (an
/// agent and its collector may be different builds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdKey {
    /// Each host's key is [`host_key`] of this one and the host's name (the events' `host`):
    /// `record`, `export`, `collect`.
    Run([u8; 16]),
    /// This key for every event: an agent's, chosen by its collector (the collector's [`host_key`]
    /// for the name it gives the host, which the agent does not know).
    Host([u8; 16]),
}

impl IdKey {
    /// A fresh random run key.
    pub fn random() -> IdKey {
        IdKey::Run(random_key())
    }

    pub(super) fn for_host(&self, host: &str) -> [u8; 16] {
        match self {
            IdKey::Run(key) => host_key(key, host),
            IdKey::Host(key) => *key,
        }
    }
}

/// 16 bytes from the kernel's random source.
pub fn random_key() -> [u8; 16] {
    let mut key = [0; 16];
    getrandom::fill(&mut key).expect("the kernel's random source");
    key
}

/// The ids key of host `host` in a run keyed `run`.
pub fn host_key(run: &[u8; 16], host: &str) -> [u8; 16] {
    let mut h = siphasher::sip128::SipHasher13::new_with_key(run);
    h.write(&[ID_HOST]);
    h.write(host.as_bytes());
    h.finish128().as_bytes()
}

// What an id is of: the first byte hashed, so that no two kinds of span can share an id.
const ID_HOST: u8 = 0;
const ID_TRACE: u8 = 1;
const ID_PROCESS: u8 = 2;
const ID_CALL: u8 = 3;
const ID_ORPHAN_RETURN: u8 = 4;
const ID_SEND: u8 = 5;
const ID_RECV: u8 = 6;
const ID_RECV_LINK: u8 = 7;

/// The ids of one host's spans. Every field is hashed as 8 little-endian bytes after the kind:
/// - trace of a process: (`ID_TRACE`, pid, incarnation): 128 bits; `incarnation` counts the
///   earlier processes of that pid in the trace (their exits), so a reused pid is a new trace;
/// - process span: (`ID_PROCESS`, pid, incarnation);
/// - call span: (`ID_CALL`, pid, track, depth, the call's ts); a return whose call was not seen:
///   (`ID_ORPHAN_RETURN`, pid, track, depth, the return's ts);
/// - send and receive spans: (`ID_SEND` or `ID_RECV`, pid, tid, the event's ts);
/// - the collector's link span of a receive: (`ID_RECV_LINK`, pid, tid, the receive's ts).
///
/// Span ids are the low 64 bits; none is zero (an all-zero id is invalid in OTLP).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostIds {
    key: [u8; 16],
}

impl HostIds {
    pub fn new(key: [u8; 16]) -> HostIds {
        HostIds { key }
    }

    fn hash(&self, kind: u8, fields: &[u64]) -> [u8; 16] {
        let mut h = siphasher::sip128::SipHasher13::new_with_key(&self.key);
        h.write(&[kind]);
        for f in fields {
            h.write(&f.to_le_bytes());
        }
        h.finish128().as_bytes()
    }

    fn span(&self, kind: u8, fields: &[u64]) -> u64 {
        let b = self.hash(kind, fields);
        u64::from_le_bytes(b[..8].try_into().expect("8 bytes")).max(1)
    }

    pub fn trace(&self, pid: u32, incarnation: u32) -> [u8; 16] {
        let mut id = self.hash(ID_TRACE, &[pid.into(), incarnation.into()]);
        if id == [0; 16] {
            id[15] = 1;
        }
        id
    }

    pub fn process(&self, pid: u32, incarnation: u32) -> u64 {
        self.span(ID_PROCESS, &[pid.into(), incarnation.into()])
    }

    pub fn call(&self, pid: u32, track: Track, depth: usize, ts: u64) -> u64 {
        self.span(ID_CALL, &[pid.into(), track_id(track), depth as u64, ts])
    }

    pub fn orphan_return(&self, pid: u32, track: Track, depth: usize, ts: u64) -> u64 {
        self.span(ID_ORPHAN_RETURN, &[pid.into(), track_id(track), depth as u64, ts])
    }

    pub fn send(&self, pid: u32, tid: u32, ts: u64) -> u64 {
        self.span(ID_SEND, &[pid.into(), tid.into(), ts])
    }

    pub fn recv(&self, pid: u32, tid: u32, ts: u64) -> u64 {
        self.span(ID_RECV, &[pid.into(), tid.into(), ts])
    }

    pub fn recv_link(&self, pid: u32, tid: u32, ts: u64) -> u64 {
        self.span(ID_RECV_LINK, &[pid.into(), tid.into(), ts])
    }
}

/// A track as one number: threads below 2^32, goroutines above.
fn track_id(track: Track) -> u64 {
    match track {
        Track::Thread(tid) => tid.into(),
        Track::Goroutine(g) => (1 << 32) | g,
    }
}
