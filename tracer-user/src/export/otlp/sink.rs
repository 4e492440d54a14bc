//! The sink: a trace's events made into spans, batched per process and queued for the exporter.

use std::{
    collections::{HashMap, VecDeque},
    io,
    sync::{Arc, OnceLock, atomic::Ordering, mpsc},
    thread,
    time::Instant,
};

use prost::Message as _;

use super::{
    BATCH_SPANS, DRAIN_DEADLINE, MAX_PROCESS_EVENTS, MAX_REMEMBERED_SENDS, OtlpConfig, QUEUE_BATCHES,
    attributes::{channel_kind, int, ints, resource, string},
    ids::{HostIds, IdKey},
    proto::{
        collector::trace::v1::ExportTraceServiceRequest,
        common::v1::{InstrumentationScope, KeyValue},
        logs::v1::LogRecord,
        trace::v1::{ResourceSpans, ScopeSpans, Span, span},
    },
    transport::{Counters, Request, Signal, UrlError, export_loop, logs_endpoint, traces_endpoint},
};
use crate::{
    analysis::{
        processes,
        slices::{CallEvent, CallTracker, Calls, Ending},
    },
    event::{Event, EventData, TraceEnd, TraceStart, Track, data},
    export::lifecycle_name,
    sink::Sink,
};

/// A trace's spans, sent to an OTLP/HTTP collector as they end; a [`Sink`].
pub struct OtlpSink {
    tracker: CallTracker,
    spans: Spans,
}

/// The spans being made and sent: everything but the open calls.
pub(super) struct Spans {
    ids: IdKey,
    /// Each host's [`HostIds`], by the events' `host`.
    host_ids: HashMap<Arc<str>, HostIds>,
    /// Processes of each pid that have ended so far (see [`HostIds::trace`]).
    incarnations: HashMap<(Arc<str>, u32), u32>,
    /// The ts of the event being handled on its host's own clock (ids are made of it): its `ts`,
    /// except in a collector's merge, where `ts` is corrected to the collector's clock.
    host_ts: u64,
    /// Hosts whose agents export their own spans (the collector's name → the `host.name` the
    /// agent gives them): only the links across hosts are made for them.
    exporting: HashMap<String, String>,
    pub(super) service_name: Option<String>,
    pub(super) processes: HashMap<(Arc<str>, u32), Process>,
    /// The span ids of the open calls of each track, by depth.
    open: HashMap<(Arc<str>, u32, Track), Vec<u64>>,
    /// flow_id → (trace id, span id, host) of the send span.
    sends: HashMap<u64, ([u8; 16], u64, Arc<str>)>,
    send_order: VecDeque<u64>,
    batch: Vec<(BatchKey, Span)>,
    /// Log records waiting for their batch, each with the name of its logger (its scope).
    pub(super) log_batch: Vec<(BatchKey, Option<String>, LogRecord)>,
    queue: Option<mpsc::SyncSender<Request>>,
    exporter: Option<thread::JoinHandle<()>>,
    counters: Arc<Counters>,
    /// Set when the trace ends: batches still queued after it are dropped (and counted), so that
    /// an unreachable collector holds the end of a trace up for at most [`DRAIN_DEADLINE`].
    deadline: Arc<OnceLock<Instant>>,
    endpoint: String,
    logs_endpoint: String,
    /// Batches wait for room in the queue: the trace is ending, or is read from a file.
    ending: bool,
    host: Arc<str>,
}

/// Whose resource a batched span goes under.
#[derive(PartialEq, Eq)]
pub(super) struct BatchKey {
    pub(super) host: Arc<str>,
    pub(super) pid: u32,
    pub(super) comm: Arc<str>,
}

pub(super) struct Process {
    trace_id: [u8; 16],
    span_id: u64,
    pub(super) comm: Arc<str>,
    start: u64,
    events: Vec<span::Event>,
    dropped_events: u32,
}

