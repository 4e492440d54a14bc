//! Rust fixture for program events (`tracer-events`), with exactly known events.
//!
//! - `events_fixture run`: prints `listening 0|1` and `file FILE`, then makes the events below in this order,
//!   printing `line NAME N` with each one's source line: `print` (print), `data` (print_with_data),
//!   `printf` (printf!), `printf_data` (printf_with_data!), `tracing_warn` (in spans outer >
//!   inner, with fields), `tracing_error` (no span, no fields), `log_info` (target app::db, with
//!   key-values), `log_debug`, `long` (a 10,000-byte message), `thread` (print from a second
//!   thread, which prints `thread TID`).
//! - `events_fixture serve`: prints `ready`, then per line on stdin: `state` prints
//!   `listening 0|1`, `emit` prints one event (`served`) and `emitted`, `quit` exits.
//! - `events_fixture bench MODE N`: N calls of MODE (baseline, print, printf, log, tracing, and
//!   tracing_without_layer: a `tracing` subscriber without `TraceLayer`) and `calls N ns T` with
//!   the loop's time.

use std::{hint::black_box, io::BufRead as _, time::Instant};

use serde::Serialize;
use tracing_subscriber::layer::SubscriberExt as _;

#[derive(Serialize)]
struct Batch {
    id: u64,
    tags: Vec<&'static str>,
}

fn install() {
    tracer_events::TraceLogger::init().expect("the only logger");
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(tracer_events::TraceLayer::new()))
        .expect("the only subscriber");
}

fn line(name: &str, line: u32) {
    println!("line {name} {line}");
}

fn run() {
    println!("listening {}", tracer_events::listening() as u8);
    println!("file {}", file!());
    tracer_events::print("plain message");
    line("print", line!() - 1);
    tracer_events::print_with_data(&serde_json::json!({"count": 3, "name": "widget"}), "with data");
    line("data", line!() - 1);
    tracer_events::printf!("formatted {} and {:?}", 42, "x");
    line("printf", line!() - 1);
    tracer_events::printf_with_data!(Batch { id: 7, tags: vec!["a", "b"] }, "batch {} done", 7);
    line("printf_data", line!() - 1);
    {
        let outer = tracing::info_span!("outer", request = 1);
        let _outer = outer.enter();
        let inner = tracing::debug_span!("inner");
        let _inner = inner.enter();
        tracing::warn!(bytes = 512u64, peer = "10.0.0.2", ok = true, delta = -3i64, "slow client {}", 9);
        line("tracing_warn", line!() - 1);
    }
    tracing::error!("no fields");
    line("tracing_error", line!() - 1);
    log::info!(target: "app::db", user = "ada", attempts = 3; "logged in");
    line("log_info", line!() - 1);
    log::debug!("debug from log");
    line("log_debug", line!() - 1);
    tracer_events::print(&"x".repeat(10_000));
    line("long", line!() - 1);
    let tid = std::thread::spawn(|| {
        tracer_events::print("from thread");
        // SAFETY: gettid has no preconditions.
        unsafe { libc::gettid() }
    })
    .join()
    .unwrap();
    line("thread", line!() - 6);
    println!("thread {tid}");
}

fn serve() {
    println!("ready");
    for command in std::io::stdin().lock().lines() {
        match command.expect("stdin").trim() {
            "state" => println!("listening {}", tracer_events::listening() as u8),
            "emit" => {
                tracer_events::print("served");
                println!("emitted");
            }
            "quit" => return,
            other => panic!("unknown command {other}"),
        }
    }
}

fn bench(mode: &str, n: u64) {
    let start = Instant::now();
    // Every mode makes the same opaque value per iteration; the baseline makes only that.
    match mode {
        "baseline" => (0..n).for_each(|i| {
            black_box(i);
        }),
        "print" => (0..n).for_each(|i| {
            black_box(i);
            tracer_events::print("a message");
        }),
        "printf" => (0..n).for_each(|i| {
            let i = black_box(i);
            tracer_events::printf!("value {}", i);
        }),
        "log" => (0..n).for_each(|i| {
            let i = black_box(i);
            log::info!("value {}", i);
        }),
        "tracing" | "tracing_without_layer" => (0..n).for_each(|i| {
            let i = black_box(i);
            tracing::info!(i, "value");
        }),
        other => panic!("unknown bench mode {other}"),
    }
    println!("calls {n} ns {}", start.elapsed().as_nanos());
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(2).map(String::as_str) == Some("tracing_without_layer") {
        // What `tracing` costs with a subscriber but no layer: the reference for `TraceLayer`.
        tracing::subscriber::set_global_default(tracing_subscriber::registry()).expect("the only subscriber");
    } else {
        install();
    }
    match args.get(1).map(String::as_str) {
        Some("run") | None => run(),
        Some("serve") => serve(),
        Some("bench") => bench(&args[2], args[3].parse().expect("a count")),
        Some(other) => panic!("unknown mode {other}"),
    }
}
