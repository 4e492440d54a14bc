//! Calls at source level: for the functions of an ELF file, what their DWARF says (file and line
//! of definition, parameters by name and type, return type), where each parameter is when an
//! entry probe fires, and how to turn captured registers and string bytes into JSON values.
//!
//! - [`locate`]: finding the DWARF (in the file, by build id, by `.gnu_debuglink`);
//! - [`dwarf`]: reading functions, parameters and types (gimli), all wanted functions in one pass;
//! - [`types`]: the type model; [`abi`]: where values are at entry and return;
//! - [`layout`]: the compact per-function layout for the kernel and the raw capture format;
//! - [`format`]: raw captures to JSON values.
//!
//! ```no_run
//! use tracer_user::debuginfo::{DebugInfo, DebugSearch, layout::{FunctionLayout, DEFAULT_STRING_SIZE}};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let path = std::path::Path::new("/usr/bin/true");
//! let data = std::fs::read(path)?;
//! let found = DebugInfo::find(path, &data, &DebugSearch::default())?;
//! if let Some(info) = found.info {
//!     for (address, function) in info.functions(&[0x1234])? {
//!         if let Some(signature) = &function.signature {
//!             let layout = FunctionLayout::new(signature, DEFAULT_STRING_SIZE);
//!             println!("{address:#x} {} {:?}:{:?} {:?}", function.name, function.file, function.line, layout.probe);
//!         }
//!     }
//! }
//! # Ok(()) }
//! ```

pub mod abi;
pub mod dwarf;
pub mod format;
pub mod layout;
pub mod locate;
pub mod types;

use std::{
    borrow::Cow,
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::Arc,
};

use object::{Object as _, ObjectSection as _};

pub use self::locate::{DebugOrigin, DebugSearch, Rejected};
use self::{
    abi::{DwarfEntry, Place, Unknown},
    types::Type,
};

/// The largest DWARF section decompressed (a compressed section says its size; the claim is
/// checked before any memory is set aside for it).
pub const MAX_SECTION_SIZE: u64 = 1 << 30;

