//! One timeline from several hosts: clocks corrected, messages linked across hosts, events in one
//! time order.
//!
//! The merge streams: it reads each host's events three times (from the collector's spill files,
//! [`super::spill`], or from memory) and holds only what links need. First every host's sends
//! are registered with the flow matcher, then every receive and signal looks for its sends (so
//! positions and digests, not timestamps, decide the links, and clock errors cannot hide one);
//! the cross-host links refine the clock offsets; then a k-way merge of the hosts' streams, each
//! corrected on read and already in its own time order, writes one time order into the sink.
//! What stays in memory: the send times (for the links) and the linked receives and signals, in
//! number the trace's IPC events, not its calls and returns.

use crate::event::data;
use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap, VecDeque},
    io,
    path::Path,
};

use super::{
    clock_sync::{ClockModel, ClockSample, Link, Refined, estimate, refine},
    collector::ClusterError,
    spill::SpilledEvents,
};
use crate::{
    event::{EndReason, Event, EventData, HostEnd, HostInfo, HostLoss, IpcStats, TraceEnd, TraceStart},
    export::Format,
    output_file::OutputFile,
    pipeline::flows::FlowMatcher,
    sink::Sink,
};

/// A host's events, in the host's own time order, readable as often as the merge needs.
#[derive(Clone, Debug)]
pub enum HostEvents {
    Memory(Vec<Event>),
    Spilled(SpilledEvents),
}

impl Default for HostEvents {
    fn default() -> Self {
        HostEvents::Memory(Vec::new())
    }
}

impl From<Vec<Event>> for HostEvents {
    fn from(events: Vec<Event>) -> Self {
        HostEvents::Memory(events)
    }
}

