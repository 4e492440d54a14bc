//! The Noise protocol under every connection (the `snow` crate): the handshake's parameters,
//! and frames carried as Noise transport messages.
//!
//! With a secret the handshake is `Noise_NNpsk0_25519_ChaChaPoly_SHA256`, with a pre-shared key
//! made from the secret ([`Secret::psk`]); without one (a Unix socket, whose peers the kernel vouches
//! for) it is `Noise_NN_25519_ChaChaPoly_SHA256`. Either way both sides' fresh ephemeral keys
//! make the session's keys (forward secrecy: a secret stolen later opens no recorded
//! connection), and the prologue binds the protocol version and the plain frames exchanged
//! before the handshake ([`prologue`]).
//!
//! After the handshake a frame (a postcard-encoded [`Message`], at most [`MAX_FRAME`] bytes) is
//! sent as Noise transport messages, each at most 65,535 bytes on the wire
//! ([`MAXMSGLEN`]) and each preceded by its length as a little-endian `u16`:
//!
//! ```text
//! plaintext of a frame:  body length (u32 LE) ‖ body, cut into pieces of CHUNK bytes (the last shorter)
//! on the wire, per piece: length (u16 LE) ‖ ChaChaPoly(key of the direction, nonce, piece) ‖ tag (16 bytes)
//! ```
//!
//! Why that is sound:
//! - Each piece is encrypted and authenticated under its direction's key with a nonce that both
//!   ends count (one per Noise message, never sent): a piece injected, modified, replayed,
//!   reordered or dropped fails to decrypt at the next read, and the connection closes.
//! - The frame's length is inside its first piece, so it is authenticated; the number and sizes
//!   of the pieces that follow are a function of it, so a relay can neither split, merge nor
//!   truncate frames, only end the connection (a truncated frame is an error, never a shorter
//!   message).
//! - The only bytes outside the encryption are the `u16` lengths: they bound a read to 65,535
//!   bytes before any check, a changed first one moves the piece's end (its tag then fails), and
//!   a later one that is not the size the frame's length implies is refused as forged.
//! - The length is checked against [`MAX_FRAME`] before the body is allocated.

use std::sync::Arc;

use snow::{HandshakeState, StatelessTransportState};
use tokio::io::{AsyncRead, AsyncReadExt as _};

use super::{
    auth::Secret,
    protocol::{FrameError, MAX_FRAME, MAX_HANDSHAKE_FRAME, Message, PROTOCOL_VERSION},
};

/// The handshake when the agent requires the secret: the collector's first message is already
/// encrypted under a key mixed from the secret, so the agent checks it before answering.
pub const WITH_SECRET: &str = "Noise_NNpsk0_25519_ChaChaPoly_SHA256";
/// The handshake on a Unix socket without a secret: encrypted and numbered frames all the same.
pub const WITHOUT_SECRET: &str = "Noise_NN_25519_ChaChaPoly_SHA256";

/// The most bytes a Noise message holds, tag included (the Noise specification's bound).
pub const MAXMSGLEN: usize = 65535;
/// The bytes of a ChaChaPoly tag.
pub const TAGLEN: usize = 16;
/// Plaintext bytes in one transport message: 65,535 less the tag.
pub const CHUNK: usize = MAXMSGLEN - TAGLEN;
/// The frame's body length at the head of its first piece.
const LENGTH: usize = 4;

/// What goes first into the handshake's hash: the protocol and its version, then the plain
/// frames of the exchange before it (the collector's hello, the agent's terms), so that a relay
/// that changes any of them makes the handshake fail.
pub fn prologue(hello: &[u8], terms: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(24 + hello.len() + terms.len());
    p.extend_from_slice(b"tracer protocol ");
    p.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    p.extend_from_slice(&(hello.len() as u32).to_le_bytes());
    p.extend_from_slice(hello);
    p.extend_from_slice(terms);
    p
}

/// One side of a handshake in progress.
pub struct Handshake(HandshakeState);

impl Handshake {
    /// The collector's side (it speaks first); with a secret, its pre-shared key is
    /// [`Secret::psk`].
    pub fn initiator(secret: Option<&Secret>, prologue: &[u8]) -> Handshake {
        Handshake::build(secret, prologue, true)
    }

    /// The agent's side.
    pub fn responder(secret: Option<&Secret>, prologue: &[u8]) -> Handshake {
        Handshake::build(secret, prologue, false)
    }

