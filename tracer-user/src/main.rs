use std::process::ExitCode;

use clap::Parser as _;
use tracer_user::cli::{Cli, run};

/// Prints the library's `tracing` events on stderr as `tracer: MESSAGE`, or `TARGET: MESSAGE` for
/// the parts that name themselves (`tracer agent`, `tracer collect`): the library never prints.
struct Stderr;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Stderr {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                if field.name() == "message" {
                    self.0 = value.to_string();
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        let target = event.metadata().target();
        let prefix = if target.starts_with("tracer") && !target.contains("::") { target } else { "tracer" };
        eprintln!("{prefix}: {}", message.0);
    }
}

fn main() -> ExitCode {
    use tracing_subscriber::layer::SubscriberExt as _;
    // Set before anything runs: a failure here means a subscriber is set already, which is fine.
    let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Stderr));
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("tracer: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
