//! Secrets, and the keys a connection derives from one.
//!
//! A secret lives in a file only its owner can read ([`Secret::from_file`] refuses anything
//! else) and is at least [`MIN_SECRET_BYTES`] long; [`Secret::generate`] writes a good one. It
//! never crosses the wire: each connection derives, with HKDF-SHA256 over the secret and a hash
//! of the handshake (both sides' fresh nonces), one key per direction for the frame MACs and one
//! key that later proves, on a reconnection, that it is the same collector coming back
//! ([`resume_proof`]). Without a secret (a Unix socket whose peers the kernel vouches for) the
//! keys come from the nonces alone: they still number and check every frame, but only the socket's
//! permissions keep others out.

use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _, os::unix::fs::PermissionsExt as _, path::Path};

use hmac::{Hmac, Mac as _};
use sha2::Sha256;

use super::protocol::Nonce;

/// A secret shorter than this is refused: 32 bytes of a generated secret are 128 bits of hex.
pub const MIN_SECRET_BYTES: usize = 32;

/// A 256-bit key.
pub type Key = [u8; 32];

/// A shared secret, read from a file (trailing whitespace ignored).
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cannot read the secret file {path}")]
    Read { path: String, source: std::io::Error },
    #[error(
        "the secret file {path} can be read by other users (mode {mode:03o}): make it private with chmod 600 {path}"
    )]
    Readable { path: String, mode: u32 },
    #[error(
        "the secret file {path} holds {len} bytes, fewer than {MIN_SECRET_BYTES}: make a good one with tracer agent --gen-secret FILE"
    )]
    TooShort { path: String, len: usize },
    #[error("cannot write the secret file {path}")]
    Write { path: String, source: std::io::Error },
}

impl Secret {
    /// A secret from bytes (the library's callers check their own; files are checked in
    /// [`Secret::from_file`]).
    pub fn new(bytes: impl Into<Vec<u8>>) -> Secret {
        Secret(bytes.into())
    }

    /// Reads a secret file: refused if group or others may read it, or if it is too short.
    pub fn from_file(path: &Path) -> Result<Secret, SecretError> {
        let name = || path.display().to_string();
        let read = |source| SecretError::Read { path: name(), source };
        let file = std::fs::File::open(path).map_err(read)?;
        let mode = file.metadata().map_err(read)?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(SecretError::Readable { path: name(), mode });
        }
        let text = std::io::read_to_string(file).map_err(read)?;
        let secret = text.trim_end();
        if secret.len() < MIN_SECRET_BYTES {
            return Err(SecretError::TooShort { path: name(), len: secret.len() });
        }
        Ok(Secret(secret.as_bytes().to_vec()))
    }

    /// Writes a new secret to `path`: 32 random bytes as 64 hex digits, mode 0600. Never
    /// overwrites a file that exists.
    pub fn generate(path: &Path) -> Result<(), SecretError> {
        let write = |source| SecretError::Write { path: path.display().to_string(), source };
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| write(std::io::Error::other(e.to_string())))?;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let mut file =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(write)?;
        // The mode given to open is filtered by the umask, which can only take bits away.
        file.write_all(format!("{hex}\n").as_bytes()).map_err(write)?;
        file.sync_all().map_err(write)
    }
}

/// Roles, bound into every key so that one direction's frames never pass for the other's.
const TO_AGENT: &[u8] = b"tracer v2 collector to agent";
const TO_COLLECTOR: &[u8] = b"tracer v2 agent to collector";
const RESUME: &[u8] = b"tracer v2 resume";

/// One connection's keys.
#[derive(Clone)]
pub struct SessionKeys {
    /// MACs of the frames the collector sends.
    pub to_agent: Key,
    /// MACs of the frames the agent sends.
    pub to_collector: Key,
    /// Proves on a later connection that a trace started on this one is being resumed by the
    /// same collector.
    pub resume: Key,
}

