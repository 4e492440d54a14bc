//! Loading the eBPF programs into the kernel, attaching them, and the maps user space drives.
//!
//! Everything attached lives in [`Kernel`]: dropping it detaches every probe and tracepoint (the
//! kernel closes the links with their file descriptors), so a target is never left probed. The
//! function and USDT probes are uprobe-multi links ([`crate::kernel::uprobe_multi`]) or,
//! on kernels without them, perf-event uprobes ([`crate::kernel::uprobe_perf`]); the
//! raw tracepoints go through aya. Which, and which program variants, the [`KernelFeatures`] say.

use std::{
    collections::BTreeMap,
    os::fd::{AsFd as _, OwnedFd},
    path::Path,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
    programs::RawTracePoint,
};
use tracer_common::{Config, InodeKey, LostSlot, names, programs};

use crate::kernel::{
    call_rings::CallRings,
    features::{AttachMechanism, KernelFeatures},
    sites::{Access, ProbeSpec, UsdtProbe, UsdtProgram, Watchpoint},
    uprobe_multi::{self, ObjectError, Site},
    uprobe_perf,
};

/// The eBPF object, built by `cargo xtask build` and embedded at compile time (see build.rs).
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer-ebpf.o"));

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("this tracer binary was built without its eBPF programs; build it with `cargo xtask build`")]
    NoObject,
    #[error("cannot load the eBPF programs into the kernel")]
    Load(#[source] LoadFailure),
    // aya's errors keep the system's answer (`Operation not permitted`) as their own source: as
    // sources here, `{:#}` and `errors::report` say it too.
    #[error("cannot attach {what}")]
    Attach {
        what: String,
        #[source]
        error: aya::programs::ProgramError,
    },
    #[error("cannot update the {map} map")]
    Map {
        map: &'static str,
        #[source]
        error: aya::maps::MapError,
    },
    #[error("cannot open a hardware watchpoint at {address:#x} in thread {tid}")]
    Watchpoint {
        address: u64,
        tid: u32,
        #[source]
        error: aya::programs::ProgramError,
    },
}

/// What went wrong while loading: [`LoadError::Load`]'s source. Each variant is its cause as aya
/// gives it, whose own source (the system's answer) follows it.
#[derive(Debug, thiserror::Error)]
pub enum LoadFailure {
    /// A program or map the object should have (a build that does not match this code).
    #[error("{0} is missing")]
    Missing(String),
    #[error(transparent)]
    Ebpf(aya::EbpfError),
    #[error(transparent)]
    Program(aya::programs::ProgramError),
    #[error("{name}")]
    NamedProgram {
        name: &'static str,
        #[source]
        error: aya::programs::ProgramError,
    },
    #[error(transparent)]
    MapType(aya::maps::MapError),
    #[error("cannot map the call rings into memory")]
    MapMemory(#[source] std::io::Error),

    #[error(transparent)]
    Object(ObjectError),
    #[error(transparent)]
    KernelLog(aya_log::Error),
}

impl From<LoadFailure> for LoadError {
    fn from(failure: LoadFailure) -> Self {
        LoadError::Load(failure)
    }
}

/// Why probes that read strings run without the sleepable programs (which may fault a page in).
#[derive(Debug, thiserror::Error)]
pub enum SleepableUnavailable {
    #[error("this kernel has no sleepable uprobe programs (Linux 6.0 and later have them)")]
    NoKernelSupport,
    #[error("the sleepable uprobe programs could not be loaded: {0}")]
    Calls(ObjectError),
    #[error("the sleepable USDT program could not be loaded: {0}")]
    Usdt(ObjectError),
}

/// A probe that could not be attached.
#[derive(Clone, Debug)]
pub struct AttachFailure {
    pub cookie: u64,
    pub reason: String,
}

/// Kernel-side counts of what could not be recorded, summed over CPUs, by `LOST` slot.
pub type LostCounts = [u64; LostSlot::COUNT as usize];

/// The loaded programs and their maps.
pub struct Kernel {
    /// What this kernel offers: how probes attach, which exit program runs.
    features: KernelFeatures,
    /// Elements of `CALL_RINGS`.
    call_rings: usize,
    /// Links of the function probes (one per file and program, or one per site): dropping them
    /// detaches the probes.
    entry_links: Vec<OwnedFd>,
    return_links: Vec<OwnedFd>,
    /// The entry and return programs (indexed by `ret`), each loaded on first use (see
    /// [`crate::kernel::uprobe_multi`]): a trace whose probes all read strings on entry and none
    /// on return needs neither the plain entry nor the sleepable return program, and verifying
    /// each costs tens to hundreds of milliseconds.
    function_programs: [Option<OwnedFd>; 2],
    /// Their sleepable variants (indexed by `ret`), for probes that read strings, each loaded on
    /// first use; or why there is none (the kernel has no sleepable uprobes, `--no-sleepable`, or
    /// it did not load).
    sleepable_programs: [Option<Result<OwnedFd, SleepableUnavailable>>; 2],
    /// Links of the USDT probes (closing them also lowers their semaphores).
    usdt_links: Vec<OwnedFd>,
    /// The program-event and USDT programs, loaded on first use.
    usdt_programs: Option<(OwnedFd, OwnedFd)>,
    /// The USDT program's sleepable variant, for breakpoints that read strings, loaded on first
    /// use; or why there is none (as `sleepable_programs`).
    sleepable_usdt: Option<Result<OwnedFd, SleepableUnavailable>>,
    /// The programs loaded into the kernel (verified) so far, by name, in load order: only what
    /// the trace asked for is.
    loaded: Vec<&'static str>,
    /// The object the uprobe programs are loaded from, parsed and relocated on first use.
    program_object: Option<uprobe_multi::ProgramObject>,
    ebpf: Ebpf,
}

/// Lets the process hold many file descriptors (aya's maps and programs, and the links).
pub fn raise_fd_limit(needed: u64) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else { return };
    let want = needed.saturating_add(1024);
    if soft >= want {
        return;
    }
    let nr_open: u64 =
        std::fs::read_to_string("/proc/sys/fs/nr_open").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(hard);
    let new = want.min(nr_open.max(hard));
    let _ = setrlimit(Resource::RLIMIT_NOFILE, new, new.max(hard));
}

