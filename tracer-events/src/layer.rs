//! `tracing` events as trace events.

use std::fmt;

use serde_json::{Map, Value};
use tracing_core::{
    Event, Subscriber,
    field::{Field, Visit},
};
use tracing_subscriber::{layer::Context, registry::LookupSpan};

use crate::{
    emit, listening,
    payload::{Kind, Level, Payload},
};

/// A [`tracing_subscriber::Layer`] that adds every `tracing` event to the trace while a tracer
/// listens: its level, target (as source), message, module path (as function), file and line, its
/// other fields as data, and the names of the spans it happened in.
///
/// It never filters events for the other layers of the subscriber: when nobody listens, it only
/// checks the semaphore, and an event that no other layer wants costs what `tracing` itself costs.
///
/// ```
/// use tracing_subscriber::layer::SubscriberExt as _;
///
/// let subscriber = tracing_subscriber::registry().with(tracer_events::TraceLayer::new());
/// tracing::subscriber::with_default(subscriber, || {
///     let span = tracing::info_span!("request", id = 7);
///     let _entered = span.enter();
///     tracing::warn!(bytes = 512, peer = "10.0.0.2", "slow client");
/// });
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct TraceLayer {
    _private: (),
}

impl TraceLayer {
    pub fn new() -> TraceLayer {
        TraceLayer::default()
    }
}

fn level(level: &tracing_core::Level) -> Level {
    match *level {
        tracing_core::Level::TRACE => Level::Trace,
        tracing_core::Level::DEBUG => Level::Debug,
        tracing_core::Level::INFO => Level::Info,
        tracing_core::Level::WARN => Level::Warn,
        tracing_core::Level::ERROR => Level::Error,
    }
}

/// Collects an event's message and its other fields as JSON values.
#[derive(Default)]
struct Fields {
    message: String,
    data: Map<String, Value>,
}

impl Fields {
    fn insert(&mut self, field: &Field, value: Value) {
        self.data.insert(field.name().to_string(), value);
    }
}

impl Visit for Fields {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.insert(field, serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.insert(field, value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.insert(field, value.into());
    }
    fn record_i128(&mut self, field: &Field, value: i128) {
        self.insert(field, i64::try_from(value).map_or_else(|_| value.to_string().into(), Value::from));
    }
    fn record_u128(&mut self, field: &Field, value: u128) {
        self.insert(field, u64::try_from(value).map_or_else(|_| value.to_string().into(), Value::from));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.insert(field, value.into());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.insert(field, value.into());
        }
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.insert(field, value.to_string().into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            // The message is `format_args!`, whose Debug is its text.
            self.message = format!("{value:?}");
        } else {
            self.insert(field, format!("{value:?}").into());
        }
    }
}

impl<S> tracing_subscriber::Layer<S> for TraceLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        if !listening() {
            return;
        }
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let spans: Vec<&str> =
            ctx.event_scope(event).map(|scope| scope.from_root().map(|span| span.name()).collect()).unwrap_or_default();
        let data = if fields.data.is_empty() { String::new() } else { Value::Object(fields.data).to_string() };
        emit(&Payload {
            kind: Some(Kind::Log),
            level: Some(level(meta.level())),
            source: meta.target(),
            function: meta.module_path().unwrap_or_default(),
            file: meta.file().unwrap_or_default(),
            line: meta.line().unwrap_or(0),
            spans: &spans,
            message: &fields.message,
            data: &data,
        });
    }
}
