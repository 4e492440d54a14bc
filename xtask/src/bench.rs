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

/// Calls of the benchmarked function per run (a trapping probe costs about 30 µs a call, so the
/// slow builds take 6 s a run).
const CALLS: u64 = 200_000;
/// Runs per measurement; the median is reported.
pub(crate) const RUNS: usize = 5;
/// The ratios to bpftrace: calls per run and runs, more than the rows above take, because the
/// ratio is the goal (issue 26: 1.10x) and five runs of 200,000 calls here spread over more than
/// the distance to it (1.08x to 1.30x between two quiet runs).
const RATIO_CALLS: u64 = 1_000_000;
const RATIO_RUNS: usize = 9;

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

/// The median of `samples` (the upper one of an even count); every bench reports these.
pub(crate) fn median<T: PartialOrd + Copy>(mut samples: Vec<T>) -> T {
    samples.sort_by(|a, b| a.partial_cmp(b).expect("no NaN among the samples"));
    samples[samples.len() / 2]
}

/// One measured configuration: medians over `RUNS` runs.
pub(crate) struct Sample {
    /// Wall time of the whole command.
    pub(crate) wall: Duration,
    /// The benchmark loop's own time, as the fixture printed it.
    pub(crate) loop_ns: u64,
}

/// Runs `make()` `RUNS` times; the fixture's `calls N ns T` line is read from its standard output.
pub(crate) fn measure(what: &str, mut make: impl FnMut() -> Command) -> Result<Sample> {
    let mut samples = measure_alternating(&mut [(what, &mut make)])?;
    Ok(samples.remove(0))
}

/// Runs each of `configs` `RUNS` times, taking turns (one run of each, then the next round), so
/// that the machine's load, which changes by the minute here, weighs on each alike: a ratio of
/// two of them is then fair even where their medians are not those of a quiet machine.
pub(crate) fn measure_alternating(configs: &mut [(&str, &mut dyn FnMut() -> Command)]) -> Result<Vec<Sample>> {
    measure_alternating_n(configs, RUNS)
}

/// As [`measure_alternating`], `rounds` times.
fn measure_alternating_n(configs: &mut [(&str, &mut dyn FnMut() -> Command)], rounds: usize) -> Result<Vec<Sample>> {
    let mut runs = vec![(Vec::with_capacity(rounds), Vec::with_capacity(rounds)); configs.len()];
    for _ in 0..rounds {
        for ((what, make), (walls, loops)) in configs.iter_mut().zip(&mut runs) {
            let (wall, loop_ns) = run_once(what, make())?;
            walls.push(wall);
            loops.push(loop_ns);
        }
    }
    Ok(runs.into_iter().map(|(walls, loops)| Sample { wall: median(walls), loop_ns: median(loops) }).collect())
}

