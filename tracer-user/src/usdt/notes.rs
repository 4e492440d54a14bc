//! The USDT probes of an ELF file: its `.note.stapsdt` notes, read with the `object` crate.
//!
//! Each note (name `stapsdt`, type 3) describes one probe site: the address of its instruction,
//! the link-time address of `_.stapsdt.base`, the address of its semaphore (0 for none), then the
//! NUL-terminated provider, name and argument string. If the file was moved by a prelinker, its
//! `.stapsdt.base` section is no longer where the note says: the difference moves the probe and
//! the semaphore too. A uprobe attaches at a file offset and the kernel bumps a semaphore at a
//! file offset, so both addresses are turned into offsets through the loadable segments.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use object::{
    Endianness, Object as _, ObjectSymbol as _,
    elf::PT_LOAD,
    read::elf::{ElfFile64, FileHeader as _, ProgramHeader as _, SectionHeader as _},
};

use super::args::{ArgError, ArgReason, ArgSpec, Location, Register, parse_args};

/// `NT_STAPSDT`.
const NOTE_TYPE: u32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum NoteError {
    #[error("cannot read {path}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a 64-bit ELF file ({reason})")]
    NotElf { path: PathBuf, reason: String },
    #[error("{path} has a malformed .note.stapsdt section: {reason}")]
    Malformed { path: PathBuf, reason: String },
}

/// A probe's semaphore: the counter the kernel raises while a tracer is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Semaphore {
    /// Link-time address (after the `.stapsdt.base` adjustment).
    pub address: u64,
    /// Where it is in the file: the uprobe's `ref_ctr_offset`.
    pub file_offset: u64,
}

/// One probe site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsdtNote {
    pub provider: String,
    pub name: String,
    /// Link-time address of the probe instruction (after the `.stapsdt.base` adjustment).
    pub address: u64,
    /// Where the probe instruction is in the file: what the uprobe attaches to.
    pub file_offset: u64,
    pub semaphore: Option<Semaphore>,
    /// The argument string as the note has it (`8@%rdi -4@-12(%rbp)`).
    pub args_text: String,
    /// Each argument, parsed; a symbol (`counter(%rip)`) is already resolved to an offset from the
    /// probe's address. An argument the tracer cannot evaluate is an error, the others still count.
    pub args: Vec<Result<ArgSpec, ArgError>>,
}

/// Why a probe note was skipped (the file's other notes are still used).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SkippedNote {
    #[error("a probe note of {0} bytes is too short")]
    TooShort(usize),
    #[error("a probe note is cut short")]
    CutShort,
    #[error("{probe} at {address:#x} is in no loadable segment of the file")]
    Unloaded { probe: String, address: u64 },
    #[error("{probe} has its semaphore at {address:#x}, which the file does not hold")]
    SemaphoreOutside { probe: String, address: u64 },
}

/// The probes of one file.
#[derive(Clone, Debug)]
pub struct UsdtFile {
    pub path: PathBuf,
    pub notes: Vec<UsdtNote>,
    /// Notes that were skipped, and why (a probe in no loadable segment, a cut note).
    pub skipped: Vec<SkippedNote>,
}

/// The `PT_LOAD` segments: (address, size in the file, file offset).
struct Segments(Vec<(u64, u64, u64)>);

impl Segments {
    /// The file offset of a link-time address, if the file holds it (not in `.bss`).
    fn file_offset(&self, address: u64) -> Option<u64> {
        self.0
            .iter()
            .find(|&&(start, size, _)| address >= start && address - start < size)
            .map(|&(start, _, offset)| address - start + offset)
    }
}

/// Splits a NUL-terminated string off the front of `bytes`.
fn c_string(bytes: &[u8]) -> Option<(String, &[u8])> {
    let end = bytes.iter().position(|&b| b == 0)?;
    Some((String::from_utf8_lossy(&bytes[..end]).into_owned(), &bytes[end + 1..]))
}

impl UsdtFile {
    pub fn load(path: &Path) -> Result<UsdtFile, NoteError> {
        let data = crate::mapped_file::MappedFile::open(path)
            .map_err(|source| NoteError::Read { path: path.to_owned(), source })?;
        Self::parse(path, &data)
    }

