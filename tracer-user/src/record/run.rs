//! A recording: load and attach a [`Plan`], launch its command, then drain the ring buffer
//! into a sink until the targets are gone, the duration elapses or the caller stops it.

use std::{
    collections::{BTreeMap, BTreeSet},
    future::Future,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use tracer_common::{Config, LostSlot, RecordKind, cookie, kind_bit};

use super::{
    StartGate,
    pace::{Deadline, liveness_tick},
};
use crate::{
    assemble::EventAssembler,
    assemble::clock::BootClock,
    assemble::{FunctionTable, NativeReturns},
    breakpoints::{
        decode::{BreakTable, WatchEntry, WatchTable},
        hardware,
        select::Selection as BreakpointSelection,
    },
    event::host::Machine,
    event::{
        EndReason, EventKind, FORMAT_VERSION, FilterStats, KernelInfo, ProbePaths, TargetInfo, TraceEnd, TraceStart,
    },
    kernel::loader::{FilterCounters, Kernel, LostCounters, raise_fd_limit},
    kernel::log::{self as kernel_log, KernelLog},
    kernel::sites::{ProbeSpec, UsdtProbe, UsdtProgram, Watchpoint},
    kernel::traced::any_target_alive,
    kernel::{btf::KernelFacts, features::KernelFeatures},
    pipeline::EventPipeline,
    pipeline::keep_children::KeepChildren,
    pipeline::order::REORDER_WINDOW_NS,
    plan::{FilterSpec, Plan, RecordError, RecordOptions},
    record::attached::Attached,
    record::drain::{Batch, RingDrain},
    record::follow::{ExecFollower, ExecToResolve, OwnSignals},
    sink::Sink,
    targets::launch::{ChildExit, OutputPipes, StoppedChild, spawn_stopped, try_reap},
    targets::{self, FileId, Process},
    usdt::select::Selection as UsdtSelection,
};

/// Runs `f` (which forks) with address-space randomization off for the children it makes; the
/// tracer's own setting is restored after.
fn without_randomization<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: `personality` only reads or sets this thread's execution domain flags.
    let previous = unsafe { libc::personality(0xffff_ffff) };
    if previous >= 0 {
        // SAFETY: as above.
        unsafe { libc::personality((previous as libc::c_ulong) | libc::ADDR_NO_RANDOMIZE as libc::c_ulong) };
    }
    let result = f();
    if previous >= 0 {
        // SAFETY: as above.
        unsafe { libc::personality(previous as libc::c_ulong) };
    }
    result
}

/// Functions with predicates the kernel counts for, when exec'd images may add some: the size of
/// its predicate map (`FILTERS` in tracer-ebpf/src/filter.rs).
const FOLLOWED_FILTERS: u32 = 16384;

/// How often the sink is flushed: with the reorder window, an event is in the file (safe from a
/// `kill -9` of the tracer) about half a second after it happened.
const FLUSH_EVERY: Duration = Duration::from_millis(250);
/// How often [`Progress::lost`] is brought up to date (it reads every CPU's counters).
const PROGRESS_LOST_EVERY: Duration = Duration::from_secs(1);

impl Recording {
    /// Starts recording `plan`: launches its command (stopped), loads and attaches everything,
    /// starts tracing the targets, and lets the command run.
    pub fn start(plan: Plan) -> Result<Recording, RecordError> {
        Recording::start_gated(plan, &StartGate::default())
    }

