//! The agent/collector protocol: length-prefixed postcard frames over a Unix socket, TCP or TLS.
//!
//! During the handshake a frame is a little-endian `u32` length, then that many bytes: one
//! postcard-encoded [`Message`], in the clear, at most [`MAX_HANDSHAKE_FRAME`] bytes. After it,
//! a frame is the same message encrypted and authenticated as Noise transport messages (see
//! [`super::noise`]), at most [`MAX_FRAME`] bytes. A frame that is too large, truncated, fails
//! to open or does not decode closes that connection with the reason, and nothing else.

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
/// `trace_start` carries `aliases`; returns carry `unwound` and `tail_call`. 9: the Noise handshake
/// (`Terms`, `Noise`), and every frame after it encrypted. 10: a launched command's stdout and
/// stderr are streamed to its collector (`CommandOutput`); `cwd` in a trace request. 11:
/// `trace_start.kernel` carries `ring_bytes`; a trace request's `buffer_size` 0 fits the ring
/// to the trace. 12: `trace_end` carries `filters` (each predicate's counters); `break` and
/// `watch` events. 13: a trace request carries `start_at`, `stop_at` and `depth`; `trace_end`'s
/// filter counters carry `by_trigger`, `by_depth` and `returns_unmatched`. 14: a trace request
/// carries `breaks` and `watches` (`-B`, `-w`). 15: `trace_end`'s filter counters carry
/// `children_dropped`; `trace_end` carries `execs_probed_late`.
pub const PROTOCOL_VERSION: u32 = 15;
/// The largest frame (its message's encoding) either end accepts from an authenticated peer.
pub const MAX_FRAME: usize = 8 << 20;
/// The largest frame either end accepts before the peer has proved itself: an unauthenticated
/// peer cannot make the other side allocate more than this.
pub const MAX_HANDSHAKE_FRAME: usize = 4 << 10;

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
    /// The ring buffer's size; 0 fits it to the trace.
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
    /// The launched command's working directory, entered as its user (`None`: `/`). An absolute
    /// path of at most [`request_limits::MAX_PATH`] bytes.
    pub cwd: Option<String>,
    /// `--start-at` and `--stop-at` function patterns.
    #[serde(deserialize_with = "request_limits::patterns")]
    pub start_at: Vec<String>,
    #[serde(deserialize_with = "request_limits::patterns")]
    pub stop_at: Vec<String>,
    /// `--depth` (0: none; checked by the agent like `record`'s own).
    pub depth: u32,
    /// `-B` breakpoints and `-w` watchpoints, as the user wrote them (parsed, and resolved against
    /// the agent's own executables, by the agent as `record` does).
    #[serde(deserialize_with = "request_limits::patterns")]
    pub breaks: Vec<String>,
    #[serde(deserialize_with = "request_limits::patterns")]
    pub watches: Vec<String>,
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
            cwd: None,
            start_at: Vec::new(),
            stop_at: Vec::new(),
            depth: 0,
            breaks: Vec::new(),
            watches: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Message {
    /// Collector → agent, first (plain): the version it speaks. `padding` is zeros: versions 2
    /// to 8 had a nonce there, and keeping its 32 bytes lets an agent of those versions decode
    /// this hello and refuse it by its version, in words (and this agent those versions' hellos).
    Hello { version: u32, padding: [u8; 32] },
    /// Agent → collector (plain): whether the collector must prove it holds the secret, that is
    /// which Noise handshake follows. Proves nothing: the agent proves itself only after the
    /// collector has.
    Terms { version: u32, secret_required: bool },
    /// Either way (plain): one Noise handshake message; the agent's carries its [`Message::Welcome`].
    Noise {
        #[serde(with = "serde_bytes")]
        message: Vec<u8>,
    },
    /// Agent → collector, inside its Noise handshake message: who it is.
    Welcome { host: String },
    /// Either way: the connection is refused, and why (plain during the handshake, encrypted
    /// after it).
    Refused { reason: String },

    /// Collector → agent: answer at once with your clock (clock offset estimation).
    ClockProbe { id: u32 },
    /// Agent → collector: the agent's clock when it answered, in its Unix nanoseconds.
    ClockEcho { id: u32, agent_ns: u64 },

    /// Collector → agent: start tracing. (Boxed: a request is large, most messages are small.)
    Start { trace_id: u64, request: Box<TraceRequest> },
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
    /// Agent → collector: what the launched command wrote to `stream` next, at most
    /// [`super::command_output::MAX_CHUNK`] bytes. `dropped`: bytes of that stream the agent
    /// could not keep for the collector just before these (its output file has them).
    CommandOutput {
        stream: OutputStream,
        dropped: u64,
        #[serde(with = "serde_bytes")]
        bytes: Vec<u8>,
    },
}

/// A launched command's standard output or standard error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OutputStream {
    Stdout,
    Stderr,
}

