//! Helpers for the integration tests: run the real `tracer` binary (named by `TRACER_BIN`, which
//! `cargo xtask test` sets) against fixture programs and read back what it wrote, as a user would:
//! as JSON, without the tracer's own types.

use std::{
    collections::HashMap,
    ffi::OsStr,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

pub mod netns;
pub mod rotel;
pub mod speedscope;

/// No tracer run in these tests should take longer; past it, the run is killed and the test fails.
/// A guard against hangs, not a timing assertion: under the emulated VMs a traced Go recursion
/// took over 60 s when a third VM shared the two cores, so the bound leaves room for that.
const TIMEOUT: Duration = Duration::from_secs(180);

pub fn tracer_bin() -> PathBuf {
    let path = std::env::var_os("TRACER_BIN")
        .expect("TRACER_BIN is not set: run the integration tests with `cargo xtask test`");
    PathBuf::from(path)
}

/// Perfetto's trace types, generated from the protos `tracer` writes with (see build.rs).
#[allow(clippy::all, missing_docs)]
pub mod perfetto {
    include!(concat!(env!("OUT_DIR"), "/perfetto.protos.rs"));

    /// The track events and descriptors of a Perfetto trace file, with its interned names and
    /// incremental timestamps resolved by the tracer's reader (which follows Perfetto's published
    /// semantics and fails on anything it cannot resolve), decoded with the published protos.
    pub fn read(path: &std::path::Path) -> Vec<TracePacket> {
        use prost::Message as _;
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let packets =
            tracer_user::trace::read::perfetto::resolve(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let plain = tracer_user::export::perfetto::protos::Trace { packet: packets }.encode_to_vec();
        Trace::decode(&plain[..]).expect("a Perfetto trace").packet
    }
}

/// A compiled C, C++, Rust or Go fixture (see build.rs).
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(match name {
        "params" => env!("FIXTURE_PARAMS"),
        "filters" => env!("FIXTURE_FILTERS"),
        "filters_nop" => env!("FIXTURE_FILTERS_NOP"),
        "cold_strings" => env!("FIXTURE_COLD_STRINGS"),
        "params_o2" => env!("FIXTURE_PARAMS_O2"),
        "params_dwarf4" => env!("FIXTURE_PARAMS_DWARF4"),
        "params_stripped" => env!("FIXTURE_PARAMS_STRIPPED"),
        "params_cpp" => env!("FIXTURE_PARAMS_CPP"),
        "params_cpp_o2" => env!("FIXTURE_PARAMS_CPP_O2"),
        "rust_params" => env!("FIXTURE_RUST_PARAMS"),
        "rust_params_o3" => env!("FIXTURE_RUST_PARAMS_O3"),
        "calls" => env!("FIXTURE_CALLS"),
        "calls_stripped" => env!("FIXTURE_CALLS_STRIPPED"),
        "bench" => env!("FIXTURE_BENCH"),
        "bench_params" => env!("FIXTURE_BENCH_PARAMS"),
        "bench_params_nodwarf" => env!("FIXTURE_BENCH_PARAMS_NODWARF"),
        "twofiles" => env!("FIXTURE_TWOFILES"),
        "bench_cet" => env!("FIXTURE_BENCH_CET"),
        "bench_plain" => env!("FIXTURE_BENCH_PLAIN"),
        "bench_pfe5" => env!("FIXTURE_BENCH_PFE5"),
        "shapes" => env!("FIXTURE_SHAPES"),
        "client_server_demo" => env!("FIXTURE_CLIENT_SERVER_DEMO"),
        "ipc" => env!("FIXTURE_IPC"),
        "timing" => env!("FIXTURE_TIMING"),
        "sdt_probes_o0" => env!("FIXTURE_SDT_PROBES_O0"),
        "sdt_probes_o2" => env!("FIXTURE_SDT_PROBES_O2"),
        "events_c" => env!("FIXTURE_EVENTS_C"),
        "events_cxx" => env!("FIXTURE_EVENTS_CXX"),
        "throws" => env!("FIXTURE_THROWS"),
        "unwinds_cpp" => env!("FIXTURE_UNWINDS_CPP"),
        "longjmps" => env!("FIXTURE_LONGJMPS"),
        "unwinds_rust" => env!("FIXTURE_UNWINDS_RUST"),
        "gofixture" => env!("FIXTURE_GOFIXTURE"),
        "gofixture_nodwarf" => env!("FIXTURE_GOFIXTURE_NODWARF"),
        "gofixture_stripped" => env!("FIXTURE_GOFIXTURE_STRIPPED"),
        "gofixture_stripped_pie" => env!("FIXTURE_GOFIXTURE_STRIPPED_PIE"),
        "debian_gofmt" => env!("FIXTURE_DEBIAN_GOFMT"),
        "gofmt_symbols" => env!("FIXTURE_GOFMT_SYMBOLS"),
        "breakpoints_o0" => env!("FIXTURE_BREAKPOINTS_O0"),
        "breakpoints_o1" => env!("FIXTURE_BREAKPOINTS_O1"),
        "breakpoints_renamed" => env!("FIXTURE_BREAKPOINTS_RENAMED"),
        other => panic!("no fixture named {other}"),
    })
}

/// What a finished process left.
#[derive(Debug)]
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn code(&self) -> i32 {
        self.status.code().unwrap_or_else(|| panic!("killed by a signal: {self:?}"))
    }

    /// Asserts the tracer failed with exactly one `tracer: error:` sentence on stderr.
    pub fn assert_error(&self, expected_start: &str) {
        assert_ne!(self.code(), 0, "expected a failure: {self:?}");
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "expected one line on stderr: {self:?}");
        let message = lines[0].strip_prefix("tracer: error: ").unwrap_or_else(|| panic!("not an error line: {self:?}"));
        assert!(message.starts_with(expected_start), "expected an error starting {expected_start:?}: {self:?}");
    }
}

