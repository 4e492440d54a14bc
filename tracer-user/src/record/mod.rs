//! Recording a trace: check and resolve what to trace ([`plan`]), load and attach everything
//! ([`Plan::start`]), then drain events into a sink until the targets are gone, the duration
//! elapses or the caller stops it ([`Recording::run`]).
//!
//! Everything a user can get wrong is checked in [`plan`], before anything is attached or launched.

pub mod attach;
pub mod drain;
pub mod kernel_log;
pub mod resolve;

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::OsString,
    future::Future,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use aya::maps::{MapData, RingBuf};
use tracer_common::{CAPTURE_BYTES_MAX, Config, RecordKind, cookie, kind_bit, lost_slot};

use crate::{
    assemble::clock::BootClock,
    assemble::{EventAssembler, FunctionTable, ProbedFunction, lost_slot_name},
    event::host::{self, Machine, NameError},
    event::{EndReason, EventKind, FORMAT_VERSION, ProbePaths, TargetInfo, TraceEnd, TraceStart},
    pipeline::EventPipeline,
    pipeline::order::REORDER_WINDOW_NS,
    record::attach::kernel_btf::{KernelBtf, KernelBtfError},
    record::attach::launch::{ChildExit, LaunchError, RunAs, spawn_stopped, try_reap},
    record::attach::loader::{Kernel, LoadError, LostCounters, ProbeSpec, raise_fd_limit},
    record::drain::{Batch, RingDrain},
    record::kernel_log::KernelLog,
    record::resolve::modules::{ModuleCandidates, ModuleError},
    record::resolve::placement::ProbePath,
    record::resolve::symbols::{FunctionPattern, Placement, SymbolError, SymbolTable, is_go_program_code},
    record::resolve::targets::{self, FileId, Process, TargetError},
    sink::Sink,
    usdt::{
        self,
        select::{ProbeFiles, RegisterOffsets, Selection as UsdtSelection, UsdtPattern},
    },
};

/// Default `--max-probes`.
pub const DEFAULT_MAX_PROBES: usize = 4096;
/// Default `--buffer-size`: 64 MiB holds about 700,000 call records: a second of a busy target.
pub const DEFAULT_BUFFER_SIZE: u32 = 64 << 20;
/// How often liveness of the targets is checked.
pub(crate) const TICK: Duration = Duration::from_millis(50);
/// How often the sink is flushed: with the reorder window, an event is in the file (safe from a
/// `kill -9` of the tracer) about half a second after it happened.
const FLUSH_EVERY: Duration = Duration::from_millis(250);
/// How often [`Progress::lost`] is brought up to date (it reads every CPU's counters).
const PROGRESS_LOST_EVERY: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub struct RecordOptions {
    pub pids: Vec<u32>,
    pub binaries: Vec<PathBuf>,
    /// The command to launch, program first; empty for none.
    pub command: Vec<OsString>,
    pub functions: Vec<String>,
    /// `-u [MODULE:]PROVIDER:NAME` patterns: USDT probes to trace besides the program events.
    pub usdt: Vec<String>,
    pub events: BTreeSet<EventKind>,
    pub follow_children: bool,
    pub duration: Option<Duration>,
    pub buffer_size: u32,
    pub max_probes: usize,
    /// Bytes read of each string parameter or return value at most (`--string-size`).
    pub string_size: u16,
    /// `--capture-bytes`: payload bytes kept from each send and receive (0: none; at most
    /// [`CAPTURE_BYTES_MAX`]).
    pub capture_bytes: u32,
    /// The host name written in every event (checked with [`host::check_name`]; default: this
    /// machine's host name).
    pub host: String,
    /// Run the command as this user (the agent launching for a socket-group member).
    pub run_as: Option<RunAs>,
    /// `--debug-kernel`: the eBPF programs log their rare failures through aya-log, and the
    /// recording forwards those records to the `log` crate (target `tracer_ebpf::...`).
    pub debug_kernel: bool,
}

