//! What a host is in a trace: a name the user chose (checked here, once, for every way a name gets
//! in: `record --host-name`, `collect --agent NAME=ADDR`, [`crate::cluster::collector::Cluster`]),
//! and, as information beside it, the machine's own identity ([`Machine`]).
//!
//! Names go into every event, into file names of exports, process names of visual traces and
//! terminal lines, and they are split off `NAME:PID` and `NAME=ADDR` arguments: so they are short
//! and made of a few safe characters only.

use std::{io::Read as _, path::Path};

use serde::{Deserialize, Serialize};

/// The longest host name, in bytes (Linux's own limit for host names, `HOST_NAME_MAX`).
pub const MAX_NAME: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("a host name cannot be empty")]
    Empty,
    #[error("host name '{}…' is longer than {MAX_NAME} bytes", .0.chars().take(MAX_NAME).collect::<String>())]
    TooLong(String),
    #[error("host name {0:?} has {1:?}: use letters, digits, '.', '_' and '-' only")]
    BadCharacter(String, char),
    #[error("host name {0} is given twice: each host needs a name of its own")]
    Duplicate(String),
}

fn allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// Checks a host name given by the user.
pub fn check_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME {
        return Err(NameError::TooLong(name.to_string()));
    }
    match name.chars().find(|&c| !allowed(c)) {
        Some(c) => Err(NameError::BadCharacter(name.to_string(), c)),
        None => Ok(()),
    }
}

/// Checks that no name is given twice (the names themselves are checked with [`check_name`]).
pub fn check_unique<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<(), NameError> {
    let mut seen = std::collections::HashSet::new();
    for name in names {
        if !seen.insert(name) {
            return Err(NameError::Duplicate(name.to_string()));
        }
    }
    Ok(())
}

/// The name a single-host trace uses when the user gives none: this machine's host name, made
/// into a valid name (any other character becomes '_'; the real one is in [`Machine::hostname`]).
pub fn default_name() -> String {
    let name: String =
        Machine::hostname().unwrap_or_default().chars().map(|c| if allowed(c) { c } else { '_' }).collect();
    let name: String = name.chars().take(MAX_NAME).collect();
    if name.is_empty() { "localhost".to_string() } else { name }
}

/// Who a host is, as the machine itself says: recorded beside the user's name, as information
/// (two machines cloned from one image share a host name; their boot ids still differ).
/// Each field is `None` when it could not be read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    /// The host name of the UTS namespace the tracer runs in.
    pub hostname: Option<String>,
    /// `/proc/sys/kernel/random/boot_id`: new at every boot.
    pub boot_id: Option<String>,
    /// `/etc/machine-id`: the installation's id (missing on some systems and containers).
    pub machine_id: Option<String>,
}

/// Bytes read from any of the files at most: each holds one short line.
const MAX_READ: u64 = 256;

/// The first line of a small file, if it is there, readable and of the expected shape.
fn read_id(path: &Path, valid: impl Fn(&str) -> bool) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(path).ok()?.take(MAX_READ).read_to_string(&mut text).ok()?;
    let line = text.lines().next()?.trim();
    valid(line).then(|| line.to_string())
}