/// One run of `cmd`: its wall time and the loop time the fixture printed (`calls N ns T`), on
/// stdout, or on stderr where the tracer keeps stdout for itself (`top --json`).
fn run_once(what: &str, mut cmd: Command) -> Result<(Duration, u64)> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let start = Instant::now();
    let out = cmd.output().with_context(|| format!("cannot run {what}"))?;
    let wall = start.elapsed();
    if !out.status.success() {
        bail!("{what} failed ({})", out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ns = stdout
        .lines()
        .chain(stderr.lines())
        .find_map(|l| l.strip_prefix("calls ").and_then(|rest| rest.split(" ns ").nth(1)))
        .and_then(|ns| ns.trim().parse().ok())
        .with_context(|| format!("{what} printed no loop time: {stdout}"))?;
    Ok((wall, ns))
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

/// Nanoseconds per call that tracing added to the traced program's own loop of `calls` calls.
pub(crate) fn per_call_ns(traced: &Sample, base: &Sample, calls: u64) -> f64 {
    (traced.loop_ns as f64 - base.loop_ns as f64) / calls as f64
}

pub(crate) fn has_bpftrace() -> bool {
    Command::new("bpftrace")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Reads the lost-event total and event count from a JSON lines trace's last line.
pub(crate) fn trace_end(path: &Path) -> Result<(u64, u64)> {
    let text = std::fs::read_to_string(path)?;
    let last = text.lines().last().context("empty trace")?;
    let end: serde_json::Value = serde_json::from_str(last)?;
    let lost = end["lost_events"].as_object().context("no lost_events")?.values().filter_map(|v| v.as_u64()).sum();
    Ok((lost, end["events_written"].as_u64().unwrap_or(0)))
}

/// The parts of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    /// What tracing costs the traced program (root). In an emulated VM, only the `kernels` rows.
    Overhead,
    /// Start to exit and peak memory of `record` for 1, 100 and 10,000 probes, against
    /// bpftrace; the agent's memory idle and during a trace (root).
    Startup,
    /// The agent's rows of `startup` alone: its memory idle, during a trace and after (root).
    Agent,
    /// What a call costs by attach mechanism on the running kernel (uprobe-multi, perf-event
    /// uprobes), as ratios to bpftrace; small enough for the emulated VMs (root).
    Kernels,
    /// How fast the exporters and `tracer report` read a 10-million-event trace.
    Export,
    /// How fast a collector takes events from agents, and merges them (root).
    Cluster,
    /// What a program event (`tracer-events`) costs, untraced and traced (root).
    Events,
    /// The native trace format against JSON lines and uftrace: bytes an event, `report` time (root).
    Native,
    /// What a traced message costs with and without `--capture-bytes` (root).
    Capture,
    /// What calls at source level cost a call: parameters from registers, a string (root).
    Params,
    /// `tracer export --otlp` to rotel-agent (blackhole exporter) against `export` to JSON lines.
    Otlp,
    /// What a predicate evaluated in the kernel costs a call, against recording every call (root).
    Filters,
}

/// Where the benchmarks run: on this machine, or inside an emulated VM (`bench --kernel`), where
/// every instruction is 10-50 times slower and only the overhead's kernel-dependent rows run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Machine {
    Host,
    Emulated,
}

pub fn run(tracer: &Path, only: Option<Part>, machine: Machine) -> Result<()> {
    let wanted = |part| only.is_none_or(|o| o == part);
    if wanted(Part::Overhead) {
        match machine {
            Machine::Host => overhead(tracer)?,
            Machine::Emulated => crate::bench_kernels::run(tracer)?,
        }
    }
    if wanted(Part::Startup) {
        crate::bench_startup::run(tracer)?;
    }
    if only == Some(Part::Agent) {
        crate::bench_startup::run_agent(tracer)?;
    }
    if only == Some(Part::Kernels) {
        crate::bench_kernels::run(tracer)?;
    }
    if wanted(Part::Export) {
        crate::bench_export::run(tracer)?;
    }
    if wanted(Part::Cluster) {
        crate::bench_cluster::run(tracer)?;
    }
    if wanted(Part::Events) {
        crate::bench_events::run(tracer)?;
    }
    if wanted(Part::Native) {
        crate::bench_native::run_bench(tracer)?;
    }
    if wanted(Part::Capture) {
        capture(tracer)?;
    }
    if wanted(Part::Params) {
        crate::bench_params::run(tracer)?;
    }
    if wanted(Part::Otlp) {
        crate::bench_otlp::run(tracer)?;
    }
    if wanted(Part::Filters) {
        crate::bench_filters::run(tracer)?;
    }
    Ok(())
}

/// Messages per run of the capture benchmark.
const MESSAGES: u64 = 100_000;

/// The cost of a traced message (its send and its receive) by `--capture-bytes`.
fn capture(tracer: &Path) -> Result<()> {
    let ipc = fixture("ipc")?;
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let out = dir.join("capture.jsonl");
    println!(
        "xtask: {RUNS} runs of each; `ipc bench {MESSAGES} SIZE` (tests/fixtures/c/ipc.c): {MESSAGES} writes of SIZE bytes into a Unix socketpair, read SIZE at a time by a child, traced with `tracer record -e ipc --capture-bytes N`"
    );
    println!();
    println!(
        "| message size | untraced, per message | `--capture-bytes` | traced, per message (send + recv) | added by capture |"
    );
    println!("|---|---|---|---|---|");
    for size in [64u64, 4096] {
        let untraced = measure(&format!("ipc bench {size}"), || {
            let mut c = Command::new(&ipc);
            c.args(["bench", &MESSAGES.to_string(), &size.to_string()]);
            c
        })?;
        let base = untraced.loop_ns as f64 / MESSAGES as f64;
        let mut without = None;
        for capture in [0u64, 64, 4096] {
            if capture > size && capture != 4096 {
                continue;
            }
            let sample = measure(&format!("tracer --capture-bytes {capture} on ipc bench {size}"), || {
                let mut c = Command::new(tracer);
                c.args(["record", "-e", "ipc", "--capture-bytes", &capture.to_string(), "-o"])
                    .arg(&out)
                    .arg("--")
                    .arg(&ipc)
                    .args(["bench", &MESSAGES.to_string(), &size.to_string()]);
                c
            })?;
            let (lost, events) = trace_end(&out)?;
            if lost != 0 || events < 2 * MESSAGES {
                bail!("the capture benchmark lost events ({lost} lost, {events} written)");
            }
            let per = sample.loop_ns as f64 / MESSAGES as f64 - base;
            let added = match without {
                None => {
                    without = Some(per);
                    "—".to_string()
                }
                Some(w) => format!("{:.0} ns", per - w),
            };
            println!("| {size} B | {base:.0} ns | {capture} | {per:.0} ns | {added} |");
        }
    }
    Ok(())
}

fn overhead(tracer: &Path) -> Result<()> {
    let bench = fixture("bench")?;
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let out = dir.join("bench.jsonl");
    ensure_bpftrace();

    println!(
        "xtask: {RUNS} runs of each; {CALLS} calls of work() (tests/fixtures/c/bench.c), probed by `tracer record -f work -e call,return`"
    );
    let untraced = |exe: PathBuf, n: u64| {
        move || {
            let mut c = Command::new(&exe);
            c.arg(n.to_string());
            c
        }
    };
    let traced_with = |exe: PathBuf, n: u64, extra: &'static [&'static str]| {
        let (out, tracer) = (out.clone(), tracer.to_path_buf());
        move || {
            let mut c = Command::new(&tracer);
            c.args(["record", "-e", "call,return", "-f", "work"])
                .args(extra)
                .arg("-o")
                .arg(&out)
                .arg("--")
                .arg(&exe)
                .arg(n.to_string());
            c
        }
    };
    let traced = |exe: PathBuf, n: u64| traced_with(exe, n, &[]);

    // The four builds of issue 12's table: where the probe goes and which path the kernel takes.
    println!();
    println!("| build of `work()` | entry bytes | probe placed | path | untraced loop | tracer, per call |");
    println!("|---|---|---|---|---|---|");
    let mut ours = None;
    for (name, flags, entry) in [
        ("bench", "`-pg -mfentry -mnop-mcount`, no CET", "`nopl 0x0(%rax,%rax,1)`"),
        ("bench_cet", "same with `-fcf-protection=full`", "`endbr64`, then the same nop"),
        ("bench_plain", "plain `-O2`", "`lea`"),
        ("bench_pfe5", "`-fpatchable-function-entry=5`", "five one-byte `nop`s"),
    ] {
        let exe = fixture(name)?;
        let base = measure(name, untraced(exe.clone(), CALLS))?;
        let traced_sample = measure(&format!("tracer on {name}"), traced(exe.clone(), CALLS))?;
        let (placed, path) = probe_path(&out)?;
        let per_call = per_call_ns(&traced_sample, &base, CALLS);
        println!(
            "| {flags} | {entry} | {placed} | {path} | {:.2} ms | **{} ns** |",
            base.loop_ns as f64 / 1e6,
            per_call.round()
        );
        if name == "bench" {
            ours = Some((base, traced_sample, trace_end(&out)?, per_call));
        }
    }
    let (base, ours, (lost, events), ours_per_call) = ours.expect("the nop5 build was measured");
    let base_0 = measure("bench 0", untraced(bench.clone(), 0))?;
    let ours_0 = measure("tracer on bench 0", traced(bench.clone(), 0))?;
    let top = measure("tracer top on bench", || {
        let mut c = Command::new(tracer);
        c.args(["top", "--json", "-f", "work", "--"]).arg(&bench).arg(CALLS.to_string());
        c
    })?;
    let top_per_call = per_call_ns(&top, &base, CALLS);
    // How kernels before 6.6 attach (a perf-event uprobe per site), on this kernel: the same
    // programs, so the per-call cost should match; what differs is attaching and detaching.
    let perf_event =
        measure("tracer --attach perf_event on bench", traced_with(bench.clone(), CALLS, &["--attach", "perf_event"]))?;
    let perf_event_per_call = per_call_ns(&perf_event, &base, CALLS);
    let perf_event_0 =
        measure("tracer --attach perf_event on bench 0", traced_with(bench.clone(), 0, &["--attach", "perf_event"]))?;
    // Returns probed where they happen (each `ret`, for programs that unwind stacks) against the
    // return-address probe, on the leaf work() and on branchy() (three `ret`s), same build.
    let returns = |function: &'static str, how: &'static str| {
        let (out, tracer, bench) = (out.clone(), tracer.to_path_buf(), bench.clone());
        move || {
            let mut c = Command::new(&tracer);
            c.args(["record", "-e", "call,return", "-f", function, "--returns", how, "-o"])
                .arg(&out)
                .arg("--")
                .arg(&bench)
                .arg(CALLS.to_string())
                .arg(function);
            c
        }
    };
    let branchy_base = measure("bench branchy", || {
        let mut c = Command::new(&bench);
        c.args([CALLS.to_string().as_str(), "branchy"]);
        c
    })?;
    let mut return_rows = Vec::new();
    for (function, base) in [("work", &base), ("branchy", &branchy_base)] {
        let mut row = Vec::new();
        for how in ["return_address", "exits"] {
            let sample = measure(&format!("tracer --returns {how} on {function}"), returns(function, how))?;
            row.push(per_call_ns(&sample, base, CALLS));
        }
        return_rows.push((function, row[0], row[1]));
    }

    println!();
    println!("On the `-pg -mfentry -mnop-mcount` build (optimized path):");
    println!();
    println!("| measurement | median |");
    println!("|---|---|");
    println!("| untraced: the loop of {CALLS} calls | {:.2} ms |", base.loop_ns as f64 / 1e6);
    println!("| traced by tracer (call + return to JSON lines): the loop | {:.1} ms |", ours.loop_ns as f64 / 1e6);
    println!("| **tracer record overhead per call** (call + return) | **{ours_per_call:.0} ns** |");
    println!("| **tracer top overhead per call** (in-kernel statistics) | **{top_per_call:.0} ns** |");
    println!(
        "| tracer record per call, probes attached as perf-event uprobes (`--attach perf_event`) | {perf_event_per_call:.0} ns |"
    );
    println!(
        "| start-up and shutdown with perf-event uprobes (0 calls, minus untraced) | {} |",
        ms(perf_event_0.wall.saturating_sub(base_0.wall))
    );
    for (function, at_return_address, at_exits) in return_rows {
        let what = if function == "work" { "leaf `work()`, one `ret`" } else { "`branchy()`, three `ret`s" };
        println!(
            "| tracer record per call, {what}: returns by return address / at each `ret` (`--returns exits`, \
             for programs that unwind) | {at_return_address:.0} / {at_exits:.0} ns ({:.2}x) |",
            at_exits / at_return_address
        );
    }
    println!("| tracer, whole run until the trace is written | {} |", ms(ours.wall));
    println!(
        "| tracer start-up and shutdown (0 calls traced, minus untraced) | {} |",
        ms(ours_0.wall.saturating_sub(base_0.wall))
    );
    println!("| events written / lost (last run) | {events} / {lost} |");

    if has_bpftrace() {
        let bpftrace = |probes: &'static str, calls: u64| {
            let (bench, printed) = (bench.clone(), dir.join("bpftrace.out"));
            move || {
                let b = bench.display();
                let script = match probes {
                    "entry" => format!("uprobe:{b}:work {{ @calls = count(); }}"),
                    "both" => {
                        format!("uprobe:{b}:work {{ @calls = count(); }} uretprobe:{b}:work {{ @returns = count(); }}")
                    }
                    // `count()` and a read of the clock at both probes, nothing stored: what any
                    // tracer that stamps calls and returns pays beyond `count()`.
                    "clock" => format!(
                        "uprobe:{b}:work {{ @calls = count(); if (nsecs == 1) {{ @never = count(); }} }} \
                         uretprobe:{b}:work {{ @returns = count(); if (nsecs == 1) {{ @never = count(); }} }}"
                    ),
                    _ => format!(
                        "uprobe:{b}:work {{ printf(\"call %d %d %lu\\n\", tid, nsecs, arg0); }} \
                         uretprobe:{b}:work {{ printf(\"return %d %d %lu\\n\", tid, nsecs, retval); }}"
                    ),
                };
                let mut c = Command::new("bpftrace");
                c.arg("-o").arg(&printed).args(["-e", &script, "-c", &format!("{b} {calls}")]);
                c
            }
        };
        let entry = per_call_ns(&measure("bpftrace count() on uprobe", bpftrace("entry", CALLS))?, &base, CALLS);
        let printf =
            per_call_ns(&measure("bpftrace printf on uprobe + uretprobe", bpftrace("printf", CALLS))?, &base, CALLS);
        // The ratios: the untraced loop, tracer record, tracer top and bpftrace `count()` taking
        // turns run by run, so that each meets the same load.
        let samples = measure_alternating_n(
            &mut [
                ("bench", &mut untraced(bench.clone(), RATIO_CALLS)),
                ("tracer on bench", &mut traced(bench.clone(), RATIO_CALLS)),
                ("tracer top on bench", &mut || {
                    let mut c = Command::new(tracer);
                    c.args(["top", "--json", "-f", "work", "--"]).arg(&bench).arg(RATIO_CALLS.to_string());
                    c
                }),
                ("bpftrace count() on uprobe + uretprobe", &mut bpftrace("both", RATIO_CALLS)),
                ("bpftrace count() and the clock on uprobe + uretprobe", &mut bpftrace("clock", RATIO_CALLS)),
            ],
            RATIO_RUNS,
        )?;
        let [alt_base, alt_record, alt_top, alt_both, alt_clock] = samples.as_slice() else {
            unreachable!("five configurations measured")
        };
        let (record, top, both, clock) = (
            per_call_ns(alt_record, alt_base, RATIO_CALLS),
            per_call_ns(alt_top, alt_base, RATIO_CALLS),
            per_call_ns(alt_both, alt_base, RATIO_CALLS),
            per_call_ns(alt_clock, alt_base, RATIO_CALLS),
        );
        println!("| bpftrace `count()` on uprobe only, per call | {entry:.0} ns |");
        println!("| bpftrace `printf` of every call and return (recording everything), per call | {printf:.0} ns |");
        println!(
            "| {RATIO_RUNS} runs alternated, {RATIO_CALLS} calls each: tracer record / tracer top / bpftrace `count()` \
             / bpftrace `count()` and the clock read, on uprobe + uretprobe, per call \
             | {record:.0} / {top:.0} / {both:.0} / {clock:.0} ns |"
        );
        println!(
            "| **tracer record / bpftrace `count()`** (both uprobe + uretprobe), per call, runs alternated | **{:.2}** |",
            record / both
        );
        println!(
            "| **tracer top / bpftrace `count()`** (both uprobe + uretprobe), per call, runs alternated | **{:.2}** |",
            top / both
        );
        println!(
            "| bpftrace `count()` and the clock read / bpftrace `count()` (what stamping calls and returns costs a \
             peer), runs alternated | {:.2} |",
            clock / both
        );
        println!("| tracer record / bpftrace `printf`, per call | {:.2} |", ours_per_call / printf);
    } else {
        println!("| bpftrace | could not be installed (apt-get install bpftrace) |");
    }
    if lost > 0 {
        println!("\nxtask: warning: the traced run lost {lost} events");
    }
    go_overhead(tracer)
}

