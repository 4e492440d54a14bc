//! Functions of an ELF file: read from `.symtab` and `.dynsym`, demangled, matched against the
//! user's patterns, and placed at the file offsets that uprobes attach to.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
};

use object::{Object as _, ObjectSegment as _, ObjectSymbol as _, SymbolKind};

use crate::{
    functions::disasm::{self, Entry, Exit, FunctionCode},
    functions::golang::{self, GoInfo},
    functions::gopclntab,
    functions::placement::{self, EntryPoint, ProbePath},
    kernel::features::KernelProbes,
};

#[derive(Debug, thiserror::Error)]
pub enum SymbolError {
    #[error("cannot read {path}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is not an ELF executable or shared library ({reason})")]
    NotElf { path: PathBuf, reason: String },
    #[error("{path} defines no functions ({why})")]
    NoFunctions { path: PathBuf, why: String },
    #[error("invalid function pattern '{pattern}': {reason}")]
    BadPattern { pattern: String, reason: String },
}

/// One function that can be probed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// Demangled, without the Rust hash suffix.
    pub name: String,
    /// Other names at the same address (aliases), demangled.
    pub aliases: Vec<String>,
    /// The names of C++ functions that the demangler writes with a leading return type (template
    /// functions: `std::basic_ostream<...>& std::__ostream_insert<...>(...)`), without it, as
    /// people write them: matched like the other names.
    pub without_return_type: Vec<String>,
    /// Virtual address in the ELF file.
    pub address: u64,
    /// Offset in the file: where a uprobe attaches.
    pub file_offset: u64,
    pub size: u64,
    /// Where its probes go.
    pub placement: Placement,
}

/// Where a function's probes go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// A uprobe and a uretprobe for its return, both at `entry` bytes after the symbol (past a
    /// leading `endbr64` or nops when that reaches a faster path: see [`crate::functions::placement`]) (System
    /// V code: C, C++, Rust).
    Native {
        entry: EntryPoint,
        /// Its exits as file offsets (each `ret`, each jump out), for programs that unwind
        /// stacks, whose return probes go there (see [`crate::functions::unwinding`]); `None`
        /// when they cannot all be told (undecodable bytes, a jump through memory).
        exits: Option<Exits>,
    },
    /// Go code, whose runtime moves and walks stacks, so no uretprobe: ordinary uprobes at the
    /// entry (after the stack-bound check) and on each `ret` instruction (which always traps), as
    /// file offsets.
    Go { entry: u64, entry_path: ProbePath, returns: Vec<u64> },
    /// Go code that cannot be probed safely, and why.
    Refused(String),
}

/// Where a native function can be left other than by a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exits {
    /// Each `ret` and jump out, at file offsets.
    pub sites: Vec<Exit>,
    /// The function's code as (start, length) from its symbol's address (wrapping): itself and its
    /// cold part. A `jmp reg` to a target in here stays inside.
    pub extent: Vec<(u64, u64)>,
}

impl Function {
    /// Every name patterns are matched against: the name, the aliases, then the names without a
    /// return type.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.name.as_str())
            .chain(self.aliases.iter().map(String::as_str))
            .chain(self.without_return_type.iter().map(String::as_str))
    }

    /// The function's symbols' names other than `chosen` (the name its events carry): its
    /// primary name and aliases, not the same names without a return type.
    pub fn other_names(&self, chosen: &str) -> Vec<String> {
        std::iter::once(&self.name).chain(&self.aliases).filter(|n| *n != chosen).cloned().collect()
    }

    /// Whether a return probe may be placed on this function. A uretprobe overwrites the return
    /// address at the top of the stack on entry: for a function that is not entered by `call` (the
    /// process entry point) or that returns more than once (`setjmp`), that would corrupt the
    /// process, so such functions get entry probes only.
    pub fn return_probe_is_safe(&self) -> bool {
        const UNSAFE: &[&str] = &[
            "_start",
            "_dl_start",
            "_dl_start_user",
            "setjmp",
            "_setjmp",
            "__setjmp",
            "sigsetjmp",
            "__sigsetjmp",
            "getcontext",
            "__getcontext",
            "swapcontext",
            "__swapcontext",
            "vfork",
            "__vfork",
            "__restore_rt",
        ];
        !self.names().any(|n| UNSAFE.contains(&n))
    }
}

