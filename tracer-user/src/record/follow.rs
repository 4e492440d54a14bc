//! Following execs: the function patterns apply to every image the traced processes exec, which
//! is what a wrapper runs (`sh -c`, `env`, `timeout`, `nice`, a shim, a `#!` script's interpreter
//! and the programs it starts). The kernel stops a traced process that execs an image not yet
//! resolved, before the image's first instruction (`try_sched_exec` in tracer-ebpf/src/sched.rs).
//! Here the patterns are resolved against the image as the command's own executable is at start
//! (symbols, DWARF parameters, placement: [`select_functions`]), its probes are attached, the
//! image is marked resolved (matched or not, so that it never stops a process again), and the
//! process is continued. A process under `ptrace` (gdb, strace) is not stopped, since its
//! debugger would see the stop: its image is resolved the same way as it runs.
//!
//! A stopped process is continued in every case: after an error (said once), and if this is
//! dropped half-way (a panic); the records drained after the programs are detached, and those
//! left when start-up or the recording is left early, are continued by `record/attached.rs`.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::PathBuf,
};

use tracer_common::{
    ExecResolve, InodeKey, RecordKind,
    decode::{Record, decode},
};

use crate::plan::{FilterSpec, RecordError, RecordOptions, Scope, choose::Unmatched, filter, select_functions};
use crate::{
    assemble::EventAssembler,
    event::{Event, EventData, UnmatchedFunctions, data},
    functions::symbols::FunctionPattern,
    kernel::loader::Kernel,
    targets::{FileId, modules::ModuleCandidates},
};

/// Most "did you mean" names kept per report.
const MAX_SUGGESTIONS: usize = 5;

/// An exec of an image not resolved yet: the process, the image, and whether the kernel stopped
/// the process for it (it does not stop one under `ptrace`: see [`ExecResolve`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ExecToResolve {
    pub pid: u32,
    pub image: InodeKey,
    pub stopped: bool,
}

impl ExecToResolve {
    /// The exec to resolve that a record announces, if it announces one.
    pub fn of(bytes: &[u8]) -> Option<ExecToResolve> {
        // Only exec records are decoded a second time (the assembler decodes every record).
        if bytes.len() < 4 || u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) != RecordKind::Exec as u32 {
            return None;
        }
        let Ok(Record::Exec(r)) = decode(bytes) else { return None };
        let stopped = match ExecResolve::try_from(r.resolve) {
            Ok(ExecResolve::Stopped) => true,
            Ok(ExecResolve::Running) => false,
            Ok(ExecResolve::No) | Err(_) => return None,
        };
        Some(ExecToResolve { pid: r.header.pid, image: InodeKey { dev: r.dev, ino: r.ino }, stopped })
    }
}

/// Continues a process the kernel stopped at exec. One gone meanwhile (killed) needs nothing.
pub(crate) fn continue_process(pid: u32) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGCONT);
}

/// The signals of a stop for resolution, which are tracer's and not the program's, and are left
/// out of the trace: the kernel's `SIGSTOP` (generated in the process that exec'd, by the exec
/// program, and then delivered to it) and tracer's own `SIGCONT` to it. Each stop expects each of
/// the three once; a pid's expectations end at its next exec or exit, so a `SIGSTOP` whose record
/// was lost does not hide a later one the program really got.
#[derive(Debug, Default)]
pub(crate) struct OwnSignals {
    expected: HashMap<u32, Expected>,
}

#[derive(Debug, Default)]
struct Expected {
    stop_generated: bool,
    stop_delivered: bool,
    continued: bool,
}

impl OwnSignals {
    /// `pid` was stopped at exec (told after the exec's own event, which ends the expectations
    /// of an earlier stop): its next `SIGSTOP` generation and delivery, and tracer's next
    /// `SIGCONT` to it, are ours.
    pub fn stopped(&mut self, pid: u32) {
        self.expected.insert(pid, Expected::default());
    }

    /// Whether `e` is one of those signals (each is matched once).
    pub fn is_ours(&mut self, e: &Event) -> bool {
        let s = match &e.data {
            EventData::Signal(s) => s,
            EventData::Exit(data::Exit { thread: false, .. })
            | EventData::Spawn(data::Spawn { how: data::SpawnHow::Exec, .. }) => {
                self.expected.remove(&e.pid);
                return false;
            }
            _ => return false,
        };
        let Some(expected) = self.expected.get_mut(&s.target_pid) else { return false };
        let seen = match (s.signal.number, s.delivered) {
            (libc::SIGSTOP, false) if s.sender_pid == s.target_pid => &mut expected.stop_generated,
            (libc::SIGSTOP, true) => &mut expected.stop_delivered,
            (libc::SIGCONT, false) if s.sender_pid == std::process::id() => &mut expected.continued,
            _ => return false,
        };
        let ours = !std::mem::replace(seen, true);
        if expected.stop_generated && expected.stop_delivered && expected.continued {
            self.expected.remove(&s.target_pid);
        }
        ours
    }
}