impl OtlpSink {
    /// Starts the exporter thread. `url` must have been checked by [`traces_endpoint`].
    pub fn new(config: OtlpConfig) -> Result<OtlpSink, UrlError> {
        let endpoint = traces_endpoint(&config.url)?;
        let logs_endpoint = logs_endpoint(&config.url)?;
        let counters = Arc::new(Counters::default());
        let deadline = Arc::new(OnceLock::new());
        let (tx, rx) = mpsc::sync_channel::<Request>(QUEUE_BATCHES);
        let exporter = {
            let (counters, deadline) = (counters.clone(), deadline.clone());
            let endpoints = [endpoint.clone(), logs_endpoint.clone()];
            let retry = config.retry;
            thread::Builder::new()
                .name("otlp-export".into())
                .spawn(move || export_loop(&endpoints, retry, rx, &counters, &deadline))
                .expect("spawn the OTLP exporter thread")
        };
        let spans = Spans {
            ids: config.ids,
            host_ids: HashMap::new(),
            incarnations: HashMap::new(),
            host_ts: 0,
            exporting: config.exporting,
            service_name: config.service_name,
            processes: HashMap::new(),
            open: HashMap::new(),
            sends: HashMap::new(),
            send_order: VecDeque::new(),
            batch: Vec::new(),
            log_batch: Vec::new(),
            queue: Some(tx),
            exporter: Some(exporter),
            counters,
            deadline,
            endpoint,
            logs_endpoint,
            ending: config.wait_when_full,
            host: Arc::from(""),
        };
        Ok(OtlpSink { tracker: CallTracker::default(), spans })
    }

    pub fn counters(&self) -> Arc<Counters> {
        self.spans.counters.clone()
    }
}

impl Spans {
    fn ids(&mut self, host: &Arc<str>) -> HostIds {
        let key = &self.ids;
        *self.host_ids.entry(host.clone()).or_insert_with(|| HostIds::new(key.for_host(host)))
    }

    /// Whether `host`'s agent exports its own spans.
    fn mirrored(&self, host: &str) -> bool {
        self.exporting.contains_key(host)
    }

    fn process(&mut self, host: &Arc<str>, pid: u32, ts: u64) -> &mut Process {
        let ids = self.ids(host);
        let incarnation = self.incarnations.get(&(host.clone(), pid)).copied().unwrap_or(0);
        self.processes.entry((host.clone(), pid)).or_insert_with(|| Process {
            trace_id: ids.trace(pid, incarnation),
            span_id: ids.process(pid, incarnation),
            comm: Arc::from(""),
            start: ts,
            events: Vec::new(),
            dropped_events: 0,
        })
    }

    /// The span a thread is in now: its innermost open call, else its process.
    pub(super) fn current_span(&mut self, host: &Arc<str>, pid: u32, tid: u32, ts: u64) -> ([u8; 16], u64) {
        let top = self.open.get(&(host.clone(), pid, Track::Thread(tid))).and_then(|s| s.last().copied());
        let p = self.process(host, pid, ts);
        (p.trace_id, top.unwrap_or(p.span_id))
    }

    fn push(&mut self, host: &Arc<str>, pid: u32, span: Span) {
        let comm = self.processes.get(&(host.clone(), pid)).map_or_else(|| Arc::from(""), |p| p.comm.clone());
        self.batch.push((BatchKey { host: host.clone(), pid, comm }, span));
        if self.batch.len() >= BATCH_SPANS {
            self.send_batch();
        }
    }

    /// Encodes the batch as one request (a resource per process) and queues it; the end of the
    /// trace waits for room (the exporter drains the queue by its deadline), events never do.
    fn send_batch(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let spans = std::mem::take(&mut self.batch);
        let items = spans.len() as u64;
        let body = self.request(spans).encode_to_vec();
        self.enqueue(Request { signal: Signal::Traces, body, items });
    }

    /// Queues a request, or counts its spans or log records as dropped.
    pub(super) fn enqueue(&mut self, request: Request) {
        let (signal, items) = (request.signal, request.items);
        let Some(queue) = &self.queue else { return };
        let queued = if self.ending { queue.send(request).is_ok() } else { queue.try_send(request).is_ok() };
        if !queued {
            self.counters.dropped_queue_full(signal).fetch_add(items, Ordering::Relaxed);
        }
    }

    /// Sends both kinds of batch.
    fn send_batches(&mut self) {
        self.send_batch();
        self.send_log_batch();
    }

