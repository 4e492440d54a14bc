//! The functions of a stripped Go file, read from its `.gopclntab`: the table Go's runtime keeps
//! for its own tracebacks, so it survives `strip` and `-ldflags=-s` (Go's `debug/gosym`,
//! `go tool nm` and profilers name functions from it too).
//!
//! Layout (Go 1.18+, `runtime/symtab.go`, `debug/gosym/pclntab.go`): a header (`pcHeader`: magic
//! `0xfffffff0` for Go 1.18-1.19, `0xfffffff1` from 1.20; two zero bytes; the pc quantum; the
//! pointer size; then eight pointer-sized words: nfunc, nfiles, textStart and the offsets of
//! funcnametab, cutab, filetab, pctab and pclntab from the header's start). pclntab begins with
//! the function table, `nfunc` pairs of `u32` (entry offset from the start of the text, offset of
//! the function's `_func` from pclntab's start) and one `u32` (the end of the text); each `_func`
//! begins with `entryoff u32, nameoff i32, args i32, deferreturn u32, pcsp u32`, the same in 1.18
//! and 1.20. A function's name is the NUL-terminated string at `nameoff` in funcnametab; its size is
//! where its stack-pointer delta table (pcsp, a pc-value table in pctab) ends, as the linker's
//! symbol size is, bounded by the next function's entry.
//!
//! Names are those of the file's symbols had it kept them, with `·` written `.` as Go's linker
//! writes ELF symbols, except where the table says less: assembly functions have no `.abi0`
//! suffix, and what lies between a name's first `[` and last `]` (a generic function's type
//! arguments, an array length in `type..eq.[5]T`) is written `[...]`, as in Go's tracebacks.
//!
//! The file is untrusted: every offset is checked against the section, counts against the bytes
//! that would hold them, and nothing here panics or allocates more than the section's size allows.
//! Older layouts (before Go 1.18) are refused: the tracer needs Go 1.17's register ABI, and 1.17
//! files keep their symbols unless stripped, where this table has another layout (`0xfffffffa`).
//!
//! Why not a crate: the ones on crates.io that read this table are parts of reverse-engineering
//! tool kits (goblin-based, whole-binary analysers), and one read checked mislabels the magic of
//! 1.18 and 1.20; the part needed here is a hundred lines against Go's own source.

/// Magic of Go 1.18 and 1.19's table.
const MAGIC_GO118: u32 = 0xffff_fff0;
/// Magic from Go 1.20 on (the same layout for what is read here; `_func` gained `startLine`).
const MAGIC_GO120: u32 = 0xffff_fff1;
/// `_func` fields read: entryoff, nameoff, args, deferreturn, pcsp.
const FUNC_READ: usize = 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PclntabError {
    #[error("it has no .gopclntab (nor Go's function table in .data.rel.ro) and no .text")]
    Missing,
    #[error("its .gopclntab is too short ({0} bytes)")]
    Short(usize),
    #[error("its .gopclntab has magic {0:#010x}, not Go 1.18 or later's")]
    Magic(u32),
    #[error("its .gopclntab header is malformed: {0}")]
    Header(&'static str),
    #[error("its .gopclntab function {index} is malformed: {what}")]
    Function { index: usize, what: &'static str },
}

/// A function as the table gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoFunction {
    pub name: String,
    /// Virtual address of its entry.
    pub address: u64,
    /// Bytes of code (without the alignment padding before the next function).
    pub size: u64,
}

/// Where a linker leaves the table: Go's own linker in `.gopclntab`, or `.data.rel.ro.gopclntab`
/// in a position-independent executable; an external linker (cgo) merges the latter into
/// `.data.rel.ro`, where the table is found as `debug/gosym`'s callers find it without a section:
/// by its magic, at an 8-byte boundary, taken when the whole table then reads.
const SECTIONS: [&str; 2] = [".gopclntab", ".data.rel.ro.gopclntab"];
const MERGED_INTO: &str = ".data.rel.ro";

/// The functions of a Go ELF file's table (see [`functions`]).
pub fn of_file(file: &object::File) -> Result<Vec<GoFunction>, PclntabError> {
    use object::{Object as _, ObjectSection as _};
    let text = file.section_by_name(".text").ok_or(PclntabError::Missing)?;
    let text = text.address()..text.address().saturating_add(text.size());
    let data = |name: &str| file.section_by_name(name).and_then(|s| s.data().ok());
    if let Some(section) = SECTIONS.iter().find_map(|name| data(name)) {
        return functions(section, text);
    }
    let merged = data(MERGED_INTO).ok_or(PclntabError::Missing)?;
    let magics = [MAGIC_GO118.to_le_bytes(), MAGIC_GO120.to_le_bytes()];
    (0..merged.len())
        .step_by(8)
        .filter(|&at| merged.get(at..at + 4).is_some_and(|m| magics.iter().any(|magic| m == magic)))
        .find_map(|at| functions(&merged[at..], text.clone()).ok().filter(|f| !f.is_empty()))
        .ok_or(PclntabError::Missing)
}

/// Little-endian reads that fail instead of panicking.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u32(&self, at: usize) -> Option<u32> {
        let b = self.0.get(at..at.checked_add(4)?)?;
        Some(u32::from_le_bytes(b.try_into().ok()?))
    }

    fn word(&self, at: usize, size: usize) -> Option<u64> {
        let b = self.0.get(at..at.checked_add(size)?)?;
        Some(match size {
            4 => u64::from(u32::from_le_bytes(b.try_into().ok()?)),
            _ => u64::from_le_bytes(b.try_into().ok()?),
        })
    }
}