    /// [`Recording::start`], which a caller may give up on through `gate` until it traces its
    /// targets (`Err(Abandoned)` then); past that point it runs to its end.
    pub fn start_gated(plan: Plan, gate: &StartGate) -> Result<Recording, RecordError> {
        let Plan {
            options,
            ring_bytes,
            processes,
            binaries,
            command,
            probes,
            functions,
            probe_paths,
            aliases,
            usdt,
            filters,
            breakpoints,
            executables,
            unmatched,
            ..
        } = plan;
        let mut warnings = Vec::new();
        let events = &options.events;
        let mut child = launch(command.as_deref(), &options, &breakpoints)?;
        let command_output = child.as_mut().and_then(|c| c.take_output());
        let (btf, features) = kernel_features(&options, !probes.is_empty() || !usdt.probes.is_empty())?;
        // Function patterns apply to every image the traced processes exec (see `follow`).
        let want_calls = events.contains(&EventKind::Call) || events.contains(&EventKind::Return);
        let resolve_execs = want_calls && !options.functions.is_empty();
        let config = kernel_config(&options, ring_bytes, !binaries.is_empty(), resolve_execs, &breakpoints, btf)?;
        let breaks = BreakProbes::after(&usdt.probes, &breakpoints);
        raise_fd_limit(1024 + probes.len() as u64 + usdt.probes.len() as u64 + breaks.probes.len() as u64);
        let room = PredicateRoom::of(&options, &filters, resolve_execs);
        let gated = filters.iter().any(|f| f.gate.is_some());
        let mut kernel =
            Kernel::load_sized(&config, &features, ring_bytes, breaks.spec_slots(), 1, room.functions, gated)?;
        // Started before any program is loaded, and kept for the whole run: its map's fd is in
        // the programs' code.
        let kernel_log = if options.debug_kernel { Some(kernel.start_kernel_log()?) } else { None };
        attach_tracepoints(&mut kernel, events)?;
        set_predicates(&mut kernel, &filters, &functions)?;
        let attached = attach_functions(&mut kernel, &probes, &functions, &mut warnings)?;
        let usdt_sites = attach_usdt(&mut kernel, &usdt, &mut warnings)?;
        let break_sites = attach_breakpoints(&mut kernel, &breaks, &breakpoints, &mut warnings)?;
        warnings.extend(unreadable_strings(&kernel, &options));
        let (watch_table, watchpoints) = watchpoints(&breakpoints, &processes, child.as_ref(), &mut warnings);
        kernel.attach_watchpoints(&watchpoints)?;
        if resolve_execs {
            kernel.prepare_uprobe_programs()?;
        }
        // The drain runs from here on: whatever way start-up or the recording is left, what the
        // ring holds is read and every process stopped there continued (`Attached`).
        let drain = RingDrain::spawn(kernel.take_ring()?, kernel.call_rings()?)?;
        let lost = kernel.take_lost_counters()?;
        let filter_counters = filter_counters(&mut kernel, &filters, &functions, room.later)?;

        // From here on a traced process that execs may be stopped for tracer to resolve it: the
        // start can no longer be walked away from, and an error from here on ends `live`,
        // which continues whatever was stopped meanwhile.
        let mut live = Attached::new(kernel, drain);
        gate.commit()?;
        // The images resolved now: a traced process that execs one of them is not stopped.
        let pids: Vec<u32> = processes.iter().map(|p| p.pid).collect();
        let mut follower =
            resolve_execs.then(|| ExecFollower::new(options.clone(), &executables, &pids, unmatched, room.functions));
        trace_targets(live.kernel(), &binaries, &processes, &executables, follower.as_mut(), child.as_ref())?;
        test_pause_after_commit();

        let clock = BootClock::calibrate();
        let targets = target_infos(&processes, &binaries, child.as_ref().zip(command.as_deref()), &options);
        let start = trace_start(&options, &clock, targets, attached, probe_paths, aliases, features.info(ring_bytes));
        let return_probes = options.events.contains(&EventKind::Return);
        // `--min-duration-keep-children`: the native functions with return probes are decided
        // in user space, as the kernel writes them.
        let keep_children = options.keep_children.then(|| {
            let held = functions.iter().filter(|f| f.returns != NativeReturns::None).map(|f| f.name.clone());
            KeepChildren::new(options.min_duration_ns, held)
        });
        let assembler = EventAssembler::new(Arc::from(options.host.as_str()), clock, functions, return_probes)
            .with_usdt(usdt.table)
            .with_breakpoints(
                BreakTable { first_cookie: breaks.first_cookie, sites: breakpoints.break_sites },
                watch_table,
            );
        // Everything is in place: the command runs from its first instruction, traced.
        let child_pid = match child {
            Some(child) => Some(child.release()?),
            None => None,
        };
        Ok(Recording {
            live,
            lost,
            filter_counters,
            kernel_log,
            assembler,
            clock,
            start,
            child_pid,
            command_output,
            ends_when_empty: binaries.is_empty(),
            duration: options.duration,
            kinds: options.events.clone(),
            min_duration_ns: options.min_duration_ns,
            keep_children,
            usdt_sites,
            break_sites,
            watchpoints: watchpoints.len(),
            progress: Arc::default(),
            warnings,
            follower,
        })
    }
}