/// The function patterns, resolved against each new image as the traced processes exec it.
pub(crate) struct ExecFollower {
    options: RecordOptions,
    /// The executables the trace saw, first seen first: the plan's, then each exec'd image.
    images: Vec<String>,
    /// The patterns that have matched nothing yet, with the names close to them.
    unmatched: BTreeMap<String, Vec<String>>,
    /// Images resolved (attached or found to match nothing): a process stopped for one of them
    /// again (two processes at once, or `RESOLVED_IMAGES` full) is only continued.
    resolved: HashSet<InodeKey>,
    /// Messages said already: each is said once.
    said: HashSet<String>,
    /// Processes stopped and not continued yet.
    stopped: Vec<u32>,
    /// See [`ExecFollower::probed_late`].
    probed_late: u64,
    /// Functions whose predicate counters the kernel has room for (see `Kernel::load_sized`).
    filter_capacity: u32,
    /// The module patterns (`libz:inflate`) and the libraries they have been resolved in: at
    /// start, or in the libraries an exec'd image needs. Each pair once, as a library's probes
    /// hold in every process (a second attach would write every call twice).
    libraries_probed: HashSet<(String, FileId)>,
}

impl ExecFollower {
    /// `executables`: the images resolved at start, and `pids` the processes traced then;
    /// `unmatched`: the patterns that matched nothing there.
    pub fn new(
        options: RecordOptions,
        executables: &[PathBuf],
        pids: &[u32],
        unmatched: Vec<Unmatched>,
        filter_capacity: u32,
    ) -> ExecFollower {
        // Read only when a pattern names a module (the libraries' files and the processes' maps).
        let named: Vec<(&String, String)> =
            options.functions.iter().filter_map(|text| Some((text, module_of(text)?))).collect();
        let at_start = (!named.is_empty()).then(|| ModuleCandidates::new(executables, pids));
        let libraries_probed = named
            .into_iter()
            .filter_map(|(text, module)| {
                let library = at_start.as_ref()?.resolve(&module).ok()?;
                Some((text.clone(), FileId::of(&library).ok()?))
            })
            .collect();
        ExecFollower {
            libraries_probed,
            options,
            images: executables.iter().map(|p| p.display().to_string()).collect(),
            unmatched: unmatched.into_iter().map(|u| (u.pattern, u.suggestions)).collect(),
            resolved: HashSet::new(),
            said: HashSet::new(),
            stopped: Vec::new(),
            probed_late: 0,
            filter_capacity,
        }
    }

    /// An image resolved at start: a process that execs it is not stopped.
    pub fn resolved_at_start(&mut self, image: InodeKey) {
        self.resolved.insert(image);
    }

    /// Resolves the patterns against the image `exec.pid` exec'd, attaches what matched, marks
    /// the image resolved and continues the process if the kernel stopped it. Never fails: what
    /// goes wrong is said once.
    pub fn resolve(
        &mut self,
        exec: ExecToResolve,
        kernel: &mut Kernel,
        assembler: &mut EventAssembler,
        filters: &mut Vec<(String, FilterSpec)>,
    ) {
        if exec.stopped {
            self.stopped.push(exec.pid);
        } else {
            self.probed_late += 1;
            self.say(
                "a process under ptrace (gdb, strace) is not stopped when it execs a program: the calls that program makes before its probes are attached are missing (counted in trace_end.execs_probed_late)"
                    .to_string(),
            );
            if !std::path::Path::new(&format!("/proc/{}", exec.pid)).exists() {
                // It ran on and is gone already (a short program under a debugger): nothing to
                // attach to, and its image is left for the next process that execs it.
                return;
            }
        }
        if self.resolved.insert(exec.image) {
            if let Err(e) = self.attach_image(exec.pid, kernel, assembler, filters) {
                self.say(format!(
                    "the functions of the program process {} exec'd are not traced: {}",
                    exec.pid,
                    crate::errors::report(&e)
                ));
            }
            if let Err(e) = kernel.mark_resolved(exec.image) {
                // Full (1024 images): later processes are still stopped and continued at once.
                self.say(format!("{}: each further exec of a new image is stopped briefly", crate::errors::report(&e)));
            }
        }
        self.continue_all();
    }

    /// Execs of new images resolved while their process ran on (under ptrace): their calls
    /// before the probes were attached are missing.
    pub fn probed_late(&self) -> u64 {
        self.probed_late
    }

    /// The patterns that matched nothing in any image the trace saw.
    pub fn unmatched(&self) -> Option<Box<UnmatchedFunctions>> {
        if self.unmatched.is_empty() {
            return None;
        }
        let mut suggestions: Vec<String> = Vec::new();
        for s in self.unmatched.values().flatten() {
            if !suggestions.contains(s) && suggestions.len() < MAX_SUGGESTIONS {
                suggestions.push(s.clone());
            }
        }
        Some(Box::new(UnmatchedFunctions {
            patterns: self.unmatched.keys().cloned().collect(),
            images: self.images.clone(),
            suggestions,
        }))
    }

