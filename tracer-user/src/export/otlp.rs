//! OTLP export: a trace as OpenTelemetry spans, sent to a collector over OTLP/HTTP (protobuf).
//!
//! The mapping (also in docs/exports.md, "OpenTelemetry"):
//! - One resource per traced process (`host.name`, `process.pid`, `process.executable.name`,
//!   `service.name`: `--service-name`, else the process's comm).
//! - One trace per process. Ids are made of the events, not drawn (see [`HostIds`]), so that a
//!   collector names an agent's spans as the agent did. The process
//!   itself is the root span (`process <comm>`, from its first event to its exit or the end of
//!   tracing); spawns, exits and signals are its span events.
//! - One span per call, a child of its caller's span (the process span for a call with no traced
//!   caller), with `code.function`, `tracer.module`, `thread.id`, `tracer.args` and `tracer.retval`,
//!   and with DWARF `code.file.path`, `code.line.number`, `code.param.NAME` and `code.return`
//!   (JSON text).
//! - What a program says about itself (`log` events: its `tracing`/`log` records and `print`s)
//!   becomes an OTLP log record (see [`Spans::log`]), in the trace and span of the innermost call
//!   open on its thread (its process span when none), under its process's resource and a scope
//!   named for its logger; sent to `/v1/logs` through the same queue and exporter as spans.
//!   `usdt` events are events of their process's span.
//! - Each IPC send and receive is a short span (PRODUCER, CONSUMER) under the call it happened in;
//!   a receive's span links to the spans of the sends whose bytes it read (their `flow_id`s), so
//!   links cross processes and, in a collected trace, hosts. For a host whose agent exports its own
//!   spans ([`OtlpConfig::exporting`]) only a `recv link` span is made, per receive of bytes sent
//!   from other hosts: the link the agent could not make.
//!
//! Spans and log records are batched per [`BATCH_SPANS`] (a batch holds one or the other) and
//! handed to one exporter thread through one queue of [`QUEUE_BATCHES`] requests; a batch that
//! finds the queue full is dropped and counted. The exporter retries 429, 502, 503, 504 and
//! connection errors with exponential back-off; a batch that still fails is dropped and counted.
//! Drops are counted apart for spans and log records, and reported on stderr when the trace ends.

use std::{
    collections::{HashMap, VecDeque},
    hash::Hasher as _,
    io,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use prost::Message as _;
use siphasher::sip128::Hasher128 as _;

use crate::{
    analysis::{
        processes,
        slices::{CallEvent, CallTracker, Calls, Ending},
    },
    event::{Event, EventData, TraceEnd, TraceStart, Track, data},
    export::lifecycle_name,
    sink::Sink,
};

/// The Rust types of the vendored OTLP protos (messages only).
#[allow(clippy::all, clippy::pedantic)]
pub mod proto {
    pub mod common {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/opentelemetry.proto.common.v1.rs"));
        }
    }
    pub mod resource {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/opentelemetry.proto.resource.v1.rs"));
        }
    }
    pub mod trace {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/opentelemetry.proto.trace.v1.rs"));
        }
    }
    pub mod logs {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/opentelemetry.proto.logs.v1.rs"));
        }
    }
    pub mod collector {
        pub mod trace {
            pub mod v1 {
                include!(concat!(env!("OUT_DIR"), "/opentelemetry.proto.collector.trace.v1.rs"));
            }
        }
        pub mod logs {
            pub mod v1 {
                include!(concat!(env!("OUT_DIR"), "/opentelemetry.proto.collector.logs.v1.rs"));
            }
        }
    }
}

use proto::{
    collector::{logs::v1::ExportLogsServiceRequest, trace::v1::ExportTraceServiceRequest},
    common::v1::{AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList, any_value},
    logs::v1::{LogRecord, ResourceLogs, ScopeLogs, SeverityNumber},
    resource::v1::Resource,
    trace::v1::{ResourceSpans, ScopeSpans, Span, span},
};

