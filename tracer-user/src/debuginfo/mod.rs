//! Calls at source level: for the functions of an ELF file, what their DWARF says (file and line
//! of definition, parameters by name and type, return type), where each parameter is when an
//! entry probe fires, and how to turn captured registers and string bytes into JSON values.
//!
//! - [`locate`]: finding the DWARF (in the file, by build id, by `.gnu_debuglink`);
//! - [`dwarf`]: reading functions, parameters and types (gimli), all wanted functions in one pass;
//! - [`types`]: the type model; [`abi`]: where values are at entry and return;
//! - [`layout`]: the compact per-function layout for the kernel and the raw capture format;
//! - [`format`]: raw captures to JSON values;
//! - [`source_map`]: line tables, globals and the locals in scope at an address (breakpoints,
//!   watchpoints).
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
pub mod source_map;
pub mod types;

use std::{
    borrow::Cow,
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::Arc,
};

use object::{Object as _, ObjectSection as _};

use crate::mapped_file::MappedFile;

pub use self::locate::{DebugOrigin, DebugSearch, Rejected, RejectedWhy};
use self::{
    abi::{DwarfEntry, Place, Unknown},
    types::Type,
};

/// The largest DWARF section decompressed (a compressed section says its size; the claim is
/// checked before any memory is set aside for it).
pub const MAX_SECTION_SIZE: u64 = 1 << 30;

#[derive(Debug, thiserror::Error)]
pub enum DebugInfoError {
    #[error("cannot read {path}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is not an ELF file ({reason})")]
    NotElf { path: PathBuf, reason: String },
    #[error("{path} is not an x86-64 ELF file")]
    NotX86_64 { path: PathBuf },
    #[error("cannot read section {section} of {path}: {reason}")]
    Section { path: PathBuf, section: &'static str, reason: String },
    #[error("malformed DWARF in {path}")]
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
    data: Bytes<'a>,
}

/// An ELF file's bytes: the traced file's own (borrowed), or a separate debug file's (mapped).
#[derive(Debug)]
enum Bytes<'a> {
    Borrowed(&'a [u8]),
    Mapped(MappedFile),
}

impl std::ops::Deref for Bytes<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Borrowed(data) => data,
            Bytes::Mapped(file) => file,
        }
    }
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
            let info = DebugInfo { origin: DebugOrigin::InFile, path: path.to_owned(), data: Bytes::Borrowed(data) };
            return Ok(Found { info: Some(info), rejected: Vec::new() });
        }
        let (found, rejected) = locate::find_separate(path, &file, search);
        let info = found.map(|(origin, data)| {
            let path = match &origin {
                DebugOrigin::BuildId(p) | DebugOrigin::DebugLink(p) => p.clone(),
                DebugOrigin::InFile => path.to_owned(),
            };
            DebugInfo { origin, path, data: Bytes::Mapped(data) }
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
        let wanted: BTreeSet<u64> = addresses.iter().copied().collect();
        self.read(|reader| reader.functions(&wanted))
    }

    /// The line table and the functions' address ranges.
    pub fn source_map(&self) -> Result<source_map::SourceMap, DebugInfoError> {
        self.read(|reader| reader.source_map())
    }

    /// A global or static variable by name, if DWARF gives it a fixed address.
    pub fn global(&self, name: &str) -> Result<Option<source_map::Global>, DebugInfoError> {
        self.read(|reader| reader.global(name))
    }

    /// The parameters and locals in scope at each of `pcs` (`None` where no function's DWARF
    /// covers it), CFAs from `frames` (the executable's `.eh_frame`).
    pub fn locals_at(
        &self,
        pcs: &[u64],
        frames: Option<&source_map::CallFrames<'_>>,
    ) -> Result<Vec<Option<Vec<source_map::Local>>>, DebugInfoError> {
        self.read(|reader| pcs.iter().map(|&pc| reader.locals_at(pc, frames)).collect())
    }

    /// Runs `f` over this file's DWARF sections.
    fn read<T>(
        &self,
        f: impl for<'d, 'b> FnOnce(&mut dwarf::Reader<'d, 'b>) -> Result<T, gimli::Error>,
    ) -> Result<T, DebugInfoError> {
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
        f(&mut dwarf::Reader::new(&dwarf)).map_err(|source| DebugInfoError::Dwarf { path: path.clone(), source })
    }
}