/// The probe-able functions of one ELF file, one entry per address.
#[derive(Clone, Debug)]
pub struct SymbolTable {
    pub path: PathBuf,
    pub functions: Vec<Function>,
    /// Where the functions' names come from.
    pub names_from: NamesFrom,
    /// Set when the file contains Go code (every function of it is then placed as Go's).
    pub go: Option<GoInfo>,
}

/// Where a file's function names and sizes come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NamesFrom {
    /// `.symtab` (with `.dynsym`): every function.
    Symtab,
    /// `.dynsym` only: a stripped file, its exported functions.
    Dynsym,
    /// A stripped Go file: its `.gopclntab` (with `.dynsym`), every Go function, as with symbols.
    GoPclntab,
}

/// Demangles a Rust (legacy or v0) or C++ symbol; other names come back unchanged. Rust names
/// lose their `::h<hash>` suffix, so that patterns match what the user sees in source.
pub fn demangle(raw: &str) -> String {
    if let Ok(d) = rustc_demangle::try_demangle(raw) {
        return format!("{d:#}");
    }
    if raw.starts_with("_Z")
        && let Ok(sym) = cpp_demangle::Symbol::new(raw)
        && let Ok(d) = sym.demangle(&cpp_demangle::DemangleOptions::default())
    {
        return d;
    }
    raw.to_string()
}

/// A C++ symbol demangled without its leading return type, when the full demangling has one
/// (function templates; cpp_demangle's `no_return_type`); `None` otherwise.
pub fn demangle_without_return_type(raw: &str, full: &str) -> Option<String> {
    if !raw.starts_with("_Z") {
        return None;
    }
    let sym = cpp_demangle::Symbol::new(raw).ok()?;
    let bare = sym.demangle(&cpp_demangle::DemangleOptions::default().no_return_type()).ok()?;
    (bare != full).then_some(bare)
}

/// A symbol that is not a function entry even though it is typed as one: GCC's split-off cold
/// parts (`foo.cold`) are jumped into, never called, and a return probe there would corrupt the
/// stack.
fn is_function_fragment(raw: &str) -> bool {
    raw.ends_with(".cold") || raw.contains(".cold.")
}

impl SymbolTable {
    pub fn load(path: &Path) -> Result<SymbolTable, SymbolError> {
        let data = crate::mapped_file::MappedFile::open(path)
            .map_err(|source| SymbolError::Read { path: path.to_owned(), source })?;
        Self::parse(path, &data)
    }

