//! `tracer debug-usdt`: attaches the USDT probes of a command or of running processes and writes
//! every record they produce, decoded, as JSON lines (one `log` or `usdt` object per record, an
//! `end` object last). A window onto the kernel side until `tracer record` carries `log` and
//! `usdt` events; the integration tests and `cargo xtask bench` drive it.

use std::{collections::BTreeMap, ffi::OsString, future::Future, io::Write, path::PathBuf, time::Duration};

use serde::Serialize;
use tracer_common::{Config, RecordKind, decode::Record, kind_bit};

use super::{
    decode::{ArgValue, ProgramEvent, probe_hit, program_event},
    select::{ProbeFiles, ProbeTable, RegisterOffsets, Selection, UsdtPattern, UsdtProgram, select},
};
use crate::{
    assemble::lost_slot_name,
    clock::BootClock,
    drain::RingDrain,
    event::EndReason,
    kernel_btf::KernelBtf,
    launch::{ChildExit, spawn_stopped, try_reap},
    loader::{Kernel, raise_fd_limit},
    modules::ModuleCandidates,
    record::{RecordError, TICK, any_target_alive, sleep_until, wakeup_bytes},
    targets::{self, Process},
};

#[derive(Clone, Debug, Default)]
pub struct DebugOptions {
    pub pids: Vec<u32>,
    /// The command to launch, program first; empty for none.
    pub command: Vec<OsString>,
    /// `-u` patterns, besides the program-event probes that are always taken.
    pub patterns: Vec<String>,
    pub duration: Option<Duration>,
    pub buffer_size: u32,
}

/// What is going to be attached, checked before anything is.
pub struct DebugPlan {
    options: DebugOptions,
    processes: Vec<Process>,
    command: Option<PathBuf>,
    files: ProbeFiles,
    selection: Selection,
}

/// Resolves the targets, reads the probes of their executables and libraries, and selects.
pub fn plan(options: DebugOptions) -> Result<DebugPlan, RecordError> {
    if options.pids.is_empty() && options.command.is_empty() {
        return Err(RecordError::NoTargets);
    }
    let processes = options.pids.iter().map(|&pid| targets::inspect_process(pid)).collect::<Result<Vec<_>, _>>()?;
    let command = options.command.first().map(|program| targets::resolve_command(program)).transpose()?;
    let executables: Vec<PathBuf> = processes.iter().map(|p| p.exe.clone()).chain(command.clone()).collect();
    let pids: Vec<u32> = processes.iter().map(|p| p.pid).collect();
    let candidates = ModuleCandidates::new(&executables, &pids);
    let patterns = options.patterns.iter().map(|p| UsdtPattern::parse(p)).collect::<Result<Vec<_>, _>>()?;
    let mut files = ProbeFiles::load(candidates.files())?;
    let regs = RegisterOffsets::from_btf(&KernelBtf::load()?)?;
    let selection = select(&mut files, &candidates, &patterns, &regs)?;
    Ok(DebugPlan { options, processes, command, files, selection })
}

