//! The DWARF module (`tracer_user::debuginfo`) on the real fixture binaries: names, types, file
//! and line of definition, where each parameter is at entry, the probe layout, and the values
//! formatted from registers as the caller sets them. No root needed.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::json;
use tracer_tests::{fixture, temp_dir};
use tracer_user::{
    debuginfo::{
        DebugInfo, DebugOrigin, DebugSearch, FunctionInfo, Language, Signature,
        abi::{DwarfEntry, Place, Unknown},
        format::{format_params, format_return},
        layout::{
            CapturedString, DEFAULT_STRING_SIZE, FunctionLayout, LayoutError, ProbeLayout, Reg, Registers, StringKind,
            StringRead, StringStatus,
        },
    },
    functions::symbols::SymbolTable,
};

/// A fixture's functions as the tracer will read them: symbols first, then their DWARF.
struct Read {
    origin: DebugOrigin,
    by_name: BTreeMap<String, FunctionInfo>,
}

fn read_with(path: &Path, search: &DebugSearch) -> Read {
    let data = std::fs::read(path).unwrap();
    let symbols = SymbolTable::parse(path, &data).unwrap();
    let found = DebugInfo::find(path, &data, search).unwrap();
    let info = found.info.unwrap_or_else(|| panic!("no debug info for {}: {:?}", path.display(), found.rejected));
    let addresses: Vec<u64> = symbols.functions.iter().map(|f| f.address).collect();
    let mut functions = info.functions(&addresses).unwrap();
    let by_name =
        symbols.functions.iter().filter_map(|f| Some((f.name.clone(), functions.remove(&f.address)?))).collect();
    Read { origin: info.origin().clone(), by_name }
}

fn read(name: &str) -> Read {
    read_with(&fixture(name), &DebugSearch::default())
}

impl Read {
    fn get(&self, name: &str) -> &FunctionInfo {
        self.by_name.get(name).unwrap_or_else(|| panic!("no {name} in {:?}", self.by_name.keys().collect::<Vec<_>>()))
    }

    fn sig(&self, name: &str) -> &Signature {
        self.get(name).signature.as_ref().unwrap_or_else(|| panic!("{name} has no signature"))
    }
}

fn place(p: &Result<Place, Unknown>) -> String {
    match p {
        Ok(Place::Reg(r)) => r.name().into(),
        Ok(Place::RegPair(a, b)) => format!("{}:{}", a.name(), b.name()),
        Ok(Place::Reference(r)) => format!("&{}", r.name()),
        Ok(Place::Stack { offset, spilled: true }) => format!("stack+{offset}, no register left"),
        Ok(Place::Stack { offset, spilled: false }) => format!("stack+{offset}"),
        Ok(Place::Float) => "xmm".into(),
        Ok(Place::PartlyFloat) => "int+xmm".into(),
        Ok(Place::Split) => "split".into(),
        Ok(Place::Nothing) => "nothing".into(),
        Err(e) => format!("{e:?}"),
    }
}

/// `name: type @ place` for each parameter, then `-> type @ place`.
fn described(s: &Signature) -> Vec<String> {
    let mut out: Vec<String> = s
        .params
        .iter()
        .map(|p| format!("{}: {} @ {}", p.name.as_deref().unwrap_or("?"), p.ty.name, place(&p.entry)))
        .collect();
    if let Some(r) = &s.ret {
        out.push(format!("-> {} @ {}", r.ty.name, place(&r.place)));
    }
    out
}

fn source(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(rel)
}

/// The line of the one line of the fixture source that contains `text`: the oracle for
/// DW_AT_decl_line, read from the source rather than from DWARF.
fn line_of(rel: &str, text: &str) -> u32 {
    let src = std::fs::read_to_string(source(rel)).unwrap();
    let hits: Vec<usize> = src.lines().enumerate().filter(|(_, l)| l.contains(text)).map(|(i, _)| i + 1).collect();
    assert_eq!(hits.len(), 1, "{text:?} in {rel}: {hits:?}");
    hits[0] as u32
}

fn assert_defined_at(r: &Read, name: &str, rel: &str, text: &str) {
    let f = r.get(name);
    assert_eq!(f.file.as_deref(), Some(source(rel).as_path()), "{name}");
    assert_eq!(f.line, Some(line_of(rel, text)), "{name}");
}