/// Derives a connection's keys from the secret (none: empty) and the hash of its handshake.
pub fn derive(secret: Option<&Secret>, transcript: &[u8; 32]) -> SessionKeys {
    let ikm = secret.map_or(&[][..], |s| &s.0[..]);
    let hkdf = hkdf::Hkdf::<Sha256>::new(Some(transcript), ikm);
    let key = |info: &[u8]| {
        let mut k = [0u8; 32];
        hkdf.expand(info, &mut k).expect("32 bytes is a valid HKDF-SHA256 length");
        k
    };
    SessionKeys { to_agent: key(TO_AGENT), to_collector: key(TO_COLLECTOR), resume: key(RESUME) }
}

/// The proof that resumes `trace_id` on the connection whose handshake hashed to `transcript`,
/// made with the resume key of the connection that started the trace.
pub fn resume_proof(resume_key: &Key, transcript: &[u8; 32], trace_id: u64) -> [u8; 32] {
    resume_mac(resume_key, transcript, trace_id).finalize().into_bytes().into()
}

/// Checks a resume proof in constant time.
pub fn verify_resume(resume_key: &Key, transcript: &[u8; 32], trace_id: u64, proof: &[u8; 32]) -> bool {
    resume_mac(resume_key, transcript, trace_id).verify_slice(proof).is_ok()
}

fn resume_mac(resume_key: &Key, transcript: &[u8; 32], trace_id: u64) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(resume_key).expect("HMAC takes keys of any length");
    mac.update(RESUME);
    mac.update(transcript);
    mac.update(&trace_id.to_le_bytes());
    mac
}

/// A fresh random nonce.
pub fn nonce() -> Nonce {
    let mut n = [0u8; 32];
    getrandom::fill(&mut n).expect("the kernel's random source");
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("tracer-secret-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn keys_differ_by_secret_transcript_and_direction() {
        let s = Secret::new("a".repeat(32));
        let k = derive(Some(&s), &[1; 32]);
        assert_ne!(k.to_agent, k.to_collector);
        assert_ne!(k.to_agent, k.resume);
        assert_eq!(derive(Some(&s), &[1; 32]).to_agent, k.to_agent, "both ends derive the same keys");
        assert_ne!(derive(Some(&s), &[2; 32]).to_agent, k.to_agent);
        assert_ne!(derive(Some(&Secret::new("b".repeat(32))), &[1; 32]).to_agent, k.to_agent);
        assert_ne!(derive(None, &[1; 32]).to_agent, k.to_agent);
    }

    #[test]
    fn resume_proofs_are_bound_to_the_key_the_connection_and_the_trace() {
        let (key, other) = ([7; 32], [8; 32]);
        let p = resume_proof(&key, &[1; 32], 9);
        assert!(verify_resume(&key, &[1; 32], 9, &p));
        assert!(!verify_resume(&other, &[1; 32], 9, &p), "another session's key");
        assert!(!verify_resume(&key, &[2; 32], 9, &p), "replayed on another connection");
        assert!(!verify_resume(&key, &[1; 32], 10, &p), "another trace");
    }

    #[test]
    fn generated_secrets_are_private_long_and_never_overwrite() {
        let dir = temp("gen");
        let f = dir.join("s");
        Secret::generate(&f).unwrap();
        let mode = std::fs::metadata(&f).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let text = std::fs::read_to_string(&f).unwrap();
        assert_eq!(text.trim_end().len(), 64);
        assert!(text.trim_end().bytes().all(|b| b.is_ascii_hexdigit()));
        Secret::from_file(&f).unwrap();
        let err = Secret::generate(&f).unwrap_err();
        assert_eq!(err.to_string(), format!("cannot write the secret file {}", f.display()));
        assert_eq!(std::fs::read_to_string(&f).unwrap(), text, "not overwritten");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn readable_or_short_secret_files_are_refused() {
        let dir = temp("bad");
        let f = dir.join("s");
        std::fs::write(&f, format!("{}\n", "x".repeat(40))).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(
            Secret::from_file(&f).unwrap_err().to_string(),
            format!(
                "the secret file {0} can be read by other users (mode 644): make it private with chmod 600 {0}",
                f.display()
            )
        );
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        Secret::from_file(&f).unwrap();
        std::fs::write(&f, "swordfish\n").unwrap();
        assert_eq!(
            Secret::from_file(&f).unwrap_err().to_string(),
            format!(
                "the secret file {} holds 9 bytes, fewer than 32: make a good one with tracer agent --gen-secret FILE",
                f.display()
            )
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