/// Waits for a child, killing it (and failing) after [`TIMEOUT`].
pub fn wait_with_timeout(mut child: Child, what: &str) -> Run {
    let deadline = Instant::now() + TIMEOUT;
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let read = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_string(&mut s);
            }
            s
        })
    };
    let out = read(stdout.map(|p| Box::new(p) as Box<dyn std::io::Read + Send>));
    let err = read(stderr.map(|p| Box::new(p) as Box<dyn std::io::Read + Send>));
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Run { status, stdout: out.join().unwrap(), stderr: err.join().unwrap() }
}

/// Runs `tracer` with these arguments.
pub fn tracer<S: AsRef<OsStr>>(args: &[S]) -> Run {
    let child = Command::new(tracer_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tracer");
    wait_with_timeout(child, "tracer")
}

/// `docs/schema/event.schema.json`, the JSON Schema of a JSON lines trace, compiled once.
fn event_schema() -> &'static jsonschema::Validator {
    static SCHEMA: std::sync::OnceLock<jsonschema::Validator> = std::sync::OnceLock::new();
    SCHEMA.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/schema/event.schema.json");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let schema: Value = serde_json::from_str(&text).expect("the schema is JSON");
        jsonschema::validator_for(&schema).unwrap_or_else(|e| panic!("{} is not a valid schema: {e}", path.display()))
    })
}

/// Checks one line of a JSON lines trace against the published schema: `Err` names what does not
/// match, and where.
pub fn check_schema(line: &Value) -> Result<(), String> {
    let errors: Vec<String> =
        event_schema().iter_errors(line).map(|e| format!("{} at {}", e, e.instance_path())).take(5).collect();
    if errors.is_empty() { Ok(()) } else { Err(format!("does not match the schema: {}: {line}", errors.join("; "))) }
}

/// A trace file read back: its first line, events, last line. Every line is checked against the
/// schema users are given (`docs/schema/event.schema.json`).
#[derive(Debug)]
pub struct Trace {
    pub start: Value,
    pub events: Vec<Value>,
    pub end: Value,
}

impl Trace {
    pub fn load(path: &Path) -> Trace {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let mut lines: Vec<Value> = text
            .lines()
            .enumerate()
            .map(|(i, l)| serde_json::from_str(l).unwrap_or_else(|e| panic!("line {} is not JSON ({e}): {l}", i + 1)))
            .collect();
        assert!(lines.len() >= 2, "a trace has at least a start and an end line: {text}");
        let end = lines.pop().unwrap();
        let start = lines.remove(0);
        for (i, line) in lines.iter().enumerate() {
            check_schema(line).unwrap_or_else(|e| panic!("{} line {}: {e}", path.display(), i + 1));
        }
        assert_eq!(start["kind"], "trace_start", "first line: {start}");
        assert_eq!(end["kind"], "trace_end", "last line: {end}");
        for e in &lines {
            for field in ["kind", "ts", "host", "pid", "tid"] {
                assert!(!e[field].is_null(), "event without {field}: {e}");
            }
        }
        assert_eq!(end["events_written"].as_u64(), Some(lines.len() as u64), "events_written");
        Trace { start, events: lines, end }
    }