/// The functions of a `.gopclntab` (`section`) whose code lies in `text` (the `.text` section's
/// addresses). Entries are offsets from the header's textStart (`runtime.text`): after C's code
/// where an external linker put that first, so it is read from the header; where that word is
/// left for a relocation to fill (zero) or lies outside `text`, the start of `.text` is taken, as
/// `debug/gosym` takes it. Sorted by address, one per entry, each inside `text`.
pub fn functions(section: &[u8], text: std::ops::Range<u64>) -> Result<Vec<GoFunction>, PclntabError> {
    let data = Bytes(section);
    let magic = data.u32(0).ok_or(PclntabError::Short(section.len()))?;
    if magic != MAGIC_GO118 && magic != MAGIC_GO120 {
        return Err(PclntabError::Magic(magic));
    }
    let (pad, quantum, ptr_size) = match section.get(4..8) {
        Some(&[a, b, q, p]) => (a | b, q, usize::from(p)),
        _ => return Err(PclntabError::Short(section.len())),
    };
    if pad != 0 || !matches!(quantum, 1 | 2 | 4) || !matches!(ptr_size, 4 | 8) {
        return Err(PclntabError::Header("padding, pc quantum or pointer size"));
    }
    let word = |i: usize| data.word(8 + i * ptr_size, ptr_size).ok_or(PclntabError::Short(section.len()));
    let offset = |i: usize| -> Result<usize, PclntabError> {
        usize::try_from(word(i)?)
            .ok()
            .filter(|&o| o < section.len())
            .ok_or(PclntabError::Header("a table offset is past the section's end"))
    };
    let nfunc = word(0)?;
    let text_start = Some(word(2)?).filter(|start| text.contains(start)).unwrap_or(text.start);
    let (funcnames, cutab, pctab, pcln) = (offset(3)?, offset(4)?, offset(6)?, offset(7)?);
    if funcnames >= cutab {
        return Err(PclntabError::Header("the function names do not precede the compilation unit table"));
    }
    let names = &section[funcnames..cutab];
    let pcvalues = &section[pctab..];
    let table = Bytes(&section[pcln..]);
    // Each function takes 8 bytes of the table: a count larger than the bytes left is a lie,
    // refused before anything is allocated for it.
    let nfunc = usize::try_from(nfunc)
        .ok()
        .filter(|&n| n <= table.0.len() / 8)
        .ok_or(PclntabError::Header("more functions than the table has room for"))?;
    let text_end = table.u32(nfunc * 8).ok_or(PclntabError::Header("the table has no end entry"))?;

    // Steps of pc-value tables decoded, in all: each takes at least two bytes of pctab, and Go
    // shares a table between functions only where they are the same, so a real file needs far fewer
    // than the section has bytes; a hostile one whose functions all point into one long table would
    // make the walk quadratic. Past the budget, sizes are the spans to the next entry.
    let mut steps = section.len();
    let mut functions = Vec::with_capacity(nfunc);
    for index in 0..nfunc {
        let bad = |what| PclntabError::Function { index, what };
        let (entry, func) = (table.u32(index * 8), table.u32(index * 8 + 4));
        let (Some(entry), Some(func)) = (entry, func) else { return Err(bad("outside the table")) };
        let next = if index + 1 < nfunc { table.u32((index + 1) * 8) } else { Some(text_end) };
        let next = next.ok_or(bad("outside the table"))?;
        if next <= entry {
            return Err(bad("entries are not in increasing order"));
        }
        let func = usize::try_from(func).map_err(|_| bad("its record is outside the table"))?;
        let record =
            table.0.get(func..).filter(|r| r.len() >= FUNC_READ).ok_or(bad("its record is outside the table"))?;
        let record = Bytes(record);
        let (Some(own_entry), Some(name), Some(pcsp)) = (record.u32(0), record.u32(4), record.u32(16)) else {
            return Err(bad("its record is outside the table"));
        };
        if own_entry != entry {
            return Err(bad("its record names another entry"));
        }
        let name =
            usize::try_from(name).ok().and_then(|n| names.get(n..)).ok_or(bad("its name is outside the names"))?;
        let end = name.iter().position(|&b| b == 0).ok_or(bad("its name is not terminated"))?;
        let name = std::str::from_utf8(&name[..end]).map_err(|_| bad("its name is not UTF-8"))?;
        if name.is_empty() {
            return Err(bad("its name is empty"));
        }
        let span = u64::from(next - entry);
        let address = text_start.checked_add(u64::from(entry));
        if address.and_then(|a| a.checked_add(span)).is_none_or(|end| end > text.end) {
            return Err(bad("its code is outside .text"));
        }
        let address = address.unwrap_or_default();
        let size = pcvalue_end(pcvalues, pcsp, quantum, span, &mut steps).filter(|&s| s > 0).unwrap_or(span);
        // `·` as `.`, as Go's linker writes the names of its ELF symbols.
        functions.push(GoFunction { name: name.replace('·', "."), address, size });
    }
    Ok(functions)
}

