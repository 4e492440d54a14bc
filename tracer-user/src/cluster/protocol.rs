//! The agent/collector protocol: length-prefixed postcard frames over a Unix socket, TCP or TLS.
//!
//! A frame is a little-endian `u32` length, then that many bytes: one postcard-encoded
//! [`Message`] and, on every frame after the handshake, its 32-byte MAC (see
//! [`super::session`]). Frames are bounded by [`MAX_HANDSHAKE_FRAME`] until the peer has proved
//! itself and by [`MAX_FRAME`] after; a frame that is too large, truncated, or does not decode
//! closes that connection with the reason, and nothing else.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

use super::{request_limits, wire::EventBatch};
use crate::event::{TraceEnd, TraceStart};

/// Version of this protocol; both ends must speak the same. 4: calls carry `params`, `file`,
/// `line` and returns `ret` (calls at source level); `log` and `usdt` events; `usdt` and
/// `capture_bytes` in a trace request, payloads on sends and receives. 5: `string_size` in a
/// trace request. 6: `otlp_key` in a trace request and `exports_otlp` in `Started` (cross-host
/// OTLP links when agents export their own spans); an event batch carries its events' encoded
/// bytes, names numbered once per trace. 7: `trace_start` carries `kernel` (the agent's kernel and
/// the mechanisms it chose). 8: receives carry `peek` and `discarded` (`MSG_PEEK`, `MSG_TRUNC`);
/// `trace_start` carries `aliases`; returns carry `unwound` and `tail_call`.
pub const PROTOCOL_VERSION: u32 = 8;
/// The largest frame either end accepts from an authenticated peer.
pub const MAX_FRAME: usize = 8 << 20;
/// The largest frame either end accepts before the peer has proved itself: an unauthenticated
/// peer cannot make the other side allocate more than this.
pub const MAX_HANDSHAKE_FRAME: usize = 4 << 10;

pub type Nonce = [u8; 32];
pub type Proof = [u8; 32];

/// What to trace on one agent: the options of `tracer record`, for that host. Empty lists and
/// zeros mean `record`'s defaults (every event kind, the default buffer and probe limit); the
/// default request follows children, as `record` does. Its lists are bounded
/// ([`super::request_limits`]): decoding keeps one element past each bound, and the agent refuses
/// such a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRequest {
    #[serde(deserialize_with = "request_limits::pids")]
    pub pids: Vec<u32>,
    #[serde(deserialize_with = "request_limits::binaries")]
    pub binaries: Vec<String>,
    /// A command to launch, program first (empty: none).
    #[serde(deserialize_with = "request_limits::command")]
    pub command: Vec<String>,
    #[serde(deserialize_with = "request_limits::patterns")]
    pub functions: Vec<String>,
    /// `-u` USDT patterns.
    #[serde(deserialize_with = "request_limits::patterns")]
    pub usdt: Vec<String>,
    /// Event kinds, by name (`call`, `return`, ...).
    #[serde(deserialize_with = "request_limits::event_names")]
    pub events: Vec<String>,
    pub follow_children: bool,
    pub buffer_size: u32,
    pub max_probes: u32,
    /// `--capture-bytes` (checked by the agent like `record`'s own).
    pub capture_bytes: u32,
    /// `--string-size` (checked by the agent like `record`'s own: 1 to 4096; no zero default).
    pub string_size: u16,
    /// The key of this host's OTLP span and trace ids, for an agent that exports its own spans
    /// (`tracer agent --otlp`): the collector, which makes the same ids from the same events,
    /// then adds the links across hosts. Any 16 bytes are a key; all zero: the collector chose
    /// none, and the agent draws its own (its spans then get no links from other hosts).
    pub otlp_key: [u8; 16],
}