fn hex_or_dash(s: &str) -> bool {
    s.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

fn is_boot_id(s: &str) -> bool {
    s.len() == 36 && hex_or_dash(s)
}

fn is_machine_id(s: &str) -> bool {
    s.len() == 32 && hex_or_dash(s)
}

/// The kernel's bound on a host name (`HOST_NAME_MAX`).
const MAX_HOSTNAME: usize = 64;

fn is_hostname(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_HOSTNAME && !s.chars().any(char::is_control)
}

impl Machine {
    /// Reads this machine's identity; missing or malformed files leave their field `None`.
    pub fn read() -> Machine {
        Machine {
            hostname: Machine::hostname(),
            boot_id: read_id(Path::new("/proc/sys/kernel/random/boot_id"), is_boot_id),
            machine_id: read_id(Path::new("/etc/machine-id"), is_machine_id),
        }
    }

    /// The identity another host sent, keeping only fields of the shape a real machine gives:
    /// an agent's word travels into the trace and onto terminals, so an overlong host name or
    /// one with control characters (terminal escapes) is dropped, not stored.
    pub fn from_peer(self) -> Machine {
        Machine {
            hostname: self.hostname.filter(|s| is_hostname(s)),
            boot_id: self.boot_id.filter(|s| is_boot_id(s)),
            machine_id: self.machine_id.filter(|s| is_machine_id(s)),
        }
    }

    fn hostname() -> Option<String> {
        // The kernel bounds it (64 bytes); not necessarily UTF-8.
        nix::unistd::gethostname().ok().map(|h| h.to_string_lossy().into_owned()).filter(|h| !h.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for good in ["web", "db-1", "eu.west_2", &"a".repeat(MAX_NAME)] {
            assert_eq!(check_name(good), Ok(()), "{good}");
        }
        assert_eq!(check_name("").unwrap_err().to_string(), "a host name cannot be empty");
        assert_eq!(
            check_name("we b").unwrap_err().to_string(),
            "host name \"we b\" has ' ': use letters, digits, '.', '_' and '-' only"
        );
        assert!(matches!(check_name("a\u{1b}[2J"), Err(NameError::BadCharacter(_, '\u{1b}'))));
        assert!(matches!(check_name("a:b"), Err(NameError::BadCharacter(_, ':'))));
        assert!(matches!(check_name("a=b"), Err(NameError::BadCharacter(_, '='))));
        assert!(matches!(check_name("wéb"), Err(NameError::BadCharacter(_, 'é'))));
        assert!(matches!(check_name(&"a".repeat(MAX_NAME + 1)), Err(NameError::TooLong(_))));
    }

    #[test]
    fn a_peers_identity_keeps_only_well_formed_fields() {
        let good = Machine {
            hostname: Some("web-1.example".into()),
            boot_id: Some("0d3c6f1e-3b0a-4b8e-9c1d-2f4e5a6b7c8d".into()),
            machine_id: Some("0123456789abcdef0123456789abcdef".into()),
        };
        assert_eq!(good.clone().from_peer(), good);
        let hostile = Machine {
            hostname: Some("web\u{1b}]0;owned\u{7}".into()),
            boot_id: Some("x".repeat(1 << 20)),
            machine_id: Some("0123456789abcdef0123456789abcdeg".into()),
        };
        assert_eq!(hostile.from_peer(), Machine::default());
        let long = Machine { hostname: Some("a".repeat(MAX_HOSTNAME + 1)), ..Machine::default() };
        assert_eq!(long.from_peer().hostname, None);
    }

    #[test]
    fn duplicates_are_named() {
        assert_eq!(check_unique(["a", "b"]), Ok(()));
        assert_eq!(
            check_unique(["a", "b", "a"]).unwrap_err().to_string(),
            "host name a is given twice: each host needs a name of its own"
        );
    }

    #[test]
    fn the_default_name_is_valid_and_this_machine_is_read() {
        check_name(&default_name()).unwrap();
        let m = Machine::read();
        assert_eq!(m.boot_id.as_ref().map(String::len), Some(36), "{m:?}");
        assert!(m.hostname.is_some(), "{m:?}");
    }

    #[test]
    fn malformed_or_missing_ids_are_none() {
        let dir = std::env::temp_dir().join(format!("tracer-host-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("id");
        std::fs::write(&f, "uninitialized\n").unwrap();
        assert_eq!(read_id(&f, |s| s.len() == 32 && hex_or_dash(s)), None);
        std::fs::write(&f, format!("{}\n", "ab".repeat(16))).unwrap();
        assert_eq!(read_id(&f, |s| s.len() == 32 && hex_or_dash(s)), Some("ab".repeat(16)));
        // A huge file is read only up to the bound.
        std::fs::write(&f, "a".repeat(10_000)).unwrap();
        assert_eq!(read_id(&f, |_| true).map(|s| s.len()), Some(MAX_READ as usize));
        assert_eq!(read_id(&dir.join("missing"), |_| true), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