/// Why strings that functions and breakpoints read are unreadable in pages the traced program
/// has not touched yet, when the kernel cannot fault them in (no sleepable uprobes).
fn unreadable_strings(kernel: &Kernel, options: &RecordOptions) -> Option<String> {
    let why = kernel.sleepable_unavailable()?;
    let why = if options.no_sleepable {
        "--no-sleepable asks for the non-faulting read only".to_string()
    } else {
        why.to_string()
    };
    Some(format!(
        "a string in a page the traced program has not touched yet (of .rodata, say) cannot be read and is marked unreadable: {why}"
    ))
}

/// The predicates' counters, and each filtered function's event name and spec: when the kernel
/// decides on some function's calls, or may for functions found in exec'd images (`later`).
fn filter_counters(
    kernel: &mut Kernel,
    filters: &[FilterSpec],
    functions: &FunctionTable,
    later: bool,
) -> Result<Option<(FilterCounters, Vec<FilteredFunction>)>, RecordError> {
    if filters.is_empty() && !later {
        return Ok(None);
    }
    let named = filters.iter().map(|f| (functions[f.function as usize].name.to_string(), f.clone())).collect();
    Ok(Some((kernel.take_filter_counters()?, named)))
}

/// The trace's first line: what is traced, with which probes and events, on what machine and
/// kernel, from when.
fn trace_start(
    options: &RecordOptions,
    clock: &BootClock,
    targets: Vec<TargetInfo>,
    probes: usize,
    probe_paths: ProbePaths,
    aliases: BTreeMap<String, Vec<String>>,
    kernel: KernelInfo,
) -> TraceStart {
    TraceStart {
        format_version: FORMAT_VERSION,
        host: options.host.clone(),
        tracer_version: env!("CARGO_PKG_VERSION").to_string(),
        ts: clock.now_unix_ns(),
        clock: clock.info(),
        targets,
        probes,
        events: options.events.iter().copied().collect(),
        follow_children: options.follow_children,
        probe_paths,
        aliases,
        hosts: vec![],
        machine: Some(Machine::read()),
        kernel: Some(kernel),
    }
}

/// The test-only hook of start-up (the drain has the other, `TRACER_TEST_DRAIN_DELAY_MS`): with `TRACER_TEST_PAUSE_AFTER_COMMIT_MS` set, start-up
/// waits that long once its targets are traced, so that a test can have a process stopped at exec
/// before an error that comes after that point (`tests/tests/crash_and_signals.rs`). Not an
/// option: nothing but those tests has a use for it.
fn test_pause_after_commit() {
    if let Some(ms) = std::env::var("TRACER_TEST_PAUSE_AFTER_COMMIT_MS").ok().and_then(|v| v.parse().ok()) {
        std::thread::sleep(Duration::from_millis(ms));
    }
}

/// Launches the command, if there is one, stopped at its first instruction. A launched command's
/// watchpoints are opened before it execs, at addresses that must be known then: a
/// position-independent one starts with randomization off (see `breakpoints::hardware`).
fn launch(
    command: Option<&Path>,
    options: &RecordOptions,
    breakpoints: &BreakpointSelection,
) -> Result<Option<StoppedChild>, RecordError> {
    let fixed_layout = !breakpoints.watches.is_empty() && breakpoints.layout.pie;
    Ok(match command {
        Some(path) if fixed_layout => {
            Some(without_randomization(|| spawn_stopped(path, &options.command, &options.start))?)
        }
        Some(path) => Some(spawn_stopped(path, &options.command, &options.start)?),
        None => None,
    })
}

/// What the running kernel offers, as `--attach` and `--no-sleepable` narrow it; an error when
/// it cannot do what the plan needs.
fn kernel_features(
    options: &RecordOptions,
    probes_uprobes: bool,
) -> Result<(&'static KernelFacts, KernelFeatures), RecordError> {
    let btf = KernelFacts::running()?;
    let mut features = KernelFeatures::probe(btf);
    if let Some(mechanism) = options.attach {
        features = features.with_attach(mechanism)?;
    }
    if options.no_sleepable {
        features.sleepable_uprobes = false;
    }
    features.check(probes_uprobes)?;
    Ok((btf, features))
}

