//! Several hosts in one trace. Process and thread ids are unique only within a host, so for the
//! visual formats and the analyses (`report`, `calls`) each host's ids move into a range of their
//! own (host `i` adds `i * 2^22`, above any Linux pid) and process names start with the host's
//! name: each host's processes sort together, under its name, and two hosts' pid 7 are two
//! processes. A single-host trace passes through as is, byte for byte.
//!
//! Hosts are numbered by `trace_start.hosts` when it lists several (a collector's trace). A trace
//! whose start lists none but whose events name several hosts (merged by hand, or written by
//! another tool) is grouped as its events come: the first host seen keeps its ids and names, each
//! other host gets the next range and its name before its processes'.
//!
//! Events name their host, so the names must tell the hosts apart: a `trace_start.hosts` that
//! names a host twice (the collector never writes one; a file edited by hand may) is refused
//! rather than drawn with two hosts' processes mixed in one range.

use std::{collections::HashMap, io, sync::Arc};

use crate::event::data;

use crate::{
    event::{Event, EventData, TargetInfo, TraceEnd, TraceStart},
    sink::Sink,
};

/// Linux pids are below `PID_MAX_LIMIT` (2^22); a collector refuses any other.
const PID_SPACE: u32 = crate::cluster::event_bounds::PID_MAX_LIMIT;

pub struct HostGrouping<S> {
    inner: S,
    /// Each host's index in `trace_start.hosts`, by name; a host the start does not list gets
    /// the next free index.
    hosts: HashMap<String, u32>,
    /// The start listed several hosts: every host's processes are named, the first's too.
    listed: bool,
    /// The host of the last event and its index (events come in long runs from one host: this
    /// spares a lookup per event).
    last: Option<(Arc<str>, u32)>,
}

impl<S: Sink> HostGrouping<S> {
    pub fn new(inner: S) -> Self {
        HostGrouping { inner, hosts: HashMap::new(), listed: false, last: None }
    }

    /// The sink the events went to.
    pub fn into_inner(self) -> S {
        self.inner
    }

    fn index(&mut self, host: &Arc<str>) -> u32 {
        if let Some((last, index)) = &self.last
            && (Arc::ptr_eq(last, host) || last == host)
        {
            return *index;
        }
        let next = self.hosts.len() as u32;
        let index = match self.hosts.get(&**host) {
            Some(&index) => index,
            None => *self.hosts.entry(host.to_string()).or_insert(next),
        };
        self.last = Some((host.clone(), index));
        index
    }
}

fn named(host: &str, comm: &mut String) {
    if !comm.is_empty() {
        *comm = format!("{host}: {comm}");
    }
}

