//! `tracer top`: live per-function statistics aggregated in the kernel (`tracer-ebpf/src/top.rs`):
//! no record per call crosses to user space, which reads the counters and histograms once an
//! interval.
//!
//! Targets and functions are resolved by [`plan::plan`](crate::plan::plan) exactly as for `record`; the probes are
//! the same points, running the `top_entry`/`top_return` programs. Latency percentiles come from
//! the kernel's log-linear histograms (16 buckets per power of two): each is the midpoint of the
//! bucket that holds that rank, within 3.2% of the true duration at that rank.

use std::{collections::BTreeMap, time::Duration};

use aya::maps::{Array, HashMap as BpfHashMap, MapData};
use serde::Serialize;
use tracer_common::{
    Config, LostSlot, names, programs,
    top::{BUCKETS, Key, Stats, bucket_range},
};

use crate::{
    analysis::{stats::human_ns, text_table},
    assemble::FunctionTable,
    event::EventKind,
    kernel::loader::{FilterCounters, Kernel, LostCounters, raise_fd_limit},
    kernel::{btf::KernelFacts, features::KernelFeatures, traced::any_target_alive},
    plan::{Plan, RecordError, RecordOptions, plan},
    targets::launch::{ChildExit, spawn_stopped, try_reap},
};

/// The smallest ring buffer the kernel allows: `top` writes no records, but the record programs
/// that follow forks share the object.
const RING_BYTES: u32 = 4096;

/// A `tracer top` session: probes attached, targets running.
pub struct Top {
    kernel: Kernel,
    lost: LostCounters,
    functions: FunctionTable,
    by_process: bool,
    child_pid: Option<u32>,
    ends_when_empty: bool,
    command_exit: Option<ChildExit>,
    /// Calls per row at the previous snapshot, for calls/s.
    previous: BTreeMap<(u32, u32), u64>,
    /// Functions with a predicate (`-f 'FUNC if EXPR'`): index and expression; and the kernel's
    /// counts of the calls each predicate saw and refused.
    predicates: Vec<(u32, String)>,
    filter_counters: Option<FilterCounters>,
    /// Things found while attaching that do not stop the session.
    pub warnings: Vec<String>,
    /// Functions probed.
    pub probes: usize,
}

/// Checks `options` as `record` does, for call and return probes. Go functions are refused
/// here: their calls move between threads with their goroutines, which per-thread
/// stacks in the kernel cannot follow.
pub fn plan_top(mut options: RecordOptions) -> Result<Plan, TopError> {
    options.events = [EventKind::Call, EventKind::Return].into_iter().collect();
    let mut plan = plan(options)?;
    // `top` does not follow execs: a pattern must match in what it starts with (refused before
    // the plan's warnings, which speak of following execs, are shown).
    if !plan.unmatched.is_empty() {
        let u = plan.unmatched.swap_remove(0);
        return Err(RecordError::NoMatch { pattern: u.pattern, modules: u.modules, suggestions: u.suggestions }.into());
    }
    // Entry predicates are evaluated by `top_entry` (a refused call is neither counted nor
    // timed); a `ret-if` would need the call's arguments kept until its return.
    if let Some(f) = plan.filters.iter().find(|f| f.ret.is_some()) {
        return Err(TopError::RetPredicate(plan.functions[f.function as usize].name.to_string()));
    }
    if let Some(go) = plan.probes.iter().find(|p| tracer_common::cookie::is_go(p.cookie)) {
        return Err(TopError::Go(plan.functions[tracer_common::cookie::function(go.cookie) as usize].name.to_string()));
    }
    Ok(plan)
}

#[derive(Debug, thiserror::Error)]
pub enum TopError {
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("tracer top cannot time Go functions yet ({0}); use tracer record")]
    Go(String),
    #[error(
        "tracer top decides calls at their entry only (-f '{0} ret-if ...' needs the return): use tracer record with the predicate, then tracer report"
    )]
    RetPredicate(String),
    #[error("reading the kernel's statistics failed: {0}")]
    Read(String),
}