    pub fn parse(path: &Path, data: &[u8]) -> Result<UsdtFile, NoteError> {
        let not_elf = |reason: String| NoteError::NotElf { path: path.to_owned(), reason };
        let malformed = |reason: String| NoteError::Malformed { path: path.to_owned(), reason };
        let elf = ElfFile64::<Endianness>::parse(data).map_err(|e| not_elf(e.to_string()))?;
        let endian = elf.endian();
        let header = elf.elf_header();
        let segments = Segments(
            header
                .program_headers(endian, data)
                .map_err(|e| not_elf(e.to_string()))?
                .iter()
                .filter(|p| p.p_type(endian) == PT_LOAD)
                .map(|p| (p.p_vaddr(endian), p.p_filesz(endian), p.p_offset(endian)))
                .collect(),
        );
        let sections = elf.elf_section_table();
        let base_section = sections.section_by_name(endian, b".stapsdt.base").map(|(_, s)| s.sh_addr(endian));

        let mut file = UsdtFile { path: path.to_owned(), notes: Vec::new(), skipped: Vec::new() };
        for section in sections.iter() {
            let Some(notes) = section.notes(endian, data).map_err(|e| malformed(e.to_string()))? else { continue };
            for note in notes {
                let note = note.map_err(|e| malformed(e.to_string()))?;
                if note.name() != b"stapsdt" || note.n_type(endian) != NOTE_TYPE {
                    continue;
                }
                match Self::probe(note.desc(), base_section, &segments) {
                    Ok(probe) => file.notes.push(probe),
                    Err(reason) => file.skipped.push(reason),
                }
            }
        }
        file.resolve_symbols(&elf);
        Ok(file)
    }