    fn request(&self, spans: Vec<(BatchKey, Span)>) -> ExportTraceServiceRequest {
        let mut by_process: Vec<(BatchKey, Vec<Span>)> = Vec::new();
        for (key, span) in spans {
            match by_process.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => v.push(span),
                None => by_process.push((key, vec![span])),
            }
        }
        let resource_spans = by_process
            .into_iter()
            .map(|(key, spans)| ResourceSpans {
                // A link span goes under the resource its agent gives the receiver's spans.
                resource: Some(resource(
                    self.exporting.get(&*key.host).map_or(&key.host, |name| name),
                    key.pid,
                    &key.comm,
                    self.service_name.as_deref(),
                )),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "tracer".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..Default::default()
                    }),
                    spans,
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            })
            .collect();
        ExportTraceServiceRequest { resource_spans }
    }

    /// Ends a process's span (its exit, or the end of tracing).
    fn end_process(&mut self, host: &Arc<str>, pid: u32, end: u64) {
        *self.incarnations.entry((host.clone(), pid)).or_default() += 1;
        let Some(p) = self.processes.remove(&(host.clone(), pid)) else { return };
        self.open.retain(|(h, p2, _), _| !(h == host && *p2 == pid));
        if self.mirrored(host) {
            return;
        }
        let name = if p.comm.is_empty() { format!("process {pid}") } else { format!("process {}", p.comm) };
        let span = Span {
            trace_id: p.trace_id.to_vec(),
            span_id: p.span_id.to_be_bytes().to_vec(),
            name,
            kind: span::SpanKind::Internal as i32,
            start_time_unix_nano: p.start,
            end_time_unix_nano: end.max(p.start),
            events: p.events,
            dropped_events_count: p.dropped_events,
            ..Default::default()
        };
        self.batch.push((BatchKey { host: host.clone(), pid, comm: p.comm }, span));
        if self.batch.len() >= BATCH_SPANS {
            self.send_batch();
        }
    }

    /// A span event on the span of process `pid`.
    fn process_event(&mut self, e: &Event, pid: u32, name: String, attributes: Vec<KeyValue>) {
        let mirrored = self.mirrored(&e.host);
        let p = self.process(&e.host, pid, e.ts);
        if mirrored {
            return;
        }
        if p.events.len() >= MAX_PROCESS_EVENTS {
            p.dropped_events += 1;
            return;
        }
        let mut attributes = attributes;
        attributes.push(int("thread.id", e.tid as i64));
        p.events.push(span::Event { time_unix_nano: e.ts, name, attributes, dropped_attributes_count: 0 });
    }

    /// The send spans of a receive's flows; those not known are counted.
    fn linked_sends(&self, flow_ids: &[u64]) -> Vec<([u8; 16], u64, Arc<str>)> {
        let known: Vec<_> = flow_ids.iter().filter_map(|id| self.sends.get(id)).cloned().collect();
        let unknown = (flow_ids.len() - known.len()) as u64;
        self.counters.links_unknown.fetch_add(unknown, Ordering::Relaxed);
        known
    }

    fn remember_send(&mut self, flow_id: u64, span: ([u8; 16], u64, Arc<str>)) {
        if self.sends.insert(flow_id, span).is_none() {
            self.send_order.push_back(flow_id);
            if self.send_order.len() > MAX_REMEMBERED_SENDS
                && let Some(old) = self.send_order.pop_front()
            {
                self.sends.remove(&old);
            }
        }
    }

    fn ipc_span(&mut self, e: &Event) {
        if self.mirrored(&e.host) {
            return self.link_span(e);
        }
        let (kind, name, channel, bytes, start, end, links, flow) = match &e.data {
            EventData::Send(s) => (
                span::SpanKind::Producer,
                format!("send {}", channel_kind(&s.channel)),
                &s.channel,
                s.bytes,
                e.ts,
                e.ts + s.syscall_ns,
                Vec::new(),
                Some(s.flow_id),
            ),
            EventData::Recv(r) => {
                let links = self
                    .linked_sends(&r.flow_ids)
                    .into_iter()
                    .map(|(trace_id, span_id, _)| span::Link {
                        trace_id: trace_id.to_vec(),
                        span_id: span_id.to_be_bytes().to_vec(),
                        ..Default::default()
                    })
                    .collect();
                (
                    span::SpanKind::Consumer,
                    format!("recv {}", channel_kind(&r.channel)),
                    &r.channel,
                    r.bytes,
                    e.ts.saturating_sub(r.syscall_ns),
                    e.ts,
                    links,
                    None,
                )
            }
            _ => return,
        };
        let channel = serde_json::to_string(channel).unwrap_or_default();
        let (trace_id, parent) = self.current_span(&e.host, e.pid, e.tid, e.ts);
        let ids = self.ids(&e.host);
        let span_id = match flow {
            Some(_) => ids.send(e.pid, e.tid, self.host_ts),
            None => ids.recv(e.pid, e.tid, self.host_ts),
        };
        if let Some(flow) = flow {
            self.remember_send(flow, (trace_id, span_id, e.host.clone()));
        }
        let span = Span {
            trace_id: trace_id.to_vec(),
            span_id: span_id.to_be_bytes().to_vec(),
            parent_span_id: parent.to_be_bytes().to_vec(),
            name,
            kind: kind as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: end,
            attributes: vec![
                int("thread.id", e.tid as i64),
                string("tracer.channel", channel),
                int("tracer.bytes", bytes as i64),
            ],
            links,
            ..Default::default()
        };
        self.push(&e.host, e.pid, span);
    }

    /// For a host whose agent exports its own spans: remembers its sends' spans (by the ids its
    /// agent gave them), and makes, for a receive of bytes sent from other hosts, the one span its
    /// agent could not make: a child of the agent's receive span, on the host's clock as that
    /// span is, linking to the sends on the other hosts (the agent links those on its own).
    fn link_span(&mut self, e: &Event) {
        let ids = self.ids(&e.host);
        let trace_id = self.process(&e.host, e.pid, e.ts).trace_id;
        match &e.data {
            EventData::Send(s) => {
                let span_id = ids.send(e.pid, e.tid, self.host_ts);
                self.remember_send(s.flow_id, (trace_id, span_id, e.host.clone()));
            }
            EventData::Recv(r) => {
                let links: Vec<span::Link> = self
                    .linked_sends(&r.flow_ids)
                    .into_iter()
                    .filter(|(_, _, host)| *host != e.host)
                    .map(|(trace_id, span_id, _)| span::Link {
                        trace_id: trace_id.to_vec(),
                        span_id: span_id.to_be_bytes().to_vec(),
                        ..Default::default()
                    })
                    .collect();
                if links.is_empty() {
                    return;
                }
                let span = Span {
                    trace_id: trace_id.to_vec(),
                    span_id: ids.recv_link(e.pid, e.tid, self.host_ts).to_be_bytes().to_vec(),
                    parent_span_id: ids.recv(e.pid, e.tid, self.host_ts).to_be_bytes().to_vec(),
                    name: "recv link".into(),
                    kind: span::SpanKind::Consumer as i32,
                    start_time_unix_nano: self.host_ts.saturating_sub(r.syscall_ns),
                    end_time_unix_nano: self.host_ts,
                    attributes: vec![int("thread.id", e.tid as i64)],
                    links,
                    ..Default::default()
                };
                self.push(&e.host, e.pid, span);
            }
            _ => {}
        }
    }

    /// Makes a span of each call that ended (a call's span id is made when it begins, so that
    /// its callees can name it as their parent).
    fn calls(&mut self, mut calls: Calls) {
        while let Some(c) = calls.next() {
            self.call(c);
        }
    }

    fn call(&mut self, c: CallEvent) {
        let host = self.host.clone();
        match c {
            CallEvent::Begin { pid, track, depth, .. } => {
                // The call's own event is the one being handled.
                let id = self.ids(&host).call(pid, track, depth, self.host_ts);
                let stack = self.open.entry((host, pid, track)).or_default();
                stack.truncate(depth);
                stack.push(id);
            }
            CallEvent::End(slice) => {
                let depth = slice.depth();
                let key = (host.clone(), slice.pid, slice.track);
                let stack = self.open.entry(key).or_default();
                let own = if slice.call_seen { stack.get(depth).copied() } else { None };
                let parent = depth.checked_sub(1).and_then(|d| stack.get(d).copied());
                stack.truncate(depth);
                let ts = self.host_ts;
                let span_id = own.unwrap_or_else(|| self.ids(&host).orphan_return(slice.pid, slice.track, depth, ts));
                let p = self.process(&host, slice.pid, slice.frame.start);
                let parent = parent.unwrap_or(p.span_id);
                let trace_id = p.trace_id;
                let mut attributes = vec![
                    string("code.function", slice.frame.function.to_string()),
                    string("tracer.module", slice.frame.module.to_string()),
                    int("thread.id", slice.tid as i64),
                ];
                if slice.call_seen {
                    attributes.push(ints("tracer.args", slice.frame.args.as_slice()));
                }
                // Where the function is defined (DWARF), by the current semantic conventions'
                // names (`code.file.path`, `code.line.number`; `code.filepath`/`code.lineno` are
                // deprecated).
                if let Some(file) = &slice.frame.file {
                    attributes.push(string("code.file.path", file.to_string()));
                }
                if let Some(line) = slice.frame.line {
                    attributes.push(int("code.line.number", line.into()));
                }
                // Parameters and return value at source level (DWARF), as their JSON text.
                for (name, value) in &slice.frame.params.0 {
                    attributes.push(string(&format!("code.param.{name}"), value.0.to_string()));
                }
                if let Some(ret) = &slice.frame.ret {
                    attributes.push(string("code.return", ret.0.to_string()));
                }
                match slice.ending {
                    Ending::Returned { retval } => attributes.push(int("tracer.retval", retval as i64)),
                    ending => attributes
                        .push(string("tracer.unfinished", ending.unfinished_reason().unwrap_or_default().to_string())),
                }
                let span = Span {
                    trace_id: trace_id.to_vec(),
                    span_id: span_id.to_be_bytes().to_vec(),
                    parent_span_id: parent.to_be_bytes().to_vec(),
                    name: slice.frame.function.to_string(),
                    kind: span::SpanKind::Internal as i32,
                    start_time_unix_nano: slice.frame.start,
                    end_time_unix_nano: slice.end,
                    attributes,
                    ..Default::default()
                };
                self.push(&host, slice.pid, span);
            }
        }
    }
}

