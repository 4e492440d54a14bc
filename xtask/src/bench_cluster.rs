//! `cargo xtask bench --only cluster`: collector ingest and merge throughput, memory and loss.
//!
//! Two agents on this machine (Unix sockets) each trace the benchmark fixture (a million calls of a function: two
//! million events); one collector takes both streams and merges them. The collector reports, per
//! host, the events received and the time between the first and the last arrival, and the time
//! the merge took; those are the numbers. The agents run on the same two cores as the collector
//! and the traced programs, so this is a lower bound on what one collector sustains.
//!
//! Then, once each: one host tracing [`BIG_CALLS`] calls as fast as the fixture makes them (the
//! rate one host's `record` sustains), and two hosts tracing [`BIG_CALLS`] calls each; for each,
//! the peak resident memory of the collector and of each agent (`ru_maxrss` of the collector,
//! `VmHWM` of the agents, fresh for the run), and the events lost in transit (the agents'
//! outboxes overflowing) from the collector's summary. The merged trace is written in the native
//! format to keep the disk use small, and removed.

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
/// Calls per traced program in the memory and loss runs: 10 million events a host.
const BIG_CALLS: u64 = 5_000_000;

struct Agents(Vec<Child>);

impl Agents {
    fn start(tracer: &Path, sockets: &Path, names: &[&str]) -> Result<Agents> {
        let agents = Agents(
            names
                .iter()
                .map(|name| {
                    Command::new(tracer)
                        .arg("agent")
                        .arg("--socket")
                        .arg(sockets.join(format!("{name}.sock")))
                        .arg("--allow-commands")
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .context("start an agent")
                })
                .collect::<Result<_>>()?,
        );
        // Up within 20 s, even on a loaded machine.
        for _ in 0..200 {
            if names.iter().all(|n| sockets.join(format!("{n}.sock")).exists()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(200));
        Ok(agents)
    }

    /// Each agent's peak resident memory so far, in MiB.
    fn peak_rss_mib(&self) -> Vec<f64> {
        self.0.iter().map(|a| vm_hwm_mib(a.id()).unwrap_or(f64::NAN)).collect()
    }
}

fn vm_hwm_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status.lines().find(|l| l.starts_with("VmHWM:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Runs `command` to its end; its stderr, whether it succeeded, and its peak resident memory in
/// MiB (`ru_maxrss` of exactly that child).
fn run_measured(command: &mut Command) -> Result<(String, bool, f64)> {
    let child = command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().context("run the collector")?;
    let pid = child.id() as libc::pid_t;
    let mut stderr = child.stderr.context("stderr")?;
    let reading = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, whose pid it owns (not reaped elsewhere).
    if unsafe { libc::wait4(pid, &mut status, 0, &mut usage) } != pid {
        bail!("wait4: {}", std::io::Error::last_os_error());
    }
    let stderr = reading.join().unwrap_or_default();
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    Ok((stderr, ok, usage.ru_maxrss as f64 / 1024.0))
}

/// Events the collector's summary says were lost in transit (none if it names none).
fn lost_in_transit(stderr: &str) -> u64 {
    stderr
        .lines()
        .find_map(|l| l.trim_start_matches("tracer:").trim().strip_prefix("in_transit: "))
        .and_then(|rest| rest.split(':').next()?.trim().parse().ok())
        .unwrap_or(0)
}

/// One run of `hosts` agents each tracing [`BIG_CALLS`] calls: peak memory and loss.
fn memory_and_loss(tracer: &Path, bench: &Path, sockets: &Path, hosts: &[&str]) -> Result<String> {
    let agents = Agents::start(tracer, sockets, hosts)?;
    let out = root().join("target/bench/merged-big.trc");
    let mut command = Command::new(tracer);
    command.arg("collect");
    for h in hosts {
        command.arg("--agent").arg(format!("{h}=unix:{}", sockets.join(format!("{h}.sock")).display()));
    }
    command.args(["-f", "work", "-e", "call,return"]);
    for h in hosts {
        command.arg("-c").arg(format!("{h}:{} {BIG_CALLS}", bench.display()));
    }
    command.arg("-o").arg(&out);
    let (stderr, ok, collector_mib) = run_measured(&mut command)?;
    let agents_mib = agents.peak_rss_mib();
    drop(agents);
    let _ = std::fs::remove_file(&out);
    // An incomplete trace (exit 75) is a result to report, not a failure of the bench.
    let incomplete = stderr.lines().filter(|l| l.contains("the trace is incomplete:")).count();
    if !ok && incomplete == 0 && !stderr.contains("events were lost") {
        bail!("the collector failed: {stderr}");
    }
    for line in stderr.lines().filter(|l| l.contains("lost (") || l.contains("incomplete")) {
        println!("xtask: collector: {line}");
    }
    let events = number_after(&stderr, "events written to", "tracer:").unwrap_or(f64::NAN);
    let lost = lost_in_transit(&stderr);
    let per_host: Vec<String> = hosts
        .iter()
        .map(|h| {
            number_after(&stderr, &format!("host {h}: received"), " s (")
                .map_or("-".to_string(), |r| format!("{:.2}", r / 1e6))
        })
        .collect();
    let agents_mib: Vec<String> = agents_mib.iter().map(|m| format!("{m:.0}")).collect();
    Ok(format!(
        "| {} × {} M events | {events:.0} | {lost} | {incomplete} | {} | {collector_mib:.0} MiB | {} MiB |",
        hosts.len(),
        BIG_CALLS * 2 / 1_000_000,
        per_host.join(" / "),
        agents_mib.join(" / ")
    ))
}

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
    // The agents make their socket directory (private) themselves, inside this one.
    std::fs::create_dir_all(root().join("target/bench"))?;
    let agents = Agents::start(tracer, &sockets, &["a", "b"])?;
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
    println!("\nxtask: 1 run each: hosts each tracing {BIG_CALLS} calls (call + return), merged into a native trace");
    let rows =
        [memory_and_loss(tracer, &bench, &sockets, &["a"])?, memory_and_loss(tracer, &bench, &sockets, &["a", "b"])?];
    println!();
    println!(
        "| hosts | events written | lost in transit | hosts incomplete | ingest per host (M events/s) | collector peak RSS | agents' peak RSS |"
    );
    println!("|---|---|---|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
    Ok(())
}