impl HostEvents {
    pub fn len(&self) -> u64 {
        match self {
            HostEvents::Memory(v) => v.len() as u64,
            HostEvents::Spilled(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn read(&self) -> io::Result<Box<dyn Iterator<Item = io::Result<Event>> + '_>> {
        Ok(match self {
            HostEvents::Memory(v) => Box::new(v.iter().cloned().map(Ok)),
            HostEvents::Spilled(s) => Box::new(s.read()?),
        })
    }
}

/// What one host sent for a trace.
#[derive(Clone, Debug, Default)]
pub struct HostTrace {
    /// The name the user gave the host (events carry it; unique in a merge).
    pub host: String,
    pub samples: Vec<ClockSample>,
    pub start: Option<TraceStart>,
    pub end: Option<TraceEnd>,
    /// In the host's own time order.
    pub events: HostEvents,
    /// Events the agent had to drop before the collector received them.
    pub lost_in_transit: u64,
    /// What the collector could not get from this host, and why (empty: complete).
    pub losses: Vec<HostLoss>,
}

/// A whole multi-host trace, ready for any sink.
#[derive(Clone, Debug)]
pub struct MergedTrace {
    pub start: TraceStart,
    pub events: Vec<Event>,
    pub end: TraceEnd,
}

impl MergedTrace {
    pub fn write(&self, sink: &mut dyn Sink) -> std::io::Result<()> {
        sink.begin(&self.start)?;
        for e in &self.events {
            sink.event(e)?;
        }
        sink.end(&self.end)
    }
}

/// Keeps a merge's items in memory, for [`merge`].
#[derive(Default)]
struct Collect {
    start: Option<TraceStart>,
    events: Vec<Event>,
}

impl Sink for Collect {
    fn begin(&mut self, start: &TraceStart) -> io::Result<()> {
        self.start = Some(start.clone());
        Ok(())
    }
    fn event(&mut self, event: &Event) -> io::Result<()> {
        self.events.push(event.clone());
        Ok(())
    }
    fn end(&mut self, _: &TraceEnd) -> io::Result<()> {
        Ok(())
    }
}

/// Removes the drift part of a clock model, leaving the constant offset for [`refine`].
fn without_drift(model: &ClockModel, ts: u64) -> i64 {
    ts as i64 - (model.offset_at(ts) - model.offset_ns)
}

fn is_send(e: &Event) -> bool {
    matches!(e.data, EventData::Send(data::Send { .. }))
}

/// Merges hosts' traces in memory. `collector` describes the merged trace (its host name, clock,
/// version).
pub fn merge(hosts: Vec<HostTrace>, collector: &TraceStart, reason: EndReason) -> io::Result<MergedTrace> {
    let mut collect = Collect::default();
    let (start, end) = merge_into(hosts, collector, reason, &mut collect)?;
    debug_assert_eq!(collect.start.as_ref(), Some(&start));
    Ok(MergedTrace { start, events: collect.events, end })
}

/// Merges hosts' traces into `sink` (begin, every event in one time order, end), and returns the
/// start and end it wrote.
pub fn merge_into(
    hosts: Vec<HostTrace>,
    collector: &TraceStart,
    reason: EndReason,
    sink: &mut dyn Sink,
) -> io::Result<(TraceStart, TraceEnd)> {
    let models: Vec<ClockModel> = hosts.iter().map(|h| estimate(&h.samples).unwrap_or(ClockModel::ZERO)).collect();
    let counts: Vec<u64> = hosts.iter().map(|h| h.events.len()).collect();
    let flows = Flows::link(&hosts, &models)?;
    let clocks = Clocks::new(models, &flows.across);
    let start = merged_start(&hosts, collector, &clocks, &counts);
    sink.begin(&start)?;
    let (written, last_ts) = write_in_time_order(&hosts, &clocks, &flows.first_flow, flows.linked, sink)?;
    let end = merged_end(&hosts, reason, &clocks, &counts, written, last_ts.unwrap_or(start.ts), flows.stats);
    sink.end(&end)?;
    Ok((start, end))
}

/// The flow links of a merged trace, made before anything is written: every send registered
/// before any receive looks for it, so positions and digests, not timestamps, decide the links.
struct Flows {
    /// Per host: the flow id of its first send. Sends are numbered host by host, so the merge
    /// gives each its flow id again by counting.
    first_flow: Vec<u64>,
    /// Per host: its receives and signals, linked, by their position in its stream.
    linked: Vec<VecDeque<(u64, Event)>>,
    /// The links between hosts, for the clocks.
    across: Vec<Link>,
    stats: IpcStats,
}

impl Flows {
    fn link(hosts: &[HostTrace], models: &[ClockModel]) -> io::Result<Flows> {
        let mut matcher = FlowMatcher::default();
        let mut sends: HashMap<u64, (usize, i64)> = HashMap::new();
        let mut first_flow = Vec::with_capacity(hosts.len());
        let mut next_flow = 1;
        for (h, t) in hosts.iter().enumerate() {
            first_flow.push(next_flow);
            for e in t.events.read()? {
                let mut e = e?;
                if is_send(&e) {
                    matcher.process(&mut e);
                    if let EventData::Send(data::Send { flow_id, .. }) = e.data {
                        debug_assert_eq!(flow_id, next_flow);
                        next_flow = flow_id + 1;
                        sends.insert(flow_id, (h, without_drift(&models[h], e.ts)));
                    }
                }
            }
        }
        let mut linked = Vec::with_capacity(hosts.len());
        let mut across = Vec::new();
        for (h, t) in hosts.iter().enumerate() {
            let mut mine = VecDeque::new();
            for (i, e) in t.events.read()?.enumerate() {
                let mut e = e?;
                if !matches!(e.data, EventData::Recv(_) | EventData::Signal(_)) {
                    continue;
                }
                matcher.process(&mut e);
                if let EventData::Recv(data::Recv { flow_ids, .. }) = &e.data {
                    for id in flow_ids {
                        if let Some(&(from, sent)) = sends.get(id)
                            && from != h
                        {
                            across.push(Link { from, to: h, sent, received: without_drift(&models[h], e.ts) });
                        }
                    }
                }
                mine.push_back((i as u64, e));
            }
            linked.push(mine);
        }
        Ok(Flows { first_flow, linked, across, stats: matcher.stats })
    }
}

/// Each host's clock model, refined by the links between hosts.
struct Clocks {
    models: Vec<ClockModel>,
    refined: Refined,
}

impl Clocks {
    fn new(models: Vec<ClockModel>, links: &[Link]) -> Clocks {
        let estimates: Vec<(i64, u64)> = models.iter().map(|m| (m.offset_ns, m.uncertainty_ns)).collect();
        let refined = refine(&estimates, links);
        Clocks { models, refined }
    }

    /// A time of host `h`'s clock on the collector's.
    fn correct(&self, h: usize, ts: u64) -> u64 {
        (without_drift(&self.models[h], ts) - self.refined.offsets[h]).max(0) as u64
    }
}

/// The merged trace's start: the collector's, from the earliest host start, with every host's
/// clock and counts.
fn merged_start(hosts: &[HostTrace], collector: &TraceStart, clocks: &Clocks, counts: &[u64]) -> TraceStart {
    let infos: Vec<HostInfo> = hosts
        .iter()
        .enumerate()
        .map(|(h, t)| HostInfo {
            name: t.host.clone(),
            machine: t.start.as_ref().and_then(|s| s.machine.clone()),
            offset_ns: clocks.refined.offsets[h],
            uncertainty_ns: clocks.refined.uncertainties[h],
            round_trip_uncertainty_ns: clocks.models[h].uncertainty_ns,
            drift_ppm: clocks.models[h].drift * 1e6,
            events: counts[h],
            lost_in_transit: t.lost_in_transit,
            targets: t.start.as_ref().map(|s| s.targets.clone()).unwrap_or_default(),
        })
        .collect();
    let mut start = collector.clone();
    start.ts = hosts
        .iter()
        .enumerate()
        .filter_map(|(h, t)| t.start.as_ref().map(|s| clocks.correct(h, s.ts)))
        .min()
        .unwrap_or(collector.ts);
    start.targets = Vec::new();
    start.probes = hosts.iter().filter_map(|t| t.start.as_ref()).map(|s| s.probes).sum();
    start.hosts = infos;
    if !clocks.refined.consistent {
        start.clock.source.push_str("; message links contradict the round trips, round-trip estimates kept");
    }
    start
}

/// One time order: a k-way merge of the hosts' streams, each corrected on read, sends given
/// their flow ids and receives and signals their links. Ties go to the lower host index, then
/// keep their host's order. Returns how many events were written, and the last one's time.
fn write_in_time_order(
    hosts: &[HostTrace],
    clocks: &Clocks,
    first_flow: &[u64],
    mut linked: Vec<VecDeque<(u64, Event)>>,
    sink: &mut dyn Sink,
) -> io::Result<(u64, Option<u64>)> {
    let mut streams = Vec::with_capacity(hosts.len());
    let mut heap = BinaryHeap::new();
    for (h, t) in hosts.iter().enumerate() {
        let mut stream = t.events.read()?.enumerate();
        let head = stream.next().map(|(i, e)| e.map(|e| (i, e))).transpose()?;
        if let Some((i, e)) = &head {
            heap.push(Reverse((clocks.correct(h, e.ts), h, *i)));
        }
        streams.push(HostStream { stream, head: head.map(|(_, e)| e), next_flow: first_flow[h] });
    }
    let mut written = 0u64;
    let mut last_ts = None;
    while let Some(Reverse((ts, h, i))) = heap.pop() {
        let s = &mut streams[h];
        let mut e = s.head.take().expect("a stream on the heap has its head");
        let host_ts = e.ts;
        e.ts = ts;
        match &mut e.data {
            EventData::Send(data::Send { flow_id, .. }) => {
                *flow_id = s.next_flow;
                s.next_flow += 1;
            }
            EventData::Recv(_) | EventData::Signal(_) => {
                if let Some((_, mut done)) = linked[h].pop_front().filter(|(at, _)| *at == i as u64) {
                    done.ts = ts;
                    e = done;
                }
            }
            _ => {}
        }
        sink.event_on_host_clock(&e, host_ts)?;
        written += 1;
        last_ts = Some(ts);
        if let Some((next, n)) = s.stream.next() {
            let n = n?;
            heap.push(Reverse((clocks.correct(h, n.ts), h, next)));
            s.head = Some(n);
        }
    }
    Ok((written, last_ts))
}

/// The merged trace's end: the latest host end (or `last_ts`), the hosts' losses and counters
/// summed, and each host's own end.
fn merged_end(
    hosts: &[HostTrace],
    reason: EndReason,
    clocks: &Clocks,
    counts: &[u64],
    written: u64,
    last_ts: u64,
    ipc: IpcStats,
) -> TraceEnd {
    let mut lost: std::collections::BTreeMap<String, u64> = Default::default();
    for t in hosts {
        for (k, v) in t.end.iter().flat_map(|e| e.lost_events.iter()) {
            *lost.entry(k.clone()).or_default() += v;
        }
    }
    lost.insert("in_transit".to_string(), hosts.iter().map(|t| t.lost_in_transit).sum());
    let host_ends: Vec<HostEnd> = hosts
        .iter()
        .enumerate()
        .map(|(h, t)| HostEnd {
            name: t.host.clone(),
            complete: t.losses.is_empty() && t.end.is_some(),
            reason: t.end.as_ref().map(|e| e.reason),
            events: counts[h],
            command_exit_code: t.end.as_ref().and_then(|e| e.command_exit_code),
            lost: t.losses.clone(),
        })
        .collect();
    // One command: its code; several: the first that failed, as a shell's `&&` would tell.
    let codes: Vec<i32> = host_ends.iter().filter_map(|h| h.command_exit_code).collect();
    let command_exit_code = codes.iter().copied().find(|&c| c != 0).or(codes.first().copied());
    TraceEnd {
        ts: hosts
            .iter()
            .enumerate()
            .filter_map(|(h, t)| t.end.as_ref().map(|e| clocks.correct(h, e.ts)))
            .max()
            .unwrap_or(last_ts),
        reason,
        events_written: written,
        lost_events: lost,
        calls_without_return_probe: hosts
            .iter()
            .filter_map(|t| t.end.as_ref())
            .map(|e| e.calls_without_return_probe)
            .sum(),
        command_exit_code,
        ipc,
        hosts: host_ends,
        filters: merged_filters(hosts.iter().filter_map(|t| t.end.as_ref())),
        unmatched_functions: merged_unmatched(hosts),
        execs_probed_late: hosts.iter().filter_map(|t| t.end.as_ref()?.execs_probed_late).reduce(|a, b| a + b),
    }
}

/// The `-f` patterns that matched nothing on any host: those every host that ended reports
/// unmatched (a pattern one host matched, or did not report on, is not), with each host's images
/// named `HOST:PATH` and the hosts' suggestions, first seen first.
fn merged_unmatched(hosts: &[HostTrace]) -> Option<Box<crate::event::UnmatchedFunctions>> {
    let ended: Vec<(&str, Option<&crate::event::UnmatchedFunctions>)> =
        hosts.iter().filter_map(|t| Some((t.host.as_str(), t.end.as_ref()?.unmatched_functions.as_deref()))).collect();
    let (_, first) = ended.first()?;
    let patterns: Vec<String> = (*first)?
        .patterns
        .iter()
        .filter(|p| ended.iter().all(|(_, u)| u.is_some_and(|u| u.patterns.contains(p))))
        .cloned()
        .collect();
    if patterns.is_empty() {
        return None;
    }
    let mut merged = crate::event::UnmatchedFunctions { patterns, ..Default::default() };
    for (host, u) in ended.iter().filter_map(|(h, u)| Some((h, (*u)?))) {
        merged.images.extend(u.images.iter().map(|i| format!("{host}:{i}")));
        for s in &u.suggestions {
            if !merged.suggestions.contains(s) {
                merged.suggestions.push(s.clone());
            }
        }
    }
    Some(Box::new(merged))
}

/// The hosts' predicate counters, summed by function name (the same program on several hosts).
fn merged_filters<'a>(
    ends: impl Iterator<Item = &'a TraceEnd>,
) -> std::collections::BTreeMap<String, crate::event::FilterStats> {
    let mut out: std::collections::BTreeMap<String, crate::event::FilterStats> = Default::default();
    for end in ends {
        for (name, s) in &end.filters {
            let m = out.entry(name.clone()).or_default();
            if m.predicate.is_empty() {
                m.predicate = s.predicate.clone();
            }
            if m.ret_predicate.is_none() {
                m.ret_predicate = s.ret_predicate.clone();
            }
            m.min_duration_ns = m.min_duration_ns.max(s.min_duration_ns);
            m.seen += s.seen;
            m.written += s.written;
            m.filtered_out += s.filtered_out;
            m.returns_not_dropped += s.returns_not_dropped;
            m.entries_lost += s.entries_lost;
            m.by_trigger += s.by_trigger;
            m.by_depth += s.by_depth;
            m.returns_unmatched += s.returns_unmatched;
            m.children_dropped += s.children_dropped;
        }
    }
    out
}

/// One host's stream in the k-way merge: the event on the heap, the rest, and the flow id its
/// next send gets.
struct HostStream<I> {
    stream: I,
    head: Option<Event>,
    next_flow: u64,
}

impl MergedTrace {
    /// Writes the merged trace as a Chrome trace.
    pub fn export_chrome(&self, path: &Path) -> Result<(), ClusterError> {
        self.export(path, Format::Chrome)
    }

