//! An authenticated, encrypted connection: a Noise handshake, then every frame encrypted and
//! numbered ([`super::noise`]).
//!
//! The handshake, in an order where the agent proves nothing before the collector has:
//!
//! ```text
//! collector → agent   Hello { version }                                 plain
//! agent → collector   Terms { version, secret_required }                plain
//! collector → agent   Noise: -> psk, e                                  the collector's proof
//! agent → collector   Noise: <- e, ee, payload Welcome { host }         the agent's proof
//! ```
//!
//! The plain frames carry the version, so that a mismatch is refused in words, and say which
//! handshake follows (`Noise_NNpsk0_...` when the agent requires the secret, `Noise_NN_...`
//! without one); the Noise prologue binds both, so a relay that changes them makes the
//! handshake fail. With the secret, the collector's Noise message is encrypted under a key mixed
//! from it: an agent whose secret differs cannot open it and refuses it in a plain frame
//! ([`AUTH_FAILED`]) without answering with a Noise message of its own, having sent nothing
//! derived from the secret (nothing to guess it from offline). The agent's answer is encrypted
//! under keys mixed from the secret and both sides' ephemeral keys: it proves the agent holds the
//! secret too, and only that collector can read it. From then on every frame in each direction is
//! encrypted and authenticated under its direction's key with a nonce both ends count: a frame
//! injected by a relay, modified, replayed, dropped or reordered fails to open, and the
//! connection is closed. Noise runs inside TLS when TLS is on.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadHalf, WriteHalf};

use super::{
    auth::{self, Key, Secret},
    noise::{self, Handshake, Opener, Sealer},
    protocol::{FrameError, Message, PROTOCOL_VERSION, decode, encode_body, frame, read_frame},
    tls::Transport,
};

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

/// The reading half of an authenticated connection.
pub struct SessionReader<R> {
    inner: R,
    opener: Opener,
}

impl<R: AsyncRead + Unpin> SessionReader<R> {
    /// The next message; an error ends the connection.
    pub async fn recv(&mut self) -> Result<Message, FrameError> {
        let body = self.opener.read(&mut self.inner).await?;
        decode(&body)
    }

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

    /// Reads and drops what the peer still sends until it closes (for at most [`DRAIN_TIME`]):
    /// closing with unread bytes would reset the connection, and a reset can destroy a refusal
    /// the peer has not read yet.
    pub async fn drain(&mut self) {
        let _ = tokio::time::timeout(DRAIN_TIME, drain(&mut self.inner)).await;
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
        let sealed = self.sealer.seal(message)?;
        let write = async {
            self.inner.write_all(&sealed).await?;
            self.inner.flush().await
        };
        tokio::time::timeout(WRITE_TIMEOUT, write).await.map_err(|_| FrameError::WriteTimeout(WRITE_TIMEOUT))??;
        Ok(())
    }

