//! Where the chosen functions' probes go: for each function [`choose`](super::choose) picked, its
//! probes (a native function's entry and returns, by the return address or at its exits; a Go
//! function's entry and `ret`s), the cookie of each, and what the kernel decides on its calls
//! ([`FilterSpec`]).

use std::{
    collections::{BTreeMap, HashSet},
    path::{Path, PathBuf},
    sync::Arc,
};

use tracer_common::cookie;

use super::{
    FilterSpec, RecordError, RecordOptions,
    choose::{Choice, Tables, Unmatched},
};
use crate::{
    assemble::{FunctionTable, NativeReturns, ProbedFunction},
    debuginfo::layout::FunctionLayout,
    event::{EventKind, ProbePaths},
    functions::disasm::Exit,
    functions::placement::{EntryPoint, ProbePath, ProbeSummary},
    functions::symbols::{Exits, Function, NamesFrom, Placement, SymbolTable},
    functions::unwinding::{self, ReturnProbes},
    kernel::features::KernelProbes,
    kernel::sites::ProbeSpec,
    targets::{Process, modules::ModuleCandidates},
};

/// How [`select_functions`] resolves: at plan time (strict, or lenient for a launched command,
/// which may be a wrapper), or against an image a traced process exec'd.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scope {
    /// The first function's index (its cookie): the functions already probed come before.
    pub first_function: u32,
    /// An executable that is not an ELF file (a `#!` script) or defines no functions, and a
    /// pattern that matches nothing, are not errors: the trace follows what the command executes.
    pub lenient: bool,
    /// An image a traced process exec'd, resolved in two passes: its own functions, by the
    /// patterns naming no module; then (`libraries`) the libraries it needs, by the patterns
    /// naming a module (`libc.so.6:malloc`), those [`crate::record`]'s exec follower found a library
    /// for that no earlier pass probed (a library's probes hold in every process).
    pub exec_image: bool,
    /// The second pass over an exec'd image: the patterns naming a module only.
    pub libraries: bool,
}

impl Scope {
    pub(super) const PLAN: Scope = Scope { first_function: 0, lenient: false, exec_image: false, libraries: false };
}

/// The functions to probe: those matching `--functions`, or every function of the main
/// executables but their C runtime start-up code.
pub(crate) fn select_functions(
    options: &RecordOptions,
    executables: &[PathBuf],
    processes: &[Process],
    warnings: &mut Vec<String>,
    scope: Scope,
) -> Result<Selection, RecordError> {
    let pids: Vec<u32> = processes.iter().map(|p| p.pid).collect();
    // An exec'd image's libraries are not mapped yet: they are read from its needs.
    let mut tables = match scope.libraries {
        true => Tables::with_candidates(ModuleCandidates::with_dependencies(executables)),
        false => Tables::new(pids),
    };
    let executables = tables.readable(executables, options, warnings, scope)?;
    let executables = &executables[..];
    let Choice { selected, mut event_names, mut predicates, roles, unmatched, .. } =
        Choice::of(options, executables, &mut tables, warnings, scope)?;
    if selected.len() > options.max_probes {
        return Err(RecordError::TooManyProbes { count: selected.len(), max: options.max_probes });
    }
    let mut sources = source_level(&selected, &tables.tables, options.string_size, warnings);
    stripped(&tables.tables, &sources, warnings);
    let (return_probes, unwinder) = return_probes(options, executables, &mut tables);
    let mut placed = Placed::new(options, return_probes);
    let mut functions = Vec::with_capacity(selected.len());
    let mut aliases = BTreeMap::new();
    let mut filters = Vec::new();
    for key in selected {
        let (module, index) = (&key.0, key.1);
        let table = &tables.tables[module];
        let f = &table.functions[index];
        let name = event_names.remove(&key).unwrap_or_else(|| f.name.clone());
        let function = scope.first_function + functions.len() as u32;
        let source = sources.remove(&key).map(Arc::new);
        let layout = source.as_ref().and_then(|s| s.layout.as_ref());
        let predicate = predicates.remove(&key).unwrap_or_default();
        let role = roles.get(&key).copied().unwrap_or(0);
        let native = matches!(f.placement, Placement::Native { .. });
        let filter = FilterSpec::of(options, function, &name, native, &predicate, role, layout)?;
        let chosen = Chosen { module, f, function, name: &name };
        let first_probe = placed.probes.len();
        let returns = match &f.placement {
            Placement::Native { entry, exits } => placed.native(&chosen, entry, exits.as_ref(), layout),
            Placement::Go { entry, entry_path, returns } => {
                let goid_offset = table.go.as_ref().map_or(0, |go| go.goid_offset());
                placed.go(&chosen, (*entry, *entry_path), returns, goid_offset);
                NativeReturns::None
            }
            Placement::Refused(why) => {
                placed.refused.push((name, format!("{}: {why}", module.display())));
                continue;
            }
        };
        // Every probe of a filtered function evaluates or honours its predicate.
        if let Some(spec) = filter.settled(&returns, &name)? {
            for p in &mut placed.probes[first_probe..] {
                p.cookie |= spec.cookie_flags();
            }
            filters.push(spec);
        }
        let others = f.other_names(&name);
        if !others.is_empty() {
            aliases.insert(name.clone(), others);
        }
        functions.push(ProbedFunction {
            name: Arc::from(name.as_str()),
            module: Arc::from(module.to_string_lossy()),
            source,
            returns,
        });
    }
    placed.warn(functions.is_empty(), options, warnings)?;
    let probe_summary = placed.summary(unwinder.as_ref());
    let Placed { probes, probe_paths, .. } = placed;
    Ok(Selection { probes, functions, probe_paths, aliases, probe_summary, filters, unmatched })
}