    /// Writes the merged trace in any format `record` writes.
    pub fn export(&self, path: &Path, format: Format) -> Result<(), ClusterError> {
        let file = OutputFile::create(path, "the trace")?;
        let mut sink = format.sink(file.writer()?);
        self.write(&mut *sink)?;
        drop(sink);
        Ok(file.commit()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Channel, Syscall};

    pub(super) fn collector() -> TraceStart {
        let mut start = crate::event::test_events::start(0);
        start.host = "collector".into();
        start.targets.clear();
        start
    }

    fn tcp(src: &str, dst: &str) -> Channel {
        Channel::Tcp { src: src.parse().unwrap(), dst: dst.parse().unwrap() }
    }

    fn transfer(host: &str, ts: u64, send: bool, channel: Channel, seq: u64) -> Event {
        let data = if send {
            EventData::Send(data::Send {
                channel,
                fd: 3,
                bytes: 10,
                syscall: Syscall::Write,
                flow_id: 0,
                syscall_ns: 1,
                seq: Some(seq),
                digest: None,
                payload: None,
                payload_truncated: None,
            })
        } else {
            EventData::Recv(data::Recv {
                channel,
                fd: 3,
                bytes: 10,
                syscall: Syscall::Read,
                flow_ids: vec![],
                syscall_ns: 1,
                seq: Some(seq),
                digest: None,
                payload: None,
                payload_truncated: None,
                peek: false,
                discarded: None,
            })
        };
        Event { ts, host: host.into(), pid: 1, tid: 1, data }
    }

    /// Round trips that put `offset` within ±`half_rtt`.
    pub(super) fn samples(offset: i64, half_rtt: u64) -> Vec<ClockSample> {
        vec![ClockSample {
            t0: 1_000_000,
            t1: 1_000_000 + 2 * half_rtt,
            agent_ns: (1_000_000 + half_rtt as i64 + offset) as u64,
        }]
    }

    /// A host that ended, reporting `unmatched` (patterns, images, suggestions) or nothing.
    fn ended(host: &str, unmatched: Option<(&[&str], &[&str], &[&str])>) -> HostTrace {
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        let mut end = TraceEnd::new(100, EndReason::CommandExited, 0);
        end.unmatched_functions = unmatched.map(|(patterns, images, suggestions)| {
            Box::new(crate::event::UnmatchedFunctions {
                patterns: strings(patterns),
                images: strings(images),
                suggestions: strings(suggestions),
            })
        });
        HostTrace {
            host: host.into(),
            samples: samples(0, 10),
            start: None,
            end: Some(end),
            events: Vec::<Event>::new().into(),
            lost_in_transit: 0,
            losses: vec![],
        }
    }

    /// A pattern is unmatched in the merged trace only if every host that ended says so; the
    /// images are named by host; a host that matched it (no report) keeps it out.
    #[test]
    fn a_pattern_is_unmatched_only_where_no_host_matched_it() {
        let a = ended("a", Some((&["nosuch", "tick"], &["/bin/dash", "/x/calls"], &["fib"])));
        let b = ended("b", Some((&["nosuch"], &["/x/calls"], &["fib", "tock"])));
        let merged = merge(vec![a, b], &collector(), EndReason::TargetsExited).unwrap();
        let u = merged.end.unmatched_functions.expect("nosuch matched nowhere");
        assert_eq!(u.patterns, ["nosuch"], "tick matched on b");
        assert_eq!(u.images, ["a:/bin/dash", "a:/x/calls", "b:/x/calls"]);
        assert_eq!(u.suggestions, ["fib", "tock"]);
        let a = ended("a", Some((&["nosuch"], &["/x/calls"], &[])));
        let merged = merge(vec![a, ended("b", None)], &collector(), EndReason::TargetsExited).unwrap();
        assert_eq!(merged.end.unmatched_functions, None, "b matched every pattern");
    }

    #[test]
    fn skew_is_removed_and_cross_host_messages_are_linked_in_order() {
        let skew = 5_000_000; // host b runs 5 ms ahead
        let ab = tcp("10.0.0.1:1000", "10.0.0.2:80");
        let ba = tcp("10.0.0.2:80", "10.0.0.1:1000");
        // a sends at 10_000 (true time); b receives at 10_030 true, stamped +5 ms; b answers at
        // 20_000 true; a receives at 20_030.
        let a = HostTrace {
            host: "a".into(),
            samples: samples(0, 0),
            events: vec![transfer("a", 10_000, true, ab.clone(), 1), transfer("a", 20_030, false, ba.clone(), 500)]
                .into(),
            ..Default::default()
        };
        let b = HostTrace {
            host: "b".into(),
            // The round trips leave ±100 µs of doubt, centred 80 µs off.
            samples: samples(skew + 80_000, 100_000),
            events: vec![
                transfer("b", 10_030 + skew as u64, false, ab, 1),
                transfer("b", 20_000 + skew as u64, true, ba, 500),
            ]
            .into(),
            ..Default::default()
        };
        let m = merge(vec![a, b], &collector(), EndReason::Stopped).unwrap();
        let b_info = &m.start.hosts[1];
        assert!((b_info.offset_ns - skew).abs() <= 30, "{b_info:?}");
        assert!(b_info.uncertainty_ns < b_info.round_trip_uncertainty_ns, "links narrow the doubt: {b_info:?}");
        let order: Vec<(String, &str)> = m
            .events
            .iter()
            .map(|e| {
                (e.host.to_string(), if matches!(e.data, EventData::Send(data::Send { .. })) { "send" } else { "recv" })
            })
            .collect();
        assert_eq!(
            order,
            [("a".into(), "send"), ("b".into(), "recv"), ("b".into(), "send"), ("a".into(), "recv")],
            "one time order across hosts"
        );
        let EventData::Send(data::Send { flow_id, .. }) = m.events[0].data else { panic!() };
        let EventData::Recv(data::Recv { flow_ids, .. }) = &m.events[1].data else { panic!() };
        assert_eq!(flow_ids, &[flow_id]);
        assert_eq!(m.end.ipc.linked_recvs, 2);
        assert_eq!(m.end.events_written, 4);
    }

    /// Host `name`'s events spilled to a file of `dir`, as the collector keeps them.
    fn spilled(dir: &std::sync::Arc<crate::cluster::spill::SpillDir>, index: usize, events: &[Event]) -> HostEvents {
        let mut file = dir.host(index).unwrap();
        for e in events {
            file.push(e).unwrap();
        }
        HostEvents::Spilled(file.flushed().unwrap())
    }

    #[test]
    fn a_k_way_merge_of_spilled_hosts_keeps_one_time_order_and_links_flows_across_them() {
        use crate::event::test_events::{call, ret};
        let skew = 1_000_000u64; // host b runs 1 ms ahead
        let ab = tcp("10.0.0.1:1000", "10.0.0.2:80");
        let ba = tcp("10.0.0.2:80", "10.0.0.1:1000");
        let on = |host: &str, mut e: Event| {
            e.host = host.into();
            e
        };
        // Calls every 100 ns on both hosts (true time), and 50 requests from a each answered by
        // b 10 µs later: a's requests at 5_000 + 20_000 k, b's receives 30 ns after.
        let mut a = Vec::new();
        let mut b = Vec::new();
        for i in 0..10_000u64 {
            let t = i * 100;
            a.push(on("a", if i % 2 == 0 { call(t, 1, "f") } else { ret(t, 1, "f", Some(100)) }));
            b.push(on(
                "b",
                if i % 2 == 0 { call(t + 50 + skew, 2, "g") } else { ret(t + 50 + skew, 2, "g", Some(100)) },
            ));
            if i % 200 == 50 {
                let k = i / 200;
                a.push(transfer("a", t + 1, true, ab.clone(), 1 + 10 * k));
                b.push(transfer("b", t + 31 + skew, false, ab.clone(), 1 + 10 * k));
                b.push(transfer("b", t + 10_001 + skew, true, ba.clone(), 700 + 10 * k));
                a.push(transfer("a", t + 10_031, false, ba.clone(), 700 + 10 * k));
            }
        }
        a.sort_by_key(|e| e.ts);
        b.sort_by_key(|e| e.ts);
        let dir = crate::cluster::spill::SpillDir::create(Some(&std::env::temp_dir())).unwrap();
        let hosts = |events_a: HostEvents, events_b: HostEvents| {
            vec![
                HostTrace { host: "a".into(), samples: samples(0, 0), events: events_a, ..Default::default() },
                HostTrace {
                    host: "b".into(),
                    samples: samples(skew as i64, 200),
                    events: events_b,
                    ..Default::default()
                },
            ]
        };
        let from_disk =
            merge(hosts(spilled(&dir, 0, &a), spilled(&dir, 1, &b)), &collector(), EndReason::Stopped).unwrap();
        let in_memory = merge(hosts(a.clone().into(), b.clone().into()), &collector(), EndReason::Stopped).unwrap();
        assert_eq!(from_disk.events, in_memory.events, "the same merge from disk and from memory");
        let m = from_disk;
        assert_eq!(m.events.len(), a.len() + b.len());
        assert_eq!(m.end.events_written, m.events.len() as u64);
        assert!(m.events.windows(2).all(|w| w[0].ts <= w[1].ts), "one time order");
        // Each host's events keep their order, and their own times less the offset.
        let offset = m.start.hosts[1].offset_ns;
        assert!((offset - skew as i64).abs() <= 200, "{offset}");
        let of = |host: &str| m.events.iter().filter(|e| &*e.host == host).map(|e| e.ts).collect::<Vec<_>>();
        assert_eq!(of("a"), a.iter().map(|e| e.ts).collect::<Vec<_>>());
        assert_eq!(of("b"), b.iter().map(|e| (e.ts as i64 - offset) as u64).collect::<Vec<_>>());
        // Every receive is linked to the send on the other host, and comes after it.
        let mut sent_at = HashMap::new();
        let mut linked = 0;
        for (i, e) in m.events.iter().enumerate() {
            match &e.data {
                EventData::Send(data::Send { flow_id, .. }) => {
                    assert!(sent_at.insert(*flow_id, (i, e.host.clone())).is_none(), "flow ids are unique");
                }
                EventData::Recv(data::Recv { flow_ids, .. }) => {
                    let [id] = flow_ids[..] else { panic!("one link: {flow_ids:?}") };
                    let (at, from) = &sent_at[&id];
                    assert!(*at < i && *from != e.host, "the send, on the other host, before its receive");
                    linked += 1;
                }
                _ => {}
            }
        }
        assert_eq!(linked, 100);
        assert_eq!(m.end.ipc.linked_recvs, 100);
    }
}

/// The ids an agent's OTLP exporter gives its host's spans are those the collector makes of the
/// same events, so that the collector can send the links only it sees (receives of bytes sent
/// from other hosts) and a host it exports whole links to the agents' spans.
#[cfg(test)]
mod otlp_ids {
    use super::*;
    use crate::{
        event::{Channel, Syscall, test_events},
        export::otlp::{HostIds, IdKey, OtlpConfig, OtlpSink, host_key, proto::trace::v1::Span, tests::Listener},
    };

