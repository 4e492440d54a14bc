//! `tracer report`: time per function and what each process did, from one pass over a trace.
//!
//! Per function (or per process and function): calls, total (inclusive) time, self time (total
//! minus the time in traced callees), mean, min, percentiles and max of the calls' durations, and
//! how many of the calls did not return (they are counted up to when they ended: see
//! [`super::slices`]). A recursive function's total counts its outermost calls only (a call made
//! while another call of it is on the thread's stack is inside that one's time already), as uftrace
//! and profilers count it; its self time, mean and percentiles are per call, every level.
//! Per process: lifetime, how it ended, children forked, threads started, IPC bytes.
//! What the programs said: `log` events per level and source, `usdt` events per probe (per
//! process too with `--by-process`); shown only when the trace has some.
//!
//! Memory grows with the number of functions and processes, not with the number of events (see
//! [`super::percentile`] for how durations are summarised).

use crate::event::data;
use std::{
    collections::BTreeMap,
    io::{self, Write},
    sync::Arc,
};

use serde::Serialize;

use super::{
    percentile::Percentiles,
    processes::ProcessNames,
    slices::{CallEvent, CallTracker, Calls, Ending},
};
use crate::{
    event::{Event, EventData, Level, SpawnHow, TargetInfo, TraceEnd, TraceStart},
    sink::Sink,
};

/// The columns a function table can be sorted by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortColumn {
    Function,
    Process,
    Calls,
    Total,
    SelfTime,
    Mean,
    Min,
    P50,
    P90,
    P99,
    Max,
    Unfinished,
}

impl SortColumn {
    /// Every column, in the order the command line lists them.
    pub const ALL: [SortColumn; 12] = [
        SortColumn::Function,
        SortColumn::Process,
        SortColumn::Calls,
        SortColumn::Total,
        SortColumn::SelfTime,
        SortColumn::Mean,
        SortColumn::Min,
        SortColumn::P50,
        SortColumn::P90,
        SortColumn::P99,
        SortColumn::Max,
        SortColumn::Unfinished,
    ];

