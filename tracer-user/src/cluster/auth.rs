//! Mutual authentication by challenge-response over a shared secret: each side sends a fresh random
//! nonce and proves it knows the secret by answering the other's nonce with an HMAC-SHA256. The
//! secret never crosses the wire, and a recorded answer is useless for another connection.

use hmac::{Hmac, Mac as _};
use sha2::Sha256;

use super::protocol::{Nonce, Proof};

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
    #[error("cannot read the secret file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("the secret file {0} is empty")]
    Empty(String),
}

impl Secret {
    pub fn new(bytes: impl Into<Vec<u8>>) -> Secret {
        Secret(bytes.into())
    }

    pub fn from_file(path: &std::path::Path) -> Result<Secret, SecretError> {
        let text =
            std::fs::read(path).map_err(|source| SecretError::Read { path: path.display().to_string(), source })?;
        let end = text.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(0, |i| i + 1);
        if end == 0 {
            return Err(SecretError::Empty(path.display().to_string()));
        }
        Ok(Secret(text[..end].to_vec()))
    }

    /// The answer to `challenge`, by the side named `role` (so that an answer from one side can
    /// never be replayed as the other's).
    pub fn prove(&self, role: &[u8], challenge: &Nonce, own: &Nonce) -> Proof {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(role);
        mac.update(challenge);
        mac.update(own);
        mac.finalize().into_bytes().into()
    }

    /// Checks an answer in constant time.
    pub fn verify(&self, role: &[u8], challenge: &Nonce, own: &Nonce, proof: &Proof) -> bool {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(role);
        mac.update(challenge);
        mac.update(own);
        mac.verify_slice(proof).is_ok()
    }
}

/// Roles in the proofs.
pub const AGENT: &[u8] = b"tracer agent v1";
pub const COLLECTOR: &[u8] = b"tracer collector v1";

/// A fresh random nonce.
pub fn nonce() -> Nonce {
    let mut n = [0u8; 32];
    getrandom::fill(&mut n).expect("the kernel's random source");
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_check_out_only_with_the_same_secret_role_and_nonces() {
        let s = Secret::new("swordfish");
        let (a, b) = (nonce(), nonce());
        assert_ne!(a, b);
        let p = s.prove(AGENT, &a, &b);
        assert!(s.verify(AGENT, &a, &b, &p));
        assert!(!s.verify(COLLECTOR, &a, &b, &p), "an agent's answer is not a collector's");
        assert!(!s.verify(AGENT, &b, &a, &p));
        assert!(!Secret::new("sword").verify(AGENT, &a, &b, &p));
    }

    #[test]
    fn secrets_come_from_files() {
        let dir = std::env::temp_dir().join(format!("tracer-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("s");
        std::fs::write(&f, "swordfish\n").unwrap();
        let s = Secret::from_file(&f).unwrap();
        let (a, b) = ([1; 32], [2; 32]);
        assert!(Secret::new("swordfish").verify(AGENT, &a, &b, &s.prove(AGENT, &a, &b)));
        std::fs::write(&f, " \n").unwrap();
        assert_eq!(Secret::from_file(&f).unwrap_err().to_string(), format!("the secret file {} is empty", f.display()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