    const SKEW: u64 = 3_000_000; // host b runs 3 ms ahead

    fn on(host: &str, ts: u64, pid: u32, data: EventData) -> Event {
        test_events::event_on(host, ts, pid, pid, data)
    }

    fn send(channel: Channel, seq: u64) -> EventData {
        EventData::Send(data::Send {
            channel,
            fd: 3,
            bytes: 10,
            syscall: Syscall::Write,
            flow_id: 0,
            syscall_ns: 2,
            seq: Some(seq),
            digest: None,
            payload: None,
            payload_truncated: None,
        })
    }

    fn recv(channel: Channel, seq: u64) -> EventData {
        EventData::Recv(data::Recv {
            channel,
            fd: 4,
            bytes: 10,
            syscall: Syscall::Read,
            flow_ids: vec![],
            syscall_ns: 5,
            seq: Some(seq),
            digest: None,
            payload: None,
            payload_truncated: None,
            peek: false,
            discarded: None,
        })
    }

    fn exit() -> EventData {
        EventData::Exit(data::Exit { exit_code: Some(0), signal: None, thread: false, comm: "app".into() })
    }

    /// Host a: pid 1 sends 10 bytes inside a call, exits, and a new pid 1 sends 10 more on another
    /// connection. Host b (3 ms ahead): pid 7 receives both, and sends to its pid 8 over a pipe.
    fn events(host_a: &str, host_b: &str) -> (Vec<Event>, Vec<Event>) {
        let ab = Channel::Tcp { src: "10.0.0.1:1000".parse().unwrap(), dst: "10.0.0.2:80".parse().unwrap() };
        let ab2 = Channel::Tcp { src: "10.0.0.1:1001".parse().unwrap(), dst: "10.0.0.2:80".parse().unwrap() };
        let pipe = Channel::Pipe { id: 5 };
        let mut call = test_events::call(1_000, 1, "f");
        call.host = host_a.into();
        let mut ret = test_events::ret(3_000, 1, "f", Some(2_000));
        ret.host = host_a.into();
        let a = vec![
            call,
            on(host_a, 2_000, 1, send(ab.clone(), 100)),
            ret,
            on(host_a, 4_000, 1, exit()),
            on(host_a, 5_000, 1, send(ab2.clone(), 900)),
        ];
        let b = vec![
            on(host_b, 2_050 + SKEW, 7, recv(ab, 100)),
            on(host_b, 5_050 + SKEW, 7, recv(ab2, 900)),
            on(host_b, 6_000 + SKEW, 7, send(pipe.clone(), 0)),
            on(host_b, 6_100 + SKEW, 8, recv(pipe, 0)),
        ];
        (a, b)
    }