    pub fn parse(path: &Path, data: &[u8]) -> Result<SymbolTable, SymbolError> {
        let not_elf = |reason: String| SymbolError::NotElf { path: path.to_owned(), reason };
        let file = object::File::parse(data).map_err(|e| not_elf(e.to_string()))?;
        if file.format() != object::BinaryFormat::Elf {
            return Err(not_elf(format!("it is {:?}", file.format())));
        }
        if !matches!(file.kind(), object::ObjectKind::Executable | object::ObjectKind::Dynamic) {
            return Err(not_elf(format!("it is an ELF {:?} file", file.kind())));
        }
        let segments: Vec<(u64, u64, u64)> = file
            .segments()
            .map(|s| {
                let (offset, file_size) = s.file_range();
                (s.address(), file_size, offset)
            })
            .collect();
        let file_offset = |address: u64| {
            segments
                .iter()
                .find(|(seg_addr, size, _)| address >= *seg_addr && address < seg_addr + size)
                .map(|(seg_addr, _, seg_off)| address - seg_addr + seg_off)
        };

        let has_symtab = file.symbols().next().is_some();
        // address -> (raw names, size). BTreeMap: a stable order, by address.
        let mut by_address: BTreeMap<u64, (Vec<(bool, String)>, u64)> = BTreeMap::new();
        for symbol in file.symbols().chain(file.dynamic_symbols()) {
            if symbol.kind() != SymbolKind::Text || !symbol.is_definition() || symbol.size() == 0 {
                continue;
            }
            let Ok(raw) = symbol.name() else { continue };
            if raw.is_empty() || is_function_fragment(raw) {
                continue;
            }
            let entry = by_address.entry(symbol.address()).or_insert_with(|| (Vec::new(), symbol.size()));
            if !entry.0.iter().any(|(_, n)| n == raw) {
                entry.0.push((symbol.is_global(), raw.to_string()));
            }
        }

        // GCC's split-off cold parts, by the name of the function they belong to: a part shares its
        // function's frame, and may hold its returns.
        let mut cold_parts: HashMap<&str, (u64, u64)> = HashMap::new();
        for symbol in file.symbols() {
            if let Ok(raw) = symbol.name()
                && let Some(owner) = raw.strip_suffix(".cold")
                && symbol.kind() == SymbolKind::Text
                && symbol.size() > 0
            {
                cold_parts.insert(owner, (symbol.address(), symbol.size()));
            }
        }
        let go = golang::inspect(&file);
        // A stripped Go file still has the table its runtime names functions from: the same
        // functions, addresses and sizes as its symbols had.
        let mut names_from = if has_symtab { NamesFrom::Symtab } else { NamesFrom::Dynsym };
        let mut go_table_error = None;
        if !has_symtab && go.is_some() {
            match gopclntab::of_file(&file) {
                Ok(go_functions) => {
                    names_from = NamesFrom::GoPclntab;
                    for f in go_functions {
                        let entry = by_address.entry(f.address).or_insert_with(|| (Vec::new(), f.size));
                        if !entry.0.iter().any(|(_, n)| *n == f.name) {
                            entry.0.push((true, f.name));
                        }
                    }
                }
                Err(e) => go_table_error = Some(e),
            }
        }
        let go_refusal = go.as_ref().and_then(GoInfo::refusal);
        let mut functions = Vec::with_capacity(by_address.len());
        for (address, (mut raws, size)) in by_address {
            let Some(offset) = file_offset(address) else { continue };
            let placement = match (&go, &go_refusal) {
                (None, _) => {
                    let cold = raws
                        .iter()
                        .find_map(|(_, raw)| cold_parts.get(raw.as_str()))
                        .and_then(|&(a, size)| Some(Part { address: a, offset: file_offset(a)?, size }));
                    native_placement(data, Part { address, offset, size }, cold)
                }
                (Some(_), Some(why)) => Placement::Refused(why.to_string()),
                (Some(_), None) => go_placement(data, address, offset, size),
            };
            // Prefer a global name as the primary one, then the shortest.
            raws.sort_by_key(|(global, n)| (!global, n.len(), n.clone()));
            let demangled: Vec<(&str, String)> = raws.iter().map(|(_, n)| (n.as_str(), demangle(n))).collect();
            let mut without_return_type: Vec<String> =
                demangled.iter().filter_map(|(raw, full)| demangle_without_return_type(raw, full)).collect();
            without_return_type.dedup();
            let mut names: Vec<String> = demangled.into_iter().map(|(_, d)| d).collect();
            names.dedup();
            let name = names.remove(0);
            names.retain(|n| *n != name);
            without_return_type.retain(|n| *n != name && !names.contains(n));
            functions.push(Function {
                name,
                aliases: names,
                without_return_type,
                address,
                file_offset: offset,
                size,
                placement,
            });
        }
        if functions.is_empty() {
            let why = match go_table_error {
                Some(e) => format!("no symbols in .symtab or .dynsym, and it is Go but {e}"),
                None => "no symbols in .symtab or .dynsym".to_string(),
            };
            return Err(SymbolError::NoFunctions { path: path.to_owned(), why });
        }
        Ok(SymbolTable { path: path.to_owned(), functions, names_from, go })
    }