/// What the probes and the events of one function need at source level.
#[derive(Debug, PartialEq)]
pub struct SourceFunction {
    pub file: Option<Arc<str>>,
    pub line: Option<u32>,
    /// `None` with line tables only.
    pub layout: Option<layout::FunctionLayout>,
}

/// The source-level view of the functions at `addresses` (symbol addresses) of the ELF file at
/// `path`, strings bounded to `string_size`; empty when it has no DWARF anywhere. Debug files
/// found but rejected are returned for a warning.
pub fn source_functions(
    path: &Path,
    addresses: &[u64],
    string_size: u16,
) -> Result<(BTreeMap<u64, SourceFunction>, Vec<Rejected>), DebugInfoError> {
    let data = crate::mapped_file::MappedFile::open(path)
        .map_err(|source| DebugInfoError::Read { path: path.to_owned(), source })?;
    let found = DebugInfo::find(path, &data, &DebugSearch::default())?;
    let Some(info) = found.info else { return Ok((BTreeMap::new(), found.rejected)) };
    let functions = info
        .functions(addresses)?
        .into_iter()
        .map(|(address, f)| {
            let source = SourceFunction {
                file: f.file.map(|p| Arc::from(p.to_string_lossy())),
                line: f.line,
                layout: f.signature.as_ref().map(|s| layout::FunctionLayout::new(s, string_size)),
            };
            (address, source)
        })
        .collect();
    Ok((functions, found.rejected))
}

/// DWARF written by hand (gimli's writer) into an ELF file (object's writer): the shapes a
/// hostile binary can take, which must end in a bounded time with the part marked, not a hang,
/// a stack overflow or a failure of the whole file.
#[cfg(test)]
mod crafted {
    use gimli::{
        DW_AT_abstract_origin, DW_AT_byte_size, DW_AT_data_member_location, DW_AT_encoding, DW_AT_high_pc,
        DW_AT_language, DW_AT_low_pc, DW_AT_name, DW_AT_type, DW_TAG_base_type, DW_TAG_formal_parameter, DW_TAG_member,
        DW_TAG_pointer_type, DW_TAG_structure_type, DW_TAG_subprogram, DW_TAG_typedef,
        write::{Address, AttributeValue, DwarfUnit, EndianVec, Sections, UnitEntryId},
    };

    use super::*;
    use crate::debuginfo::types::Kind;

    fn elf_with(dwarf: &mut DwarfUnit) -> Vec<u8> {
        let mut sections = Sections::new(EndianVec::new(gimli::LittleEndian));
        dwarf.write(&mut sections).unwrap();
        let mut obj = object::write::Object::new(
            object::BinaryFormat::Elf,
            object::Architecture::X86_64,
            object::Endianness::Little,
        );
        sections
            .for_each(|id, data| -> Result<(), ()> {
                if !data.slice().is_empty() {
                    let s = obj.add_section(Vec::new(), id.name().as_bytes().to_vec(), object::SectionKind::Debug);
                    obj.append_section_data(s, data.slice(), 1);
                }
                Ok(())
            })
            .unwrap();
        obj.write().unwrap()
    }

    fn string(s: &str) -> AttributeValue {
        AttributeValue::String(s.as_bytes().to_vec())
    }