    fn config(url: &str, ids: IdKey, exporting: &[&str]) -> OtlpConfig {
        OtlpConfig {
            url: url.to_string(),
            service_name: None,
            retry: Default::default(),
            wait_when_full: true,
            ids,
            exporting: exporting.iter().map(|h| (h.to_string(), "machine".to_string())).collect(),
        }
    }

    /// What an agent on host `name` of run `run` sends of its events (it names its host
    /// `machine`; its own flow matcher links what its host sent itself).
    fn agent(run: &[u8; 16], name: &str, events: &[Event]) -> Vec<Span> {
        let listener = Listener::start(vec![], None);
        let mut sink = OtlpSink::new(config(&listener.url, IdKey::Host(host_key(run, name)), &[])).unwrap();
        let mut start = test_events::start(0);
        start.host = "machine".into();
        sink.begin(&start).unwrap();
        let mut flows = crate::pipeline::flows::FlowMatcher::default();
        for e in events {
            let mut e = e.clone();
            flows.process(&mut e);
            sink.event(&e).unwrap();
        }
        sink.end(&TraceEnd::new(10_000 + SKEW, EndReason::Stopped, 0)).unwrap();
        listener.spans().into_iter().map(|(_, s)| s).collect()
    }

    /// What `collect --otlp` sends, with the agents of `exporting` sending their own.
    fn collector(run: &[u8; 16], a: Vec<Event>, b: Vec<Event>, exporting: &[&str]) -> Vec<Span> {
        let listener = Listener::start(vec![], None);
        let mut sink = OtlpSink::new(config(&listener.url, IdKey::Run(*run), exporting)).unwrap();
        let host = |name: &str, offset: i64, events: Vec<Event>| HostTrace {
            host: name.into(),
            samples: super::tests::samples(offset, 100),
            start: Some(test_events::start(0)),
            end: Some(TraceEnd::new(10_000, EndReason::Stopped, 0)),
            events: events.into(),
            ..Default::default()
        };
        let hosts = vec![host("a", 0, a), host("b", SKEW as i64, b)];
        merge_into(hosts, &super::tests::collector(), EndReason::Stopped, &mut sink).unwrap();
        listener.spans().into_iter().map(|(_, s)| s).collect()
    }

    fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
        spans.iter().filter(|s| s.name == name).collect()
    }

    /// (trace id, span id, parent span id, name).
    type Ids = (Vec<u8>, Vec<u8>, Vec<u8>, String);

    fn ids(spans: &[Span]) -> Vec<Ids> {
        let mut ids: Vec<_> = spans
            .iter()
            .map(|s| (s.trace_id.clone(), s.span_id.clone(), s.parent_span_id.clone(), s.name.clone()))
            .collect();
        ids.sort();
        ids
    }

    #[test]
    fn agents_and_the_collector_make_the_same_ids_and_it_adds_only_the_cross_host_links() {
        let run = [9u8; 16];
        let (a, b) = events("machine", "machine");
        let (agent_a, agent_b) = (agent(&run, "a", &a), agent(&run, "b", &b));
        // a: two process spans (pid 1 exited and came back), f, two sends; b: three process spans
        // (its target, pid 1, and pids 7 and 8), two unlinked receives, the pipe's send and its
        // linked receive.
        assert_eq!(agent_a.len(), 5, "{:?}", ids(&agent_a));
        assert_eq!(agent_b.len(), 7, "{:?}", ids(&agent_b));
        let sends = named(&agent_a, "send tcp");
        assert_eq!(sends.len(), 2);
        assert_ne!(sends[0].trace_id, sends[1].trace_id, "a reused pid is another trace");
        let tcp_recvs = named(&agent_b, "recv tcp");
        assert!(tcp_recvs.iter().all(|r| r.links.is_empty()), "an agent sees one end");
        assert_eq!(named(&agent_b, "recv pipe")[0].links.len(), 1, "same-host links are the agent's");

        let (a2, b2) = events("a", "b");
        let links = collector(&run, a2.clone(), b2.clone(), &["a", "b"]);
        assert_eq!(links.len(), 2, "one link span per cross-host receive, nothing else: {:?}", ids(&links));
        for (link, (recv, send)) in links.iter().zip(tcp_recvs.iter().zip(&sends)) {
            assert_eq!(link.name, "recv link");
            assert_eq!(link.trace_id, recv.trace_id);
            assert_eq!(link.parent_span_id, recv.span_id, "a child of the agent's receive span");
            assert_eq!(
                (link.start_time_unix_nano, link.end_time_unix_nano),
                (recv.start_time_unix_nano, recv.end_time_unix_nano),
                "on the host's clock, as the agent's span"
            );
            assert_eq!(link.links.len(), 1);
            assert_eq!((&link.links[0].trace_id, &link.links[0].span_id), (&send.trace_id, &send.span_id));
        }

        // Host a's agent does not export: the collector sends a whole, with the ids a's agent
        // would have made, and links b's receives to them.
        let mixed = collector(&run, a2, b2, &["b"]);
        let (of_a, of_b): (Vec<Span>, Vec<Span>) = mixed.into_iter().partition(|s| s.name != "recv link");
        assert_eq!(ids(&of_a), ids(&agent_a));
        assert_eq!(of_b.len(), 2);
        for (link, send) in of_b.iter().zip(&sends) {
            assert_eq!((&link.links[0].trace_id, &link.links[0].span_id), (&send.trace_id, &send.span_id));
        }
    }

