//! An authenticated connection: the handshake, then every frame numbered and MAC'd.
//!
//! The handshake, in an order where the agent proves nothing before the collector has:
//!
//! ```text
//! collector → agent   Hello { nonce_c }                       plain
//! agent → collector   Challenge { nonce_a, secret_required }  plain
//!                     both: keys = HKDF(secret, SHA-256(Hello ‖ Challenge))
//! collector → agent   Answer                                  MAC'd, frame 0 to the agent
//! agent → collector   Welcome { host }                        MAC'd, frame 0 to the collector
//! ```
//!
//! A collector without the right secret cannot make the Answer's MAC, so the agent refuses it
//! without having sent anything derived from the secret (nothing to guess the secret from
//! offline). From then on every frame in each direction carries
//! `HMAC-SHA256(direction's key, sequence number ‖ body)`, the sequence number counted by both
//! ends and never sent: a frame injected by a relay, modified, replayed, dropped or reordered
//! fails its check, and the connection is closed. The MAC sits inside TLS when TLS is on.

use std::time::Duration;

use hmac::{Hmac, Mac as _};
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadHalf, WriteHalf};

use super::{
    auth::{self, Key, Secret, SessionKeys},
    protocol::{FrameError, MAX_FRAME, MAX_HANDSHAKE_FRAME, Message, PROTOCOL_VERSION, decode, encode_body, frame},
    tls::Transport,
};

/// Bytes of the MAC at the end of each frame after the handshake.
pub const TAG: usize = 32;
/// A peer that has not finished the handshake by then is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// A write that the peer does not take within this long closes the connection (a stopped or
/// vanished peer stops being written to).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a refusal may take to send.
const REFUSAL_TIME: Duration = Duration::from_secs(1);
/// How long the peer's bytes are read after a refusal, at most: a collector's hello is there by
/// then (it sends it on connecting), and a peer that never closes holds nothing for longer.
const DRAIN_TIME: Duration = Duration::from_millis(100);

/// What the agent says when a collector's proof fails.
pub const AUTH_FAILED: &str = "authentication failed: the secrets differ (give both sides the same --secret-file)";

fn mac(key: &Key, seq: u64, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(&seq.to_le_bytes());
    mac.update(body);
    mac
}

/// Numbers and MACs outgoing frames.
pub struct Sealer {
    key: Key,
    seq: u64,
}

impl Sealer {
    pub fn new(key: Key) -> Sealer {
        Sealer { key, seq: 0 }
    }

    /// The next frame, with its MAC.
    pub fn seal(&mut self, message: &Message) -> Result<Vec<u8>, FrameError> {
        let body = encode_body(message)?;
        let tag = mac(&self.key, self.seq, &body).finalize().into_bytes();
        self.seq += 1;
        frame(&body, &tag)
    }
}

/// Checks incoming frames: each must carry the MAC of the next sequence number.
pub struct Opener {
    key: Key,
    seq: u64,
}

impl Opener {
    pub fn new(key: Key) -> Opener {
        Opener { key, seq: 0 }
    }

    /// Checks and decodes one frame's body (the message, then its MAC).
    pub fn open(&mut self, body: &[u8]) -> Result<Message, FrameError> {
        let forged = FrameError::Forged { seq: self.seq };
        let Some(split) = body.len().checked_sub(TAG) else { return Err(forged) };
        let (message, tag) = body.split_at(split);
        if mac(&self.key, self.seq, message).verify_slice(tag).is_err() {
            return Err(forged);
        }
        self.seq += 1;
        decode(message)
    }
}

/// The reading half of an authenticated connection.
pub struct SessionReader<R> {
    inner: R,
    opener: Opener,
}

impl<R: AsyncRead + Unpin> SessionReader<R> {
    /// The next message; an error ends the connection.
    pub async fn recv(&mut self) -> Result<Message, FrameError> {
        let body = super::protocol::read_frame(&mut self.inner, MAX_FRAME).await?;
        self.opener.open(&body)
    }
}

impl<R: AsyncRead + Unpin> SessionReader<R> {
    /// Reads frames into `frames` until the connection fails or `frames` is closed, calling
    /// `heard` after each frame that opened. Both ends run it as a task of its own, because a
    /// `recv` cut short by `select!` would lose bytes of a frame; the error, if any, is the last
    /// item sent.
    pub async fn forward(
        mut self,
        frames: tokio::sync::mpsc::Sender<Result<Message, FrameError>>,
        mut heard: impl FnMut(),
    ) {
        loop {
            let message = self.recv().await;
            let failed = message.is_err();
            if !failed {
                heard();
            }
            if frames.send(message).await.is_err() || failed {
                return;
            }
        }
    }
}

