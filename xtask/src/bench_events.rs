//! `cargo xtask bench --only events`: what a program event costs the program, untraced and traced.
//!
//! The Rust fixture (`tests/src/bin/events_fixture.rs`, `bench MODE N`) times N calls of one entry
//! point in a loop; each mode is measured next to the same loop making no event (`baseline`), in
//! the same command, and the difference per call is the cost. Three situations:
//!
//! - untraced: nobody listens, a call is the semaphore check;
//! - probe live: a tracer is attached to the same binary through another process, so the
//!   semaphore is raised and the probe fires in the measured process too, but that process is not
//!   traced: the formatting, the probe itself and the kernel program's early return;
//! - traced: under `tracer record -e log,usdt`, which also copies every payload, decodes it and
//!   writes it as a JSON line (its threads share the two cores with the program).
//!
//! A `<sys/sdt.h>` probe (a 1-byte nop, which the kernel can only trap on) is measured the same
//! way, for comparison with the 5-byte nop that `tracer-events` probes on, which the kernel turns
//! into a call.

use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    bench::{RUNS, fixture, measure, per_call_ns},
    cargo, root, run_checked,
};

/// Calls per untraced run: enough for a few nanoseconds each to stand out of the noise.
const UNTRACED_CALLS: u64 = 20_000_000;
/// Calls per run with a live probe (each fires it).
const TRACED_CALLS: u64 = 100_000;
const MODES: [(&str, &str); 4] = [
    ("print", "`tracer_events::print`"),
    ("printf", "`tracer_events::printf!` (one integer)"),
    ("log", "`log::info!` through `TraceLogger`"),
    ("tracing", "`tracing::info!` (one field) through `TraceLayer`"),
];

/// Checks the last traced run's trace: a `log` or `usdt` event per call, none lost.
fn check_records(path: &Path, calls: u64) -> Result<()> {
    let text = std::fs::read_to_string(path)?;
    let mut said = 0;
    for line in text.lines() {
        let line: serde_json::Value = serde_json::from_str(line)?;
        if line["kind"] == "log" || line["kind"] == "usdt" {
            said += 1;
        }
    }
    let end: serde_json::Value = serde_json::from_str(text.lines().last().context("no trace written")?)?;
    let lost: u64 = end["lost_events"].as_object().context("no trace_end")?.values().filter_map(|v| v.as_u64()).sum();
    if said != calls || lost != 0 {
        bail!("the traced run recorded {said} of {calls} events ({lost} lost)");
    }
    Ok(())
}

/// A tracer attached to a serving instance of a fixture: the binary's probes are live, and their
/// semaphores raised in every process that maps it, traced or not.
struct AttachedElsewhere {
    server: Child,
    tracer: Child,
}

impl AttachedElsewhere {
    fn start(tracer: &Path, program: &Path, usdt: Option<&str>) -> Result<AttachedElsewhere> {
        let mut server = Command::new(program)
            .arg("serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {}", program.display()))?;
        let mut ready = String::new();
        BufReader::new(server.stdout.take().expect("piped")).read_line(&mut ready)?;
        let mut cmd = Command::new(tracer);
        cmd.args(["record", "-e", "log,usdt", "--format", "jsonl", "-o", "/dev/null", "-p", &server.id().to_string()]);
        if let Some(pattern) = usdt {
            cmd.args(["-u", pattern]);
        }
        let mut tracer = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().context("cannot start tracer")?;
        let mut stderr = BufReader::new(tracer.stderr.take().expect("piped"));
        let attached = AttachedElsewhere { server, tracer };
        loop {
            let mut line = String::new();
            if stderr.read_line(&mut line)? == 0 {
                bail!("tracer record exited before attaching");
            }
            if line.starts_with("tracer: tracing ") {
                break;
            }
        }
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        Ok(attached)
    }
}

impl Drop for AttachedElsewhere {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.tracer.id() as i32, libc::SIGINT) };
        let _ = self.tracer.wait();
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

pub fn run(tracer: &Path) -> Result<()> {
    run_checked(&mut cargo(&["build", "--quiet", "--release", "-p", "tracer-tests", "--bin", "events_fixture"]))?;
    let events = root().join("target/release/events_fixture");
    let sdt = fixture("sdt_probes_o2")?;
    let out = root().join("target/bench/events.jsonl");
    std::fs::create_dir_all(out.parent().expect("a directory"))?;
    let direct = |program: &Path, args: Vec<String>| {
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
            c.args(["record", "-e", "log,usdt", "-o"]).arg(&out);
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
    let base = measure("events_fixture baseline", direct(&events, bench_args("baseline", UNTRACED_CALLS)))?;
    let base_live = measure("events_fixture baseline", direct(&events, bench_args("baseline", TRACED_CALLS)))?;
    let bare =
        measure("tracing without a layer", direct(&events, bench_args("tracing_without_layer", UNTRACED_CALLS)))?;
    let mut rows = Vec::new();
    for (mode, what) in MODES {
        let idle = measure(mode, direct(&events, bench_args(mode, UNTRACED_CALLS)))?;
        let live = {
            let _attached = AttachedElsewhere::start(tracer, &events, None)?;
            measure(mode, direct(&events, bench_args(mode, TRACED_CALLS)))?
        };
        let busy = measure(mode, traced(&events, None, bench_args(mode, TRACED_CALLS)))?;
        check_records(&out, TRACED_CALLS)?;
        rows.push((
            what,
            per_call_ns(&idle, &base, UNTRACED_CALLS),
            per_call_ns(&live, &base_live, TRACED_CALLS),
            per_call_ns(&busy, &base_live, TRACED_CALLS),
        ));
    }
    let sdt_args = |n: u64| vec!["bench".to_string(), n.to_string()];
    let sdt_idle = measure("sdt_probes bench", direct(&sdt, sdt_args(TRACED_CALLS)))?;
    let sdt_live = {
        let _attached = AttachedElsewhere::start(tracer, &sdt, Some("fixture:gated"))?;
        measure("sdt_probes bench", direct(&sdt, sdt_args(TRACED_CALLS)))?
    };
    let sdt_busy = measure("sdt_probes bench", traced(&sdt, Some("fixture:gated"), sdt_args(TRACED_CALLS)))?;
    check_records(&out, TRACED_CALLS)?;

    println!();
    println!("| call | untraced | probe live, process not traced | traced (`record -e log,usdt`) |");
    println!("|---|---|---|---|");
    for (what, idle, live, busy) in rows {
        println!("| {what} | {idle:.1} ns | {:.2} µs | {:.2} µs |", live / 1e3, busy / 1e3);
    }
    println!(
        "| `<sys/sdt.h>` probe with a semaphore (1-byte nop: a trap) | (a semaphore check) | {:.2} µs | {:.2} µs |",
        per_call_ns(&sdt_live, &sdt_idle, TRACED_CALLS) / 1e3,
        per_call_ns(&sdt_busy, &sdt_idle, TRACED_CALLS) / 1e3
    );
    println!(
        "| `tracing::info!` with a subscriber but no layer, for reference | {:.1} ns | | |",
        per_call_ns(&bare, &base, UNTRACED_CALLS)
    );
    println!("| the empty loop itself ({UNTRACED_CALLS} iterations) | {:.1} ms | | |", base.loop_ns as f64 / 1e6);
    Ok(())
}