    /// The column's name on the command line (`--sort NAME`).
    pub fn name(self) -> &'static str {
        match self {
            SortColumn::Function => "function",
            SortColumn::Process => "process",
            SortColumn::Calls => "calls",
            SortColumn::Total => "total",
            SortColumn::SelfTime => "self",
            SortColumn::Mean => "mean",
            SortColumn::Min => "min",
            SortColumn::P50 => "p50",
            SortColumn::P90 => "p90",
            SortColumn::P99 => "p99",
            SortColumn::Max => "max",
            SortColumn::Unfinished => "unfinished",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FunctionStats {
    pub function: String,
    /// Set with `--by-process`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
    pub calls: u64,
    /// The time in its outermost calls: a recursive call's time is counted once.
    pub total_ns: u64,
    pub self_ns: u64,
    /// Of every call's duration, nested ones too.
    pub mean_ns: u64,
    pub min_ns: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    /// Calls that did not return (ended by their caller's return, an exit, an exec or the stop).
    pub unfinished: u64,
    /// Calls made while another call of the same function was on the thread's stack: counted
    /// in `calls` and `self_ns`, but not in `total_ns`.
    #[serde(skip_serializing_if = "is_zero")]
    pub recursive_calls: u64,
    /// Whether the percentiles are exact (else within 1%, see `analysis::percentile`).
    pub exact_percentiles: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ProcessStats {
    pub pid: u32,
    pub name: Option<String>,
    /// When it was forked (or first seen), Unix ns.
    pub start_ns: u64,
    /// When it exited, Unix ns; `None` if it outlived the trace.
    pub end_ns: Option<u64>,
    /// From its start to its exit, or to the end of the trace.
    pub lifetime_ns: u64,
    pub exit_code: Option<i32>,
    /// The signal that killed it.
    pub signal: Option<i32>,
    /// Processes it forked.
    pub children: u64,
    /// Threads it started.
    pub threads: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
}

/// `log` events of one level and source.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LogCount {
    /// Set with `--by-process`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
    pub level: Level,
    /// `None`: events without one (`print*`, the C header's).
    pub source: Option<String>,
    pub events: u64,
}

/// `usdt` events of one probe.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UsdtCount {
    /// Set with `--by-process`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
    pub provider: String,
    pub name: String,
    pub events: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Report {
    pub functions: Vec<FunctionStats>,
    pub processes: Vec<ProcessStats>,
    /// Most severe level first, then by source.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub logs: Vec<LogCount>,
    /// Most events first, then by name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub usdt: Vec<UsdtCount>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Clone, Debug, Default)]
struct Accumulator {
    calls: u64,
    /// Of the outermost calls.
    total: u64,
    /// Of every call, for the mean.
    sum: u64,
    recursive: u64,
    self_ns: u64,
    min: u64,
    max: u64,
    unfinished: u64,
    durations: Percentiles,
}

/// What `log` events are counted by: (pid with `--by-process`, level, source).
type LogKey = (Option<u32>, Level, Option<String>);
/// What `usdt` events are counted by: (pid with `--by-process`, provider, name).
type UsdtKey = (Option<u32>, Arc<str>, Arc<str>);

/// What a function's calls are counted by: (pid with `--by-process`, its name).
type FunctionKey = (Option<u32>, Arc<str>);

/// Entries of [`Functions::recent`]: a power of two.
const RECENT: usize = 64;

/// The function table, updated at every call's end.
///
/// Found by name (FNV: several times faster than SipHash on a short name) only when the name's
/// `Arc` is not one of the recent ones, remembered by address: readers hand out one `Arc` per
/// distinct name, so that hashing and comparing a name is rare. A recent entry holds its `Arc`,
/// so that its address cannot be reused by another name while it is remembered.
#[derive(Debug)]
struct Functions {
    by_name: fnv::FnvHashMap<FunctionKey, usize>,
    accumulators: Vec<(FunctionKey, Accumulator)>,
    /// Direct-mapped by the name's address.
    recent: Vec<Option<(FunctionKey, usize)>>,
}

impl Default for Functions {
    fn default() -> Self {
        Functions { by_name: fnv::FnvHashMap::default(), accumulators: Vec::new(), recent: vec![None; RECENT] }
    }
}

impl Functions {
    fn get(&mut self, pid: Option<u32>, function: &Arc<str>) -> &mut Accumulator {
        let address = Arc::as_ptr(function) as *const u8 as usize;
        let way = (address >> 4 ^ pid.unwrap_or(0) as usize) & (RECENT - 1);
        let index = match &self.recent[way] {
            Some(((p, f), index)) if *p == pid && Arc::ptr_eq(f, function) => *index,
            _ => {
                let key = (pid, function.clone());
                let next = self.accumulators.len();
                let index = *self.by_name.entry(key.clone()).or_insert(next);
                if index == next {
                    self.accumulators.push((key.clone(), Accumulator::default()));
                }
                self.recent[way] = Some((key, index));
                index
            }
        };
        &mut self.accumulators[index].1
    }
}

/// Builds a [`Report`] from a trace's events; a [`Sink`], so it reads a trace in one pass.
#[derive(Debug, Default)]
pub struct ReportBuilder {
    by_process: bool,
    tracker: CallTracker,
    names: ProcessNames,
    functions: Functions,
    /// The process of the last event, known to be in `processes` (most events are on the
    /// process of the one before).
    last_pid: Option<u32>,
    processes: BTreeMap<u32, ProcessStats>,
    logs: BTreeMap<LogKey, u64>,
    usdt: BTreeMap<UsdtKey, u64>,
    report: Option<Report>,
}

impl ReportBuilder {
    pub fn new(by_process: bool) -> Self {
        ReportBuilder { by_process, ..ReportBuilder::default() }
    }

    /// The report, once the trace has ended.
    pub fn into_report(self) -> Option<Report> {
        self.report
    }

    fn process(&mut self, pid: u32, ts: u64) -> &mut ProcessStats {
        self.processes.entry(pid).or_insert_with(|| ProcessStats { pid, start_ns: ts, ..ProcessStats::default() })
    }

    /// The report so far, of the calls that ended (for a live view): lifetimes up to `now_ns`.
    pub fn snapshot(&self, now_ns: u64) -> Report {
        self.report_of(
            self.functions.accumulators.clone(),
            self.processes.clone(),
            self.logs.clone(),
            self.usdt.clone(),
            now_ns,
        )
    }

    fn build(&mut self, end: &TraceEnd) -> Report {
        let functions = std::mem::take(&mut self.functions).accumulators;
        let (processes, logs, usdt) =
            (std::mem::take(&mut self.processes), std::mem::take(&mut self.logs), std::mem::take(&mut self.usdt));
        self.report_of(functions, processes, logs, usdt, end.ts)
    }

    fn report_of(
        &self,
        accumulators: Vec<(FunctionKey, Accumulator)>,
        processes: BTreeMap<u32, ProcessStats>,
        logs: BTreeMap<LogKey, u64>,
        usdt: BTreeMap<UsdtKey, u64>,
        end_ts: u64,
    ) -> Report {
        let mut functions: Vec<FunctionStats> = accumulators
            .into_iter()
            .map(|((pid, function), mut acc)| FunctionStats {
                function: function.to_string(),
                pid,
                process: pid.and_then(|p| self.names.get(p).map(str::to_string)),
                calls: acc.calls,
                total_ns: acc.total,
                self_ns: acc.self_ns,
                mean_ns: acc.sum / acc.calls.max(1),
                min_ns: acc.min,
                p50_ns: acc.durations.quantile(0.50).unwrap_or(0),
                p90_ns: acc.durations.quantile(0.90).unwrap_or(0),
                p99_ns: acc.durations.quantile(0.99).unwrap_or(0),
                max_ns: acc.max,
                unfinished: acc.unfinished,
                recursive_calls: acc.recursive,
                exact_percentiles: acc.durations.is_exact(),
            })
            .collect();
        sort_functions(&mut functions, SortColumn::Total);
        let processes = processes
            .into_values()
            .map(|mut p| {
                p.name = self.names.get(p.pid).map(str::to_string);
                p.lifetime_ns = p.end_ns.unwrap_or(end_ts.max(p.start_ns)).saturating_sub(p.start_ns);
                p
            })
            .collect();
        let process = |pid: Option<u32>| pid.and_then(|p| self.names.get(p).map(str::to_string));
        let mut logs: Vec<LogCount> = logs
            .into_iter()
            .map(|((pid, level, source), events)| LogCount { pid, process: process(pid), level, source, events })
            .collect();
        logs.sort_by(|a, b| b.level.cmp(&a.level).then_with(|| (&a.source, a.pid).cmp(&(&b.source, b.pid))));
        let mut usdt: Vec<UsdtCount> = usdt
            .into_iter()
            .map(|((pid, provider, name), events)| UsdtCount {
                pid,
                process: process(pid),
                provider: provider.to_string(),
                name: name.to_string(),
                events,
            })
            .collect();
        usdt.sort_by(|a, b| {
            b.events.cmp(&a.events).then_with(|| (&a.provider, &a.name, a.pid).cmp(&(&b.provider, &b.name, b.pid)))
        });
        Report { functions, processes, logs, usdt }
    }
}

/// Adds the calls that ended to the function table.
fn count_calls(mut calls: Calls, functions: &mut Functions, by_process: bool) {
    while let Some(c) = calls.next() {
        let CallEvent::End(slice) = c else { continue };
        let acc = functions.get(by_process.then_some(slice.pid), &slice.frame.function);
        let duration = slice.duration();
        acc.min = if acc.calls == 0 { duration } else { acc.min.min(duration) };
        acc.max = acc.max.max(duration);
        acc.calls += 1;
        acc.sum += duration;
        // The callers are the thread's stack under this call: the names are shared `Arc`s, so
        // the pointer comparison nearly always decides.
        let name = &slice.frame.function;
        if slice.callers.iter().any(|c| Arc::ptr_eq(&c.function, name) || c.function == *name) {
            acc.recursive += 1;
        } else {
            acc.total += duration;
        }
        acc.self_ns += slice.self_ns();
        acc.durations.add(duration);
        if !matches!(slice.ending, Ending::Returned { .. }) {
            acc.unfinished += 1;
        }
    }
}

impl Sink for ReportBuilder {
    fn begin(&mut self, start: &TraceStart) -> io::Result<()> {
        self.names.begin(start);
        for pid in start.targets.iter().filter_map(|t| match t {
            TargetInfo::Process { pid, .. } | TargetInfo::Command { pid, .. } => Some(*pid),
            TargetInfo::Binary { .. } => None,
        }) {
            self.process(pid, start.ts);
        }
        Ok(())
    }

    fn event(&mut self, e: &Event) -> io::Result<()> {
        self.names.event(e);
        count_calls(self.tracker.event(e), &mut self.functions, self.by_process);
        if self.last_pid != Some(e.pid) {
            self.process(e.pid, e.ts);
            self.last_pid = Some(e.pid);
        }
        match &e.data {
            EventData::Spawn(data::Spawn { child_pid, how: SpawnHow::Fork, .. }) => {
                self.process(e.pid, e.ts).children += 1;
                // The child exists from its fork on, whatever it did first.
                let child = self.process(*child_pid, e.ts);
                child.start_ns = child.start_ns.min(e.ts);
            }
            EventData::Spawn(data::Spawn { how: SpawnHow::Thread, .. }) => self.process(e.pid, e.ts).threads += 1,
            EventData::Exit(data::Exit { exit_code, signal, thread: false, .. }) => {
                let p = self.process(e.pid, e.ts);
                p.end_ns = Some(e.ts);
                p.exit_code = *exit_code;
                p.signal = *signal;
            }
            EventData::Send(data::Send { bytes, .. }) => self.process(e.pid, e.ts).bytes_sent += bytes,
            // A peek's bytes are received by the receive that follows it.
            EventData::Recv(data::Recv { bytes, peek: false, .. }) => self.process(e.pid, e.ts).bytes_received += bytes,
            EventData::Log(log) => {
                *self.logs.entry((self.by_process.then_some(e.pid), log.level, log.source.clone())).or_default() += 1;
            }
            EventData::Usdt(u) => {
                let key = (self.by_process.then_some(e.pid), u.provider.clone(), u.name.clone());
                *self.usdt.entry(key).or_default() += 1;
            }
            _ => {}
        }
        Ok(())
    }

    fn end(&mut self, end: &TraceEnd) -> io::Result<()> {
        count_calls(self.tracker.finish(end.ts), &mut self.functions, self.by_process);
        self.report = Some(self.build(end));
        Ok(())
    }
}

/// Sorts a function table: names ascending, numbers descending (biggest first), ties by name.
pub fn sort_functions(functions: &mut [FunctionStats], by: SortColumn) {
    let key = |f: &FunctionStats| -> u64 {
        match by {
            SortColumn::Function | SortColumn::Process => 0,
            SortColumn::Calls => f.calls,
            SortColumn::Total => f.total_ns,
            SortColumn::SelfTime => f.self_ns,
            SortColumn::Mean => f.mean_ns,
            SortColumn::Min => f.min_ns,
            SortColumn::P50 => f.p50_ns,
            SortColumn::P90 => f.p90_ns,
            SortColumn::P99 => f.p99_ns,
            SortColumn::Max => f.max_ns,
            SortColumn::Unfinished => f.unfinished,
        }
    };
    functions.sort_by(|a, b| match by {
        SortColumn::Process => a.pid.cmp(&b.pid).then_with(|| a.function.cmp(&b.function)),
        _ => key(b).cmp(&key(a)).then_with(|| a.function.cmp(&b.function)).then_with(|| a.pid.cmp(&b.pid)),
    });
}

/// A duration for people: three significant digits and a unit.
pub fn human_ns(ns: u64) -> String {
    let (value, unit) = match ns {
        0..1_000 => return format!("{ns} ns"),
        1_000..1_000_000 => (ns as f64 / 1e3, "µs"),
        1_000_000..1_000_000_000 => (ns as f64 / 1e6, "ms"),
        _ => (ns as f64 / 1e9, "s"),
    };
    let decimals = if value >= 100.0 {
        0
    } else if value >= 10.0 {
        1
    } else {
        2
    };
    format!("{value:.decimals$} {unit}")
}

/// Writes the report as aligned text tables.
pub fn write_table(report: &Report, out: &mut dyn Write) -> io::Result<()> {
    let by_process = report.functions.iter().any(|f| f.pid.is_some());
    let mut header: Vec<&str> = Vec::new();
    if by_process {
        header.push("process");
    }
    header.extend(["function", "calls", "total", "self", "mean", "min", "p50", "p90", "p99", "max", "unfinished"]);
    let rows: Vec<Vec<String>> = report
        .functions
        .iter()
        .map(|f| {
            let mut row = Vec::new();
            if let Some(pid) = f.pid {
                row.push(match &f.process {
                    Some(name) => format!("{name} ({pid})"),
                    None => format!("pid {pid}"),
                });
            }
            row.push(f.function.clone());
            row.push(f.calls.to_string());
            for ns in [f.total_ns, f.self_ns, f.mean_ns, f.min_ns, f.p50_ns, f.p90_ns, f.p99_ns, f.max_ns] {
                row.push(human_ns(ns));
            }
            row.push(f.unfinished.to_string());
            row
        })
        .collect();
    writeln!(out, "Functions")?;
    write_aligned(&header, &rows, if by_process { 2 } else { 1 }, out)?;
    let mut recursive: Vec<&str> = Vec::new();
    for f in report.functions.iter().filter(|f| f.recursive_calls > 0) {
        if !recursive.contains(&f.function.as_str()) {
            recursive.push(&f.function);
        }
    }
    if !recursive.is_empty() {
        let names: Vec<&str> = recursive.iter().take(5).copied().collect();
        let more = if recursive.len() > 5 { ", ..." } else { "" };
        writeln!(
            out,
            "note: total is the time in the outermost calls of a recursive function ({}{more}): nested calls are inside it already; self, mean and percentiles are per call",
            names.join(", ")
        )?;
    }

    let header = ["pid", "process", "lifetime", "ended", "children", "threads", "bytes sent", "bytes received"];
    let rows: Vec<Vec<String>> = report
        .processes
        .iter()
        .map(|p| {
            let ended = match (p.end_ns, p.exit_code, p.signal) {
                (None, _, _) => "running".to_string(),
                (Some(_), _, Some(sig)) => format!("signal {sig}"),
                (Some(_), Some(code), None) => format!("exit {code}"),
                (Some(_), None, None) => "exited".to_string(),
            };
            vec![
                p.pid.to_string(),
                p.name.clone().unwrap_or_default(),
                human_ns(p.lifetime_ns),
                ended,
                p.children.to_string(),
                p.threads.to_string(),
                p.bytes_sent.to_string(),
                p.bytes_received.to_string(),
            ]
        })
        .collect();
    writeln!(out, "\nProcesses")?;
    write_aligned(&header, &rows, 2, out)?;

    let who = |pid: Option<u32>, process: &Option<String>| match (pid, process) {
        (Some(pid), Some(name)) => vec![format!("{name} ({pid})")],
        (Some(pid), None) => vec![format!("pid {pid}")],
        (None, _) => vec![],
    };
    if !report.logs.is_empty() {
        let by_process = report.logs.iter().any(|l| l.pid.is_some());
        let header: Vec<&str> =
            by_process.then_some("process").into_iter().chain(["level", "source", "events"]).collect();
        let rows: Vec<Vec<String>> = report
            .logs
            .iter()
            .map(|l| {
                let mut row = who(l.pid, &l.process);
                row.extend([l.level.name().to_string(), l.source.clone().unwrap_or_default(), l.events.to_string()]);
                row
            })
            .collect();
        writeln!(out, "\nProgram events (log)")?;
        write_aligned(&header, &rows, header.len() - 1, out)?;
    }
    if !report.usdt.is_empty() {
        let by_process = report.usdt.iter().any(|u| u.pid.is_some());
        let header: Vec<&str> = by_process.then_some("process").into_iter().chain(["probe", "events"]).collect();
        let rows: Vec<Vec<String>> = report
            .usdt
            .iter()
            .map(|u| {
                let mut row = who(u.pid, &u.process);
                row.extend([format!("{}:{}", u.provider, u.name), u.events.to_string()]);
                row
            })
            .collect();
        writeln!(out, "\nUSDT probes")?;
        write_aligned(&header, &rows, header.len() - 1, out)?;
    }
    Ok(())
}

fn write_aligned(header: &[&str], rows: &[Vec<String>], left: usize, out: &mut dyn Write) -> io::Result<()> {
    out.write_all(super::text_table::render(header, rows, |i| i < left).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        event::Channel,
        event::test_events::{call, call_in, ev, log, ret, ret_in, usdt},
        event::test_events::{end, start},
    };

    fn report(by_process: bool, events: &[Event], end_ts: u64) -> Report {
        let mut b = ReportBuilder::new(by_process);
        b.begin(&start(0)).unwrap();
        for e in events {
            b.event(e).unwrap();
        }
        b.end(&end(end_ts)).unwrap();
        b.into_report().unwrap()
    }

    fn fork(ts: u64, child: u32) -> Event {
        ev(
            ts,
            1,
            1,
            EventData::Spawn(data::Spawn {
                parent_pid: 1,
                child_pid: child,
                child_tid: child,
                how: SpawnHow::Fork,
                comm: "app".into(),
                filename: None,
            }),
        )
    }

    #[test]
    fn program_events_are_counted_per_level_and_source_and_probe() {
        let null = serde_json::Value::Null;
        let events = [
            log(100, 1, Level::Info, Some("app::db"), "a", null.clone()),
            log(200, 1, Level::Info, Some("app::db"), "b", null.clone()),
            log(300, 1, Level::Info, None, "c", null.clone()),
            log(400, 1, Level::Error, Some("app::db"), "d", null.clone()),
            usdt(500, 1, "fixture", "tick", vec![]),
            usdt(600, 1, "fixture", "tick", vec![]),
            usdt(700, 1, "libc", "setjmp", vec![]),
        ];
        let r = report(false, &events, 1000);
        let logs: Vec<(Level, Option<&str>, u64)> =
            r.logs.iter().map(|l| (l.level, l.source.as_deref(), l.events)).collect();
        assert_eq!(
            logs,
            [(Level::Error, Some("app::db"), 1), (Level::Info, None, 1), (Level::Info, Some("app::db"), 2)]
        );
        let usdt: Vec<(&str, &str, u64)> =
            r.usdt.iter().map(|u| (u.provider.as_str(), u.name.as_str(), u.events)).collect();
        assert_eq!(usdt, [("fixture", "tick", 2), ("libc", "setjmp", 1)]);
        let mut text = Vec::new();
        write_table(&r, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.ends_with(
                "\nProgram events (log)\nlevel  source   events\nerror  app::db       1\ninfo                 1\ninfo   app::db       2\n\nUSDT probes\nprobe         events\nfixture:tick       2\nlibc:setjmp        1\n"
            ),
            "{text}"
        );
        let by_process = report(true, &events, 1000);
        assert!(by_process.logs.iter().all(|l| l.pid == Some(1) && l.process.as_deref() == Some("app")));
        assert_eq!(by_process.usdt[0].pid, Some(1));
        // A trace without program events reports none, in JSON as in text.
        let quiet = report(false, &[call(100, 1, "main")], 1000);
        let json = serde_json::to_value(&quiet).unwrap();
        assert!(json.get("logs").is_none() && json.get("usdt").is_none(), "{json}");
    }

    #[test]
    fn functions_have_totals_self_time_and_percentiles() {
        let r = report(
            false,
            &[
                call(100, 1, "main"),
                call(200, 1, "work"),
                ret(300, 1, "work", Some(100)),
                call(400, 1, "work"),
                ret(700, 1, "work", Some(300)),
                call(800, 1, "open"),
            ],
            1000,
        );
        let main = FunctionStats {
            function: "main".into(),
            calls: 1,
            total_ns: 900,
            self_ns: 300,
            mean_ns: 900,
            min_ns: 900,
            p50_ns: 900,
            p90_ns: 900,
            p99_ns: 900,
            max_ns: 900,
            unfinished: 1,
            exact_percentiles: true,
            ..FunctionStats::default()
        };
        let work = FunctionStats {
            function: "work".into(),
            calls: 2,
            total_ns: 400,
            self_ns: 400,
            mean_ns: 200,
            min_ns: 100,
            p50_ns: 100,
            p90_ns: 300,
            p99_ns: 300,
            max_ns: 300,
            unfinished: 0,
            exact_percentiles: true,
            ..FunctionStats::default()
        };
        let open = FunctionStats {
            function: "open".into(),
            calls: 1,
            total_ns: 200,
            self_ns: 200,
            mean_ns: 200,
            min_ns: 200,
            p50_ns: 200,
            p90_ns: 200,
            p99_ns: 200,
            max_ns: 200,
            unfinished: 1,
            exact_percentiles: true,
            ..FunctionStats::default()
        };
        assert_eq!(r.functions, vec![main, work, open]);
    }

    /// fib(2) calls fib(1) and fib(0) under main: fib's total is its outermost call's 600 ns,
    /// not the 800 ns of its three calls, and so not more than main's; self is per call.
    #[test]
    fn a_recursive_function_total_counts_its_outermost_calls_once() {
        let r = report(
            false,
            &[
                call(100, 1, "main"),
                call(200, 1, "fib"),
                call(300, 1, "fib"),
                ret(400, 1, "fib", Some(100)),
                call(500, 1, "fib"),
                ret(600, 1, "fib", Some(100)),
                ret(800, 1, "fib", Some(600)),
                ret(900, 1, "main", Some(800)),
            ],
            1000,
        );
        let fib = r.functions.iter().find(|f| f.function == "fib").unwrap();
        let main = r.functions.iter().find(|f| f.function == "main").unwrap();
        assert_eq!((fib.calls, fib.recursive_calls, fib.total_ns, fib.self_ns), (3, 2, 600, 600));
        assert_eq!(fib.mean_ns, 800 / 3, "the mean is of every call");
        assert_eq!((main.total_ns, main.self_ns, main.recursive_calls), (800, 200, 0));
        let mut text = Vec::new();
        write_table(&r, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.contains("\nnote: total is the time in the outermost calls of a recursive function (fib)"),
            "{text}"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["functions"][0]["function"], "main");
        assert!(json["functions"][0].get("recursive_calls").is_none(), "{json}");
        assert_eq!(json["functions"][1]["recursive_calls"], 2);
    }

    #[test]
    fn by_process_and_sorting() {
        let mut r = report(
            true,
            &[
                call(100, 1, "f"),
                ret(200, 1, "f", Some(100)),
                call_in(100, 2, 2, "f"),
                ret_in(400, 2, 2, "f", Some(300)),
            ],
            1000,
        );
        let rows: Vec<(Option<u32>, Option<&str>, u64)> =
            r.functions.iter().map(|f| (f.pid, f.process.as_deref(), f.total_ns)).collect();
        assert_eq!(rows, [(Some(2), None, 300), (Some(1), Some("app"), 100)]);
        sort_functions(&mut r.functions, SortColumn::Process);
        assert_eq!(r.functions[0].pid, Some(1));
        let mut text = Vec::new();
        write_table(&r, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.starts_with("Functions\nprocess  function  calls"), "{text}");
        assert!(text.contains("\napp (1)  f             1  100 ns"), "{text}");
    }

    #[test]
    fn processes_have_lifetimes_exits_children_and_bytes() {
        let channel = Channel::Pipe { id: 9 };
        let r = report(
            false,
            &[
                fork(100, 2),
                ev(
                    150,
                    1,
                    1,
                    EventData::Send(data::Send {
                        channel: channel.clone(),
                        fd: 4,
                        bytes: 10,
                        syscall: crate::event::Syscall::Write,
                        flow_id: 1,
                        syscall_ns: 5,
                        seq: None,
                        digest: None,
                        payload: None,
                        payload_truncated: None,
                    }),
                ),
                ev(
                    160,
                    2,
                    2,
                    EventData::Recv(data::Recv {
                        channel,
                        fd: 3,
                        bytes: 10,
                        syscall: crate::event::Syscall::Read,
                        flow_ids: vec![1],
                        syscall_ns: 5,
                        seq: None,
                        digest: None,
                        payload: None,
                        payload_truncated: None,
                        peek: false,
                        discarded: None,
                    }),
                ),
                ev(
                    300,
                    2,
                    2,
                    EventData::Exit(data::Exit { exit_code: Some(7), signal: None, thread: false, comm: "kid".into() }),
                ),
                fork(400, 3),
                ev(
                    500,
                    3,
                    3,
                    EventData::Exit(data::Exit {
                        exit_code: None,
                        signal: Some(15),
                        thread: false,
                        comm: "app".into(),
                    }),
                ),
            ],
            1000,
        );
        let p = |pid: u32| r.processes.iter().find(|p| p.pid == pid).unwrap().clone();
        assert_eq!(r.processes.len(), 3);
        assert_eq!(
            p(1),
            ProcessStats {
                pid: 1,
                name: Some("app".into()),
                start_ns: 0,
                end_ns: None,
                lifetime_ns: 1000,
                children: 2,
                bytes_sent: 10,
                ..ProcessStats::default()
            }
        );
        assert_eq!(
            p(2),
            ProcessStats {
                pid: 2,
                name: Some("kid".into()),
                start_ns: 100,
                end_ns: Some(300),
                lifetime_ns: 200,
                exit_code: Some(7),
                bytes_received: 10,
                ..ProcessStats::default()
            }
        );
        assert_eq!((p(3).signal, p(3).lifetime_ns), (Some(15), 100));
    }

    #[test]
    fn human_durations() {
        assert_eq!(human_ns(999), "999 ns");
        assert_eq!(human_ns(1_234), "1.23 µs");
        assert_eq!(human_ns(12_345_678), "12.3 ms");
        assert_eq!(human_ns(2_000_000_000), "2.00 s");
        assert_eq!(human_ns(123_456_789_000), "123 s");
    }
}
