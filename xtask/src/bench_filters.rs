//! `cargo xtask bench --only filters`: what a predicate evaluated in the kernel costs a call. One
//! function, `spin(int key)` of `tests/fixtures/c/filters.c` built with 5-byte nop entries
//! (`filters_nop`: the kernel's fast probe path), called `CALLS` times with `key = i % 10000`:
//! untraced; recorded whole (`-f spin`); and with `-f 'spin if key == 0'`, which passes 1 call in
//! 10,000; and with `-f spin --depth 1`, which writes every call (each is outermost) through its
//! thread's gate in the kernel (`tracer_common::gate`): that row's cost over `-f spin` is what
//! triggers and depth cost a call. Ring-buffer bytes are the records written (the predicate's counters in `trace_end`)
//! times their size, with the ring's 8-byte header each.

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result, bail};

use crate::{
    bench::{RUNS, Sample, fixture, measure},
    root,
};

/// Calls per run: at about 1 µs a probed call and its return here, a run records 2 M events
/// (515 MB of JSON lines). Not the 10 M: that would write 5 GB a run for the rows that
/// record every call, and take 5 to 11 minutes (docs/performance.md).
const CALLS: u64 = 1_000_000;
/// Bytes a call and a return take in the ring buffer: the records (`tracer_common::CallRecord`,
/// 88 bytes, `ReturnRecord`, 56) and the ring's 8-byte header each.
const CALL_BYTES: u64 = 88 + 8;
const RETURN_BYTES: u64 = 56 + 8;

pub fn run(tracer: &Path) -> Result<()> {
    let exe = fixture("filters_nop")?;
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let out = dir.join("filters.jsonl");
    println!(
        "xtask: {RUNS} runs of each; {CALLS} calls of `spin(int key)` (tests/fixtures/c/filters.c, 5-byte nop entries), key = i % 10000"
    );
    println!();
    println!("| run | loop | per call, over untraced | calls written | ring-buffer bytes |");
    println!("|---|---|---|---|---|");
    let untraced = measure("filters_nop", || {
        let mut c = Command::new(&exe);
        c.arg(CALLS.to_string());
        c
    })?;
    println!("| untraced | {:.1} ms | | | |", untraced.loop_ns as f64 / 1e6);
    let traced = |pattern: &str, options: &[&str]| -> Result<Sample> {
        measure(&format!("tracer -f '{pattern}' {}", options.join(" ")), || {
            let mut c = Command::new(tracer);
            c.args(["record", "-f", pattern]).args(options).arg("-o").arg(&out);
            c.arg("--").arg(&exe).arg(CALLS.to_string());
            c
        })
    };
    let per_call = |s: &Sample| (s.loop_ns as f64 - untraced.loop_ns as f64) / CALLS as f64;
    let rows: [(&str, &[&str], u64); 3] =
        [("spin", &[], CALLS), ("spin if key == 0", &[], CALLS / 10_000), ("spin", &["--depth", "1"], CALLS)];
    for (pattern, options, expected) in rows {
        let sample = traced(pattern, options)?;
        let (calls, returns) = counts(&out, expected)?;
        let bytes = calls * CALL_BYTES + returns * RETURN_BYTES;
        println!(
            "| `-f '{pattern}'{}` | {:.1} ms | {:.0} ns | {calls} | {bytes} |",
            options.iter().map(|o| format!(" {o}")).collect::<String>(),
            sample.loop_ns as f64 / 1e6,
            per_call(&sample)
        );
    }
    std::fs::remove_file(&out)?;
    Ok(())
}

/// The last run's calls and returns of `spin`, checked against `expected` (and, with a predicate,
/// against its counters): a row that recorded something else would compare nothing.
fn counts(trace: &Path, expected: u64) -> Result<(u64, u64)> {
    let text = std::fs::read_to_string(trace)?;
    let (mut calls, mut returns) = (0u64, 0u64);
    let mut end = serde_json::Value::Null;
    for line in text.lines() {
        let e: serde_json::Value = serde_json::from_str(line)?;
        match (e["kind"].as_str(), e["function"] == "spin") {
            (Some("call"), true) => calls += 1,
            (Some("return"), true) => returns += 1,
            (Some("trace_end"), _) => end = e,
            _ => {}
        }
    }
    let lost: u64 = end["lost_events"].as_object().context("no trace_end")?.values().filter_map(|v| v.as_u64()).sum();
    if calls != expected || returns != expected || lost != 0 {
        bail!(
            "the filters benchmark recorded {calls} calls and {returns} returns of spin, {lost} lost (expected {expected})"
        );
    }
    if let Some(f) = end["filters"].get("spin")
        && (f["seen"].as_u64() != Some(CALLS) || f["written"].as_u64() != Some(expected))
    {
        bail!("the predicate's counters say {f}, expected {CALLS} seen and {expected} written");
    }
    Ok((calls, returns))
}
