//! Go executables and libraries: recognising them, their Go version, and where the runtime keeps
//! a goroutine's id.
//!
//! A Go program's runtime moves goroutine stacks (it copies a stack whole when it grows) and walks
//! them (tracebacks, garbage collection); a uretprobe's trampoline address in place of a return
//! address makes it abort ("unexpected return pc"). So every function of a file recognised here is
//! probed with ordinary uprobes only: see [`crate::functions::disasm`] and `plan::select_functions`.

use object::{Object as _, ObjectSection as _};

/// Go's build-info magic, at the start of `.go.buildinfo` (Go 1.13+).
const BUILDINFO_MAGIC: &[u8] = b"\xff Go buildinf:";
/// Flag in the build-info header: the version and module strings follow inline (Go 1.18+).
const BUILDINFO_INLINE_STRINGS: u8 = 0x2;

/// Offsets of `runtime.g.goid` by Go version (without DWARF to read it from): 152 bytes from
/// Go 1.17, when the register ABI put `g` in r14, through 1.22 (`stack` 16, `stackguard0/1` 16,
/// `_panic`, `_defer`, `m` 24, `sched` 56, `syscallsp`, `syscallpc`, `stktopsp`, `param` 32,
/// `atomicstatus`, `stackLock` 8). Checked against the DWARF of Debian's Go 1.19.
const GOID_OFFSETS: &[GoidOffset] = &[GoidOffset { from: (1, 17), to: (1, 22), offset: 152 }];

/// `runtime.g.goid` is at `offset` in Go versions `from..=to` (major, minor).
struct GoidOffset {
    from: (u32, u32),
    to: (u32, u32),
    offset: u16,
}

/// What the tracer needs to know about a Go file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoInfo {
    /// `go1.19.8`, when the build info says.
    pub version: Option<String>,
    /// Where `runtime.g.goid` lies, or why that is not known.
    pub goid_offset: Result<u16, GoRefusal>,
}

/// Why a Go file's functions cannot be probed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GoRefusal {
    #[error("it is built with {0}; the tracer needs Go 1.17 or later (register ABI)")]
    TooOld(String),
    #[error("cannot tell its goroutines apart: it has no DWARF and no readable Go version")]
    NoVersion,
    #[error(
        "cannot tell its goroutines apart: it has no DWARF, and the layout of {0}'s goroutines is not known to the tracer"
    )]
    UnknownLayout(String),
}

impl GoInfo {
    /// Why this file's Go functions cannot be probed, if they cannot: before Go 1.17 `g` is not
    /// in r14 (nor the arguments in registers), and without the goroutine id offset calls cannot
    /// be paired per goroutine.
    pub fn refusal(&self) -> Option<GoRefusal> {
        if let Some(version) = &self.version
            && major_minor(version).is_some_and(|v| v < (1, 17))
        {
            return Some(GoRefusal::TooOld(version.clone()));
        }
        self.goid_offset.as_ref().err().cloned()
    }

    /// The offset of `runtime.g.goid` (0 when unknown: [`GoInfo::refusal`] says why).
    pub fn goid_offset(&self) -> u16 {
        *self.goid_offset.as_ref().unwrap_or(&0)
    }
}

/// `Some` when the ELF file contains Go code: it has Go's build info, its pc-line table or its
/// build id note, or the runtime's `runtime.morestack` symbol.
pub fn inspect(file: &object::File) -> Option<GoInfo> {
    let go_section =
        [".go.buildinfo", ".gopclntab", ".note.go.buildid"].iter().any(|name| file.section_by_name(name).is_some());
    let go_symbol = || {
        use object::ObjectSymbol as _;
        file.symbols().any(|s| s.name() == Ok("runtime.morestack"))
    };
    if !go_section && !go_symbol() {
        return None;
    }
    let version = file.section_by_name(".go.buildinfo").and_then(|s| s.data().ok()).and_then(build_info_version);
    let goid_offset = match dwarf_goid_offset(file) {
        Some(offset) => Ok(offset),
        None => version_goid_offset(version.as_deref()),
    };
    Some(GoInfo { version, goid_offset })
}

/// The Go version from the build info's inline strings (Go 1.18+): a varint length, then the text.
fn build_info_version(data: &[u8]) -> Option<String> {
    if !data.starts_with(BUILDINFO_MAGIC) || data.len() < 32 {
        return None;
    }
    if data[15] & BUILDINFO_INLINE_STRINGS == 0 {
        return None;
    }
    let (len, used) = uvarint(&data[32..])?;
    let start = 32 + used;
    let text = data.get(start..start.checked_add(usize::try_from(len).ok()?)?)?;
    std::str::from_utf8(text).ok().filter(|v| v.starts_with("go")).map(str::to_string)
}