/// Spans (or log records) in one export request.
pub const BATCH_SPANS: usize = 512;
/// Batches waiting for the exporter thread; more are dropped (and counted).
pub const QUEUE_BATCHES: usize = 64;
/// Span events kept on one process span; more are counted in its `dropped_events_count`.
pub const MAX_PROCESS_EVENTS: usize = 1024;
/// How long the end of a trace waits for queued batches to be sent.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(30);
/// Most sends remembered for links from receives yet to come; older ones are forgotten first.
const MAX_REMEMBERED_SENDS: usize = super::MAX_REMEMBERED_SENDS;

/// How the exporter retries.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Attempts per batch, the first included.
    pub attempts: u32,
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// How long one request may take.
    pub timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 6,
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            timeout: Duration::from_secs(10),
        }
    }
}

/// What the exporter sent and lost, counted in spans and in log records.
#[derive(Debug, Default)]
pub struct Counters {
    pub spans_sent: AtomicU64,
    /// Batches that found the queue full.
    pub spans_dropped_queue_full: AtomicU64,
    /// Batches the collector refused, or that failed every attempt.
    pub spans_dropped_export_failed: AtomicU64,
    pub log_records_sent: AtomicU64,
    pub log_records_dropped_queue_full: AtomicU64,
    pub log_records_dropped_export_failed: AtomicU64,
    pub retries: AtomicU64,
    /// Links from receives to sends whose spans were not known when the receive came: the send
    /// came after it (a collected trace whose clocks could not be reconciled) or was forgotten
    /// (older than the last [`MAX_REMEMBERED_SENDS`]).
    pub links_unknown: AtomicU64,
}

/// Which OTLP signal a request carries: it picks the endpoint and the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Signal {
    Traces,
    Logs,
}

impl Counters {
    /// Spans and log records lost, whatever the reason.
    pub fn lost(&self) -> u64 {
        [
            &self.spans_dropped_queue_full,
            &self.spans_dropped_export_failed,
            &self.log_records_dropped_queue_full,
            &self.log_records_dropped_export_failed,
        ]
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .sum()
    }

    fn sent(&self, signal: Signal) -> &AtomicU64 {
        match signal {
            Signal::Traces => &self.spans_sent,
            Signal::Logs => &self.log_records_sent,
        }
    }

    fn dropped_queue_full(&self, signal: Signal) -> &AtomicU64 {
        match signal {
            Signal::Traces => &self.spans_dropped_queue_full,
            Signal::Logs => &self.log_records_dropped_queue_full,
        }
    }

    fn dropped_export_failed(&self, signal: Signal) -> &AtomicU64 {
        match signal {
            Signal::Traces => &self.spans_dropped_export_failed,
            Signal::Logs => &self.log_records_dropped_export_failed,
        }
    }
}

/// One encoded export request in the queue: its signal, its body, and how many spans or log
/// records it holds (for the counters).
struct Request {
    signal: Signal,
    body: Vec<u8>,
    items: u64,
}

/// Where to send, and as whom.
#[derive(Clone, Debug)]
pub struct OtlpConfig {
    /// The collector's base URL (`http://host:4318`), to which `/v1/traces` and `/v1/logs` are
    /// appended, or its traces endpoint (`.../v1/traces`), whose sibling `.../v1/logs` takes the
    /// log records.
    pub url: String,
    /// `service.name` of every resource; `None`: each process's comm.
    pub service_name: Option<String>,
    pub retry: RetryPolicy,
    /// Wait for room in a full queue instead of dropping the batch: for traces read from a file
    /// (`export`, `collect`'s merged trace), where waiting costs nothing; a live recording drops.
    pub wait_when_full: bool,
    /// The key span and trace ids are made with (see [`IdKey`]).
    pub ids: IdKey,
    /// Hosts whose agents send their own spans (`tracer agent --otlp`), by the name the events
    /// give them, with the `host.name` the agent gives its resources: for them only the spans
    /// that only a collector can make are sent (each receive's links to its sends on other hosts).
    pub exporting: HashMap<String, String>,
}

