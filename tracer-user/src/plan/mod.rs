//! What to trace, resolved and checked before anything is attached or launched: targets,
//! functions (symbols, DWARF, source globs), USDT sites, and the probes they need. `record`, `top`,
//! `list` and the agent all start from a [`Plan`].
//!
//! Everything a user can get wrong is checked in [`plan`], before anything is attached or
//! launched; the options and the errors are in `options.rs`.

pub(crate) mod choose;
pub mod filter;
pub mod list;
mod options;
pub mod ring_size;

pub use options::{DEFAULT_MAX_PROBES, RecordError, RecordOptions, check_pid_namespace, check_root};

use std::{
    collections::{BTreeMap, HashSet},
    path::{Path, PathBuf},
    sync::Arc,
};

use tracer_common::{CAPTURE_BYTES_MAX, cookie, gate};

use self::choose::{Choice, Tables, Unmatched};
use crate::{
    assemble::{FunctionTable, NativeReturns, ProbedFunction},
    breakpoints,
    debuginfo::layout::FunctionLayout,
    event::host,
    event::{EventKind, ProbePaths},
    functions::disasm::Exit,
    functions::placement::{EntryPoint, ProbePath, ProbeSummary},
    functions::symbols::{Exits, Function, NamesFrom, Placement, SymbolTable},
    functions::unwinding::{self, ReturnProbes},
    kernel::btf::KernelFacts,
    kernel::features::KernelProbes,
    kernel::sites::ProbeSpec,
    targets::detached,
    targets::launch::Start,
    targets::modules::ModuleCandidates,
    targets::{self, FileId, Process},
    usdt::{
        self,
        select::{ProbeFiles, RegisterOffsets, Selection as UsdtSelection, UsdtPattern},
    },
};

/// Everything resolved and checked, nothing attached yet.
pub struct Plan {
    pub(crate) options: RecordOptions,
    /// The kernel ring buffer's size: `--buffer-size`, or fitted (see [`ring_size`]).
    pub(crate) ring_bytes: u32,
    /// `--pid` targets, and processes already running a `--binary`.
    pub(crate) processes: Vec<Process>,
    pub(crate) binaries: Vec<(PathBuf, FileId)>,
    pub(crate) command: Option<PathBuf>,
    /// The main executables of the targets, each once: whose functions are probed by default.
    pub(crate) executables: Vec<PathBuf>,
    pub(crate) probes: Vec<ProbeSpec>,
    pub(crate) functions: FunctionTable,
    pub(crate) probe_paths: ProbePaths,
    /// The probed functions' other names, by the name their events carry (`trace_start.aliases`).
    pub(crate) aliases: BTreeMap<String, Vec<String>>,
    /// The USDT probe sites: program events and `-u` probes.
    pub(crate) usdt: UsdtSelection,
    /// `-B` breakpoints and `-w` watchpoints, resolved in the executable.
    pub(crate) breakpoints: breakpoints::select::Selection,
    /// One line on the paths the probes take (see [`ProbePaths::summary`]).
    pub probe_summary: Option<ProbeSummary>,
    /// Things the user should know that do not stop the trace.
    pub warnings: Vec<String>,
    /// The functions decided in the kernel: predicates (`-f 'FUNC if EXPR'`, `ret-if`) and
    /// `--min-duration`.
    pub(crate) filters: Vec<FilterSpec>,
    /// The `-f` patterns that matched nothing in the launched command (it may run what they
    /// match: they are resolved again against each image it execs).
    pub(crate) unmatched: Vec<Unmatched>,
}