    /// Functions with any name matching `pattern` (as a Go name in a Go file), each with the first
    /// of its names that matched: the name the user asked for, which its events carry.
    pub fn matching<'a>(
        &'a self,
        pattern: &'a NamePattern,
    ) -> impl Iterator<Item = (usize, &'a Function, &'a str)> + 'a {
        let go = self.go.is_some();
        self.functions.iter().enumerate().filter_map(move |(i, f)| {
            let name = f.names().find(|n| if go { pattern.matches_go(n) } else { pattern.matches(n) })?;
            Some((i, f, name))
        })
    }

    /// Up to `limit` names closest to `pattern`, best first, for "did you mean".
    pub fn suggestions(&self, pattern: &str, limit: usize) -> Vec<String> {
        let needle = pattern.trim_matches('*').to_lowercase();
        let mut scored: Vec<(f64, &str)> = self
            .functions
            .iter()
            .flat_map(|f| f.names())
            .map(|name| {
                let lower = name.to_lowercase();
                // The last path segment is what people usually remember of a Rust or C++ name.
                let tail = lower.rsplit("::").next().unwrap_or(&lower);
                let mut score = strsim::jaro_winkler(&needle, &lower).max(strsim::jaro_winkler(&needle, tail));
                if !needle.is_empty() && lower.contains(&needle) {
                    score += 0.5;
                }
                (score, name)
            })
            .filter(|(score, _)| *score > 0.7)
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.len().cmp(&b.1.len())));
        let mut out: Vec<String> = Vec::new();
        for (_, name) in scored {
            if !out.iter().any(|n| n == name) {
                out.push(name.to_string());
            }
            if out.len() == limit {
                break;
            }
        }
        out
    }
}

/// The bytes of a function in the file, if they are there.
fn function_bytes(data: &[u8], offset: u64, size: u64) -> Option<&[u8]> {
    usize::try_from(offset)
        .ok()
        .zip(usize::try_from(size).ok())
        .and_then(|(start, len)| data.get(start..start.checked_add(len)?))
}

/// A stretch of a function's code: its address, file offset and size.
#[derive(Clone, Copy)]
struct Part {
    address: u64,
    offset: u64,
    size: u64,
}

impl Part {
    fn decode(self, data: &[u8]) -> Option<FunctionCode> {
        FunctionCode::decode(function_bytes(data, self.offset, self.size)?, self.address).ok()
    }
}

/// Where the probes of the native function `f` (with its cold part, if it has one) go: the
/// fastest equivalent entry point, and its exits. Bytes that do not decode as a whole (data in the
/// text) are judged by their first instruction alone, and probed at the symbol; their exits are
/// unknown.
fn native_placement(data: &[u8], f: Part, cold: Option<Part>) -> Placement {
    let kernel = KernelProbes::current();
    let Some(bytes) = function_bytes(data, f.offset, f.size) else {
        return Placement::Native { entry: EntryPoint { offset: 0, path: ProbePath::Trap }, exits: None };
    };
    let Ok(code) = FunctionCode::decode(bytes, f.address) else {
        let entry = EntryPoint { offset: 0, path: placement::classify_at(bytes, f.address, f.offset, kernel) };
        return Placement::Native { entry, exits: None };
    };
    let entry = placement::native_entry(&code, bytes, f.offset, kernel);
    let mut parts = vec![code];
    if let Some(part) = cold {
        match part.decode(data) {
            Some(code) => parts.push(code),
            None => return Placement::Native { entry, exits: None },
        }
    }
    // Addresses to file offsets, in whichever part they are.
    let to_offset = |a: u64| match cold {
        Some(part) if (part.address..part.address + part.size).contains(&a) => a - part.address + part.offset,
        _ => a - f.address + f.offset,
    };
    let mut extent = vec![(0, f.size)];
    extent.extend(cold.map(|c| (c.address.wrapping_sub(f.address), c.size)));
    let exits = disasm::exits(&parts)
        .map(|sites| Exits { sites: sites.into_iter().map(|e| e.map(to_offset)).collect(), extent });
    Placement::Native { entry, exits }
}