impl Top {
    /// Launches the command (stopped), loads and attaches the `top` programs at the plan's probe
    /// points, starts tracing the targets and lets the command run.
    /// `min_duration_ns`: only calls that last at least this long are counted and timed (0: all).
    pub fn start(plan: Plan, by_process: bool, min_duration_ns: u64) -> Result<Top, TopError> {
        let Plan { options, processes, binaries, command, probes, functions, filters, .. } = plan;
        let child = match &command {
            Some(path) => Some(spawn_stopped(path, &options.command, &options.start).map_err(RecordError::from)?),
            None => None,
        };
        let btf = KernelFacts::running().map_err(RecordError::from)?;
        let config = Config {
            enabled_kinds: 0,
            follow_children: options.follow_children as u32,
            has_target_inodes: !binaries.is_empty() as u32,
            top_by_process: by_process as u32,
            wakeup_bytes: u64::MAX,
            capture_bytes: 0,
            debug: 0,
            min_duration_ns,
            max_depth: options.depth.unwrap_or(0),
            start_off: !options.start_at.is_empty() as u32,
            resolve_execs: 0,
            // `top`'s programs write no calls.
            call_rings: 0,
            watch_image: tracer_common::InodeKey::default(),
            offsets: btf.offsets().map_err(RecordError::from)?,
        };
        raise_fd_limit(1024 + probes.len() as u64);
        let features = KernelFeatures::probe(btf);
        features.check(true).map_err(RecordError::from)?;
        let predicates: Vec<(u32, String)> =
            filters.iter().filter_map(|f| f.entry.as_ref().map(|(_, text)| (f.function, text.clone()))).collect();
        let counted = if predicates.is_empty() { 1 } else { functions.len() as u32 };
        let mut kernel = Kernel::load_sized(&config, &features, RING_BYTES, 0, functions.len() as u32, counted, false)
            .map_err(RecordError::from)?;
        // `--start-at`, `--stop-at`: each thread's state is kept in its stack (`top::Stack::gate`).
        for spec in &filters {
            if let Some((program, _)) = &spec.entry {
                kernel.set_filter(spec.function, *program).map_err(RecordError::from)?;
            }
            if let Some(role) = spec.gate.filter(|&role| role != 0) {
                kernel.set_gate_role(spec.function, role).map_err(RecordError::from)?;
            }
        }
        kernel.attach_sched().map_err(RecordError::from)?;
        let failures = kernel
            .attach_function_programs(&probes, programs::TOP_ENTRY, programs::TOP_RETURN)
            .map_err(RecordError::from)?;
        let failed: std::collections::BTreeSet<u32> =
            failures.iter().map(|f| tracer_common::cookie::function(f.cookie)).collect();
        if !probes.is_empty() && failed.len() == functions.len() {
            return Err(RecordError::NoProbeAttached(failures[0].reason.clone()).into());
        }
        let mut warnings = Vec::new();
        if !failures.is_empty() {
            let listed: Vec<String> = failures
                .iter()
                .take(5)
                .map(|f| {
                    format!("{} ({})", functions[tracer_common::cookie::function(f.cookie) as usize].name, f.reason)
                })
                .collect();
            warnings.push(format!(
                "{} of {} functions could not be probed: {}",
                failed.len(),
                functions.len(),
                listed.join(", ")
            ));
        }
        let lost = kernel.take_lost_counters().map_err(RecordError::from)?;
        let filter_counters = match predicates.is_empty() {
            true => None,
            false => Some(kernel.take_filter_counters().map_err(RecordError::from)?),
        };
        for (_, id) in &binaries {
            kernel.trace_executable(id.kernel_key()).map_err(RecordError::from)?;
        }
        for p in &processes {
            kernel.trace_pid(p.pid).map_err(RecordError::from)?;
        }
        if let Some(child) = &child {
            kernel.trace_pid(child.pid()).map_err(RecordError::from)?;
        }
        let child_pid = match child {
            Some(child) => Some(child.release().map_err(RecordError::from)?),
            None => None,
        };
        Ok(Top {
            kernel,
            lost,
            probes: functions.len() - failed.len(),
            functions,
            by_process,
            child_pid,
            ends_when_empty: binaries.is_empty(),
            command_exit: None,
            previous: BTreeMap::new(),
            predicates,
            filter_counters,
            warnings,
        })
    }

    /// Whether the targets are all gone (never with `--binary`: a new instance may start).
    pub fn targets_gone(&mut self) -> bool {
        if let Some(pid) = self.child_pid
            && self.command_exit.is_none()
        {
            self.command_exit = try_reap(pid);
        }
        let command_done = self.child_pid.is_none() || self.command_exit.is_some();
        command_done && self.ends_when_empty && !any_target_alive(&mut self.kernel)
    }

    /// How the launched command ended, if it did.
    pub fn command_exit(&mut self) -> Option<ChildExit> {
        if let Some(pid) = self.child_pid
            && self.command_exit.is_none()
        {
            self.command_exit = try_reap(pid);
        }
        self.command_exit
    }

    /// The launched command's pid, while it runs.
    pub fn command_running(&self) -> Option<u32> {
        self.child_pid.filter(|_| self.command_exit.is_none())
    }