/// The writing half of an authenticated connection.
pub struct SessionWriter<W> {
    inner: W,
    sealer: Sealer,
}

impl<W: AsyncWrite + Unpin> SessionWriter<W> {
    /// Sends one message; a peer that does not take it within [`WRITE_TIMEOUT`] is an error.
    pub async fn send(&mut self, message: &Message) -> Result<(), FrameError> {
        let frame = self.sealer.seal(message)?;
        let write = async {
            self.inner.write_all(&frame).await?;
            self.inner.flush().await
        };
        tokio::time::timeout(WRITE_TIMEOUT, write).await.map_err(|_| FrameError::WriteTimeout(WRITE_TIMEOUT))??;
        Ok(())
    }

    /// Sends a MAC'd refusal and closes this side (best effort, within a second): the peer reads
    /// the reason before the end of the stream.
    pub async fn refuse(&mut self, reason: &str) {
        let _ = tokio::time::timeout(REFUSAL_TIME, async {
            self.send(&Message::Refused { reason: reason.to_string() }).await?;
            self.inner.shutdown().await?;
            Ok::<_, FrameError>(())
        })
        .await;
    }
}

impl<R: AsyncRead + Unpin> SessionReader<R> {
    /// Reads and drops what the peer still sends until it closes (for at most [`DRAIN_TIME`]):
    /// closing with unread bytes would reset the connection, and a reset can destroy a refusal
    /// the peer has not read yet.
    pub async fn drain(&mut self) {
        let _ = tokio::time::timeout(DRAIN_TIME, drain(&mut self.inner)).await;
    }
}

async fn drain<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<()> {
    // Small: every refusal being told holds one (up to `MAX_REFUSING` at once).
    let mut sink = [0u8; 512];
    while r.read(&mut sink).await? > 0 {}
    Ok(())
}

/// An authenticated connection, split in halves.
pub struct Session {
    pub reader: SessionReader<ReadHalf<Box<dyn Transport>>>,
    pub writer: SessionWriter<WriteHalf<Box<dyn Transport>>>,
    /// The hash of this connection's handshake (what a resume proof is bound to).
    pub transcript: [u8; 32],
    /// This connection's resume key.
    pub resume_key: Key,
    /// The agent's name (as the agent gave it; on the agent's side, its own).
    pub host: String,
}

#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("protocol version {theirs} is not {PROTOCOL_VERSION}")]
    Version { theirs: u32 },
    #[error("the peer refused: {0}")]
    Refused(String),
    #[error("{}", AUTH_FAILED)]
    WrongSecret,
    #[error("the agent requires a secret and this collector has none")]
    SecretNeeded,
    #[error("the agent did not prove that it knows the secret")]
    AgentNotAuthenticated,
    #[error("the agent accepts collectors without a secret over the network: refusing to trust it")]
    AgentWithoutSecret,
    #[error("the handshake did not finish within {HANDSHAKE_TIMEOUT:?}")]
    Timeout,
    #[error("unexpected {0} during the handshake")]
    Unexpected(&'static str),
}

fn transcript(hello: &[u8], challenge: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((hello.len() as u32).to_le_bytes());
    h.update(hello);
    h.update(challenge);
    h.finalize().into()
}

async fn send_plain(stream: &mut Box<dyn Transport>, body: &[u8]) -> Result<(), FrameError> {
    stream.write_all(&frame(body, &[])?).await?;
    stream.flush().await?;
    Ok(())
}

/// Tells the peer why, as a plain frame, and closes (best effort: it may be gone): the
/// refusal, the end of this side, then the peer's bytes (its hello) read until it closes or for
/// [`DRAIN_TIME`], so that the collector reads the reason rather than a reset.
pub async fn refuse(stream: &mut Box<dyn Transport>, reason: &str) {
    let Ok(body) = encode_body(&Message::Refused { reason: reason.to_string() }) else { return };
    let sent = tokio::time::timeout(REFUSAL_TIME, async {
        send_plain(stream, &body).await?;
        stream.shutdown().await?;
        Ok::<_, FrameError>(())
    })
    .await;
    if let Ok(Ok(())) = sent {
        let _ = tokio::time::timeout(DRAIN_TIME, drain(stream)).await;
    }
}