/// Where the probes of the Go function at `address` (file offset `offset`) go: decoded from its
/// bytes, the entry after the stack-bound check and every `ret`.
fn go_placement(data: &[u8], address: u64, offset: u64, size: u64) -> Placement {
    let code = function_bytes(data, offset, size);
    let Some(code) = code else {
        return Placement::Refused("its code is not in the file".to_string());
    };
    let bytes = code;
    let code = match FunctionCode::decode(bytes, address) {
        Ok(code) => code,
        Err(e) => return Placement::Refused(format!("its code does not decode: {e}")),
    };
    let to_offset = |a: u64| a - address + offset;
    let entry_address = match code.entry() {
        Entry::GoStackCheck { body } => body,
        Entry::Plain => address,
    };
    let entry = to_offset(entry_address);
    let entry_path = placement::classify_at(
        &bytes[(entry_address - address) as usize..],
        entry_address,
        entry,
        KernelProbes::current(),
    );
    Placement::Go { entry, entry_path, returns: code.returns().into_iter().map(to_offset).collect() }
}

/// Whether a Go function belongs to the program's own code rather than to the runtime or the
/// standard library: package `main`, or a package whose import path starts with a domain
/// (`github.com/x/y`), as every module outside the standard library's does.
pub fn is_go_program_code(name: &str) -> bool {
    // The compiler's generated functions (`type..eq.io/fs.PathError`, `go.buildid`) are no
    // package's.
    if ["type.", "type:", "go.", "go:"].iter().any(|p| name.starts_with(p)) {
        return false;
    }
    let after_slash = name.rfind('/').map_or(0, |i| i + 1);
    let package_end = name[after_slash..].find(['.', '(']).map_or(name.len(), |i| after_slash + i);
    let package = &name[..package_end];
    package == "main" || package.split('/').next().is_some_and(|first| first.contains('.') && after_slash > 0)
}

/// A glob over demangled function names.
#[derive(Clone, Debug)]
pub struct NamePattern {
    text: String,
    matcher: globset::GlobMatcher,
    /// For Go names: the same glob with `(*`, a pointer receiver as in `net/http.(*conn).serve`,
    /// taken literally (`None` when the pattern has none).
    go_matcher: Option<globset::GlobMatcher>,
}

fn glob(text: &str, pattern: &str) -> Result<globset::GlobMatcher, SymbolError> {
    // `*` crosses `/` and `.` (Go import paths, `main.*`); `(`, `)` and `.` are literal.
    let glob = globset::GlobBuilder::new(pattern)
        .literal_separator(false)
        .backslash_escape(true)
        .build()
        .map_err(|e| SymbolError::BadPattern { pattern: text.to_string(), reason: e.kind().to_string() })?;
    Ok(glob.compile_matcher())
}

impl NamePattern {
    pub fn new(text: &str) -> Result<NamePattern, SymbolError> {
        let go_matcher = if text.contains("(*") { Some(glob(text, &text.replace("(*", "(\\*"))?) } else { None };
        Ok(NamePattern { text: text.to_string(), matcher: glob(text, text)?, go_matcher })
    }

    pub fn matches(&self, name: &str) -> bool {
        self.matcher.is_match(name)
    }