/// A function whose calls the kernel decides on: its predicates, compiled, with their text.
#[derive(Clone, Debug)]
pub(crate) struct FilterSpec {
    pub function: u32,
    pub entry: Option<(tracer_common::filter::Program, String)>,
    pub ret: Option<(tracer_common::filter::Program, String)>,
    /// Decided at the return (`cookie::HOLD`): `ret` or `--min-duration`.
    pub held: bool,
    /// Decided by its thread's gate (`cookie::GATED`: `--start-at`, `--stop-at`, `--depth`),
    /// with its role there (`gate::START`, `STOP`, `NO_RETURN`; 0 for none).
    pub gate: Option<u8>,
}

impl FilterSpec {
    /// How the kernel decides on `function`'s calls, before its probes are placed: its
    /// predicates compiled (`layout` names their parameters), whether its calls are held to their
    /// return, its gate role. Only native functions' calls are decided in the kernel.
    fn of(
        options: &RecordOptions,
        function: u32,
        name: &str,
        native: bool,
        predicate: &filter::Predicates,
        role: u8,
        layout: Option<&FunctionLayout>,
    ) -> Result<FilterSpec, RecordError> {
        if !predicate.is_empty() && !native {
            return Err(RecordError::FilterOnGo(name.to_string()));
        }
        // Calls decided at their return: their entries are held in the kernel until then.
        let held = native && (predicate.ret.is_some() || options.min_duration_ns > 0);
        if held && !options.events.contains(&EventKind::Return) {
            return Err(RecordError::HeldWithoutReturnEvents);
        }
        let compiled = |p: &filter::Predicate, at_return| {
            p.compile(name, layout, at_return).map(|program| (program, p.text.clone()))
        };
        Ok(FilterSpec {
            function,
            entry: predicate.entry.as_ref().map(|p| compiled(p, false)).transpose()?,
            ret: predicate.ret.as_ref().map(|p| compiled(p, true)).transpose()?,
            held,
            // Calls decided by their thread's gate (Go functions' returns are not matched by
            // stack pointer: they are written as they come).
            gate: (native && options.gated()).then_some(role),
        })
    }

    /// The spec once the function's returns are placed (`returns`), or `None` when the kernel
    /// has nothing to decide. A function whose returns are not probed cannot be decided at its
    /// return, nor close its thread's gate.
    fn settled(mut self, returns: &NativeReturns, name: &str) -> Result<Option<FilterSpec>, RecordError> {
        if matches!(returns, NativeReturns::None) {
            if self.held {
                if self.ret.is_some() {
                    return Err(RecordError::HeldWithoutReturn(name.to_string()));
                }
                // No return to decide at: its calls are written as they come (a warning names
                // it), not held for ever.
                self.held = false;
            }
            // Decided at its entry but never opened on its thread's gate: no return will close it.
            if let Some(role) = &mut self.gate {
                *role |= gate::NO_RETURN;
            }
        }
        let decides = self.entry.is_some() || self.ret.is_some() || self.held || self.gate.is_some();
        Ok(decides.then_some(self))
    }

    /// The flags every probe of the function carries, for the programs to evaluate or honour
    /// its predicates.
    fn cookie_flags(&self) -> u64 {
        (if self.entry.is_some() { cookie::FILTERED } else { 0 })
            | if self.held { cookie::HOLD } else { 0 }
            | match self.gate {
                Some(0) => cookie::GATED,
                Some(_) => cookie::GATED | cookie::GATE_ROLE,
                None => 0,
            }
    }
}