/// Where a pc-value table (`pctab[at..]`) ends: the sum of its pc deltas, each a varint times the
/// pc quantum, up to the first zero value delta after the first pair (Go's `runtime.step`).
/// `None` when the table runs off the section, does not decode, goes past `span` or takes more
/// than the `steps` left.
fn pcvalue_end(pctab: &[u8], at: u32, quantum: u8, span: u64, steps: &mut usize) -> Option<u64> {
    if at == 0 {
        // Offset 0 is Go's "no table".
        return None;
    }
    let mut rest = pctab.get(usize::try_from(at).ok()?..)?;
    let mut pc = 0u64;
    let mut first = true;
    loop {
        if rest.first() == Some(&0) && !first {
            return Some(pc);
        }
        let (_value_delta, used) = uvarint32(rest)?;
        rest = &rest[used..];
        let (pc_delta, used) = uvarint32(rest)?;
        rest = &rest[used..];
        pc = pc.checked_add(u64::from(pc_delta) * u64::from(quantum)).filter(|&pc| pc <= span)?;
        *steps = steps.checked_sub(1)?;
        first = false;
    }
}

/// A Go varint as the runtime reads pc-value tables: at most 5 bytes, a `u32`.
fn uvarint32(bytes: &[u8]) -> Option<(u32, usize)> {
    let mut value = 0u32;
    for (i, &b) in bytes.iter().enumerate().take(5) {
        value |= u32::from(b & 0x7f).checked_shl(7 * i as u32)?;
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: std::ops::Range<u64> = 0x401000..0x500000;

    /// A table in Go 1.18's layout with these (entry offset, name, code size, span to the next).
    fn table(functions: &[(u32, &str, u32)], text_len: u32) -> Vec<u8> {
        let mut names = Vec::new();
        let mut name_offsets = Vec::new();
        for (_, name, _) in functions {
            name_offsets.push(names.len() as u32);
            names.extend_from_slice(name.as_bytes());
            names.push(0);
        }
        // pctab: a leading zero byte (offset 0 means "none"), then one pcsp table per function:
        // value +8 over the whole size, then the terminator.
        let mut pctab = vec![0u8];
        let mut pcsp = Vec::new();
        for (_, _, size) in functions {
            pcsp.push(pctab.len() as u32);
            pctab.extend_from_slice(&[0x10]);
            let mut s = *size;
            loop {
                let b = (s & 0x7f) as u8;
                s >>= 7;
                pctab.push(if s == 0 { b } else { b | 0x80 });
                if s == 0 {
                    break;
                }
            }
            pctab.push(0);
        }
        let header_len = 8 + 8 * 8;
        let funcnames = header_len;
        let cutab = funcnames + names.len();
        let pctab_at = cutab + 4;
        let pcln = pctab_at + pctab.len();
        let mut pclntab = Vec::new();
        let records_at = functions.len() * 8 + 4;
        for (i, (entry, _, _)) in functions.iter().enumerate() {
            pclntab.extend_from_slice(&entry.to_le_bytes());
            pclntab.extend_from_slice(&((records_at + i * 40) as u32).to_le_bytes());
        }
        pclntab.extend_from_slice(&text_len.to_le_bytes());
        for (i, (entry, _, _)) in functions.iter().enumerate() {
            let mut record = [0u8; 40];
            record[0..4].copy_from_slice(&entry.to_le_bytes());
            record[4..8].copy_from_slice(&name_offsets[i].to_le_bytes());
            record[16..20].copy_from_slice(&pcsp[i].to_le_bytes());
            pclntab.extend_from_slice(&record);
        }
        let mut out = MAGIC_GO118.to_le_bytes().to_vec();
        out.extend_from_slice(&[0, 0, 1, 8]);
        for w in [functions.len(), 1, 0x401000, funcnames, cutab, cutab + 2, pctab_at, pcln] {
            out.extend_from_slice(&(w as u64).to_le_bytes());
        }
        out.extend_from_slice(&names);
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&pctab);
        out.extend_from_slice(&pclntab);
        out
    }

    #[test]
    fn reads_names_addresses_and_sizes() {
        let data = table(&[(0, "main.main", 0x5b), (0x60, "main.(*T).M", 0x200), (0x260, "runtime.goexit", 1)], 0x280);
        let got = functions(&data, TEXT).unwrap();
        let want = [("main.main", 0x401000, 0x5b), ("main.(*T).M", 0x401060, 0x200), ("runtime.goexit", 0x401260, 1)];
        let got: Vec<(&str, u64, u64)> = got.iter().map(|f| (f.name.as_str(), f.address, f.size)).collect();
        assert_eq!(got, want);
        // From Go 1.20 the magic differs and the fields read stay where they were.
        let mut go120 = data.clone();
        go120[0..4].copy_from_slice(&MAGIC_GO120.to_le_bytes());
        assert_eq!(functions(&go120, TEXT).unwrap().len(), 3);
    }

    #[test]
    fn a_size_past_the_next_entry_or_without_pcsp_is_the_span() {
        let data = table(&[(0, "a", 0x100), (0x40, "b", 0)], 0x80);
        let got: Vec<u64> = functions(&data, TEXT).unwrap().iter().map(|f| f.size).collect();
        assert_eq!(got, [0x40, 0x40]);
    }

    /// An external linker puts C's code first in `.text`: entries count from the header's
    /// textStart. Where that is zero (left for a relocation) or outside `.text`, from `.text`.
    #[test]
    fn entries_count_from_the_header_text_start_inside_text() {
        let mut data = table(&[(0, "main.main", 0x10)], 0x20);
        let start = |data: &[u8]| functions(data, 0x400f00..0x500000).unwrap()[0].address;
        assert_eq!(start(&data), 0x401000);
        data[24..32].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(start(&data), 0x400f00);
        data[24..32].copy_from_slice(&0x600000u64.to_le_bytes());
        assert_eq!(start(&data), 0x400f00);
        // Code past the end of .text is refused.
        assert!(matches!(functions(&data, 0x400f00..0x400f08), Err(PclntabError::Function { index: 0, .. })));
    }

    #[test]
    fn refuses_other_layouts_and_lies() {
        let good = table(&[(0, "main.main", 0x10), (0x20, "main.f", 0x10)], 0x40);
        assert_eq!(functions(&[], TEXT), Err(PclntabError::Short(0)));
        let mut old = good.clone();
        old[0..4].copy_from_slice(&0xffff_fffau32.to_le_bytes());
        assert_eq!(functions(&old, TEXT), Err(PclntabError::Magic(0xffff_fffa)));
        let mut huge = good.clone();
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(functions(&huge, TEXT), Err(PclntabError::Header(_))));
        let mut unsorted = good.clone();
        let pcln = u64::from_le_bytes(good[8 + 7 * 8..8 + 8 * 8].try_into().unwrap()) as usize;
        unsorted[pcln + 8..pcln + 12].copy_from_slice(&0u32.to_le_bytes());
        assert!(matches!(functions(&unsorted, TEXT), Err(PclntabError::Function { index: 0, .. })));
        let mut other_entry = good.clone();
        let record = pcln + 2 * 8 + 4;
        other_entry[record] = 7;
        assert!(matches!(functions(&other_entry, TEXT), Err(PclntabError::Function { index: 0, .. })));
    }

    /// Every prefix and every single-byte change of a valid table: an error or functions, never a
    /// panic, and never a function outside the text.
    #[test]
    fn hostile_bytes_never_panic() {
        let good = table(&[(0, "main.main", 0x10), (0x20, "main.f", 0x10), (0x40, "main.g", 0x30)], 0x80);
        for len in 0..good.len() {
            let _ = functions(&good[..len], TEXT);
        }
        for at in 0..good.len() {
            for value in [0x00, 0x01, 0x7f, 0x80, 0xff] {
                let mut bytes = good.clone();
                bytes[at] = value;
                if let Ok(functions) = functions(&bytes, TEXT) {
                    for f in functions {
                        assert!(f.size > 0 && TEXT.contains(&f.address) && f.address + f.size <= TEXT.end, "{f:?}");
                    }
                }
            }
        }
        let _ = functions(&good, u64::MAX - 1..u64::MAX);
    }

    #[test]
    fn varints() {
        assert_eq!(uvarint32(&[0x05]), Some((5, 1)));
        assert_eq!(uvarint32(&[0x80, 0x01]), Some((128, 2)));
        assert_eq!(uvarint32(&[0x80; 6]), None);
        assert_eq!(uvarint32(&[]), None);
        let end = |pctab: &[u8], quantum, span, mut steps| pcvalue_end(pctab, 1, quantum, span, &mut steps);
        assert_eq!(end(&[0, 0x10, 0x05, 0x02, 0x03, 0], 1, 100, 10), Some(8));
        assert_eq!(end(&[0, 0x10, 0x05, 0x02, 0x03, 0], 4, 100, 10), Some(32));
        assert_eq!(end(&[0, 0x10, 0x05], 1, 100, 10), None, "runs off the end");
        assert_eq!(end(&[0, 0x10, 0x05, 0x02, 0x03, 0], 1, 7, 10), None, "past the next entry");
        assert_eq!(end(&[0, 0x10, 0x05, 0x02, 0x03, 0], 1, 100, 1), None, "past the budget");
        assert_eq!(pcvalue_end(&[0, 0x10, 0x05, 0], 0, 1, 100, &mut 10), None, "offset 0 is no table");
    }

    /// Debian's gofmt (golang-go, which `cargo xtask setup` installs), in the GOROOT of the `go`
    /// on PATH: a stripped Go 1.19 executable.
    fn debian_gofmt() -> std::path::PathBuf {
        let out = std::process::Command::new("go").args(["env", "GOROOT"]).output();
        let out = out.expect("go on PATH (`cargo xtask setup` installs golang-go)");
        std::path::Path::new(String::from_utf8(out.stdout).unwrap().trim()).join("bin/gofmt")
    }

    #[test]
    fn reads_debian_stripped_gofmt() {
        use crate::functions::symbols::{NamesFrom, Placement, SymbolTable};
        use object::{Object as _, ObjectSection as _};
        let path = debian_gofmt();
        let data = std::fs::read(&path).unwrap();
        let file = object::File::parse(&*data).unwrap();
        assert!(file.symbols().next().is_none(), "{} has symbols", path.display());
        let text = file.section_by_name(".text").unwrap();
        let text = text.address()..text.address() + text.size();
        let functions = of_file(&file).unwrap();
        assert!(functions.len() > 2000, "{}", functions.len());
        assert!(functions.windows(2).all(|w| w[0].address + w[0].size <= w[1].address));
        assert!(functions.iter().all(|f| text.contains(&f.address) && f.address + f.size <= text.end));

        let table = SymbolTable::load(&path).unwrap();
        assert_eq!(table.names_from, NamesFrom::GoPclntab);
        assert!(table.go.as_ref().unwrap().version.as_deref().unwrap().starts_with("go1."));
        assert_eq!(table.functions.len(), functions.len());
        for name in ["main.main", "main.processFile", "go/printer.(*printer).print", "go/parser.(*parser).next"] {
            let f = table.functions.iter().find(|f| f.name == name).unwrap_or_else(|| panic!("{name}"));
            let Placement::Go { entry, returns, .. } = &f.placement else { panic!("{name}: {:?}", f.placement) };
            assert!(*entry > f.file_offset && !returns.is_empty(), "{name}: after the stack check, with returns");
        }
    }

    /// The real table, cut short anywhere and with bytes changed anywhere: an error or functions
    /// inside the text, never a panic.
    #[test]
    fn a_truncated_or_corrupted_real_table_never_panics() {
        use object::{Object as _, ObjectSection as _};
        let data = std::fs::read(debian_gofmt()).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let section = file.section_by_name(".gopclntab").unwrap().data().unwrap().to_vec();
        let text = file.section_by_name(".text").unwrap();
        let text = text.address()..text.address() + text.size();
        let whole = functions(&section, text.clone()).unwrap();
        // Cut short, it reads as a whole only where what is gone was never read (the last
        // function's tables past its pcsp).
        for len in (0..section.len()).step_by(997).chain([section.len() - 1]) {
            if let Ok(got) = functions(&section[..len], text.clone()) {
                assert_eq!(got, whole, "cut to {len} bytes");
            }
        }
        // A xorshift walk over positions and values, the same on every run.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..300 {
            let mut bytes = section.clone();
            for _ in 0..4 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let at = (state % bytes.len() as u64) as usize;
                // Mostly the header and the function table, where offsets live.
                let at = if state & 1 == 0 { at % 4096 } else { at };
                bytes[at] = (state >> 32) as u8;
            }
            if let Ok(got) = functions(&bytes, text.clone()) {
                assert!(got.len() <= whole.len());
                assert!(got.iter().all(|f| f.size > 0 && text.contains(&f.address) && f.address + f.size <= text.end));
            }
        }
    }
}
