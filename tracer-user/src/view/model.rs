//! What the viewer shows, aggregated as the trace streams (never the events themselves): the
//! report's per-function and per-process statistics ([`ReportBuilder`]), and for a trace of
//! several hosts the same per host (one builder per host, fed that host's events only), the
//! flame graph's stacks ([`StackCollector`]), the spawn tree, the threads, and the first
//! send → receive links. Memory
//! grows with functions, stacks, processes and threads, not with events; the lists that could grow
//! with events (threads, messages) are capped, and what a cap leaves out is counted and shown.

use std::{
    collections::{BTreeMap, HashMap},
    io,
    sync::Arc,
};

use serde::Serialize;

use crate::{
    analysis::{
        flame_stacks::{FlameNode, StackCollector},
        stats::{FunctionStats, ProcessStats, Report, ReportBuilder},
    },
    event::{Event, EventData, SpawnHow, TraceEnd, TraceStart, data},
    sink::Sink,
};

/// Threads listed for the call tree; the others are counted.
pub const MAX_THREADS: usize = 10_000;
/// Send → receive links listed; the others are counted.
pub const MAX_MESSAGES: usize = 1_000;
/// Sends remembered while waiting for their receive (only while links are still being listed).
const MAX_PENDING_SENDS: usize = 100_000;

/// A process in the spawn tree.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessView {
    #[serde(flatten)]
    pub stats: ProcessStats,
    /// The process that forked it, when the trace saw the fork.
    pub parent: Option<u32>,
    pub host: Option<String>,
}

/// A process's flame graph: the root, named `comm (pid)`, and the stacks under it.
#[derive(Clone, Debug, Serialize)]
pub struct FlameRoot {
    pub pid: u32,
    pub host: Option<String>,
    #[serde(flatten)]
    pub node: FlameNode,
}

/// A function's statistics over every process of one host (`report` of that host's events).
#[derive(Clone, Debug, Serialize)]
pub struct HostFunction {
    pub host: String,
    #[serde(flatten)]
    pub stats: FunctionStats,
}

/// A thread whose calls can be listed.
#[derive(Clone, Debug, Serialize)]
pub struct ThreadView {
    pub tid: u32,
    pub pid: u32,
    pub host: String,
}

/// One end of a message.
#[derive(Clone, Debug, Serialize)]
pub struct End {
    pub host: String,
    pub pid: u32,
    pub tid: u32,
    pub ts: u64,
}

/// A receive linked to the send whose bytes it read.
#[derive(Clone, Debug, Serialize)]
pub struct Message {
    pub send: End,
    pub recv: End,
    /// What the receive read.
    pub bytes: u64,
    pub channel: data::Channel,
    pub latency_ns: u64,
}

/// Everything the page shows, as one JSON document.
#[derive(Clone, Debug, Serialize)]
pub struct State {
    /// Still recording.
    pub live: bool,
    pub events: u64,
    /// Last event's time (Unix ns).
    pub last_ts: u64,
    pub start: Option<TraceStart>,
    pub end: Option<TraceEnd>,
    pub flame: Vec<FlameRoot>,
    pub functions: Vec<FunctionStats>,
    /// Per host, for a trace of several hosts (else empty).
    pub host_functions: Vec<HostFunction>,
    pub processes: Vec<ProcessView>,
    pub threads: Vec<ThreadView>,
    pub threads_not_listed: u64,
    pub messages: Vec<Message>,
    /// Linked receives, listed or not.
    pub messages_total: u64,
    /// Events written and lost so far by a live recording (its status line's figures).
    pub written: Option<u64>,
    pub lost: Option<u64>,
}

struct PendingSend {
    end: End,
    channel: data::Channel,
}

/// The function table per host: one [`ReportBuilder`] per host, each fed its host's events.
#[derive(Default)]
struct PerHost {
    start: Option<TraceStart>,
    builders: BTreeMap<Arc<str>, ReportBuilder>,
}

impl PerHost {
    fn event(&mut self, e: &Event) -> io::Result<()> {
        if let Some(builder) = self.builders.get_mut(&*e.host) {
            return builder.event(e);
        }
        let mut builder = ReportBuilder::new(false);
        if let Some(start) = &self.start {
            builder.begin(start)?;
        }
        builder.event(e)?;
        self.builders.insert(e.host.clone(), builder);
        Ok(())
    }

    fn functions(reports: impl Iterator<Item = (Arc<str>, Report)>) -> Vec<HostFunction> {
        reports
            .flat_map(|(host, report)| {
                report.functions.into_iter().map(move |stats| HostFunction { host: host.to_string(), stats })
            })
            .collect()
    }

    fn snapshot(&self, now_ns: u64) -> Vec<HostFunction> {
        Self::functions(self.builders.iter().map(|(host, b)| (host.clone(), b.snapshot(now_ns))))
    }

