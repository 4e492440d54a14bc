//! What the viewer shows, aggregated as the trace streams (never the events themselves), for each
//! host apart (a pid names a process on one host only; two hosts can have the same pid): the
//! report's per-function and per-process statistics ([`ReportBuilder`]), and for a trace of
//! several hosts the functions over all of a host's processes, the flame graph's stacks
//! ([`StackCollector`]), the spawn tree; and over all hosts the threads (by host and tid) and the
//! first send → receive links. Memory
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
    /// The process that forked it (on its host), when the trace saw the fork.
    pub parent: Option<u32>,
    pub host: String,
}

/// A process's flame graph: the root, named `comm (pid)`, and the stacks under it.
#[derive(Clone, Debug, Serialize)]
pub struct FlameRoot {
    pub pid: u32,
    pub host: String,
    #[serde(flatten)]
    pub node: FlameNode,
}

/// A function's statistics on one host: in one of its processes (`pid` set), or over all of them.
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
    /// As people read it ([`data::Channel::text`]), as `tracer calls` writes it.
    pub channel: String,
    pub latency_ns: u64,
}

/// Everything the page shows, as one JSON document. Processes and threads are named by host and
/// pid (or tid): two hosts can have the same pid.
#[derive(Clone, Debug, Serialize)]
pub struct State {
    /// Still recording.
    pub live: bool,
    pub events: u64,
    /// Last event's time (Unix ns).
    pub last_ts: u64,
    pub start: Option<TraceStart>,
    pub end: Option<TraceEnd>,
    /// Every host's processes' flame graphs, by time.
    pub flame: Vec<FlameRoot>,
    /// Per host and process.
    pub functions: Vec<HostFunction>,
    /// Per host, every process together, for a trace of several hosts (else empty).
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

/// One host's aggregates: its processes are keyed by pid, which is unique on one host only.
struct HostPart {
    /// Per process.
    report: ReportBuilder,
    /// Every process together, for a trace of several hosts.
    functions: Option<ReportBuilder>,
    stacks: StackCollector,
    parents: HashMap<u32, u32>,
    finished: Option<Finished>,
}

/// A host's aggregates, once the trace has ended.
struct Finished {
    report: Report,
    flame: Vec<(u32, FlameNode)>,
    functions: Vec<FunctionStats>,
}

/// What [`HostPart`] shows now.
struct HostState {
    report: Report,
    flame: Vec<(u32, FlameNode)>,
    functions: Vec<FunctionStats>,
}

impl HostPart {
    /// A host's part of a trace that began with `start`: the start's targets are its host's.
    fn new(host: &str, start: Option<&TraceStart>, per_host: bool) -> io::Result<Self> {
        let mut part = HostPart {
            report: ReportBuilder::new(true),
            functions: per_host.then(|| ReportBuilder::new(false)),
            stacks: StackCollector::default(),
            parents: HashMap::new(),
            finished: None,
        };
        if let Some(start) = start {
            let mut own = start.clone();
            if start.host != host || start.hosts.len() > 1 {
                own.targets.clear();
            }
            part.report.begin(&own)?;
            if let Some(functions) = &mut part.functions {
                functions.begin(&own)?;
            }
            part.stacks.begin(&own);
        }
        Ok(part)
    }

    fn event(&mut self, e: &Event) -> io::Result<()> {
        self.report.event(e)?;
        if let Some(functions) = &mut self.functions {
            functions.event(e)?;
        }
        self.stacks.event(e);
        if let EventData::Spawn(data::Spawn { child_pid, how: SpawnHow::Fork, .. }) = &e.data {
            self.parents.insert(*child_pid, e.pid);
        }
        Ok(())
    }

    fn state(&self, now_ns: u64) -> HostState {
        match &self.finished {
            Some(f) => HostState { report: f.report.clone(), flame: f.flame.clone(), functions: f.functions.clone() },
            None => HostState {
                report: self.report.snapshot(now_ns),
                flame: self.stacks.roots(),
                functions: self.functions.as_ref().map_or_else(Vec::new, |b| b.snapshot(now_ns).functions),
            },
        }
    }

    fn end(&mut self, end: &TraceEnd) -> io::Result<()> {
        self.report.end(end)?;
        self.stacks.end_calls(end);
        let functions = match self.functions.take() {
            Some(mut builder) => {
                builder.end(end)?;
                builder.into_report().unwrap_or_default().functions
            }
            None => Vec::new(),
        };
        let report = std::mem::take(&mut self.report).into_report().unwrap_or_default();
        self.finished = Some(Finished { report, flame: self.stacks.roots(), functions });
        Ok(())
    }
}

/// The viewer's aggregates, one part per host; a [`Sink`].
#[derive(Default)]
pub struct ViewModel {
    /// Keep every host's function table over all its processes too: [`ViewModel::per_host`], or
    /// a trace whose start lists several hosts.
    per_host: bool,
    hosts: BTreeMap<Arc<str>, HostPart>,
    /// By host and tid.
    threads: BTreeMap<(Arc<str>, u32), ThreadView>,
    threads_not_listed: u64,
    sends: HashMap<u64, PendingSend>,
    messages: Vec<Message>,
    messages_total: u64,
    events: u64,
    last_ts: u64,
    start: Option<TraceStart>,
    end: Option<TraceEnd>,
}

impl ViewModel {
    /// A model that keeps the function table per host as well, whatever the trace's start says
    /// (a collector's live trace: its start lists no hosts until the merge).
    pub fn per_host() -> Self {
        ViewModel { per_host: true, ..ViewModel::default() }
    }

