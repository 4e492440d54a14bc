//! `cargo xtask bench --only native`: the native trace format against JSON lines and uftrace, on
//! the same call/return stream: bytes an event as recorded, and how long `report` takes to read it.
//!
//! The stream is [`CALLS`] calls of `work()` in `tests/fixtures/c/bench.c` (built with `-pg`, so
//! uftrace can trace it too): `tracer record -f work -e call,return` writes it as JSON lines and
//! as native, `uftrace record -P work` in its own format. Then the three `report`s run in turn,
//! [`RUNS`] rounds (so that a burst of load on this noisy machine falls on all of them alike), and
//! each one's median is shown, with the ratio of tracer's native `report` to `uftrace report`.
//! uftrace is installed by `cargo xtask setup`; without it its rows say so.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{bench::fixture, root};

const CALLS: u64 = 1_000_000;
const RUNS: usize = 5;

fn run(what: &str, cmd: &mut Command) -> Result<Duration> {
    let start = Instant::now();
    let out =
        cmd.stdout(Stdio::null()).stderr(Stdio::piped()).output().with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        bail!("{what} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(start.elapsed())
}

fn median(times: &mut [Duration]) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// Total size of a file, or of the files in a directory.
fn size(path: &Path) -> Result<u64> {
    if path.is_file() {
        return Ok(std::fs::metadata(path)?.len());
    }
    let mut total = 0;
    for entry in std::fs::read_dir(path)? {
        total += size(&entry?.path())?;
    }
    Ok(total)
}

fn row(what: &str, bytes: u64, events: u64, report: Duration) {
    println!(
        "| {what} | {:.1} | {:.3} s | {:.1} M |",
        bytes as f64 / events as f64,
        report.as_secs_f64(),
        events as f64 / report.as_secs_f64() / 1e6
    );
}

/// One trace to report on: its row's name, its size, and how to run its `report`.
struct Reader {
    name: String,
    bytes: u64,
    report: Command,
    times: Vec<Duration>,
}

pub fn run_bench(tracer: &Path) -> Result<()> {
    let bench = fixture("bench")?;
    let dir = root().join("target/bench/native");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let events = 2 * CALLS;
    println!(
        "xtask: {CALLS} calls of work() (tests/fixtures/c/bench.c, {events} events) recorded by each tool; then each `report` in turn, {RUNS} rounds (median)"
    );
    let mut readers = Vec::new();
    for (name, what) in [("bench.jsonl", "tracer, JSON lines"), ("bench.trc", "tracer, native")] {
        let out = dir.join(name);
        run(
            &format!("tracer record -o {name}"),
            Command::new(tracer)
                .args(["record", "-e", "call,return", "-f", "work", "-o"])
                .arg(&out)
                .arg("--")
                .arg(&bench)
                .arg(CALLS.to_string()),
        )?;
        let mut report = Command::new(tracer);
        report.arg("report").arg(&out);
        readers.push(Reader { name: what.into(), bytes: size(&out)?, report, times: Vec::new() });
    }
    let uftrace_dir = dir.join("uftrace.data");
    let recorded = Command::new("uftrace")
        .args(["record", "--no-libcall", "-P", "work", "-d"])
        .arg(&uftrace_dir)
        .arg(&bench)
        .arg(CALLS.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output();
    let uftrace_missing = match recorded {
        Ok(out) if out.status.success() => {
            // The trace data proper: the per-thread `.dat` files (the rest is symbols and maps).
            let mut data = 0;
            for entry in std::fs::read_dir(&uftrace_dir)? {
                let path = entry?.path();
                if path.extension().is_some_and(|e| e == "dat") {
                    data += size(&path)?;
                }
            }
            let mut report = Command::new("uftrace");
            report.args(["report", "-d"]).arg(&uftrace_dir);
            readers.push(Reader { name: "uftrace (its `.dat` files)".into(), bytes: data, report, times: Vec::new() });
            None
        }
        Ok(out) => Some(format!("could not record: {}", String::from_utf8_lossy(&out.stderr).trim())),
        Err(_) => Some("not installed (apt-get install uftrace, or `cargo xtask setup`)".to_string()),
    };
    for _ in 0..RUNS {
        for r in &mut readers {
            r.times.push(run(&format!("report of {}", r.name), &mut r.report)?);
        }
    }
    println!();
    println!("| format | bytes/event | report | events/s |");
    println!("|---|---|---|---|");
    let medians: Vec<Duration> = readers.iter_mut().map(|r| median(&mut r.times)).collect();
    for (r, m) in readers.iter().zip(&medians) {
        row(&r.name, r.bytes, events, *m);
    }
    match uftrace_missing {
        Some(why) => println!("| uftrace | {why} | | |"),
        None => println!(
            "\nratio, tracer's native `report` to `uftrace report` (medians of the same rounds): {:.2}",
            medians[1].as_secs_f64() / medians[2].as_secs_f64()
        ),
    }
    Ok(())
}