    fn finish(&mut self, end: &TraceEnd) -> io::Result<Vec<HostFunction>> {
        let mut reports = Vec::new();
        for (host, mut builder) in std::mem::take(&mut self.builders) {
            builder.end(end)?;
            reports.push((host, builder.into_report().unwrap_or_default()));
        }
        Ok(Self::functions(reports.into_iter()))
    }
}

/// The whole trace's aggregates, once it has ended.
struct Finished {
    report: Report,
    flame: Vec<(u32, FlameNode)>,
    host_functions: Vec<HostFunction>,
}

/// The viewer's aggregates; a [`Sink`].
pub struct ViewModel {
    report: ReportBuilder,
    /// Kept for a trace of several hosts: [`ViewModel::per_host`], or a trace whose start lists
    /// several.
    per_host: Option<PerHost>,
    stacks: StackCollector,
    parents: HashMap<u32, u32>,
    hosts: HashMap<u32, Arc<str>>,
    threads: BTreeMap<u32, ThreadView>,
    threads_not_listed: u64,
    sends: HashMap<u64, PendingSend>,
    messages: Vec<Message>,
    messages_total: u64,
    events: u64,
    last_ts: u64,
    start: Option<TraceStart>,
    end: Option<TraceEnd>,
    finished: Option<Finished>,
}

impl Default for ViewModel {
    fn default() -> Self {
        ViewModel {
            report: ReportBuilder::new(true),
            per_host: None,
            stacks: StackCollector::default(),
            parents: HashMap::new(),
            hosts: HashMap::new(),
            threads: BTreeMap::new(),
            threads_not_listed: 0,
            sends: HashMap::new(),
            messages: Vec::new(),
            messages_total: 0,
            events: 0,
            last_ts: 0,
            start: None,
            end: None,
            finished: None,
        }
    }
}

impl ViewModel {
    /// A model that keeps the function table per host as well, whatever the trace's start says
    /// (a collector's live trace: its start lists no hosts until the merge).
    pub fn per_host() -> Self {
        ViewModel { per_host: Some(PerHost::default()), ..ViewModel::default() }
    }

    /// What the page shows now: the whole trace once it ended, else the calls that ended so far.
    pub fn state(&self) -> State {
        let (report, flame, host_functions) = match &self.finished {
            Some(f) => (f.report.clone(), f.flame.clone(), f.host_functions.clone()),
            None => (
                self.report.snapshot(self.last_ts),
                self.stacks.roots(),
                self.per_host.as_ref().map_or_else(Vec::new, |p| p.snapshot(self.last_ts)),
            ),
        };
        let flame = flame
            .into_iter()
            .map(|(pid, node)| FlameRoot { pid, host: self.hosts.get(&pid).map(|h| h.to_string()), node })
            .collect();
        let processes = report
            .processes
            .into_iter()
            .map(|stats| ProcessView {
                parent: self.parents.get(&stats.pid).copied(),
                host: self.hosts.get(&stats.pid).map(|h| h.to_string()),
                stats,
            })
            .collect();
        State {
            live: self.end.is_none(),
            events: self.events,
            last_ts: self.last_ts,
            start: self.start.clone(),
            end: self.end.clone(),
            flame,
            functions: report.functions,
            host_functions,
            processes,
            threads: self.threads.values().cloned().collect(),
            threads_not_listed: self.threads_not_listed,
            messages: self.messages.clone(),
            messages_total: self.messages_total,
            written: None,
            lost: None,
        }
    }

    fn end_of(e: &Event) -> End {
        End { host: e.host.to_string(), pid: e.pid, tid: e.tid, ts: e.ts }
    }

    fn link(&mut self, e: &Event, recv: &data::Recv) {
        for flow in &recv.flow_ids {
            self.messages_total += 1;
            if self.messages.len() >= MAX_MESSAGES {
                continue;
            }
            if let Some(send) = self.sends.remove(flow) {
                self.messages.push(Message {
                    latency_ns: e.ts.saturating_sub(send.end.ts),
                    send: send.end,
                    recv: Self::end_of(e),
                    bytes: recv.bytes,
                    channel: send.channel,
                });
            }
        }
    }
}

impl Sink for ViewModel {
    fn begin(&mut self, start: &TraceStart) -> io::Result<()> {
        self.start = Some(start.clone());
        self.report.begin(start)?;
        if start.hosts.len() > 1 && self.per_host.is_none() {
            self.per_host = Some(PerHost::default());
        }
        if let Some(per_host) = &mut self.per_host {
            per_host.start = Some(start.clone());
        }
        self.stacks.begin(start);
        Ok(())
    }