/// What the programs read at run time: the kinds to write, the options they decide, the kernel's
/// structure offsets.
fn kernel_config(
    options: &RecordOptions,
    ring_bytes: u32,
    has_target_inodes: bool,
    resolve_execs: bool,
    breakpoints: &BreakpointSelection,
    btf: &KernelFacts,
) -> Result<Config, RecordError> {
    Ok(Config {
        enabled_kinds: enabled_kinds(&options.events),
        follow_children: options.follow_children as u32,
        has_target_inodes: has_target_inodes as u32,
        top_by_process: 0,
        wakeup_bytes: wakeup_bytes(ring_bytes),
        capture_bytes: options.capture_bytes,
        debug: options.debug_kernel as u32,
        // With `--min-duration-keep-children` user space decides the durations.
        min_duration_ns: if options.keep_children { 0 } else { options.min_duration_ns },
        max_depth: options.depth.unwrap_or(0),
        start_off: !options.start_at.is_empty() as u32,
        resolve_execs: resolve_execs as u32,
        call_rings: crate::kernel::call_rings::count(),
        // Watchpoints survive exec: a hit in a process that exec'd another image is dropped.
        watch_image: match breakpoints.watches.is_empty() {
            true => tracer_common::InodeKey::default(),
            false => targets::FileId::of(&breakpoints.exe).map(|id| id.kernel_key()).unwrap_or_default(),
        },
        offsets: btf.offsets()?,
    })
}