fn split(stream: Box<dyn Transport>, keys: &SessionKeys, agent: bool, transcript: [u8; 32], host: String) -> Session {
    let (read, write) = tokio::io::split(stream);
    let (incoming, outgoing) =
        if agent { (keys.to_agent, keys.to_collector) } else { (keys.to_collector, keys.to_agent) };
    Session {
        reader: SessionReader { inner: read, opener: Opener::new(incoming) },
        writer: SessionWriter { inner: write, sealer: Sealer::new(outgoing) },
        transcript,
        resume_key: keys.resume,
        host,
    }
}

/// The collector's side. `network`: the agent is reached over TCP (where an agent that takes
/// anyone is not to be trusted), not a Unix socket.
pub async fn client(
    mut stream: Box<dyn Transport>,
    secret: Option<&Secret>,
    network: bool,
) -> Result<Session, HandshakeError> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, async move {
        let hello = encode_body(&Message::Hello { version: PROTOCOL_VERSION, nonce: auth::nonce() })?;
        let sent = send_plain(&mut stream, &hello).await;
        // An agent that refuses us at once may have closed before our hello: its reason is
        // still there to read.
        let challenge = match super::protocol::read_frame(&mut stream, MAX_HANDSHAKE_FRAME).await {
            Ok(frame) => frame,
            Err(e) => return Err(sent.err().unwrap_or(e).into()),
        };
        if let Err(e) = sent {
            return Err(match decode(&challenge) {
                Ok(Message::Refused { reason }) => HandshakeError::Refused(reason),
                _ => e.into(),
            });
        }
        let secret_required = match decode(&challenge)? {
            Message::Challenge { version, secret_required, .. } if version == PROTOCOL_VERSION => secret_required,
            Message::Challenge { version, .. } => return Err(HandshakeError::Version { theirs: version }),
            Message::Refused { reason } => return Err(HandshakeError::Refused(reason)),
            _ => return Err(HandshakeError::Unexpected("message instead of a challenge")),
        };
        let secret = match (secret_required, secret) {
            (true, None) => {
                refuse(&mut stream, "authentication failed: the collector has no secret").await;
                return Err(HandshakeError::SecretNeeded);
            }
            (false, _) if network => {
                refuse(&mut stream, "an agent on the network must require a secret").await;
                return Err(HandshakeError::AgentWithoutSecret);
            }
            (true, secret) => secret,
            (false, _) => None,
        };
        let transcript = transcript(&hello, &challenge);
        let keys = auth::derive(secret, &transcript);
        let mut sealer = Sealer::new(keys.to_agent);
        stream.write_all(&sealer.seal(&Message::Answer)?).await.map_err(FrameError::from)?;
        stream.flush().await.map_err(FrameError::from)?;
        let welcome = super::protocol::read_frame(&mut stream, MAX_HANDSHAKE_FRAME).await?;
        let host = match Opener::new(keys.to_collector).open(&welcome) {
            Ok(Message::Welcome { host }) => host,
            Ok(_) => return Err(HandshakeError::Unexpected("message instead of a welcome")),
            // Not MAC'd: the agent refused us (or someone pretends to be the agent).
            Err(_) => match decode(&welcome) {
                Ok(Message::Refused { reason }) => return Err(HandshakeError::Refused(reason)),
                _ => return Err(HandshakeError::AgentNotAuthenticated),
            },
        };
        let mut session = split(stream, &keys, false, transcript, host);
        // Frame 0 of each direction was the handshake's.
        session.writer.sealer.seq = 1;
        session.reader.opener.seq = 1;
        Ok(session)
    })
    .await
    .map_err(|_| HandshakeError::Timeout)?
}

/// The agent's side: refuses a collector that cannot prove it holds `secret` (if there is one)
/// without giving away anything derived from it.
pub async fn server(
    mut stream: Box<dyn Transport>,
    secret: Option<&Secret>,
    host: &str,
) -> Result<Session, HandshakeError> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, async move {
        let hello = read_hello(&mut stream).await?;
        server_after_hello(stream, hello, secret, host).await
    })
    .await
    .map_err(|_| HandshakeError::Timeout)?
}

/// The first step of the agent's side: the collector's hello, of this protocol's version (a
/// valid hello starts a real handshake: [`super::admission`]). Returns its frame.
pub async fn read_hello(stream: &mut Box<dyn Transport>) -> Result<Vec<u8>, HandshakeError> {
    let hello = super::protocol::read_frame(stream, MAX_HANDSHAKE_FRAME).await?;
    match decode(&hello)? {
        Message::Hello { version, .. } if version == PROTOCOL_VERSION => Ok(hello),
        Message::Hello { version, .. } => {
            refuse(stream, &format!("protocol version {version} is not {PROTOCOL_VERSION}")).await;
            Err(HandshakeError::Version { theirs: version })
        }
        _ => Err(HandshakeError::Unexpected("message instead of a hello")),
    }
}