impl Default for RecordOptions {
    fn default() -> Self {
        RecordOptions {
            pids: Vec::new(),
            binaries: Vec::new(),
            command: Vec::new(),
            functions: Vec::new(),
            usdt: Vec::new(),
            events: EventKind::ALL.into_iter().collect(),
            follow_children: true,
            duration: None,
            buffer_size: DEFAULT_BUFFER_SIZE,
            max_probes: DEFAULT_MAX_PROBES,
            string_size: crate::debuginfo::layout::DEFAULT_STRING_SIZE,
            capture_bytes: 0,
            host: host::default_name(),
            run_as: None,
            debug_kernel: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("tracer must run as root (it loads eBPF programs into the kernel)")]
    NotRoot,
    #[error("nothing to trace: give --pid, --binary, or a command after --")]
    NoTargets,
    #[error(transparent)]
    HostName(#[from] NameError),
    #[error(
        "tracer must run in the initial pid namespace: the kernel reports the pids of that namespace, so in another one it would trace the wrong processes or none (run it on the host, or in a container with --pid=host)"
    )]
    NotInitialPidNamespace,
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Symbols(#[from] SymbolError),
    #[error(transparent)]
    Module(#[from] ModuleError),
    #[error("function pattern '{pattern}' matches nothing in {modules}{}", suggest(.suggestions))]
    NoMatch { pattern: String, modules: String, suggestions: Vec<String> },
    #[error(
        "{count} functions would be probed, more than --max-probes ({max}); narrow the selection with -f (e.g. -f 'app::*')"
    )]
    TooManyProbes { count: usize, max: usize },
    #[error("no function of {modules} is defined in a source file matching '{glob}': {available}")]
    NoSourceMatch { glob: String, modules: String, available: String },
    #[error("--functions needs call or return events, but --events has neither")]
    FunctionsWithoutCallEvents,
    #[error("--capture-bytes is at most {CAPTURE_BYTES_MAX}, got {0}")]
    CaptureBytesTooLarge(u32),
    #[error("--string-size must be between 1 and {max}, got {0}", max = crate::debuginfo::layout::MAX_STRING_SIZE)]
    BadStringSize(u16),
    #[error("--buffer-size must be a power of two multiple of the page size (4 KiB), got {0}")]
    BadBufferSize(u32),
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    KernelBtf(#[from] KernelBtfError),
    #[error("no function could be probed: {0}")]
    NoProbeAttached(String),
    #[error(transparent)]
    Usdt(#[from] crate::usdt::select::SelectError),
    #[error("--usdt needs usdt events, but --events does not have them")]
    UsdtWithoutUsdtEvents,
    #[error("cannot probe the Go functions of {0}")]
    GoRefused(String),
    #[error("writing the trace failed")]
    Output(#[from] std::io::Error),
}

fn suggest(suggestions: &[String]) -> String {
    if suggestions.is_empty() { String::new() } else { format!("; did you mean {}?", suggestions.join(", ")) }
}

/// Checks that the process can load eBPF programs.
pub fn check_root() -> Result<(), RecordError> {
    if nix::unistd::geteuid().is_root() { Ok(()) } else { Err(RecordError::NotRoot) }
}

/// The inode of the initial pid namespace (`PROC_PID_INIT_INO` in the kernel's `proc_ns.h`).
const INITIAL_PID_NAMESPACE: u64 = 0xEFFF_FFFC;

/// The trace's pids are the initial pid namespace's (what `bpf_get_current_pid_tgid` and the
/// sched tracepoints report), and so are the pids the user gives and the tracer launches: a
/// tracer in another pid namespace would compare numbers from two namespaces.
pub fn check_pid_namespace() -> Result<(), RecordError> {
    use std::os::unix::fs::MetadataExt as _;
    match std::fs::metadata("/proc/self/ns/pid") {
        Ok(m) if m.ino() != INITIAL_PID_NAMESPACE => Err(RecordError::NotInitialPidNamespace),
        // Without /proc/self/ns (very old kernels, no procfs) there is nothing to tell.
        _ => Ok(()),
    }
}

/// Everything resolved and checked, nothing attached yet.
pub struct Plan {
    pub(crate) options: RecordOptions,
    /// `--pid` targets, and processes already running a `--binary`.
    pub(crate) processes: Vec<Process>,
    pub(crate) binaries: Vec<(PathBuf, FileId)>,
    pub(crate) command: Option<PathBuf>,
    pub(crate) probes: Vec<ProbeSpec>,
    pub(crate) functions: FunctionTable,
    pub(crate) probe_paths: ProbePaths,
    /// The USDT probe sites: program events and `-u` probes.
    pub(crate) usdt: UsdtSelection,
    /// One line on the paths the probes take (see [`ProbePaths::summary`]).
    pub probe_summary: Option<String>,
    /// Things the user should know that do not stop the trace.
    pub warnings: Vec<String>,
}

/// Resolves targets and functions. Fails, before anything is attached or launched, on anything
/// the user got wrong.
pub fn plan(options: RecordOptions) -> Result<Plan, RecordError> {
    if options.pids.is_empty() && options.binaries.is_empty() && options.command.is_empty() {
        return Err(RecordError::NoTargets);
    }
    host::check_name(&options.host)?;
    check_pid_namespace()?;
    let size = options.buffer_size;
    if !size.is_power_of_two() || size < 4096 {
        return Err(RecordError::BadBufferSize(size));
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
        Some(program) => Some(targets::resolve_command(program)?),
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

    let Selection { probes, functions, probe_paths, probe_summary } = if want_calls {
        select_functions(&options, &executables, &processes, &mut warnings)?
    } else {
        Selection::default()
    };
    let usdt = select_usdt(&options, &executables, &processes, &mut warnings)?;
    Ok(Plan { options, processes, binaries, command, probes, functions, probe_paths, usdt, probe_summary, warnings })
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
    let regs = RegisterOffsets::from_btf(&KernelBtf::load()?)?;
    let mut selection = usdt::select::select(&mut files, &candidates, &patterns, &regs, program_events)?;
    warnings.append(&mut selection.warnings);
    Ok(selection)
}

/// The functions to probe: those matching `--functions`, or every function of the main
/// executables.
fn select_functions(
    options: &RecordOptions,
    executables: &[PathBuf],
    processes: &[Process],
    warnings: &mut Vec<String>,
) -> Result<Selection, RecordError> {
    let entry = options.events.contains(&EventKind::Call);
    let exit = options.events.contains(&EventKind::Return);
    let mut tables: BTreeMap<PathBuf, SymbolTable> = BTreeMap::new();
    fn load<'a>(
        tables: &'a mut BTreeMap<PathBuf, SymbolTable>,
        path: &PathBuf,
    ) -> Result<&'a SymbolTable, RecordError> {
        if !tables.contains_key(path) {
            tables.insert(path.clone(), SymbolTable::load(path)?);
        }
        Ok(&tables[path])
    }
    // (module, function index) in selection order, each once.
    let mut selected: Vec<(PathBuf, usize)> = Vec::new();
    fn select(selected: &mut Vec<(PathBuf, usize)>, module: &PathBuf, index: usize) {
        if !selected.iter().any(|(m, i)| m == module && *i == index) {
            selected.push((module.clone(), index));
        }
    }
    if options.functions.is_empty() {
        for exe in executables {
            let table = match load(&mut tables, exe) {
                Ok(table) => table,
                // A stripped executable that exports nothing: still worth tracing its processes.
                Err(RecordError::Symbols(SymbolError::NoFunctions { path })) => {
                    warnings.push(format!("{} has no function symbols: tracing its processes only", path.display()));
                    continue;
                }
                Err(e) => return Err(e),
            };
            // Of a Go program, its own code: the runtime's and the standard library's thousands of
            // functions (schedulers, the garbage collector) would bury it.
            let go = table.go.is_some();
            for (i, f) in table.functions.iter().enumerate() {
                if !go || f.names().any(is_go_program_code) {
                    select(&mut selected, exe, i);
                }
            }
        }
    } else {
        let pids: Vec<u32> = processes.iter().map(|p| p.pid).collect();
        let mut module_candidates = None;
        // The file each function is defined in, per module, read only for source file patterns.
        let mut source_files: BTreeMap<PathBuf, SourceFiles> = BTreeMap::new();
        for text in &options.functions {
            let pattern = FunctionPattern::parse(text)?;
            let modules = match &pattern.module {
                None => executables.to_vec(),
                Some(spec) => {
                    let candidates = module_candidates.get_or_insert_with(|| ModuleCandidates::new(executables, &pids));
                    vec![candidates.resolve(spec)?]
                }
            };
            let mut matched = 0;
            let mut in_source = 0;
            for module in &modules {
                let table = load(&mut tables, module)?;
                let mut found: Vec<usize> = table.matching(&pattern.name).map(|(i, _)| i).collect();
                if let Some(glob) = &pattern.source {
                    let files = source_files.entry(module.clone()).or_insert_with(|| SourceFiles::of(module, table));
                    in_source += files.defined_in(glob).count();
                    found.retain(|&i| files.file_of(table.functions[i].address).is_some_and(|f| glob.matches(f)));
                }
                for i in found {
                    select(&mut selected, module, i);
                    matched += 1;
                }
            }
            if let (Some(glob), 0) = (&pattern.source, in_source) {
                let modules = modules.iter().map(|m| m.display().to_string()).collect::<Vec<_>>().join(", ");
                let known: Vec<&SourceFiles> = source_files.values().collect();
                return Err(RecordError::NoSourceMatch {
                    glob: glob.as_str().to_string(),
                    modules,
                    available: SourceFiles::listing(&known, 10),
                });
            }
            if matched == 0 {
                let mut suggestions: Vec<String> =
                    modules.iter().flat_map(|m| tables[m].suggestions(pattern.name.as_str(), 5)).collect();
                suggestions.truncate(5);
                let modules = modules.iter().map(|m| m.display().to_string()).collect::<Vec<_>>().join(", ");
                return Err(RecordError::NoMatch { pattern: text.clone(), modules, suggestions });
            }
        }
    }
    if selected.len() > options.max_probes {
        return Err(RecordError::TooManyProbes { count: selected.len(), max: options.max_probes });
    }
    for (path, table) in &tables {
        if table.stripped {
            warnings
                .push(format!("{} is stripped: only its exported functions (.dynsym) can be probed", path.display()));
        }
    }

    let mut sources = source_level(&selected, &tables, options.string_size, warnings);
    let mut probes = Vec::with_capacity(selected.len());
    let mut functions = Vec::with_capacity(selected.len());
    let mut no_return = Vec::new();
    let mut refused: Vec<(String, String)> = Vec::new();
    let mut probe_paths = ProbePaths::default();
    let mut go_probed = false;
    for (module, index) in selected {
        let table = &tables[&module];
        let f = &table.functions[index];
        let function = functions.len() as u32;
        let source = sources.remove(&(module.clone(), index)).map(Arc::new);
        let reads = |ret: bool| {
            let layout = source.as_ref().and_then(|s| s.layout.as_ref());
            layout.is_some_and(|l| if ret { l.probe.ret.kind != 0 } else { l.probe.entry_strings > 0 })
        };
        let strings = |ret: bool| if reads(ret) { cookie::STRINGS } else { 0 };
        let mut probe = |file_offset: u64, cookie: u64, ret: bool| {
            probes.push(ProbeSpec { path: module.clone(), file_offset, cookie, ret });
        };
        match &f.placement {
            Placement::Native(point) => {
                let return_safe = f.return_probe_is_safe();
                if exit && !return_safe {
                    no_return.push(f.name.clone());
                }
                // Both probes on the chosen point: a uretprobe there still finds the caller's
                // return address on top of the stack (only `endbr64` and nops come before it).
                let at = f.file_offset + point.offset;
                if entry {
                    probe(at, cookie::plain(function) | strings(false), false);
                }
                if exit && return_safe {
                    probe(at, cookie::plain(function) | strings(true), true);
                }
                probe_paths.add(&f.name, point.path);
                if point.offset != 0 {
                    probe_paths.moved.insert(f.name.clone(), point.offset);
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
                probe_paths.add(&f.name, path);
                if *at != f.file_offset {
                    probe_paths.moved.insert(f.name.clone(), *at - f.file_offset);
                }
                go_probed = true;
            }
            Placement::Refused(why) => {
                refused.push((f.name.clone(), format!("{}: {why}", module.display())));
                continue;
            }
        }
        functions.push(ProbedFunction {
            name: Arc::from(f.name.as_str()),
            module: Arc::from(module.to_string_lossy()),
            source,
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
    let probe_summary = probe_paths.summary(go_probed);
    Ok(Selection { probes, functions, probe_paths, probe_summary })
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
        if matches!(tables[module].functions[*index].placement, Placement::Native(_)) {
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
                        r.why
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
    fn defined_in<'a>(
        &'a self,
        glob: &'a crate::record::resolve::symbols::SourceGlob,
    ) -> impl Iterator<Item = u64> + 'a {
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

/// What [`select_functions`] chose.
#[derive(Default)]
struct Selection {
    probes: Vec<ProbeSpec>,
    functions: FunctionTable,
    probe_paths: ProbePaths,
    probe_summary: Option<String>,
}

impl Plan {
    /// Functions to probe.
    pub fn probe_count(&self) -> usize {
        self.functions.len()
    }

    /// Launches the command (stopped), loads and attaches everything, starts tracing the targets,
    /// and lets the command run.
    pub fn start(self) -> Result<Recording, RecordError> {
        let Plan { options, processes, binaries, command, probes, functions, probe_paths, usdt, .. } = self;
        let mut warnings = Vec::new();
        let events = &options.events;
        let child = match &command {
            Some(path) => Some(spawn_stopped(path, &options.command, options.run_as.as_ref())?),
            None => None,
        };

        let mut enabled_kinds = 0;
        if events.contains(&EventKind::Spawn) {
            enabled_kinds |= kind_bit(RecordKind::Fork) | kind_bit(RecordKind::Exec);
        }
        if events.contains(&EventKind::Exit) {
            enabled_kinds |= kind_bit(RecordKind::Exit);
        }
        let want_ipc = events.contains(&EventKind::Send) || events.contains(&EventKind::Recv);
        if want_ipc {
            enabled_kinds |= kind_bit(RecordKind::Ipc);
        }
        if events.contains(&EventKind::Signal) {
            enabled_kinds |= kind_bit(RecordKind::Signal);
        }
        if events.contains(&EventKind::Log) {
            enabled_kinds |= kind_bit(RecordKind::UserEvent);
        }
        if events.contains(&EventKind::Usdt) {
            enabled_kinds |= kind_bit(RecordKind::Usdt);
        }
        let config = Config {
            enabled_kinds,
            follow_children: options.follow_children as u32,
            has_target_inodes: !binaries.is_empty() as u32,
            top_by_process: 0,
            wakeup_bytes: wakeup_bytes(options.buffer_size),
            capture_bytes: options.capture_bytes,
            debug: options.debug_kernel as u32,
            offsets: KernelBtf::load()?.offsets()?,
        };
        raise_fd_limit(1024);
        let mut kernel = Kernel::load(&config, options.buffer_size, usdt.probes.len())?;
        // Started before any program is loaded, and kept for the whole run: its map's fd is in
        // the programs' code.
        let kernel_log = if options.debug_kernel { Some(kernel.start_kernel_log()?) } else { None };
        kernel.attach_sched()?;
        if want_ipc {
            kernel.attach_ipc()?;
        }
        if events.contains(&EventKind::Signal) {
            kernel.attach_signals()?;
        }
        for (i, f) in functions.iter().enumerate() {
            if let Some(layout) = f.source.as_ref().and_then(|s| s.layout.as_ref())
                && layout.probe.reads_memory()
            {
                kernel.set_layout(i as u32, layout.probe.to_bytes())?;
            }
        }
        let failures = kernel.attach_functions(&probes)?;
        // A function with any probe that failed counts as not probed (its other probes stay).
        let failed: BTreeSet<u32> = failures.iter().map(|f| cookie::function(f.cookie)).collect();
        let attached = functions.len() - failed.len();
        if !probes.is_empty() && attached == 0 {
            return Err(RecordError::NoProbeAttached(failures[0].reason.clone()));
        }
        if !failures.is_empty() {
            let mut listed: Vec<String> = Vec::new();
            for f in failures.iter().take(5) {
                listed.push(format!("{} ({})", functions[cookie::function(f.cookie) as usize].name, f.reason));
            }
            warnings.push(format!(
                "{} of {} functions could not be probed: {}{}",
                failed.len(),
                functions.len(),
                listed.join(", "),
                if failures.len() > 5 { ", ..." } else { "" }
            ));
        }
        let usdt_failures = kernel.attach_usdt(&usdt.probes)?;
        if let Some(first) = usdt_failures.first() {
            let probe = &usdt.table[first.cookie as usize];
            warnings.push(format!(
                "{} of {} USDT probe sites could not be attached (first: {}:{} in {}: {})",
                usdt_failures.len(),
                usdt.probes.len(),
                probe.provider,
                probe.name,
                probe.module,
                first.reason
            ));
        }
        let ring = kernel.take_ring()?;
        let lost = kernel.take_lost_counters()?;

        // Probes are in place: only now do the targets become traced, so every call they make
        // from here on is seen whole.
        for (_, id) in &binaries {
            kernel.trace_executable(id.kernel_key())?;
        }
        for p in &processes {
            kernel.trace_pid(p.pid)?;
        }
        if let Some(child) = &child {
            kernel.trace_pid(child.pid())?;
        }

        let clock = BootClock::calibrate();
        let mut targets: Vec<TargetInfo> = processes
            .iter()
            .map(|p| TargetInfo::Process { pid: p.pid, comm: p.comm.clone(), exe: p.exe.display().to_string() })
            .collect();
        targets.extend(binaries.iter().map(|(path, _)| TargetInfo::Binary { path: path.display().to_string() }));
        if let (Some(child), Some(path)) = (&child, &command) {
            targets.push(TargetInfo::Command {
                pid: child.pid(),
                argv: targets::command_display(&options.command),
                exe: path.display().to_string(),
            });
        }
        let start = TraceStart {
            format_version: FORMAT_VERSION,
            host: options.host.clone(),
            tracer_version: env!("CARGO_PKG_VERSION").to_string(),
            ts: clock.now_unix_ns(),
            clock: clock.info(),
            targets,
            probes: attached,
            events: events.iter().copied().collect(),
            follow_children: options.follow_children,
            probe_paths,
            hosts: vec![],
            machine: Some(Machine::read()),
        };
        let return_probes = options.events.contains(&EventKind::Return);
        let assembler = EventAssembler::new(Arc::from(options.host.as_str()), clock, functions, return_probes)
            .with_usdt(usdt.table);
        let child_pid = match child {
            Some(child) => Some(child.release()?),
            None => None,
        };
        Ok(Recording {
            kernel,
            ring,
            lost,
            kernel_log,
            assembler,
            clock,
            start,
            child_pid,
            ends_when_empty: binaries.is_empty(),
            duration: options.duration,
            kinds: options.events.clone(),
            usdt_sites: usdt.probes.len() - usdt_failures.len(),
            progress: Arc::default(),
            warnings,
        })
    }
}

/// A trace in progress: probes attached, targets running.
pub struct Recording {
    kernel: Kernel,
    ring: RingBuf<MapData>,
    lost: LostCounters,
    /// `--debug-kernel`: the programs' aya-log records.
    kernel_log: Option<KernelLog>,
    assembler: EventAssembler,
    clock: BootClock,
    start: TraceStart,
    child_pid: Option<u32>,
    /// With `--binary`, new processes may start at any time: the trace does not end for lack of
    /// targets.
    ends_when_empty: bool,
    duration: Option<Duration>,
    kinds: BTreeSet<EventKind>,
    /// USDT probe sites attached (program events and `-u` probes).
    pub usdt_sites: usize,
    progress: Arc<Progress>,
    /// Things found while attaching that do not stop the trace (the plan's are in [`Plan::warnings`]).
    pub warnings: Vec<String>,
}

/// What a recording has done so far, readable from elsewhere while [`Recording::run`] runs (a
/// status line). Events written are current after every batch; the lost count is at most
/// [`PROGRESS_LOST_EVERY`] old.
#[derive(Debug, Default)]
pub struct Progress {
    events_written: AtomicU64,
    lost: AtomicU64,
}

impl Progress {
    pub fn events_written(&self) -> u64 {
        self.events_written.load(Ordering::Relaxed)
    }

    /// Events lost so far, counted as `trace_end.lost_events` counts them.
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }
}

/// How a recording ended.
#[derive(Debug)]
pub struct Outcome {
    pub end: TraceEnd,
    /// How the launched command ended, if it did while traced.
    pub command_exit: Option<ChildExit>,
    /// The launched command's pid, when it was still running as tracing stopped.
    pub command_still_running: Option<u32>,
}

impl Recording {
    pub fn trace_start(&self) -> &TraceStart {
        &self.start
    }

    /// The launched command's pid, if there is one.
    pub fn command_pid(&self) -> Option<u32> {
        self.child_pid
    }

    /// The recording's progress, updated while it runs.
    pub fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }

    /// Drains events into `sink` until the trace ends: the command and its traced descendants
    /// exit, every traced process exits, the duration elapses, or `stop` resolves.
    pub async fn run(self, sink: &mut dyn Sink, stop: impl Future<Output = EndReason>) -> Result<Outcome, RecordError> {
        let Recording {
            mut kernel,
            ring,
            lost,
            kernel_log,
            mut assembler,
            clock,
            start,
            child_pid,
            ends_when_empty,
            duration,
            kinds,
            progress,
            ..
        } = self;
        let mut pipeline = EventPipeline::new(kinds);
        let mut drain = RingDrain::spawn(ring)?;
        let mut kernel_log = kernel_log.map(KernelLog::polled).transpose()?;
        sink.begin(&start)?;
        sink.flush()?;
        let mut command_exit: Option<ChildExit> = None;
        let mut last_flush = tokio::time::Instant::now();
        let mut last_lost_count = tokio::time::Instant::now();
        let deadline = duration.map(|d| tokio::time::Instant::now() + d);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(stop);

        let reason = loop {
            tokio::select! {
                biased;
                reason = &mut stop => break reason,
                _ = sleep_until(deadline) => break EndReason::Duration,
                batch = drain.recv() => match batch {
                    Some(batch) => {
                        push_batch(&batch, &mut assembler, &mut pipeline);
                        pipeline.flush_ready(sink)?;
                        progress.events_written.store(pipeline.written, Ordering::Relaxed);
                    }
                    None => return Err(drain.join().err().unwrap_or_else(|| std::io::Error::other("the ring-buffer drain stopped")).into()),
                },
                ready = kernel_log::forward(&mut kernel_log) => ready?,
                _ = tick.tick() => {
                    pipeline.flush_older_than(clock.now_unix_ns().saturating_sub(REORDER_WINDOW_NS), sink)?;
                    progress.events_written.store(pipeline.written, Ordering::Relaxed);
                    if last_flush.elapsed() >= FLUSH_EVERY {
                        sink.flush()?;
                        last_flush = tokio::time::Instant::now();
                    }
                    if last_lost_count.elapsed() >= PROGRESS_LOST_EVERY {
                        let lost_so_far = lost_events(&lost, &assembler).values().sum();
                        progress.lost.store(lost_so_far, Ordering::Relaxed);
                        last_lost_count = tokio::time::Instant::now();
                    }
                    if let Some(pid) = child_pid
                        && command_exit.is_none()
                    {
                        command_exit = try_reap(pid);
                    }
                    let command_done = child_pid.is_none() || command_exit.is_some();
                    if command_done && ends_when_empty && !any_target_alive(&mut kernel) {
                        break if child_pid.is_some() { EndReason::CommandExited } else { EndReason::TargetsExited };
                    }
                }
            }
        };

        // Stop and detach first, so that no record arrives after the final drain.
        let end_ts = clock.now_unix_ns();
        kernel.stop_tracing();
        drop(kernel);
        drain.finish();
        while let Some(batch) = drain.recv().await {
            push_batch(&batch, &mut assembler, &mut pipeline);
        }
        drain.join()?;
        if let Some(log) = &mut kernel_log {
            log.flush();
        }
        pipeline.flush_all(sink)?;
        if let Some(pid) = child_pid
            && command_exit.is_none()
        {
            command_exit = try_reap(pid);
        }

        let lost_events = lost_events(&lost, &assembler);
        progress.events_written.store(pipeline.written, Ordering::Relaxed);
        progress.lost.store(lost_events.values().sum(), Ordering::Relaxed);
        let end = TraceEnd {
            ts: end_ts,
            reason,
            events_written: pipeline.written,
            lost_events,
            calls_without_return_probe: assembler.calls_without_return_probe(),
            command_exit_code: command_exit.map(ChildExit::shell_code),
            ipc: pipeline.ipc_stats(),
            hosts: Vec::new(),
        };
        sink.end(&end)?;
        let command_still_running = child_pid.filter(|_| command_exit.is_none());
        Ok(Outcome { end, command_exit, command_still_running })
    }
}

/// Events lost so far, by the name `trace_end.lost_events` gives them: the kernel's counters
/// and the records user space could not decode.
fn lost_events(lost: &LostCounters, assembler: &EventAssembler) -> BTreeMap<String, u64> {
    let counts = lost.read();
    let mut lost_events: BTreeMap<String, u64> = BTreeMap::new();
    for slot in 0..lost_slot::COUNT {
        if let Some(name) = lost_slot_name(slot) {
            *lost_events.entry(name.to_string()).or_default() += counts[slot as usize];
        }
    }
    lost_events.insert("undecodable".to_string(), assembler.undecodable);
    lost_events.insert("log_unreadable".to_string(), assembler.unreadable_logs);
    lost_events
}

/// How full the ring may get before a record wakes the drain (which otherwise polls every few
/// milliseconds): an eighth, capped at 1 MiB.
pub(crate) fn wakeup_bytes(ring_bytes: u32) -> u64 {
    (ring_bytes as u64 / 8).min(1 << 20)
}

/// Turns a batch of records into events for the pipeline.
fn push_batch(batch: &Batch, assembler: &mut EventAssembler, pipeline: &mut EventPipeline) {
    for record in batch.records() {
        if let Some(e) = assembler.assemble(record) {
            pipeline.push(e);
        }
    }
}

/// Whether any traced process still lives; forgets the ones that are gone (a process that exited
/// before it could be traced never produces the exit that would remove it).
pub(crate) fn any_target_alive(kernel: &mut Kernel) -> bool {
    let mut alive = false;
    for pid in kernel.traced_pids() {
        if targets::process_alive(pid) {
            alive = true;
        } else {
            kernel.untrace_pid(pid);
        }
    }
    alive
}

pub(crate) async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