/// Why `--otlp URL` was refused.
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    #[error("'{0}' is not an http:// URL (OTLP/HTTP without TLS is what tracer speaks)")]
    NotHttp(String),
    #[error("'{0}' names no host")]
    NoHost(String),
    #[error(
        "'{0}' names a path that does not end in /v1/traces, so tracer cannot tell where its log records go: give the collector's base URL (http://host:4318) or its traces endpoint (.../v1/traces)"
    )]
    NotSignalPath(String),
}

/// The traces endpoint of a collector URL: `http://h:4318` → `http://h:4318/v1/traces`.
pub fn traces_endpoint(url: &str) -> Result<String, UrlError> {
    endpoint(url, Signal::Traces)
}

/// The logs endpoint of a collector URL, derived as [`traces_endpoint`] is (OTLP/HTTP: a base
/// URL gets `/v1/logs` appended): `http://h:4318` → `http://h:4318/v1/logs`, and a traces
/// endpoint `http://h/otlp/v1/traces` → its sibling `http://h/otlp/v1/logs`.
pub fn logs_endpoint(url: &str) -> Result<String, UrlError> {
    endpoint(url, Signal::Logs)
}

fn endpoint(url: &str, signal: Signal) -> Result<String, UrlError> {
    let rest = url.strip_prefix("http://").ok_or_else(|| UrlError::NotHttp(url.to_string()))?;
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    if authority.is_empty() || authority.contains(['@', ' ', '?', '#']) {
        return Err(UrlError::NoHost(url.to_string()));
    }
    let suffix = match signal {
        Signal::Traces => "v1/traces",
        Signal::Logs => "v1/logs",
    };
    if path.is_empty() {
        return Ok(format!("http://{authority}/{suffix}"));
    }
    let base = path.strip_suffix("v1/traces").filter(|b| b.is_empty() || b.ends_with('/'));
    match base {
        Some(base) => Ok(format!("http://{authority}/{base}{suffix}")),
        None => Err(UrlError::NotSignalPath(url.to_string())),
    }
}

/// A trace's spans, sent to an OTLP/HTTP collector as they end; a [`Sink`].
pub struct OtlpSink {
    tracker: CallTracker,
    spans: Spans,
}

