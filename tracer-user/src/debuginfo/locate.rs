//! Finding the DWARF of an ELF file: in the file itself, else in a separate debug file named by
//! its build id (`<debug dir>/.build-id/xx/rest.debug`, checked against the id) or by its
//! `.gnu_debuglink` (beside the file, in its `.debug/`, or under `<debug dir>/<its dir>`, checked
//! against the link's CRC-32), in the order gdb looks.
//!
//! The names come from the traced file, which anybody may have written: a debuglink must be a
//! plain file name (no directory, no `..`), a candidate must be a regular file (a FIFO would
//! block the tracer) of at most [`MAX_DEBUG_FILE`] bytes, and is opened without blocking.

use std::{
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
};

use object::{Object as _, ObjectSection as _};

use crate::mapped_file::MappedFile;

/// The largest debug file read (Chromium's are about 2 GiB; it is mapped, and DWARF reading
/// touches only the sections it needs).
pub const MAX_DEBUG_FILE: u64 = 4 << 30;

/// Where to look for separate debug files.
#[derive(Clone, Debug)]
pub struct DebugSearch {
    /// The global debug directories (gdb's `debug-file-directory`).
    pub debug_dirs: Vec<PathBuf>,
}

impl Default for DebugSearch {
    fn default() -> DebugSearch {
        DebugSearch { debug_dirs: vec![PathBuf::from("/usr/lib/debug")] }
    }
}

/// Where a file's DWARF was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DebugOrigin {
    InFile,
    BuildId(PathBuf),
    DebugLink(PathBuf),
}

/// A candidate debug file that exists but was not used, and why.
#[derive(Debug)]
pub struct Rejected {
    pub path: PathBuf,
    pub why: RejectedWhy,
}

/// Why a candidate debug file was not used.
#[derive(Debug, thiserror::Error)]
pub enum RejectedWhy {
    #[error("cannot open it")]
    Open(#[source] std::io::Error),
    #[error("cannot stat it")]
    Stat(#[source] std::io::Error),
    #[error("not a regular file")]
    NotAFile,
    #[error("{0} bytes, more than the {MAX_DEBUG_FILE} read at most")]
    TooLarge(u64),
    #[error("cannot read it")]
    Read(#[source] std::io::Error),
    #[error("not an ELF file ({0})")]
    NotElf(object::Error),
    #[error("its build id differs")]
    OtherBuildId,
    #[error("its CRC-32 is {actual:08x}, the link says {expected:08x}")]
    OtherCrc { actual: u32, expected: u32 },
    #[error("it has no .debug_info")]
    NoDwarf,
    #[error("a .gnu_debuglink that is not a plain file name")]
    NotAFileName,
}

/// Whether an ELF file carries DWARF of its own.
pub fn has_dwarf(file: &object::File) -> bool {
    file.section_by_name(".debug_info").is_some_and(|s| s.size() > 0)
}

/// A debug file's contents, mapped (a debug file is often hundreds of MiB, of which DWARF
/// reading touches a part), or why it cannot be one (`None`: it does not exist).
fn read_candidate(path: &Path) -> Option<Result<MappedFile, RejectedWhy>> {
    let file = match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => return Some(Err(RejectedWhy::Open(e))),
    };
    let check = || -> Result<MappedFile, RejectedWhy> {
        let meta = file.metadata().map_err(RejectedWhy::Stat)?;
        if !meta.is_file() {
            return Err(RejectedWhy::NotAFile);
        }
        if meta.len() > MAX_DEBUG_FILE {
            return Err(RejectedWhy::TooLarge(meta.len()));
        }
        MappedFile::of(&file, MAX_DEBUG_FILE).map_err(RejectedWhy::Read)
    };
    Some(check())
}

/// A candidate's data if it is an ELF file with DWARF, else why not.
fn usable(
    data: MappedFile,
    check: impl FnOnce(&object::File) -> Result<(), RejectedWhy>,
) -> Result<MappedFile, RejectedWhy> {
    let file = object::File::parse(&*data).map_err(RejectedWhy::NotElf)?;
    check(&file)?;
    if !has_dwarf(&file) {
        return Err(RejectedWhy::NoDwarf);
    }
    Ok(data)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A debuglink name that names a file in a directory, and nothing else.
fn plain_file_name(name: &[u8]) -> Option<&str> {
    let name = std::str::from_utf8(name).ok()?;
    let ok = !name.is_empty() && name.len() <= 255 && name != "." && name != ".." && !name.contains(['/', '\0']);
    ok.then_some(name)
}

/// Looks for the DWARF of the file at `elf_path` (parsed as `elf`) outside the file. Returns the
/// debug file's origin and contents if one fits, and every candidate that existed but did not.
pub fn find_separate(
    elf_path: &Path,
    elf: &object::File,
    search: &DebugSearch,
) -> (Option<(DebugOrigin, MappedFile)>, Vec<Rejected>) {
    let mut rejected = Vec::new();
    if let Ok(Some(id)) = elf.build_id()
        && id.len() >= 2
    {
        let id_hex = hex(id);
        for dir in &search.debug_dirs {
            let path = dir.join(".build-id").join(&id_hex[..2]).join(format!("{}.debug", &id_hex[2..]));
            let Some(read) = read_candidate(&path) else { continue };
            let same_id = |f: &object::File| match f.build_id() {
                Ok(Some(other)) if other == id => Ok(()),
                _ => Err(RejectedWhy::OtherBuildId),
            };
            match read.and_then(|data| usable(data, same_id)) {
                Ok(data) => return (Some((DebugOrigin::BuildId(path), data)), rejected),
                Err(why) => rejected.push(Rejected { path, why }),
            }
        }
    }
    if let Ok(Some((raw_name, crc))) = elf.gnu_debuglink() {
        let Some(name) = plain_file_name(raw_name) else {
            rejected.push(Rejected {
                path: PathBuf::from(String::from_utf8_lossy(raw_name).into_owned()),
                why: RejectedWhy::NotAFileName,
            });
            return (None, rejected);
        };
        // gdb resolves the directory of the real file, not of a symlink to it.
        let real = std::fs::canonicalize(elf_path).unwrap_or_else(|_| elf_path.to_path_buf());
        let dir = real.parent().unwrap_or(Path::new("/")).to_path_buf();
        let mut candidates = vec![dir.join(name), dir.join(".debug").join(name)];
        for debug_dir in &search.debug_dirs {
            candidates.push(debug_dir.join(dir.strip_prefix("/").unwrap_or(&dir)).join(name));
        }
        for path in candidates {
            if path == real {
                continue;
            }
            let Some(read) = read_candidate(&path) else { continue };
            let same_crc = |data: MappedFile| {
                let actual = crc32fast::hash(&data);
                if actual == crc { Ok(data) } else { Err(RejectedWhy::OtherCrc { actual, expected: crc }) }
            };
            match read.and_then(same_crc).and_then(|data| usable(data, |_| Ok(()))) {
                Ok(data) => return (Some((DebugOrigin::DebugLink(path), data)), rejected),
                Err(why) => rejected.push(Rejected { path, why }),
            }
        }
    }
    (None, rejected)
}