/// The C fixture's parameters where each is at entry (the same at -O0, -O2 and with DWARF 4,
/// except `wide_int` at -O2: see `c_fixture_at_o2_is_cross_checked_with_location_lists`).
fn c_expected() -> Vec<(&'static str, &'static str, Vec<&'static str>)> {
    vec![
        (
            "ints",
            "FIXTURE int ints(",
            vec![
                "c: signed char @ rdi",
                "s: short int @ rsi",
                "i: int @ rdx",
                "l: long int @ rcx",
                "uc: unsigned char @ r8",
                "us: short unsigned int @ r9",
                "-> int @ rax",
            ],
        ),
        (
            "more_ints",
            "FIXTURE unsigned long more_ints(",
            vec![
                "ui: unsigned int @ rdi",
                "ul: long unsigned int @ rsi",
                "ll: long long int @ rdx",
                "t: u32_t @ rcx",
                "b: _Bool @ r8",
                "-> long unsigned int @ rax",
            ],
        ),
        (
            "text",
            "FIXTURE bool text(",
            vec![
                "c: char @ rdi",
                "name: const char * @ rsi",
                "buf: char * @ rdx",
                "bytes: const unsigned char * @ rcx",
                "col: enum color @ r8",
                "lv: enum level @ r9",
                "p: volatile long int * @ stack+0, no register left",
                "-> _Bool @ rax",
            ],
        ),
        ("greet", "FIXTURE const char *greet(", vec!["who: name_t @ rdi", "-> const char * @ rax"]),
        (
            "floats",
            "FIXTURE double floats(",
            vec![
                "d: double @ xmm",
                "f: float @ xmm",
                "after: int @ rdi",
                "ld: long double @ stack+0",
                "last: int @ rsi",
                "-> double @ xmm",
            ],
        ),
        (
            "structs",
            "FIXTURE long structs(",
            vec![
                "p: struct pair @ rdi",
                "w: struct wide @ rsi:rdx",
                "m: struct mixed @ int+xmm",
                "b: struct big @ stack+0",
                "u: union word @ r8",
                "after: int @ r9",
                "-> long int @ rax",
            ],
        ),
        (
            "eight",
            "FIXTURE int eight(",
            vec![
                "a: int @ rdi",
                "b: int @ rsi",
                "c: int @ rdx",
                "d: int @ rcx",
                "e: int @ r8",
                "f: int @ r9",
                "g: int @ stack+0, no register left",
                "h: int @ stack+8, no register left",
                "-> int @ rax",
            ],
        ),
        (
            "make_big",
            "FIXTURE struct big make_big(",
            vec!["seed: int @ rsi", "w: struct wide @ rdx:rcx", "-> struct big @ &rax"],
        ),
        ("swap_wide", "FIXTURE struct wide swap_wide(", vec!["w: struct wide @ rdi:rsi", "-> struct wide @ rax:rdx"]),
        (
            "wide_int",
            "FIXTURE __int128 wide_int(",
            vec!["v: __int128 @ rdi:rsi", "after: int @ rdx", "-> __int128 @ rax:rdx"],
        ),
        ("sum", "FIXTURE int sum(", vec!["count: int @ rdi", "-> int @ rax"]),
        ("nothing", "FIXTURE void nothing(", vec![]),
    ]
}

#[test]
fn c_fixture_at_o0_is_placed_by_the_system_v_abi() {
    let r = read("params");
    assert_eq!(r.origin, DebugOrigin::InFile);
    for (name, definition, expected) in c_expected() {
        assert_defined_at(&r, name, "c/params.c", definition);
        let s = r.sig(name);
        assert_eq!(described(s), expected, "{name}");
        assert!(!s.optimized, "{name}");
        assert_eq!(r.get(name).language, Language::C);
        // Unoptimised: DWARF has the stack slots the prologue fills, and the caller's stack area.
        for p in &s.params {
            assert!(matches!(p.dwarf, DwarfEntry::FrameSlot | DwarfEntry::At(Place::Stack { .. })), "{name}: {p:?}");
        }
    }
    assert!(r.sig("sum").variadic && !r.sig("eight").variadic);
    assert!(r.sig("nothing").ret.is_none(), "void returns nothing");
}

