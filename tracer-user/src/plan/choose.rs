//! Which functions a plan probes ([`Choice::of`]): every function of the main executables but
//! their C runtime start-up code (of a Go program, its own code), or those the `-f` patterns
//! match, with their predicates; and the trigger functions (`--start-at`, `--stop-at`), whether or
//! not a pattern chose them. Each function is chosen once, named by the first pattern that chose
//! it. The symbol tables read on the way ([`Tables`]) are kept for the probes' placement.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    path::{Path, PathBuf},
    sync::Arc,
};

use tracer_common::gate;

use super::{
    RecordError, RecordOptions, Scope,
    filter::{self, Predicates},
};
use crate::{
    functions::symbols::{FunctionPattern, SymbolError, SymbolTable, is_go_program_code},
    targets::modules::{ModuleCandidates, ModuleError},
};

/// The symbol tables read, by file, and the files the targets load (read from `/proc` and the
/// executables' needed libraries once, when a pattern names a module or the return probes'
/// choice needs them).
pub(crate) struct Tables {
    pub tables: BTreeMap<PathBuf, SymbolTable>,
    candidates: Option<ModuleCandidates>,
    pids: Vec<u32>,
}

impl Tables {
    pub fn new(pids: Vec<u32>) -> Tables {
        Tables { tables: BTreeMap::new(), candidates: None, pids }
    }

    /// With the files module names are looked up in already known.
    pub fn with_candidates(candidates: ModuleCandidates) -> Tables {
        Tables { tables: BTreeMap::new(), candidates: Some(candidates), pids: Vec::new() }
    }

    /// The symbol table of `path`, read the first time it is asked for.
    pub fn load(&mut self, path: &Path) -> Result<&SymbolTable, RecordError> {
        if !self.tables.contains_key(path) {
            self.tables.insert(path.to_path_buf(), SymbolTable::load(path)?);
        }
        Ok(&self.tables[path])
    }

    /// The files the targets load, found once.
    pub fn candidates(&mut self, executables: &[PathBuf]) -> &ModuleCandidates {
        self.candidates.get_or_insert_with(|| ModuleCandidates::new(executables, &self.pids))
    }

    /// The modules a pattern is looked up in: the one its `MODULE:` names, else every executable.
    fn modules_of(&mut self, pattern: &FunctionPattern, executables: &[PathBuf]) -> Result<Vec<PathBuf>, RecordError> {
        Ok(match &pattern.module {
            None => executables.to_vec(),
            Some(spec) => vec![self.candidates(executables).resolve(spec)?],
        })
    }