    /// Stops counting: no process is traced any more (the probes go with `self`).
    pub fn stop(&mut self) {
        self.kernel.stop_tracing();
    }

    /// Reads every counter now. `elapsed` is the time since the start, `interval` since the last
    /// snapshot (calls/s are over it).
    pub fn snapshot(&mut self, elapsed: Duration, interval: Duration, last: bool) -> Result<Snapshot, TopError> {
        let read = |e: &dyn std::fmt::Display| TopError::Read(e.to_string());
        let mut raw: Vec<(Option<u32>, u32, Stats)> = Vec::new();
        if self.by_process {
            let map = self.kernel.map(names::TOP_BY_PROCESS).map_err(|e| read(&e))?;
            let map: BpfHashMap<&MapData, Key, Stats> = BpfHashMap::try_from(map).map_err(|e| read(&e))?;
            for item in map.iter() {
                let (key, stats) = item.map_err(|e| read(&e))?;
                raw.push((Some(key.pid), key.function, stats));
            }
        } else {
            let map = self.kernel.map(names::TOP_FUNCTIONS).map_err(|e| read(&e))?;
            let map: Array<&MapData, Stats> = Array::try_from(map).map_err(|e| read(&e))?;
            for function in 0..self.functions.len() as u32 {
                let stats = map.get(&function, 0).map_err(|e| read(&e))?;
                raw.push((None, function, stats));
            }
        }
        let seconds = interval.as_secs_f64().max(1e-9);
        let mut rows = Vec::new();
        for (pid, function, stats) in raw {
            if stats.calls == 0 {
                continue;
            }
            let Some(f) = self.functions.get(function as usize) else { continue };
            let before = self.previous.insert((pid.unwrap_or(0), function), stats.calls).unwrap_or(0);
            rows.push(Row::new(
                &f.name,
                &f.module,
                pid,
                &stats,
                (stats.calls - before.min(stats.calls)) as f64 / seconds,
            ));
        }
        rows.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(b.calls.cmp(&a.calls)).then(a.function.cmp(&b.function)));
        let counts = self.lost.read();
        let lost = Lost {
            threads_full: counts[LostSlot::TopThreadsFull as usize],
            keys_full: counts[LostSlot::TopKeysFull as usize],
            too_deep: counts[LostSlot::TopTooDeep as usize],
            no_return: counts[LostSlot::TopNoReturn as usize],
            untraced_children: counts[LostSlot::UntrackedChild as usize],
        };
        let mut filters = BTreeMap::new();
        if let Some(counters) = &self.filter_counters {
            for (function, predicate) in &self.predicates {
                let Some(f) = self.functions.get(*function as usize) else { continue };
                let c = counters.read(*function);
                filters.insert(
                    f.name.to_string(),
                    Filtered { predicate: predicate.clone(), seen: c.seen, filtered_out: c.filtered },
                );
            }
        }
        Ok(Snapshot {
            kind: "top",
            elapsed_ns: elapsed.as_nanos() as u64,
            interval_ns: interval.as_nanos() as u64,
            last,
            functions: rows,
            lost,
            filters,
        })
    }
}

/// One interval's statistics: one JSON object per interval, and a last one at the end.
#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    /// Always `top`.
    pub kind: &'static str,
    /// Since tracing started.
    pub elapsed_ns: u64,
    /// Since the previous snapshot (what `calls_per_s` is over).
    pub interval_ns: u64,
    /// The final snapshot, when the targets exited, on Ctrl-C or at `--duration`.
    #[serde(rename = "final")]
    pub last: bool,
    /// Functions (or process and function with `--by-process`) that were called, most total time
    /// first.
    pub functions: Vec<Row>,
    /// What the kernel could not count.
    pub lost: Lost,
    /// Functions with a predicate (`-f 'FUNC if EXPR'`), by name: the calls it saw and refused
    /// (a refused call is in no row). Left out without predicates.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub filters: BTreeMap<String, Filtered>,
}

/// What one function's predicate decided, since the start.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Filtered {
    pub predicate: String,
    /// Calls the predicate was evaluated on.
    pub seen: u64,
    /// Of those, the calls it refused: neither counted nor timed.
    pub filtered_out: u64,
}

/// Counts of what could not be counted.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Lost {
    /// Calls of threads whose call stack found its map full.
    pub threads_full: u64,
    /// Calls of a (process, function) pair that found its map full (`--by-process`).
    pub keys_full: u64,
    /// Calls nested more than [`tracer_common::top::MAX_DEPTH`] deep: counted, not timed.
    pub too_deep: u64,
    /// Calls whose return never came (left by `longjmp` or an exception).
    pub no_return: u64,
    /// Children of traced processes that could not be traced (the pid map was full).
    pub untraced_children: u64,
}