#[test]
fn c_fixture_at_o2_is_cross_checked_with_location_lists() {
    for (fixture_name, version) in [("params_o2", 5), ("params_dwarf4", 4)] {
        let r = read(fixture_name);
        let data = std::fs::read(fixture(fixture_name)).unwrap();
        assert!(dwarf_version(&data) == version, "{fixture_name} is DWARF {version}");
        for (name, definition, mut expected) in c_expected() {
            assert_defined_at(&r, name, "c/params.c", definition);
            let s = r.sig(name);
            if name == "wide_int" {
                // gcc 12 -O2 describes the __int128 with its halves swapped; the psABI binds an
                // external function at its symbol, so the two disagree and it is marked, not guessed.
                expected[0] = "v: __int128 @ Conflict { abi: RegPair(Rdi, Rsi), dwarf: RegPair(Rsi, Rdi) }";
            }
            assert_eq!(described(s), expected, "{fixture_name} {name}");
            assert_eq!(s.optimized, !s.params.is_empty(), "{fixture_name} {name}");
            // Every location DWARF gives at the entry pc is the ABI's (but that one).
            for p in &s.params {
                if let DwarfEntry::At(d) = &p.dwarf
                    && !(name == "wide_int" && p.name.as_deref() == Some("v"))
                {
                    assert!(p.abi.as_ref().is_ok_and(|a| a.same_as(d)), "{fixture_name} {name}: {p:?}");
                }
            }
        }
        // The compiler's registers, not just the ABI's: a location list starts at the entry pc.
        assert_eq!(r.sig("structs").params[1].dwarf, DwarfEntry::At(Place::RegPair(Reg::Rsi, Reg::Rdx)));
        assert_eq!(r.sig("floats").params[0].dwarf, DwarfEntry::At(Place::Float));
        assert_eq!(r.sig("eight").params[7].dwarf, DwarfEntry::At(Place::Stack { offset: 8, spilled: false }));
    }
}

/// The DWARF version of the first unit (byte 4..6 of .debug_info for 32-bit DWARF).
fn dwarf_version(data: &[u8]) -> u16 {
    use object::{Object as _, ObjectSection as _};
    let file = object::File::parse(data).unwrap();
    let info = file.section_by_name(".debug_info").unwrap().data().unwrap();
    u16::from_le_bytes([info[4], info[5]])
}

#[test]
fn types_are_modelled_with_width_sign_enumerators_and_strings() {
    use tracer_user::debuginfo::types::{Enumerator, Kind};
    let r = read("params");
    let text = r.sig("text");
    let kinds: Vec<&Kind> = text.params.iter().map(|p| &p.ty.kind).collect();
    assert_eq!(kinds[0], &Kind::Char { signed: true, unicode: false });
    assert_eq!(kinds[1], &Kind::CString, "const char *");
    assert_eq!(kinds[2], &Kind::CString, "char *");
    assert_eq!(kinds[3], &Kind::Pointer, "unsigned char * is a byte buffer, not a string");
    let Kind::Enum { signed: false, enumerators } = kinds[4] else { panic!("{:?}", kinds[4]) };
    let names: Vec<(&str, i128)> = enumerators.iter().map(|e| (e.name.as_str(), e.value)).collect();
    assert_eq!(names, [("RED", 1), ("GREEN", 2), ("BLUE", 4)]);
    let Kind::Enum { signed: true, enumerators } = kinds[5] else { panic!("{:?}", kinds[5]) };
    assert_eq!(enumerators[0], Enumerator { name: "LOW".into(), value: -1 });
    assert_eq!(text.params[4].ty.size, 4);
    // Typedefs are seen through, their names kept.
    let greet = r.sig("greet");
    assert_eq!((greet.params[0].ty.name.as_str(), &greet.params[0].ty.kind), ("name_t", &Kind::CString));
    let more = r.sig("more_ints");
    assert_eq!((more.params[3].ty.size, &more.params[3].ty.kind), (4, &Kind::Int { signed: false }));
    assert_eq!(more.params[4].ty.kind, Kind::Bool);
    let ints = r.sig("ints");
    let widths: Vec<(u64, bool)> = ints
        .params
        .iter()
        .map(|p| match p.ty.kind {
            Kind::Int { signed } => (p.ty.size, signed),
            ref k => panic!("{k:?}"),
        })
        .collect();
    assert_eq!(widths, [(1, true), (2, true), (4, true), (8, true), (1, false), (2, false)]);
    assert!(matches!(r.sig("floats").params[3].ty.kind, Kind::Float { x87: true }));
    assert_eq!(r.sig("structs").params[3].ty.size, 32);
}

#[test]
fn a_stripped_binary_finds_its_debug_file_by_debuglink_and_by_build_id() {
    let stripped = fixture("params_stripped");
    let debug_file = stripped.with_file_name("params_stripped.debug");
    let via_link = read("params_stripped");
    assert_eq!(via_link.origin, DebugOrigin::DebugLink(debug_file.clone()));
    for (name, definition, expected) in c_expected() {
        assert_defined_at(&via_link, name, "c/params.c", definition);
        assert_eq!(described(via_link.sig(name)), expected, "{name}");
    }

    // By build id, under a debug directory of our own (build ids come first, as in gdb).
    let dir = temp_dir();
    let id = build_id(&std::fs::read(&stripped).unwrap());
    let by_id = dir.path().join(".build-id").join(&id[..2]).join(format!("{}.debug", &id[2..]));
    std::fs::create_dir_all(by_id.parent().unwrap()).unwrap();
    std::fs::copy(&debug_file, &by_id).unwrap();
    let search = DebugSearch { debug_dirs: vec![dir.path().to_path_buf()] };
    let via_id = read_with(&stripped, &search);
    assert_eq!(via_id.origin, DebugOrigin::BuildId(by_id));
    assert_eq!(via_id.by_name, via_link.by_name);
}