    /// The executables whose functions can be read. Leniently (a launched command, which may be
    /// a wrapper), one that is not an ELF file or defines no functions is left out with a
    /// warning; strictly, all are kept and the selection says what is wrong.
    pub fn readable(
        &mut self,
        executables: &[PathBuf],
        options: &RecordOptions,
        warnings: &mut Vec<String>,
        scope: Scope,
    ) -> Result<Vec<PathBuf>, RecordError> {
        if !scope.lenient {
            return Ok(executables.to_vec());
        }
        let mut kept = Vec::new();
        for exe in executables {
            match self.load(exe) {
                Ok(_) => kept.push(exe.clone()),
                // Without patterns, the default selection says this itself.
                Err(RecordError::Symbols(SymbolError::NoFunctions { .. })) if options.functions.is_empty() => {
                    kept.push(exe.clone())
                }
                Err(RecordError::Symbols(e @ (SymbolError::NotElf { .. } | SymbolError::NoFunctions { .. })))
                    if !scope.exec_image =>
                {
                    let what = match e {
                        SymbolError::NotElf { .. } => "is not an ELF executable",
                        _ => "defines no functions",
                    };
                    let then = if options.functions.is_empty() {
                        "tracing its processes only"
                    } else {
                        "the function patterns are resolved against each program it executes"
                    };
                    warnings.push(format!("{} {what}: {then}", exe.display()));
                }
                Err(e) if is_not_a_program(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(kept)
    }
}

/// The functions chosen, as (module, function index), and what each was chosen with.
#[derive(Default)]
pub(crate) struct Choice {
    /// In selection order, each once.
    pub selected: Vec<(PathBuf, usize)>,
    /// Answers "already chosen?" in constant time, so that a thousand patterns matching the same
    /// functions cost n, not n².
    chosen: HashMap<PathBuf, HashSet<usize>>,
    /// The name a function's events carry: the first of its names that the first pattern to
    /// choose it matched (`open64` when asked for, not its alias `open`).
    pub event_names: HashMap<(PathBuf, usize), String>,
    /// The predicate of the pattern that chose each function, if it has one.
    pub predicates: HashMap<(PathBuf, usize), Predicates>,
    /// The trigger functions' roles (`gate::START`, `gate::STOP`).
    pub roles: HashMap<(PathBuf, usize), u8>,
    /// The patterns that matched nothing (leniently; strictly they are errors).
    pub unmatched: Vec<Unmatched>,
}

impl Choice {
    /// The functions `options` choose among `executables` (those [`Tables::readable`] kept).
    pub fn of(
        options: &RecordOptions,
        executables: &[PathBuf],
        tables: &mut Tables,
        warnings: &mut Vec<String>,
        scope: Scope,
    ) -> Result<Choice, RecordError> {
        let mut choice = Choice::default();
        if options.functions.is_empty() {
            choice.defaults(executables, tables, warnings)?;
        } else {
            choice.patterns(options, executables, tables, warnings, scope)?;
        }
        choice.triggers(options, executables, tables, scope)?;
        Ok(choice)
    }

    fn select(&mut self, module: &Path, index: usize, name: &str, predicate: Option<&Predicates>) {
        let fresh = match self.chosen.get_mut(module) {
            Some(indexes) => indexes.insert(index),
            None => self.chosen.insert(module.to_path_buf(), HashSet::from([index])).is_none(),
        };
        if fresh {
            let key = (module.to_path_buf(), index);
            self.selected.push(key.clone());
            if let Some(p) = predicate {
                self.predicates.insert(key.clone(), p.clone());
            }
            self.event_names.insert(key, name.to_string());
        }
    }

    /// Without patterns: every function of the executables but their start-up code.
    fn defaults(
        &mut self,
        executables: &[PathBuf],
        tables: &mut Tables,
        warnings: &mut Vec<String>,
    ) -> Result<(), RecordError> {
        for exe in executables {
            let table = match tables.load(exe) {
                Ok(table) => table,
                // A stripped executable that exports nothing: still worth tracing its processes.
                Err(RecordError::Symbols(SymbolError::NoFunctions { path, .. })) => {
                    warnings.push(format!("{} has no function symbols: tracing its processes only", path.display()));
                    continue;
                }
                Err(e) => return Err(e),
            };
            // Of a Go program, its own code: the runtime's and the standard library's thousands of
            // functions (schedulers, the garbage collector) would bury it.
            let go = table.go.is_some();
            for (i, f) in table.functions.iter().enumerate() {
                if f.names().any(is_startup_code) {
                    continue;
                }
                if !go || f.names().any(is_go_program_code) {
                    self.select(exe, i, &f.name, None);
                }
            }
        }
        Ok(())
    }

    /// The functions the `-f` patterns match, each with its pattern's predicate.
    fn patterns(
        &mut self,
        options: &RecordOptions,
        executables: &[PathBuf],
        tables: &mut Tables,
        warnings: &mut Vec<String>,
        scope: Scope,
    ) -> Result<(), RecordError> {
        // The file each function is defined in, per module, read only for source file patterns.
        let mut source_files: BTreeMap<PathBuf, SourceFiles> = BTreeMap::new();
        for text in &options.functions {
            let (pattern_text, predicate) = filter::split(text)?;
            let predicate = Some(predicate).filter(|p| !p.is_empty());
            let pattern = FunctionPattern::parse(pattern_text)?;
            if left_out(&pattern, scope) {
                continue;
            }
            let modules = match tables.modules_of(&pattern, executables) {
                Ok(modules) => modules,
                // A launched command may be a wrapper: a library none of the targets loads yet may
                // be one a program it execs loads, looked for then (or reported at the end).
                Err(RecordError::Module(ModuleError::NotFound { spec, .. })) if scope.lenient => {
                    if !scope.exec_image {
                        warnings.push(format!(
                            "no file the command loads is module '{spec}': it is looked for in the libraries of each program the command executes"
                        ));
                    }
                    self.unmatched.push(Unmatched {
                        pattern: text.clone(),
                        modules: String::new(),
                        suggestions: Vec::new(),
                    });
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mut matched = 0;
            let mut in_source = 0;
            for module in &modules {
                let table = tables.load(module)?;
                let mut found: Vec<(usize, &str)> = table.matching(&pattern.name).map(|(i, _, n)| (i, n)).collect();
                if let Some(glob) = &pattern.source {
                    let files = source_files.entry(module.clone()).or_insert_with(|| SourceFiles::of(module, table));
                    in_source += files.defined_in(glob).count();
                    found.retain(|&(i, _)| files.file_of(table.functions[i].address).is_some_and(|f| glob.matches(f)));
                }
                for (i, name) in found {
                    self.select(module, i, name, predicate.as_ref());
                    matched += 1;
                }
            }
            // At start, a source glob that matches no file of a program's DWARF is a mistake to
            // say now; an exec'd image's is only unmatched (reported at the end).
            if let (Some(glob), 0, false, false) = (&pattern.source, in_source, scope.exec_image, modules.is_empty()) {
                let known: Vec<&SourceFiles> = source_files.values().collect();
                return Err(RecordError::NoSourceMatch {
                    glob: glob.as_str().to_string(),
                    modules: listed(&modules),
                    available: SourceFiles::listing(&known, 10),
                });
            }
            if matched == 0 {
                let mut suggestions: Vec<String> =
                    modules.iter().flat_map(|m| tables.tables[m].suggestions(pattern.name.as_str(), 5)).collect();
                suggestions.truncate(5);
                let modules = listed(&modules);
                if !scope.lenient {
                    return Err(RecordError::NoMatch { pattern: text.clone(), modules, suggestions });
                }
                self.unmatched.push(Unmatched { pattern: text.clone(), modules, suggestions });
            }
        }
        Ok(())
    }

    /// The trigger functions, chosen whether or not a pattern chose them, with their roles.
    fn triggers(
        &mut self,
        options: &RecordOptions,
        executables: &[PathBuf],
        tables: &mut Tables,
        scope: Scope,
    ) -> Result<(), RecordError> {
        for (role, option, patterns) in
            [(gate::START, "--start-at", &options.start_at), (gate::STOP, "--stop-at", &options.stop_at)]
        {
            for text in patterns {
                let pattern = FunctionPattern::parse(text)?;
                // Triggers are resolved at start only (see their check below).
                if scope.libraries || left_out(&pattern, scope) {
                    continue;
                }
                let modules = tables.modules_of(&pattern, executables)?;
                let mut matched = 0;
                for module in &modules {
                    let table = tables.load(module)?;
                    for (i, _, name) in table.matching(&pattern.name) {
                        self.select(module, i, name, None);
                        *self.roles.entry((module.clone(), i)).or_default() |= role;
                        matched += 1;
                    }
                }
                // Checked once, at start: an image exec'd later that lacks a trigger function
                // still has its `-f` functions traced.
                if matched == 0 && !scope.exec_image {
                    return Err(RecordError::NoTriggerMatch {
                        option,
                        pattern: text.clone(),
                        modules: listed(&modules),
                    });
                }
            }
        }
        Ok(())
    }
}

/// Whether `pattern` is left out of this pass over an exec'd image: one naming a module
/// (`libc.so.6:malloc`) from the image's own pass, one naming none from its libraries' pass.
fn left_out(pattern: &FunctionPattern, scope: Scope) -> bool {
    scope.exec_image && pattern.module.is_some() != scope.libraries
}

/// Modules, for a message.
fn listed(modules: &[PathBuf]) -> String {
    modules.iter().map(|m| m.display().to_string()).collect::<Vec<_>>().join(", ")
}

/// The C runtime's start-up and shutdown code that the toolchain links into every executable:
/// not the program's own, and left out of the default selection (it would top every report and
/// flame graph); a pattern still probes it.
const STARTUP_CODE: &[&str] = &[
    "_start",
    "_init",
    "_fini",
    "frame_dummy",
    "register_tm_clones",
    "deregister_tm_clones",
    "__do_global_dtors_aux",
    "__libc_csu_init",
    "__libc_csu_fini",
    "_dl_relocate_static_pie",
];

fn is_startup_code(name: &str) -> bool {
    STARTUP_CODE.contains(&name)
}
/// A `-f` pattern that matched no function of the images it was resolved against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Unmatched {
    /// The pattern as given (with its predicate).
    pub pattern: String,
    /// The images it was resolved against, comma-separated.
    pub modules: String,
    /// The "did you mean" names.
    pub suggestions: Vec<String>,
}

/// Whether a file's functions cannot be read because it is no program of its own: not an ELF
/// file (a `#!` script) or one without function symbols (a stripped `dash`).
fn is_not_a_program(e: &RecordError) -> bool {
    matches!(e, RecordError::Symbols(SymbolError::NotElf { .. } | SymbolError::NoFunctions { .. }))
}
/// The source file of each function of one module (DWARF `DW_AT_decl_file`), for `-f
/// 'src/net.c:*'`.
struct SourceFiles {
    by_address: BTreeMap<u64, Arc<str>>,
    /// Why there are none, when the DWARF could not be read.
    error: Option<String>,
}

impl SourceFiles {
    fn of(module: &Path, table: &SymbolTable) -> SourceFiles {
        let addresses: Vec<u64> = table.functions.iter().map(|f| f.address).collect();
        let size = crate::debuginfo::layout::DEFAULT_STRING_SIZE;
        match crate::debuginfo::source_functions(module, &addresses, size) {
            Ok((found, _)) => SourceFiles {
                by_address: found.into_iter().filter_map(|(a, f)| Some((a, f.file?))).collect(),
                error: None,
            },
            Err(e) => SourceFiles { by_address: BTreeMap::new(), error: Some(e.to_string()) },
        }
    }

    fn file_of(&self, address: u64) -> Option<&str> {
        self.by_address.get(&address).map(|f| &**f)
    }

    /// The functions defined in a file matching `glob`.
    fn defined_in<'a>(&'a self, glob: &'a crate::functions::symbols::SourceGlob) -> impl Iterator<Item = u64> + 'a {
        self.by_address.iter().filter(|(_, f)| glob.matches(f)).map(|(&a, _)| a)
    }

    /// The source files of `all`, at most `limit` of them named, for an error.
    fn listing(all: &[&SourceFiles], limit: usize) -> String {
        let files: BTreeSet<&str> = all.iter().flat_map(|s| s.by_address.values().map(|f| &**f)).collect();
        if files.is_empty() {
            return match all.iter().find_map(|s| s.error.as_deref()) {
                Some(e) => format!("their DWARF could not be read ({e})"),
                None => "they have no DWARF naming source files (build with -g)".to_string(),
            };
        }
        let named: Vec<&str> = files.iter().take(limit).copied().collect();
        let more = if files.len() > limit { format!(" and {} more", files.len() - limit) } else { String::new() };
        format!("the source files there are {}{more}", named.join(", "))
    }
}
