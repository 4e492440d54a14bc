//! `cargo xtask bench`: what tracing costs, measured, never assumed.
//!
//! Every number is the median of several runs, next to a baseline measured in the same command
//! (these machines are shared and noisy): the fixture untraced, and bpftrace where installed.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{cargo, root};

/// Calls of the benchmarked function per run.
const CALLS: u64 = 1_000_000;
/// Runs per measurement; the median is reported.
const RUNS: usize = 5;

/// Path of a fixture built by the tests crate (the same build the tests use).
pub fn fixture(name: &str) -> Result<PathBuf> {
    let out = cargo(&["run", "--quiet", "--release", "-p", "tracer-tests", "--bin", "fixture_path", "--", name])
        .stderr(Stdio::inherit())
        .output()
        .context("cannot build the fixtures")?;
    if !out.status.success() {
        bail!("building the fixtures failed");
    }
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

fn median<T: Ord + Copy>(mut samples: Vec<T>) -> T {
    samples.sort();
    samples[samples.len() / 2]
}

/// One measured configuration: medians over `RUNS` runs.
struct Sample {
    /// Wall time of the whole command.
    wall: Duration,
    /// The benchmark loop's own time, as the fixture printed it.
    loop_ns: u64,
}

/// Runs `make()` `RUNS` times; the fixture's `calls N ns T` line is read from its standard output.
fn measure(what: &str, mut make: impl FnMut() -> Command) -> Result<Sample> {
    let (mut walls, mut loops) = (Vec::with_capacity(RUNS), Vec::with_capacity(RUNS));
    for _ in 0..RUNS {
        let mut cmd = make();
        cmd.stdout(Stdio::piped()).stderr(Stdio::null());
        let start = Instant::now();
        let out = cmd.output().with_context(|| format!("cannot run {what}"))?;
        walls.push(start.elapsed());
        if !out.status.success() {
            bail!("{what} failed ({})", out.status);
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let ns = stdout
            .lines()
            .find_map(|l| l.strip_prefix("calls ").and_then(|rest| rest.split(" ns ").nth(1)))
            .and_then(|ns| ns.trim().parse().ok())
            .with_context(|| format!("{what} printed no loop time: {stdout}"))?;
        loops.push(ns);
    }
    Ok(Sample { wall: median(walls), loop_ns: median(loops) })
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

/// Nanoseconds per call that tracing added to the traced program's own loop.
fn per_call_ns(traced: &Sample, base: &Sample) -> f64 {
    (traced.loop_ns as f64 - base.loop_ns as f64) / CALLS as f64
}

fn has_bpftrace() -> bool {
    Command::new("bpftrace")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Reads the lost-event total and event count from a JSON lines trace's last line.
fn trace_end(path: &Path) -> Result<(u64, u64)> {
    let text = std::fs::read_to_string(path)?;
    let last = text.lines().last().context("empty trace")?;
    let end: serde_json::Value = serde_json::from_str(last)?;
    let lost = end["lost_events"].as_object().context("no lost_events")?.values().filter_map(|v| v.as_u64()).sum();
    Ok((lost, end["events_written"].as_u64().unwrap_or(0)))
}

/// The parts of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    /// What tracing costs the traced program (root).
    Overhead,
    /// How fast the exporters and `tracer report` read a 10-million-event trace.
    Export,
    /// How fast a collector takes events from agents, and merges them (root).
    Cluster,
}

pub fn run(tracer: &Path, only: Option<Part>) -> Result<()> {
    let wanted = |part| only.is_none_or(|o| o == part);
    if wanted(Part::Overhead) {
        overhead(tracer)?;
    }
    if wanted(Part::Export) {
        crate::bench_export::run(tracer)?;
    }
    if wanted(Part::Cluster) {
        crate::bench_cluster::run(tracer)?;
    }
    Ok(())
}

fn overhead(tracer: &Path) -> Result<()> {
    let bench = fixture("bench")?;
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let out = dir.join("bench.jsonl");

    println!("xtask: {RUNS} runs of each; {CALLS} calls of a 5-byte-nop-entry function (tests/fixtures/c/bench.c)");
    let untraced = |n: u64| {
        let bench = bench.clone();
        move || {
            let mut c = Command::new(&bench);
            c.arg(n.to_string());
            c
        }
    };
    let traced = |n: u64| {
        let (bench, out, tracer) = (bench.clone(), out.clone(), tracer.to_path_buf());
        move || {
            let mut c = Command::new(&tracer);
            c.args(["record", "-f", "work", "-o"]).arg(&out).arg("--").arg(&bench).arg(n.to_string());
            c
        }
    };
    let base = measure("bench", untraced(CALLS))?;
    let base_0 = measure("bench 0", untraced(0))?;
    let ours_0 = measure("tracer on bench 0", traced(0))?;
    let ours = measure("tracer on bench", traced(CALLS))?;
    let (lost, events) = trace_end(&out)?;
    let ours_per_call = per_call_ns(&ours, &base);

    println!();
    println!("| measurement | median |");
    println!("|---|---|");
    println!("| untraced: the loop of {CALLS} calls | {:.1} ms |", base.loop_ns as f64 / 1e6);
    println!("| traced by tracer (call + return to JSON lines): the loop | {:.1} ms |", ours.loop_ns as f64 / 1e6);
    println!("| **tracer overhead per call** (call + return) | **{ours_per_call:.0} ns** |");
    println!("| tracer, whole run until the trace is written | {} |", ms(ours.wall));
    println!(
        "| tracer start-up and shutdown (0 calls traced, minus untraced) | {} |",
        ms(ours_0.wall.saturating_sub(base_0.wall))
    );
    println!("| events written / lost (last run) | {events} / {lost} |");

    if has_bpftrace() {
        let bpftrace = |returns: bool| {
            let bench = bench.clone();
            move || {
                let mut script = format!("uprobe:{}:work {{ @calls = count(); }}", bench.display());
                if returns {
                    script.push_str(&format!(" uretprobe:{}:work {{ @returns = count(); }}", bench.display()));
                }
                let mut c = Command::new("bpftrace");
                c.args(["-e", &script, "-c", &format!("{} {CALLS}", bench.display())]);
                c
            }
        };
        let entry = per_call_ns(&measure("bpftrace", bpftrace(false))?, &base);
        let both = per_call_ns(&measure("bpftrace", bpftrace(true))?, &base);
        println!("| bpftrace `count()` on uprobe only, per call | {entry:.0} ns |");
        println!("| bpftrace `count()` on uprobe + uretprobe, per call | {both:.0} ns |");
        println!("| **tracer / bpftrace** (both uprobe + uretprobe), per call | **{:.2}** |", ours_per_call / both);
    } else {
        println!("| bpftrace | not installed (apt-get install bpftrace) |");
    }
    if lost > 0 {
        println!("\nxtask: warning: the traced run lost {lost} events");
    }
    go_overhead(tracer)
}

/// Calls of the Go benchmark function per run: its probes trap (an ordinary instruction at the
/// entry, a `ret`), so a million would take half a minute.
const GO_CALLS: u64 = 20_000;

/// What a Go call costs traced: an entry probe after the stack check and a probe on its `ret`,
/// both ordinary uprobes (no uretprobe in Go code).
fn go_overhead(tracer: &Path) -> Result<()> {
    let gofixture = fixture("gofixture")?;
    let out = root().join("target/bench/go.jsonl");
    println!();
    println!("xtask: {RUNS} runs of each; {GO_CALLS} calls of a Go function (`gofixture bench`, tests/fixtures/go)");
    let run = |traced: bool| {
        let (gofixture, out, tracer) = (gofixture.clone(), out.clone(), tracer.to_path_buf());
        move || {
            let mut c = if traced {
                let mut c = Command::new(&tracer);
                c.args(["record", "-e", "call,return", "-f", "main.tiny", "-o"]).arg(&out).arg("--").arg(&gofixture);
                c
            } else {
                Command::new(&gofixture)
            };
            c.args(["bench", &GO_CALLS.to_string()]);
            c
        }
    };
    let base = measure("gofixture bench", run(false))?;
    let ours = measure("tracer on gofixture bench", run(true))?;
    let (lost, events) = trace_end(&out)?;
    println!();
    println!("| Go measurement | median |");
    println!("|---|---|");
    println!("| untraced: the loop of {GO_CALLS} calls | {:.2} ms |", base.loop_ns as f64 / 1e6);
    println!("| traced by tracer (call + return to JSON lines): the loop | {:.1} ms |", ours.loop_ns as f64 / 1e6);
    println!(
        "| **tracer overhead per Go call** (entry + `ret` uprobe, both trapping) | **{:.1} µs** |",
        (ours.loop_ns as f64 - base.loop_ns as f64) / GO_CALLS as f64 / 1e3
    );
    println!("| events written / lost (last run) | {events} / {lost} |");
    Ok(())
}