    pub fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.events.iter().filter(move |e| e["kind"] == kind)
    }

    pub fn calls<'a>(&'a self, function: &'a str) -> Vec<&'a Value> {
        self.of_kind("call").filter(|e| e["function"] == function).collect()
    }

    pub fn returns<'a>(&'a self, function: &'a str) -> Vec<&'a Value> {
        self.of_kind("return").filter(|e| e["function"] == function).collect()
    }

    /// Total lost events, which must be zero for exact counts to mean anything.
    pub fn lost(&self) -> u64 {
        self.end["lost_events"].as_object().expect("lost_events").values().map(|v| v.as_u64().unwrap()).sum()
    }

    /// Checks per thread that timestamps never go back and that every return ends the innermost
    /// open call of the same function, with a duration equal to the time since that call. Returns
    /// the deepest nesting seen per function.
    pub fn check_nesting(&self) -> HashMap<String, usize> {
        let mut stacks: HashMap<u64, Vec<(&str, u64)>> = HashMap::new();
        let mut last_ts: HashMap<u64, u64> = HashMap::new();
        let mut deepest: HashMap<String, usize> = HashMap::new();
        for e in &self.events {
            let tid = e["tid"].as_u64().unwrap();
            let ts = e["ts"].as_u64().unwrap();
            let prev = last_ts.insert(tid, ts).unwrap_or(0);
            assert!(ts >= prev, "thread {tid} went back in time at {e}");
            let stack = stacks.entry(tid).or_default();
            match e["kind"].as_str().unwrap() {
                "call" => {
                    let f = e["function"].as_str().unwrap();
                    stack.push((f, ts));
                    let depth = stack.iter().filter(|(g, _)| *g == f).count();
                    let d = deepest.entry(f.to_string()).or_default();
                    *d = (*d).max(depth);
                }
                "return" => {
                    let f = e["function"].as_str().unwrap();
                    let (top, call_ts) = stack.pop().unwrap_or_else(|| panic!("return without a call: {e}"));
                    assert_eq!(top, f, "return does not match the innermost call: {e}");
                    assert_eq!(e["duration_ns"].as_u64(), Some(ts - call_ts), "duration of {e}");
                }
                "exit" => {
                    stack.clear();
                }
                _ => {}
            }
        }
        deepest
    }
}

/// A temporary directory for one test's output.
pub fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("tracer-test-").tempdir().expect("temp dir")
}

/// `tracer record -o <dir>/trace.jsonl <args>`; returns the run and the trace.
pub fn record<S: AsRef<OsStr>>(dir: &Path, args: &[S]) -> (Run, Trace) {
    let out = dir.join("trace.jsonl");
    let mut all: Vec<&OsStr> = vec![OsStr::new("record"), OsStr::new("-o"), out.as_os_str()];
    all.extend(args.iter().map(AsRef::as_ref));
    let run = tracer(&all);
    assert!(out.exists(), "no trace written: {run:?}");
    let trace = Trace::load(&out);
    (run, trace)
}

/// Starts `tracer <args>` (stdin and stdout null) and returns at once: the child and its stderr.
pub fn spawn_tracer<S: AsRef<OsStr>>(args: &[S]) -> (Child, BufReader<std::process::ChildStderr>) {
    let mut child = Command::new(tracer_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tracer");
    let stderr = BufReader::new(child.stderr.take().unwrap());
    (child, stderr)
}

/// Starts `tracer <args>` and returns once it says it is tracing (`tracer: tracing ...` on
/// stderr): the child, the rest of its stderr, and what it printed until then.
pub fn start_tracing<S: AsRef<OsStr>>(args: &[S]) -> (Child, BufReader<std::process::ChildStderr>, String) {
    let (mut child, mut stderr) = spawn_tracer(args);
    let mut startup = String::new();
    loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).expect("read tracer stderr") == 0 {
            let _ = child.wait();
            panic!("tracer exited before tracing: {startup}");
        }
        startup.push_str(&line);
        if line.starts_with("tracer: tracing ") {
            break;
        }
    }
    (child, stderr, startup)
}

/// A `tracer record` running in the background, started once it has attached everything.
pub struct TracerRun {
    child: Child,
    stderr: BufReader<std::process::ChildStderr>,
    startup: String,
    out: PathBuf,
}

impl TracerRun {
    /// Starts `tracer record -o <dir>/trace.jsonl <args>` and returns once it says it is tracing.
    pub fn start<S: AsRef<OsStr>>(dir: &Path, args: &[S]) -> TracerRun {
        let out = dir.join("trace.jsonl");
        let mut all: Vec<&OsStr> = vec![OsStr::new("record"), OsStr::new("-o"), out.as_os_str()];
        all.extend(args.iter().map(AsRef::as_ref));
        TracerRun::spawn(&all, out.clone())
    }

