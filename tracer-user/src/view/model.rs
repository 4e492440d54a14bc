//! What the viewer shows, aggregated as the trace streams (never the events themselves): the
//! report's per-function and per-process statistics ([`ReportBuilder`]), the flame graph's stacks
//! ([`StackCollector`]), the spawn tree, the threads, and the first send → receive links. Memory
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
    pub flame: Vec<FlameNode>,
    pub functions: Vec<FunctionStats>,
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

/// The viewer's aggregates; a [`Sink`].
pub struct ViewModel {
    report: ReportBuilder,
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
    /// The report and flame graph, once the trace has ended.
    finished: Option<(Report, Vec<FlameNode>)>,
}

impl Default for ViewModel {
    fn default() -> Self {
        ViewModel {
            report: ReportBuilder::new(true),
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
    /// What the page shows now: the whole trace once it ended, else the calls that ended so far.
    pub fn state(&self) -> State {
        let (report, flame) = match &self.finished {
            Some((report, flame)) => (report.clone(), flame.clone()),
            None => (self.report.snapshot(self.last_ts), self.stacks.snapshot()),
        };
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
        self.stacks.begin(start);
        Ok(())
    }

    fn event(&mut self, e: &Event) -> io::Result<()> {
        self.events += 1;
        self.last_ts = self.last_ts.max(e.ts);
        self.report.event(e)?;
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
        let flame = self.stacks.finish(end);
        let report = std::mem::take(&mut self.report).into_report().unwrap_or_default();
        self.finished = Some((report, flame));
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
        assert_eq!(live.flame[0].children[0].name, "main");
        assert_eq!(live.threads.len(), 1);
        m.end(&end(1000)).unwrap();
        let done = m.state();
        assert!(!done.live);
        let mut calls: Vec<(&str, u64, u64)> =
            done.functions.iter().map(|f| (f.function.as_str(), f.calls, f.unfinished)).collect();
        calls.sort();
        assert_eq!(calls, [("main", 1, 1), ("work", 1, 0)]);
    }
}