impl Sink for OtlpSink {
    fn begin(&mut self, start: &TraceStart) -> io::Result<()> {
        self.spans.begin(start);
        Ok(())
    }

    fn event(&mut self, e: &Event) -> io::Result<()> {
        self.event_on_host_clock(e, e.ts)
    }

    fn event_on_host_clock(&mut self, e: &Event, host_ts: u64) -> io::Result<()> {
        // Calls of a multi-host trace nest per host: the tracker's keys are pids, so the host
        // each call event belongs to is the event's.
        self.spans.host = e.host.clone();
        self.spans.host_ts = host_ts;
        if !self.spans.mirrored(&e.host) {
            self.spans.calls(self.tracker.event(e));
        }
        self.spans.event(e);
        Ok(())
    }

    fn end(&mut self, end: &TraceEnd) -> io::Result<()> {
        self.spans.ending = true;
        self.spans.calls(self.tracker.finish(end.ts));
        self.spans.end(end);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.spans.send_batches();
        Ok(())
    }
}

/// The spans of the trace's other events, around the calls'.
impl Spans {
    fn begin(&mut self, start: &TraceStart) {
        self.host = Arc::from(start.host.as_str());
        let own = start.targets.iter().map(|t| (self.host.clone(), t));
        let hosts = start.hosts.iter().flat_map(|h| {
            let name: Arc<str> = Arc::from(h.name.as_str());
            h.targets.iter().map(move |t| (name.clone(), t))
        });
        let targets: Vec<_> = own.chain(hosts).collect();
        for (host, target) in targets {
            if let Some((pid, comm)) = processes::target_name(target) {
                self.process(&host, pid, start.ts).comm = Arc::from(comm);
            }
        }
    }

