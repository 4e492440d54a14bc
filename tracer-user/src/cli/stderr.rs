//! What reaches stderr from the library. The library never prints: it emits `tracing` events, and
//! this subscriber writes each of the tracer's own as one line (the lines users and tests read):
//! `tracer: MESSAGE`, with `warning: ` or `error: ` before the message at those levels; or, for the
//! parts that name themselves with a target of their own (`tracer agent`, `tracer collect`),
//! `TARGET: MESSAGE` as they word it. Debug and trace events, and other crates' events, are not shown.
//!
//! The CLI's own lines take the same shape through [`info`], [`warning`] and [`error`]. Every
//! message passes through [`escape_controls`] on its way out: it may name a traced program's
//! functions, a file, or what an agent sent, and a terminal must show those, not act on them. On a
//! terminal the labels are coloured (warning yellow, error red); `anstream` leaves the colour out
//! when stderr is not a terminal or `NO_COLOR` is set.

use std::{
    fmt::{self, Display, Write as _},
    io::Write as _,
};

use anstyle::{AnsiColor, Style};

use tracer_user::printable::escape_controls;

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
        let mut prefix = String::new();
        if target.contains("::") || target == "tracer_user" {
            // A module path: the line is the tracer's, its level said.
            prefix.push_str("tracer: ");
            match *meta.level() {
                Level::ERROR => prefix.push_str(&label(ERROR, "error: ")),
                Level::WARN => prefix.push_str(&label(WARNING, "warning: ")),
                _ => {}
            }
        } else {
            prefix.push_str(target);
            prefix.push_str(": ");
        }
        let mut message = String::new();
        event.record(&mut Message(&mut message));
        write_line(&prefix, &message);
    }
}

const WARNING: Style = AnsiColor::Yellow.on_default().bold();
const ERROR: Style = AnsiColor::Red.on_default().bold();

fn label(style: Style, text: &str) -> String {
    format!("{style}{text}{style:#}")
}

/// `tracer: MESSAGE` on stderr.
pub fn info(message: impl Display) {
    write_line("tracer: ", &message.to_string());
}

/// `tracer: warning: MESSAGE` on stderr.
pub fn warning(message: impl Display) {
    write_line(&format!("tracer: {}", label(WARNING, "warning: ")), &message.to_string());
}

/// `tracer: error: MESSAGE` on stderr.
pub fn error(message: impl Display) {
    write_line(&format!("tracer: {}", label(ERROR, "error: ")), &message.to_string());
}

/// Writes `prefix`, `message` (its control characters shown, not acted on) and a newline in one
/// write, so that lines from several threads do not interleave; a status line on the terminal is
/// erased first (see `cli::status`), outside `anstream`, which would strip that escape along with
/// colours.
fn write_line(prefix: &str, message: &str) {
    let line = format!("{prefix}{}\n", escape_controls(message));
    let _ = std::io::stderr().lock().write_all(super::status::erase().as_bytes());
    let _ = anstream::stderr().lock().write_all(line.as_bytes());
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