    /// A receive whose send's span is not known (it came later, or was forgotten) loses its link:
    /// counted, and said at the end.
    #[test]
    fn a_link_to_a_send_not_seen_is_counted() {
        let listener = Listener::start(vec![], None);
        let mut sink = OtlpSink::new(config(&listener.url, IdKey::Run([3; 16]), &[])).unwrap();
        sink.begin(&test_events::start(0)).unwrap();
        let mut r = on("h", 100, 1, recv(Channel::Pipe { id: 1 }, 0));
        let EventData::Recv(data::Recv { flow_ids, .. }) = &mut r.data else { unreachable!() };
        flow_ids.extend([41, 42]);
        sink.event(&r).unwrap();
        sink.end(&TraceEnd::new(200, EndReason::Stopped, 0)).unwrap();
        assert_eq!(sink.counters().links_unknown.load(std::sync::atomic::Ordering::Relaxed), 2);
        let recvs: Vec<Span> = listener.spans().into_iter().map(|(_, s)| s).filter(|s| s.name == "recv pipe").collect();
        assert_eq!(recvs.len(), 1);
        assert!(recvs[0].links.is_empty());
    }

    #[test]
    fn ids_are_a_pure_function_of_the_key_and_the_event() {
        let ids = HostIds::new(host_key(&[1; 16], "a"));
        assert_eq!(ids.send(1, 2, 3), HostIds::new(host_key(&[1; 16], "a")).send(1, 2, 3));
        assert_ne!(ids.send(1, 2, 3), ids.recv(1, 2, 3), "the kind is hashed");
        assert_ne!(ids.send(1, 2, 3), HostIds::new(host_key(&[1; 16], "b")).send(1, 2, 3), "so is the host");
        assert_ne!(ids.trace(1, 0), ids.trace(1, 1));
        // SipHash-1-3 is specified: these are the ids of every build, on every machine.
        assert_eq!(host_key(&[0; 16], ""), host_key(&[0; 16], ""));
        assert_eq!(format!("{:016x}", ids.send(1, 2, 3)), "a098fa70298f7af2");
    }
}