impl OutputStream {
    pub const BOTH: [OutputStream; 2] = [OutputStream::Stdout, OutputStream::Stderr];

    /// `stdout` or `stderr`.
    pub fn name(self) -> &'static str {
        match self {
            OutputStream::Stdout => "stdout",
            OutputStream::Stderr => "stderr",
        }
    }

    pub(super) fn index(self) -> usize {
        self as usize
    }
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
    #[error("this connection has used up its keys (2^64 - 1 messages): reconnect")]
    Exhausted,
    #[error("writing to the peer timed out after {0:?}")]
    WriteTimeout(std::time::Duration),
    #[error("connection error")]
    Io(#[from] std::io::Error),
}

/// Reads one plain (handshake) frame's body, refusing one longer than [`MAX_HANDSHAKE_FRAME`]
/// before reading (or allocating) it.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Vec<u8>, FrameError> {
    let limit = MAX_HANDSHAKE_FRAME;
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
    decode(&read_frame(r).await?)
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

/// Makes a plain (handshake) frame of a body.
pub fn frame(body: &[u8]) -> Result<Vec<u8>, FrameError> {
    let len = body.len();
    if len > MAX_HANDSHAKE_FRAME {
        return Err(FrameError::TooLarge { len, limit: MAX_HANDSHAKE_FRAME });
    }
    let mut frame = Vec::with_capacity(4 + len);
    frame.extend_from_slice(&(len as u32).to_le_bytes());
    frame.extend_from_slice(body);
    Ok(frame)
}

/// Encodes one message as a plain (handshake) frame.
pub fn encode(message: &Message) -> Result<Vec<u8>, FrameError> {
    frame(&encode_body(message)?)
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
            Message::Hello { version: PROTOCOL_VERSION, padding: [0; 32] },
            Message::Terms { version: 1, secret_required: true },
            Message::Noise { message: vec![1, 2, 3] },
            Message::Welcome { host: "a".into() },
            Message::Resume { trace_id: 1, next_seq: 2, proof: [3; 32] },
            Message::Start {
                trace_id: 9,
                request: Box::new(TraceRequest {
                    pids: vec![1],
                    events: vec!["call".into()],
                    cwd: Some("/srv".into()),
                    ..Default::default()
                }),
            },
            Message::Gap { first_seq: 10, count: 5 },
            Message::CommandOutput { stream: OutputStream::Stderr, dropped: 3, bytes: b"a\nb".to_vec() },
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
        // Before authentication, a few KiB at most: nothing is allocated for a bigger frame.
        let mut big = Vec::new();
        big.extend_from_slice(&(MAX_HANDSHAKE_FRAME as u32 + 1).to_le_bytes());
        let err = read_message(&mut &big[..]).await.unwrap_err();
        assert_eq!(err.to_string(), "frame of 4097 bytes is larger than the limit (4096)");
        let mut cut = encode(&Message::Stop { trace_id: 1 }).unwrap();
        cut[0] = 10;
        assert!(matches!(read_message(&mut &cut[..]).await, Err(FrameError::Truncated)));
        let garbage = [3u8, 0, 0, 0, 0xff, 0xff, 0xff];
        assert!(matches!(read_message(&mut &garbage[..]).await, Err(FrameError::Malformed(_))));
        let mut trailing = encode(&Message::Stop { trace_id: 1 }).unwrap();
        trailing[0] += 1;
        trailing.push(0);
        assert!(matches!(read_message(&mut &trailing[..]).await, Err(FrameError::Malformed(_))));
    }

    /// The first messages of versions 2 to 8, as those versions declared them.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    enum Version8 {
        Hello { version: u32, nonce: [u8; 32] },
        Challenge { version: u32, nonce: [u8; 32], secret_required: bool },
        Answer,
        Welcome { host: String },
        Refused { reason: String },
    }

    /// A collector and an agent of different versions tell each other so in words: each decodes
    /// the other's hello, and the other's refusal.
    #[test]
    fn older_versions_read_the_hello_and_the_refusal() {
        let hello = encode_body(&Message::Hello { version: PROTOCOL_VERSION, padding: [0; 32] }).unwrap();
        let old: Version8 = postcard::from_bytes(&hello).unwrap();
        assert_eq!(old, Version8::Hello { version: PROTOCOL_VERSION, nonce: [0; 32] });
        let old_hello = postcard::to_stdvec(&Version8::Hello { version: 8, nonce: [9; 32] }).unwrap();
        assert!(matches!(decode(&old_hello).unwrap(), Message::Hello { version: 8, .. }));
        let refusal = encode_body(&Message::Refused { reason: "protocol version 8 is not 9".into() }).unwrap();
        let old: Version8 = postcard::from_bytes(&refusal).unwrap();
        assert_eq!(old, Version8::Refused { reason: "protocol version 8 is not 9".into() });
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
