//! How returns are probed: by the return address (a uretprobe) or where they happen (a uprobe on
//! each `ret` and each jump out of the function).
//!
//! A uretprobe replaces the return address on the stack with a trampoline's on entry. A program
//! that unwinds its stack (a C++ exception, a Rust panic) walks those addresses looking for frame
//! descriptions; the trampoline has none, and the unwinder aborts the program (`terminate called
//! after throwing ...`); `longjmp` skips frames, whose returns never come. So when a traced
//! program may unwind, every return is probed where it happens instead, which leaves the stack
//! alone; calls and returns pair by stack position, and a frame left by unwinding gets its return
//! marked `unwound` (see `assemble::pairing::NativeStacks`). Elsewhere the uretprobe stays: on
//! 6.11+ it returns through the `uretprobe` syscall, cheaper than a trap on a `ret`
//! (`cargo xtask bench --only overhead`).

use std::path::{Path, PathBuf};

use object::{Object as _, ObjectSymbol as _};

/// How a trace probes returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum ReturnProbes {
    /// A uretprobe at the entry (the return address is replaced while the call runs).
    ReturnAddress,
    /// A uprobe on each `ret` and jump out of the function.
    Exits,
}

/// Why a program may unwind its stack: a file of it and the symbol that says so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unwinder {
    pub file: PathBuf,
    pub symbol: &'static str,
    /// The file holds the unwinder itself (libgcc_s) rather than calling it.
    pub defines: bool,
}

impl std::fmt::Display for Unwinder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verb = if self.defines { "defines" } else { "uses" };
        write!(f, "{} {verb} {}", self.file.display(), self.symbol)
    }
}

/// Functions whose use means the program's stack may be unwound past frames it did not leave by
/// returning: the unwinder's entry points (C++ exceptions, Rust panics), C++'s throw, and the
/// `longjmp` family, which skips frames without unwinding them.
const UNWINDING: &[&str] = &[
    "_Unwind_RaiseException",
    "_Unwind_Resume",
    "_Unwind_ForcedUnwind",
    "__cxa_throw",
    "longjmp",
    "_longjmp",
    "siglongjmp",
    "__longjmp_chk",
];
// Not `pthread_exit` and `pthread_cancel` (python3 imports the first): glibc's forced unwinding
// stops at a frame it cannot describe and ends the thread from there, so the thread still ends as
// asked; only `pthread_cleanup_push` handlers above a traced call are skipped (docs/record.md says so).

/// The first of `files` (the targets' executables and the libraries they load) that may unwind
/// a stack, if one does. A file that cannot be read says nothing.
pub fn unwinder(files: &[PathBuf]) -> Option<Unwinder> {
    files.iter().find_map(|f| file_unwinder(f))
}

fn file_unwinder(path: &Path) -> Option<Unwinder> {
    let data = crate::mapped_file::MappedFile::open(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let found = |symbol: &str| UNWINDING.iter().copied().find(|&u| u == symbol);
    let dynamic = file.dynamic_symbols().next().is_some();
    let mut defines = false;
    let symbol = if dynamic {
        // What a dynamically linked file imports; or the unwinder itself (libgcc_s, or one linked
        // into the file), whose presence in a process means something there throws.
        file.dynamic_symbols().find_map(|s| {
            let name = s.name().ok()?;
            if s.is_undefined() {
                found(name)
            } else if name == "_Unwind_RaiseException" {
                defines = true;
                found(name)
            } else {
                None
            }
        })
    } else {
        // A static executable holds what it uses.
        file.symbols().find_map(|s| if s.is_definition() { found(s.name().ok()?) } else { None })
    };
    symbol.map(|symbol| Unwinder { file: path.to_owned(), symbol, defines })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpp_runtimes_unwind_and_plain_c_programs_do_not() {
        let libstdcxx = Path::new("/usr/lib/x86_64-linux-gnu/libstdc++.so.6");
        let found = file_unwinder(libstdcxx).expect("libstdc++ raises exceptions");
        assert!(found.symbol.starts_with("_Unwind_") || found.symbol == "__cxa_throw", "{found}");
        // libc defines longjmp and friends but imports none of them.
        assert_eq!(file_unwinder(Path::new("/lib/x86_64-linux-gnu/libc.so.6")), None);
        assert_eq!(file_unwinder(Path::new("/usr/bin/python3")), None);
        assert_eq!(unwinder(&[PathBuf::from("/nonexistent")]), None);
    }
}