/// The spans being made and sent: everything but the open calls.
struct Spans {
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
    service_name: Option<String>,
    processes: HashMap<(Arc<str>, u32), Process>,
    /// The span ids of the open calls of each track, by depth.
    open: HashMap<(Arc<str>, u32, Track), Vec<u64>>,
    /// flow_id → (trace id, span id, host) of the send span.
    sends: HashMap<u64, ([u8; 16], u64, Arc<str>)>,
    send_order: VecDeque<u64>,
    batch: Vec<(BatchKey, Span)>,
    /// Log records waiting for their batch, each with the name of its logger (its scope).
    log_batch: Vec<(BatchKey, Option<String>, LogRecord)>,
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
struct BatchKey {
    host: Arc<str>,
    pid: u32,
    comm: Arc<str>,
}

struct Process {
    trace_id: [u8; 16],
    span_id: u64,
    comm: Arc<str>,
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
    fn current_span(&mut self, host: &Arc<str>, pid: u32, tid: u32, ts: u64) -> ([u8; 16], u64) {
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
    fn enqueue(&mut self, request: Request) {
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

/// What a program said about itself, as OTLP log records.
impl Spans {
    /// A log record for a `log` event, in the span its thread is in (see [`log_record`]).
    fn log(&mut self, e: &Event, log: &data::Log) {
        let (trace_id, span_id) = self.current_span(&e.host, e.pid, e.tid, e.ts);
        let record = log_record(e, log, trace_id, span_id);
        let comm = self.processes.get(&(e.host.clone(), e.pid)).map_or_else(|| Arc::from(""), |p| p.comm.clone());
        self.log_batch.push((BatchKey { host: e.host.clone(), pid: e.pid, comm }, log.source.clone(), record));
        if self.log_batch.len() >= BATCH_SPANS {
            self.send_log_batch();
        }
    }

    fn send_log_batch(&mut self) {
        if self.log_batch.is_empty() {
            return;
        }
        let records = std::mem::take(&mut self.log_batch);
        let items = records.len() as u64;
        let body = self.logs_request(records).encode_to_vec();
        self.enqueue(Request { signal: Signal::Logs, body, items });
    }

    /// One request: a resource per process (the same as its spans'), and under it a scope per
    /// logger (the Logs Bridge API's rule: a logger name is the instrumentation scope's name;
    /// `tracer` for a record without one, such as a `print`).
    fn logs_request(&self, records: Vec<(BatchKey, Option<String>, LogRecord)>) -> ExportLogsServiceRequest {
        /// A process's records, by logger.
        type Scopes = Vec<(Option<String>, Vec<LogRecord>)>;
        let mut by_process: Vec<(BatchKey, Scopes)> = Vec::new();
        for (key, logger, record) in records {
            let i = match by_process.iter().position(|(k, _)| *k == key) {
                Some(i) => i,
                None => {
                    by_process.push((key, Vec::new()));
                    by_process.len() - 1
                }
            };
            let scopes = &mut by_process[i].1;
            match scopes.iter_mut().find(|(l, _)| *l == logger) {
                Some((_, v)) => v.push(record),
                None => scopes.push((logger, vec![record])),
            }
        }
        let resource_logs = by_process
            .into_iter()
            .map(|(key, scopes)| ResourceLogs {
                resource: Some(resource(&key.host, key.pid, &key.comm, self.service_name.as_deref())),
                scope_logs: scopes
                    .into_iter()
                    .map(|(logger, log_records)| ScopeLogs {
                        scope: Some(InstrumentationScope {
                            version: if logger.is_none() { env!("CARGO_PKG_VERSION").into() } else { String::new() },
                            name: logger.unwrap_or_else(|| "tracer".into()),
                            ..Default::default()
                        }),
                        log_records,
                        schema_url: String::new(),
                    })
                    .collect(),
                schema_url: String::new(),
            })
            .collect();
        ExportLogsServiceRequest { resource_logs }
    }
}

/// The OTLP log record of a program's `log` event, in span `span_id` of trace `trace_id`: its
/// time (also its observed time: the probe fired as it was said), severity (the log data model's
/// numbers: TRACE 1, DEBUG 5, INFO 9, WARN 13, ERROR 17, and their names as text), the message as
/// body, and as attributes its structured fields (each field of an object its own attribute,
/// other data as `tracer.data`), where it was said (`code.function`, `code.file.path`,
/// `code.line.number`), `thread.id`, `tracer.log.type` (`log` or `trace`, a `print`), the
/// `tracing` spans it was in (`tracer.log.spans`) and `tracer.truncated` when the payload was cut.
pub fn log_record(e: &Event, log: &data::Log, trace_id: [u8; 16], span_id: u64) -> LogRecord {
    let (number, text) = severity(log.level);
    let mut attributes = Vec::new();
    match &log.data {
        serde_json::Value::Null => {}
        serde_json::Value::Object(fields) => {
            attributes.extend(fields.iter().map(|(k, v)| kv(k, json_value(v))));
        }
        other => attributes.push(kv("tracer.data", json_value(other))),
    }
    if let Some(f) = &log.function {
        attributes.push(string("code.function", f.clone()));
    }
    if let Some(f) = &log.file {
        attributes.push(string("code.file.path", f.clone()));
    }
    if let Some(line) = log.line {
        attributes.push(int("code.line.number", line.into()));
    }
    attributes.push(int("thread.id", e.tid as i64));
    let kind = match log.log_type {
        data::LogType::Log => "log",
        data::LogType::Trace => "trace",
    };
    attributes.push(string("tracer.log.type", kind.into()));
    if !log.spans.is_empty() {
        let spans = log.spans.iter().map(|s| AnyValue { value: Some(any_value::Value::StringValue(s.clone())) });
        let spans = AnyValue { value: Some(any_value::Value::ArrayValue(ArrayValue { values: spans.collect() })) };
        attributes.push(kv("tracer.log.spans", spans));
    }
    if log.truncated {
        attributes.push(kv("tracer.truncated", AnyValue { value: Some(any_value::Value::BoolValue(true)) }));
    }
    LogRecord {
        time_unix_nano: e.ts,
        observed_time_unix_nano: e.ts,
        severity_number: number as i32,
        severity_text: text.into(),
        body: Some(AnyValue { value: Some(any_value::Value::StringValue(log.message.clone())) }),
        attributes,
        trace_id: trace_id.to_vec(),
        span_id: span_id.to_be_bytes().to_vec(),
        ..Default::default()
    }
}

/// A level's severity by the OTel log data model's mapping (the first number of each range).
fn severity(level: data::Level) -> (SeverityNumber, &'static str) {
    match level {
        data::Level::Trace => (SeverityNumber::Trace, "TRACE"),
        data::Level::Debug => (SeverityNumber::Debug, "DEBUG"),
        data::Level::Info => (SeverityNumber::Info, "INFO"),
        data::Level::Warn => (SeverityNumber::Warn, "WARN"),
        data::Level::Error => (SeverityNumber::Error, "ERROR"),
    }
}

/// A JSON value as an OTLP value: numbers that fit an i64 as integers, others as doubles,
/// objects as key-value lists.
fn json_value(v: &serde_json::Value) -> AnyValue {
    use serde_json::Value as J;
    let value = match v {
        J::Null => None,
        J::Bool(b) => Some(any_value::Value::BoolValue(*b)),
        J::Number(n) => Some(match n.as_i64() {
            Some(i) => any_value::Value::IntValue(i),
            None => any_value::Value::DoubleValue(n.as_f64().unwrap_or(f64::NAN)),
        }),
        J::String(s) => Some(any_value::Value::StringValue(s.clone())),
        J::Array(a) => Some(any_value::Value::ArrayValue(ArrayValue { values: a.iter().map(json_value).collect() })),
        J::Object(o) => Some(any_value::Value::KvlistValue(KeyValueList {
            values: o.iter().map(|(k, v)| kv(k, json_value(v))).collect(),
        })),
    };
    AnyValue { value }
}

fn resource(host: &str, pid: u32, comm: &str, service_name: Option<&str>) -> Resource {
    let comm = if comm.is_empty() { format!("pid {pid}") } else { comm.to_string() };
    Resource {
        attributes: vec![
            string("service.name", service_name.map_or_else(|| comm.clone(), str::to_string)),
            string("host.name", host.to_string()),
            int("process.pid", pid as i64),
            string("process.executable.name", comm),
        ],
        ..Default::default()
    }
}

fn channel_kind(c: &data::Channel) -> &'static str {
    match c {
        data::Channel::Tcp { .. } => "tcp",
        data::Channel::Udp { .. } => "udp",
        data::Channel::UnixStream { .. } => "unix_stream",
        data::Channel::UnixDgram { .. } => "unix_dgram",
        data::Channel::Pipe { .. } => "pipe",
        data::Channel::Fifo { .. } => "fifo",
    }
}

fn kv(key: &str, value: AnyValue) -> KeyValue {
    KeyValue { key: key.into(), value: Some(value), ..Default::default() }
}

fn string(key: &str, value: String) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(any_value::Value::StringValue(value)) }),
        ..Default::default()
    }
}