/// An unsigned LEB128 varint (Go's `binary.Uvarint`): the value and the bytes it took.
fn uvarint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// (major, minor) of `go1.19.8`, `go1.21rc2`, `go1.22`.
fn major_minor(version: &str) -> Option<(u32, u32)> {
    let rest = version.strip_prefix("go")?;
    let mut parts = rest.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor_text: String = parts.next()?.chars().take_while(char::is_ascii_digit).collect();
    Some((major, minor_text.parse().ok()?))
}

fn version_goid_offset(version: Option<&str>) -> Result<u16, GoRefusal> {
    let Some(version) = version else {
        return Err(GoRefusal::NoVersion);
    };
    let known = major_minor(version)
        .and_then(|v| GOID_OFFSETS.iter().find(|known| (known.from..=known.to).contains(&v)).map(|known| known.offset));
    known.ok_or_else(|| GoRefusal::UnknownLayout(version.to_string()))
}

/// `DW_AT_data_member_location` of `goid` in the `runtime.g` structure, from the file's DWARF
/// (Go compresses it; `object` inflates it).
fn dwarf_goid_offset(file: &object::File) -> Option<u16> {
    let load = |id: gimli::SectionId| -> Result<std::borrow::Cow<[u8]>, gimli::Error> {
        Ok(file
            .section_by_name(id.name())
            .and_then(|s| s.uncompressed_data().ok())
            .unwrap_or(std::borrow::Cow::Borrowed(&[])))
    };
    let sections = gimli::DwarfSections::load(load).ok()?;
    let dwarf = sections.borrow(|s| gimli::EndianSlice::new(s, gimli::LittleEndian));
    let mut units = dwarf.units();
    while let Ok(Some(header)) = units.next() {
        let Ok(unit) = dwarf.unit(header) else { continue };
        let mut entries = unit.entries();
        let mut in_g = None::<isize>;
        while let Ok(Some(entry)) = entries.next_dfs() {
            let depth = entry.depth();
            if in_g.is_some_and(|d| depth <= d) {
                // Left runtime.g without finding goid.
                return None;
            }
            let name =
                entry.attr_value(gimli::DW_AT_name).and_then(|v| dwarf.attr_string(&unit, v).ok()).map(|s| s.slice());
            match (entry.tag(), in_g) {
                (gimli::DW_TAG_structure_type, None) if name == Some(b"runtime.g") => in_g = Some(depth),
                (gimli::DW_TAG_member, Some(_)) if name == Some(b"goid") => {
                    let location = entry.attr_value(gimli::DW_AT_data_member_location)?;
                    return location.udata_value().and_then(|v| u16::try_from(v).ok());
                }
                _ => {}
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(major_minor("go1.19.8"), Some((1, 19)));
        assert_eq!(major_minor("go1.21rc2"), Some((1, 21)));
        assert_eq!(major_minor("devel"), None);
        assert_eq!(version_goid_offset(Some("go1.19.8")), Ok(152));
        assert_eq!(version_goid_offset(Some("go1.16")), Err(GoRefusal::UnknownLayout("go1.16".into())));
        assert!(version_goid_offset(None).is_err());
        let old = GoInfo { version: Some("go1.16.3".into()), goid_offset: Ok(152) };
        assert!(old.refusal().unwrap().to_string().contains("Go 1.17 or later"), "{old:?}");
        let new = GoInfo { version: Some("go1.19.8".into()), goid_offset: Ok(152) };
        assert_eq!((new.refusal(), new.goid_offset()), (None, 152));
    }

    #[test]
    fn build_info_inline_version() {
        let mut data = BUILDINFO_MAGIC.to_vec();
        data.push(8); // pointer size
        data.push(BUILDINFO_INLINE_STRINGS);
        data.resize(32, 0);
        data.push(8);
        data.extend_from_slice(b"go1.19.8");
        data.extend_from_slice(&[0; 8]);
        assert_eq!(build_info_version(&data).as_deref(), Some("go1.19.8"));
        // A length past the end, and the older pointer form, give no version.
        data[32] = 100;
        assert_eq!(build_info_version(&data), None);
        data[15] = 0;
        assert_eq!(build_info_version(&data), None);
    }

    #[test]
    fn this_rust_binary_is_not_go() {
        let data = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(inspect(&object::File::parse(&*data).unwrap()), None);
    }
}