    fn build(secret: Option<&Secret>, prologue: &[u8], initiator: bool) -> Handshake {
        let psk = secret.map(Secret::psk);
        let pattern = if psk.is_some() { WITH_SECRET } else { WITHOUT_SECRET };
        let params = pattern.parse().expect("a pattern snow implements (tested)");
        let mut builder = snow::Builder::new(params).prologue(prologue).expect("one prologue");
        if let Some(psk) = &psk {
            builder = builder.psk(0, psk).expect("one key, in place 0");
        }
        let state = if initiator { builder.build_initiator() } else { builder.build_responder() };
        Handshake(state.expect("the parameters are complete (tested)"))
    }

    /// This side's next handshake message, carrying `payload`.
    pub fn write(&mut self, payload: &[u8]) -> Result<Vec<u8>, snow::Error> {
        // Room for the plain frame's encoding around it (a variant and a length).
        let mut message = vec![0u8; MAX_HANDSHAKE_FRAME - 8];
        let len = self.0.write_message(payload, &mut message)?;
        message.truncate(len);
        Ok(message)
    }

    /// Reads the peer's handshake message; its payload. `Err(snow::Error::Decrypt)`: it was not
    /// made with the same keys (another secret, or a changed prologue).
    pub fn read(&mut self, message: &[u8]) -> Result<Vec<u8>, snow::Error> {
        let mut payload = vec![0u8; message.len()];
        let len = self.0.read_message(message, &mut payload)?;
        payload.truncate(len);
        Ok(payload)
    }

    /// The transport, once both messages have passed: the two halves, and the handshake's hash
    /// (the same on both sides, unique to this connection).
    pub fn finish(self) -> Result<(Sealer, Opener, [u8; 32]), snow::Error> {
        let mut hash = [0u8; 32];
        hash.copy_from_slice(self.0.get_handshake_hash());
        let state = Arc::new(self.0.into_stateless_transport_mode()?);
        Ok((Sealer { state: state.clone(), nonce: 0 }, Opener::new(state), hash))
    }
}

/// Encrypts outgoing frames; counts this direction's nonces.
pub struct Sealer {
    state: Arc<StatelessTransportState>,
    nonce: u64,
}

impl Sealer {
    /// The next frame, as it goes on the wire.
    pub fn seal(&mut self, message: &Message) -> Result<Vec<u8>, FrameError> {
        let mut plain =
            postcard::to_extend(message, vec![0u8; LENGTH]).map_err(|e| FrameError::Malformed(e.to_string()))?;
        let len = plain.len() - LENGTH;
        if len > MAX_FRAME {
            return Err(FrameError::TooLarge { len, limit: MAX_FRAME });
        }
        plain[..LENGTH].copy_from_slice(&(len as u32).to_le_bytes());
        let pieces = plain.len().div_ceil(CHUNK);
        let mut wire = vec![0u8; plain.len() + pieces * (2 + TAGLEN)];
        let mut at = 0;
        for piece in plain.chunks(CHUNK) {
            let n = piece.len() + TAGLEN;
            wire[at..at + 2].copy_from_slice(&(n as u16).to_le_bytes());
            self.state
                .write_message(self.nonce, piece, &mut wire[at + 2..at + 2 + n])
                .map_err(|_| FrameError::Exhausted)?;
            self.nonce += 1;
            at += 2 + n;
        }
        Ok(wire)
    }
}

/// Decrypts incoming frames; counts this direction's nonces and frames.
pub struct Opener {
    state: Arc<StatelessTransportState>,
    nonce: u64,
    /// Frames opened so far: the number of the next, as errors name it.
    frames: u64,
    /// One transport message as read, and the first piece of a frame decrypted.
    sealed: Box<[u8]>,
    head: Box<[u8]>,
}

impl Opener {
    fn new(state: Arc<StatelessTransportState>) -> Opener {
        Opener {
            state,
            nonce: 0,
            frames: 0,
            sealed: vec![0u8; MAXMSGLEN].into_boxed_slice(),
            head: vec![0u8; MAXMSGLEN].into_boxed_slice(),
        }
    }