    /// One note's description: three addresses, then provider, name and arguments.
    fn probe(desc: &[u8], base_section: Option<u64>, segments: &Segments) -> Result<UsdtNote, SkippedNote> {
        if desc.len() < 24 {
            return Err(SkippedNote::TooShort(desc.len()));
        }
        let word = |i: usize| u64::from_le_bytes(desc[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        let (pc, base, semaphore) = (word(0), word(1), word(2));
        let (provider, rest) = c_string(&desc[24..]).ok_or(SkippedNote::CutShort)?;
        let (name, rest) = c_string(rest).ok_or(SkippedNote::CutShort)?;
        let (args_text, _) = c_string(rest).unwrap_or_default();
        // A prelinked file moved everything by the same amount as `.stapsdt.base`.
        let shift = match base_section {
            Some(actual) if base != 0 => actual.wrapping_sub(base),
            _ => 0,
        };
        let address = pc.wrapping_add(shift);
        let file_offset = segments
            .file_offset(address)
            .ok_or_else(|| SkippedNote::Unloaded { probe: format!("{provider}:{name}"), address })?;
        let semaphore = match semaphore {
            0 => None,
            s => {
                let address = s.wrapping_add(shift);
                let file_offset = segments
                    .file_offset(address)
                    .ok_or_else(|| SkippedNote::SemaphoreOutside { probe: format!("{provider}:{name}"), address })?;
                Some(Semaphore { address, file_offset })
            }
        };
        let args = parse_args(&args_text);
        Ok(UsdtNote { provider, name, address, file_offset, semaphore, args_text, args })
    }

    /// Turns `symbol(%rip)` arguments into memory relative to the probe's address: the kernel sees
    /// the thread stopped at the probe, so `ip + (symbol - probe address)` is the symbol's address
    /// wherever the file was loaded.
    fn resolve_symbols(&mut self, elf: &ElfFile64<'_, Endianness>) {
        let mut wanted: BTreeMap<String, Option<u64>> = BTreeMap::new();
        for note in &self.notes {
            for arg in note.args.iter().flatten() {
                if let Location::Symbol { name, .. } = &arg.location {
                    wanted.insert(name.clone(), None);
                }
            }
        }
        if wanted.is_empty() {
            return;
        }
        for symbol in elf.symbols().chain(elf.dynamic_symbols()) {
            if let Ok(name) = symbol.name()
                && let Some(slot) = wanted.get_mut(name)
                && symbol.is_definition()
            {
                slot.get_or_insert(symbol.address());
            }
        }
        for note in &mut self.notes {
            let pc = note.address;
            for arg in &mut note.args {
                let Ok(spec) = arg else { continue };
                let Location::Symbol { name, offset } = &spec.location else { continue };
                *arg = match wanted.get(name).copied().flatten() {
                    Some(address) => Ok(ArgSpec {
                        location: Location::Memory {
                            base: Register::Ip,
                            index: None,
                            offset: (address as i64).wrapping_add(*offset).wrapping_sub(pc as i64),
                        },
                        ..spec.clone()
                    }),
                    None => Err(ArgError {
                        text: format!("{}{}@{name}{offset:+}(%rip)", if spec.signed { "-" } else { "" }, spec.size),
                        reason: ArgReason::UnknownSymbol(name.clone()),
                    }),
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    /// Compiles the `<sys/sdt.h>` fixture of the integration tests (`cargo xtask setup` installs
    /// systemtap-sdt-dev) into a temporary directory.
    fn sdt_fixture(extra: &[&str]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("sdt_probes");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/c");
        let status = Command::new("cc")
            .args(["-O1", "-o"])
            .arg(&out)
            .arg(src.join("sdt_probes.c"))
            .arg(src.join("sdt_gated.c"))
            .args(extra)
            .status()
            .unwrap();
        assert!(status.success(), "cc failed for the fixture in {}", src.display());
        (dir, out)
    }

    /// What `readelf -n` (binutils, an independent reader) says about a file's probes:
    /// (provider, name, location, base, semaphore, arguments).
    fn readelf(path: &Path) -> Vec<(String, String, u64, u64, u64, String)> {
        let out = Command::new("readelf").args(["-n", "--wide"]).arg(path).output().expect("readelf");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut probes = Vec::new();
        let mut lines = text.lines().map(str::trim);
        while let Some(line) = lines.next() {
            // With --wide the provider follows the note's owner on the same line.
            let Some(provider) = line.split("Provider: ").nth(1) else { continue };
            let name = lines.next().unwrap().strip_prefix("Name: ").unwrap();
            let location = lines.next().unwrap();
            let hex = |label: &str| {
                let at = location.find(label).unwrap() + label.len();
                let end = location[at..].find(',').map_or(location.len(), |e| at + e);
                u64::from_str_radix(location[at..end].trim().trim_start_matches("0x"), 16).unwrap()
            };
            let args = lines.next().unwrap().strip_prefix("Arguments:").unwrap().trim().to_string();
            probes.push((
                provider.to_string(),
                name.to_string(),
                hex("Location: "),
                hex("Base: "),
                hex("Semaphore: "),
                args,
            ));
        }
        probes
    }

    /// The notes agree with readelf's, and every probe's file offset holds a nop.
    fn check_against_readelf(path: &Path, file: &UsdtFile) {
        let expected = readelf(path);
        assert!(!expected.is_empty(), "readelf found no probes in {}", path.display());
        assert_eq!(file.notes.len(), expected.len(), "{:?}", file.notes);
        let bytes = std::fs::read(path).unwrap();
        for (note, (provider, name, location, _base, semaphore, args)) in file.notes.iter().zip(&expected) {
            assert_eq!((&note.provider, &note.name), (provider, name));
            assert_eq!(note.address, *location, "{name}: no prelink here, so no adjustment");
            assert_eq!(note.semaphore.map_or(0, |s| s.address), *semaphore, "{name}");
            assert_eq!(&note.args_text, args, "{name}");
            let at = note.file_offset as usize;
            let nop = bytes[at] == 0x90 || bytes[at..at + 5] == [0x0f, 0x1f, 0x44, 0x00, 0x00];
            assert!(nop, "{provider}:{name}: no nop at file offset {at:#x}: {:x?}", &bytes[at..at + 5]);
        }
    }

    fn note<'a>(file: &'a UsdtFile, name: &str) -> &'a UsdtNote {
        file.notes.iter().find(|n| n.name == name).unwrap_or_else(|| panic!("no probe {name}: {:?}", file.notes))
    }

    #[test]
    fn reads_a_program_built_with_sys_sdt_h() {
        for flags in [&["-pie", "-fPIE"][..], &["-no-pie", "-fno-pie"]] {
            let (_dir, path) = sdt_fixture(flags);
            let file = UsdtFile::load(&path).unwrap();
            assert!(file.skipped.is_empty(), "{:?}", file.skipped);
            check_against_readelf(&path, &file);
            assert!(file.notes.iter().all(|n| n.provider == "fixture"));

            // The semaphore is where the symbol table puts `fixture_gated_semaphore`, in the file.
            let bytes = std::fs::read(&path).unwrap();
            let elf = object::File::parse(&*bytes).unwrap();
            let symbol = elf.symbols().find(|s| s.name() == Ok("fixture_gated_semaphore")).unwrap();
            let gated = note(&file, "gated");
            let semaphore = gated.semaphore.expect("gated has a semaphore");
            assert_eq!(semaphore.address, symbol.address());
            assert_eq!(&bytes[semaphore.file_offset as usize..][..2], [0, 0], "a zero counter in the file");
            assert!(note(&file, "constants").semaphore.is_none());

            // Every argument of the fixture is one the tracer evaluates.
            for n in &file.notes {
                assert!(n.args.iter().all(Result::is_ok), "{}: {:?}", n.name, n.args);
            }
            let constants = note(&file, "constants");
            let sizes: Vec<(u8, bool)> = constants.args.iter().flatten().map(|a| (a.size, a.signed)).collect();
            assert_eq!(sizes, [(4, true), (8, true), (1, false), (2, true), (8, false)], "{}", constants.args_text);
        }
    }

    #[test]
    fn resolves_globals_relative_to_the_probe() {
        // -O2 -fPIE: GCC passes a global as `counter(%rip)`.
        let (_dir, path) = sdt_fixture(&["-O2", "-pie", "-fPIE"]);
        let file = UsdtFile::load(&path).unwrap();
        let global = note(&file, "global");
        assert!(global.args_text.contains("(%rip)"), "{}", global.args_text);
        let bytes = std::fs::read(&path).unwrap();
        let elf = object::File::parse(&*bytes).unwrap();
        let counter = elf.symbols().find(|s| s.name() == Ok("fixture_counter")).unwrap().address();
        let Ok(ArgSpec { location: Location::Memory { base: Register::Ip, index: None, offset }, .. }) =
            &global.args[0]
        else {
            panic!("{:?}", global.args)
        };
        assert_eq!(global.address as i64 + offset, counter as i64);
    }

    #[test]
    fn reads_libstdcxx_probes() {
        // Debian 12's glibc is built without probes; its libstdc++ has three (throw, rethrow,
        // catch), with memory operands and a prelink base.
        let path = Path::new("/lib/x86_64-linux-gnu/libstdc++.so.6");
        let file = UsdtFile::load(path).unwrap();
        check_against_readelf(path, &file);
        let names: Vec<&str> = file.notes.iter().map(|n| n.name.as_str()).collect();
        for probe in ["throw", "rethrow", "catch"] {
            assert!(names.contains(&probe), "{names:?}");
        }
        let throw = note(&file, "throw");
        assert_eq!(throw.provider, "libstdcxx");
        assert_eq!(
            throw.args,
            [
                Ok(ArgSpec { size: 8, signed: false, location: Location::Register(Register::Di) }),
                Ok(ArgSpec { size: 8, signed: false, location: Location::Register(Register::Si) }),
            ]
        );
    }

    #[test]
    fn applies_the_prelink_adjustment() {
        let segments = Segments(vec![(0x1000, 0x1000, 0x1000), (0x4000, 0x100, 0x3000)]);
        let mut desc = Vec::new();
        for word in [0x1010u64, 0x4000, 0x4010] {
            desc.extend_from_slice(&word.to_le_bytes());
        }
        desc.extend_from_slice(b"p\0n\08@%rdi\0");
        // `.stapsdt.base` is where the note says: nothing moves.
        let probe = UsdtFile::probe(&desc, Some(0x4000), &segments).unwrap();
        assert_eq!((probe.address, probe.file_offset), (0x1010, 0x1010));
        assert_eq!(probe.semaphore, Some(Semaphore { address: 0x4010, file_offset: 0x3010 }));
        // The file was moved down by 0x800 after linking: so were the probe and its semaphore.
        let segments = Segments(vec![(0x800, 0x1000, 0x1000), (0x3800, 0x100, 0x3000)]);
        let probe = UsdtFile::probe(&desc, Some(0x3800), &segments).unwrap();
        assert_eq!((probe.address, probe.file_offset), (0x810, 0x1010));
        assert_eq!(probe.semaphore, Some(Semaphore { address: 0x3810, file_offset: 0x3010 }));
        // A semaphore the file does not hold (in .bss) cannot be bumped by the kernel.
        let segments = Segments(vec![(0x1000, 0x1000, 0x1000)]);
        let err = UsdtFile::probe(&desc, Some(0x4000), &segments).unwrap_err();
        assert_eq!(err.to_string(), "p:n has its semaphore at 0x4010, which the file does not hold");
        assert!(UsdtFile::probe(&desc[..20], None, &segments).is_err());
        assert_eq!(UsdtFile::probe(&desc[..26], None, &segments).unwrap_err(), SkippedNote::CutShort);
    }

    #[test]
    fn a_file_without_probes_has_none() {
        let file = UsdtFile::load(Path::new("/bin/true")).unwrap();
        assert!(file.notes.is_empty());
        assert!(matches!(UsdtFile::parse(Path::new("x"), b"not elf"), Err(NoteError::NotElf { .. })));
    }
}