/// Resolves targets and functions. Fails, before anything is attached or launched, on anything
/// the user got wrong.
pub fn plan(options: RecordOptions) -> Result<Plan, RecordError> {
    if options.pids.is_empty() && options.binaries.is_empty() && options.command.is_empty() {
        return Err(RecordError::NoTargets);
    }
    host::check_name(&options.host)?;
    check_pid_namespace()?;
    // Checked before anything is read; the default is fitted once the probes are known.
    if let Some(size) = options.buffer_size {
        ring_size::checked(size)?;
    }
    if options.capture_bytes as usize > CAPTURE_BYTES_MAX {
        return Err(RecordError::CaptureBytesTooLarge(options.capture_bytes));
    }
    if !(1..=crate::debuginfo::layout::MAX_STRING_SIZE).contains(&options.string_size) {
        return Err(RecordError::BadStringSize(options.string_size));
    }
    let want_calls = options.events.contains(&EventKind::Call) || options.events.contains(&EventKind::Return);
    if !want_calls && !options.functions.is_empty() {
        return Err(RecordError::FunctionsWithoutCallEvents);
    }
    if let Some(depth) = options.depth
        && !(1..=gate::MAX_OPEN as u32).contains(&depth)
    {
        return Err(RecordError::BadDepth(depth));
    }
    if options.gated() && !options.events.contains(&EventKind::Return) {
        return Err(RecordError::GateWithoutReturnEvents);
    }
    // The kernel's BTF is parsed (once) while the targets' symbols and DWARF are read: both take
    // tens of milliseconds, and they are independent.
    std::thread::spawn(|| KernelFacts::running().is_ok());
    let mut warnings = Vec::new();

    let mut processes = Vec::new();
    for &pid in &options.pids {
        let p = targets::inspect_process(pid)?;
        if p.pid != pid {
            warnings.push(format!("{pid} is a thread of process {}: tracing the whole process", p.pid));
        }
        if !processes.iter().any(|q: &Process| q.pid == p.pid) {
            processes.push(p);
        }
    }
    let mut binaries = Vec::new();
    for path in &options.binaries {
        let path = targets::check_executable(path)?;
        let id = FileId::of(&path)?;
        for p in targets::processes_running(id) {
            if !processes.iter().any(|q| q.pid == p.pid) {
                processes.push(p);
            }
        }
        binaries.push((path, id));
    }
    let command = match options.command.first() {
        Some(program) => Some(match &options.start {
            Start::Inherit | Start::InheritStdoutToStderr => targets::resolve_command(program)?,
            Start::Detached(d) => targets::resolve_command_in(program, detached::CLEAN_PATH, &d.cwd)?,
        }),
        None => None,
    };

    // The main executables whose functions are probed by default, each once.
    let mut executables: Vec<PathBuf> = Vec::new();
    let mut seen: Vec<FileId> = Vec::new();
    let candidates =
        processes.iter().map(|p| p.exe.clone()).chain(binaries.iter().map(|(p, _)| p.clone())).chain(command.clone());
    for exe in candidates {
        let id = FileId::of(&exe)?;
        if !seen.contains(&id) {
            seen.push(id);
            executables.push(exe);
        }
    }

    // A launched command may be a wrapper (a script, `sh -c`, `env`, `timeout`): what it runs
    // is resolved as it is exec'd (see `record::follow`), so nothing matching in it is no error.
    let scope = Scope { lenient: command.is_some(), ..Scope::PLAN };
    let Selection { probes, functions, probe_paths, aliases, probe_summary, filters, unmatched } = if want_calls {
        select_functions(&options, &executables, &processes, &mut warnings, scope)?
    } else {
        Selection::default()
    };
    // (An executable whose functions could not be read was named in a warning already.)
    for u in unmatched.iter().filter(|u| !u.modules.is_empty()) {
        let close = match u.suggestions.is_empty() {
            true => String::new(),
            false => format!(" (did you mean {}?)", u.suggestions.join(", ")),
        };
        warnings
            .push(format!("{} defines no function matching '{}'{close}: following its execs", u.modules, u.pattern));
    }
    let usdt = select_usdt(&options, &executables, &processes, &mut warnings)?;
    let mut breakpoints = select_breakpoints(&options, &executables)?;
    warnings.append(&mut breakpoints.warnings);
    let ipc = options.events.contains(&EventKind::Send) || options.events.contains(&EventKind::Recv);
    let load = ring_size::Load { fast: !probes.is_empty() || !usdt.probes.is_empty() || ipc, cpus: ring_size::cpus() };
    let ring_bytes = options.buffer_size.unwrap_or_else(|| ring_size::fitted_here(load));
    Ok(Plan {
        ring_bytes,
        options,
        processes,
        binaries,
        command,
        executables,
        probes,
        functions,
        probe_paths,
        aliases,
        usdt,
        breakpoints,
        probe_summary,
        warnings,
        filters,
        unmatched,
    })
}