impl Kernel {
    /// Loads every program with `config`, the ring buffer sized `ring_bytes`, with room for the
    /// argument specs of `usdt_probes` USDT probes, as `features` allow.
    pub fn load(
        config: &Config,
        features: &KernelFeatures,
        ring_bytes: u32,
        usdt_probes: usize,
    ) -> Result<Kernel, LoadError> {
        Self::load_sized(config, features, ring_bytes, usdt_probes, 1, 1, false)
    }

    /// As [`Kernel::load`], with room for `top_functions` functions' statistics (`tracer top`)
    /// and the counters of predicates on functions numbered below `filtered_functions`; `gated`:
    /// room for the threads' gates (`--start-at`, `--stop-at`, `--depth`).
    pub fn load_sized(
        config: &Config,
        features: &KernelFeatures,
        ring_bytes: u32,
        usdt_probes: usize,
        top_functions: u32,
        filtered_functions: u32,
        gated: bool,
    ) -> Result<Kernel, LoadError> {
        if EBPF_OBJECT.is_empty() {
            return Err(LoadError::NoObject);
        }
        let ebpf = EbpfLoader::new()
            .override_global(names::CONFIG, config, true)
            .map_max_entries(names::EVENTS, ring_bytes)
            .map_max_entries(names::CALL_RINGS, config.call_rings.max(1))
            .map_max_entries(names::USDT_SPECS, usdt_probes.max(1) as u32)
            .map_max_entries(names::TOP_FUNCTIONS, top_functions.max(1))
            .map_max_entries(names::FILTER_COUNTS, filtered_functions.max(1))
            // A thread's gate is 528 bytes, preallocated: none without triggers or --depth.
            .map_max_entries(names::GATES, if gated { tracer_common::gate::MAX_THREADS } else { 1 })
            .load(EBPF_OBJECT)
            .map_err(LoadFailure::Ebpf)?;
        Ok(Kernel {
            features: features.clone(),
            call_rings: config.call_rings.max(1) as usize,
            entry_links: Vec::new(),
            return_links: Vec::new(),
            function_programs: [None, None],
            sleepable_programs: [None, None],
            program_object: None,
            usdt_links: Vec::new(),
            usdt_programs: None,
            sleepable_usdt: None,
            loaded: Vec::new(),
            ebpf,
        })
    }

