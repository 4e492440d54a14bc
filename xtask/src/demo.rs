//! `cargo xtask demo`: trace the bundled client/server workload, export it to every visual format,
//! print `tracer report` of it, and say where the files went.

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result};
use serde_json::Value;

use crate::{root, run_checked};

pub fn run(tracer: &Path) -> Result<()> {
    let dir = root().join("target/demo");
    std::fs::create_dir_all(&dir)?;
    let jsonl = dir.join("trace.jsonl");
    record(tracer, &dir, &jsonl)?;
    let exports = ["trace.json", "trace.pftrace", "trace.svg", "trace.folded"].map(|name| dir.join(name));
    for out in &exports {
        run_checked(Command::new(tracer).arg("export").arg(&jsonl).arg("-o").arg(out))?;
    }
    println!();
    run_checked(Command::new(tracer).arg("report").arg(&jsonl))?;
    println!();
    println!("{}", messages(&jsonl)?);
    println!();
    println!("JSON lines:       {}   (jq -c 'select(.kind == \"recv\")' …)", jsonl.display());
    println!("Chrome trace:     {}   (ui.perfetto.dev, speedscope.app)", exports[0].display());
    println!("Perfetto trace:   {}   (ui.perfetto.dev: slices, and arrows send → receive)", exports[1].display());
    println!("flame graph:      {}   (a browser)", exports[2].display());
    println!("folded stacks:    {}   (speedscope, inferno, flamegraph.pl)", exports[3].display());
    println!("call tree:        {} calls {}", tracer.display(), jsonl.display());
    println!("in the browser:   {} view {}", tracer.display(), jsonl.display());
    Ok(())
}

/// Builds the demo workload in `dir` and records it into `jsonl`.
pub fn record(tracer: &Path, dir: &Path, jsonl: &Path) -> Result<()> {
    // Built here, not with the test fixtures (whose build needs the C++ and Go compilers and
    // <sys/sdt.h>): the demo needs only gcc.
    let demo = dir.join("client_server_demo");
    run_checked(
        Command::new("gcc")
            .args(["-O0", "-pthread", "-o"])
            .arg(&demo)
            .arg(root().join("tests/fixtures/c/client_server_demo.c")),
    )?;
    println!("xtask: tracing {} (a server, 3 clients, 15 requests over TCP, results over a pipe)", demo.display());
    run_checked(Command::new(tracer).arg("record").arg("-o").arg(jsonl).arg("--").arg(&demo))
}

/// The trace's IPC link statistics, from its `trace_end` line.
fn messages(jsonl: &Path) -> Result<String> {
    let text = std::fs::read_to_string(jsonl)?;
    let end: Value = serde_json::from_str(text.lines().last().context("empty trace")?).context("parse trace_end")?;
    let ipc = &end["ipc"];
    let lost: u64 = end["lost_events"].as_object().into_iter().flatten().filter_map(|(_, n)| n.as_u64()).sum();
    Ok(format!(
        "Messages: {} sends, {} receives ({} linked to their sends); signals linked to their sender: {}; events lost: {lost}",
        ipc["sends"], ipc["recvs"], ipc["linked_recvs"], ipc["linked_signals"]
    ))
}