/// The rest of the agent's side, after [`read_hello`] (the caller bounds its time).
pub async fn server_after_hello(
    mut stream: Box<dyn Transport>,
    hello: Vec<u8>,
    secret: Option<&Secret>,
    host: &str,
) -> Result<Session, HandshakeError> {
    let challenge = encode_body(&Message::Challenge {
        version: PROTOCOL_VERSION,
        nonce: auth::nonce(),
        secret_required: secret.is_some(),
    })?;
    send_plain(&mut stream, &challenge).await?;
    let transcript = transcript(&hello, &challenge);
    let keys = auth::derive(secret, &transcript);
    let answer = super::protocol::read_frame(&mut stream, MAX_HANDSHAKE_FRAME).await?;
    match Opener::new(keys.to_agent).open(&answer) {
        Ok(Message::Answer) => {}
        Ok(_) => return Err(HandshakeError::Unexpected("message instead of an answer")),
        Err(_) => {
            if let Ok(Message::Refused { reason }) = decode(&answer) {
                return Err(HandshakeError::Refused(reason));
            }
            refuse(&mut stream, AUTH_FAILED).await;
            return Err(HandshakeError::WrongSecret);
        }
    }
    let mut sealer = Sealer::new(keys.to_collector);
    stream.write_all(&sealer.seal(&Message::Welcome { host: host.to_string() })?).await.map_err(FrameError::from)?;
    stream.flush().await.map_err(FrameError::from)?;
    let mut session = split(stream, &keys, true, transcript, host.to_string());
    session.writer.sealer.seq = 1;
    session.reader.opener.seq = 1;
    Ok(session)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::protocol::read_frame;

    fn frames(sealer: &mut Sealer, messages: &[Message]) -> Vec<Vec<u8>> {
        // Bodies without the length prefix, as `read_frame` returns them.
        messages.iter().map(|m| sealer.seal(m).unwrap()[4..].to_vec()).collect()
    }

    fn probes() -> Vec<Message> {
        (0..3).map(|id| Message::ClockProbe { id }).collect()
    }

    #[test]
    fn frames_in_order_open() {
        let mut s = Sealer::new([1; 32]);
        let mut o = Opener::new([1; 32]);
        for (f, m) in frames(&mut s, &probes()).iter().zip(probes()) {
            assert_eq!(o.open(f).unwrap(), m);
        }
    }

    #[test]
    fn a_tampered_frame_is_refused() {
        let mut s = Sealer::new([1; 32]);
        let mut f = frames(&mut s, &probes()).remove(0);
        f[1] ^= 1;
        assert!(matches!(Opener::new([1; 32]).open(&f), Err(FrameError::Forged { seq: 0 })));
        let mut cut = frames(&mut Sealer::new([1; 32]), &probes()).remove(0);
        cut.pop();
        assert!(matches!(Opener::new([1; 32]).open(&cut), Err(FrameError::Forged { seq: 0 })));
        assert!(matches!(Opener::new([1; 32]).open(&[0; 5]), Err(FrameError::Forged { seq: 0 })));
    }

    #[test]
    fn a_replayed_frame_is_refused() {
        let fs = frames(&mut Sealer::new([1; 32]), &probes());
        let mut o = Opener::new([1; 32]);
        o.open(&fs[0]).unwrap();
        o.open(&fs[1]).unwrap();
        let err = o.open(&fs[1]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "frame 2 failed authentication (forged, modified, replayed or out of order): closing the connection"
        );
    }

    #[test]
    fn reordered_or_dropped_frames_are_refused() {
        let fs = frames(&mut Sealer::new([1; 32]), &probes());
        let mut o = Opener::new([1; 32]);
        o.open(&fs[0]).unwrap();
        assert!(matches!(o.open(&fs[2]), Err(FrameError::Forged { seq: 1 })), "frame 1 was skipped");
        let mut o = Opener::new([1; 32]);
        assert!(o.open(&fs[1]).is_err(), "frame 1 before frame 0");
    }

    #[test]
    fn a_frame_for_the_other_direction_or_another_key_is_refused() {
        let keys = auth::derive(Some(&Secret::new("k".repeat(32))), &[5; 32]);
        let f = frames(&mut Sealer::new(keys.to_agent), &probes()).remove(0);
        assert!(Opener::new(keys.to_collector).open(&f).is_err(), "reflected back at its sender");
        assert!(Opener::new(auth::derive(None, &[5; 32]).to_agent).open(&f).is_err());
        assert_eq!(Opener::new(keys.to_agent).open(&f).unwrap(), Message::ClockProbe { id: 0 });
    }

    #[test]
    fn an_injected_plain_frame_is_refused() {
        let body = encode_body(&Message::Stop { trace_id: 1 }).unwrap();
        assert!(Opener::new([1; 32]).open(&body).is_err());
    }

    async fn pair(
        agent_secret: Option<Secret>,
        collector_secret: Option<Secret>,
    ) -> (Result<Session, HandshakeError>, Result<Session, HandshakeError>) {
        let (a, b) = tokio::io::duplex(1 << 16);
        let agent = tokio::spawn(async move { server(Box::new(a), agent_secret.as_ref(), "h").await });
        let collector = client(Box::new(b), collector_secret.as_ref(), true).await;
        (agent.await.unwrap(), collector)
    }

    #[tokio::test]
    async fn handshake_with_the_same_secret_then_messages_both_ways() {
        let s = Secret::new("s".repeat(32));
        let (agent, collector) = pair(Some(s.clone()), Some(s)).await;
        let (mut agent, mut collector) = (agent.unwrap(), collector.unwrap());
        assert_eq!(collector.host, "h");
        assert_eq!(agent.transcript, collector.transcript);
        assert_eq!(agent.resume_key, collector.resume_key);
        collector.writer.send(&Message::ClockProbe { id: 4 }).await.unwrap();
        assert_eq!(agent.reader.recv().await.unwrap(), Message::ClockProbe { id: 4 });
        agent.writer.send(&Message::ClockEcho { id: 4, agent_ns: 9 }).await.unwrap();
        assert_eq!(collector.reader.recv().await.unwrap(), Message::ClockEcho { id: 4, agent_ns: 9 });
    }

    #[tokio::test]
    async fn a_wrong_or_missing_secret_is_refused_on_both_sides() {
        let (agent, collector) = pair(Some(Secret::new("s".repeat(32))), Some(Secret::new("t".repeat(32)))).await;
        assert!(matches!(agent, Err(HandshakeError::WrongSecret)));
        assert!(matches!(collector, Err(HandshakeError::Refused(r)) if r == AUTH_FAILED));
        let (agent, collector) = pair(Some(Secret::new("s".repeat(32))), None).await;
        assert!(matches!(agent, Err(HandshakeError::Refused(_))));
        assert!(matches!(collector, Err(HandshakeError::SecretNeeded)));
        // An agent over the network that takes anyone is not trusted.
        let (_, collector) = pair(None, Some(Secret::new("s".repeat(32)))).await;
        assert!(matches!(collector, Err(HandshakeError::AgentWithoutSecret)));
    }

    /// What an agent sends before the collector has proved itself is its nonce and nothing
    /// derived from the secret: the same bytes with two different secrets, apart from the nonce.
    #[tokio::test]
    async fn the_agent_gives_away_nothing_before_the_collector_has_proved_itself() {
        for secret in ["s".repeat(32), "t".repeat(32)] {
            let (a, mut b) = tokio::io::duplex(1 << 16);
            let secret = Secret::new(secret);
            let agent = tokio::spawn(async move { server(Box::new(a), Some(&secret), "h").await });
            let hello = crate::cluster::protocol::encode(&Message::Hello { version: PROTOCOL_VERSION, nonce: [0; 32] });
            b.write_all(&hello.unwrap()).await.unwrap();
            let challenge = read_frame(&mut b, MAX_HANDSHAKE_FRAME).await.unwrap();
            let Message::Challenge { secret_required: true, .. } = decode(&challenge).unwrap() else { panic!() };
            // A guess at the answer is refused, and the refusal is plain text.
            let mut guess = Sealer::new([0; 32]);
            b.write_all(&guess.seal(&Message::Answer).unwrap()).await.unwrap();
            let refusal = read_frame(&mut b, MAX_HANDSHAKE_FRAME).await.unwrap();
            assert_eq!(decode(&refusal).unwrap(), Message::Refused { reason: AUTH_FAILED.to_string() });
            assert!(matches!(agent.await.unwrap(), Err(HandshakeError::WrongSecret)));
        }
    }
}
