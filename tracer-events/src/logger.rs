//! `log` records as trace events.

use log::kv::{self, VisitSource};
use serde_json::{Map, Value};

use crate::{
    emit, listening, message,
    payload::{Kind, Level, Payload},
};

/// A [`log::Log`] that adds every record to the trace while a tracer listens: its level, target
/// (as source), message, module path (as function), file and line, and its key-values as data.
/// When nobody listens, [`log::Log::enabled`] is false and a record costs a semaphore check.
///
/// ```
/// tracer_events::TraceLogger::init().expect("no other logger is installed");
/// log::info!(user = "ada", attempts = 3; "logged in");
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct TraceLogger {
    _private: (),
}

static LOGGER: TraceLogger = TraceLogger { _private: () };

impl TraceLogger {
    pub fn new() -> TraceLogger {
        TraceLogger::default()
    }

    /// Installs the logger as `log`'s (which allows one per program) and lets every level through.
    pub fn init() -> Result<(), log::SetLoggerError> {
        log::set_logger(&LOGGER)?;
        log::set_max_level(log::LevelFilter::Trace);
        Ok(())
    }
}

fn level(level: log::Level) -> Level {
    match level {
        log::Level::Trace => Level::Trace,
        log::Level::Debug => Level::Debug,
        log::Level::Info => Level::Info,
        log::Level::Warn => Level::Warn,
        log::Level::Error => Level::Error,
    }
}

/// A key-value's JSON: numbers and booleans as themselves, anything else as its text.
fn json(value: &kv::Value<'_>) -> Value {
    if let Some(b) = value.to_bool() {
        Value::Bool(b)
    } else if let Some(n) = value.to_i64() {
        n.into()
    } else if let Some(n) = value.to_u64() {
        n.into()
    } else if let Some(n) = value.to_f64() {
        serde_json::Number::from_f64(n).map_or(Value::Null, Value::Number)
    } else {
        Value::String(value.to_string())
    }
}

struct Pairs(Map<String, Value>);

impl<'kvs> VisitSource<'kvs> for Pairs {
    fn visit_pair(&mut self, key: kv::Key<'kvs>, value: kv::Value<'kvs>) -> Result<(), kv::Error> {
        self.0.insert(key.as_str().to_string(), json(&value));
        Ok(())
    }
}

impl log::Log for TraceLogger {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        listening()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !listening() {
            return;
        }
        let mut pairs = Pairs(Map::new());
        // A source that fails half-way still gives the pairs it visited.
        let _ = record.key_values().visit(&mut pairs);
        let data = if pairs.0.is_empty() { String::new() } else { Value::Object(pairs.0).to_string() };
        emit(&Payload {
            kind: Some(Kind::Log),
            level: Some(level(record.level())),
            source: record.target(),
            function: record.module_path().unwrap_or_default(),
            file: record.file().unwrap_or_default(),
            line: record.line().unwrap_or(0),
            spans: &[],
            message: &message(*record.args()),
            data: &data,
        });
    }

    fn flush(&self) {}
}
