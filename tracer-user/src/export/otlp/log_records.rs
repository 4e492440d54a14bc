//! What a program says about itself (`log` events) as OTLP log records.

use std::sync::Arc;

use prost::Message as _;

use super::{
    BATCH_SPANS,
    attributes::{int, json_value, kv, resource, string},
    proto::{
        collector::logs::v1::ExportLogsServiceRequest,
        common::v1::{AnyValue, ArrayValue, InstrumentationScope, any_value},
        logs::v1::{LogRecord, ResourceLogs, ScopeLogs, SeverityNumber},
    },
    sink::{BatchKey, Spans},
    transport::{Request, Signal},
};
use crate::event::{Event, data};

/// What a program said about itself, as OTLP log records.
impl Spans {
    /// A log record for a `log` event, in the span its thread is in (see [`log_record`]).
    pub(super) fn log(&mut self, e: &Event, log: &data::Log) {
        let (trace_id, span_id) = self.current_span(&e.host, e.pid, e.tid, e.ts);
        let record = log_record(e, log, trace_id, span_id);
        let comm = self.processes.get(&(e.host.clone(), e.pid)).map_or_else(|| Arc::from(""), |p| p.comm.clone());
        self.log_batch.push((BatchKey { host: e.host.clone(), pid: e.pid, comm }, log.source.clone(), record));
        if self.log_batch.len() >= BATCH_SPANS {
            self.send_log_batch();
        }
    }

    pub(super) fn send_log_batch(&mut self) {
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