    /// What the page shows now: the whole trace once it ended, else the calls that ended so far.
    pub fn state(&self) -> State {
        let (mut flame, mut functions, mut host_functions, mut processes) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (host, part) in &self.hosts {
            let now = part.state(self.last_ts);
            let named = |stats| HostFunction { host: host.to_string(), stats };
            flame.extend(now.flame.into_iter().map(|(pid, node)| FlameRoot { pid, host: host.to_string(), node }));
            functions.extend(now.report.functions.into_iter().map(named));
            host_functions.extend(now.functions.into_iter().map(named));
            processes.extend(now.report.processes.into_iter().map(|stats| ProcessView {
                parent: part.parents.get(&stats.pid).copied(),
                host: host.to_string(),
                stats,
            }));
        }
        // Processes by time, whatever their host.
        flame.sort_by_key(|r| std::cmp::Reverse(r.node.value));
        State {
            live: self.end.is_none(),
            events: self.events,
            last_ts: self.last_ts,
            start: self.start.clone(),
            end: self.end.clone(),
            flame,
            functions,
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

    /// One row per send this receive read from (`flow_ids`). A send stays known after a first
    /// receive: a reader that takes a message in two reads (a header, then the rest) links both
    /// to it. Every link is counted; the rows stop at [`MAX_MESSAGES`].
    fn link(&mut self, e: &Event, recv: &data::Recv) {
        for flow in &recv.flow_ids {
            self.messages_total += 1;
            if self.messages.len() >= MAX_MESSAGES {
                continue;
            }
            if let Some(send) = self.sends.get(flow) {
                self.messages.push(Message {
                    latency_ns: e.ts.saturating_sub(send.end.ts),
                    send: send.end.clone(),
                    recv: Self::end_of(e),
                    bytes: recv.bytes,
                    channel: send.channel.text(),
                });
            }
        }
    }
}

impl Sink for ViewModel {
    fn begin(&mut self, start: &TraceStart) -> io::Result<()> {
        self.start = Some(start.clone());
        self.per_host |= start.hosts.len() > 1;
        Ok(())
    }

    fn event(&mut self, e: &Event) -> io::Result<()> {
        self.events += 1;
        self.last_ts = self.last_ts.max(e.ts);
        let part = match self.hosts.get_mut(&*e.host) {
            Some(part) => part,
            None => {
                let part = HostPart::new(&e.host, self.start.as_ref(), self.per_host)?;
                self.hosts.entry(e.host.clone()).or_insert(part)
            }
        };
        part.event(e)?;
        let thread = (e.host.clone(), e.tid);
        if !self.threads.contains_key(&thread) {
            if self.threads.len() < MAX_THREADS {
                self.threads.insert(thread, ThreadView { tid: e.tid, pid: e.pid, host: e.host.to_string() });
            } else {
                self.threads_not_listed += 1;
            }
        }
        match &e.data {
            EventData::Send(send) if self.messages.len() < MAX_MESSAGES && self.sends.len() < MAX_PENDING_SENDS => {
                self.sends.insert(send.flow_id, PendingSend { end: Self::end_of(e), channel: send.channel.clone() });
            }
            EventData::Recv(recv) => self.link(e, recv),
            _ => {}
        }
        Ok(())
    }

    fn end(&mut self, end: &TraceEnd) -> io::Result<()> {
        for part in self.hosts.values_mut() {
            part.end(end)?;
        }
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
        let calls: Vec<(&str, u64)> =
            live.functions.iter().map(|f| (f.stats.function.as_str(), f.stats.calls)).collect();
        assert_eq!(calls, [("work", 1)]);
        assert_eq!(live.flame[0].node.children[0].name, "main");
        assert_eq!(live.threads.len(), 1);
        m.end(&end(1000)).unwrap();
        let done = m.state();
        assert!(!done.live);
        let mut calls: Vec<(&str, u64, u64)> =
            done.functions.iter().map(|f| (f.stats.function.as_str(), f.stats.calls, f.stats.unfinished)).collect();
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
            let mut roots: Vec<(u32, &str)> = state.flame.iter().map(|r| (r.pid, r.host.as_str())).collect();
            roots.sort();
            assert_eq!(roots, [(10, "a"), (20, "b")]);
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

    /// Two hosts with the same pid: two processes, two flame graphs, two rows, two threads.
    #[test]
    fn the_same_pid_on_two_hosts_is_two_processes() {
        let on = |host: &str, mut e: Event| {
            e.host = host.into();
            e
        };
        let mut m = ViewModel::default();
        m.begin(&start(0)).unwrap();
        for (host, n) in [("a", 2), ("b", 3)] {
            for i in 0..n {
                m.event(&on(host, call(100 + i * 10, 1, "work"))).unwrap();
                m.event(&on(host, ret(105 + i * 10, 1, "work", Some(5)))).unwrap();
            }
        }
        for state in [m.state(), {
            m.end(&end(1000)).unwrap();
            m.state()
        }] {
            let mut rows: Vec<(&str, Option<u32>, u64)> =
                state.functions.iter().map(|f| (f.host.as_str(), f.stats.pid, f.stats.calls)).collect();
            rows.sort();
            assert_eq!(rows, [("a", Some(1), 2), ("b", Some(1), 3)]);
            let mut roots: Vec<(&str, u32, u64)> =
                state.flame.iter().map(|r| (r.host.as_str(), r.pid, r.node.value)).collect();
            roots.sort();
            assert_eq!(roots, [("a", 1, 10), ("b", 1, 15)]);
            let processes: Vec<(&str, u32)> = state.processes.iter().map(|p| (p.host.as_str(), p.stats.pid)).collect();
            assert_eq!(processes, [("a", 1), ("b", 1)]);
            let threads: Vec<(&str, u32)> = state.threads.iter().map(|t| (t.host.as_str(), t.tid)).collect();
            assert_eq!(threads, [("a", 1), ("b", 1)]);
        }
    }
}