/// OTLP integers are signed: a u64 above `i64::MAX` keeps its bits.
fn int(key: &str, value: i64) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(any_value::Value::IntValue(value)) }),
        ..Default::default()
    }
}

fn ints(key: &str, values: &[u64]) -> KeyValue {
    let values =
        values.iter().map(|v| AnyValue { value: Some(any_value::Value::IntValue(*v as i64)) }).collect::<Vec<_>>();
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(any_value::Value::ArrayValue(ArrayValue { values })) }),
        ..Default::default()
    }
}

/// Where span and trace ids come from: a pure function of a key and the identity of the event
/// a span is made of, so that two programs reading the same events (an agent that exports its
/// host's spans, and the collector that receives the same events and adds the cross-host links)
/// make the same ids. The hash is SipHash-1-3 with a 128-bit key (crate `siphasher`): specified
/// and stable, unlike std's `DefaultHasher`, whose output may change between Rust releases (an
/// agent and its collector may be different builds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdKey {
    /// Each host's key is [`host_key`] of this one and the host's name (the events' `host`):
    /// `record`, `export`, `collect`.
    Run([u8; 16]),
    /// This key for every event: an agent's, chosen by its collector (the collector's [`host_key`]
    /// for the name it gives the host, which the agent does not know).
    Host([u8; 16]),
}