    fn event(&mut self, e: &Event) {
        if let EventData::Spawn(s) = &e.data
            && s.how == data::SpawnHow::Fork
        {
            // The child's own trace starts here.
            self.process(&e.host, s.child_pid, e.ts);
        }
        if let Some((pid, comm)) = processes::named_by(e) {
            self.process(&e.host, pid, e.ts).comm = Arc::from(comm);
        }
        match &e.data {
            EventData::Call(_) | EventData::Return(_) => {}
            EventData::Send(_) | EventData::Recv(_) => self.ipc_span(e),
            EventData::Spawn(s) => {
                let name = lifecycle_name(&e.data).unwrap_or_default();
                let attrs = vec![int("tracer.child_pid", s.child_pid as i64)];
                self.process_event(e, e.pid, name, attrs);
            }
            EventData::Exit(x) => {
                let name = lifecycle_name(&e.data).unwrap_or_default();
                let mut attrs = Vec::new();
                if let Some(code) = x.exit_code {
                    attrs.push(int("process.exit.code", code as i64));
                }
                if let Some(sig) = x.signal {
                    attrs.push(int("tracer.signal", sig as i64));
                }
                self.process_event(e, e.pid, name, attrs);
                if !x.thread {
                    self.end_process(&e.host.clone(), e.pid, e.ts);
                }
            }
            EventData::Signal(s) => {
                let what = if s.delivered { "delivered" } else { "generated" };
                let name = format!("signal {} {what}", s.signal.name);
                let attrs =
                    vec![int("tracer.sender_pid", s.sender_pid as i64), int("tracer.target_pid", s.target_pid as i64)];
                // On the target's span: a generation may be raised in a process that is exiting
                // (SIGCHLD, in the child), whose span has ended.
                self.process_event(e, s.target_pid, name, attrs);
            }
            // A log record only (no span event as well): the record carries its span's ids, and
            // a process span keeps at most MAX_PROCESS_EVENTS events.
            EventData::Log(log) => self.log(e, log),
            EventData::Usdt(u) => {
                let attrs = vec![string("tracer.module", u.module.to_string()), string("tracer.args", u.args_text())];
                self.process_event(e, e.pid, format!("usdt {}:{}", u.provider, u.name), attrs);
            }
            EventData::Break(b) => {
                let mut attrs = vec![
                    string("code.file.path", b.file.to_string()),
                    int("code.line.number", b.line as i64),
                    string("tracer.module", b.module.to_string()),
                    string("tracer.locals", b.locals_text()),
                ];
                if let Some(function) = &b.function {
                    attrs.push(string("code.function", function.to_string()));
                }
                self.process_event(e, e.pid, b.title(), attrs);
            }
            EventData::Watch(w) => {
                let mut attrs = vec![
                    string("tracer.variable", w.variable.to_string()),
                    int("tracer.address", w.address as i64),
                    string("tracer.value", w.value.0.to_string()),
                ];
                if let Some(function) = &w.function {
                    attrs.push(string("code.function", function.to_string()));
                }
                if let Some(file) = &w.file {
                    attrs.push(string("code.file.path", file.to_string()));
                }
                if let Some(line) = w.line {
                    attrs.push(int("code.line.number", line as i64));
                }
                self.process_event(e, e.pid, w.title(), attrs);
            }
        }
    }