/// Installs bpftrace when it is missing (so that the ratio rows always appear), and mounts
/// tracefs, which it reads probe formats from.
pub(crate) fn ensure_bpftrace() {
    if !Path::new("/sys/kernel/tracing/trace").exists() {
        let _ = Command::new("mount").args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"]).status();
    }
    if has_bpftrace() {
        return;
    }
    println!("xtask: installing bpftrace (apt-get install bpftrace) for the comparison rows");
    let installed = Command::new("apt-get")
        .args(["install", "-y", "bpftrace"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !installed {
        let _ = Command::new("apt-get").arg("update").stdout(Stdio::null()).status();
        let _ = Command::new("apt-get")
            .args(["install", "-y", "bpftrace"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status();
    }
}

/// Where the last trace's probe on `work` went and which path it takes (`trace_start.probe_paths`).
fn probe_path(trace: &Path) -> Result<(String, String)> {
    let text = std::fs::read_to_string(trace)?;
    let first = text.lines().next().context("empty trace")?;
    let start: serde_json::Value = serde_json::from_str(first)?;
    let paths = &start["probe_paths"];
    let path = ["optimized", "emulated", "trap"]
        .into_iter()
        .find(|p| paths[p].as_array().is_some_and(|a| a.iter().any(|f| f == "work")))
        .unwrap_or("?");
    let placed = match paths["moved"]["work"].as_u64() {
        Some(offset) => format!("work+{offset}"),
        None => "work".to_string(),
    };
    Ok((placed, path.to_string()))
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
