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
//!
//! The goal those runs check (issue 16): no event lost in transit at the rate one host's `record`
//! sustains. So the same fixture, with the same call count, is first traced by `tracer record`
//! alone, and the table sets side by side: the traced program's own event rate (its calls ×2 over
//! its run time, which it prints), the collector's ingest rate, the events lost in transit, the
//! agent's outbox at its fullest (the agent logs it at the end of a trace: how close transit came
//! to losing events, whatever the cores' load), and the CPU time per event of each process
//! (`/proc/PID/stat` of the agents, `ru_utime + ru_stime` of the collector and of `record`): on
//! two cores, agent, collector and traced program compete, which `record` alone does not.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

use crate::{
    bench::{fixture, median},
    root,
};

/// Calls per traced program (two events each).
const CALLS: u64 = 1_000_000;
const RUNS: usize = 3;
/// Calls per traced program in the memory and loss runs: 10 million events a host.
const BIG_CALLS: u64 = 5_000_000;

struct Agents(Vec<Child>);

/// Where an agent's stdout (the traced program's, which it launched) and stderr go.
fn agent_log(sockets: &Path, name: &str, stream: &str) -> std::path::PathBuf {
    sockets.with_file_name(format!("agent-{name}.{stream}"))
}

impl Agents {
    /// Agents named `names`; with `logs`, their stdout and stderr go to [`agent_log`]'s files.
    fn start(tracer: &Path, sockets: &Path, names: &[&str], logs: bool) -> Result<Agents> {
        let output = |name: &str, stream: &str| -> Result<Stdio> {
            Ok(if logs { std::fs::File::create(agent_log(sockets, name, stream))?.into() } else { Stdio::null() })
        };
        let agents = Agents(
            names
                .iter()
                .map(|name| {
                    Command::new(tracer)
                        .arg("agent")
                        .arg("--socket")
                        .arg(sockets.join(format!("{name}.sock")))
                        .arg("--allow-commands")
                        .stdout(output(name, "out")?)
                        .stderr(output(name, "err")?)
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

    /// Each agent's CPU time so far (user + system), in seconds.
    fn cpu_s(&self) -> Vec<f64> {
        self.0.iter().map(|a| proc_cpu_s(a.id()).unwrap_or(f64::NAN)).collect()
    }
}

fn proc_cpu_s(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    Some(ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64)
}

/// The traced program's own event rate (two events a call) from its last line,
/// `calls N ns T`, in events per second.
fn program_rate(stdout: &str) -> Option<f64> {
    let line = stdout.lines().rev().find(|l| l.starts_with("calls "))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let calls: f64 = words.get(1)?.parse().ok()?;
    let ns: f64 = words.get(3)?.parse().ok()?;
    Some(2.0 * calls / ns * 1e9)
}

/// The agent's closing line on its outbox: "held at most N events (M MiB encoded)".
fn outbox_peak(stderr: &str) -> Option<(f64, f64)> {
    let rest = stderr.lines().find_map(|l| l.split_once("the outbox held at most ").map(|(_, r)| r))?;
    let events = rest.split_whitespace().next()?.parse().ok()?;
    let mib = rest.split_once('(')?.1.split_whitespace().next()?.parse().ok()?;
    Some((events, mib))
}

fn vm_hwm_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status.lines().find(|l| l.starts_with("VmHWM:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Runs `command` to its end; its stderr, whether it succeeded, and its peak resident memory in
/// MiB (`ru_maxrss` of exactly that child).
pub(crate) fn run_measured(command: &mut Command) -> Result<Measured> {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().context("run the collector")?;
    let mut stdout = child.stdout.take().context("stdout")?;
    let reading_out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut text);
        text
    });
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
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(Measured {
        stdout: reading_out.join().unwrap_or_default(),
        stderr,
        ok,
        peak_mib: usage.ru_maxrss as f64 / 1024.0,
        cpu_s: seconds(usage.ru_utime) + seconds(usage.ru_stime),
    })
}

pub(crate) struct Measured {
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    pub(crate) ok: bool,
    /// Peak resident memory, MiB.
    pub(crate) peak_mib: f64,
    /// CPU time, user + system, seconds.
    pub(crate) cpu_s: f64,
}

/// `tracer record` alone on the fixture, [`BIG_CALLS`] calls: the program's event rate, the
/// events lost, and a table row.
fn record_alone(tracer: &Path, bench: &Path) -> Result<(f64, String)> {
    let out = root().join("target/bench/record-big.trc");
    let m = run_measured(
        Command::new(tracer)
            .args(["record", "-e", "call,return", "-f", "work", "-o"])
            .arg(&out)
            .arg("--")
            .arg(bench)
            .arg(BIG_CALLS.to_string()),
    )?;
    let _ = std::fs::remove_file(&out);
    if !m.ok {
        bail!("tracer record failed: {}", m.stderr);
    }
    for line in m.stderr.lines().filter(|l| l.contains("lost")) {
        println!("xtask: record: {line}");
    }
    let rate = program_rate(&m.stdout).with_context(|| format!("no `calls N ns T` line: {}", m.stdout))?;
    let events = 2.0 * BIG_CALLS as f64;
    let row = format!(
        "| `tracer record` alone, 1 × {} M events | {:.2} | - | {} | - | - | {:.2} (record) | {:.0} MiB |",
        BIG_CALLS * 2 / 1_000_000,
        rate / 1e6,
        if m.stderr.contains("lost") { "see above" } else { "0" },
        m.cpu_s / events * 1e6,
        m.peak_mib,
    );
    Ok((rate, row))
}

/// What one agent → collector run measured, for the closing sentence.
struct Transit {
    ingest: Vec<f64>,
    lost: u64,
    outbox_peak_events: Vec<f64>,
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
fn memory_and_loss(tracer: &Path, bench: &Path, sockets: &Path, hosts: &[&str]) -> Result<(Transit, String)> {
    let agents = Agents::start(tracer, sockets, hosts, true)?;
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
    let Measured { stderr, ok, peak_mib: collector_mib, cpu_s: collector_cpu, .. } = run_measured(&mut command)?;
    let agents_mib = agents.peak_rss_mib();
    let agents_cpu = agents.cpu_s();
    drop(agents);
    let _ = std::fs::remove_file(&out);
    let logs: Vec<(String, String)> = hosts
        .iter()
        .map(|h| {
            let read = |stream| std::fs::read_to_string(agent_log(sockets, h, stream)).unwrap_or_default();
            let logs = (read("out"), read("err"));
            let _ = std::fs::remove_file(agent_log(sockets, h, "out"));
            let _ = std::fs::remove_file(agent_log(sockets, h, "err"));
            logs
        })
        .collect();
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
    let ingest: Vec<f64> = hosts
        .iter()
        .map(|h| number_after(&stderr, &format!("host {h}: received"), " s (").unwrap_or(f64::NAN))
        .collect();
    let program: Vec<f64> = logs.iter().map(|(out, _)| program_rate(out).unwrap_or(f64::NAN)).collect();
    let peaks: Vec<(f64, f64)> = logs.iter().map(|(_, err)| outbox_peak(err).unwrap_or((f64::NAN, f64::NAN))).collect();
    let per_event_us = |cpu: f64| cpu / (BIG_CALLS as f64 * 2.0) * 1e6;
    let join = |v: Vec<String>| v.join(" / ");
    let row = format!(
        "| agent → collector, {} × {} M events | {} | {} | {lost} | {incomplete} | {} | {} / {:.2} | {collector_mib:.0} MiB / {} MiB |",
        hosts.len(),
        BIG_CALLS * 2 / 1_000_000,
        join(program.iter().map(|r| format!("{:.2}", r / 1e6)).collect()),
        join(ingest.iter().map(|r| format!("{:.2}", r / 1e6)).collect()),
        join(peaks.iter().map(|(e, m)| format!("{e:.0} ({m:.1} MiB)")).collect()),
        join(agents_cpu.iter().map(|c| format!("{:.2}", per_event_us(*c))).collect()),
        collector_cpu / (BIG_CALLS as f64 * 2.0 * hosts.len() as f64) * 1e6,
        join(agents_mib.iter().map(|m| format!("{m:.0}")).collect()),
    );
    println!("xtask: {row} ({events:.0} events written)");
    Ok((Transit { ingest, lost, outbox_peak_events: peaks.iter().map(|p| p.0).collect() }, row))
}

impl Drop for Agents {
    fn drop(&mut self) {
        for a in &mut self.0 {
            let _ = a.kill();
            let _ = a.wait();
        }
    }
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
    let agents = Agents::start(tracer, &sockets, &["a", "b"], false)?;
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
    let (record_rate, record_row) = record_alone(tracer, &bench)?;
    let (one, one_row) = memory_and_loss(tracer, &bench, &sockets, &["a"])?;
    let (_, two_row) = memory_and_loss(tracer, &bench, &sockets, &["a", "b"])?;
    println!();
    println!(
        "| run | traced program's rate (M events/s) | ingest per host (M events/s) | lost in transit | hosts incomplete | agent's outbox at its fullest (events, encoded) | CPU per event, agent / collector (µs) | peak RSS, collector / agents |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    println!("{record_row}");
    println!("{one_row}");
    println!("{two_row}");
    let bound = 2_000_000.0; // the agent's default --buffer-events
    let keeps_up = one.lost == 0 && one.ingest[0] >= record_rate;
    println!(
        "\nxtask: one host: ingest {:.2} M events/s against `record` alone {:.2} M events/s, {} lost in transit: {}; the outbox peaked at {:.0} events, {:.1} % of its bound ({bound:.0})",
        one.ingest[0] / 1e6,
        record_rate / 1e6,
        one.lost,
        if keeps_up {
            "the transit keeps up with record's rate"
        } else {
            "below record's rate (see the CPU per event)"
        },
        one.outbox_peak_events[0],
        one.outbox_peak_events[0] / bound * 100.0,
    );
    Ok(())
}
