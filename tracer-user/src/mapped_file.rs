//! Executables, libraries and debug files, read through a read-only mapping with a size bound.
//!
//! Reading a file whole costs its size in memory, and the agent reads whatever file a collector
//! names (`--binary`, a process's executable and libraries): a 3 GiB sparse file took 3 GiB.
//! Mapped, a file costs the pages the ELF parser touches (symbol tables, notes, DWARF sections),
//! shared with the page cache; and a file above [`MAX_MAPPED_FILE`] is refused before it is
//! mapped.
//!
//! A mapped file that someone truncates while it is read raises `SIGBUS`. An executable that
//! runs cannot be written (`ETXTBSY`), and the files the planner reads are read once, briefly.

use std::{fs::File, io, ops::Deref, path::Path};

/// The largest executable or library read (debug files have their own bound,
/// [`crate::debuginfo::locate::MAX_DEBUG_FILE`]).
pub const MAX_MAPPED_FILE: u64 = 2 << 30;

#[derive(Debug, thiserror::Error)]
#[error("it is {size} bytes, more than the {max} read at most")]
pub struct TooLarge {
    pub size: u64,
    pub max: u64,
}

/// A file's bytes, mapped read-only.
#[derive(Debug)]
pub struct MappedFile {
    /// `None` for an empty file (which cannot be mapped).
    map: Option<memmap2::Mmap>,
}

impl MappedFile {
    /// Maps the file at `path`; one above [`MAX_MAPPED_FILE`] is refused with [`TooLarge`] (as an
    /// `io::Error` of kind `FileTooLarge`, so that callers' "cannot read PATH" errors carry it).
    pub fn open(path: &Path) -> io::Result<MappedFile> {
        MappedFile::of(&File::open(path)?, MAX_MAPPED_FILE)
    }

    /// Maps an open file of at most `max` bytes.
    pub fn of(file: &File, max: u64) -> io::Result<MappedFile> {
        let size = file.metadata()?.len();
        if size > max {
            return Err(io::Error::new(io::ErrorKind::FileTooLarge, TooLarge { size, max }));
        }
        if size == 0 {
            return Ok(MappedFile { map: None });
        }
        // SAFETY: a read-only private mapping; its bytes change only if someone writes the file
        // while it is read (see the module's note), which the ELF parser treats as any bytes.
        let map = unsafe { memmap2::MmapOptions::new().len(size as usize).map(file)? };
        Ok(MappedFile { map: Some(map) })
    }
}

impl Deref for MappedFile {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_a_file_and_refuses_one_above_the_bound() {
        let dir = std::env::temp_dir().join(format!("tracer-mapped-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let small = dir.join("small");
        std::fs::write(&small, b"\x7fELF and more").unwrap();
        assert_eq!(&*MappedFile::open(&small).unwrap(), b"\x7fELF and more");
        let empty = dir.join("empty");
        std::fs::write(&empty, b"").unwrap();
        assert!(MappedFile::open(&empty).unwrap().is_empty());
        // Sparse: costs no disk.
        let huge = dir.join("huge");
        File::create(&huge).unwrap().set_len(MAX_MAPPED_FILE + 1).unwrap();
        let err = MappedFile::open(&huge).err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::FileTooLarge);
        assert_eq!(
            err.to_string(),
            format!("it is {} bytes, more than the {MAX_MAPPED_FILE} read at most", MAX_MAPPED_FILE + 1)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