impl IdKey {
    /// A fresh random run key.
    pub fn random() -> IdKey {
        IdKey::Run(random_key())
    }

    fn for_host(&self, host: &str) -> [u8; 16] {
        match self {
            IdKey::Run(key) => host_key(key, host),
            IdKey::Host(key) => *key,
        }
    }
}

/// 16 bytes from the kernel's random source.
pub fn random_key() -> [u8; 16] {
    let mut key = [0; 16];
    getrandom::fill(&mut key).expect("the kernel's random source");
    key
}

/// The ids key of host `host` in a run keyed `run`.
pub fn host_key(run: &[u8; 16], host: &str) -> [u8; 16] {
    let mut h = siphasher::sip128::SipHasher13::new_with_key(run);
    h.write(&[ID_HOST]);
    h.write(host.as_bytes());
    h.finish128().as_bytes()
}

// What an id is of: the first byte hashed, so that no two kinds of span can share an id.
const ID_HOST: u8 = 0;
const ID_TRACE: u8 = 1;
const ID_PROCESS: u8 = 2;
const ID_CALL: u8 = 3;
const ID_ORPHAN_RETURN: u8 = 4;
const ID_SEND: u8 = 5;
const ID_RECV: u8 = 6;
const ID_RECV_LINK: u8 = 7;

/// The ids of one host's spans. Every field is hashed as 8 little-endian bytes after the kind:
/// - trace of a process: (`ID_TRACE`, pid, incarnation): 128 bits; `incarnation` counts the
///   earlier processes of that pid in the trace (their exits), so a reused pid is a new trace;
/// - process span: (`ID_PROCESS`, pid, incarnation);
/// - call span: (`ID_CALL`, pid, track, depth, the call's ts); a return whose call was not seen:
///   (`ID_ORPHAN_RETURN`, pid, track, depth, the return's ts);
/// - send and receive spans: (`ID_SEND` or `ID_RECV`, pid, tid, the event's ts);
/// - the collector's link span of a receive: (`ID_RECV_LINK`, pid, tid, the receive's ts).
///
/// Span ids are the low 64 bits; none is zero (an all-zero id is invalid in OTLP).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostIds {
    key: [u8; 16],
}

impl HostIds {
    pub fn new(key: [u8; 16]) -> HostIds {
        HostIds { key }
    }

    fn hash(&self, kind: u8, fields: &[u64]) -> [u8; 16] {
        let mut h = siphasher::sip128::SipHasher13::new_with_key(&self.key);
        h.write(&[kind]);
        for f in fields {
            h.write(&f.to_le_bytes());
        }
        h.finish128().as_bytes()
    }

    fn span(&self, kind: u8, fields: &[u64]) -> u64 {
        let b = self.hash(kind, fields);
        u64::from_le_bytes(b[..8].try_into().expect("8 bytes")).max(1)
    }

    pub fn trace(&self, pid: u32, incarnation: u32) -> [u8; 16] {
        let mut id = self.hash(ID_TRACE, &[pid.into(), incarnation.into()]);
        if id == [0; 16] {
            id[15] = 1;
        }
        id
    }

    pub fn process(&self, pid: u32, incarnation: u32) -> u64 {
        self.span(ID_PROCESS, &[pid.into(), incarnation.into()])
    }

    pub fn call(&self, pid: u32, track: Track, depth: usize, ts: u64) -> u64 {
        self.span(ID_CALL, &[pid.into(), track_id(track), depth as u64, ts])
    }

    pub fn orphan_return(&self, pid: u32, track: Track, depth: usize, ts: u64) -> u64 {
        self.span(ID_ORPHAN_RETURN, &[pid.into(), track_id(track), depth as u64, ts])
    }