    /// Matches a Go function name: as [`NamePattern::matches`], except that `(*` is literal.
    pub fn matches_go(&self, name: &str) -> bool {
        self.go_matcher.as_ref().unwrap_or(&self.matcher).is_match(name)
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// A `--functions` argument: a name glob, optionally prefixed by a module (`libc.so.6:malloc`)
/// or by a source file glob (`src/net.c:*`). The separator is a single `:`, so Rust and C++ paths
/// (`app::run`) need no escaping. The left side is a source file glob when it ends in a source
/// extension ([`SOURCE_EXTENSIONS`]): no module is named so (modules are `.so`, `.so.N` or
/// executables), and a module may be a path, so a `/` alone tells nothing.
#[derive(Clone, Debug)]
pub struct FunctionPattern {
    pub module: Option<String>,
    /// Only functions defined (DWARF `DW_AT_decl_file`) in a file matching this.
    pub source: Option<SourceGlob>,
    pub name: NamePattern,
}

/// What a source file glob ends in (`-f 'src/net.c:*'`).
pub const SOURCE_EXTENSIONS: [&str; 7] = [".c", ".cc", ".cpp", ".cxx", ".h", ".hpp", ".rs"];

impl FunctionPattern {
    pub fn parse(text: &str) -> Result<FunctionPattern, SymbolError> {
        let bytes = text.as_bytes();
        let split = (0..bytes.len())
            .find(|&i| bytes[i] == b':' && bytes.get(i + 1) != Some(&b':') && (i == 0 || bytes[i - 1] != b':'));
        let (left, name) = match split {
            Some(i) => (Some(&text[..i]), &text[i + 1..]),
            None => (None, text),
        };
        if left == Some("") || name.is_empty() {
            return Err(SymbolError::BadPattern {
                pattern: text.to_string(),
                reason: "expected 'NAME', 'MODULE:NAME' or 'SOURCE_FILE:NAME'".to_string(),
            });
        }
        let name = NamePattern::new(name)?;
        Ok(match left {
            Some(l) if SOURCE_EXTENSIONS.iter().any(|e| l.ends_with(e)) => {
                FunctionPattern { module: None, source: Some(SourceGlob::new(text, l)?), name }
            }
            _ => FunctionPattern { module: left.map(str::to_string), source: None, name },
        })
    }
}

/// A glob over source file paths, as users write them: relative (`src/net.c`, `*.c`), matched
/// against the whole path DWARF gives (usually absolute) or any part of it after a `/`. `*`
/// stays within one directory; `**` crosses them.
#[derive(Clone, Debug)]
pub struct SourceGlob {
    text: String,
    matcher: globset::GlobMatcher,
}

impl SourceGlob {
    fn new(pattern: &str, text: &str) -> Result<SourceGlob, SymbolError> {
        let glob = globset::GlobBuilder::new(text)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|e| SymbolError::BadPattern { pattern: pattern.to_string(), reason: e.kind().to_string() })?;
        Ok(SourceGlob { text: text.to_string(), matcher: glob.compile_matcher() })
    }

    pub fn matches(&self, path: &str) -> bool {
        self.matcher.is_match(path) || path.match_indices('/').any(|(i, _)| self.matcher.is_match(&path[i + 1..]))
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl std::fmt::Display for FunctionPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.module, &self.source) {
            (Some(m), _) => write!(f, "{m}:{}", self.name.as_str()),
            (None, Some(s)) => write!(f, "{}:{}", s.as_str(), self.name.as_str()),
            (None, None) => f.write_str(self.name.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demangles_rust_legacy_without_hash() {
        assert_eq!(demangle("_ZN7fixture3fib17h0123456789abcdefE"), "fixture::fib");
    }

    #[test]
    fn demangles_rust_v0() {
        // `fixture::fib` in the v0 scheme, crate disambiguator included.
        assert_eq!(demangle("_RNvCs1234_7fixture3fib"), "fixture::fib");
    }

    #[test]
    fn demangles_cpp() {
        assert_eq!(demangle("_ZN6shapes6Circle4areaEv"), "shapes::Circle::area()");
        assert_eq!(demangle("_Z3addii"), "add(int, int)");
    }

    #[test]
    fn leaves_c_names_alone() {
        assert_eq!(demangle("main"), "main");
        assert_eq!(demangle("_Zjunk"), "_Zjunk");
    }

    #[test]
    fn patterns_split_on_a_single_colon() {
        let p = FunctionPattern::parse("libc.so.6:malloc").unwrap();
        assert_eq!(p.module.as_deref(), Some("libc.so.6"));
        assert!(p.name.matches("malloc"));
        let p = FunctionPattern::parse("app::*").unwrap();
        assert_eq!(p.module, None);
        assert!(p.name.matches("app::run"));
        assert!(p.name.matches("app::inner::deep"));
        assert!(!p.name.matches("other::run"));
        let p = FunctionPattern::parse("libfoo.so:ns::f*").unwrap();
        assert_eq!(p.module.as_deref(), Some("libfoo.so"));
        assert!(p.name.matches("ns::frob"));
        assert!(FunctionPattern::parse(":x").is_err());
        assert!(FunctionPattern::parse("m:").is_err());
        assert!(FunctionPattern::parse("[").is_err());
    }

    #[test]
    fn patterns_whose_left_side_ends_in_a_source_extension_name_source_files() {
        let p = FunctionPattern::parse("src/net.c:*").unwrap();
        assert_eq!(p.module, None);
        let source = p.source.unwrap();
        assert!(source.matches("/home/u/app/src/net.c"));
        assert!(source.matches("src/net.c"));
        assert!(!source.matches("/home/u/app/src/net.cc"));
        assert!(!source.matches("/home/u/app/xsrc/net.c"), "a suffix starts after a '/'");
        let p = FunctionPattern::parse("*.rs:app::*").unwrap();
        let source = p.source.unwrap();
        assert!(source.matches("/b/src/main.rs"));
        assert!(p.name.matches("app::run"));
        let source = FunctionPattern::parse("src/*.cpp:f").unwrap().source.unwrap();
        assert!(source.matches("/b/src/a.cpp"));
        assert!(!source.matches("/b/src/x/a.cpp"), "'*' stays within a directory");
        assert!(FunctionPattern::parse("src/**/*.cpp:f").unwrap().source.unwrap().matches("/b/src/x/a.cpp"));
        // Modules keep their meaning, paths included.
        let p = FunctionPattern::parse("/usr/lib/libc.so.6:malloc").unwrap();
        assert_eq!(p.module.as_deref(), Some("/usr/lib/libc.so.6"));
        assert!(p.source.is_none());
        assert!(FunctionPattern::parse("src/[.c:f").is_err());
    }

    #[test]
    fn go_names_match_as_go_programmers_write_them() {
        let p = NamePattern::new("main.*").unwrap();
        assert!(p.matches_go("main.work") && p.matches_go("main.(*T).M") && p.matches_go("main.main.func1"));
        assert!(!p.matches_go("runtime.main"));
        let p = NamePattern::new("net/http.(*conn).serve").unwrap();
        assert!(p.matches_go("net/http.(*conn).serve"));
        // `(*` is a pointer receiver in a Go name, not a wildcard.
        assert!(!p.matches_go("net/http.(*http2conn).serve"));
        assert!(p.matches("net/http.(*http2conn).serve"), "elsewhere `*` stays a wildcard (C++ argument lists)");
        assert!(NamePattern::new("net/http.*").unwrap().matches_go("net/http.(*conn).serve"));
        assert!(NamePattern::new("*.(*conn).*").unwrap().matches_go("net/http.(*conn).serve"));
    }

    #[test]
    fn go_program_code_is_main_and_modules() {
        for own in ["main.work", "main.(*T).M", "main.main.func1", "github.com/a/b.F", "example.com/x.(*T).M"] {
            assert!(is_go_program_code(own), "{own}");
        }
        for std in [
            "runtime.main",
            "net/http.(*conn).serve",
            "fmt.Println",
            "type..eq.main.T",
            "type..eq.internal/cpu.option",
            "internal/abi.F",
        ] {
            assert!(!is_go_program_code(std), "{std}");
        }
    }

    #[test]
    fn globs_match_whole_names() {
        let p = NamePattern::new("fib").unwrap();
        assert!(p.matches("fib"));
        assert!(!p.matches("fib2"));
        assert!(!p.matches("app::fib"));
        assert!(NamePattern::new("*fib*").unwrap().matches("app::fibonacci"));
        assert!(NamePattern::new("shapes::Circle::area()").unwrap().matches("shapes::Circle::area()"));
    }

    fn table(names: &[&str]) -> SymbolTable {
        SymbolTable {
            path: "/x".into(),
            names_from: NamesFrom::Symtab,
            functions: names
                .iter()
                .enumerate()
                .map(|(i, n)| Function {
                    name: n.to_string(),
                    aliases: vec![],
                    without_return_type: vec![],
                    address: i as u64,
                    file_offset: i as u64,
                    size: 1,
                    placement: Placement::Native {
                        entry: EntryPoint { offset: 0, path: ProbePath::Trap },
                        exits: None,
                    },
                })
                .collect(),
            go: None,
        }
    }

    #[test]
    fn a_function_is_named_by_the_name_that_matched() {
        let mut t = table(&["open", "close"]);
        t.functions[0].aliases = vec!["open64".into(), "__open64".into()];
        let matched = |p: &str| -> Vec<(usize, String)> {
            let pattern = NamePattern::new(p).unwrap();
            t.matching(&pattern).map(|(i, _, name)| (i, name.to_string())).collect()
        };
        assert_eq!(matched("open64"), [(0, "open64".to_string())]);
        assert_eq!(matched("__open*"), [(0, "__open64".to_string())]);
        // Several names match: the function's own name first.
        assert_eq!(matched("*open*"), [(0, "open".to_string())]);
        assert_eq!(t.functions[0].other_names("open64"), ["open", "__open64"]);
    }

    /// libstdc++'s `std::__ostream_insert<char, std::char_traits<char> >`, a function template,
    /// demangles with its return type first; a pattern written as the function is named matches
    /// it without.
    #[test]
    fn cpp_templates_match_without_their_return_type() {
        let raw = "_ZSt16__ostream_insertIcSt11char_traitsIcEERSt13basic_ostreamIT_T0_ES6_PKS3_l";
        let full = demangle(raw);
        assert!(
            full.starts_with("std::basic_ostream<char, std::char_traits<char> >& std::__ostream_insert<"),
            "{full}"
        );
        let bare = demangle_without_return_type(raw, &full).expect("a name without the return type");
        assert_eq!(
            bare,
            "std::__ostream_insert<char, std::char_traits<char> >(std::basic_ostream<char, std::char_traits<char> >&, \
             char const*, long)"
        );
        // Names without a return type have no other form.
        assert_eq!(demangle_without_return_type("_Z3addii", &demangle("_Z3addii")), None);
        assert_eq!(demangle_without_return_type("main", "main"), None);

        let mut t = table(&[&full]);
        t.functions[0].without_return_type = vec![bare.clone()];
        let pattern = NamePattern::new("std::__ostream_insert<char*").unwrap();
        let found: Vec<&str> = t.matching(&pattern).map(|(_, _, name)| name).collect();
        assert_eq!(found, [bare.as_str()]);
        // The full name still matches as before, and is what a pattern of it names.
        let pattern = NamePattern::new("std::basic_ostream<*>& std::__ostream_insert<*").unwrap();
        let found: Vec<&str> = t.matching(&pattern).map(|(_, _, name)| name).collect();
        assert_eq!(found, [full.as_str()]);
        assert_eq!(t.functions[0].other_names(&bare), std::slice::from_ref(&full));
    }

    #[test]
    fn suggests_near_names() {
        let t = table(&["fixture::fib", "fixture::compute", "main", "std::rt::lang_start"]);
        let s = t.suggestions("fib", 3);
        assert_eq!(s.first().map(String::as_str), Some("fixture::fib"), "{s:?}");
        let s = t.suggestions("comput", 3);
        assert_eq!(s.first().map(String::as_str), Some("fixture::compute"), "{s:?}");
        assert!(t.suggestions("zzzzqqq", 3).is_empty());
    }

    #[test]
    fn return_probes_skip_entry_points_and_setjmp() {
        let mut t = table(&["_start", "main", "_setjmp"]);
        t.functions[1].aliases.push("alias".into());
        let safe: Vec<bool> = t.functions.iter().map(Function::return_probe_is_safe).collect();
        assert_eq!(safe, [false, true, false]);
    }

    #[test]
    fn rejects_non_elf() {
        let err = SymbolTable::parse(Path::new("/tmp/script.sh"), b"#!/bin/sh\necho hi\n").unwrap_err();
        assert!(err.to_string().starts_with("/tmp/script.sh is not an ELF executable"), "{err}");
    }

    #[test]
    fn reads_this_test_binary() {
        let exe = std::env::current_exe().unwrap();
        let t = SymbolTable::load(&exe).unwrap();
        let main = t.functions.iter().find(|f| f.name == "main").expect("main in the test binary");
        assert!(main.size > 0);
        // Offsets are inside the file.
        let len = std::fs::metadata(&exe).unwrap().len();
        assert!(t.functions.iter().all(|f| f.file_offset < len));
        // Rust functions are demangled without hash.
        assert!(t.functions.iter().any(|f| f.name.starts_with("tracer_user::functions::symbols::")));
        assert!(!t.functions.iter().any(|f| f.name.contains("::h") && f.name.ends_with('E')));
    }
}
