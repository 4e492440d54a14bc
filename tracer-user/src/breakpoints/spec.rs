//! The `-B` and `-w` options as the user writes them.

use super::BreakpointError;
use crate::kernel::sites::Access;

/// Where a breakpoint goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BreakSpec {
    /// `fixture.c:12`: every address where the line's code starts.
    Line { file: String, line: u32 },
    /// `bump+4`: an address in a function (bytes from its start).
    Offset { function: String, offset: u64 },
}

/// What a watchpoint watches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchTarget {
    /// A global or static variable named by DWARF.
    Variable(String),
    /// Raw bytes at an address of the process.
    Address { address: u64, len: u8 },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchSpec {
    pub target: WatchTarget,
    pub access: Access,
}

fn number(text: &str) -> Option<u64> {
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

impl BreakSpec {
    pub fn parse(text: &str) -> Result<BreakSpec, BreakpointError> {
        let bad = || BreakpointError::BadBreak(text.to_string());
        if let Some((function, offset)) = text.rsplit_once('+')
            && !function.is_empty()
            && !function.contains(':')
        {
            let offset = number(offset).ok_or_else(bad)?;
            return Ok(BreakSpec::Offset { function: function.to_string(), offset });
        }
        let (file, line) = text.rsplit_once(':').ok_or_else(bad)?;
        let line: u32 = line.parse().map_err(|_| bad())?;
        if file.is_empty() || line == 0 {
            return Err(bad());
        }
        Ok(BreakSpec::Line { file: file.to_string(), line })
    }
}

impl WatchSpec {
    pub fn parse(text: &str) -> Result<WatchSpec, BreakpointError> {
        let bad = || BreakpointError::BadWatch(text.to_string());
        let (name, suffix) = match text.rsplit_once(':') {
            Some((n, s)) => (n, Some(s)),
            None => (text, None),
        };
        if name.starts_with("0x") || name.starts_with("0X") {
            let address = number(name).ok_or_else(bad)?;
            let len = suffix.and_then(|s| s.parse::<u8>().ok()).filter(|l| [1, 2, 4, 8].contains(l)).ok_or_else(bad)?;
            if address % u64::from(len) != 0 {
                return Err(bad());
            }
            return Ok(WatchSpec { target: WatchTarget::Address { address, len }, access: Access::Write });
        }
        let access = match suffix {
            None | Some("w") => Access::Write,
            Some("r") => Access::Read,
            Some("rw") => Access::ReadWrite,
            Some(_) => return Err(bad()),
        };
        let valid = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
        if !valid {
            return Err(bad());
        }
        Ok(WatchSpec { target: WatchTarget::Variable(name.to_string()), access })
    }
}

/// The text `parse` reads back as the same breakpoint: what a collector sends its agents.
impl std::fmt::Display for BreakSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BreakSpec::Line { file, line } => write!(f, "{file}:{line}"),
            BreakSpec::Offset { function, offset } => write!(f, "{function}+{offset:#x}"),
        }
    }
}

/// The text `parse` reads back as the same watchpoint.
impl std::fmt::Display for WatchSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.target {
            WatchTarget::Address { address, len } => write!(f, "{address:#x}:{len}"),
            WatchTarget::Variable(name) => {
                let access = match self.access {
                    Access::Write => "w",
                    Access::Read => "r",
                    Access::ReadWrite => "rw",
                };
                write!(f, "{name}:{access}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breakpoints_parse() {
        assert_eq!(
            BreakSpec::parse("src/fixture.c:12").unwrap(),
            BreakSpec::Line { file: "src/fixture.c".into(), line: 12 }
        );
        assert_eq!(BreakSpec::parse("bump+0x4").unwrap(), BreakSpec::Offset { function: "bump".into(), offset: 4 });
        assert_eq!(BreakSpec::parse("bump+7").unwrap(), BreakSpec::Offset { function: "bump".into(), offset: 7 });
        for bad in ["fixture.c", "fixture.c:0", "fixture.c:x", ":3", "bump+x"] {
            assert!(BreakSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn watchpoints_parse() {
        let w = |t: &str| WatchSpec::parse(t).unwrap();
        assert_eq!(w("counter"), WatchSpec { target: WatchTarget::Variable("counter".into()), access: Access::Write });
        assert_eq!(w("counter:rw").access, Access::ReadWrite);
        assert_eq!(w("counter:r").access, Access::Read);
        assert_eq!(w("0x4010:4").target, WatchTarget::Address { address: 0x4010, len: 4 });
        for bad in ["counter:x", "0x4010:3", "0x4011:4", "0x4010", "a b", ""] {
            assert!(WatchSpec::parse(bad).is_err(), "{bad}");
        }
    }

    /// What a collector sends is read by its agents as the user's own option.
    #[test]
    fn specs_read_back_from_their_text() {
        for text in ["src/fixture.c:12", "bump+0x4", "bump+7", "a::b.rs:3"] {
            let spec = BreakSpec::parse(text).unwrap();
            assert_eq!(BreakSpec::parse(&spec.to_string()).unwrap(), spec, "{text}");
        }
        for text in ["counter", "counter:r", "counter:rw", "ns::x:w", "0x4010:4", "0x4010:8"] {
            let spec = WatchSpec::parse(text).unwrap();
            assert_eq!(WatchSpec::parse(&spec.to_string()).unwrap(), spec, "{text}");
        }
    }
}
