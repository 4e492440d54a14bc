//! `cargo xtask bench --only startup`: how long `tracer record` takes from start to exit, and the
//! memory it holds at its peak, for 1, 100 and 10,000 probed functions (each with its return),
//! against bpftrace counting the same probes in the same run (up to [`BPFTRACE_MAX_PROBES`]), runs
//! alternated; then the agent's
//! memory idle and during a trace.
//!
//! The traced program is generated here: [`FUNCTIONS`] small functions, each called once, so that
//! the run is start-up and shutdown, not tracing.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};

use crate::{
    bench::{RUNS, ensure_bpftrace, has_bpftrace, median},
    bench_cluster::run_measured,
    root,
};

/// Functions of the generated program, `fn_0` .. `fn_9999`.
const FUNCTIONS: usize = 10_000;
/// How long one bpftrace run may take.
const BPFTRACE_LIMIT: Duration = Duration::from_secs(120);
/// The most probes bpftrace is run with. It attaches and detaches one perf-event uprobe at a
/// time: 100 took it 23 s here (3 Dec 2026), 10,000 had not ended after 5 minutes, and a run
/// stopped then went on unregistering its uprobes for an hour in the kernel, in D state, slowing
/// every measurement after it on the machine.
const BPFTRACE_MAX_PROBES: usize = 100;

/// Builds the program of [`FUNCTIONS`] functions (once; its source is rewritten only if it
/// changed).
fn many_functions() -> Result<PathBuf> {
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let mut source = String::from("#include <stdio.h>\n");
    for i in 0..FUNCTIONS {
        writeln!(source, "__attribute__((noinline)) int fn_{i}(int x) {{ return x + {i}; }}")?;
    }
    source.push_str("int main(void) {\n    int sum = 0;\n");
    for i in 0..FUNCTIONS {
        writeln!(source, "    sum = fn_{i}(sum);")?;
    }
    source.push_str("    printf(\"%d\\n\", sum);\n    return 0;\n}\n");
    let (c, exe) = (dir.join("many_functions.c"), dir.join("many_functions"));
    if std::fs::read_to_string(&c).ok().as_deref() != Some(source.as_str()) || !exe.exists() {
        std::fs::write(&c, &source)?;
        let status = Command::new("gcc").args(["-O1", "-o"]).arg(&exe).arg(&c).status().context("run gcc")?;
        ensure!(status.success(), "gcc failed on {}", c.display());
    }
    Ok(exe)
}

/// One run: wall time and peak resident memory (MiB).
fn once(command: &mut Command) -> Result<(Duration, f64)> {
    let start = Instant::now();
    let m = run_measured(command)?;
    let wall = start.elapsed();
    if !m.ok {
        bail!("{command:?} failed: {}", m.stderr);
    }
    Ok((wall, m.peak_mib))
}