    fn event(&mut self, e: &Event) -> io::Result<()> {
        self.events += 1;
        self.last_ts = self.last_ts.max(e.ts);
        self.report.event(e)?;
        if let Some(per_host) = &mut self.per_host {
            per_host.event(e)?;
        }
        self.stacks.event(e);
        if !self.hosts.get(&e.pid).is_some_and(|h| Arc::ptr_eq(h, &e.host)) {
            self.hosts.insert(e.pid, e.host.clone());
        }
        if !self.threads.contains_key(&e.tid) {
            if self.threads.len() < MAX_THREADS {
                self.threads.insert(e.tid, ThreadView { tid: e.tid, pid: e.pid, host: e.host.to_string() });
            } else {
                self.threads_not_listed += 1;
            }
        }
        match &e.data {
            EventData::Spawn(data::Spawn { child_pid, how: SpawnHow::Fork, .. }) => {
                self.parents.insert(*child_pid, e.pid);
            }
            EventData::Send(send) if self.messages.len() < MAX_MESSAGES && self.sends.len() < MAX_PENDING_SENDS => {
                self.sends.insert(send.flow_id, PendingSend { end: Self::end_of(e), channel: send.channel.clone() });
            }
            EventData::Recv(recv) => self.link(e, recv),
            _ => {}
        }
        Ok(())
    }

    fn end(&mut self, end: &TraceEnd) -> io::Result<()> {
        self.report.end(end)?;
        self.stacks.end_calls(end);
        let flame = self.stacks.roots();
        let report = std::mem::take(&mut self.report).into_report().unwrap_or_default();
        let host_functions = match &mut self.per_host {
            Some(per_host) => per_host.finish(end)?,
            None => Vec::new(),
        };
        self.finished = Some(Finished { report, flame, host_functions });
        self.end = Some(end.clone());
        self.sends.clear();
        Ok(())
    }
}

/// Feeds a shared [`ViewModel`] (the server reads it) from a recording's sink chain.
pub struct SharedSink(pub Arc<std::sync::Mutex<ViewModel>>);

impl SharedSink {
    fn with<T>(&self, f: impl FnOnce(&mut ViewModel) -> T) -> T {
        // A panic while holding the lock leaves aggregates that are still consistent enough to show.
        let mut model = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut model)
    }
}

impl Sink for SharedSink {
    fn begin(&mut self, start: &TraceStart) -> io::Result<()> {
        self.with(|m| m.begin(start))
    }
    fn event(&mut self, event: &Event) -> io::Result<()> {
        self.with(|m| m.event(event))
    }
    fn end(&mut self, end: &TraceEnd) -> io::Result<()> {
        self.with(|m| m.end(end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::test_events::{call, end, ret, start};

    #[test]
    fn a_live_state_counts_the_calls_that_ended_and_the_final_one_all() {
        let mut m = ViewModel::default();
        m.begin(&start(0)).unwrap();
        for e in [call(100, 1, "main"), call(200, 1, "work"), ret(300, 1, "work", Some(100))] {
            m.event(&e).unwrap();
        }
        let live = m.state();
        assert!(live.live);
        assert_eq!(live.events, 3);
        let calls: Vec<(&str, u64)> = live.functions.iter().map(|f| (f.function.as_str(), f.calls)).collect();
        assert_eq!(calls, [("work", 1)]);
        assert_eq!(live.flame[0].node.children[0].name, "main");
        assert_eq!(live.threads.len(), 1);
        m.end(&end(1000)).unwrap();
        let done = m.state();
        assert!(!done.live);
        let mut calls: Vec<(&str, u64, u64)> =
            done.functions.iter().map(|f| (f.function.as_str(), f.calls, f.unfinished)).collect();
        calls.sort();
        assert_eq!(calls, [("main", 1, 1), ("work", 1, 0)]);
    }

    #[test]
    fn a_per_host_model_counts_each_host_s_calls_apart_and_names_the_host_of_each_root() {
        let on = |host: &str, mut e: Event, pid: u32| {
            e.host = host.into();
            e.pid = pid;
            e.tid = pid;
            e
        };
        let mut m = ViewModel::per_host();
        m.begin(&start(0)).unwrap();
        for (host, pid, n) in [("a", 10, 2), ("b", 20, 3)] {
            for i in 0..n {
                m.event(&on(host, call(100 + i * 10, 1, "work"), pid)).unwrap();
                m.event(&on(host, ret(105 + i * 10, 1, "work", Some(5)), pid)).unwrap();
            }
        }
        let check = |state: &State| {
            let per_host: Vec<(&str, &str, u64)> = state
                .host_functions
                .iter()
                .map(|f| (f.host.as_str(), f.stats.function.as_str(), f.stats.calls))
                .collect();
            assert_eq!(per_host, [("a", "work", 2), ("b", "work", 3)]);
            let mut roots: Vec<(u32, Option<&str>)> = state.flame.iter().map(|r| (r.pid, r.host.as_deref())).collect();
            roots.sort();
            assert_eq!(roots, [(10, Some("a")), (20, Some("b"))]);
        };
        check(&m.state());
        m.end(&end(1000)).unwrap();
        check(&m.state());
        // One host: no table per host.
        let mut one = ViewModel::default();
        one.begin(&start(0)).unwrap();
        one.event(&call(1, 1, "work")).unwrap();
        assert!(one.state().host_functions.is_empty());
    }
}
