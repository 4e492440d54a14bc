//! `cargo xtask bench --only params`: what calls at source level cost per call. The same function
//! is traced with its DWARF (parameters by name; a `char *` read from the target's memory) and
//! with its DWARF stripped (the six registers only), on the same code (`bench_params` and
//! `bench_params_nodwarf` differ only in their debug sections), against the program untraced, in
//! one command; and with DWARF again under `--no-sleepable`: a function with a string parameter
//! runs the sleepable programs by default and the non-sleepable ones then (a function without
//! runs the non-sleepable ones both times, so its two columns measure the same thing twice).

use std::{path::Path, process::Command};

use anyhow::{Result, bail};

use crate::{
    bench::{RUNS, Sample, fixture, measure},
    root,
};

/// Calls per run: a probed call and its return cost a few microseconds here.
const CALLS: u64 = 200_000;

pub fn run(tracer: &Path) -> Result<()> {
    let with = fixture("bench_params")?;
    let without = fixture("bench_params_nodwarf")?;
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let out = dir.join("params.jsonl");
    println!(
        "xtask: {RUNS} runs of each; {CALLS} calls of one function (tests/fixtures/c/bench_params.c), probed by `tracer record -e call,return -f FUNCTION`"
    );
    println!();
    println!(
        "| function | untraced loop | traced, no DWARF, per call | traced with DWARF, per call | added by parameters | with DWARF, `--no-sleepable`, per call | added by the sleepable program |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (mode, function, what) in [
        ("ints", "work_ints", "`work_ints(long, int, unsigned)`: integers only"),
        ("str", "work_str", "`work_str(long, const char *)`: one string (24 bytes)"),
    ] {
        let untraced = measure(&format!("bench_params {mode}"), || {
            let mut c = Command::new(&with);
            c.args([mode, &CALLS.to_string()]);
            c
        })?;
        let traced = |exe: &Path, extra: &[&str]| -> Result<Sample> {
            let sample = measure(&format!("tracer on {}", exe.display()), || {
                let mut c = Command::new(tracer);
                c.args(["record", "-e", "call,return", "-f", function])
                    .args(extra)
                    .arg("-o")
                    .arg(&out)
                    .arg("--")
                    .arg(exe)
                    .args([mode, &CALLS.to_string()]);
                c
            })?;
            Ok(sample)
        };
        let plain = traced(&without, &[])?;
        check(&out, function, false)?;
        let source = traced(&with, &[])?;
        check(&out, function, true)?;
        let fast_only = traced(&with, &["--no-sleepable"])?;
        check(&out, function, true)?;
        let per_call = |s: &Sample| (s.loop_ns as f64 - untraced.loop_ns as f64) / CALLS as f64;
        let (plain, source, fast_only) = (per_call(&plain), per_call(&source), per_call(&fast_only));
        println!(
            "| {what} | {:.2} ms | {plain:.0} ns | {source:.0} ns | {:.0} ns | {fast_only:.0} ns | {:.0} ns |",
            untraced.loop_ns as f64 / 1e6,
            source - plain,
            source - fast_only
        );
    }
    std::fs::remove_file(&out)?;
    Ok(())
}

/// The last run recorded every call and return, with parameters exactly when DWARF was there:
/// otherwise the row would compare something else.
fn check(trace: &Path, function: &str, params: bool) -> Result<()> {
    let text = std::fs::read_to_string(trace)?;
    let (mut calls, mut returns, mut with_params) = (0u64, 0u64, 0u64);
    for line in text.lines() {
        let e: serde_json::Value = serde_json::from_str(line)?;
        if e["function"] != function {
            continue;
        }
        match e["kind"].as_str() {
            Some("call") => {
                calls += 1;
                with_params += u64::from(e.get("params").is_some());
            }
            Some("return") => returns += 1,
            _ => {}
        }
    }
    let expected_params = if params { CALLS } else { 0 };
    if calls != CALLS || returns != CALLS || with_params != expected_params {
        bail!(
            "the params benchmark recorded {calls} calls, {returns} returns, {with_params} with params of {function} (expected {CALLS}, {CALLS}, {expected_params})"
        );
    }
    Ok(())
}
