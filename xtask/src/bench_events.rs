//! `cargo xtask bench --only events`: what a program event costs the program, untraced and traced.
//!
//! The Rust fixture (`tests/src/bin/events_fixture.rs`, `bench MODE N`) times N calls of one entry
//! point in a loop; each mode is measured next to the same loop making no event (`baseline`), in
//! the same command, and the difference per call is the cost. Untraced, a call is the semaphore
//! check; traced (under `tracer debug-usdt`, which decodes and writes every record), it is the
//! formatting, the probe and the tracer's copy. A `<sys/sdt.h>` probe (a 1-byte nop, which the
//! kernel can only trap on) is measured the same way, for comparison with the 5-byte nop that
//! `tracer-events` probes on.

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result, bail};

use crate::{
    bench::{RUNS, Sample, fixture, measure},
    cargo, root, run_checked,
};

/// Calls per untraced run: enough for a few nanoseconds each to stand out of the noise.
const UNTRACED_CALLS: u64 = 20_000_000;
/// Calls per traced run (each writes a record).
const TRACED_CALLS: u64 = 100_000;
const MODES: [(&str, &str); 4] = [
    ("print", "`tracer_events::print`"),
    ("printf", "`tracer_events::printf!` (one integer)"),
    ("log", "`log::info!` through `TraceLogger`"),
    ("tracing", "`tracing::info!` (one field) through `TraceLayer`"),
];

fn per_call_ns(sample: &Sample, base: &Sample, calls: u64) -> f64 {
    (sample.loop_ns as f64 - base.loop_ns as f64) / calls as f64
}

/// Checks the last traced run's records: as many as calls, none lost.
fn check_records(path: &Path, calls: u64) -> Result<()> {
    let text = std::fs::read_to_string(path)?;
    let end: serde_json::Value = serde_json::from_str(text.lines().last().context("no records written")?)?;
    let lost: u64 = end["lost"].as_object().context("no lost counts")?.values().filter_map(|v| v.as_u64()).sum();
    if end["records"].as_u64() != Some(calls) || lost != 0 {
        bail!("the traced run recorded {} of {calls} events ({lost} lost)", end["records"]);
    }
    Ok(())
}

pub fn run(tracer: &Path) -> Result<()> {
    run_checked(&mut cargo(&["build", "--quiet", "--release", "-p", "tracer-tests", "--bin", "events_fixture"]))?;
    let events = root().join("target/release/events_fixture");
    let sdt = fixture("sdt_probes_o2")?;
    let out = root().join("target/bench/events.jsonl");
    std::fs::create_dir_all(out.parent().expect("a directory"))?;
    let untraced = |program: &Path, args: Vec<String>| {
        let program = program.to_path_buf();
        move || {
            let mut c = Command::new(&program);
            c.args(&args);
            c
        }
    };
    let traced = |program: &Path, usdt: Option<&str>, args: Vec<String>| {
        let (program, out, tracer, usdt) =
            (program.to_path_buf(), out.clone(), tracer.to_path_buf(), usdt.map(str::to_string));
        move || {
            let mut c = Command::new(&tracer);
            c.arg("debug-usdt").arg("-o").arg(&out);
            if let Some(pattern) = &usdt {
                c.args(["-u", pattern]);
            }
            c.arg("--").arg(&program).args(&args);
            c
        }
    };
    let bench_args = |mode: &str, n: u64| vec!["bench".to_string(), mode.to_string(), n.to_string()];

    println!(
        "xtask: {RUNS} runs of each; program events of tests/src/bin/events_fixture.rs, each loop against an empty one"
    );
    let base = measure("events_fixture baseline", untraced(&events, bench_args("baseline", UNTRACED_CALLS)))?;
    let base_traced = measure("events_fixture baseline", untraced(&events, bench_args("baseline", TRACED_CALLS)))?;
    let mut rows = Vec::new();
    for (mode, what) in MODES {
        let idle = measure(mode, untraced(&events, bench_args(mode, UNTRACED_CALLS)))?;
        let busy = measure(mode, traced(&events, None, bench_args(mode, TRACED_CALLS)))?;
        check_records(&out, TRACED_CALLS)?;
        rows.push((what, per_call_ns(&idle, &base, UNTRACED_CALLS), per_call_ns(&busy, &base_traced, TRACED_CALLS)));
    }
    let sdt_args = |n: u64| vec!["bench".to_string(), n.to_string()];
    let sdt_idle = measure("sdt_probes bench", untraced(&sdt, sdt_args(TRACED_CALLS)))?;
    let sdt_busy = measure("sdt_probes bench", traced(&sdt, Some("fixture:gated"), sdt_args(TRACED_CALLS)))?;
    check_records(&out, TRACED_CALLS)?;

    println!();
    println!("| call | untraced, per call | traced, per call |");
    println!("|---|---|---|");
    for (what, idle, busy) in rows {
        println!("| {what} | {idle:.1} ns | {:.2} µs |", busy / 1e3);
    }
    println!(
        "| `<sys/sdt.h>` probe with a semaphore (1-byte nop: a trap) | (the semaphore check) | {:.2} µs |",
        per_call_ns(&sdt_busy, &sdt_idle, TRACED_CALLS) / 1e3
    );
    println!("| the empty loop itself ({UNTRACED_CALLS} iterations) | {:.1} ms | |", base.loop_ns as f64 / 1e6);
    Ok(())
}