fn build_id(data: &[u8]) -> String {
    use object::Object as _;
    let file = object::File::parse(data).unwrap();
    file.build_id().unwrap().unwrap().iter().map(|b| format!("{b:02x}")).collect()
}

/// A copy of the stripped fixture in a fresh directory (so that its own debug file is not
/// beside it), its debuglink optionally replaced by `link` (name, CRC).
fn stripped_copy(dir: &Path, link: Option<(&str, u32)>) -> PathBuf {
    let copy = dir.join("bin").join("params_stripped");
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    std::fs::copy(fixture("params_stripped"), &copy).unwrap();
    if let Some((name, crc)) = link {
        let mut section = name.as_bytes().to_vec();
        section.push(0);
        while section.len() % 4 != 0 {
            section.push(0);
        }
        section.extend_from_slice(&crc.to_le_bytes());
        let blob = dir.join("debuglink");
        std::fs::write(&blob, section).unwrap();
        let status = std::process::Command::new("objcopy")
            .arg("--remove-section=.gnu_debuglink")
            .arg(format!("--add-section=.gnu_debuglink={}", blob.display()))
            .arg(&copy)
            .status()
            .unwrap();
        assert!(status.success());
    }
    copy
}

fn find_in(path: &Path) -> tracer_user::debuginfo::Found<'static> {
    let data: &'static [u8] = Box::leak(std::fs::read(path).unwrap().into_boxed_slice());
    DebugInfo::find(path, data, &DebugSearch { debug_dirs: vec![] }).unwrap()
}

#[test]
fn a_debug_file_whose_crc_differs_is_refused_and_said_why() {
    let dir = temp_dir();
    let copy = stripped_copy(dir.path(), None);
    let mut debug = std::fs::read(fixture("params_stripped").with_file_name("params_stripped.debug")).unwrap();
    let last = debug.len() - 1;
    debug[last] ^= 0xff;
    let beside = copy.with_file_name("params_stripped.debug");
    std::fs::write(&beside, &debug).unwrap();
    let found = find_in(&copy);
    assert!(found.info.is_none());
    assert_eq!(found.rejected.len(), 1, "{:?}", found.rejected);
    assert_eq!(found.rejected[0].path, beside);
    assert!(found.rejected[0].why.to_string().starts_with("its CRC-32 is "), "{:?}", found.rejected);
}

#[test]
fn a_debuglink_that_leaves_its_directory_is_refused() {
    // A valid debug file one directory up, with the right CRC: the link must still not reach it.
    let dir = temp_dir();
    let debug = std::fs::read(fixture("params_stripped").with_file_name("params_stripped.debug")).unwrap();
    std::fs::write(dir.path().join("secret.debug"), &debug).unwrap();
    let crc = crc32(&debug);
    for name in ["../secret.debug", "/etc/passwd", "..", ""] {
        let copy = stripped_copy(dir.path(), Some((name, crc)));
        let found = find_in(&copy);
        assert!(found.info.is_none(), "{name:?}");
        assert_eq!(found.rejected.len(), 1, "{name:?}: {:?}", found.rejected);
        assert_eq!(found.rejected[0].why.to_string(), "a .gnu_debuglink that is not a plain file name");
    }
}

/// CRC-32 (IEEE), bit by bit: an oracle independent of the crate the tracer uses.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xedb8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

#[test]
fn a_fifo_in_place_of_the_debug_file_is_refused_without_blocking() {
    let dir = temp_dir();
    let copy = stripped_copy(dir.path(), None);
    let fifo = copy.with_file_name("params_stripped.debug");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let (tx, rx) = std::sync::mpsc::channel();
    let path = copy.clone();
    std::thread::spawn(move || tx.send(find_in(&path).rejected).unwrap());
    let rejected = rx.recv_timeout(Duration::from_secs(10)).expect("looking for a debug file blocked on a FIFO");
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!(
        (rejected[0].path.as_path(), rejected[0].why.to_string()),
        (fifo.as_path(), "not a regular file".into())
    );
}