    /// Starts `tracer <args>` (which writes the trace to `out`) and returns once it says it is
    /// tracing.
    pub fn spawn<S: AsRef<OsStr>>(args: &[S], out: PathBuf) -> TracerRun {
        let (child, stderr, startup) = start_tracing(args);
        TracerRun { child, stderr, startup, out }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends the tracer a signal.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// Kills the tracer (as if it crashed).
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the tracer to end by itself; returns its run and trace.
    pub fn finish(mut self) -> (Run, Trace) {
        let mut rest = String::new();
        use std::io::Read as _;
        self.stderr.read_to_string(&mut rest).expect("read tracer stderr");
        let run = wait_with_timeout(self.child, "tracer");
        let run = Run { stderr: self.startup + &rest, ..run };
        let trace = Trace::load(&self.out);
        (run, trace)
    }
}

/// A fixture process running in the background (`calls loop`), killed when dropped.
pub struct Background {
    pub child: Child,
    stdout: BufReader<std::process::ChildStdout>,
}

impl Background {
    /// Starts `program args` and waits for it to print `ready`.
    pub fn start<S: AsRef<OsStr>>(program: &Path, args: &[S]) -> Background {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start fixture");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read fixture output");
        assert_eq!(line.trim(), "ready", "fixture did not start");
        Background { child, stdout }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Asks the fixture to finish (SIGUSR1) and returns its exit code and last line.
    pub fn finish(mut self) -> (i32, String) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGUSR1) };
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read fixture output");
        let status = self.child.wait().expect("wait fixture");
        (status.code().expect("fixture exited normally"), line.trim().to_string())
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The pid of a running process whose command line (arguments separated and ended by NUL, as
/// in `/proc/PID/cmdline`) satisfies `matches`.
pub fn find_process(matches: impl Fn(&str) -> bool) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.filter_map(Result::ok).find_map(|entry| {
        let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
        matches(&String::from_utf8_lossy(&cmdline)).then_some(pid)
    })
}

/// The integer arguments of a call event.
/// The running kernel's release as (major, minor), from `uname -r`.
pub fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse().ok());
    (parts.next().expect("major"), parts.next().expect("minor"))
}

/// Whether this kernel turns uprobes on 5-byte nops into calls (the optimized path, Linux 6.18),
/// from its version: an oracle independent of the tracer's own detection, which tests compare
/// with `trace_start.kernel.optimized_probes`.
pub fn kernel_optimizes_nop5() -> bool {
    kernel_version() >= (6, 18)
}

/// The path a 5-byte nop's probe takes on this kernel: `optimized`, or `emulated` (like any nop).
pub fn nop5_path() -> &'static str {
    if kernel_optimizes_nop5() { "optimized" } else { "emulated" }
}

pub fn args(e: &Value) -> Vec<u64> {
    e["args"].as_array().expect("args").iter().map(|a| a.as_u64().unwrap()).collect()
}

pub fn u64_field(e: &Value, field: &str) -> u64 {
    e[field].as_u64().unwrap_or_else(|| panic!("no integer {field} in {e}"))
}

/// A new secret file in `dir`, made by `tracer agent --gen-secret` (mode 0600).
pub fn gen_secret(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(format!("secret-{name}"));
    let run = tracer(&[OsStr::new("agent"), OsStr::new("--gen-secret"), path.as_os_str()]);
    assert_eq!(run.code(), 0, "{run:?}");
    path
}

/// `tracer agent` on this machine, on a Unix socket in `dir` (or on TCP with `--listen` among
/// `extra`), its log in a file; stopped on drop.
pub struct LocalAgent {
    pub child: Child,
    /// Where it listens, as a collector names it: `unix:PATH` or `ADDR:PORT`.
    pub addr: String,
    pub socket: PathBuf,
    log: PathBuf,
}

impl LocalAgent {
    pub fn start(dir: &Path, name: &str, extra: &[&str]) -> LocalAgent {
        LocalAgent::start_with(dir, name, extra, |_| {})
    }

