//! One timeline from several hosts: clocks corrected, messages linked across hosts, events in one
//! time order.

use crate::event::data;
use std::collections::HashMap;

use super::clock_sync::{ClockModel, ClockSample, Link, estimate, refine};
use crate::{
    event::{EndReason, Event, EventData, HostEnd, HostInfo, HostLoss, TraceEnd, TraceStart},
    pipeline::flows::FlowMatcher,
    sink::Sink,
};

/// What one host sent for a trace.
#[derive(Clone, Debug, Default)]
pub struct HostTrace {
    /// The name the user gave the host (events carry it; unique in a merge).
    pub host: String,
    pub samples: Vec<ClockSample>,
    pub start: Option<TraceStart>,
    pub end: Option<TraceEnd>,
    /// In the host's own time order.
    pub events: Vec<Event>,
    /// Events the agent had to drop while the collector was away.
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

/// Removes the drift part of a clock model, leaving the constant offset for [`refine`].
fn without_drift(model: &ClockModel, ts: u64) -> i64 {
    ts as i64 - (model.offset_at(ts) - model.offset_ns)
}

/// Merges hosts' traces. `collector` describes the merged trace (its host name, clock, version).
pub fn merge(mut hosts: Vec<HostTrace>, collector: &TraceStart, reason: EndReason) -> MergedTrace {
    let models: Vec<ClockModel> = hosts.iter().map(|h| estimate(&h.samples).unwrap_or(ClockModel::ZERO)).collect();
    let counts: Vec<u64> = hosts.iter().map(|h| h.events.len() as u64).collect();

    // Link first: positions and digests, not timestamps, decide the links, so clock errors
    // cannot hide one. Every send is registered before any receive looks for it.
    let mut per_host: Vec<Vec<Event>> = hosts.iter_mut().map(|h| std::mem::take(&mut h.events)).collect();
    let mut matcher = FlowMatcher::default();
    for events in per_host.iter_mut() {
        for e in events.iter_mut().filter(|e| matches!(e.data, EventData::Send(data::Send { .. }))) {
            matcher.process(e);
        }
    }
    for events in per_host.iter_mut() {
        for e in events.iter_mut().filter(|e| !matches!(e.data, EventData::Send(data::Send { .. }))) {
            matcher.process(e);
        }
    }

    // Causality: no linked receive before its send.
    let mut sends: HashMap<u64, (usize, i64)> = HashMap::new();
    for (h, events) in per_host.iter().enumerate() {
        for e in events {
            if let EventData::Send(data::Send { flow_id, .. }) = e.data {
                sends.insert(flow_id, (h, without_drift(&models[h], e.ts)));
            }
        }
    }
    let mut links = Vec::new();
    for (h, events) in per_host.iter().enumerate() {
        for e in events {
            if let EventData::Recv(data::Recv { flow_ids, .. }) = &e.data {
                for id in flow_ids {
                    if let Some(&(from, sent)) = sends.get(id)
                        && from != h
                    {
                        links.push(Link { from, to: h, sent, received: without_drift(&models[h], e.ts) });
                    }
                }
            }
        }
    }
    let estimates: Vec<(i64, u64)> = models.iter().map(|m| (m.offset_ns, m.uncertainty_ns)).collect();
    let refined = refine(&estimates, &links);
    let correct = |h: usize, ts: u64| (without_drift(&models[h], ts) - refined.offsets[h]).max(0) as u64;

    let mut events: Vec<Event> = Vec::with_capacity(per_host.iter().map(Vec::len).sum());
    for (h, host_events) in per_host.into_iter().enumerate() {
        events.extend(host_events.into_iter().map(|mut e| {
            e.ts = correct(h, e.ts);
            e
        }));
    }
    // Each host's events are already in order; a stable sort keeps ties in host order.
    events.sort_by_key(|e| e.ts);

    let infos: Vec<HostInfo> = hosts
        .iter()
        .enumerate()
        .map(|(h, t)| HostInfo {
            name: t.host.clone(),
            machine: t.start.as_ref().and_then(|s| s.machine.clone()),
            offset_ns: refined.offsets[h],
            uncertainty_ns: refined.uncertainties[h],
            round_trip_uncertainty_ns: models[h].uncertainty_ns,
            drift_ppm: models[h].drift * 1e6,
            events: counts[h],
            lost_in_transit: t.lost_in_transit,
            targets: t.start.as_ref().map(|s| s.targets.clone()).unwrap_or_default(),
        })
        .collect();
    let mut start = collector.clone();
    start.ts = hosts
        .iter()
        .enumerate()
        .filter_map(|(h, t)| t.start.as_ref().map(|s| correct(h, s.ts)))
        .min()
        .unwrap_or(collector.ts);
    start.targets = Vec::new();
    start.probes = hosts.iter().filter_map(|t| t.start.as_ref()).map(|s| s.probes).sum();
    start.hosts = infos;
    if !refined.consistent {
        start.clock.source.push_str("; message links contradict the round trips, round-trip estimates kept");
    }

    let mut lost: std::collections::BTreeMap<String, u64> = Default::default();
    for t in &hosts {
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
    let end = TraceEnd {
        ts: hosts
            .iter()
            .enumerate()
            .filter_map(|(h, t)| t.end.as_ref().map(|e| correct(h, e.ts)))
            .max()
            .unwrap_or_else(|| events.last().map_or(start.ts, |e| e.ts)),
        reason,
        events_written: events.len() as u64,
        lost_events: lost,
        calls_without_return_probe: hosts
            .iter()
            .filter_map(|t| t.end.as_ref())
            .map(|e| e.calls_without_return_probe)
            .sum(),
        command_exit_code,
        ipc: matcher.stats.clone(),
        hosts: host_ends,
    };
    MergedTrace { start, events, end }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Channel, Syscall};

    fn collector() -> TraceStart {
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
            })
        };
        Event { ts, host: host.into(), pid: 1, tid: 1, data }
    }

    /// Round trips that put `offset` within ±`half_rtt`.
    fn samples(offset: i64, half_rtt: u64) -> Vec<ClockSample> {
        vec![ClockSample {
            t0: 1_000_000,
            t1: 1_000_000 + 2 * half_rtt,
            agent_ns: (1_000_000 + half_rtt as i64 + offset) as u64,
        }]
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
            events: vec![transfer("a", 10_000, true, ab.clone(), 1), transfer("a", 20_030, false, ba.clone(), 500)],
            ..Default::default()
        };
        let b = HostTrace {
            host: "b".into(),
            // The round trips leave ±100 µs of doubt, centred 80 µs off.
            samples: samples(skew + 80_000, 100_000),
            events: vec![
                transfer("b", 10_030 + skew as u64, false, ab, 1),
                transfer("b", 20_000 + skew as u64, true, ba, 500),
            ],
            ..Default::default()
        };
        let m = merge(vec![a, b], &collector(), EndReason::Stopped);
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
}
