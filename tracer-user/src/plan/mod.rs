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
    path::PathBuf,
    sync::Arc,
};

use tracer_common::{CAPTURE_BYTES_MAX, cookie, gate};

use self::choose::{Choice, Tables, Unmatched};
use crate::{
    assemble::{FunctionTable, NativeReturns, ProbedFunction},
    breakpoints,
    event::host,
    event::{EventKind, ProbePaths},
    functions::disasm::Exit,
    functions::placement::{ProbePath, ProbeSummary},
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
    let entry = options.events.contains(&EventKind::Call);
    let exit = options.events.contains(&EventKind::Return);
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
    // A stripped file whose debug file was found (libc with libc6-dbg) gives its functions'
    // parameters: saying only that it is stripped would tell the user the opposite.
    for (path, table) in &tables.tables {
        if table.names_from == NamesFrom::Dynsym && !sources.keys().any(|(module, _)| module == path) {
            warnings
                .push(format!("{} is stripped: only its exported functions (.dynsym) can be probed", path.display()));
        }
    }

    // Returns by the return address, unless a program here unwinds stacks (see `unwinding`).
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
    let mut probes = Vec::with_capacity(selected.len());
    let mut functions = Vec::with_capacity(selected.len());
    let mut no_return = Vec::new();
    let mut exits_unknown = Vec::new();
    let mut exit_sites = 0usize;
    let mut refused: Vec<(String, String)> = Vec::new();
    let mut probe_paths = ProbePaths::default();
    let mut aliases = BTreeMap::new();
    let mut filters = Vec::new();
    // The Go functions probed, by event name: the fast-path advice differs for them.
    let mut go_functions: HashSet<String> = HashSet::new();
    for (module, index) in selected {
        let table = &tables.tables[&module];
        let f = &table.functions[index];
        let name = event_names.remove(&(module.clone(), index)).unwrap_or_else(|| f.name.clone());
        let function = scope.first_function + functions.len() as u32;
        let source = sources.remove(&(module.clone(), index)).map(Arc::new);
        let reads = |ret: bool| {
            let layout = source.as_ref().and_then(|s| s.layout.as_ref());
            layout.is_some_and(|l| if ret { l.probe.ret.kind != 0 } else { l.probe.entry_strings > 0 })
        };
        let strings = |ret: bool| if reads(ret) { cookie::STRINGS } else { 0 };
        let mut returns = NativeReturns::None;
        let predicate = predicates.remove(&(module.clone(), index)).unwrap_or_default();
        let native = matches!(f.placement, Placement::Native { .. });
        if !predicate.is_empty() && !native {
            return Err(RecordError::FilterOnGo(name));
        }
        // Calls decided at their return: their entries are held in the kernel until then.
        let held = native && (predicate.ret.is_some() || options.min_duration_ns > 0);
        // Calls decided by their thread's gate (Go functions' returns are not matched by stack
        // pointer: they are written as they come).
        let role = roles.get(&(module.clone(), index)).copied().unwrap_or(0);
        let gate = (native && options.gated()).then_some(role);
        if held && !exit {
            return Err(RecordError::HeldWithoutReturnEvents);
        }
        if !predicate.is_empty() || held || gate.is_some() {
            let layout = source.as_ref().and_then(|s| s.layout.as_ref());
            let compiled = |p: &filter::Predicate, at_return| {
                p.compile(&name, layout, at_return).map(|program| (program, p.text.clone()))
            };
            filters.push(FilterSpec {
                function,
                entry: predicate.entry.as_ref().map(|p| compiled(p, false)).transpose()?,
                ret: predicate.ret.as_ref().map(|p| compiled(p, true)).transpose()?,
                held,
                gate,
            });
        }
        // Every probe of a filtered function evaluates or honours its predicate.
        let flags = if predicate.entry.is_some() { cookie::FILTERED } else { 0 }
            | if held { cookie::HOLD } else { 0 }
            | match gate {
                Some(0) => cookie::GATED,
                Some(_) => cookie::GATED | cookie::GATE_ROLE,
                None => 0,
            };
        let first_probe = probes.len();
        let mut probe = |file_offset: u64, cookie: u64, ret: bool| {
            probes.push(ProbeSpec { path: module.clone(), file_offset, cookie: cookie | flags, ret });
        };
        match &f.placement {
            Placement::Native { entry: point, exits } => {
                let return_safe = f.return_probe_is_safe();
                if exit && !return_safe {
                    no_return.push(name.clone());
                }
                // Both probes on the chosen point: a uretprobe there still finds the caller's
                // return address on top of the stack (only `endbr64` and nops come before it).
                let at = f.file_offset + point.offset;
                let mut entry_cookie = cookie::plain(function) | strings(false);
                if exit && return_safe {
                    returns = match return_probes {
                        ReturnProbes::ReturnAddress => {
                            probe(at, cookie::plain(function) | strings(true), true);
                            NativeReturns::ReturnAddress
                        }
                        ReturnProbes::Exits => match exits.as_ref().and_then(|e| exit_probes(f, function, e)) {
                            Some(sites) => {
                                exit_sites += sites.len();
                                for (offset, cookie, value) in sites {
                                    if entry && offset == at {
                                        // The entry instruction is an exit too: its one probe
                                        // writes both, in order.
                                        entry_cookie = cookie::with_exit(entry_cookie, cookie);
                                    } else {
                                        probe(offset, cookie | if value { strings(true) } else { 0 }, false);
                                    }
                                }
                                let extent = exits.as_ref().map(|e| e.extent.clone()).unwrap_or_default();
                                NativeReturns::AtExits { extent: extent.into() }
                            }
                            None => {
                                exits_unknown.push(name.clone());
                                NativeReturns::None
                            }
                        },
                    };
                }
                if entry {
                    probe(at, entry_cookie, false);
                }
                probe_paths.add(&name, point.path);
                if point.offset != 0 {
                    probe_paths.moved.insert(name.clone(), point.offset);
                }
            }
            Placement::Go { entry: at, entry_path, returns } => {
                let goid_offset = table.go.as_ref().map_or(0, |go| go.goid_offset());
                if entry {
                    probe(*at, cookie::go(function, false, goid_offset), false);
                }
                if exit {
                    for &ret in returns {
                        probe(ret, cookie::go(function, true, goid_offset), false);
                    }
                }
                // A `ret` is single-stepped: with return probes a Go function traps.
                let path = if exit && !returns.is_empty() { ProbePath::Trap } else { *entry_path };
                probe_paths.add(&name, path);
                if *at != f.file_offset {
                    probe_paths.moved.insert(name.clone(), *at - f.file_offset);
                }
                go_functions.insert(name.clone());
            }
            Placement::Refused(why) => {
                refused.push((name.clone(), format!("{}: {why}", module.display())));
                continue;
            }
        }
        if held && matches!(returns, NativeReturns::None) {
            if predicate.ret.is_some() {
                return Err(RecordError::HeldWithoutReturn(name));
            }
            // No return to decide at: its calls are written as they come (the warning above
            // names it), not held for ever.
            for p in &mut probes[first_probe..] {
                p.cookie &= !cookie::HOLD;
            }
            if filters.last().is_some_and(|s: &FilterSpec| s.function == function) {
                filters.pop_if(|s| s.entry.is_none() && s.gate.is_none());
                if let Some(spec) = filters.last_mut().filter(|s| s.function == function) {
                    spec.held = false;
                }
            }
        }
        if gate.is_some() && matches!(returns, NativeReturns::None) {
            // Decided at its entry but never opened on its thread's gate: no return will close it.
            for p in &mut probes[first_probe..] {
                p.cookie |= cookie::GATE_ROLE;
            }
            if let Some(spec) = filters.last_mut().filter(|s| s.function == function) {
                spec.gate = Some(role | gate::NO_RETURN);
            }
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
    if let Some((_, why)) = refused.first() {
        if functions.is_empty() {
            return Err(RecordError::GoRefused(why.clone()));
        }
        let names: Vec<&str> = refused.iter().take(5).map(|(n, _)| n.as_str()).collect();
        warnings.push(format!(
            "{} functions not probed ({}{}): {why}",
            refused.len(),
            names.join(", "),
            if refused.len() > 5 { ", ..." } else { "" }
        ));
    }
    // Unasked-for functions (no -f) like `_start` need no remark.
    if !no_return.is_empty() && !options.functions.is_empty() {
        warnings.push(format!(
            "no return probes on {} (entry points and functions that return twice cannot take one safely)",
            no_return.join(", ")
        ));
    }
    if !exits_unknown.is_empty() {
        let mut names: Vec<&str> = exits_unknown.iter().take(5).map(String::as_str).collect();
        if exits_unknown.len() > 5 {
            names.push("...");
        }
        warnings.push(format!(
            "no return probes on {} ({}): where they end cannot all be found in their code (a jump through \
             memory), and a return-address probe would break unwinding in this program; their calls are traced",
            plural(exits_unknown.len(), "function"),
            names.join(", ")
        ));
    }
    let mut probe_summary = probe_paths.summary(|f| go_functions.contains(f), exit, KernelProbes::current());
    if let (ReturnProbes::Exits, Some(ProbeSummary { line, .. })) = (return_probes, &mut probe_summary) {
        let why = match &unwinder {
            Some(u) => format!("{u}, and a return-address probe would abort it when it unwinds through a traced call"),
            None => "as asked".to_string(),
        };
        line.push_str(&format!(
            "; returns probed where they happen ({}, a trap each): {why}",
            plural(exit_sites, "ret and tail-jump site")
        ));
    }
    Ok(Selection { probes, functions, probe_paths, aliases, probe_summary, filters, unmatched })
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