impl Lost {
    pub fn total(&self) -> u64 {
        self.threads_full + self.keys_full + self.too_deep + self.no_return + self.untraced_children
    }
}

/// One function's (or one process's function's) statistics since the start.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub function: String,
    pub module: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    pub calls: u64,
    /// Calls per second over the last interval.
    pub calls_per_s: f64,
    /// Calls that returned (the others are still open, or returned unseen).
    pub returns: u64,
    pub total_ns: u64,
    pub mean_ns: Option<u64>,
    pub p50_ns: Option<u64>,
    pub p90_ns: Option<u64>,
    pub p99_ns: Option<u64>,
}

impl Row {
    fn new(function: &str, module: &str, pid: Option<u32>, stats: &Stats, calls_per_s: f64) -> Row {
        let p = |q| percentile(&stats.histogram, q);
        Row {
            function: function.to_string(),
            module: module.to_string(),
            pid,
            calls: stats.calls,
            calls_per_s,
            returns: stats.returns,
            total_ns: stats.total_ns,
            mean_ns: stats.total_ns.checked_div(stats.returns),
            p50_ns: p(0.50),
            p90_ns: p(0.90),
            p99_ns: p(0.99),
        }
    }
}

/// The duration at quantile `q` (nearest rank) of a histogram: the midpoint of the bucket holding
/// that rank (`None` for an empty histogram).
pub fn percentile(histogram: &[u64; BUCKETS], q: f64) -> Option<u64> {
    let n: u64 = histogram.iter().sum();
    if n == 0 {
        return None;
    }
    let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
    let mut seen = 0;
    for (i, &count) in histogram.iter().enumerate() {
        seen += count;
        if seen >= rank {
            let (low, high) = bucket_range(i);
            return Some(if high == u64::MAX || high - low == 1 { low } else { low + (high - low) / 2 });
        }
    }
    None
}

impl Snapshot {
    /// The table a terminal shows, like `top`'s.
    pub fn table(&self, max_rows: usize) -> String {
        let mut out = format!(
            "tracer top: {:.1} s, {} function(s) called{}\n",
            self.elapsed_ns as f64 / 1e9,
            self.functions.len(),
            if self.lost.total() > 0 {
                format!(", {} calls not counted or not timed", self.lost.total())
            } else {
                String::new()
            }
        );
        let by_process = self.functions.iter().any(|r| r.pid.is_some());
        let header: Vec<&str> = by_process
            .then_some("pid")
            .into_iter()
            .chain(["calls", "calls/s", "total", "mean", "p50", "p90", "p99", "function"])
            .collect();
        let opt = |v: Option<u64>| v.map_or_else(|| "-".to_string(), human_ns);
        let rows: Vec<Vec<String>> = self
            .functions
            .iter()
            .take(max_rows)
            .map(|r| {
                let mut row: Vec<String> = r.pid.map(|pid| pid.to_string()).into_iter().collect();
                row.extend([
                    r.calls.to_string(),
                    format!("{:.0}", r.calls_per_s),
                    human_ns(r.total_ns),
                    opt(r.mean_ns),
                    opt(r.p50_ns),
                    opt(r.p90_ns),
                    opt(r.p99_ns),
                    r.function.to_string(),
                ]);
                row
            })
            .collect();
        let function = header.len() - 1;
        out.push_str(&text_table::render(&header, &rows, |i| i == function));
        out
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::top::bucket;

    use super::*;

    #[test]
    fn percentiles_are_bucket_midpoints_within_a_few_percent() {
        let mut h = [0u64; BUCKETS];
        for ns in
            [500_000u64, 510_000, 520_000, 530_000, 2_000_000, 2_100_000, 2_200_000, 2_300_000, 2_400_000, 9_000_000]
        {
            h[bucket(ns)] += 1;
        }
        let p50 = percentile(&h, 0.5).unwrap();
        assert!((p50 as f64 - 2_000_000.0).abs() / 2_000_000.0 < 0.065, "{p50}");
        let p90 = percentile(&h, 0.9).unwrap();
        assert!((p90 as f64 - 2_400_000.0).abs() / 2_400_000.0 < 0.065, "{p90}");
        let p99 = percentile(&h, 0.99).unwrap();
        assert!((p99 as f64 - 9_000_000.0).abs() / 9_000_000.0 < 0.065, "{p99}");
        assert_eq!(percentile(&[0; BUCKETS], 0.5), None);
        let mut small = [0u64; BUCKETS];
        small[7] = 1;
        assert_eq!(percentile(&small, 0.99), Some(7));
    }
}