impl Default for TraceRequest {
    fn default() -> Self {
        TraceRequest {
            pids: Vec::new(),
            binaries: Vec::new(),
            command: Vec::new(),
            functions: Vec::new(),
            usdt: Vec::new(),
            events: Vec::new(),
            follow_children: true,
            buffer_size: 0,
            max_probes: 0,
            capture_bytes: 0,
            string_size: crate::debuginfo::layout::DEFAULT_STRING_SIZE,
            otlp_key: [0; 16],
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Message {
    /// Collector → agent, first (plain): its fresh nonce.
    Hello { version: u32, nonce: Nonce },
    /// Agent → collector (plain): its fresh nonce, and whether the collector must know the
    /// secret. Proves nothing: the agent proves itself only after the collector has.
    Challenge { version: u32, nonce: Nonce, secret_required: bool },
    /// Collector → agent, the first MAC'd frame: its MAC proves the collector holds the key
    /// derived from the secret and both nonces.
    Answer,
    /// Agent → collector, the agent's first MAC'd frame (its proof), and who it is.
    Welcome { host: String },
    /// Either way: the connection is refused, and why (plain during the handshake).
    Refused { reason: String },

    /// Collector → agent: answer at once with your clock (clock offset estimation).
    ClockProbe { id: u32 },
    /// Agent → collector: the agent's clock when it answered, in its Unix nanoseconds.
    ClockEcho { id: u32, agent_ns: u64 },

    /// Collector → agent: start tracing.
    Start { trace_id: u64, request: TraceRequest },
    /// Agent → collector: tracing; the trace's start. The trace belongs to this
    /// connection: only it, or a reconnection proving it is the same collector, can receive,
    /// acknowledge or stop it. `exports_otlp`: the agent sends this trace's spans to an
    /// OpenTelemetry collector itself (`tracer agent --otlp`).
    Started { trace_id: u64, trace_start: Box<TraceStart>, exports_otlp: bool },
    /// Agent → collector: the trace could not start (one sentence).
    Failed { trace_id: u64, error: String },
    /// Agent → collector: events, numbered.
    Events(EventBatch),
    /// Agent → collector: events the agent had to drop (its buffer overflowed while no collector
    /// was connected): sequence numbers `first_seq..first_seq + count`.
    Gap { first_seq: u64, count: u64 },
    /// Collector → agent: everything before `next_seq` is safely received.
    Ack { next_seq: u64 },
    /// Collector → agent: stop tracing.
    Stop { trace_id: u64 },
    /// Agent → collector: the trace is over; its end and how many events it had.
    Ended { trace_id: u64, trace_end: TraceEnd, total_events: u64 },
    /// Collector → agent, after reconnecting: carry on with the trace from `next_seq`. `proof`
    /// is [`super::auth::resume_proof`] with the resume key of the connection that started it.
    Resume { trace_id: u64, next_seq: u64, proof: Proof },
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("the peer closed the connection")]
    Closed,
    #[error("frame of {len} bytes is larger than the limit ({limit})")]
    TooLarge { len: usize, limit: usize },
    #[error("frame is truncated (the connection ended inside it)")]
    Truncated,
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error("frame {seq} failed authentication (forged, modified, replayed or out of order): closing the connection")]
    Forged { seq: u64 },
    #[error("writing to the peer timed out after {0:?}")]
    WriteTimeout(std::time::Duration),
    #[error("connection error")]
    Io(#[from] std::io::Error),
}

/// Reads one frame's body, refusing one longer than `limit` before reading (or allocating) it.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R, limit: usize) -> Result<Vec<u8>, FrameError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > limit {
        return Err(FrameError::TooLarge { len, limit });
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => FrameError::Truncated,
        _ => e.into(),
    })?;
    Ok(body)
}

/// Reads one plain (handshake) message.
pub async fn read_message<R: AsyncRead + Unpin>(r: &mut R) -> Result<Message, FrameError> {
    decode(&read_frame(r, MAX_HANDSHAKE_FRAME).await?)
}

/// Decodes one frame's body; trailing bytes are malformed too.
pub fn decode(body: &[u8]) -> Result<Message, FrameError> {
    let (message, rest) = postcard::take_from_bytes(body).map_err(|e| FrameError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(FrameError::Malformed(format!("{} bytes after the message", rest.len())));
    }
    Ok(message)
}