pub fn run(tracer: &Path) -> Result<()> {
    let exe = many_functions()?;
    ensure_bpftrace();
    let bpftrace = has_bpftrace();
    let out = root().join("target/bench/startup.jsonl");
    println!(
        "xtask: {RUNS} alternated runs of each; a generated program of {FUNCTIONS} functions, each called once \
         (target/bench/many_functions.c); `tracer record -e call,return -f PATTERN` against bpftrace \
         `uprobe:...{{ @c = count(); }} uretprobe:...{{ @r = count(); }}` on the same functions"
    );
    println!();
    println!("| functions probed | tracer, start to exit | bpftrace | ratio | tracer, peak RSS | bpftrace | ratio |");
    println!("|---|---|---|---|---|---|---|");
    let sets: [(usize, &[&str]); 3] = [(1, &["fn_0"]), (100, &["fn_?", "fn_??"]), (FUNCTIONS, &["fn_*"])];
    for (n, patterns) in sets {
        let tracer_command = || {
            let mut c = Command::new(tracer);
            c.args(["record", "-e", "call,return", "--max-probes", &(2 * FUNCTIONS).to_string(), "-o"]).arg(&out);
            for p in patterns {
                c.args(["-f", p]);
            }
            c.arg("--").arg(&exe);
            c
        };
        // bpftrace's wildcard is `*` alone: the hundred are named one by one.
        let names: Vec<String> = if n == 100 {
            (0..100).map(|i| format!("fn_{i}")).collect()
        } else {
            patterns.iter().map(|p| p.to_string()).collect()
        };
        let probes = |kind: &str| names.iter().map(|p| format!("{kind}:{}:{p}", exe.display())).collect::<Vec<_>>();
        let script = format!(
            "{} {{ @c = count(); }} {} {{ @r = count(); }}",
            probes("uprobe").join(","),
            probes("uretprobe").join(",")
        );
        // Within BPFTRACE_LIMIT, beyond which its row says so.
        let bpftrace_command = || {
            let mut c = Command::new("timeout");
            c.args(["-k", "10", &BPFTRACE_LIMIT.as_secs().to_string(), "bpftrace", "-e", &script, "-c"])
                .arg(&exe)
                .stdin(Stdio::null())
                // Its default refuses more than 512 probes.
                .env("BPFTRACE_MAX_PROBES", "100000");
            c
        };
        let (mut ours, mut theirs, mut too_slow) = (Vec::new(), Vec::new(), false);
        for _ in 0..RUNS {
            ours.push(once(&mut tracer_command())?);
            if bpftrace && n <= BPFTRACE_MAX_PROBES && !too_slow {
                match once(&mut bpftrace_command()) {
                    Ok(run) => theirs.push(run),
                    Err(_) => too_slow = true,
                }
            }
        }
        check_probes(&out, n)?;
        let (wall, rss) = (median(ours.iter().map(|r| r.0).collect()), median(ours.iter().map(|r| r.1).collect()));
        let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1e3);
        if too_slow {
            println!(
                "| {n} | {} | did not end within {} s | — | {rss:.0} MiB | — | — |",
                ms(wall),
                BPFTRACE_LIMIT.as_secs()
            );
            continue;
        }
        if bpftrace && n > BPFTRACE_MAX_PROBES {
            println!(
                "| {n} | {} | not run: bpftrace attaches one uprobe at a time (100 took 23 s; 10,000 had not \
                 ended after 5 min, and its uprobes took an hour to unregister after it was stopped) | — | \
                 {rss:.0} MiB | — | — |",
                ms(wall)
            );
            continue;
        }
        if theirs.is_empty() {
            println!("| {n} | {} | — | — | {rss:.0} MiB | — | — |", ms(wall));
            continue;
        }
        let (b_wall, b_rss) =
            (median(theirs.iter().map(|r| r.0).collect()), median(theirs.iter().map(|r| r.1).collect()));
        println!(
            "| {n} | {} | {} | **{:.2}x** | {rss:.0} MiB | {b_rss:.0} MiB | **{:.2}x** |",
            ms(wall),
            ms(b_wall),
            wall.as_secs_f64() / b_wall.as_secs_f64(),
            rss / b_rss
        );
    }
    agent(tracer, &exe)
}

/// Each probed function was called once and returned: the trace has `n` of each.
fn check_probes(trace: &Path, n: usize) -> Result<()> {
    let text = std::fs::read_to_string(trace)?;
    let count = |kind: &str| text.lines().filter(|l| l.contains(&format!("\"kind\":\"{kind}\""))).count();
    ensure!(
        count("call") == n && count("return") == n,
        "{n} probes: {} calls, {} returns",
        count("call"),
        count("return")
    );
    Ok(())
}

fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

/// `bench --only agent`: the agent's rows alone.
pub fn run_agent(tracer: &Path) -> Result<()> {
    agent(tracer, &many_functions()?)
}

/// The agent's resident memory idle, and at its peak during a trace of 100 functions.
fn agent(tracer: &Path, exe: &Path) -> Result<()> {
    let dir = root().join("target/bench/startup-agent");
    std::fs::create_dir_all(&dir)?;
    let socket = dir.join("a.sock");
    let _ = std::fs::remove_file(&socket);
    let mut agent = Command::new(tracer)
        .arg("agent")
        .arg("--socket")
        .arg(&socket)
        .arg("--allow-commands")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start an agent")?;
    let pid = agent.id();
    let result = (|| {
        for _ in 0..200 {
            if socket.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_secs(1));
        let idle = status_kib(pid, "VmRSS:")?;
        let mut rows = Vec::new();
        for _ in 0..RUNS {
            // A fresh peak for each trace.
            std::fs::write(format!("/proc/{pid}/clear_refs"), "5")?;
            let out = dir.join("trace.jsonl");
            let run = Command::new(tracer)
                .arg("collect")
                .arg("--agent")
                .arg(format!("a=unix:{}", socket.display()))
                .args(["-e", "call,return", "-f", "fn_?", "-f", "fn_??", "-o"])
                .arg(&out)
                .arg("-c")
                .arg(format!("a:{}", exe.display()))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()?;
            ensure!(run.success(), "collect failed");
            rows.push(status_kib(pid, "VmHWM:")?);
        }
        let after = status_kib(pid, "VmRSS:")?;
        println!();
        println!("| the agent (`tracer agent`) | resident memory |");
        println!("|---|---|");
        println!("| idle, after start-up | {:.0} MiB |", idle as f64 / 1024.0);
        println!(
            "| peak during a trace of 100 functions (median of {RUNS}) | {:.0} MiB |",
            median(rows) as f64 / 1024.0
        );
        println!("| idle again, after {RUNS} traces | {:.0} MiB |", after as f64 / 1024.0);
        Ok(())
    })();
    let _ = agent.kill();
    let _ = agent.wait();
    result
}