    /// Resolves the patterns against the image `pid` exec'd: those naming no module against its
    /// own functions, then those naming a module against the libraries it needs that they were
    /// not resolved in yet (a library only it loads: `-f 'libz:inflate' -- sh -c 'curl ...'`).
    fn attach_image(
        &mut self,
        pid: u32,
        kernel: &mut Kernel,
        assembler: &mut EventAssembler,
        filters: &mut Vec<(String, FilterSpec)>,
    ) -> Result<(), RecordError> {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
            .map_err(|source| crate::targets::TargetError::Inspect { pid, source })?;
        let name = exe.display().to_string();
        if !self.images.contains(&name) {
            self.images.push(name);
        }
        let options = self.options.clone();
        let own = Scope { first_function: 0, lenient: true, exec_image: true, libraries: false };
        self.attach_pass(&exe, &options, own, kernel, assembler, filters)?;
        if !self.options.functions.iter().any(|text| module_of(text).is_some()) {
            return Ok(());
        }
        let needed = ModuleCandidates::with_dependencies(std::slice::from_ref(&exe));
        let mut patterns = Vec::new();
        for text in &self.options.functions {
            let Some(library) = module_of(text).and_then(|spec| needed.resolve(&spec).ok()) else { continue };
            if let Ok(id) = FileId::of(&library)
                && self.libraries_probed.insert((text.clone(), id))
            {
                patterns.push(text.clone());
            }
        }
        if patterns.is_empty() {
            return Ok(());
        }
        // Triggers are resolved at start only.
        let options = RecordOptions { functions: patterns, start_at: Vec::new(), stop_at: Vec::new(), ..options };
        let libraries = Scope { libraries: true, ..own };
        self.attach_pass(&exe, &options, libraries, kernel, assembler, filters)
    }

    /// One pass of [`Self::attach_image`]: selects what `options`' patterns match in `scope`,
    /// attaches it, and forgets the patterns that matched from the unmatched ones.
    fn attach_pass(
        &mut self,
        exe: &std::path::Path,
        options: &RecordOptions,
        scope: Scope,
        kernel: &mut Kernel,
        assembler: &mut EventAssembler,
        filters: &mut Vec<(String, FilterSpec)>,
    ) -> Result<(), RecordError> {
        let first_function = assembler.function_count();
        let scope = Scope { first_function, ..scope };
        let mut warnings = Vec::new();
        let exes = [exe.to_path_buf()];
        let selection = select_functions(options, &exes, &[], &mut warnings, scope)?;
        for w in warnings {
            self.say(w);
        }
        // The patterns this pass resolved that matched.
        let not_here: HashSet<&str> = selection.unmatched.iter().map(|u| u.pattern.as_str()).collect();
        for text in &options.functions {
            if module_of(text).is_some() == scope.libraries && !not_here.contains(text.as_str()) {
                self.unmatched.remove(text);
            }
        }
        for u in &selection.unmatched {
            if let Some(known) = self.unmatched.get_mut(&u.pattern) {
                for s in &u.suggestions {
                    if !known.contains(s) {
                        known.push(s.clone());
                    }
                }
            }
        }
        if selection.functions.is_empty() {
            return Ok(());
        }
        for spec in &selection.filters {
            if spec.function >= self.filter_capacity {
                return Err(RecordError::TooManyProbes {
                    count: spec.function as usize + 1,
                    max: self.filter_capacity as usize,
                });
            }
            if let Some((program, _)) = &spec.entry {
                kernel.set_filter(spec.function, *program)?;
            }
            if let Some((program, _)) = &spec.ret {
                kernel.set_filter(tracer_common::filter::ret_key(spec.function), *program)?;
            }
            let name = selection.functions[(spec.function - first_function) as usize].name.to_string();
            filters.push((name, spec.clone()));
        }
        for (i, f) in selection.functions.iter().enumerate() {
            if let Some(layout) = f.source.as_ref().and_then(|s| s.layout.as_ref())
                && layout.probe.reads_memory()
            {
                kernel.set_layout(first_function + i as u32, layout.probe.to_bytes())?;
            }
        }
        let failures = kernel.attach_functions(&selection.probes)?;
        if let Some(first) = failures.first() {
            let function = tracer_common::cookie::function(first.cookie) - first_function;
            self.say(format!(
                "{} probes in {} could not be attached (first: {}: {})",
                failures.len(),
                exe.display(),
                selection.functions[function as usize].name,
                first.reason
            ));
        }
        assembler.add_functions(selection.functions);
        Ok(())
    }

    fn say(&mut self, message: String) {
        if self.said.insert(message.clone()) {
            tracing::warn!("{message}");
        }
    }

    fn continue_all(&mut self) {
        for pid in self.stopped.drain(..) {
            continue_process(pid);
        }
    }
}

/// The module a function pattern names (`libz` of `libz:inflate if len > 0`), if it names one.
fn module_of(text: &str) -> Option<String> {
    let (pattern, _) = filter::split(text).ok()?;
    FunctionPattern::parse(pattern).ok()?.module
}

impl Drop for ExecFollower {
    /// The tracer never leaves a target process stopped.
    fn drop(&mut self) {
        self.continue_all();
    }
}
