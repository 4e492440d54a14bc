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
//!   becomes an OTLP log record (see [`log_record`]), in the trace and span of the innermost call
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

mod attributes;
mod ids;
mod log_records;
mod sink;
mod transport;

use std::{collections::HashMap, time::Duration};

pub use ids::{HostIds, IdKey, host_key, random_key};
pub use log_records::log_record;
pub use sink::OtlpSink;
pub use transport::{
    Counters, Outcome, RetryPolicy, SendError, UrlError, classify, logs_endpoint, send_with_retries, traces_endpoint,
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

#[cfg(test)]
pub(crate) mod tests;
