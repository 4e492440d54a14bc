//! `cargo xtask bench --only native`: the native trace format against JSON lines and uftrace, on
//! the same call/return stream: bytes an event as recorded, and how long `report` takes to read it.
//!
//! The stream is [`CALLS`] calls of `work()` in `tests/fixtures/c/bench.c` (built with `-pg`, so
//! uftrace can trace it too): `tracer record -f work -e call,return` writes it as JSON lines and
//! as native, `uftrace record -P work` in its own format. Each `report` runs [`RUNS`] times; the
//! median is shown. uftrace is installed by `cargo xtask setup`; without it its rows say so.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{bench::fixture, root};

const CALLS: u64 = 1_000_000;
const RUNS: usize = 3;

fn run(what: &str, cmd: &mut Command) -> Result<Duration> {
    let start = Instant::now();
    let out =
        cmd.stdout(Stdio::null()).stderr(Stdio::piped()).output().with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        bail!("{what} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(start.elapsed())
}

fn median_of(what: &str, mut make: impl FnMut() -> Command) -> Result<Duration> {
    let mut times = (0..RUNS).map(|_| run(what, &mut make())).collect::<Result<Vec<_>>>()?;
    times.sort();
    Ok(times[RUNS / 2])
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

pub fn run_bench(tracer: &Path) -> Result<()> {
    let bench = fixture("bench")?;
    let dir = root().join("target/bench/native");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let events = 2 * CALLS;
    println!(
        "xtask: {CALLS} calls of work() (tests/fixtures/c/bench.c, {events} events) recorded by each tool; `report` {RUNS} times each (median)"
    );
    println!();
    println!("| format | bytes/event | report | events/s |");
    println!("|---|---|---|---|");
    for name in ["bench.jsonl", "bench.trc"] {
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
        let report = median_of("tracer report", || {
            let mut c = Command::new(tracer);
            c.arg("report").arg(&out);
            c
        })?;
        row(
            &format!("tracer, {}", if name.ends_with("trc") { "native" } else { "JSON lines" }),
            size(&out)?,
            events,
            report,
        );
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
    match recorded {
        Ok(out) if out.status.success() => {
            let report = median_of("uftrace report", || {
                let mut c = Command::new("uftrace");
                c.args(["report", "-d"]).arg(&uftrace_dir);
                c
            })?;
            // The trace data proper: the per-thread `.dat` files (the rest is symbols and maps).
            let mut data = 0;
            for entry in std::fs::read_dir(&uftrace_dir)? {
                let path = entry?.path();
                if path.extension().is_some_and(|e| e == "dat") {
                    data += size(&path)?;
                }
            }
            row("uftrace (its `.dat` files)", data, events, report);
        }
        Ok(out) => println!("| uftrace | could not record: {} | | |", String::from_utf8_lossy(&out.stderr).trim()),
        Err(_) => println!("| uftrace | not installed (apt-get install uftrace, or `cargo xtask setup`) | | |"),
    }
    Ok(())
}