/// The offset in the file of a section's contents.
fn section_offset(data: &[u8], name: &str) -> usize {
    use object::{Object as _, ObjectSection as _};
    let file = object::File::parse(data).unwrap();
    file.section_by_name(name).unwrap().file_range().unwrap().0 as usize
}

#[test]
fn compressed_debug_sections_are_read_and_a_lying_size_is_refused() {
    let dir = temp_dir();
    let compressed = dir.path().join("params_compressed");
    let status = std::process::Command::new("objcopy")
        .arg("--compress-debug-sections=zlib")
        .arg(fixture("params"))
        .arg(&compressed)
        .status()
        .unwrap();
    assert!(status.success());
    let plain = read("params");
    let read_back = read_with(&compressed, &DebugSearch::default());
    assert_eq!(read_back.by_name, plain.by_name, "the same DWARF, compressed");

    // Elf64_Chdr: ch_type (4), reserved (4), ch_size (8): claim a terabyte.
    let mut data = std::fs::read(&compressed).unwrap();
    let chdr = section_offset(&data, ".debug_info");
    data[chdr + 8..chdr + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let liar = dir.path().join("params_liar");
    std::fs::write(&liar, &data).unwrap();
    let found = find_in(&liar);
    let err = found.info.unwrap().functions(&[0x1139]).unwrap_err().to_string();
    assert!(err.starts_with("cannot read section .debug_info of "), "{err}");
    assert!(
        err.ends_with(&format!("it claims {} bytes uncompressed from {} compressed", 1u64 << 40, {
            use object::{Object as _, ObjectSection as _};
            let f = object::File::parse(&*data).unwrap();
            f.section_by_name(".debug_info").unwrap().file_range().unwrap().1 - 24
        })),
        "{err}"
    );
}

#[test]
fn line_tables_only_debug_info_gives_file_and_line_but_no_signature() {
    let dir = temp_dir();
    let g1 = dir.path().join("params_g1");
    let status = std::process::Command::new("cc")
        .args(["-g1", "-O0", "-o"])
        .arg(&g1)
        .arg(source("c/params.c"))
        .status()
        .unwrap();
    assert!(status.success());
    let r = read_with(&g1, &DebugSearch::default());
    let ints = r.get("ints");
    assert_eq!(ints.line, Some(line_of("c/params.c", "FIXTURE int ints(")));
    assert_eq!(ints.signature, None, "-g1 has no parameters or types: none is made up");
}

#[test]
fn cpp_fixture_methods_references_enums_and_by_reference_classes() {
    for name in ["params_cpp", "params_cpp_o2"] {
        let r = read(name);
        let add = "shop::Counter::add(char const*, int, shop::Size)";
        let calm = "shop::Counter::calm(shop::Mood) const";
        let refs = "shop::refs(shop::Counter&, long&, long const&, char const*&)";
        let take = "shop::take(shop::Ticket, int)";
        assert_defined_at(&r, add, "cpp/params.cpp", "FIXTURE long add(");
        assert_defined_at(&r, calm, "cpp/params.cpp", "FIXTURE bool calm(");
        assert_defined_at(&r, refs, "cpp/params.cpp", "FIXTURE void refs(");
        assert_defined_at(&r, take, "cpp/params.cpp", "FIXTURE long take(");
        assert_eq!(r.get(add).name, "add");
        assert_eq!(r.get(add).language, Language::Cpp);
        assert_eq!(
            described(r.sig(add)),
            [
                "this: Counter * const @ rdi",
                "what: const char * @ rsi",
                "n: int @ rdx",
                "size: Size @ rcx",
                "-> long int @ rax"
            ],
            "{name}"
        );
        assert!(r.sig(add).params[0].artificial && !r.sig(add).params[1].artificial);
        assert_eq!(
            described(r.sig(calm)),
            ["this: const Counter * const @ rdi", "mood: Mood @ rsi", "-> bool @ rax"],
            "{name}"
        );
        assert_eq!(
            described(r.sig(refs)),
            ["c: Counter & @ rdi", "n: long int & @ rsi", "m: const long int & @ rdx", "s: const char *& @ rcx"],
            "{name}"
        );
        // A destructor of its own: passed by invisible reference.
        assert_eq!(described(r.sig(take)), ["t: Ticket @ &rdi", "after: int @ rsi", "-> long int @ rax"], "{name}");
        assert_eq!(r.sig(take).optimized, name == "params_cpp_o2");
    }
}

fn rust_expected() -> Vec<(&'static str, &'static str, Vec<&'static str>)> {
    vec![
        ("params::greet", "fn greet(", vec!["name: &str @ rdi:rsi", "times: u32 @ rdx", "-> usize @ rax"]),
        (
            "params::signed_and_small",
            "fn signed_and_small(",
            vec![
                "a: i8 @ rdi",
                "b: i16 @ rsi",
                "c: i32 @ rdx",
                "d: i64 @ rcx",
                "e: u8 @ r8",
                "f: u16 @ r9",
                "-> i64 @ rax",
            ],
        ),
        (
            "params::wide",
            "fn wide(",
            vec![
                "g: u32 @ rdi",
                "h: u64 @ rsi",
                "i: isize @ rdx",
                "j: usize @ rcx",
                "k: i128 @ r8:r9",
                "-> i128 @ rax:rdx",
            ],
        ),
        (
            "params::flags",
            "fn flags(",
            vec!["on: bool @ rdi", "letter: char @ rsi", "color: Color @ rdx", "level: Level @ rcx", "-> char @ rax"],
        ),
        ("params::scaled", "fn scaled(", vec!["x: f64 @ xmm", "n: i32 @ rdi", "-> f64 @ xmm"]),
        (
            "params::shapes",
            "fn shapes(",
            vec![
                "m: Meters @ rdi",
                "p: Pair @ rsi:rdx",
                "s: Small @ rcx",
                "big: Big @ &r8",
                "after: u8 @ r9",
                "-> u64 @ rax",
            ],
        ),
        ("params::hello", "fn hello(", vec!["name: &str @ rdi:rsi", "-> &str @ rax:rdx"]),
        ("params::make_big", "fn make_big(", vec!["seed: u64 @ rsi", "-> Big @ &rax"]),
    ]
}

#[test]
fn rust_fixture_at_o0_is_placed_by_rusts_abi() {
    use tracer_user::debuginfo::types::Kind;
    let r = read("rust_params");
    for (name, definition, expected) in rust_expected() {
        assert_defined_at(&r, name, "rust/params.rs", definition);
        assert_eq!(r.get(name).language, Language::Rust);
        let s = r.sig(name);
        assert!(!s.optimized, "{name}");
        assert_eq!(described(s), expected, "{name}");
    }
    let flags = r.sig("params::flags");
    assert_eq!(flags.params[1].ty.kind, Kind::Char { signed: false, unicode: true });
    let Kind::Enum { signed: true, enumerators } = &flags.params[3].ty.kind else { panic!() };
    assert_eq!(enumerators.iter().map(|e| e.value).collect::<Vec<_>>(), [-1, 0, 1]);
    assert_eq!(r.sig("params::greet").params[0].ty.kind, Kind::RustStr);
}

#[test]
fn rust_fixture_at_o3_follows_dwarf_where_the_optimiser_changed_the_signature() {
    let r = read("rust_params_o3");
    let o0 = rust_expected();
    for (name, definition, expected) in &o0 {
        assert_defined_at(&r, name, "rust/params.rs", definition);
        let got = described(r.sig(name));
        match *name {
            // LLVM dropped the unused pointer half of `name` (dead-argument elimination): its
            // length comes first, and `times` moved up a register. DWARF says so; the ABI cannot.
            "params::greet" => {
                assert_eq!(got, ["name: &str @ PartlyOptimizedOut", "times: u32 @ rsi", "-> usize @ rax"]);
                assert_eq!(place(&r.sig(name).params[1].abi), "rdx", "the ABI's place, overruled");
            }
            // `big` was promoted to the fields that are read, and `after` lives in a frame slot.
            "params::shapes" => assert_eq!(
                got,
                [
                    "m: Meters @ rdi",
                    "p: Pair @ rsi:rdx",
                    "s: Small @ PartlyOptimizedOut",
                    "big: Big @ OptimizedOut",
                    "after: u8 @ FrameSlot",
                    "-> u64 @ rax"
                ]
            ),
            _ => assert_eq!(&got, expected, "{name}"),
        }
    }
    // `hello` keeps `name` in a stack slot throughout (for format!): nothing shows optimisation,
    // and the ABI places it.
    assert!(!r.sig("params::hello").optimized);
    assert!(r.sig("params::wide").optimized);
}

#[test]
fn libc_debug_info_is_found_by_build_id_under_usr_lib_debug() {
    let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    let id = build_id(&std::fs::read(libc).unwrap());
    let debug = Path::new("/usr/lib/debug/.build-id").join(&id[..2]).join(format!("{}.debug", &id[2..]));
    assert!(
        debug.exists(),
        "{} is missing: libc6-dbg is not installed (cargo xtask setup installs it)",
        debug.display()
    );
    let r = read_with(libc, &DebugSearch::default());
    assert_eq!(r.origin, DebugOrigin::BuildId(debug));
    let fopen = r.get("fopen");
    assert_eq!(fopen.name, "_IO_new_fopen");
    // glibc 2.36, libio/iofopen.c: `_IO_new_fopen (const char *filename, const char *mode)`.
    assert_eq!((fopen.file.as_deref(), fopen.line), (Some(Path::new("./libio/iofopen.c")), Some(84)));
    assert_eq!(
        described(fopen.signature.as_ref().unwrap()),
        ["filename: const char * @ rdi", "mode: const char * @ rsi", "-> FILE * @ rax"]
    );
    assert!(r.by_name.len() > 2000, "{}", r.by_name.len());
}

#[test]
fn probe_layouts_read_only_the_strings() {
    let c = read("params");
    let text = FunctionLayout::new(c.sig("text"), DEFAULT_STRING_SIZE);
    let cstring = |r: Reg| StringRead { kind: StringKind::CString as u8, ptr: r as u8, len: 0, reserved: 0 };
    assert_eq!(text.probe.entry_strings, 2);
    assert_eq!(text.probe.entry[..2], [cstring(Reg::Rsi), cstring(Reg::Rdx)]);
    assert_eq!(text.probe.string_size, 64);
    assert!(text.probe.ret.kind == StringKind::None as u8);
    let greet = FunctionLayout::new(c.sig("greet"), 16);
    assert_eq!((greet.probe.entry_strings, greet.probe.ret), (1, cstring(Reg::Rax)));
    assert!(!FunctionLayout::new(c.sig("ints"), 64).probe.reads_memory());

    let rust = read("rust_params");
    let slice = |p: Reg, l: Reg| StringRead { kind: StringKind::Slice as u8, ptr: p as u8, len: l as u8, reserved: 0 };
    let hello = FunctionLayout::new(rust.sig("params::hello"), 64);
    assert_eq!(hello.probe.entry[0], slice(Reg::Rdi, Reg::Rsi));
    assert_eq!(hello.probe.ret, slice(Reg::Rax, Reg::Rdx));

    // Round trip through the map value's bytes, and what a damaged one is told.
    let bytes = hello.probe.to_bytes();
    assert_eq!(ProbeLayout::from_bytes(&bytes), Ok(hello.probe));
    assert_eq!(ProbeLayout::from_bytes(&bytes[1..]), Err(LayoutError::Size(ProbeLayout::SIZE - 1)));
    let damaged = |i: usize, v: u8| {
        let mut b = bytes;
        b[i] = v;
        ProbeLayout::from_bytes(&b)
    };
    assert_eq!(damaged(0, 2), Err(LayoutError::Version(2)));
    assert_eq!(damaged(1, 7), Err(LayoutError::StringCount(7)));
    assert_eq!(damaged(4, 9), Err(LayoutError::StringKind(9)));
    assert_eq!(damaged(5, 7), Err(LayoutError::Register(7)));
    assert_eq!(damaged(3, 0xff), Err(LayoutError::StringSize(0xff40)));
}

#[test]
fn unreadable_parameters_say_why() {
    let c = read("params");
    let why = |f: &str| -> Vec<serde_json::Value> {
        let layout = FunctionLayout::new(c.sig(f), 64);
        let regs = Registers::default();
        format_params(&layout, &regs, &[]).into_iter().map(|(_, v)| v).collect()
    };
    let floats = why("floats");
    assert_eq!(floats[0], json!({"unreadable": "in a floating-point register"}));
    assert_eq!(floats[3], json!({"unreadable": "passed in memory, on the stack"}));
    let structs = why("structs");
    assert_eq!(structs[0], json!({"unreadable": "a struct of 8 bytes: members are not decoded"}));
    assert_eq!(structs[2], json!({"unreadable": "partly in a floating-point register"}));
    assert_eq!(structs[4], json!({"unreadable": "a union of 4 bytes: members are not decoded"}));
    assert_eq!(why("eight")[6], json!({"unreadable": "on the stack: no integer register was left"}));
    let cpp = read("params_cpp");
    let take = FunctionLayout::new(cpp.sig("shop::take(shop::Ticket, int)"), 64);
    assert_eq!(take.params[0].source, tracer_user::debuginfo::layout::Source::Unreadable("passed by reference".into()));
    let o2 = read("params_o2");
    let wide = FunctionLayout::new(o2.sig("wide_int"), 64);
    assert_eq!(
        format_params(&wide, &Registers::default(), &[])[0].1,
        json!({"unreadable": "DWARF says rsi:rdi, the calling convention rdi:rsi"})
    );
    let rust = read("rust_params_o3");
    let shapes = FunctionLayout::new(rust.sig("params::shapes"), 64);
    let values = object(format_params(&shapes, &Registers::default(), &[]));
    assert_eq!(values["big"], json!({"unreadable": "optimized out"}));
    assert_eq!(values["after"], json!({"unreadable": "in a stack slot, not yet written at entry"}));
}

/// Name-value pairs as a JSON object (to compare whole values; the order is checked apart).
fn object(pairs: Vec<(String, serde_json::Value)>) -> serde_json::Value {
    serde_json::Value::Object(pairs.into_iter().collect())
}

/// The registers as each caller in the fixtures' `main` sets them, formatted through the real
/// layouts: the values in the fixture sources' comments come back.
#[test]
fn values_from_the_callers_registers_read_as_the_sources_say() {
    let c = read("params");
    let f = |name: &str, args: [u64; 6], strings: &[CapturedString]| {
        let layout = FunctionLayout::new(c.sig(name), DEFAULT_STRING_SIZE);
        object(format_params(&layout, &Registers::at_entry(args), strings))
    };
    // movl-style writes leave the upper halves as they were: junk that must not show.
    let junk = 0xdead_beef_0000_0000u64;
    assert_eq!(
        f(
            "ints",
            [junk | 0xffff_fffb, junk | 0xffff_fed4, junk | 0xfffe_ee90, (-5_000_000_000i64) as u64, 200, 60000],
            &[]
        ),
        json!({"c": -5, "s": -300, "i": -70000, "l": -5_000_000_000i64, "uc": 200, "us": 60000})
    );
    assert_eq!(
        f(
            "more_ints",
            [4_000_000_000, 18_000_000_000_000_000_000, (-9_000_000_000_000_000_000i64) as u64, 7, 1, 0],
            &[]
        ),
        json!({"ui": 4_000_000_000u32, "ul": 18_000_000_000_000_000_000u64, "ll": -9_000_000_000_000_000_000i64, "t": 7, "b": true})
    );
    let ok = |b: &'static [u8]| CapturedString { status: StringStatus::Complete, bytes: b };
    let text = FunctionLayout::new(c.sig("text"), DEFAULT_STRING_SIZE);
    let keys: Vec<String> =
        format_params(&text, &Registers::default(), &[ok(b""), ok(b"")]).into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["c", "name", "buf", "bytes", "col", "lv", "p"], "declaration order");
    assert_eq!(
        f("text", [b'A' as u64, 0x4000, 0x7ffd_0000, 0x4010, 4, 1], &[ok(b"alice"), ok(b"bob")]),
        json!({"c": "A", "name": "alice", "buf": "bob", "bytes": "0x4010", "col": "BLUE", "lv": "HIGH",
               "p": {"unreadable": "on the stack: no integer register was left"}})
    );
    let layout = FunctionLayout::new(c.sig("greet"), DEFAULT_STRING_SIZE);
    assert_eq!(format_return(&layout, &Registers::at_return(0x2004, 0), Some(&ok(b"hello"))), Some(json!("hello")));

    let rust = read("rust_params");
    let r = |name: &str, args: [u64; 6], strings: &[CapturedString]| {
        let layout = FunctionLayout::new(rust.sig(name), DEFAULT_STRING_SIZE);
        object(format_params(&layout, &Registers::at_entry(args), strings))
    };
    assert_eq!(r("params::greet", [0x5000, 5, 3, 0, 0, 0], &[ok(b"alice")]), json!({"name": "alice", "times": 3}));
    let min = i128::MIN as u128;
    assert_eq!(
        r(
            "params::wide",
            [4_000_000_000, 18_000_000_000_000_000_000, (-7i64) as u64, 7, min as u64, (min >> 64) as u64],
            &[]
        ),
        json!({"g": 4_000_000_000u32, "h": 18_000_000_000_000_000_000u64, "i": -7, "j": 7,
               "k": "-170141183460469231731687303715884105728"})
    );
    assert_eq!(
        r("params::flags", [1, 'é' as u64, 2, 0xff, 0, 0], &[]),
        json!({"on": true, "letter": "é", "color": "Blue", "level": "Low"})
    );
    let layout = FunctionLayout::new(rust.sig("params::hello"), 4);
    let truncated = CapturedString { status: StringStatus::Truncated, bytes: b"hell" };
    assert_eq!(
        format_return(&layout, &Registers::at_return(0x6000, 10), Some(&truncated)),
        Some(json!({"string": "hell", "truncated": true, "length": 10}))
    );
}
