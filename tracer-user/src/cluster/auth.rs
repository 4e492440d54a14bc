//! Secrets, and the keys a connection derives from one.
//!
//! A secret lives in a regular file that root (or the user reading it) owns and only its owner can
//! read, at least [`MIN_SECRET_BYTES`] and at most [`MAX_SECRET_FILE_BYTES`] long, with no
//! obvious pattern ([`Secret::from_file`] refuses anything else, one sentence each);
//! [`Secret::generate`] writes a good one. It
//! never crosses the wire: it becomes the pre-shared key of the Noise handshake ([`Secret::psk`],
//! [`super::noise`]), and, with the hash of a connection's handshake, the key that later proves,
//! on a reconnection, that it is the same collector coming back ([`resume_key`],
//! [`resume_proof`]). Without a secret (a Unix socket whose peers the kernel vouches for) the
//! handshake has no pre-shared key: frames are still encrypted and numbered, but only the
//! socket's permissions keep others out.

use std::{
    io::{Read as _, Write as _},
    os::unix::fs::{FileTypeExt as _, MetadataExt as _, OpenOptionsExt as _},
    path::Path,
};

use hmac::{Hmac, Mac as _};
use sha2::Sha256;

/// A secret shorter than this is refused: 32 bytes of a generated secret are 128 bits of hex.
pub const MIN_SECRET_BYTES: usize = 32;

/// A secret file longer than this is refused unread: a secret is one line, and reading whatever
/// the file holds would let a 1 GiB file take the memory of two.
pub const MAX_SECRET_FILE_BYTES: usize = 4096;
/// A secret with fewer distinct byte values than this is refused (32 zero bytes, `abababab...`).
/// Not more: `--gen-secret` writes hex, 16 symbols, and a quarter of its 64-digit secrets miss
/// one of them; fewer than 8 distinct digits in 32 random hex digits is a one-in-millions draw.
pub const MIN_DISTINCT_BYTES: usize = 8;

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
    #[error("the secret file {path} is a symbolic link: give the path of the file itself")]
    Symlink { path: String },
    #[error("the secret file {path} is {kind}, not a regular file")]
    NotRegular { path: String, kind: &'static str },
    #[error(
        "the secret file {path} belongs to uid {owner}, neither root nor you (uid {me}): its owner could change the secret, so make it yours with chown"
    )]
    Owner { path: String, owner: u32, me: u32 },
    #[error(
        "the secret file {path} can be read by other users (mode {mode:03o}): make it private with chmod 600 {path}"
    )]
    Readable { path: String, mode: u32 },
    #[error(
        "the secret file {path} holds more than {MAX_SECRET_FILE_BYTES} bytes: a secret is one line, such as tracer agent --gen-secret FILE writes"
    )]
    TooLong { path: String },
    #[error(
        "the secret file {path} holds {len} bytes, fewer than {MIN_SECRET_BYTES}: make a good one with tracer agent --gen-secret FILE"
    )]
    TooShort { path: String, len: usize },
    #[error(
        "the secret file {path} holds only {distinct} distinct byte values, fewer than {MIN_DISTINCT_BYTES}: make a good one with tracer agent --gen-secret FILE"
    )]
    FewValues { path: String, distinct: usize },
    #[error(
        "the secret file {path} repeats the same {period} bytes over and over: make a good one with tracer agent --gen-secret FILE"
    )]
    Repeats { path: String, period: usize },
    #[error("cannot write the secret file {path}")]
    Write { path: String, source: std::io::Error },
}

impl Secret {
    /// A secret from bytes (the library's callers check their own; files are checked in
    /// [`Secret::from_file`]).
    pub fn new(bytes: impl Into<Vec<u8>>) -> Secret {
        Secret(bytes.into())
    }