#[derive(Debug, thiserror::Error)]
pub enum DebugInfoError {
    #[error("{path} is not an ELF file ({reason})")]
    NotElf { path: PathBuf, reason: String },
    #[error("{path} is not an x86-64 ELF file")]
    NotX86_64 { path: PathBuf },
    #[error("cannot read section {section} of {path}: {reason}")]
    Section { path: PathBuf, section: &'static str, reason: String },
    #[error("malformed DWARF in {path}: {source}")]
    Dwarf { path: PathBuf, source: gimli::Error },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Language {
    C,
    Cpp,
    Rust,
    /// Another `DW_LANG_*` (0: none given).
    Other(u16),
}

/// What DWARF says of one function.
#[derive(Clone, Debug, PartialEq)]
pub struct FunctionInfo {
    /// `DW_AT_name`: unqualified (`add`, not `shop::Counter::add`).
    pub name: String,
    /// The source file of its definition, as the compiler recorded it (joined with the
    /// compilation directory).
    pub file: Option<PathBuf>,
    /// The line of its definition.
    pub line: Option<u32>,
    pub language: Language,
    /// `None` when the debug info has line tables only (gcc `-g1`, rustc `debuginfo=1`).
    pub signature: Option<Signature>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Signature {
    /// In declaration order; C++'s `this` first (`artificial`).
    pub params: Vec<Param>,
    /// Declared with `...`.
    pub variadic: bool,
    /// `None` for `void` (and Rust's `()`).
    pub ret: Option<Ret>,
    /// Whether the DWARF shows optimised code (a register location at entry, a parameter without
    /// location); unoptimised code gives stack-frame slots only.
    pub optimized: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    pub name: Option<String>,
    pub ty: Arc<Type>,
    pub artificial: bool,
    /// Where it is when the entry probe fires (see [`abi`]), or why that is not known.
    pub entry: Result<Place, Unknown>,
    /// What the calling convention alone says.
    pub abi: Result<Place, Unknown>,
    /// What DWARF alone says at the entry pc.
    pub dwarf: DwarfEntry,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Ret {
    pub ty: Arc<Type>,
    /// Where it is when the return probe fires.
    pub place: Result<Place, Unknown>,
}

/// The result of looking for a file's DWARF.
#[derive(Debug)]
pub struct Found<'a> {
    pub info: Option<DebugInfo<'a>>,
    /// Debug files that were there but did not fit (wrong CRC or build id, not ELF, ...).
    pub rejected: Vec<Rejected>,
}

/// The DWARF of one ELF file, found and ready to read.
#[derive(Debug)]
pub struct DebugInfo<'a> {
    origin: DebugOrigin,
    path: PathBuf,
    data: Cow<'a, [u8]>,
}

impl<'a> DebugInfo<'a> {
    /// Finds the DWARF of the ELF file at `path` whose contents are `data`.
    pub fn find(path: &Path, data: &'a [u8], search: &DebugSearch) -> Result<Found<'a>, DebugInfoError> {
        let file = object::File::parse(data)
            .map_err(|e| DebugInfoError::NotElf { path: path.to_owned(), reason: e.to_string() })?;
        if file.architecture() != object::Architecture::X86_64 {
            return Err(DebugInfoError::NotX86_64 { path: path.to_owned() });
        }
        if locate::has_dwarf(&file) {
            let info = DebugInfo { origin: DebugOrigin::InFile, path: path.to_owned(), data: Cow::Borrowed(data) };
            return Ok(Found { info: Some(info), rejected: Vec::new() });
        }
        let (found, rejected) = locate::find_separate(path, &file, search);
        let info = found.map(|(origin, data)| {
            let path = match &origin {
                DebugOrigin::BuildId(p) | DebugOrigin::DebugLink(p) => p.clone(),
                DebugOrigin::InFile => path.to_owned(),
            };
            DebugInfo { origin, path, data: Cow::Owned(data) }
        });
        Ok(Found { info, rejected })
    }

    pub fn origin(&self) -> &DebugOrigin {
        &self.origin
    }

    /// The file the DWARF is read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the DWARF says of the functions at these addresses (their symbols' addresses), all
    /// in one pass; addresses it does not describe are left out.
    pub fn functions(&self, addresses: &[u64]) -> Result<BTreeMap<u64, FunctionInfo>, DebugInfoError> {
        let path = &self.path;
        let file = object::File::parse(&*self.data)
            .map_err(|e| DebugInfoError::NotElf { path: path.clone(), reason: e.to_string() })?;
        let sections = gimli::DwarfSections::load(|id| -> Result<Cow<[u8]>, DebugInfoError> {
            let Some(section) = file.section_by_name(id.name()) else { return Ok(Cow::Borrowed(&[])) };
            let fail = |reason: String| DebugInfoError::Section { path: path.clone(), section: id.name(), reason };
            let compressed = section.compressed_data().map_err(|e| fail(e.to_string()))?;
            // zlib expands at most 1032 to 1; zstd is bounded by MAX_SECTION_SIZE alone.
            let ratio_bound = match compressed.format {
                object::CompressionFormat::Zlib => (compressed.data.len() as u64).saturating_mul(1032) + 4096,
                _ => u64::MAX,
            };
            if compressed.format != object::CompressionFormat::None
                && (compressed.uncompressed_size > MAX_SECTION_SIZE || compressed.uncompressed_size > ratio_bound)
            {
                return Err(fail(format!(
                    "it claims {} bytes uncompressed from {} compressed",
                    compressed.uncompressed_size,
                    compressed.data.len()
                )));
            }
            compressed.decompress().map_err(|e| fail(e.to_string()))
        })?;
        let dwarf = sections.borrow(|s| gimli::EndianSlice::new(s, gimli::LittleEndian));
        let wanted: BTreeSet<u64> = addresses.iter().copied().collect();
        dwarf::Reader::new(&dwarf)
            .functions(&wanted)
            .map_err(|source| DebugInfoError::Dwarf { path: path.clone(), source })
    }
}
