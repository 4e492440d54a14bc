//! `cargo xtask bench --only otlp`: what OTLP export costs on top of reading a trace.
//!
//! The export bench's synthetic trace, at [`EVENTS`] events (about 480,000 calls, and sends and
//! receives between two processes), is exported [`RUNS`] times each way, alternating:
//! `tracer export T -o T.jsonl` (JSON lines in, JSON lines out: reading the trace and writing it
//! again) and `tracer export T --otlp URL` to `rotel-agent start --exporter blackhole` (a real
//! OpenTelemetry collector, from `cargo xtask setup`, that receives, decodes and discards). The
//! median wall time and peak RSS of each are shown; the OTLP run also says how many spans it sent
//! and lost (from its stderr), and the bench fails if any was lost or the count is not the
//! trace's (a span per call, send and receive, and one per process).

use std::{
    io::{BufRead as _, BufReader},
    net::{TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{bench::median, bench_export, root, toolchain};

/// Events in the synthetic trace.
const EVENTS: u64 = 1_000_000;
const RUNS: usize = 3;

/// A rotel-agent receiving OTLP/HTTP and discarding it; stopped (by its pid) when dropped.
struct Rotel {
    child: Child,
    url: String,
}

impl Rotel {
    fn start(dir: &Path) -> Result<Rotel> {
        let agent = toolchain::rotel_agent().context("rotel-agent is not installed: run `cargo xtask setup`")?;
        let port = || -> Result<u16> { Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port()) };
        let (http, grpc) = (port()?, port()?);
        let child = Command::new(agent)
            .args(["start", "--exporter", "blackhole"])
            .args(["--otlp-http-endpoint", &format!("127.0.0.1:{http}")])
            .args(["--otlp-grpc-endpoint", &format!("127.0.0.1:{grpc}")])
            .arg("--pid-file")
            .arg(dir.join("rotel-bench.pid"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start rotel-agent")?;
        let rotel = Rotel { child, url: format!("http://127.0.0.1:{http}") };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", http)).is_err() {
            if Instant::now() > deadline {
                bail!("rotel-agent did not listen on {http} within 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(rotel)
    }
}

impl Drop for Rotel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The spans the trace makes: one per call, send and receive, and one per traced process.
fn expected_spans(trace: &Path) -> Result<u64> {
    let file = std::fs::File::open(trace).with_context(|| format!("cannot read {}", trace.display()))?;
    let mut spans = 0;
    let mut processes = std::collections::BTreeSet::new();
    for line in BufReader::new(file).lines() {
        let line = line?;
        for kind in [r#""kind":"call""#, r#""kind":"send""#, r#""kind":"recv""#] {
            if line.starts_with(&format!("{{{kind}")) {
                spans += 1;
            }
        }
        if let Some(rest) = line.split(r#""pid":"#).nth(1) {
            processes.insert(rest.split([',', '}']).next().unwrap_or_default().to_string());
        }
    }
    Ok(spans + processes.len() as u64)
}

/// The number in `tracer: N spans sent to ...`.
fn spans_sent(stderr: &str) -> Option<u64> {
    stderr.lines().find_map(|l| l.strip_prefix("tracer: ")?.split_once(" spans sent to ")?.0.parse().ok())
}

pub fn run(tracer: &Path) -> Result<()> {
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let trace = dir.join("synthetic-1M.jsonl");
    if !trace.exists() {
        println!("xtask: generating a synthetic trace of {EVENTS} events in {}", trace.display());
        let partial = trace.with_extension("partial");
        bench_export::generate(&partial, EVENTS)?;
        std::fs::rename(&partial, &trace)?;
    }
    let spans = expected_spans(&trace)?;
    let rotel = Rotel::start(&dir)?;
    let out = dir.join("otlp-bench-out.jsonl");
    let (mut jsonl, mut otlp) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let mut cmd = Command::new(tracer);
        cmd.arg("export").arg(&trace).arg("-o").arg(&out);
        let (wall, kib, _) = bench_export::run_measured_output(&cmd)?;
        jsonl.push((wall, kib));
        let mut cmd = Command::new(tracer);
        cmd.arg("export").arg(&trace).arg("--otlp").arg(&rotel.url);
        let (wall, kib, stderr) = bench_export::run_measured_output(&cmd)?;
        let sent =
            spans_sent(&stderr).with_context(|| format!("tracer export --otlp said no 'spans sent': {stderr}"))?;
        if sent != spans || stderr.contains("were lost") {
            bail!("tracer export --otlp sent {sent} of {spans} spans: {stderr}");
        }
        otlp.push((wall, kib));
    }
    let _ = std::fs::remove_file(&out);
    println!("xtask: {} ({EVENTS} events, {spans} spans), {RUNS} runs each, alternating; medians", trace.display());
    println!();
    println!("| command | wall time | spans/s | peak memory (RSS) | spans lost |");
    println!("|---|---|---|---|---|");
    let rows =
        [("tracer export T -o T.jsonl", &jsonl, "-"), ("tracer export T --otlp URL (rotel, blackhole)", &otlp, "0")];
    let mut walls = Vec::new();
    for (what, runs, lost) in rows {
        let wall = median(runs.iter().map(|r| r.0).collect());
        let kib = median(runs.iter().map(|r| r.1).collect());
        walls.push(wall);
        println!(
            "| `{what}` | {:.2} s | {:.0} k | {:.0} MiB | {lost} |",
            wall.as_secs_f64(),
            spans as f64 / wall.as_secs_f64() / 1e3,
            kib as f64 / 1024.0
        );
    }
    let extra = walls[1].saturating_sub(walls[0]);
    println!();
    println!(
        "OTLP costs {:.2} s more than JSON lines for {spans} spans (ratio {:.2})",
        extra.as_secs_f64(),
        walls[1].as_secs_f64() / walls[0].as_secs_f64()
    );
    Ok(())
}