/// One line of the output.
#[derive(Serialize)]
#[serde(tag = "record", rename_all = "snake_case")]
enum Line<'a> {
    /// A program event.
    Log {
        ts: u64,
        pid: u32,
        tid: u32,
        module: &'a str,
        #[serde(flatten)]
        event: ProgramEvent,
        /// Bytes the program passed, and bytes the kernel copied.
        payload_len: u64,
        copied_len: u32,
    },
    /// A program event whose payload could not be read.
    Unreadable { ts: u64, pid: u32, tid: u32, module: &'a str, reason: String },
    /// A USDT probe's arguments.
    Usdt { ts: u64, pid: u32, tid: u32, provider: &'a str, name: &'a str, module: &'a str, args: Vec<Option<ArgValue>> },
    /// The last line.
    End { reason: EndReason, records: u64, lost: BTreeMap<&'static str, u64>, undecodable: u64 },
}

/// How the run ended.
pub struct DebugOutcome {
    pub records: u64,
    /// Records lost in the kernel or not decodable, by where.
    pub lost: BTreeMap<&'static str, u64>,
    pub command_exit: Option<ChildExit>,
}

impl DebugPlan {
    pub fn warnings(&self) -> &[String] {
        &self.selection.warnings
    }

    /// How many sites will be attached: program-event probes, other probes.
    pub fn counts(&self) -> (usize, usize) {
        let events = self.selection.probes.iter().filter(|p| p.program == UsdtProgram::Event).count();
        (events, self.selection.probes.len() - events)
    }

    /// Writes every probe of the targets' files: `module`, then `  provider:name args [semaphore]`.
    pub fn list(&self, out: &mut dyn Write) -> std::io::Result<()> {
        for file in self.files.iter().filter(|f| !f.notes.is_empty()) {
            writeln!(out, "{}", file.path.display())?;
            for note in &file.notes {
                let semaphore = if note.semaphore.is_some() { " [semaphore]" } else { "" };
                writeln!(out, "  {}:{}  {}{semaphore}", note.provider, note.name, note.args_text)?;
            }
        }
        Ok(())
    }

    /// Launches the command (stopped), attaches every selected probe, traces the targets, and
    /// writes their decoded records to `out` until they are gone, the duration elapses or `stop`
    /// resolves.
    pub async fn run(
        self,
        out: &mut dyn Write,
        stop: impl Future<Output = EndReason>,
        started: impl FnOnce(usize),
    ) -> Result<DebugOutcome, RecordError> {
        let DebugPlan { options, processes, command, selection, .. } = self;
        if selection.probes.is_empty() {
            return Err(RecordError::NoUsdtProbes);
        }
        let child = command.as_ref().map(|path| spawn_stopped(path, &options.command, None)).transpose()?;
        let config = Config {
            enabled_kinds: kind_bit(RecordKind::UserEvent) | kind_bit(RecordKind::Usdt),
            follow_children: 1,
            has_target_inodes: 0,
            top_by_process: 0,
            wakeup_bytes: wakeup_bytes(options.buffer_size),
            capture_bytes: 0,
            _pad: 0,
            offsets: KernelBtf::load()?.offsets()?,
        };
        raise_fd_limit(1024);
        let mut kernel = Kernel::load(&config, options.buffer_size, selection.probes.len())?;
        kernel.attach_sched()?;
        let failures = kernel.attach_usdt(&selection.probes)?;
        if failures.len() == selection.probes.len() {
            return Err(RecordError::NoUsdtProbeAttached(failures[0].reason.clone()));
        }
        let ring = kernel.take_ring()?;
        let lost_counters = kernel.take_lost_counters()?;
        for p in &processes {
            kernel.trace_pid(p.pid)?;
        }
        if let Some(child) = &child {
            kernel.trace_pid(child.pid())?;
        }
        let clock = BootClock::calibrate();
        let child_pid = child.map(|c| c.release()).transpose()?;
        started(selection.probes.len() - failures.len());

        let mut writer = Writer { out, table: &selection.table, clock, records: 0, undecodable: 0 };
        let mut drain = RingDrain::spawn(ring)?;
        let deadline = options.duration.map(|d| tokio::time::Instant::now() + d);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut command_exit = None;
        tokio::pin!(stop);
        let reason = loop {
            tokio::select! {
                biased;
                reason = &mut stop => break reason,
                _ = sleep_until(deadline) => break EndReason::Duration,
                batch = drain.recv() => match batch {
                    Some(batch) => batch.records().try_for_each(|r| writer.record(r))?,
                    None => return Err(drain.join().err().unwrap_or_else(|| std::io::Error::other("the ring-buffer drain stopped")).into()),
                },
                _ = tick.tick() => {
                    if let Some(pid) = child_pid && command_exit.is_none() {
                        command_exit = try_reap(pid);
                    }
                    if (child_pid.is_none() || command_exit.is_some()) && !any_target_alive(&mut kernel) {
                        break if child_pid.is_some() { EndReason::CommandExited } else { EndReason::TargetsExited };
                    }
                }
            }
        };
        kernel.stop_tracing();
        drop(kernel);
        drain.finish();
        while let Some(batch) = drain.recv().await {
            batch.records().try_for_each(|r| writer.record(r))?;
        }
        drain.join()?;
        if let Some(pid) = child_pid
            && command_exit.is_none()
        {
            command_exit = try_reap(pid);
        }
        let counts = lost_counters.read();
        let mut lost = BTreeMap::new();
        for kind in [RecordKind::UserEvent, RecordKind::Usdt] {
            lost.insert(lost_slot_name(kind as u32).expect("named"), counts[kind as usize]);
        }
        let (records, undecodable) = (writer.records, writer.undecodable);
        lost.insert("undecodable", undecodable);
        writer.line(&Line::End { reason, records, lost: lost.clone(), undecodable })?;
        writer.out.flush()?;
        Ok(DebugOutcome { records, lost, command_exit })
    }
}

/// Decodes records and writes them as lines.
struct Writer<'a> {
    out: &'a mut dyn Write,
    table: &'a ProbeTable,
    clock: BootClock,
    records: u64,
    undecodable: u64,
}

impl Writer<'_> {
    fn line(&mut self, line: &Line<'_>) -> std::io::Result<()> {
        serde_json::to_writer(&mut *self.out, line)?;
        self.out.write_all(b"\n")
    }

    fn record(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let record = tracer_common::decode::decode(bytes);
        let probe = record.as_ref().ok().and_then(|r| match r {
            Record::UserEvent(r, _) => self.table.get(r.cookie as usize),
            Record::Usdt(r) => self.table.get(r.cookie as usize),
            _ => None,
        });
        let (Ok(record), Some(probe)) = (record, probe) else {
            self.undecodable += 1;
            return Ok(());
        };
        let h = *record.header();
        let (ts, pid, tid, module) = (self.clock.to_unix_ns(h.ts_boot_ns), h.pid, h.tid, &*probe.module);
        let line = match record {
            Record::UserEvent(r, payload) => match program_event(&r, payload) {
                Ok(event) => {
                    Line::Log { ts, pid, tid, module, event, payload_len: r.payload_len, copied_len: r.copied_len }
                }
                Err(e) => Line::Unreadable { ts, pid, tid, module, reason: e.to_string() },
            },
            Record::Usdt(r) => Line::Usdt {
                ts,
                pid,
                tid,
                provider: &probe.provider,
                name: &probe.name,
                module,
                args: probe_hit(&r, probe).args,
            },
            _ => unreachable!("only USDT records have a probe"),
        };
        self.records += 1;
        self.line(&line)
    }
}
