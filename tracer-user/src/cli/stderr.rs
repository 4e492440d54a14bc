//! What reaches stderr from the library. The library never prints: it emits `tracing` events, and
//! this subscriber writes each of the tracer's own as one line (the lines users and tests read):
//! `tracer: MESSAGE`, with `warning: ` or `error: ` before the message at those levels; or, for the
//! parts that name themselves with a target of their own (`tracer agent`, `tracer collect`),
//! `TARGET: MESSAGE` as they word it. Debug and trace events, and other crates' events, are not shown.

use std::{
    fmt::{self, Write as _},
    io::Write as _,
};

use tracing::{
    Event, Level, Subscriber,
    field::{Field, Visit},
};
use tracing_subscriber::{
    Layer,
    layer::{Context, SubscriberExt as _},
    registry::Registry,
    util::SubscriberInitExt as _,
};

/// Installs the subscriber for the whole process (once; later calls do nothing).
pub fn install() {
    let _ = Registry::default().with(Stderr).try_init();
}

struct Stderr;

impl<S: Subscriber> Layer<S> for Stderr {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        let target = meta.target();
        if !target.starts_with("tracer") || *meta.level() > Level::INFO {
            return;
        }
        let mut line = String::new();
        if target.contains("::") || target == "tracer_user" {
            // A module path: the line is the tracer's, its level said.
            line.push_str("tracer: ");
            match *meta.level() {
                Level::ERROR => line.push_str("error: "),
                Level::WARN => line.push_str("warning: "),
                _ => {}
            }
        } else {
            line.push_str(target);
            line.push_str(": ");
        }
        event.record(&mut Message(&mut line));
        line.push('\n');
        // One write per line, so lines from several threads do not interleave.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}

/// Appends the event's `message` field (its format string, formatted); other fields are not shown.
struct Message<'a>(&'a mut String);

impl Visit for Message<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        }
    }
}