impl<S: Sink> Sink for HostGrouping<S> {
    fn begin(&mut self, start: &TraceStart) -> io::Result<()> {
        if start.hosts.len() < 2 {
            return self.inner.begin(start);
        }
        self.listed = true;
        let mut start = start.clone();
        for (i, h) in start.hosts.iter().enumerate() {
            if self.hosts.insert(h.name.clone(), i as u32).is_some() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("trace_start.hosts names host {} twice: its hosts cannot be told apart", h.name),
                ));
            }
        }
        // The exporters name processes from the targets: give them each host's, moved.
        for (i, host) in start.hosts.iter().enumerate() {
            let offset = i as u32 * PID_SPACE;
            for target in &host.targets {
                start.targets.push(match target.clone() {
                    TargetInfo::Process { pid, comm, exe } => {
                        TargetInfo::Process { pid: pid + offset, comm: format!("{}: {comm}", host.name), exe }
                    }
                    TargetInfo::Command { pid, argv, exe } => TargetInfo::Command {
                        pid: pid + offset,
                        argv,
                        exe: format!("{}: {}", host.name, exe.rsplit('/').next().unwrap_or(&exe)),
                    },
                    other => other,
                });
            }
        }
        self.inner.begin(&start)
    }

    fn event(&mut self, event: &Event) -> io::Result<()> {
        let index = self.index(&event.host);
        if index == 0 && !self.listed {
            return self.inner.event(event);
        }
        let offset = index * PID_SPACE;
        let host = event.host.clone();
        let mut e = event.clone();
        e.pid += offset;
        e.tid += offset;
        match &mut e.data {
            EventData::Spawn(data::Spawn { parent_pid, child_pid, child_tid, comm, .. }) => {
                *parent_pid += offset;
                *child_pid += offset;
                *child_tid += offset;
                named(&host, comm);
            }
            EventData::Exit(data::Exit { comm, .. }) => named(&host, comm),
            EventData::Signal(data::Signal { sender_pid, target_pid, target_tid, .. }) => {
                *sender_pid += offset;
                *target_pid += offset;
                *target_tid += offset;
            }
            _ => {}
        }
        self.inner.event(&e)
    }

    fn end(&mut self, end: &TraceEnd) -> io::Result<()> {
        self.inner.end(end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        event::{EndReason, HostInfo, SpawnHow},
        sink::CallbackSink,
    };

    fn start(hosts: &[&str]) -> TraceStart {
        TraceStart {
            host: "collector".into(),
            targets: vec![],
            hosts: hosts
                .iter()
                .map(|h| HostInfo {
                    name: h.to_string(),
                    machine: None,
                    offset_ns: 0,
                    uncertainty_ns: 0,
                    round_trip_uncertainty_ns: 0,
                    drift_ppm: 0.0,
                    events: 0,
                    lost_in_transit: 0,
                    targets: vec![TargetInfo::Process { pid: 10, comm: "srv".into(), exe: "/srv".into() }],
                })
                .collect(),
            ..crate::event::test_events::start(0)
        }
    }

    fn spawn(host: &str) -> Event {
        Event {
            ts: 1,
            host: host.into(),
            pid: 10,
            tid: 10,
            data: EventData::Spawn(data::Spawn {
                parent_pid: 10,
                child_pid: 11,
                child_tid: 11,
                how: SpawnHow::Fork,
                comm: "srv".into(),
                filename: None,
            }),
        }
    }

    /// Runs events through the grouping into a collecting sink.
    fn group(start: &TraceStart, events: &[Event]) -> Vec<Event> {
        let mut seen = Vec::new();
        {
            let mut g = HostGrouping::new(CallbackSink::new(|e: &Event| seen.push(e.clone())));
            g.begin(start).unwrap();
            for e in events {
                g.event(e).unwrap();
            }
            g.end(&TraceEnd {
                ts: 2,
                reason: EndReason::Stopped,
                events_written: 0,
                lost_events: Default::default(),
                calls_without_return_probe: 0,
                command_exit_code: None,
                ipc: Default::default(),
                hosts: Vec::new(),
                filters: Default::default(),
                unmatched_functions: None,
                execs_probed_late: None,
            })
            .unwrap();
        }
        seen
    }

    #[test]
    fn hosts_get_their_own_pid_ranges_and_names() {
        let out = group(&start(&["a", "b"]), &[spawn("a"), spawn("b")]);
        let ids: Vec<(u32, u32)> = out.iter().map(|e| (e.pid, e.tid)).collect();
        assert_eq!(ids, [(10, 10), (PID_SPACE + 10, PID_SPACE + 10)]);
        let EventData::Spawn(data::Spawn { child_pid, comm, .. }) = &out[1].data else { panic!() };
        assert_eq!((*child_pid, comm.as_str()), (PID_SPACE + 11, "b: srv"));
    }

    #[test]
    fn ranges_follow_the_hosts_order_in_the_start_not_the_events() {
        let out = group(&start(&["a", "b"]), &[spawn("b"), spawn("a")]);
        let ids: Vec<u32> = out.iter().map(|e| e.pid).collect();
        assert_eq!(ids, [PID_SPACE + 10, 10]);
    }

    #[test]
    fn a_host_named_twice_is_refused() {
        let mut g = HostGrouping::new(CallbackSink::new(|_: &Event| {}));
        let err = g.begin(&start(&["a", "a"])).unwrap_err();
        assert_eq!(err.to_string(), "trace_start.hosts names host a twice: its hosts cannot be told apart");
    }

    #[test]
    fn a_start_that_lists_no_hosts_is_grouped_as_its_events_come() {
        let out = group(&start(&[]), &[spawn("a"), spawn("b"), spawn("a")]);
        let ids: Vec<u32> = out.iter().map(|e| e.pid).collect();
        assert_eq!(ids, [10, PID_SPACE + 10, 10]);
        let comms: Vec<&str> = out
            .iter()
            .map(|e| match &e.data {
                EventData::Spawn(data::Spawn { comm, .. }) => comm.as_str(),
                _ => panic!(),
            })
            .collect();
        assert_eq!(comms, ["srv", "b: srv", "srv"], "the first host keeps its names");
    }

    #[test]
    fn one_host_passes_through() {
        let e = spawn("a");
        assert_eq!(group(&start(&["a"]), std::slice::from_ref(&e)), [e]);
    }
}
