//! Which ELF file a module name in a function pattern means (`libc.so.6:malloc`, `libc:malloc`,
//! `/opt/lib/libfoo.so:bar`, or the main executable's own name).

use std::path::{Path, PathBuf};

use object::read::elf::ElfFile64;

use crate::targets;

#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    #[error("module '{spec}' matches no executable or library of the targets (known: {known})")]
    NotFound { spec: String, known: String },
    #[error("module '{spec}' is ambiguous: it could be {candidates}")]
    Ambiguous { spec: String, candidates: String },
}

/// Directories the dynamic loader searches by default on Debian-like x86-64 systems.
const DEFAULT_LIBRARY_DIRS: &[&str] = &[
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
    "/usr/local/lib",
];

/// The files a module name can refer to: the main executables, the libraries they need
/// (`DT_NEEDED`, looked up like the dynamic loader does, minus `ld.so.cache`), and everything the
/// traced processes have mapped.
pub struct ModuleCandidates {
    files: Vec<PathBuf>,
}

impl ModuleCandidates {
    pub fn new(executables: &[PathBuf], pids: &[u32]) -> ModuleCandidates {
        let mut files: Vec<PathBuf> = executables.to_vec();
        for exe in executables {
            files.extend(needed_libraries(exe));
        }
        for &pid in pids {
            files.extend(targets::mapped_files(pid));
        }
        ModuleCandidates::of_files(files)
    }

    /// The files a program exec'd from `executables` will have mapped once its dynamic loader is
    /// done: them, and the libraries they need directly or through other libraries (at most
    /// [`MAX_LIBRARIES`]). Read while the process is stopped at its exec, before any is mapped.
    pub fn with_dependencies(executables: &[PathBuf]) -> ModuleCandidates {
        let mut files: Vec<PathBuf> = executables.to_vec();
        files.extend(libraries_needed(executables));
        ModuleCandidates::of_files(files)
    }

    /// `files` by their canonical paths, each once.
    fn of_files(files: Vec<PathBuf>) -> ModuleCandidates {
        let mut canonical: Vec<PathBuf> = files.into_iter().map(|f| std::fs::canonicalize(&f).unwrap_or(f)).collect();
        canonical.sort();
        canonical.dedup();
        ModuleCandidates { files: canonical }
    }

    /// Every file a module name can refer to (canonical paths, each once).
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// Resolves a module name: a path (used as is), or a file name, or a file name's prefix up to a
    /// `.` or `-` (`libc` for `libc.so.6`).
    pub fn resolve(&self, spec: &str) -> Result<PathBuf, ModuleError> {
        if spec.contains('/') {
            let path = Path::new(spec);
            return if path.exists() {
                Ok(std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned()))
            } else {
                Err(self.not_found(spec))
            };
        }
        let name_of = |f: &PathBuf| f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let exact: Vec<&PathBuf> = self.files.iter().filter(|f| name_of(f) == spec).collect();
        let matches = if exact.is_empty() {
            self.files
                .iter()
                .filter(|f| {
                    let name = name_of(f);
                    name.strip_prefix(spec).is_some_and(|rest| rest.starts_with('.') || rest.starts_with('-'))
                })
                .collect()
        } else {
            exact
        };
        match matches.as_slice() {
            [] => Err(self.not_found(spec)),
            [one] => Ok((*one).clone()),
            many => {
                // Several links to one file (libc.so.6 -> libc-2.36.so) are one module.
                let mut ids: Vec<_> = many.iter().filter_map(|f| targets::FileId::of(f).ok()).collect();
                ids.dedup();
                if ids.len() == 1 {
                    Ok(many[0].clone())
                } else {
                    Err(ModuleError::Ambiguous {
                        spec: spec.to_string(),
                        candidates: many.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", "),
                    })
                }
            }
        }
    }

    fn not_found(&self, spec: &str) -> ModuleError {
        let known: Vec<String> =
            self.files.iter().filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned())).collect();
        ModuleError::NotFound { spec: spec.to_string(), known: known.join(", ") }
    }
}

/// The libraries a process loads at start-up, at most: a bound on a dependency graph read from
/// files (a loop or a huge graph ends there).
pub const MAX_LIBRARIES: usize = 512;

/// The libraries `executables` need, directly or through the libraries they need (each once,
/// breadth first, at most [`MAX_LIBRARIES`]): what the dynamic loader maps before `main`.
fn libraries_needed(executables: &[PathBuf]) -> Vec<PathBuf> {
    let mut seen: std::collections::HashSet<PathBuf> = executables.iter().cloned().collect();
    // The executables, then every library found, in the order found: read one after the other.
    let mut queue: Vec<PathBuf> = executables.to_vec();
    let limit = executables.len() + MAX_LIBRARIES;
    let mut next = 0;
    while next < queue.len() && queue.len() < limit {
        for library in needed_libraries(&queue[next]) {
            let library = std::fs::canonicalize(&library).unwrap_or(library);
            if queue.len() < limit && seen.insert(library.clone()) {
                queue.push(library);
            }
        }
        next += 1;
    }
    queue.split_off(executables.len())
}

/// The libraries an executable needs directly, resolved to paths where they can be found.
fn needed_libraries(exe: &Path) -> Vec<PathBuf> {
    let Ok(data) = crate::mapped_file::MappedFile::open(exe) else { return Vec::new() };
    let Ok(elf) = ElfFile64::<object::Endianness>::parse(&*data) else { return Vec::new() };
    let Ok(dynamic) = elf.elf_dynamic_table() else { return Vec::new() };
    let mut needed = Vec::new();
    let mut search: Vec<PathBuf> = Vec::new();
    let origin = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    for d in dynamic.iter() {
        let Ok(value) = dynamic.string(d) else { continue };
        let value = String::from_utf8_lossy(value).into_owned();
        match d.tag {
            object::elf::DT_NEEDED => needed.push(value),
            object::elf::DT_RUNPATH | object::elf::DT_RPATH => {
                search.extend(value.split(':').map(|p| PathBuf::from(p.replace("$ORIGIN", &origin.to_string_lossy()))))
            }
            _ => {}
        }
    }
    if let Ok(paths) = std::env::var("LD_LIBRARY_PATH") {
        search.extend(paths.split(':').filter(|p| !p.is_empty()).map(PathBuf::from));
    }
    search.extend(DEFAULT_LIBRARY_DIRS.iter().map(PathBuf::from));
    needed.iter().filter_map(|name| search.iter().map(|dir| dir.join(name)).find(|p| p.is_file())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_libc_of_this_test_binary() {
        let exe = std::env::current_exe().unwrap();
        let candidates = ModuleCandidates::new(std::slice::from_ref(&exe), &[]);
        let libc = candidates.resolve("libc.so.6").expect("libc.so.6 is needed by every Rust binary");
        assert!(libc.file_name().unwrap().to_string_lossy().starts_with("libc"), "{libc:?}");
        assert_eq!(candidates.resolve("libc").unwrap(), libc);
        let own_name = exe.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(candidates.resolve(&own_name).unwrap(), std::fs::canonicalize(&exe).unwrap());
    }

    #[test]
    fn names_known_modules_when_nothing_matches() {
        let exe = std::env::current_exe().unwrap();
        let candidates = ModuleCandidates::new(&[exe], &[]);
        let err = candidates.resolve("libnothing.so").unwrap_err().to_string();
        assert!(err.starts_with("module 'libnothing.so' matches no executable or library"), "{err}");
        assert!(err.contains("libc"), "{err}");
        assert!(candidates.resolve("/no/such/lib.so").is_err());
    }
}
