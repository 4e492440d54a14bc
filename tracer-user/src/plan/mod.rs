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
mod place;
pub mod ring_size;

pub use options::{DEFAULT_MAX_PROBES, RecordError, RecordOptions, check_pid_namespace, check_root};
pub(crate) use place::{Scope, Selection, select_functions};

use std::{collections::BTreeMap, path::PathBuf};

use tracer_common::{CAPTURE_BYTES_MAX, cookie, gate};

use self::choose::Unmatched;
use crate::{
    assemble::{FunctionTable, NativeReturns},
    breakpoints,
    debuginfo::layout::FunctionLayout,
    event::host,
    event::{EventKind, ProbePaths},
    functions::placement::ProbeSummary,
    kernel::btf::KernelFacts,
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
        // Calls decided at their return: their entries are held in the kernel until then (with
        // `--min-duration-keep-children`, durations are decided in user space instead).
        let held = native && (predicate.ret.is_some() || (options.min_duration_ns > 0 && !options.keep_children));
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
    if options.min_duration_ns > 0 && !options.events.contains(&EventKind::Return) {
        return Err(RecordError::HeldWithoutReturnEvents);
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

impl Plan {
    /// Functions to probe.
    pub fn probe_count(&self) -> usize {
        self.functions.len()
    }
}
