//! `cargo xtask bench --only cluster`: collector ingest and merge throughput.
//!
//! Two agents on this machine (Unix sockets) each trace the benchmark fixture (a million calls of a function: two
//! million events); one collector takes both streams and merges them. The collector reports, per
//! host, the events received and the time between the first and the last arrival, and the time
//! the merge took; those are the numbers. The agents run on the same two cores as the collector
//! and the traced programs, so this is a lower bound on what one collector sustains.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

use crate::{bench::fixture, root};

/// Calls per traced program (two events each).
const CALLS: u64 = 1_000_000;
const RUNS: usize = 3;

struct Agents(Vec<Child>);

impl Drop for Agents {
    fn drop(&mut self) {
        for a in &mut self.0 {
            let _ = a.kill();
            let _ = a.wait();
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A number after `marker` in `text`'s line containing `line`.
fn number_after(text: &str, line: &str, marker: &str) -> Option<f64> {
    let l = text.lines().find(|l| l.contains(line))?;
    l.split(marker).nth(1)?.split_whitespace().next()?.trim_start_matches('(').parse().ok()
}

pub fn run(tracer: &Path) -> Result<()> {
    let bench = fixture("bench")?;
    let out = root().join("target/bench/merged.jsonl");
    let sockets = root().join("target/bench/agents");
    let socket = |name: &str| sockets.join(format!("{name}.sock"));
    let agents = Agents(
        ["a", "b"]
            .iter()
            .map(|name| {
                Command::new(tracer)
                    .arg("agent")
                    .arg("--socket")
                    .arg(socket(name))
                    .args(["--name", name, "--allow-commands"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .context("start an agent")
            })
            .collect::<Result<_>>()?,
    );
    std::thread::sleep(Duration::from_millis(500));
    println!("\nxtask: {RUNS} runs; 2 agents on this machine, each tracing {CALLS} calls (call + return)");
    let (mut per_host, mut total, mut merge) = (Vec::new(), Vec::new(), Vec::new());
    let mut events = 0.0;
    for _ in 0..RUNS {
        let output = Command::new(tracer)
            .args([
                "collect",
                "--agent",
                &format!("a=unix:{}", socket("a").display()),
                "--agent",
                &format!("b=unix:{}", socket("b").display()),
                "-f",
                "work",
                "-e",
                "call,return",
            ])
            .arg("-c")
            .arg(format!("a:{} {CALLS}", bench.display()))
            .arg("-c")
            .arg(format!("b:{} {CALLS}", bench.display()))
            .arg("-o")
            .arg(&out)
            .stdout(Stdio::null())
            .output()
            .context("run the collector")?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() {
            bail!("the collector failed: {stderr}");
        }
        let mut rates = Vec::new();
        for host in ["a", "b"] {
            let rate = number_after(&stderr, &format!("host {host}: received"), " s (")
                .with_context(|| format!("no ingest line for {host}: {stderr}"))?;
            rates.push(rate);
        }
        per_host.push(rates.iter().sum::<f64>() / 2.0);
        total.push(rates.iter().sum::<f64>());
        let merged = "tracer collect: merged ";
        events = number_after(&stderr, merged, merged).with_context(|| format!("no merge line: {stderr}"))?;
        merge.push(number_after(&stderr, merged, " s (").context("no merge rate")?);
    }
    drop(agents);
    println!();
    println!("| collector | median |");
    println!("|---|---|");
    println!("| ingest, per agent | {:.2} M events/s |", median(per_host) / 1e6);
    println!("| ingest, both agents together | {:.2} M events/s |", median(total) / 1e6);
    println!(
        "| merge (clock correction, flow linking, time order) of {events:.0} events | {:.2} M events/s |",
        median(merge) / 1e6
    );
    Ok(())
}