/// The `-B` breakpoints and `-w` watchpoints, in the first executable (the command's, or the
/// first process's): checked before anything is attached.
fn select_breakpoints(
    options: &RecordOptions,
    executables: &[PathBuf],
) -> Result<breakpoints::select::Selection, RecordError> {
    if options.breaks.is_empty() && options.watches.is_empty() {
        return Ok(breakpoints::select::Selection::default());
    }
    if options.watches.len() > tracer_common::MAX_WATCHPOINTS {
        return Err(breakpoints::BreakpointError::TooManyWatches(options.watches.len()).into());
    }
    if (!options.breaks.is_empty() && !options.events.contains(&EventKind::Break))
        || (!options.watches.is_empty() && !options.events.contains(&EventKind::Watch))
    {
        return Err(RecordError::BreakpointsWithoutEvents);
    }
    if !options.watches.is_empty()
        && let Some(why) = breakpoints::hardware::unavailable()
    {
        return Err(RecordError::NoHardwareBreakpoints(why));
    }
    let exe = executables.first().ok_or(breakpoints::BreakpointError::NoExecutable)?;
    let regs = RegisterOffsets::from_facts(KernelFacts::running()?)?;
    Ok(breakpoints::select::select(exe, &options.breaks, &options.watches, &regs, options.string_size)?)
}

/// The USDT sites to attach: every program-event probe of the targets' executables and libraries
/// (with `log` events), and the probes the `-u` patterns match.
fn select_usdt(
    options: &RecordOptions,
    executables: &[PathBuf],
    processes: &[Process],
    warnings: &mut Vec<String>,
) -> Result<UsdtSelection, RecordError> {
    let program_events = options.events.contains(&EventKind::Log);
    if !options.usdt.is_empty() && !options.events.contains(&EventKind::Usdt) {
        return Err(RecordError::UsdtWithoutUsdtEvents);
    }
    if !program_events && options.usdt.is_empty() {
        return Ok(UsdtSelection::default());
    }
    let patterns = options.usdt.iter().map(|p| UsdtPattern::parse(p)).collect::<Result<Vec<_>, _>>()?;
    let pids: Vec<u32> = processes.iter().map(|p| p.pid).collect();
    let candidates = ModuleCandidates::new(executables, &pids);
    let mut files = ProbeFiles::load(candidates.files())?;
    let regs = RegisterOffsets::from_facts(KernelFacts::running()?)?;
    let mut selection = usdt::select::select(&mut files, &candidates, &patterns, &regs, program_events)?;
    warnings.append(&mut selection.warnings);
    Ok(selection)
}

/// How [`select_functions`] resolves: at plan time (strict, or lenient for a launched command,
/// which may be a wrapper), or against an image a traced process exec'd.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scope {
    /// The first function's index (its cookie): the functions already probed come before.
    pub first_function: u32,
    /// An executable that is not an ELF file (a `#!` script) or defines no functions, and a
    /// pattern that matches nothing, are not errors: the trace follows what the command executes.
    pub lenient: bool,
    /// An image a traced process exec'd: patterns naming a module (`libc.so.6:malloc`) were
    /// resolved at start (a library's probes hold in every process) and are left out here.
    pub exec_image: bool,
}

impl Scope {
    const PLAN: Scope = Scope { first_function: 0, lenient: false, exec_image: false };
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
    let mut tables = Tables::new(pids);
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

impl Plan {
    /// Functions to probe.
    pub fn probe_count(&self) -> usize {
        self.functions.len()
    }
}