    /// Attaches the process-lifecycle programs (always on: they also follow forks).
    pub fn attach_sched(&mut self) -> Result<(), LoadError> {
        self.attach_raw_tracepoints(&[
            (programs::SCHED_FORK, programs::SCHED_FORK_TP),
            (programs::SCHED_EXEC, programs::SCHED_EXEC_TP),
            (self.features.sched_exit_program(), programs::SCHED_EXIT_TP),
        ])
    }

    fn attach_raw_tracepoints(&mut self, pairs: &[(&'static str, &str)]) -> Result<(), LoadError> {
        for &(program, tracepoint) in pairs {
            let prog: &mut RawTracePoint = self
                .ebpf
                .program_mut(program)
                .ok_or_else(|| LoadFailure::Missing(format!("program {program}")))?
                .try_into()
                .map_err(LoadFailure::Program)?;
            prog.load().map_err(LoadFailure::Program)?;
            self.loaded.push(program);
            prog.attach(tracepoint)
                .map_err(|error| LoadError::Attach { what: format!("raw tracepoint {tracepoint}"), error })?;
        }
        Ok(())
    }

    /// Attaches the IPC programs to syscall entry and exit.
    pub fn attach_ipc(&mut self) -> Result<(), LoadError> {
        self.attach_raw_tracepoints(&[
            (programs::IPC_SYS_ENTER, programs::SYS_ENTER_TP),
            (programs::IPC_SYS_EXIT, programs::SYS_EXIT_TP),
        ])
    }

    /// Attaches the signal programs.
    pub fn attach_signals(&mut self) -> Result<(), LoadError> {
        self.attach_raw_tracepoints(&[
            (programs::SIGNAL_GENERATE, programs::SIGNAL_GENERATE_TP),
            (programs::SIGNAL_DELIVER, programs::SIGNAL_DELIVER_TP),
        ])
    }

    /// Attaches the probes; returns those that failed (the others stay attached).
    /// Probes whose cookie has `cookie::STRINGS` run the sleepable programs where the kernel has
    /// them (see [`Kernel::sleepable_unavailable`]). Only the programs these probes run are
    /// loaded; probes attached later (in images the traced processes exec) load the others then.
    pub fn attach_functions(&mut self, probes: &[ProbeSpec]) -> Result<Vec<AttachFailure>, LoadError> {
        let mut failures = Vec::new();
        // Return probes first, as in `attach_sites`.
        for ret in [true, false] {
            let (strings, mut plain): (Vec<&ProbeSpec>, Vec<&ProbeSpec>) =
                probes.iter().filter(|p| p.ret == ret).partition(|p| tracer_common::cookie::reads_strings(p.cookie));
            if !strings.is_empty() && self.load_sleepable(ret) {
                let Some(Ok(prog)) = self.sleepable_programs[ret as usize].take() else { unreachable!("loaded above") };
                failures.extend(self.attach_sites(&strings, &prog, ret));
                self.sleepable_programs[ret as usize] = Some(Ok(prog));
            } else {
                plain.extend(strings);
            }
            let name = if ret { programs::CALL_RETURN } else { programs::CALL_ENTRY };
            failures.extend(self.attach_with(&plain, name, ret)?);
        }
        Ok(failures)
    }

    /// Loads the sleepable entry or return program once; whether there is one
    /// ([`Kernel::sleepable_unavailable`] says why not).
    fn load_sleepable(&mut self, ret: bool) -> bool {
        if self.sleepable_programs[ret as usize].is_none() {
            let loaded = if !self.features.sleepable_uprobes {
                Err(SleepableUnavailable::NoKernelSupport)
            } else {
                let name = if ret { programs::CALL_RETURN_SLEEPABLE } else { programs::CALL_ENTRY_SLEEPABLE };
                self.load_uprobe_programs(&[name])
                    .map(|mut fds| fds.pop().expect("one program"))
                    .map_err(SleepableUnavailable::Calls)
            };
            self.sleepable_programs[ret as usize] = Some(loaded);
        }
        matches!(self.sleepable_programs[ret as usize], Some(Ok(_)))
    }

    /// Loads the sleepable USDT program once, for breakpoints that read strings; the error says
    /// why there is none.
    fn load_sleepable_usdt(&mut self) -> Option<&OwnedFd> {
        if self.sleepable_usdt.is_none() {
            let loaded = if !self.features.sleepable_uprobes {
                Err(SleepableUnavailable::NoKernelSupport)
            } else {
                self.load_uprobe_programs(&[programs::USDT_PROBE_SLEEPABLE])
                    .map(|mut fds| fds.pop().expect("one program"))
                    .map_err(SleepableUnavailable::Usdt)
            };
            self.sleepable_usdt = Some(loaded);
        }
        self.sleepable_usdt.as_ref().and_then(|r| r.as_ref().ok())
    }

    /// Makes the uprobe programs loadable later, once their maps have been taken out of the
    /// object (`take_ring`, `take_lost_counters`): for probes attached while the trace runs (in
    /// images the traced processes exec). Loading itself waits for the first probe that runs
    /// each program, so none of the four call programs is verified before a probe needs it.
    pub fn prepare_uprobe_programs(&mut self) -> Result<(), LoadError> {
        if self.program_object.is_none() {
            self.program_object = Some(
                uprobe_multi::ProgramObject::prepare(&self.ebpf, EBPF_OBJECT, self.features.attach)
                    .map_err(LoadFailure::Object)?,
            );
        }
        Ok(())
    }

    /// Loads the uprobe programs `names` for this kernel's attach mechanism (see
    /// [`uprobe_multi::ProgramObject`]).
    fn load_uprobe_programs(&mut self, names: &[&'static str]) -> Result<Vec<OwnedFd>, ObjectError> {
        if self.program_object.is_none() {
            self.program_object =
                Some(uprobe_multi::ProgramObject::prepare(&self.ebpf, EBPF_OBJECT, self.features.attach)?);
        }
        let fds = self.program_object.as_ref().expect("prepared above").load(names)?;
        self.loaded.extend(names);
        Ok(fds)
    }

    /// The programs loaded into the kernel so far, by name, in load order.
    pub fn loaded_programs(&self) -> &[&'static str] {
        &self.loaded
    }

    /// Why probes that read strings run without faulting pages in, if they do: a string in a
    /// page the target has not touched yet is then unreadable.
    pub fn sleepable_unavailable(&self) -> Option<&SleepableUnavailable> {
        self.sleepable_programs.iter().chain([&self.sleepable_usdt]).find_map(|r| r.as_ref()?.as_ref().err())
    }

    /// As [`Kernel::attach_functions`], running the programs named `entry` and `ret` (the record
    /// programs or `tracer top`'s); one pair per `Kernel`.
    pub fn attach_function_programs(
        &mut self,
        probes: &[ProbeSpec],
        entry: &'static str,
        ret: &'static str,
    ) -> Result<Vec<AttachFailure>, LoadError> {
        let mut failures = Vec::new();
        // Return probes first, as in `attach_sites`.
        for (name, is_return) in [(ret, true), (entry, false)] {
            let sites: Vec<&ProbeSpec> = probes.iter().filter(|p| p.ret == is_return).collect();
            failures.extend(self.attach_with(&sites, name, is_return)?);
        }
        Ok(failures)
    }

    /// Attaches `probes` (all of them return probes, or all entry probes, as `ret` says) running
    /// the program `name`, loaded first if it is not yet.
    fn attach_with(
        &mut self,
        probes: &[&ProbeSpec],
        name: &'static str,
        ret: bool,
    ) -> Result<Vec<AttachFailure>, LoadError> {
        if probes.is_empty() {
            return Ok(Vec::new());
        }
        let prog = match self.function_programs[ret as usize].take() {
            Some(prog) => prog,
            None => self.load_uprobe_programs(&[name]).map_err(LoadFailure::Object)?.pop().expect("one program"),
        };
        let failures = self.attach_sites(probes, &prog, ret);
        self.function_programs[ret as usize] = Some(prog);
        Ok(failures)
    }

    /// Attaches `probes`, all uprobes or all uretprobes (`ret`), running `prog`. Callers attach a
    /// function's return probes before its entry probes, so that a call seen entering is seen
    /// returning.
    fn attach_sites(&mut self, probes: &[&ProbeSpec], prog: &OwnedFd, ret: bool) -> Vec<AttachFailure> {
        let mut by_file: BTreeMap<&Path, Vec<Site>> = BTreeMap::new();
        for p in probes {
            by_file.entry(&p.path).or_default().push(Site {
                file_offset: p.file_offset,
                cookie: p.cookie,
                ref_ctr_offset: 0,
            });
        }
        let mut failures = Vec::new();
        let links = if ret { &mut self.return_links } else { &mut self.entry_links };
        let kind = if ret { "return" } else { "entry" };
        for (path, batch) in by_file {
            attach_batch(self.features.attach, prog, path, &batch, ret, kind, links, &mut failures);
        }
        failures
    }

    /// Writes the argument specs of `probes` (by cookie) and attaches them, each with its
    /// semaphore; returns the probes that failed (others stay attached).
    pub fn attach_usdt(&mut self, probes: &[UsdtProbe]) -> Result<Vec<AttachFailure>, LoadError> {
        if probes.is_empty() {
            return Ok(Vec::new());
        }
        {
            let map =
                self.ebpf.map_mut(names::USDT_SPECS).ok_or_else(|| LoadFailure::Missing("USDT_SPECS map".into()))?;
            let mut specs: Array<&mut MapData, tracer_common::UsdtSpec> =
                Array::try_from(map).map_err(LoadFailure::MapType)?;
            for p in probes {
                specs
                    .set(p.cookie as u32, p.spec, 0)
                    .map_err(|e| LoadError::Map { map: names::USDT_SPECS, error: e })?;
            }
        }
        if self.usdt_programs.is_none() {
            let mut fds = self
                .load_uprobe_programs(&[programs::USDT_EVENT, programs::USDT_PROBE])
                .map_err(LoadFailure::Object)?;
            let probe = fds.pop().expect("two programs");
            let event = fds.pop().expect("two programs");
            self.usdt_programs = Some((event, probe));
        }
        // A breakpoint that reads strings runs the sleepable variant where there is one.
        let reads_strings = |p: &UsdtProbe| p.program == UsdtProgram::Probe && p.spec.strings[1] > 0;
        let sleepable = probes.iter().any(reads_strings) && self.load_sleepable_usdt().is_some();
        let mut by_link: BTreeMap<(&Path, UsdtProgram, bool), Vec<Site>> = BTreeMap::new();
        for p in probes {
            by_link.entry((&p.path, p.program, sleepable && reads_strings(p))).or_default().push(Site {
                file_offset: p.file_offset,
                cookie: p.cookie,
                ref_ctr_offset: p.semaphore_offset,
            });
        }
        let (event_prog, probe_prog) = self.usdt_programs.as_ref().expect("loaded above");
        let sleepable_prog = self.sleepable_usdt.as_ref().and_then(|r| r.as_ref().ok());
        let mut failures = Vec::new();
        for ((path, program, sleepable), sites) in by_link {
            let prog = match (program, sleepable_prog) {
                (UsdtProgram::Event, _) => event_prog,
                (UsdtProgram::Probe, Some(probe_s)) if sleepable => probe_s,
                (UsdtProgram::Probe, _) => probe_prog,
            };
            attach_batch(self.features.attach, prog, path, &sites, false, "USDT", &mut self.usdt_links, &mut failures);
        }
        Ok(failures)
    }

    /// Opens a hardware watchpoint on each of `points` (inherited by the threads and children
    /// the thread creates after it) with the `watch_hit` program attached.
    pub fn attach_watchpoints(&mut self, points: &[Watchpoint]) -> Result<(), LoadError> {
        use aya::programs::perf_event::{
            BreakpointConfig, PerfBreakpointLength, PerfBreakpointType, PerfEvent, PerfEventConfig, PerfEventScope,
            SamplePolicy,
        };
        if points.is_empty() {
            return Ok(());
        }
        let program: &mut PerfEvent = self
            .ebpf
            .program_mut(programs::WATCH_HIT)
            .ok_or_else(|| LoadFailure::Missing("the watch_hit program".into()))?
            .try_into()
            .map_err(LoadFailure::Program)?;
        if !self.loaded.contains(&programs::WATCH_HIT) {
            program.load().map_err(|error| LoadFailure::NamedProgram { name: programs::WATCH_HIT, error })?;
            self.loaded.push(programs::WATCH_HIT);
        }
        for p in points {
            let length = match p.len {
                1 => PerfBreakpointLength::Len1,
                2 => PerfBreakpointLength::Len2,
                4 => PerfBreakpointLength::Len4,
                _ => PerfBreakpointLength::Len8,
            };
            let r#type = match p.access {
                Access::Write => PerfBreakpointType::Write,
                // x86 debug registers have no read-only mode: reads are caught with writes.
                Access::Read | Access::ReadWrite => PerfBreakpointType::ReadWrite,
            };
            let config = PerfEventConfig::Breakpoint(BreakpointConfig::Data { r#type, address: p.address, length });
            program
                .attach(config, PerfEventScope::OneProcess { pid: p.tid, cpu: None }, SamplePolicy::Period(1), true)
                .map_err(|error| LoadError::Watchpoint { address: p.address, tid: p.tid, error })?;
        }
        Ok(())
    }

    /// What this kernel offers, as probed at start-up.
    pub fn features(&self) -> &KernelFeatures {
        &self.features
    }

    /// Adds a process to the traced set, with its thread count (see `THREAD_COUNTS` in
    /// tracer-ebpf/src/maps.rs). The threads are counted after the process is traced, so that
    /// one started meanwhile is in the count whether or not the kernel saw it start; one started
    /// or ended between the count and its write can make the count one off (the process's end
    /// then comes a thread early or late). A launched command has one thread, held before exec.
    pub fn trace_pid(&mut self, pid: u32) -> Result<(), LoadError> {
        self.traced_pids_map()?.insert(pid, 1, 0).map_err(|e| LoadError::Map { map: names::TRACED_PIDS, error: e })?;
        let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.count() as u64).unwrap_or(1).max(1);
        self.thread_counts_map()?
            .insert(pid, threads, 0)
            .map_err(|e| LoadError::Map { map: names::THREAD_COUNTS, error: e })
    }

    fn thread_counts_map(&mut self) -> Result<BpfHashMap<&mut MapData, u32, u64>, LoadError> {
        let map =
            self.ebpf.map_mut(names::THREAD_COUNTS).ok_or_else(|| LoadFailure::Missing("THREAD_COUNTS map".into()))?;
        Ok(BpfHashMap::try_from(map).map_err(LoadFailure::MapType)?)
    }

    /// Removes a process from the traced set (one that exited before the kernel saw it exit), and
    /// counts the removal in `TRACED_REMOVALS`' user-space slot, which makes every CPU's cached
    /// "traced" answer stale (see `is_traced` in tracer-ebpf/src/maps.rs).
    pub fn untrace_pid(&mut self, pid: u32) {
        if let Ok(mut map) = self.traced_pids_map() {
            let _ = map.remove(&pid);
        }
        if let Ok(mut map) = self.thread_counts_map() {
            let _ = map.remove(&pid);
        }
        if let Some(map) = self.ebpf.map_mut(names::TRACED_REMOVALS)
            && let Ok(mut removals) = Array::<&mut MapData, u64>::try_from(map)
        {
            // User space is this slot's only writer.
            let n = removals.get(&1, 0).unwrap_or(0);
            let _ = removals.set(1, n.wrapping_add(1), 0);
        }
    }

    /// The processes being traced now.
    pub fn traced_pids(&mut self) -> Vec<u32> {
        self.traced_pids_map().map(|m| m.keys().filter_map(Result::ok).collect()).unwrap_or_default()
    }

    fn traced_pids_map(&mut self) -> Result<BpfHashMap<&mut MapData, u32, u32>, LoadError> {
        let map =
            self.ebpf.map_mut(names::TRACED_PIDS).ok_or_else(|| LoadFailure::Missing("TRACED_PIDS map".into()))?;
        Ok(BpfHashMap::try_from(map).map_err(LoadFailure::MapType)?)
    }

    /// Stops recording: no process is traced any more (the probes stay until dropped). Calls
    /// still open then stay unfinished, rather than their returns arriving without their calls
    /// while the probes are detached one link at a time.
    pub fn stop_tracing(&mut self) {
        for pid in self.traced_pids() {
            self.untrace_pid(pid);
        }
        if let Some(map) = self.ebpf.map_mut(names::TARGET_INODES)
            && let Ok(mut map) = BpfHashMap::<&mut MapData, InodeKey, u32>::try_from(map)
        {
            let keys: Vec<InodeKey> = map.keys().filter_map(Result::ok).collect();
            for key in keys {
                let _ = map.remove(&key);
            }
        }
    }

    /// Hands the kernel a function's string reads (see `tracer_common::strings`), before its
    /// probes are attached with `cookie::STRINGS`.
    pub fn set_layout(&mut self, function: u32, layout: tracer_common::ProbeLayoutBytes) -> Result<(), LoadError> {
        let map = self.ebpf.map_mut(names::LAYOUTS).ok_or_else(|| LoadFailure::Missing("LAYOUTS map".into()))?;
        let mut map: BpfHashMap<&mut MapData, u32, tracer_common::ProbeLayoutBytes> =
            BpfHashMap::try_from(map).map_err(LoadFailure::MapType)?;
        map.insert(function, layout, 0).map_err(|e| LoadError::Map { map: names::LAYOUTS, error: e })
    }

    /// Makes processes that exec this file traced from their first instruction.
    pub fn trace_executable(&mut self, key: InodeKey) -> Result<(), LoadError> {
        let map =
            self.ebpf.map_mut(names::TARGET_INODES).ok_or_else(|| LoadFailure::Missing("TARGET_INODES map".into()))?;
        let mut map: BpfHashMap<&mut MapData, InodeKey, u32> =
            BpfHashMap::try_from(map).map_err(LoadFailure::MapType)?;
        map.insert(key, 1, 0).map_err(|e| LoadError::Map { map: names::TARGET_INODES, error: e })
    }

    /// Marks an image as resolved: a traced process that execs it is no longer stopped for
    /// resolution (see `RESOLVED_IMAGES` in tracer-ebpf/src/maps.rs).
    pub fn mark_resolved(&mut self, key: InodeKey) -> Result<(), LoadError> {
        let map = self
            .ebpf
            .map_mut(names::RESOLVED_IMAGES)
            .ok_or_else(|| LoadFailure::Missing("RESOLVED_IMAGES map".into()))?;
        let mut map: BpfHashMap<&mut MapData, InodeKey, u8> =
            BpfHashMap::try_from(map).map_err(LoadFailure::MapType)?;
        map.insert(key, 1, 0).map_err(|e| LoadError::Map { map: names::RESOLVED_IMAGES, error: e })
    }

    /// `--debug-kernel`: takes the programs' aya-log ring (keep it for the whole run).
    pub fn start_kernel_log(&mut self) -> Result<crate::kernel::log::KernelLog, LoadError> {
        Ok(crate::kernel::log::KernelLog::start(&mut self.ebpf).map_err(LoadFailure::KernelLog)?)
    }

    /// Takes the ring buffer, to be drained independently of the programs' lifetime.
    pub fn take_ring(&mut self) -> Result<RingBuf<MapData>, LoadError> {
        let map = self.ebpf.take_map(names::EVENTS).ok_or_else(|| LoadFailure::Missing("EVENTS map".into()))?;
        Ok(RingBuf::try_from(map).map_err(LoadFailure::MapType)?)
    }

    /// The per-CPU rings calls and returns are written to, mapped for reading.
    pub fn call_rings(&self) -> Result<CallRings, LoadError> {
        let Some(aya::maps::Map::Array(map)) = self.ebpf.map(names::CALL_RINGS) else {
            return Err(LoadFailure::Missing("CALL_RINGS map".into()).into());
        };
        Ok(CallRings::map(map.fd().as_fd(), self.call_rings).map_err(LoadFailure::MapMemory)?)
    }

    /// The kernel's map named `name` (for `tracer top`'s statistics).
    pub fn map(&self, name: &'static str) -> Result<&aya::maps::Map, LoadError> {
        Ok(self.ebpf.map(name).ok_or_else(|| LoadFailure::Missing(format!("{name} map")))?)
    }

    /// Takes the lost-event counters, to be read after the programs are detached.
    /// Hands the kernel a function's predicate, before its probes are attached with
    /// `cookie::FILTERED`.
    pub fn set_filter(&mut self, function: u32, program: tracer_common::filter::Program) -> Result<(), LoadError> {
        let map = self.ebpf.map_mut(names::FILTERS).ok_or_else(|| LoadFailure::Missing("FILTERS map".into()))?;
        let mut map: BpfHashMap<&mut MapData, u32, tracer_common::filter::Program> =
            BpfHashMap::try_from(map).map_err(LoadFailure::MapType)?;
        map.insert(function, program, 0).map_err(|e| LoadError::Map { map: names::FILTERS, error: e })
    }

    /// Hands the kernel a function's gate role (`gate::START`, ...), before its probes are
    /// attached with `cookie::GATE_ROLE`.
    pub fn set_gate_role(&mut self, function: u32, role: u8) -> Result<(), LoadError> {
        let map = self.ebpf.map_mut(names::GATE_ROLES).ok_or_else(|| LoadFailure::Missing("GATE_ROLES map".into()))?;
        let mut map: BpfHashMap<&mut MapData, u32, u8> = BpfHashMap::try_from(map).map_err(LoadFailure::MapType)?;
        map.insert(function, role, 0).map_err(|e| LoadError::Map { map: names::GATE_ROLES, error: e })
    }

    /// The predicates' per-function counters, readable after the programs are gone.
    pub fn take_filter_counters(&mut self) -> Result<FilterCounters, LoadError> {
        let map =
            self.ebpf.take_map(names::FILTER_COUNTS).ok_or_else(|| LoadFailure::Missing("FILTER_COUNTS map".into()))?;
        Ok(FilterCounters { map: PerCpuArray::try_from(map).map_err(LoadFailure::MapType)? })
    }

    pub fn take_lost_counters(&mut self) -> Result<LostCounters, LoadError> {
        let map = self.ebpf.take_map(names::LOST).ok_or_else(|| LoadFailure::Missing("LOST map".into()))?;
        Ok(LostCounters { map: PerCpuArray::try_from(map).map_err(LoadFailure::MapType)? })
    }
}

impl Drop for Kernel {
    /// Entry probes go first: detaching takes a while (an RCU grace period per link), and calls
    /// made meanwhile must still get their returns.
    fn drop(&mut self) {
        self.entry_links.clear();
        self.return_links.clear();
        self.usdt_links.clear();
    }
}

/// Attaches a batch of probes. As uprobe-multi, in one link; when the kernel refuses the batch
/// (one offset it cannot probe spoils it all), halves it until the refused probes are found, so
/// that the good ones are still attached, in few links. As perf events, one link per site.
#[allow(clippy::too_many_arguments)]
fn attach_batch(
    mechanism: AttachMechanism,
    prog: &OwnedFd,
    path: &Path,
    batch: &[Site],
    ret: bool,
    kind: &str,
    links: &mut Vec<OwnedFd>,
    failures: &mut Vec<AttachFailure>,
) {
    let failed = |site: &Site, e: std::io::Error| AttachFailure {
        cookie: site.cookie,
        reason: format!("{kind} probe at offset {:#x}: {e}", site.file_offset),
    };
    if mechanism == AttachMechanism::PerfEvent {
        for site in batch {
            match uprobe_perf::attach(prog, path, site, ret) {
                Ok(link) => links.push(link),
                Err(e) => failures.push(failed(site, e)),
            }
        }
        return;
    }
    if batch.is_empty() {
        return;
    }
    match uprobe_multi::attach(prog, path, batch, ret) {
        Ok(link) => links.push(link),
        Err(e) if batch.len() == 1 => failures.push(failed(&batch[0], e)),
        Err(_) => {
            let (left, right) = batch.split_at(batch.len() / 2);
            attach_batch(mechanism, prog, path, left, ret, kind, links, failures);
            attach_batch(mechanism, prog, path, right, ret, kind, links, failures);
        }
    }
}

/// The kernel's per-CPU counters of each filtered function.
pub struct FilterCounters {
    map: PerCpuArray<MapData, tracer_common::filter::Counts>,
}

impl FilterCounters {
    /// One function's counts, summed over the CPUs.
    pub fn read(&self, function: u32) -> tracer_common::filter::Counts {
        let mut total = tracer_common::filter::Counts::default();
        if let Ok(values) = self.map.get(&function, 0) {
            for c in values.iter() {
                total.seen += c.seen;
                total.filtered += c.filtered;
                total.returns_not_dropped += c.returns_not_dropped;
                total.entries_lost += c.entries_lost;
                total.by_trigger += c.by_trigger;
                total.by_depth += c.by_depth;
                total.returns_unmatched += c.returns_unmatched;
            }
        }
        total
    }
}

/// The kernel's per-CPU lost-event counters.
pub struct LostCounters {
    map: PerCpuArray<MapData, u64>,
}

impl LostCounters {
    pub fn read(&self) -> LostCounts {
        let mut counts = [0u64; LostSlot::COUNT as usize];
        for (slot, count) in counts.iter_mut().enumerate() {
            if let Ok(values) = self.map.get(&(slot as u32), 0) {
                *count = values.iter().sum();
            }
        }
        counts
    }
}