/// A stripped file whose debug file was found (libc with libc6-dbg) gives its functions'
/// parameters: saying only that it is stripped would tell the user the opposite.
fn stripped(
    tables: &BTreeMap<PathBuf, SymbolTable>,
    sources: &BTreeMap<(PathBuf, usize), crate::debuginfo::SourceFunction>,
    warnings: &mut Vec<String>,
) {
    for (path, table) in tables {
        if table.names_from == NamesFrom::Dynsym && !sources.keys().any(|(module, _)| module == path) {
            warnings
                .push(format!("{} is stripped: only its exported functions (.dynsym) can be probed", path.display()));
        }
    }
}

/// How native returns are probed: as `--return-probes` says, else by the return address unless
/// a program here unwinds stacks (see `unwinding`), which is returned too, as the reason.
fn return_probes(
    options: &RecordOptions,
    executables: &[PathBuf],
    tables: &mut Tables,
) -> (ReturnProbes, Option<unwinding::Unwinder>) {
    let exit = options.events.contains(&EventKind::Return);
    let unwinder = if exit && options.return_probes.is_none() {
        // The executables first: their own use is the clearest reason to give.
        let files: Vec<PathBuf> = executables.iter().chain(tables.candidates(executables).files()).cloned().collect();
        unwinding::unwinder(&files)
    } else {
        None
    };
    let return_probes = match (options.return_probes, &unwinder) {
        (Some(chosen), _) => chosen,
        (None, Some(_)) => ReturnProbes::Exits,
        (None, None) => ReturnProbes::ReturnAddress,
    };
    (return_probes, unwinder)
}

/// A function being placed: its file, its symbol, its index (its cookie) and its event name.
struct Chosen<'a> {
    module: &'a Path,
    f: &'a Function,
    function: u32,
    name: &'a str,
}

/// The probes placed on the chosen functions, and what the user is told about them after.
struct Placed {
    entry: bool,
    exit: bool,
    return_probes: ReturnProbes,
    probes: Vec<ProbeSpec>,
    probe_paths: ProbePaths,
    /// Functions that cannot take a return probe safely.
    no_return: Vec<String>,
    /// Native functions whose exits cannot all be found, with `ReturnProbes::Exits`.
    exits_unknown: Vec<String>,
    /// Exit sites probed, with `ReturnProbes::Exits`.
    exit_sites: usize,
    /// Functions not probed (event name, why).
    refused: Vec<(String, String)>,
    /// The Go functions probed, by event name: the fast-path advice differs for them.
    go_functions: HashSet<String>,
}

impl Placed {
    fn new(options: &RecordOptions, return_probes: ReturnProbes) -> Placed {
        Placed {
            entry: options.events.contains(&EventKind::Call),
            exit: options.events.contains(&EventKind::Return),
            return_probes,
            probes: Vec::new(),
            probe_paths: ProbePaths::default(),
            no_return: Vec::new(),
            exits_unknown: Vec::new(),
            exit_sites: 0,
            refused: Vec::new(),
            go_functions: HashSet::new(),
        }
    }

    fn probe(&mut self, module: &Path, file_offset: u64, cookie: u64, ret: bool) {
        self.probes.push(ProbeSpec { path: module.to_path_buf(), file_offset, cookie, ret });
    }

