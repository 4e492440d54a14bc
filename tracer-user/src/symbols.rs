//! Functions of an ELF file: read from `.symtab` and `.dynsym`, demangled, matched against the
//! user's patterns, and placed at the file offsets that uprobes attach to.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use object::{Object as _, ObjectSegment as _, ObjectSymbol as _, SymbolKind};

#[derive(Debug, thiserror::Error)]
pub enum SymbolError {
    #[error("cannot read {path}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is not an ELF executable or shared library ({reason})")]
    NotElf { path: PathBuf, reason: String },
    #[error("{path} defines no functions (no symbols in .symtab or .dynsym)")]
    NoFunctions { path: PathBuf },
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
    /// Virtual address in the ELF file.
    pub address: u64,
    /// Offset in the file: where a uprobe attaches.
    pub file_offset: u64,
    pub size: u64,
}

impl Function {
    pub fn names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.name.as_str()).chain(self.aliases.iter().map(String::as_str))
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
    /// True when only `.dynsym` was available (a stripped file).
    pub stripped: bool,
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

/// A symbol that is not a function entry even though it is typed as one: GCC's split-off cold
/// parts (`foo.cold`) are jumped into, never called, and a return probe there would corrupt the
/// stack.
fn is_function_fragment(raw: &str) -> bool {
    raw.ends_with(".cold") || raw.contains(".cold.")
}

impl SymbolTable {
    pub fn load(path: &Path) -> Result<SymbolTable, SymbolError> {
        let data = std::fs::read(path).map_err(|source| SymbolError::Read { path: path.to_owned(), source })?;
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

        let stripped = file.symbols().next().is_none();
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

        let mut functions = Vec::with_capacity(by_address.len());
        for (address, (mut raws, size)) in by_address {
            let Some(offset) = file_offset(address) else { continue };
            // Prefer a global name as the primary one, then the shortest.
            raws.sort_by_key(|(global, n)| (!global, n.len(), n.clone()));
            let mut names: Vec<String> = raws.iter().map(|(_, n)| demangle(n)).collect();
            names.dedup();
            let name = names.remove(0);
            names.retain(|n| *n != name);
            functions.push(Function { name, aliases: names, address, file_offset: offset, size });
        }
        if functions.is_empty() {
            return Err(SymbolError::NoFunctions { path: path.to_owned() });
        }
        Ok(SymbolTable { path: path.to_owned(), functions, stripped })
    }

    /// Functions with any name matching `pattern`.
    pub fn matching<'a>(&'a self, pattern: &'a NamePattern) -> impl Iterator<Item = &'a Function> + 'a {
        self.functions.iter().filter(move |f| f.names().any(|n| pattern.matches(n)))
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

/// A glob over demangled function names.
#[derive(Clone, Debug)]
pub struct NamePattern {
    text: String,
    matcher: globset::GlobMatcher,
}

impl NamePattern {
    pub fn new(text: &str) -> Result<NamePattern, SymbolError> {
        let glob = globset::GlobBuilder::new(text)
            .literal_separator(false)
            .backslash_escape(true)
            .build()
            .map_err(|e| SymbolError::BadPattern { pattern: text.to_string(), reason: e.kind().to_string() })?;
        Ok(NamePattern { text: text.to_string(), matcher: glob.compile_matcher() })
    }

    pub fn matches(&self, name: &str) -> bool {
        self.matcher.is_match(name)
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// A `--functions` argument: a name glob, optionally prefixed by a module (`libc.so.6:malloc`).
/// The module separator is a single `:`, so Rust and C++ paths (`app::run`) need no escaping.
#[derive(Clone, Debug)]
pub struct FunctionPattern {
    pub module: Option<String>,
    pub name: NamePattern,
}

impl FunctionPattern {
    pub fn parse(text: &str) -> Result<FunctionPattern, SymbolError> {
        let bytes = text.as_bytes();
        let split = (0..bytes.len())
            .find(|&i| bytes[i] == b':' && bytes.get(i + 1) != Some(&b':') && (i == 0 || bytes[i - 1] != b':'));
        let (module, name) = match split {
            Some(i) => (Some(&text[..i]), &text[i + 1..]),
            None => (None, text),
        };
        if module == Some("") || name.is_empty() {
            return Err(SymbolError::BadPattern {
                pattern: text.to_string(),
                reason: "expected 'NAME' or 'MODULE:NAME'".to_string(),
            });
        }
        Ok(FunctionPattern { module: module.map(str::to_string), name: NamePattern::new(name)? })
    }
}

impl std::fmt::Display for FunctionPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.module {
            Some(m) => write!(f, "{m}:{}", self.name.as_str()),
            None => f.write_str(self.name.as_str()),
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
            stripped: false,
            functions: names
                .iter()
                .enumerate()
                .map(|(i, n)| Function {
                    name: n.to_string(),
                    aliases: vec![],
                    address: i as u64,
                    file_offset: i as u64,
                    size: 1,
                })
                .collect(),
        }
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
        assert!(t.functions.iter().any(|f| f.name.starts_with("tracer_user::symbols::")));
        assert!(!t.functions.iter().any(|f| f.name.contains("::h") && f.name.ends_with('E')));
    }
}