    /// Reads a secret file: refused unless it is a regular file owned by root or by this process's
    /// user, private to its owner, of a sane length and without an obvious pattern.
    pub fn from_file(path: &Path) -> Result<Secret, SecretError> {
        let name = || path.display().to_string();
        let read = |source| SecretError::Read { path: name(), source };
        // O_NOFOLLOW: the checks below are of the file itself, not of a link someone else may
        // repoint. O_NONBLOCK: opening a FIFO would otherwise wait for a writer, forever.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => SecretError::Symlink { path: name() },
                _ => read(e),
            })?;
        let meta = file.metadata().map_err(read)?;
        if let Some(kind) = not_regular(meta.file_type()) {
            return Err(SecretError::NotRegular { path: name(), kind });
        }
        let me = nix::unistd::geteuid().as_raw();
        if meta.uid() != 0 && meta.uid() != me {
            return Err(SecretError::Owner { path: name(), owner: meta.uid(), me });
        }
        let mode = meta.mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(SecretError::Readable { path: name(), mode });
        }
        let mut bytes = Vec::new();
        file.take(MAX_SECRET_FILE_BYTES as u64 + 1).read_to_end(&mut bytes).map_err(read)?;
        if bytes.len() > MAX_SECRET_FILE_BYTES {
            return Err(SecretError::TooLong { path: name() });
        }
        let secret = bytes.trim_ascii_end();
        check_strength(secret).map_err(|weak| match weak {
            Weak::Short(len) => SecretError::TooShort { path: name(), len },
            Weak::FewValues(distinct) => SecretError::FewValues { path: name(), distinct },
            Weak::Repeats(period) => SecretError::Repeats { path: name(), period },
        })?;
        Ok(Secret(secret.to_vec()))
    }

    /// The Noise pre-shared key: HKDF-SHA256 of the secret (of any length) to 32 bytes.
    pub fn psk(&self) -> Key {
        let mut psk = [0u8; 32];
        hkdf::Hkdf::<Sha256>::new(None, &self.0).expand(PSK, &mut psk).expect("32 bytes is a valid HKDF-SHA256 length");
        psk
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

/// What is wrong with a weak secret.
#[derive(Debug, PartialEq, Eq)]
enum Weak {
    /// Its length, below [`MIN_SECRET_BYTES`].
    Short(usize),
    /// Its number of distinct byte values, below [`MIN_DISTINCT_BYTES`].
    FewValues(usize),
    /// The length of the pattern it repeats (at most half its own).
    Repeats(usize),
}

/// Refuses what a person might type instead of a secret: too short, too few distinct values, or
/// one pattern repeated (`0123456789abcdef` twice has 16 values, and only 16 bytes of secret).
fn check_strength(secret: &[u8]) -> Result<(), Weak> {
    if secret.len() < MIN_SECRET_BYTES {
        return Err(Weak::Short(secret.len()));
    }
    let mut seen = [false; 256];
    for &b in secret {
        seen[b as usize] = true;
    }
    let distinct = seen.iter().filter(|&&s| s).count();
    if distinct < MIN_DISTINCT_BYTES {
        return Err(Weak::FewValues(distinct));
    }
    // The shortest period: the secret is its first `period` bytes over and over (the last copy
    // may be cut short).
    if let Some(period) = (1..=secret.len() / 2).find(|&p| secret[p..].iter().zip(secret).all(|(a, b)| a == b)) {
        return Err(Weak::Repeats(period));
    }
    Ok(())
}

/// What a file that is not a regular one is, said as a sentence names it.
fn not_regular(t: std::fs::FileType) -> Option<&'static str> {
    if t.is_file() {
        None
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_socket() {
        Some("a socket")
    } else if t.is_char_device() || t.is_block_device() {
        Some("a device")
    } else {
        Some("of an unknown kind")
    }
}

/// What each key made from the secret is for, so that no two uses share a key.
const PSK: &[u8] = b"tracer noise psk";
const RESUME: &[u8] = b"tracer resume";

/// Proves on a later connection that a trace started on this one is being resumed by the same
/// collector: HKDF-SHA256 of the secret (none: empty) salted with the hash of this connection's
/// Noise handshake (the same on both sides, unique to the connection, and never sent).
pub fn resume_key(secret: Option<&Secret>, handshake_hash: &[u8; 32]) -> Key {
    let ikm = secret.map_or(&[][..], |s| &s.0[..]);
    let mut key = [0u8; 32];
    hkdf::Hkdf::<Sha256>::new(Some(handshake_hash), ikm)
        .expand(RESUME, &mut key)
        .expect("32 bytes is a valid HKDF-SHA256 length");
    key
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

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn temp(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("tracer-secret-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn keys_differ_by_secret_handshake_and_use() {
        let s = Secret::new("a".repeat(32));
        let k = resume_key(Some(&s), &[1; 32]);
        assert_eq!(resume_key(Some(&s), &[1; 32]), k, "both ends derive the same key");
        assert_ne!(resume_key(Some(&s), &[2; 32]), k);
        assert_ne!(resume_key(Some(&Secret::new("b".repeat(32))), &[1; 32]), k);
        assert_ne!(resume_key(None, &[1; 32]), k);
        assert_ne!(s.psk(), Secret::new("b".repeat(32)).psk());
        assert_ne!(s.psk(), k);
        // A secret longer than the key makes one of 32 bytes all the same, of all its bytes.
        let long = Secret::new([&b"x".repeat(4000)[..], b"y"].concat());
        assert_ne!(long.psk(), Secret::new([&b"x".repeat(4000)[..], b"z"].concat()).psk());
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
        std::fs::write(&f, GOOD).unwrap();
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

    /// `name` in `dir`, holding `bytes`, mode 0600.
    fn private(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let f = dir.join(name);
        std::fs::write(&f, bytes).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        f
    }

    fn refusal(path: &Path) -> String {
        Secret::from_file(path).unwrap_err().to_string()
    }

    /// 32 bytes, 31 distinct values, no period: a good enough secret.
    const GOOD: &[u8] = b"0123456789abcdefghijklmnopqrstuu\n";

    /// Whoever owns the file can change the secret, so holds the keys to every agent that reads
    /// it (root's commands included). Unit tests run as root, as the agent does.
    #[test]
    fn a_secret_file_of_another_user_is_refused() {
        let dir = temp("owner");
        let f = private(&dir, "s", GOOD);
        Secret::from_file(&f).unwrap();
        std::os::unix::fs::chown(&f, Some(65534), Some(65534)).unwrap();
        assert_eq!(
            refusal(&f),
            format!(
                "the secret file {} belongs to uid 65534, neither root nor you (uid 0): its owner could change the secret, so make it yours with chown",
                f.display()
            )
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A FIFO would block the open (and then the read) until someone writes: refused at once.
    #[test]
    fn a_fifo_a_directory_or_a_symlink_is_refused_without_waiting() {
        let dir = temp("kinds");
        let fifo = dir.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let started = std::time::Instant::now();
        assert_eq!(refusal(&fifo), format!("the secret file {} is a FIFO, not a regular file", fifo.display()));
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        let sub = dir.join("d");
        std::fs::create_dir(&sub).unwrap();
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(refusal(&sub), format!("the secret file {} is a directory, not a regular file", sub.display()));
        let good = private(&dir, "good", GOOD);
        let link = dir.join("link");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        assert_eq!(
            refusal(&link),
            format!("the secret file {} is a symbolic link: give the path of the file itself", link.display())
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_secret_file_over_4_kib_is_refused_unread() {
        let dir = temp("long");
        let mut bytes: Vec<u8> = (0..=255u8).cycle().take(MAX_SECRET_FILE_BYTES).collect();
        // Exactly 4096 bytes pass (the 256-byte cycle is broken by its last byte).
        *bytes.last_mut().unwrap() = b'!';
        let f = private(&dir, "s", &bytes);
        assert_eq!(Secret::from_file(&f).unwrap().0.len(), MAX_SECRET_FILE_BYTES);
        bytes.push(b'x');
        let f = private(&dir, "s", &bytes);
        let tail = format!(
            "the secret file {} holds more than 4096 bytes: a secret is one line, such as tracer agent --gen-secret FILE writes",
            f.display()
        );
        assert_eq!(refusal(&f), tail);
        // A sparse 1 GiB file: refused after reading 4097 bytes of it.
        let huge = std::fs::File::create(&f).unwrap();
        huge.set_len(1 << 30).unwrap();
        assert_eq!(refusal(&f), tail);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn secrets_without_enough_distinct_bytes_or_with_a_repeated_pattern_are_refused() {
        let dir = temp("weak");
        let cases: [(&[u8], &str); 4] = [
            (&[0; 32], "holds only 1 distinct byte values, fewer than 8"),
            (b"abcdefgabcdefgabcdefgabcdefgabcdefg\n", "holds only 7 distinct byte values, fewer than 8"),
            (b"0123456789abcdef0123456789abcdef\n", "repeats the same 16 bytes over and over"),
            (b"0123456789abcdef0123456789abcdef01234567\n", "repeats the same 16 bytes over and over"),
        ];
        for (bytes, why) in cases {
            let f = private(&dir, "s", bytes);
            assert_eq!(
                refusal(&f),
                format!("the secret file {} {why}: make a good one with tracer agent --gen-secret FILE", f.display())
            );
        }
        // Binary secrets are fine; only trailing whitespace is trimmed.
        let f = private(&dir, "s", &(0..40u8).rev().collect::<Vec<_>>());
        assert_eq!(Secret::from_file(&f).unwrap().0, (0..40u8).rev().collect::<Vec<_>>());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Random hex passes, even 32 digits of it (half of what `--gen-secret` writes): the
    /// distinct-value bound is set for hex.
    #[test]
    fn generated_secrets_always_pass_the_strength_checks() {
        for _ in 0..2000 {
            let mut bytes = [0u8; 16];
            getrandom::fill(&mut bytes).unwrap();
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(check_strength(hex.as_bytes()), Ok(()), "{hex}");
        }
    }
}