    /// Reads, checks and decrypts the next frame; its body.
    pub async fn read<R: AsyncRead + Unpin>(&mut self, r: &mut R) -> Result<Vec<u8>, FrameError> {
        let forged = FrameError::Forged { seq: self.frames };
        // The end of the stream between frames is the peer closing; anywhere else, a truncation.
        let mut length = [0u8; 2];
        if r.read(&mut length[..1]).await? == 0 {
            return Err(FrameError::Closed);
        }
        read_exact(r, &mut length[1..]).await?;
        let n = u16::from_le_bytes(length) as usize;
        read_exact(r, &mut self.sealed[..n]).await?;
        let got = self.state.read_message(self.nonce, &self.sealed[..n], &mut self.head).map_err(|_| forged)?;
        self.nonce += 1;
        let Some(length) = self.head[..got].first_chunk::<LENGTH>() else {
            return Err(FrameError::Malformed(format!("a frame's first piece of {got} bytes holds no length")));
        };
        let len = u32::from_le_bytes(*length) as usize;
        if len > MAX_FRAME {
            return Err(FrameError::TooLarge { len, limit: MAX_FRAME });
        }
        if got != (LENGTH + len).min(CHUNK) {
            return Err(FrameError::Malformed(format!("a frame of {len} bytes begins with a piece of {got}")));
        }
        // Room for the tag of the last piece, decrypted in place (dropped below).
        let mut body = Vec::with_capacity(len + TAGLEN);
        body.extend_from_slice(&self.head[LENGTH..got]);
        while body.len() < len {
            let at = body.len();
            let piece = (len - at).min(CHUNK);
            if read_length(r).await? != piece + TAGLEN {
                return Err(FrameError::Forged { seq: self.frames });
            }
            read_exact(r, &mut self.sealed[..piece + TAGLEN]).await?;
            body.resize(at + piece + TAGLEN, 0);
            self.state
                .read_message(self.nonce, &self.sealed[..piece + TAGLEN], &mut body[at..])
                .map_err(|_| FrameError::Forged { seq: self.frames })?;
            self.nonce += 1;
            body.truncate(at + piece);
        }
        self.frames += 1;
        Ok(body)
    }
}

/// A transport message's length (after the first of a frame); [`FrameError::Truncated`] if the
/// stream ends first.
async fn read_length<R: AsyncRead + Unpin>(r: &mut R) -> Result<usize, FrameError> {
    let mut len = [0u8; 2];
    read_exact(r, &mut len).await?;
    Ok(u16::from_le_bytes(len) as usize)
}