    /// The same, letting `prepare` adjust the command first.
    pub fn start_with(dir: &Path, name: &str, extra: &[&str], prepare: impl FnOnce(&mut Command)) -> LocalAgent {
        let socket = dir.join(format!("{name}.sock"));
        let log = dir.join(format!("agent-{name}.log"));
        let mut command = Command::new(tracer_bin());
        command.arg("agent");
        if !extra.contains(&"--listen") {
            command.arg("--socket").arg(&socket);
        }
        // Commands' output beside the log, not in the machine's /var/log/tracer-agent.
        if !extra.contains(&"--command-output-dir") {
            command.arg("--command-output-dir").arg(dir.join("command-output"));
        }
        command.args(extra).stdin(Stdio::null()).stdout(Stdio::null()).stderr(std::fs::File::create(&log).unwrap());
        prepare(&mut command);
        let child = command.spawn().expect("start agent");
        let mut agent = LocalAgent { child, addr: String::new(), socket, log };
        let line = agent.wait_for_log("listening on ");
        // "tracer agent: listening on ADDR as NAME..."
        agent.addr = line.split("listening on ").nth(1).unwrap().split(' ').next().unwrap().to_string();
        agent
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `NAME=ADDR`, for `tracer collect --agent`.
    pub fn spec(&self, name: &str) -> String {
        format!("{name}={}", self.addr)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (up to 20 s) for a line containing `text` in the log; returns the line.
    pub fn wait_for_log(&self, text: &str) -> String {
        self.wait_for_log_lines(text, 1)
    }

    /// Waits until the log has `n` lines containing `text`; returns the `n`th.
    pub fn wait_for_log_lines(&self, text: &str, n: usize) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(line) = self.log().lines().filter(|l| l.contains(text)).nth(n - 1) {
                return line.to_string();
            }
            assert!(Instant::now() < deadline, "agent never logged {text:?} {n} times: {}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for LocalAgent {
    fn drop(&mut self) {
        stop_child(&mut self.child);
    }
}

/// Stops a child of the test as an agent should be stopped: SIGTERM, then SIGKILL after 10 s.
pub fn stop_child(child: &mut std::process::Child) {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A process's state letter from `/proc/PID/stat` (`R`, `S`, `T`, `Z`...), if it exists.
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// How many BPF objects (programs, maps, links) a process holds open.
pub fn bpf_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter(|e| {
                    std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("anon_inode:bpf"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// Children of `pid` that have exited and not been reaped.
pub fn zombie_children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&child| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else { return false };
            let Some((_, rest)) = stat.rsplit_once(") ") else { return false };
            let fields: Vec<&str> = rest.split(' ').collect();
            fields[0] == "Z" && fields[1] == pid.to_string()
        })
        .collect()
}

/// Writes a merged trace of two hosts whose start lists none (written by hand, or by another
/// tool): each host has a process 7 whose thread 7 makes different calls, `serve` once on a
/// (process `web`, exit 0), `query` twice, nested, on b (process `db`, exit 3).
pub fn write_two_host_trace(trace: &Path) {
    let on = |host: &str, kind: &str, ts: u64, function: &str, rest: &str| {
        format!(
            r#"{{"kind":"{kind}","ts":{ts},"host":"{host}","pid":7,"tid":7,"function":"{function}","module":"/bin/x",{rest}}}"#
        )
    };
    let (call, ret) = (r#""args":[0,0,0,0,0,0]"#, r#""retval":0"#);
    let lines = [
        r#"{"kind":"trace_start","format_version":1,"host":"a","tracer_version":"0.1.0","ts":1000000000,"clock":{"source":"test","offset_ns":0,"uncertainty_ns":0},"targets":[],"probes":2,"events":["call","return"],"follow_children":true}"#.to_string(),
        on("a", "call", 1000001000, "serve", call),
        on("b", "call", 1000001500, "query", call),
        on("b", "call", 1000001600, "query", call),
        on("b", "return", 1000001700, "query", &format!("{ret},\"duration_ns\":100")),
        on("a", "return", 1000005000, "serve", &format!("{ret},\"duration_ns\":4000")),
        on("b", "return", 1000009000, "query", &format!("{ret},\"duration_ns\":7500")),
        r#"{"kind":"exit","ts":1000009500,"host":"a","pid":7,"tid":7,"exit_code":0,"signal":null,"thread":false,"comm":"web"}"#.to_string(),
        r#"{"kind":"exit","ts":1000009600,"host":"b","pid":7,"tid":7,"exit_code":3,"signal":null,"thread":false,"comm":"db"}"#.to_string(),
        r#"{"kind":"trace_end","ts":1000010000,"reason":"duration","events_written":8,"lost_events":{},"calls_without_return_probe":0,"command_exit_code":null,"ipc":{"sends":0,"recvs":0,"linked_recvs":0,"unlinked_recvs":0,"linked_signals":0}}"#.to_string(),
    ];
    std::fs::write(trace, lines.join("\n") + "\n").unwrap();
}