    /// A C unit with one function at 0x1000 whose parameters have the given types, and the
    /// function's own DIE for more mischief.
    fn unit_with(params: impl FnOnce(&mut DwarfUnit) -> Vec<UnitEntryId>) -> (DwarfUnit, UnitEntryId) {
        let encoding = gimli::Encoding { format: gimli::Format::Dwarf32, version: 5, address_size: 8 };
        let mut dwarf = DwarfUnit::new(encoding);
        let root = dwarf.unit.root();
        let cu = dwarf.unit.get_mut(root);
        cu.set(DW_AT_language, AttributeValue::Language(gimli::DW_LANG_C11));
        cu.set(DW_AT_low_pc, AttributeValue::Address(Address::Constant(0x1000)));
        cu.set(DW_AT_high_pc, AttributeValue::Udata(0x100));
        let types = params(&mut dwarf);
        let f = dwarf.unit.add(root, DW_TAG_subprogram);
        let die = dwarf.unit.get_mut(f);
        die.set(DW_AT_name, string("f"));
        // External, and no locations: the psABI places the parameters (DWARF has nothing to say).
        die.set(gimli::DW_AT_external, AttributeValue::Flag(true));
        die.set(DW_AT_low_pc, AttributeValue::Address(Address::Constant(0x1000)));
        die.set(DW_AT_high_pc, AttributeValue::Udata(0x10));
        for (i, ty) in types.into_iter().enumerate() {
            let p = dwarf.unit.add(f, DW_TAG_formal_parameter);
            let die = dwarf.unit.get_mut(p);
            die.set(DW_AT_name, string(&format!("p{i}")));
            die.set(DW_AT_type, AttributeValue::UnitRef(ty));
        }
        (dwarf, f)
    }

    fn read(dwarf: &mut DwarfUnit) -> FunctionInfo {
        let elf = elf_with(dwarf);
        let found = DebugInfo::find(Path::new("crafted"), &elf, &DebugSearch { debug_dirs: vec![] }).unwrap();
        let mut functions = found.info.unwrap().functions(&[0x1000]).unwrap();
        functions.remove(&0x1000).expect("the function is read")
    }

    #[test]
    fn types_that_contain_themselves_are_marked_not_followed_forever() {
        let (mut dwarf, _) = unit_with(|d| {
            let root = d.unit.root();
            // typedef t t;
            let looped = d.unit.add(root, DW_TAG_typedef);
            d.unit.get_mut(looped).set(DW_AT_name, string("t"));
            d.unit.get_mut(looped).set(DW_AT_type, AttributeValue::UnitRef(looped));
            // struct s { struct s inner; } of 8 bytes
            let s = d.unit.add(root, DW_TAG_structure_type);
            d.unit.get_mut(s).set(DW_AT_name, string("s"));
            d.unit.get_mut(s).set(DW_AT_byte_size, AttributeValue::Udata(8));
            let m = d.unit.add(s, DW_TAG_member);
            d.unit.get_mut(m).set(DW_AT_type, AttributeValue::UnitRef(s));
            d.unit.get_mut(m).set(DW_AT_data_member_location, AttributeValue::Udata(0));
            // A pointer to itself: its name is bounded.
            let p = d.unit.add(root, DW_TAG_pointer_type);
            d.unit.get_mut(p).set(DW_AT_type, AttributeValue::UnitRef(p));
            // And an ordinary int after them, whose place depends on theirs.
            let int = d.unit.add(root, DW_TAG_base_type);
            d.unit.get_mut(int).set(DW_AT_name, string("int"));
            d.unit.get_mut(int).set(DW_AT_byte_size, AttributeValue::Udata(4));
            d.unit.get_mut(int).set(DW_AT_encoding, AttributeValue::Encoding(gimli::DW_ATE_signed));
            vec![looped, s, p, int]
        });
        let f = read(&mut dwarf);
        let params = f.signature.unwrap().params;
        assert!(
            matches!(&params[0].ty.kind, Kind::Unknown { why } if why.contains("contains itself")),
            "{:?}",
            params[0].ty
        );
        let Kind::Aggregate(s) = &params[1].ty.kind else { panic!("{:?}", params[1].ty) };
        assert_eq!(s.leaves, None, "a member that is the struct itself is not modelled");
        assert_eq!(params[2].ty.kind, Kind::Pointer);
        assert!(params[2].ty.name.len() < 200, "{}", params[2].ty.name);
        // The typedef's place is unknown, and so is every later one (registers may have shifted).
        assert!(matches!(&params[0].entry, Err(abi::Unknown::Type(_))));
        assert!(matches!(&params[3].entry, Err(abi::Unknown::Type(why)) if why.starts_with("an earlier parameter")));
    }

    #[test]
    fn an_origin_that_points_to_itself_ends() {
        let (mut dwarf, f) = unit_with(|_| Vec::new());
        dwarf.unit.get_mut(f).set(DW_AT_abstract_origin, AttributeValue::UnitRef(f));
        let info = read(&mut dwarf);
        assert_eq!(info.name, "f");
    }
}