async fn read_exact<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8]) -> Result<(), FrameError> {
    r.read_exact(buf).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => FrameError::Truncated,
        _ => e.into(),
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::protocol::decode;

    /// Both ends of a finished handshake, without a connection: the collector's sealer and the
    /// agent's opener, then the agent's sealer and the collector's opener.
    fn transports(secret: Option<&Secret>) -> (Sealer, Opener, Sealer, Opener) {
        let mut collector = Handshake::initiator(secret, b"prologue");
        let mut agent = Handshake::responder(secret, b"prologue");
        assert_eq!(agent.read(&collector.write(&[]).unwrap()).unwrap(), b"");
        assert_eq!(collector.read(&agent.write(b"welcome").unwrap()).unwrap(), b"welcome");
        let (to_agent, collector_opens, collector_hash) = collector.finish().unwrap();
        let (to_collector, agent_opens, agent_hash) = agent.finish().unwrap();
        assert_eq!(collector_hash, agent_hash);
        (to_agent, agent_opens, to_collector, collector_opens)
    }

    fn secret() -> Secret {
        Secret::new("0123456789abcdefghijklmnopqrstuv")
    }

    async fn open(opener: &mut Opener, wire: &[u8]) -> Result<Message, FrameError> {
        let mut r = wire;
        let message = decode(&opener.read(&mut r).await?)?;
        assert!(r.is_empty(), "{} bytes left after the frame", r.len());
        Ok(message)
    }

    fn probes() -> Vec<Message> {
        (0..3).map(|id| Message::ClockProbe { id }).collect()
    }

    /// A frame of three Noise messages, the last a short one.
    fn long() -> Message {
        Message::Refused { reason: "r".repeat(2 * CHUNK + 100) }
    }

    /// Where each Noise message of a sealed frame starts, and its length on the wire (the `u16`
    /// included).
    fn pieces(wire: &[u8]) -> Vec<(usize, usize)> {
        let mut at = 0;
        let mut pieces = Vec::new();
        while at < wire.len() {
            let n = 2 + u16::from_le_bytes([wire[at], wire[at + 1]]) as usize;
            pieces.push((at, n));
            at += n;
        }
        pieces
    }

    #[tokio::test]
    async fn frames_of_every_size_open_in_order_both_ways() {
        for secret in [Some(secret()), None] {
            let (mut to_agent, mut agent, mut to_collector, mut collector) = transports(secret.as_ref());
            // A `Refused` with a reason of n bytes (16,384 or more) is a frame of n + 8 bytes
            // (length, variant, the reason's length, the reason): frames that end just before, on
            // and just after each boundary between pieces.
            let mut sizes: Vec<usize> = vec![0, 1, 100];
            for k in 1..=2 {
                sizes.extend((k * CHUNK - LENGTH - 8)..(k * CHUNK - LENGTH + 8));
            }
            for n in sizes {
                let m = Message::Refused { reason: "x".repeat(n) };
                assert_eq!(open(&mut agent, &to_agent.seal(&m).unwrap()).await.unwrap(), m, "{n}");
                assert_eq!(open(&mut collector, &to_collector.seal(&m).unwrap()).await.unwrap(), m, "{n}");
            }
            let wire = to_agent.seal(&long()).unwrap();
            assert_eq!(pieces(&wire).len(), 3);
            assert_eq!(open(&mut agent, &wire).await.unwrap(), long());
        }
    }

    /// Without a secret too (`Noise_NN`, the Unix socket): a word repeated ten thousand times
    /// in a frame shows nowhere on the wire.
    #[tokio::test]
    async fn the_wire_shows_nothing_of_a_frame() {
        let (mut to_agent, ..) = transports(None);
        let word = b"a-distinctive-word";
        let m = Message::Refused { reason: String::from_utf8(word.repeat(10_000)).unwrap() };
        let wire = to_agent.seal(&m).unwrap();
        assert!(!wire.windows(word.len()).any(|w| w == word));
        assert!(!wire.windows(8).any(|w| w == b"-word-a-"));
    }

    #[tokio::test]
    async fn a_changed_byte_anywhere_in_a_frame_is_refused() {
        let (mut to_agent, ..) = transports(Some(&secret()));
        let wire = to_agent.seal(&long()).unwrap();
        let [(_, first), (second, _), (third, _)] = pieces(&wire)[..] else { panic!() };
        // Each piece's length, its start, its middle and its tag.
        let mut at = vec![0, 1, 2, 40, first - 1, second, second + 1, second + 2, second + 900, third - 1, third];
        at.extend([third + 2, third + 50, wire.len() - 1]);
        for i in at {
            let (mut to_agent, mut agent, ..) = transports(Some(&secret()));
            let mut changed = to_agent.seal(&long()).unwrap();
            changed[i] ^= 0x20;
            let err = open(&mut agent, &changed).await.unwrap_err();
            assert!(matches!(err, FrameError::Forged { seq: 0 } | FrameError::Truncated), "byte {i}: {err}");
        }
    }

    #[tokio::test]
    async fn replayed_reordered_or_dropped_frames_and_pieces_are_refused() {
        let (mut to_agent, mut agent, ..) = transports(Some(&secret()));
        let fs: Vec<Vec<u8>> = probes().iter().map(|m| to_agent.seal(m).unwrap()).collect();
        open(&mut agent, &fs[0]).await.unwrap();
        let err = open(&mut agent, &fs[0]).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "frame 1 failed authentication (forged, modified, replayed or out of order): closing the connection"
        );
        let (mut to_agent, mut agent, ..) = transports(Some(&secret()));
        let fs: Vec<Vec<u8>> = probes().iter().map(|m| to_agent.seal(m).unwrap()).collect();
        open(&mut agent, &fs[0]).await.unwrap();
        assert!(matches!(open(&mut agent, &fs[2]).await, Err(FrameError::Forged { seq: 1 })), "frame 1 was dropped");
        let (mut to_agent, mut agent, ..) = transports(Some(&secret()));
        let fs: Vec<Vec<u8>> = probes().iter().map(|m| to_agent.seal(m).unwrap()).collect();
        assert!(matches!(open(&mut agent, &fs[1]).await, Err(FrameError::Forged { seq: 0 })), "frame 1 first");

        // Within a frame of three pieces: the second twice, the second and third swapped, the
        // second left out, the last twice.
        for order in [[0, 1, 1, 2].as_slice(), &[0, 2, 1], &[0, 2], &[0, 1, 2, 2]] {
            let (mut to_agent, mut agent, ..) = transports(Some(&secret()));
            let wire = to_agent.seal(&long()).unwrap();
            let p = pieces(&wire);
            let piece = |i: usize| &wire[p[i].0..p[i].0 + p[i].1];
            let spliced: Vec<u8> = order.iter().flat_map(|&i| piece(i).to_vec()).collect();
            let mut r = &spliced[..];
            if order == [0, 1, 2, 2] {
                // The frame itself is whole; the extra piece comes as the next frame, out of turn.
                assert_eq!(decode(&agent.read(&mut r).await.unwrap()).unwrap(), long());
                assert!(matches!(agent.read(&mut r).await, Err(FrameError::Forged { seq: 1 })));
            } else {
                let result = agent.read(&mut r).await;
                assert!(matches!(result, Err(FrameError::Forged { seq: 0 })), "{order:?}: {result:?}");
            }
        }
    }

    #[tokio::test]
    async fn a_truncated_frame_is_an_error_never_a_shorter_message() {
        let p = pieces(&transports(None).0.seal(&long()).unwrap());
        for cut in [1, 2, 30, p[1].0, p[1].0 + 1, p[1].0 + 2, p[2].0, p[2].0 + 50] {
            let (mut to_agent, mut agent, ..) = transports(Some(&secret()));
            let wire = to_agent.seal(&long()).unwrap();
            let result = agent.read(&mut &wire[..cut]).await;
            assert!(matches!(result, Err(FrameError::Truncated)), "cut at {cut}: {result:?}");
        }
        let (_, mut agent, ..) = transports(Some(&secret()));
        assert!(matches!(agent.read(&mut &[][..]).await, Err(FrameError::Closed)));
    }

    #[tokio::test]
    async fn frames_of_the_other_direction_another_session_or_in_the_clear_are_refused() {
        let (mut to_agent, mut agent, _, mut collector) = transports(Some(&secret()));
        let frame = to_agent.seal(&Message::Stop { trace_id: 1 }).unwrap();
        assert!(matches!(open(&mut collector, &frame).await, Err(FrameError::Forged { seq: 0 })), "reflected");
        let (_, mut other, ..) = transports(Some(&secret()));
        assert!(matches!(open(&mut other, &frame).await, Err(FrameError::Forged { seq: 0 })), "another session");
        // The layout of a frame, without the encryption: a guess at the tag.
        let body = crate::cluster::protocol::encode_body(&Message::Stop { trace_id: 1 }).unwrap();
        let mut piece = (body.len() as u32).to_le_bytes().to_vec();
        piece.extend(&body);
        piece.extend([0x5a; TAGLEN]);
        let mut clear = (piece.len() as u16).to_le_bytes().to_vec();
        clear.extend(piece);
        assert!(matches!(open(&mut agent, &clear).await, Err(FrameError::Forged { seq: 0 })), "in the clear");
        assert_eq!(open(&mut agent, &frame).await.unwrap(), Message::Stop { trace_id: 1 });
    }

    #[tokio::test]
    async fn a_wrong_key_fails_the_handshake_at_the_collectors_first_message() {
        let mut collector = Handshake::initiator(Some(&secret()), b"prologue");
        let mut agent = Handshake::responder(Some(&Secret::new("another secret, 32 bytes or more")), b"prologue");
        assert!(matches!(agent.read(&collector.write(&[]).unwrap()), Err(snow::Error::Decrypt)));
        // Nor does a collector without the key pass an agent that has one.
        let mut collector = Handshake::initiator(None, b"prologue");
        let mut agent = Handshake::responder(Some(&secret()), b"prologue");
        assert!(agent.read(&collector.write(&[]).unwrap()).is_err());
    }

    /// Lengths are checked before the body is allocated, and against what the first piece holds,
    /// even from an authenticated peer.
    #[tokio::test]
    async fn lengths_beyond_the_bound_or_the_first_piece_are_refused() {
        let (mut to_agent, ..) = transports(None);
        let err = to_agent.seal(&Message::Refused { reason: "x".repeat(MAX_FRAME) }).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { .. }), "{err}");
        for (claim, holds, expected) in [
            (MAX_FRAME as u32 + 1, 10, "frame of 8388609 bytes is larger than the limit (8388608)"),
            (u32::MAX, 10, "frame of 4294967295 bytes is larger than the limit (8388608)"),
            (20, 10, "malformed frame: a frame of 20 bytes begins with a piece of 14"),
        ] {
            let (to_agent, mut agent, ..) = transports(None);
            let mut plain = claim.to_le_bytes().to_vec();
            plain.resize(LENGTH + holds, 0);
            let mut wire = vec![0u8; 2 + plain.len() + TAGLEN];
            wire[..2].copy_from_slice(&((plain.len() + TAGLEN) as u16).to_le_bytes());
            to_agent.state.write_message(0, &plain, &mut wire[2..]).unwrap();
            assert_eq!(agent.read(&mut &wire[..]).await.unwrap_err().to_string(), expected);
        }
    }
}