    pub fn send(&self, pid: u32, tid: u32, ts: u64) -> u64 {
        self.span(ID_SEND, &[pid.into(), tid.into(), ts])
    }

    pub fn recv(&self, pid: u32, tid: u32, ts: u64) -> u64 {
        self.span(ID_RECV, &[pid.into(), tid.into(), ts])
    }

    pub fn recv_link(&self, pid: u32, tid: u32, ts: u64) -> u64 {
        self.span(ID_RECV_LINK, &[pid.into(), tid.into(), ts])
    }
}

/// A track as one number: threads below 2^32, goroutines above.
fn track_id(track: Track) -> u64 {
    match track {
        Track::Thread(tid) => tid.into(),
        Track::Goroutine(g) => (1 << 32) | g,
    }
}

/// What one attempt to send a batch came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Sent,
    /// Worth another try: 429, 502, 503, 504, or no answer.
    Retry(String),
    /// The collector refused the batch for good.
    Refused(String),
}

/// Sends requests from the queue until it closes; `endpoints`: traces', logs'.
fn export_loop(
    endpoints: &[String; 2],
    retry: RetryPolicy,
    rx: mpsc::Receiver<Request>,
    counters: &Counters,
    deadline: &OnceLock<Instant>,
) {
    let agent: ureq::Agent =
        ureq::Agent::config_builder().timeout_global(Some(retry.timeout)).http_status_as_error(false).build().into();
    let mut warned = false;
    for Request { signal, body, items } in rx {
        let endpoint = match signal {
            Signal::Traces => &endpoints[0],
            Signal::Logs => &endpoints[1],
        };
        let attempt = || match deadline.get() {
            Some(at) if Instant::now() >= *at => Outcome::Refused(format!(
                "the trace ended {} s ago and the batch was not sent yet",
                DRAIN_DEADLINE.as_secs()
            )),
            _ => post(&agent, endpoint, &body),
        };
        match send_with_retries(&retry, counters, attempt) {
            Ok(()) => {
                counters.sent(signal).fetch_add(items, Ordering::Relaxed);
            }
            Err(why) => {
                counters.dropped_export_failed(signal).fetch_add(items, Ordering::Relaxed);
                if !warned {
                    tracing::warn!("OTLP export to {endpoint} failed: {why}");
                    warned = true;
                }
            }
        }
    }
}

/// Tries `attempt` until it sends, is refused, or the policy's attempts run out, sleeping an
/// exponentially growing back-off between tries.
pub fn send_with_retries(
    policy: &RetryPolicy,
    counters: &Counters,
    mut attempt: impl FnMut() -> Outcome,
) -> Result<(), String> {
    let mut backoff = policy.first_backoff;
    let mut last = String::new();
    for n in 0..policy.attempts.max(1) {
        if n > 0 {
            counters.retries.fetch_add(1, Ordering::Relaxed);
            thread::sleep(backoff);
            backoff = (backoff * 2).min(policy.max_backoff);
        }
        match attempt() {
            Outcome::Sent => return Ok(()),
            Outcome::Refused(why) => return Err(why),
            Outcome::Retry(why) => last = why,
        }
    }
    Err(format!("{last} (after {} attempts)", policy.attempts.max(1)))
}

fn post(agent: &ureq::Agent, endpoint: &str, body: &[u8]) -> Outcome {
    match agent.post(endpoint).header("Content-Type", "application/x-protobuf").send(body) {
        Ok(response) => classify(response.status().as_u16()),
        Err(e) => Outcome::Retry(format!("cannot reach the collector: {e}")),
    }
}

/// OTLP/HTTP's rule: 429, 502, 503 and 504 are retryable, other failures are not.
pub fn classify(status: u16) -> Outcome {
    match status {
        200..=299 => Outcome::Sent,
        429 | 502 | 503 | 504 => Outcome::Retry(format!("the collector answered {status}")),
        _ => Outcome::Refused(format!("the collector answered {status}")),
    }
}

#[cfg(test)]
pub(crate) mod tests;
