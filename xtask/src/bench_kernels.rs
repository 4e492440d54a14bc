//! `cargo xtask bench --only kernels` (and `--only overhead` inside `bench --kernel`'s VMs): what
//! a traced call costs through each attach mechanism the running kernel offers, against
//! bpftrace's `count()` on the same probes in the same run.
//!
//! Small on purpose: under the emulated VMs every trap costs tens of microseconds, so the full
//! overhead bench (millions of calls, four builds) would take hours there.

use std::{path::Path, process::Command};

use anyhow::Result;

use crate::{
    bench::{RUNS, ensure_bpftrace, fixture, has_bpftrace, measure, per_call_ns, trace_end},
    root,
};

/// Calls of `work()` per run.
const CALLS: u64 = 20_000;

pub fn run(tracer: &Path) -> Result<()> {
    let bench = fixture("bench")?;
    let out = root().join("target/bench/kernels.jsonl");
    std::fs::create_dir_all(out.parent().expect("a directory"))?;
    ensure_bpftrace();
    let release = kernel_release();
    println!(
        "xtask: Linux {release}; {RUNS} runs of each; {CALLS} calls of work() (tests/fixtures/c/bench.c), \
         `tracer record -f work -e call,return --attach MECHANISM` against bpftrace `count()` on uprobe + uretprobe"
    );
    let base = measure("bench", || {
        let mut c = Command::new(&bench);
        c.arg(CALLS.to_string());
        c
    })?;
    let bpftrace = if has_bpftrace() {
        let b = bench.display();
        let script = format!("uprobe:{b}:work {{ @calls = count(); }} uretprobe:{b}:work {{ @returns = count(); }}");
        let printed = root().join("target/bench/kernels-bpftrace.out");
        let sample = measure("bpftrace count() on uprobe + uretprobe", || {
            let mut c = Command::new("bpftrace");
            c.arg("-o").arg(&printed).args(["-e", &script, "-c", &format!("{b} {CALLS}")]);
            c
        })?;
        Some(per_call_ns(&sample, &base, CALLS))
    } else {
        None
    };
    println!();
    println!("| Linux {release}: per call (call + return) | ns | / bpftrace `count()` |");
    println!("|---|---|---|");
    for mechanism in ["uprobe_multi", "perf_event"] {
        let traced = measure(&format!("tracer --attach {mechanism}"), || {
            let mut c = Command::new(tracer);
            c.args(["record", "-e", "call,return", "-f", "work", "--attach", mechanism, "-o"])
                .arg(&out)
                .arg("--")
                .arg(&bench)
                .arg(CALLS.to_string());
            c
        });
        let traced = match traced {
            Ok(sample) => sample,
            // `--attach uprobe_multi` is refused with one sentence where the kernel lacks it.
            Err(e) => {
                println!("| tracer, `--attach {mechanism}` | not on this kernel ({e:#}) | |");
                continue;
            }
        };
        let used = attach_used(&out)?;
        anyhow::ensure!(used == mechanism, "tracer --attach {mechanism} attached with {used}");
        let (lost, events) = trace_end(&out)?;
        anyhow::ensure!(
            lost == 0 && events >= 2 * CALLS,
            "tracer --attach {mechanism} lost events ({lost} lost, {events} written)"
        );
        let ns = per_call_ns(&traced, &base, CALLS);
        let ratio = bpftrace.map_or("—".to_string(), |b| format!("{:.2}", ns / b));
        println!("| tracer, `--attach {mechanism}` | {ns:.0} | **{ratio}** |");
    }
    match bpftrace {
        Some(ns) => println!("| bpftrace `count()` on uprobe + uretprobe | {ns:.0} | 1 |"),
        None => println!("| bpftrace | could not be installed (apt-get install bpftrace) | |"),
    }
    println!("| untraced loop of {CALLS} calls | {:.2} ms | |", base.loop_ns as f64 / 1e6);
    Ok(())
}

/// The mechanism a trace's probes were attached with (`trace_start.kernel.attach`).
fn attach_used(trace: &Path) -> Result<String> {
    let text = std::fs::read_to_string(trace)?;
    let start: serde_json::Value = serde_json::from_str(text.lines().next().unwrap_or_default())?;
    Ok(start["kernel"]["attach"].as_str().unwrap_or("?").to_string())
}

/// The running kernel's release (`uname -r`).
fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map_or_else(|_| "?".to_string(), |r| r.trim().to_string())
}