/// Encodes one message (its body, without length).
pub fn encode_body(message: &Message) -> Result<Vec<u8>, FrameError> {
    postcard::to_stdvec(message).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// Makes a frame of a body and an optional tag.
pub fn frame(body: &[u8], tag: &[u8]) -> Result<Vec<u8>, FrameError> {
    let len = body.len() + tag.len();
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge { len, limit: MAX_FRAME });
    }
    let mut frame = Vec::with_capacity(4 + len);
    frame.extend_from_slice(&(len as u32).to_le_bytes());
    frame.extend_from_slice(body);
    frame.extend_from_slice(tag);
    Ok(frame)
}

/// Encodes one message as a plain (handshake) frame.
pub fn encode(message: &Message) -> Result<Vec<u8>, FrameError> {
    frame(&encode_body(message)?, &[])
}

/// Writes one plain (handshake) message.
pub async fn write_message<W: AsyncWrite + Unpin>(w: &mut W, message: &Message) -> Result<(), FrameError> {
    w.write_all(&encode(message)?).await?;
    w.flush().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn round_trip(m: &Message) -> Message {
        let mut buf = Vec::new();
        write_message(&mut buf, m).await.unwrap();
        read_message(&mut &buf[..]).await.unwrap()
    }

    #[tokio::test]
    async fn messages_round_trip() {
        for m in [
            Message::Hello { version: PROTOCOL_VERSION, nonce: [7; 32] },
            Message::Challenge { version: 1, nonce: [2; 32], secret_required: true },
            Message::Welcome { host: "a".into() },
            Message::Resume { trace_id: 1, next_seq: 2, proof: [3; 32] },
            Message::Start {
                trace_id: 9,
                request: TraceRequest { pids: vec![1], events: vec!["call".into()], ..Default::default() },
            },
            Message::Gap { first_seq: 10, count: 5 },
            Message::Ended {
                trace_id: 9,
                trace_end: crate::event::TraceEnd::new(5, crate::event::EndReason::Stopped, 3),
                total_events: 3,
            },
        ] {
            assert_eq!(round_trip(&m).await, m);
        }
    }

    #[tokio::test]
    async fn bad_frames_are_named() {
        let closed = read_message(&mut &[][..]).await.unwrap_err();
        assert!(matches!(closed, FrameError::Closed), "{closed}");
        let mut huge = Vec::new();
        huge.extend_from_slice(&(MAX_FRAME as u32 + 1).to_le_bytes());
        let err = read_frame(&mut &huge[..], MAX_FRAME).await.unwrap_err();
        assert_eq!(err.to_string(), format!("frame of {} bytes is larger than the limit ({MAX_FRAME})", MAX_FRAME + 1));
        // Before authentication, a few KiB at most: nothing is allocated for a bigger frame.
        let mut big = Vec::new();
        big.extend_from_slice(&(MAX_HANDSHAKE_FRAME as u32 + 1).to_le_bytes());
        assert!(matches!(read_message(&mut &big[..]).await, Err(FrameError::TooLarge { .. })));
        let mut cut = encode(&Message::Answer).unwrap();
        cut[0] = 10;
        assert!(matches!(read_message(&mut &cut[..]).await, Err(FrameError::Truncated)));
        let garbage = [3u8, 0, 0, 0, 0xff, 0xff, 0xff];
        assert!(matches!(read_message(&mut &garbage[..]).await, Err(FrameError::Malformed(_))));
        let mut trailing = encode(&Message::Answer).unwrap();
        trailing[0] += 1;
        trailing.push(0);
        assert!(matches!(read_message(&mut &trailing[..]).await, Err(FrameError::Malformed(_))));
    }

    /// Any bytes at all decode to a message or to an error: never a panic, never a hang.
    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for len in 0..2000 {
            let bytes: Vec<u8> = (0..len % 97)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            let _ = decode(&bytes);
        }
    }
}
