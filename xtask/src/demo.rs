//! `cargo xtask demo`: trace the bundled client/server workload and say where the trace went.

use std::{collections::BTreeMap, path::Path, process::Command};

use anyhow::{Context as _, Result};
use serde_json::Value;

use crate::{bench::fixture, root, run_checked};

pub fn run(tracer: &Path) -> Result<()> {
    let demo = fixture("client_server_demo")?;
    let dir = root().join("target/demo");
    std::fs::create_dir_all(&dir)?;
    let jsonl = dir.join("trace.jsonl");
    let chrome = dir.join("trace.json");
    println!("xtask: tracing {} (a server, 3 clients, 15 requests over TCP, results over a pipe)", demo.display());
    run_checked(Command::new(tracer).arg("record").arg("-o").arg(&jsonl).arg("--").arg(&demo))?;
    run_checked(Command::new(tracer).arg("export").arg(&jsonl).arg("-o").arg(&chrome))?;
    summarize(&jsonl)?;
    println!();
    println!("Chrome trace: {}", chrome.display());
    println!("  open it at https://ui.perfetto.dev (\"Open trace file\") or https://www.speedscope.app");
    println!("JSON lines:   {}", jsonl.display());
    println!("  e.g. jq -c 'select(.kind == \"spawn\")' {}", jsonl.display());
    Ok(())
}

/// A short account of the trace: processes, and the busiest functions.
fn summarize(jsonl: &Path) -> Result<()> {
    let text = std::fs::read_to_string(jsonl)?;
    let lines: Vec<Value> = text.lines().map(serde_json::from_str).collect::<Result<_, _>>().context("parse trace")?;
    let end = lines.last().context("empty trace")?;
    let mut kinds: BTreeMap<&str, u64> = BTreeMap::new();
    let mut functions: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    let mut processes: BTreeMap<u64, (String, String)> = BTreeMap::new();
    for e in &lines[1..lines.len() - 1] {
        let kind = e["kind"].as_str().unwrap_or("?");
        *kinds.entry(kind).or_default() += 1;
        match kind {
            "return" => {
                let f = functions.entry(e["function"].as_str().unwrap_or("?")).or_default();
                f.0 += 1;
                f.1 += e["duration_ns"].as_u64().unwrap_or(0);
            }
            "spawn" if e["how"] != "thread" => {
                let pid = e["child_pid"].as_u64().unwrap_or(0);
                processes.entry(pid).or_default().0 = e["comm"].as_str().unwrap_or("").to_string();
            }
            "exit" if e["thread"] == false => {
                let status = match (&e["exit_code"], &e["signal"]) {
                    (Value::Number(c), _) => format!("exit {c}"),
                    (_, Value::Number(s)) => format!("killed by signal {s}"),
                    _ => "exit".to_string(),
                };
                processes.entry(e["pid"].as_u64().unwrap_or(0)).or_default().1 = status;
            }
            _ => {}
        }
    }
    println!();
    println!(
        "{} events ({}), ended: {}; lost: {}",
        end["events_written"],
        kinds.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", "),
        end["reason"],
        end["lost_events"]
    );
    println!("processes:");
    for (pid, (comm, status)) in &processes {
        println!("  {pid:>7}  {comm:<20} {status}");
    }
    let ipc = &end["ipc"];
    println!(
        "messages: {} sends, {} receives ({} linked to their sends), {} signals linked",
        ipc["sends"], ipc["recvs"], ipc["linked_recvs"], ipc["linked_signals"]
    );
    let mut busiest: Vec<_> = functions.into_iter().collect();
    busiest.sort_by_key(|(_, (_, total))| std::cmp::Reverse(*total));
    println!("functions by total time (calls, total):");
    for (name, (calls, total)) in busiest.iter().take(8) {
        println!("  {name:<20} {calls:>6} calls  {:>10.3} ms", *total as f64 / 1e6);
    }
    Ok(())
}