/// The record kinds the kernel writes, for the events asked for (calls and returns are decided
/// by the probes placed).
fn enabled_kinds(events: &BTreeSet<EventKind>) -> u32 {
    let mut enabled_kinds = 0;
    if events.contains(&EventKind::Spawn) {
        enabled_kinds |= kind_bit(RecordKind::Fork) | kind_bit(RecordKind::Exec);
    }
    if events.contains(&EventKind::Exit) {
        enabled_kinds |= kind_bit(RecordKind::Exit);
    }
    if wants_ipc(events) {
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
    if events.contains(&EventKind::Break) {
        enabled_kinds |= kind_bit(RecordKind::Break);
    }
    if events.contains(&EventKind::Watch) {
        enabled_kinds |= kind_bit(RecordKind::Watch);
    }
    enabled_kinds
}

fn wants_ipc(events: &BTreeSet<EventKind>) -> bool {
    events.contains(&EventKind::Send) || events.contains(&EventKind::Recv)
}

/// The breakpoints' probe sites: they share the USDT programs and specs, with cookies after the
/// USDT probes'.
struct BreakProbes {
    first_cookie: u64,
    probes: Vec<UsdtProbe>,
}

impl BreakProbes {
    fn after(usdt: &[UsdtProbe], breakpoints: &BreakpointSelection) -> BreakProbes {
        let first_cookie = usdt.iter().map(|p| p.cookie + 1).max().unwrap_or(0);
        let probes = breakpoints
            .break_probes
            .iter()
            .enumerate()
            .map(|(i, b)| UsdtProbe {
                path: b.path.clone(),
                file_offset: b.file_offset,
                semaphore_offset: 0,
                cookie: first_cookie + i as u64,
                program: UsdtProgram::Probe,
                spec: b.spec,
            })
            .collect();
        BreakProbes { first_cookie, probes }
    }

    /// The argument specs the USDT programs look up by cookie: the USDT probes' and these.
    fn spec_slots(&self) -> usize {
        self.first_cookie as usize + self.probes.len()
    }
}

/// Room in the kernel's predicate and counter maps.
struct PredicateRoom {
    /// Functions found in exec'd images may have predicates too.
    later: bool,
    /// Functions the maps hold: the plan's, or as many as the kernel's predicate map holds when
    /// exec'd images may add some.
    functions: u32,
}

impl PredicateRoom {
    fn of(options: &RecordOptions, filters: &[FilterSpec], resolve_execs: bool) -> PredicateRoom {
        let later = resolve_execs
            && (options.min_duration_ns > 0
                || options.functions.iter().any(|f| crate::plan::filter::split(f).is_ok_and(|(_, p)| !p.is_empty())));
        let functions = filters.iter().map(|f| f.function + 1).max().unwrap_or(1);
        let functions = if later { functions.max(FOLLOWED_FILTERS) } else { functions };
        PredicateRoom { later, functions }
    }
}

/// The raw tracepoints the events asked for need.
fn attach_tracepoints(kernel: &mut Kernel, events: &BTreeSet<EventKind>) -> Result<(), RecordError> {
    kernel.attach_sched()?;
    if wants_ipc(events) {
        kernel.attach_ipc()?;
    }
    if events.contains(&EventKind::Signal) {
        kernel.attach_signals()?;
    }
    Ok(())
}

/// What the probes look up by function before writing: predicates, `--start-at`/`--stop-at`
/// roles, and the layouts of parameters read from memory.
fn set_predicates(kernel: &mut Kernel, filters: &[FilterSpec], functions: &FunctionTable) -> Result<(), RecordError> {
    for spec in filters {
        if let Some((program, _)) = &spec.entry {
            kernel.set_filter(spec.function, *program)?;
        }
        if let Some((program, _)) = &spec.ret {
            kernel.set_filter(tracer_common::filter::ret_key(spec.function), *program)?;
        }
        if let Some(role) = spec.gate.filter(|&role| role != 0) {
            kernel.set_gate_role(spec.function, role)?;
        }
    }
    for (i, f) in functions.iter().enumerate() {
        if let Some(layout) = f.source.as_ref().and_then(|s| s.layout.as_ref())
            && layout.probe.reads_memory()
        {
            kernel.set_layout(i as u32, layout.probe.to_bytes())?;
        }
    }
    Ok(())
}

/// Attaches the function probes; returns how many functions are probed. A function with any
/// probe that failed counts as not probed (its other probes stay).
fn attach_functions(
    kernel: &mut Kernel,
    probes: &[ProbeSpec],
    functions: &FunctionTable,
    warnings: &mut Vec<String>,
) -> Result<usize, RecordError> {
    let failures = kernel.attach_functions(probes)?;
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
    Ok(attached)
}

/// Attaches the USDT probe sites; returns how many are attached.
fn attach_usdt(kernel: &mut Kernel, usdt: &UsdtSelection, warnings: &mut Vec<String>) -> Result<usize, RecordError> {
    let failures = kernel.attach_usdt(&usdt.probes)?;
    if let Some(first) = failures.first() {
        let probe = &usdt.table[first.cookie as usize];
        warnings.push(format!(
            "{} of {} USDT probe sites could not be attached (first: {}:{} in {}: {})",
            failures.len(),
            usdt.probes.len(),
            probe.provider,
            probe.name,
            probe.module,
            first.reason
        ));
    }
    Ok(usdt.probes.len() - failures.len())
}

/// Attaches the breakpoint sites; returns how many are attached.
fn attach_breakpoints(
    kernel: &mut Kernel,
    breaks: &BreakProbes,
    breakpoints: &BreakpointSelection,
    warnings: &mut Vec<String>,
) -> Result<usize, RecordError> {
    let failures = kernel.attach_usdt(&breaks.probes)?;
    if let Some(first) = failures.first() {
        let site = &breakpoints.break_sites[(first.cookie - breaks.first_cookie) as usize];
        warnings.push(format!(
            "{} of {} breakpoint sites could not be attached (first: {}:{}: {})",
            failures.len(),
            breaks.probes.len(),
            site.file,
            site.line,
            first.reason
        ));
    }
    Ok(breaks.probes.len() - failures.len())
}

/// The hardware watchpoints to open: each watched variable in each traced process that runs the
/// watched executable, and in the launched command (started without randomization), on every
/// thread; and the table that names their hits.
fn watchpoints(
    breakpoints: &BreakpointSelection,
    processes: &[Process],
    child: Option<&StoppedChild>,
    warnings: &mut Vec<String>,
) -> (WatchTable, Vec<Watchpoint>) {
    let mut watch_table = WatchTable { by_address: Default::default(), source_map: breakpoints.source_map.clone() };
    let mut watchpoints = Vec::new();
    let mut watched = |pid: u32, bias: u64, watchpoints: &mut Vec<Watchpoint>| {
        for w in &breakpoints.watches {
            let address = w.address_with(bias);
            let entry = WatchEntry { variable: w.name.clone(), ty: w.ty.clone(), bias };
            watch_table.by_address.insert(address, entry);
            for tid in hardware::threads(pid) {
                watchpoints.push(Watchpoint { tid, address, len: w.len, access: w.access });
            }
        }
    };
    if !breakpoints.watches.is_empty() {
        for p in processes {
            match breakpoints.layout.bias_in(p.pid, &breakpoints.exe) {
                Some(bias) => watched(p.pid, bias, &mut watchpoints),
                None => warnings.push(format!(
                    "process {} does not run {}: its variables are not watched",
                    p.pid,
                    breakpoints.exe.display()
                )),
            }
        }
        if let Some(child) = child {
            watched(child.pid(), breakpoints.layout.bias_without_randomization(), &mut watchpoints);
        }
    }
    (watch_table, watchpoints)
}

/// Probes are in place: only now do the targets become traced, so every call they make from here
/// on is seen whole. The images resolved now are marked: a traced process that execs one of them
/// is not stopped.
fn trace_targets(
    kernel: &mut Kernel,
    binaries: &[(PathBuf, FileId)],
    processes: &[Process],
    executables: &[PathBuf],
    follower: Option<&mut ExecFollower>,
    child: Option<&StoppedChild>,
) -> Result<(), RecordError> {
    for (_, id) in binaries {
        kernel.trace_executable(id.kernel_key())?;
    }
    for p in processes {
        kernel.trace_pid(p.pid)?;
    }
    if let Some(follower) = follower {
        for exe in executables {
            if let Ok(id) = targets::FileId::of(exe) {
                kernel.mark_resolved(id.kernel_key())?;
                follower.resolved_at_start(id.kernel_key());
            }
        }
    }
    if let Some(child) = child {
        kernel.trace_pid(child.pid())?;
    }
    Ok(())
}

/// What the trace's start says it traces: the processes, the executables, the launched command.
fn target_infos(
    processes: &[Process],
    binaries: &[(PathBuf, FileId)],
    command: Option<(&StoppedChild, &Path)>,
    options: &RecordOptions,
) -> Vec<TargetInfo> {
    let mut targets: Vec<TargetInfo> = processes
        .iter()
        .map(|p| TargetInfo::Process { pid: p.pid, comm: p.comm.clone(), exe: p.exe.display().to_string() })
        .collect();
    targets.extend(binaries.iter().map(|(path, _)| TargetInfo::Binary { path: path.display().to_string() }));
    if let Some((child, path)) = command {
        targets.push(TargetInfo::Command {
            pid: child.pid(),
            argv: targets::command_display(&options.command),
            exe: path.display().to_string(),
        });
    }
    targets
}

/// A trace in progress: probes attached, targets running.
pub struct Recording {
    /// The programs and the drain of their ring: dropped without [`Recording::run`], it still
    /// continues the processes stopped at exec.
    live: Attached,
    lost: LostCounters,
    /// The predicates' counters, and each filtered function's (index) name and predicate.
    filter_counters: Option<(FilterCounters, Vec<FilteredFunction>)>,
    /// `--min-duration`, for the counters' description.
    min_duration_ns: u64,
    /// `--min-duration-keep-children`: the stage that decides durations.
    keep_children: Option<KeepChildren>,
    /// `--debug-kernel`: the programs' aya-log records.
    kernel_log: Option<KernelLog>,
    assembler: EventAssembler,
    clock: BootClock,
    start: TraceStart,
    child_pid: Option<u32>,
    /// A detached command's stdout and stderr, for whoever runs the recording to read.
    command_output: Option<OutputPipes>,
    /// With `--binary`, new processes may start at any time: the trace does not end for lack of
    /// targets.
    ends_when_empty: bool,
    duration: Option<Duration>,
    kinds: BTreeSet<EventKind>,
    /// USDT probe sites attached (program events and `-u` probes).
    pub usdt_sites: usize,
    /// Breakpoint sites attached (`-B`).
    pub break_sites: usize,
    /// Hardware watchpoints opened (`-w`): one per variable and thread.
    pub watchpoints: usize,
    progress: Arc<Progress>,
    /// Things found while attaching that do not stop the trace (the plan's are in [`Plan::warnings`]).
    pub warnings: Vec<String>,
    /// With function patterns: resolves them against each image a traced process execs.
    follower: Option<ExecFollower>,
}

/// What a recording has done so far, readable from elsewhere while [`Recording::run`] runs (a
/// status line). Events written are current after every batch; the lost count is at most
/// [`PROGRESS_LOST_EVERY`] old.
#[derive(Debug, Default)]
pub struct Progress {
    events_written: AtomicU64,
    lost: AtomicU64,
    command_exited: AtomicBool,
}

impl Progress {
    pub fn events_written(&self) -> u64 {
        self.events_written.load(Ordering::Relaxed)
    }

    /// Events lost so far, counted as `trace_end.lost_events` counts them.
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }

    /// Whether the launched command has exited (and the trace goes on: `-b`, `-p` or its
    /// traced descendants).
    pub fn command_exited(&self) -> bool {
        self.command_exited.load(Ordering::Relaxed)
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
    /// What start-up did, for `record -v`: the kernel's mechanisms, the ring buffer's size, the
    /// programs loaded, and how often the kernel's BTF was parsed.
    pub fn startup_details(&self) -> String {
        let kernel = self.start.kernel.as_ref();
        let parsed = crate::kernel::btf::KernelBtf::times_parsed();
        format!(
            "Linux {}, probes attached as {}, process ends from {}; ring buffer {} KiB, and {} call rings of {} \
             KiB; programs loaded: {}; the kernel's BTF parsed {} by tracer (and once more by aya's loader)",
            kernel.map_or("?", |k| k.release.as_str()),
            kernel.map_or("?", |k| k.attach.as_str()),
            kernel.map_or("?", |k| k.process_exit.as_str()),
            kernel.map_or(0, |k| k.ring_bytes >> 10),
            crate::kernel::call_rings::count(),
            tracer_common::call_rings::DATA_BYTES >> 10,
            self.live.loaded_programs().join(", "),
            match parsed {
                1 => "once".to_string(),
                n => format!("{n} times"),
            }
        )
    }

    pub fn trace_start(&self) -> &TraceStart {
        &self.start
    }

    /// The launched command's pid, if there is one.
    pub fn command_pid(&self) -> Option<u32> {
        self.child_pid
    }

    /// The read ends of a detached command's stdout and stderr (once): whoever takes them must
    /// read them as they fill, or the command blocks writing.
    pub fn take_command_output(&mut self) -> Option<OutputPipes> {
        self.command_output.take()
    }

    /// The recording's progress, updated while it runs.
    pub fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }

    /// Drains events into `sink` until the trace ends: the command and its traced descendants
    /// exit, every traced process exits, the duration elapses, or `stop` resolves.
    pub async fn run(self, sink: &mut dyn Sink, stop: impl Future<Output = EndReason>) -> Result<Outcome, RecordError> {
        let Recording {
            mut live,
            lost,
            mut filter_counters,
            min_duration_ns,
            keep_children,
            kernel_log,
            mut assembler,
            clock,
            start,
            child_pid,
            command_output: _,
            ends_when_empty,
            duration,
            kinds,
            progress,
            mut follower,
            ..
        } = self;
        let mut pipeline = EventPipeline::new(kinds).with_keep_children(keep_children);
        let mut kernel_log = kernel_log.map(KernelLog::polled).transpose()?;
        sink.begin(&start)?;
        sink.flush()?;
        let mut command_exit: Option<ChildExit> = None;
        let mut own_signals = OwnSignals::default();
        let mut last_flush = tokio::time::Instant::now();
        let mut last_lost_count = tokio::time::Instant::now();
        let deadline = Deadline::after(duration);
        let mut tick = liveness_tick();
        tokio::pin!(stop);

        // The loop's errors (a reader that went away, a full disk) are returned only after the
        // teardown below, whose final drain continues the processes the kernel stopped at exec
        // meanwhile: an error must not leave a traced process stopped.
        let looped: Result<EndReason, RecordError> = async {
            Ok(loop {
                tokio::select! {
                    biased;
                    reason = &mut stop => break reason,
                    _ = deadline.reached() => break EndReason::Duration,
                    batch = live.recv() => match batch {
                        Some(batch) => {
                            let execs = push_batch(&batch, &mut assembler, &mut pipeline, &mut own_signals);
                            if let Some(follower) = &mut follower {
                                let mut no_filters = Vec::new();
                                let filters = filter_counters.as_mut().map_or(&mut no_filters, |(_, named)| named);
                                for exec in execs {
                                    follower.resolve(exec, live.kernel(), &mut assembler, filters);
                                }
                            }
                            pipeline.flush_ready(sink)?;
                            progress.events_written.store(pipeline.written, Ordering::Relaxed);
                        }
                        // Its own error, if any, comes from `join` after the teardown.
                        None => return Err(std::io::Error::other("the ring-buffer drain stopped").into()),
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
                            progress.command_exited.store(command_exit.is_some(), Ordering::Relaxed);
                        }
                        let command_done = child_pid.is_none() || command_exit.is_some();
                        if command_done && ends_when_empty && !any_target_alive(live.kernel()) {
                            break if child_pid.is_some() { EndReason::CommandExited } else { EndReason::TargetsExited };
                        }
                    }
                }
            })
        }
        .await;

        // Stop and detach first, so that no record arrives after the final drain. Too late to
        // attach anything: `live` continues the processes stopped in what it hands out now.
        let end_ts = clock.now_unix_ns();
        live.detach();
        while let Some(batch) = live.recv().await {
            push_batch(&batch, &mut assembler, &mut pipeline, &mut own_signals);
        }
        // The drain's own error first: it is the cause when the drain stopped.
        live.join()?;
        let reason = looped?;
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
            filters: filter_stats(filter_counters.as_ref(), pipeline.keep_children(), min_duration_ns),
            unmatched_functions: follower.as_ref().and_then(ExecFollower::unmatched),
            execs_probed_late: follower.as_ref().map(ExecFollower::probed_late).filter(|&n| n > 0),
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
    for &slot in LostSlot::ALL {
        if let Some(name) = slot.trace_name() {
            *lost_events.entry(name.to_string()).or_default() += counts[slot as usize];
        }
    }
    lost_events.insert("undecodable".to_string(), assembler.undecodable);
    lost_events.insert("log_unreadable".to_string(), assembler.unreadable_logs);
    lost_events
}