    /// A native function's probes: its entry, and its returns by the return address or at its
    /// exits. Returns how its returns arrive.
    fn native(
        &mut self,
        chosen: &Chosen,
        point: &EntryPoint,
        exits: Option<&Exits>,
        layout: Option<&FunctionLayout>,
    ) -> NativeReturns {
        let &Chosen { module, f, function, name } = chosen;
        let strings = |ret: bool| {
            let reads = layout.is_some_and(|l| if ret { l.probe.ret.kind != 0 } else { l.probe.entry_strings > 0 });
            if reads { cookie::STRINGS } else { 0 }
        };
        let return_safe = f.return_probe_is_safe();
        if self.exit && !return_safe {
            self.no_return.push(name.to_string());
        }
        // Both probes on the chosen point: a uretprobe there still finds the caller's return
        // address on top of the stack (only `endbr64` and nops come before it).
        let at = f.file_offset + point.offset;
        let mut entry_cookie = cookie::plain(function) | strings(false);
        let mut returns = NativeReturns::None;
        if self.exit && return_safe {
            returns = match self.return_probes {
                ReturnProbes::ReturnAddress => {
                    self.probe(module, at, cookie::plain(function) | strings(true), true);
                    NativeReturns::ReturnAddress
                }
                ReturnProbes::Exits => match exits.and_then(|e| exit_probes(f, function, e)) {
                    Some(sites) => {
                        self.exit_sites += sites.len();
                        for (offset, cookie, value) in sites {
                            if self.entry && offset == at {
                                // The entry instruction is an exit too: its one probe writes
                                // both, in order.
                                entry_cookie = cookie::with_exit(entry_cookie, cookie);
                            } else {
                                self.probe(module, offset, cookie | if value { strings(true) } else { 0 }, false);
                            }
                        }
                        let extent = exits.map(|e| e.extent.clone()).unwrap_or_default();
                        NativeReturns::AtExits { extent: extent.into() }
                    }
                    None => {
                        self.exits_unknown.push(name.to_string());
                        NativeReturns::None
                    }
                },
            };
        }
        if self.entry {
            self.probe(module, at, entry_cookie, false);
        }
        self.probe_paths.add(name, point.path);
        if point.offset != 0 {
            self.probe_paths.moved.insert(name.to_string(), point.offset);
        }
        returns
    }

    /// A Go function's probes: its entry (`at`, on the path given), and each `ret`.
    fn go(&mut self, chosen: &Chosen, (at, entry_path): (u64, ProbePath), returns: &[u64], goid_offset: u16) {
        let &Chosen { module, f, function, name } = chosen;
        if self.entry {
            self.probe(module, at, cookie::go(function, false, goid_offset), false);
        }
        if self.exit {
            for &ret in returns {
                self.probe(module, ret, cookie::go(function, true, goid_offset), false);
            }
        }
        // A `ret` is single-stepped: with return probes a Go function traps.
        let path = if self.exit && !returns.is_empty() { ProbePath::Trap } else { entry_path };
        self.probe_paths.add(name, path);
        if at != f.file_offset {
            self.probe_paths.moved.insert(name.to_string(), at - f.file_offset);
        }
        self.go_functions.insert(name.to_string());
    }

    /// What the user is told about the functions placed: those refused (an error when nothing
    /// else is probed), and those whose returns are not probed.
    fn warn(&self, none_probed: bool, options: &RecordOptions, warnings: &mut Vec<String>) -> Result<(), RecordError> {
        if let Some((_, why)) = self.refused.first() {
            if none_probed {
                return Err(RecordError::GoRefused(why.clone()));
            }
            let names: Vec<&str> = self.refused.iter().take(5).map(|(n, _)| n.as_str()).collect();
            warnings.push(format!(
                "{} functions not probed ({}{}): {why}",
                self.refused.len(),
                names.join(", "),
                if self.refused.len() > 5 { ", ..." } else { "" }
            ));
        }
        // Unasked-for functions (no -f) like `_start` need no remark.
        if !self.no_return.is_empty() && !options.functions.is_empty() {
            warnings.push(format!(
                "no return probes on {} (entry points and functions that return twice cannot take one safely)",
                self.no_return.join(", ")
            ));
        }
        if !self.exits_unknown.is_empty() {
            let mut names: Vec<&str> = self.exits_unknown.iter().take(5).map(String::as_str).collect();
            if self.exits_unknown.len() > 5 {
                names.push("...");
            }
            warnings.push(format!(
                "no return probes on {} ({}): where they end cannot all be found in their code (a jump through \
                 memory), and a return-address probe would break unwinding in this program; their calls are traced",
                plural(self.exits_unknown.len(), "function"),
                names.join(", ")
            ));
        }
        Ok(())
    }