    fn end(&mut self, end: &TraceEnd) {
        let mut open: Vec<(Arc<str>, u32)> = self.processes.keys().cloned().collect();
        open.sort();
        for (host, pid) in open {
            self.end_process(&host, pid, end.ts);
        }
        self.send_batches();
        self.queue = None;
        let _ = self.deadline.set(Instant::now() + DRAIN_DEADLINE);
        if let Some(exporter) = self.exporter.take() {
            let _ = exporter.join();
        }
        let c = &self.counters;
        tracing::info!("{} spans sent to {} (OTLP)", c.spans_sent.load(Ordering::Relaxed), self.endpoint);
        let logs = c.log_records_sent.load(Ordering::Relaxed);
        let logs_lost = c.log_records_dropped_queue_full.load(Ordering::Relaxed)
            + c.log_records_dropped_export_failed.load(Ordering::Relaxed);
        if logs + logs_lost > 0 {
            tracing::info!("{logs} log records sent to {} (OTLP)", self.logs_endpoint);
        }
        for (what, signal) in [("spans", Signal::Traces), ("log records", Signal::Logs)] {
            let full = c.dropped_queue_full(signal).load(Ordering::Relaxed);
            let failed = c.dropped_export_failed(signal).load(Ordering::Relaxed);
            if full > 0 {
                tracing::warn!(
                    "{full} {what} were lost before OTLP export (the export queue of {QUEUE_BATCHES} batches was full: the collector took them slower than they came)"
                );
            }
            if failed > 0 {
                tracing::warn!(
                    "{failed} {what} were lost in OTLP export (the collector refused them or was unreachable; see above)"
                );
            }
        }
        let unknown = c.links_unknown.load(Ordering::Relaxed);
        if unknown > 0 {
            tracing::warn!(
                "links from receives to their sends not sent over OTLP: {unknown} (the send's span was not known when its receive came: it was older than the last {MAX_REMEMBERED_SENDS} sends, or, where the hosts' clocks could not be reconciled, it came later on the merged clock)"
            );
        }
    }
}