/// A function decided in the kernel, and its event name.
type FilteredFunction = (String, FilterSpec);

/// Each filtered function's counters, by event name: the kernel's, and with
/// `--min-duration-keep-children` what user space decided after it.
fn filter_stats(
    counters: Option<&(FilterCounters, Vec<FilteredFunction>)>,
    keep_children: Option<&KeepChildren>,
    min_duration_ns: u64,
) -> BTreeMap<String, FilterStats> {
    let mut stats = kernel_filter_stats(counters, min_duration_ns);
    for (name, c) in keep_children.map(KeepChildren::counts).into_iter().flatten() {
        let s = stats.entry(name.to_string()).or_insert_with(|| FilterStats { seen: c.seen, ..Default::default() });
        // The kernel's `written` are the calls it passed on to be decided here.
        s.min_duration_ns = min_duration_ns;
        s.written = c.written;
        s.filtered_out += c.filtered_out;
        s.entries_lost += c.entries_lost;
        s.children_dropped = c.children_dropped;
    }
    stats
}

/// Each function's counters as the kernel counted them, by event name.
fn kernel_filter_stats(
    counters: Option<&(FilterCounters, Vec<FilteredFunction>)>,
    min_duration_ns: u64,
) -> BTreeMap<String, FilterStats> {
    let Some((counters, functions)) = counters else { return BTreeMap::new() };
    functions
        .iter()
        .map(|(name, spec)| {
            let c = counters.read(spec.function);
            let text = |p: &Option<(tracer_common::filter::Program, String)>| p.as_ref().map(|(_, t)| t.clone());
            let stats = FilterStats {
                predicate: text(&spec.entry).unwrap_or_default(),
                ret_predicate: text(&spec.ret),
                min_duration_ns: if spec.held { min_duration_ns } else { 0 },
                seen: c.seen,
                written: c.seen.saturating_sub(c.filtered).saturating_sub(c.entries_lost),
                filtered_out: c.filtered,
                returns_not_dropped: c.returns_not_dropped,
                entries_lost: c.entries_lost,
                by_trigger: c.by_trigger,
                by_depth: c.by_depth,
                returns_unmatched: c.returns_unmatched,
                children_dropped: 0,
            };
            (name.clone(), stats)
        })
        .collect()
}

/// How full the ring may get before a record wakes the drain (which otherwise polls every few
/// milliseconds): an eighth, capped at 1 MiB.
pub(crate) fn wakeup_bytes(ring_bytes: u32) -> u64 {
    (ring_bytes as u64 / 8).min(1 << 20)
}

/// Turns a batch of records into events for the pipeline; returns the execs of images to
/// resolve, for [`ExecFollower`]. The signals of the stops among them are left out
/// ([`OwnSignals`]).
fn push_batch(
    batch: &Batch,
    assembler: &mut EventAssembler,
    pipeline: &mut EventPipeline,
    own_signals: &mut OwnSignals,
) -> Vec<ExecToResolve> {
    let mut execs = Vec::new();
    for record in batch.records() {
        let e = assembler.assemble(record);
        for unwound in assembler.drain_unwound() {
            pipeline.push(unwound);
        }
        if let Some(e) = e
            && !own_signals.is_ours(&e)
        {
            pipeline.push(e);
        }
        if let Some(exec) = ExecToResolve::of(record) {
            if exec.stopped {
                own_signals.stopped(exec.pid);
            }
            execs.push(exec);
        }
    }
    execs
}