    /// One line on the paths the probes take, and where returns are probed when not by the
    /// return address, with why (`unwinder`).
    fn summary(&self, unwinder: Option<&unwinding::Unwinder>) -> Option<ProbeSummary> {
        let mut summary =
            self.probe_paths.summary(|f| self.go_functions.contains(f), self.exit, KernelProbes::current());
        if let (ReturnProbes::Exits, Some(ProbeSummary { line, .. })) = (self.return_probes, &mut summary) {
            let why = match unwinder {
                Some(u) => {
                    format!("{u}, and a return-address probe would abort it when it unwinds through a traced call")
                }
                None => "as asked".to_string(),
            };
            line.push_str(&format!(
                "; returns probed where they happen ({}, a trap each): {why}",
                plural(self.exit_sites, "ret and tail-jump site")
            ));
        }
        summary
    }
}

/// The probes on `f`'s exits (file offset, cookie, whether the return value is there to read),
/// or `None` when one cannot be given a cookie (a `jmp reg` too far from the function's start).
fn exit_probes(f: &Function, function: u32, exits: &Exits) -> Option<Vec<(u64, u64, bool)>> {
    exits
        .sites
        .iter()
        .map(|&exit| {
            Some(match exit {
                Exit::Return(at) => (at, cookie::ret_site(function, false), true),
                Exit::Jump(at) => (at, cookie::ret_site(function, true), false),
                Exit::JumpIf { address, condition } => (address, cookie::ret_site_if(function, condition), false),
                Exit::JumpTo { address, register } => {
                    let site = u16::try_from(address.checked_sub(f.file_offset)?).ok()?;
                    (address, cookie::ret_site_to(function, register, site), false)
                }
            })
        })
        .collect()
}

/// "1 function", "3 functions".
fn plural(n: usize, what: &str) -> String {
    if n == 1 { format!("1 {what}") } else { format!("{n} {what}s") }
}

/// What the DWARF of each selected native function says (calls at source level), keyed as
/// `selected` is. A module without DWARF gives nothing; one whose DWARF cannot be read gives a
/// warning, not a failure (its calls keep their registers).
fn source_level(
    selected: &[(PathBuf, usize)],
    tables: &BTreeMap<PathBuf, SymbolTable>,
    string_size: u16,
    warnings: &mut Vec<String>,
) -> BTreeMap<(PathBuf, usize), crate::debuginfo::SourceFunction> {
    let mut by_module: BTreeMap<&PathBuf, Vec<usize>> = BTreeMap::new();
    for (module, index) in selected {
        // Go's register ABI is not the layout's (System V and Rust's).
        if matches!(tables[module].functions[*index].placement, Placement::Native { .. }) {
            by_module.entry(module).or_default().push(*index);
        }
    }
    let mut out = BTreeMap::new();
    for (module, indexes) in by_module {
        let table = &tables[module];
        let addresses: Vec<u64> = indexes.iter().map(|&i| table.functions[i].address).collect();
        match crate::debuginfo::source_functions(module, &addresses, string_size) {
            Ok((mut found, rejected)) => {
                for r in rejected {
                    warnings.push(format!(
                        "debug file {} does not fit {}: {}",
                        r.path.display(),
                        module.display(),
                        crate::errors::report(&r.why)
                    ));
                }
                for i in indexes {
                    if let Some(source) = found.remove(&table.functions[i].address) {
                        out.insert((module.clone(), i), source);
                    }
                }
            }
            Err(e) => {
                let cause = std::error::Error::source(&e).map(|c| format!(": {c}")).unwrap_or_default();
                warnings.push(format!("calls in {} keep their registers only: {e}{cause}", module.display()));
            }
        }
    }
    out
}

/// What [`select_functions`] chose.
#[derive(Default)]
pub(crate) struct Selection {
    pub probes: Vec<ProbeSpec>,
    pub functions: FunctionTable,
    pub probe_paths: ProbePaths,
    pub aliases: BTreeMap<String, Vec<String>>,
    pub probe_summary: Option<ProbeSummary>,
    /// The functions decided in the kernel.
    pub filters: Vec<FilterSpec>,
    /// The patterns that matched nothing (leniently; strictly they are errors).
    pub unmatched: Vec<Unmatched>,
}
