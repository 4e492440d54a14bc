//! `cargo xtask bench --only export`: how fast the exporters and `tracer report` read a big trace,
//! how much memory they need, and how big each output is.
//!
//! A synthetic trace of [`EVENTS`] events is generated once (kept in `target/bench/`): two
//! processes of two threads each, serving requests whose calls nest up to 6 deep over 40
//! functions (each function calls up to three others, or itself: about 10^5 distinct stacks), with
//! sends and receives between the processes. Each tool is run on it once; peak memory is the tool's
//! maximum resident set (`wait4`'s `ru_maxrss`, taken by `xtask peak-rss`).

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;

use crate::root;

/// Events in the synthetic trace.
pub const EVENTS: u64 = 10_000_000;
const FUNCTIONS: u64 = 40;
const MAX_DEPTH: u32 = 6;

/// One line of the synthetic trace, as `tracer record` writes it (the fields a kind does not
/// have are left out).
#[derive(Serialize)]
struct Line<'a> {
    kind: &'a str,
    ts: u64,
    host: &'a str,
    pid: u32,
    tid: u32,
    #[serde(flatten)]
    data: Data<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Data<'a> {
    Call { function: &'a str, module: &'a str, args: [u64; 6] },
    Return { function: &'a str, module: &'a str, retval: u64, duration_ns: u64 },
    Send { channel: Channel, fd: i32, bytes: u64, syscall: &'a str, flow_id: u64, syscall_ns: u64 },
    Recv { channel: Channel, fd: i32, bytes: u64, syscall: &'a str, flow_ids: [u64; 1], syscall_ns: u64 },
}

#[derive(Clone, Copy, Serialize)]
struct Channel {
    #[serde(rename = "type")]
    kind: &'static str,
    id: u64,
}

/// A small deterministic generator (an LCG): the same trace every time.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

struct Generator<W: Write> {
    out: W,
    rng: Lcg,
    names: Vec<String>,
    events: u64,
}

impl<W: Write> Generator<W> {
    fn line(&mut self, line: &Line) -> Result<()> {
        serde_json::to_writer(&mut self.out, line)?;
        self.out.write_all(b"\n")?;
        self.events += 1;
        Ok(())
    }

    /// One call and its callees on thread `(pid, tid)` from `*now`; advances `*now`.
    fn call(&mut self, pid: u32, tid: u32, now: &mut u64, function: u64, depth: u32) -> Result<()> {
        let start = *now;
        let name = self.names[function as usize].clone();
        let module = "/usr/bin/server";
        let args = [depth as u64, function, 0, 0, 0, 0];
        self.line(&Line {
            kind: "call",
            ts: start,
            host: "bench",
            pid,
            tid,
            data: Data::Call { function: &name, module, args },
        })?;
        *now += 50 + self.rng.below(500);
        if depth < MAX_DEPTH {
            for _ in 0..self.rng.below(4) {
                // Each function has three callees, and sometimes recurses.
                let callee =
                    if self.rng.below(8) == 0 { function } else { (function * 7 + self.rng.below(3)) % FUNCTIONS };
                self.call(pid, tid, now, callee, depth + 1)?;
                *now += self.rng.below(200);
            }
        }
        let duration_ns = *now - start;
        let data = Data::Return { function: &name, module, retval: duration_ns, duration_ns };
        self.line(&Line { kind: "return", ts: *now, host: "bench", pid, tid, data })
    }
}

/// Writes the synthetic trace (start line, about `events` events, end line).
pub(crate) fn generate(path: &Path, events: u64) -> Result<()> {
    let file = File::create(path).with_context(|| format!("cannot write {}", path.display()))?;
    let mut g = Generator {
        out: BufWriter::with_capacity(1 << 20, file),
        rng: Lcg(42),
        names: (0..FUNCTIONS).map(|i| format!("server::handler_{i:02}")).collect(),
        events: 0,
    };
    let t0: u64 = 1_700_000_000_000_000_000;
    let start = serde_json::json!({
        "kind": "trace_start", "format_version": 1, "host": "bench", "tracer_version": "bench", "ts": t0,
        "clock": {"source": "synthetic", "offset_ns": 0, "uncertainty_ns": 0},
        "targets": [{"type": "process", "pid": 100, "comm": "server", "exe": "/usr/bin/server"},
                    {"type": "process", "pid": 200, "comm": "client", "exe": "/usr/bin/server"}],
        "probes": FUNCTIONS, "events": ["call", "return", "send", "recv"], "follow_children": false,
    });
    serde_json::to_writer(&mut g.out, &start)?;
    g.out.write_all(b"\n")?;
    let threads = [(100, 100), (100, 101), (200, 200), (200, 201)];
    let mut clocks = [t0; 4];
    let channel = Channel { kind: "pipe", id: 7 };
    let mut flow = 0;
    while g.events < events.saturating_sub(2) {
        for (i, &(pid, tid)) in threads.iter().enumerate() {
            let root = g.rng.below(FUNCTIONS);
            g.call(pid, tid, &mut clocks[i], root, 0)?;
            clocks[i] += 1_000;
        }
        // The server's first thread answers the client's first thread.
        flow += 1;
        let ts = clocks[0];
        let data = Data::Send { channel, fd: 4, bytes: 64, syscall: "write", flow_id: flow, syscall_ns: 300 };
        g.line(&Line { kind: "send", ts, host: "bench", pid: 100, tid: 100, data })?;
        clocks[2] = clocks[2].max(ts + 1_000);
        let data = Data::Recv { channel, fd: 3, bytes: 64, syscall: "read", flow_ids: [flow], syscall_ns: 300 };
        g.line(&Line { kind: "recv", ts: clocks[2], host: "bench", pid: 200, tid: 200, data })?;
    }
    let end_ts = clocks.into_iter().max().unwrap_or(t0);
    let end = serde_json::json!({
        "kind": "trace_end", "ts": end_ts, "reason": "duration", "events_written": g.events, "lost_events": {},
    });
    serde_json::to_writer(&mut g.out, &end)?;
    g.out.write_all(b"\n")?;
    g.out.flush()?;
    Ok(())
}

/// Runs a command to completion; returns its wall time and peak resident memory in KiB.
///
/// The command runs under `xtask peak-rss`, a fresh process: a child forked straight from this one
/// would report this process's own peak (the kernel carries the parent's high-water mark over the
/// `exec`), and the overhead benchmark may have made that large.
fn run_measured(cmd: &Command) -> Result<(Duration, u64)> {
    run_measured_output(cmd).map(|(wall, kib, _)| (wall, kib))
}

/// [`run_measured`], also returning the command's stderr.
pub(crate) fn run_measured_output(cmd: &Command) -> Result<(Duration, u64, String)> {
    let start = Instant::now();
    let output = Command::new(std::env::current_exe()?)
        .arg("peak-rss")
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    let wall = start.elapsed();
    if !output.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    let kib = String::from_utf8_lossy(&output.stdout).trim().parse().context("peak-rss printed no number")?;
    Ok((wall, kib, String::from_utf8_lossy(&output.stderr).into_owned()))
}

/// `xtask peak-rss COMMAND...`: runs the command, prints its peak resident memory in KiB, and
/// fails if it did.
pub fn peak_rss(command: &[String]) -> Result<()> {
    let child = Command::new(&command[0])
        .args(&command[1..])
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot run {}", command[0]))?;
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 on our own child, with valid pointers.
    if unsafe { libc::wait4(pid, &mut status, 0, &mut usage) } != pid {
        bail!("cannot wait for {}: {}", command[0], std::io::Error::last_os_error());
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("{} failed (wait status {status})", command[0]);
    }
    println!("{}", usage.ru_maxrss);
    Ok(())
}

pub fn run(tracer: &Path) -> Result<()> {
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let trace = dir.join("synthetic-10M.jsonl");
    if !trace.exists() {
        println!("xtask: generating a synthetic trace of {EVENTS} events in {}", trace.display());
        let partial = trace.with_extension("partial");
        generate(&partial, EVENTS)?;
        std::fs::rename(&partial, &trace)?;
    }
    let size = std::fs::metadata(&trace)?.len();
    println!("xtask: each tool reads {} ({EVENTS} events, {:.2} GB) once", trace.display(), size as f64 / 1e9);
    println!();
    println!("| command | wall time | events/s | peak memory (RSS) | output | bytes/event |");
    println!("|---|---|---|---|---|---|");
    // The format follows the extension.
    let outputs = [
        "synthetic.json",
        "synthetic.flame.json",
        "synthetic.folded",
        "synthetic.svg",
        "synthetic.pftrace",
        "synthetic.speedscope.json",
    ];
    let mut runs: Vec<(String, Command, Option<PathBuf>)> = outputs
        .iter()
        .map(|name| {
            let mut cmd = Command::new(tracer);
            cmd.arg("export").arg(&trace).arg("-o").arg(dir.join(name));
            (format!("tracer export -o {name}"), cmd, Some(dir.join(name)))
        })
        .collect();
    let mut report = Command::new(tracer);
    report.arg("report").arg(&trace);
    runs.push(("tracer report".to_string(), report, None));
    let mut report_json = Command::new(tracer);
    report_json.arg("report").arg("--by-process").arg("--json").arg(&trace);
    runs.push(("tracer report --by-process --json".to_string(), report_json, None));
    for (what, cmd, output) in runs {
        let (wall, rss_kib) = run_measured(&cmd)?;
        let (size, per_event) = match output {
            Some(path) => {
                let bytes = std::fs::metadata(&path)?.len();
                (format!("{:.3} GB", bytes as f64 / 1e9), format!("{:.1}", bytes as f64 / EVENTS as f64))
            }
            None => ("-".to_string(), "-".to_string()),
        };
        println!(
            "| `{what}` | {:.1} s | {:.2} M | {:.0} MiB | {size} | {per_event} |",
            wall.as_secs_f64(),
            EVENTS as f64 / wall.as_secs_f64() / 1e6,
            rss_kib as f64 / 1024.0
        );
    }
    Ok(())
}