    /// Sends an encrypted refusal and closes this side (best effort, within a second): the peer
    /// reads the reason before the end of the stream.
    pub async fn refuse(&mut self, reason: &str) {
        let _ = tokio::time::timeout(REFUSAL_TIME, async {
            self.send(&Message::Refused { reason: reason.to_string() }).await?;
            self.inner.shutdown().await?;
            Ok::<_, FrameError>(())
        })
        .await;
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
    /// The hash of this connection's Noise handshake (what a resume proof is bound to).
    pub transcript: [u8; 32],
    /// This connection's resume key ([`auth::resume_key`]).
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
    #[error("the Noise handshake failed: {0}")]
    Noise(snow::Error),
    #[error("the handshake did not finish within {HANDSHAKE_TIMEOUT:?}")]
    Timeout,
    #[error("unexpected {0} during the handshake")]
    Unexpected(&'static str),
}

async fn send_plain(stream: &mut Box<dyn Transport>, body: &[u8]) -> Result<(), FrameError> {
    stream.write_all(&frame(body)?).await?;
    stream.flush().await?;
    Ok(())
}

/// Sends one Noise handshake message, in a plain frame.
async fn send_noise(stream: &mut Box<dyn Transport>, message: Vec<u8>) -> Result<(), FrameError> {
    send_plain(stream, &encode_body(&Message::Noise { message })?).await
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

/// The session, once both handshake messages have passed.
fn split(
    stream: Box<dyn Transport>,
    handshake: Handshake,
    secret: Option<&Secret>,
    host: String,
) -> Result<Session, HandshakeError> {
    let (sealer, opener, hash) = handshake.finish().map_err(HandshakeError::Noise)?;
    let (read, write) = tokio::io::split(stream);
    Ok(Session {
        reader: SessionReader { inner: read, opener },
        writer: SessionWriter { inner: write, sealer },
        transcript: hash,
        resume_key: auth::resume_key(secret, &hash),
        host,
    })
}

/// The collector's side. `network`: the agent is reached over TCP (where an agent that takes
/// anyone is not to be trusted), not a Unix socket.
pub async fn client(
    mut stream: Box<dyn Transport>,
    secret: Option<&Secret>,
    network: bool,
) -> Result<Session, HandshakeError> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, async move {
        let hello = encode_body(&Message::Hello { version: PROTOCOL_VERSION, padding: [0; 32] })?;
        let sent = send_plain(&mut stream, &hello).await;
        // An agent that refuses us at once may have closed before our hello: its reason is
        // still there to read.
        let terms = match read_frame(&mut stream).await {
            Ok(frame) => frame,
            Err(e) => return Err(sent.err().unwrap_or(e).into()),
        };
        if let Err(e) = sent {
            return Err(match decode(&terms) {
                Ok(Message::Refused { reason }) => HandshakeError::Refused(reason),
                _ => e.into(),
            });
        }
        let secret_required = match decode(&terms)? {
            Message::Terms { version, secret_required } if version == PROTOCOL_VERSION => secret_required,
            Message::Terms { version, .. } => return Err(HandshakeError::Version { theirs: version }),
            Message::Refused { reason } => return Err(HandshakeError::Refused(reason)),
            _ => return Err(HandshakeError::Unexpected("message instead of the agent's terms")),
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
        let mut handshake = Handshake::initiator(secret, &noise::prologue(&hello, &terms));
        send_noise(&mut stream, handshake.write(&[]).map_err(HandshakeError::Noise)?).await?;
        let answer = read_frame(&mut stream).await?;
        let host = match decode(&answer)? {
            Message::Noise { message } => match handshake.read(&message).map(|payload| decode(&payload)) {
                Ok(Ok(Message::Welcome { host })) => host,
                Ok(_) => return Err(HandshakeError::Unexpected("message instead of a welcome")),
                // Not made with the secret (or the handshake was changed on the way).
                Err(_) => return Err(HandshakeError::AgentNotAuthenticated),
            },
            Message::Refused { reason } => return Err(HandshakeError::Refused(reason)),
            _ => return Err(HandshakeError::Unexpected("message instead of the agent's handshake")),
        };
        split(stream, handshake, secret, host)
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
    let hello = read_frame(stream).await?;
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
    let terms = encode_body(&Message::Terms { version: PROTOCOL_VERSION, secret_required: secret.is_some() })?;
    send_plain(&mut stream, &terms).await?;
    let mut handshake = Handshake::responder(secret, &noise::prologue(&hello, &terms));
    let proof = read_frame(&mut stream).await?;
    match decode(&proof)? {
        Message::Noise { message } => match handshake.read(&message) {
            Ok(_) => {}
            // Not encrypted under the secret's key: refused in a plain frame, with no Noise
            // message of the agent's.
            Err(snow::Error::Decrypt) => {
                refuse(&mut stream, AUTH_FAILED).await;
                return Err(HandshakeError::WrongSecret);
            }
            Err(e) => return Err(HandshakeError::Noise(e)),
        },
        Message::Refused { reason } => return Err(HandshakeError::Refused(reason)),
        _ => return Err(HandshakeError::Unexpected("message instead of the collector's handshake")),
    }
    let welcome = encode_body(&Message::Welcome { host: host.to_string() })?;
    send_noise(&mut stream, handshake.write(&welcome).map_err(HandshakeError::Noise)?).await?;
    split(stream, handshake, secret, host.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let (agent, collector) = pair(Some(s.clone()), Some(s.clone())).await;
        let (mut agent, mut collector) = (agent.unwrap(), collector.unwrap());
        assert_eq!(collector.host, "h");
        assert_eq!(agent.transcript, collector.transcript);
        assert_eq!(agent.resume_key, collector.resume_key);
        collector.writer.send(&Message::ClockProbe { id: 4 }).await.unwrap();
        assert_eq!(agent.reader.recv().await.unwrap(), Message::ClockProbe { id: 4 });
        agent.writer.send(&Message::ClockEcho { id: 4, agent_ns: 9 }).await.unwrap();
        assert_eq!(collector.reader.recv().await.unwrap(), Message::ClockEcho { id: 4, agent_ns: 9 });
        // A frame of many Noise messages, both ways.
        let long = Message::Refused { reason: "x".repeat(300_000) };
        let (sent, received) = tokio::join!(collector.writer.send(&long), agent.reader.recv());
        sent.unwrap();
        assert_eq!(received.unwrap(), long);
        let (sent, received) = tokio::join!(agent.writer.send(&long), collector.reader.recv());
        sent.unwrap();
        assert_eq!(received.unwrap(), long);
        // Each connection has a handshake (and so resume key) of its own.
        let (again, _) = pair(Some(s.clone()), Some(s)).await;
        let again = again.unwrap();
        assert_ne!(again.transcript, agent.transcript);
        assert_ne!(again.resume_key, agent.resume_key);
    }

    /// On a Unix socket without a secret (`Noise_NN`: its frames are encrypted all the same, as
    /// `noise::tests::the_wire_shows_nothing_of_a_frame` checks).
    #[tokio::test]
    async fn without_a_secret_both_sides_agree_and_frames_pass() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let agent = tokio::spawn(async move { server(Box::new(a), None, "h").await });
        let mut collector = client(Box::new(b), None, false).await.unwrap();
        let mut agent = agent.await.unwrap().unwrap();
        assert_eq!(agent.transcript, collector.transcript);
        assert_eq!(agent.resume_key, collector.resume_key);
        collector.writer.send(&Message::ClockProbe { id: 4 }).await.unwrap();
        assert_eq!(agent.reader.recv().await.unwrap(), Message::ClockProbe { id: 4 });
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

    /// The collector's side of a handshake written by hand: `hello`, then reads the terms and
    /// sends a Noise message made with `secret`; what the agent answers, frame by frame, until it
    /// closes.
    async fn agent_answers(agent_secret: &Secret, collector_secret: &Secret) -> (Vec<u8>, Vec<Message>) {
        let (a, b) = tokio::io::duplex(1 << 16);
        let mut b: Box<dyn Transport> = Box::new(b);
        let secret = agent_secret.clone();
        let agent = tokio::spawn(async move { server(Box::new(a), Some(&secret), "h").await });
        let hello = encode_body(&Message::Hello { version: PROTOCOL_VERSION, padding: [0; 32] }).unwrap();
        send_plain(&mut b, &hello).await.unwrap();
        let terms = read_frame(&mut b).await.unwrap();
        let mut handshake = Handshake::initiator(Some(collector_secret), &noise::prologue(&hello, &terms));
        send_noise(&mut b, handshake.write(&[]).unwrap()).await.unwrap();
        let mut answers = Vec::new();
        // Until the agent closes, or answers with its handshake (and keeps the connection).
        while let Ok(frame) = read_frame(&mut b).await {
            let answer = decode(&frame).unwrap();
            let noise = matches!(answer, Message::Noise { .. });
            answers.push(answer);
            if noise {
                break;
            }
        }
        let result = agent.await.unwrap();
        assert_eq!(result.is_ok(), agent_secret.psk() == collector_secret.psk());
        (terms, answers)
    }

    /// What an agent sends before the collector has proved itself is the same whatever its
    /// secret: nothing derived from it. A collector without the secret gets a plain refusal and
    /// no Noise message; with the secret, the agent's Noise answer.
    #[tokio::test]
    async fn the_agent_gives_away_nothing_before_the_collector_has_proved_itself() {
        let (s, t) = (Secret::new("s".repeat(32)), Secret::new("t".repeat(32)));
        let (terms_s, answers) = agent_answers(&s, &t).await;
        assert_eq!(decode(&terms_s).unwrap(), Message::Terms { version: PROTOCOL_VERSION, secret_required: true });
        assert_eq!(answers, [Message::Refused { reason: AUTH_FAILED.to_string() }]);
        let (terms_t, answers) = agent_answers(&t, &s).await;
        assert_eq!(terms_s, terms_t, "the agent's terms do not depend on its secret");
        assert_eq!(answers, [Message::Refused { reason: AUTH_FAILED.to_string() }]);
        let (_, answers) = agent_answers(&s, &s).await;
        assert!(matches!(&answers[..], [Message::Noise { .. }]), "{answers:?}");
    }

    /// An agent (or whoever answers at its address) without the secret cannot make the answer
    /// that the collector opens: the collector refuses to go on.
    #[tokio::test]
    async fn a_fake_agent_without_the_secret_is_not_trusted() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let mut a: Box<dyn Transport> = Box::new(a);
        let collector =
            tokio::spawn(async move { client(Box::new(b), Some(&Secret::new("s".repeat(32))), true).await });
        let hello = read_frame(&mut a).await.unwrap();
        let terms = encode_body(&Message::Terms { version: PROTOCOL_VERSION, secret_required: true }).unwrap();
        send_plain(&mut a, &terms).await.unwrap();
        let first = read_frame(&mut a).await.unwrap();
        assert!(matches!(decode(&first).unwrap(), Message::Noise { .. }));
        // The best it can do: a handshake of its own, with its guess at the secret.
        let guess = Secret::new("t".repeat(32));
        let prologue = noise::prologue(&hello, &terms);
        let mut own = Handshake::initiator(Some(&guess), &prologue);
        let mut agent = Handshake::responder(Some(&guess), &prologue);
        agent.read(&own.write(&[]).unwrap()).unwrap();
        let welcome = encode_body(&Message::Welcome { host: "h".into() }).unwrap();
        send_noise(&mut a, agent.write(&welcome).unwrap()).await.unwrap();
        assert!(matches!(collector.await.unwrap(), Err(HandshakeError::AgentNotAuthenticated)));
    }

    /// A relay that changes the plain frames (here the agent's terms, on the way to a collector
    /// that has the secret) breaks the handshake: the prologue binds them.
    #[tokio::test]
    async fn the_plain_frames_are_bound_into_the_handshake() {
        let s = Secret::new("s".repeat(32));
        let hello = encode_body(&Message::Hello { version: PROTOCOL_VERSION, padding: [0; 32] }).unwrap();
        let terms = encode_body(&Message::Terms { version: PROTOCOL_VERSION, secret_required: true }).unwrap();
        let changed = encode_body(&Message::Hello { version: PROTOCOL_VERSION, padding: [1; 32] }).unwrap();
        let mut collector = Handshake::initiator(Some(&s), &noise::prologue(&changed, &terms));
        let mut agent = Handshake::responder(Some(&s), &noise::prologue(&hello, &terms));
        let first = collector.write(&[]).unwrap();
        assert!(matches!(agent.read(&first), Err(snow::Error::Decrypt)));
    }

    #[tokio::test]
    async fn another_version_is_refused_in_words() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let mut b: Box<dyn Transport> = Box::new(b);
        let agent = tokio::spawn(async move { server(Box::new(a), None, "h").await });
        let hello = encode_body(&Message::Hello { version: PROTOCOL_VERSION - 1, padding: [7; 32] }).unwrap();
        send_plain(&mut b, &hello).await.unwrap();
        let refusal = decode(&read_frame(&mut b).await.unwrap()).unwrap();
        let reason = format!("protocol version {} is not {PROTOCOL_VERSION}", PROTOCOL_VERSION - 1);
        assert_eq!(refusal, Message::Refused { reason });
        assert!(matches!(agent.await.unwrap(), Err(HandshakeError::Version { .. })));
    }
}
