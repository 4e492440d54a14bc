//! The `tracer` command line. `main.rs` parses it and calls [`run`]; everything a user sees on
//! stderr (warnings, the summary, errors) is written here, never by the library.

mod advice;
mod cluster;
mod docs;
mod examples;
pub mod kernel_log;
mod list;
mod pattern_list;
mod status;
pub mod stderr;
mod top;
mod values;
mod view;

use std::{
    collections::BTreeSet,
    ffi::OsString,
    fs::File,
    io::{BufReader, Write},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context as _, bail};
use clap::{Args, Parser, Subcommand};
use pattern_list::PatternList;
use tracer_user::printable::Printable;

use tracer_user::{
    analysis::{
        call_listing::{CallFilter, CallPrinter},
        stats::{self, ReportBuilder, SortColumn},
    },
    breakpoints::{
        BreakpointError,
        spec::{BreakSpec, WatchSpec},
    },
    event::host,
    event::{EndReason, EventKind, TraceEnd, why_lost},
    export::{Format, hosts::HostGrouping, jsonl, otlp},
    output_file::OutputFile,
    plan::{self, RecordOptions},
    record,
    sink::Sink,
    targets::launch::Start,
    trace::read,
};

#[derive(Debug, Parser)]
#[command(name = "tracer", version, about = "Trace what processes do: function calls, spawns, exits", long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Trace processes (running ones, every run of a binary, or a command to launch).
    #[command(after_help = examples::RECORD)]
    Record(RecordArgs),
    /// What `record` could probe in some executables or processes: functions (with their source
    /// and parameters) and USDT probes.
    #[command(after_help = examples::LIST)]
    List(list::ListArgs),
    /// Convert a recorded JSON lines trace to another format.
    #[command(after_help = examples::EXPORT)]
    Export(ExportArgs),
    /// Time per function (calls, total, self, percentiles) and what each process did.
    #[command(after_help = examples::REPORT)]
    Report(ReportArgs),
    /// Each thread's calls in order, as an indented tree with start times and durations.
    #[command(after_help = examples::CALLS)]
    Calls(CallsArgs),
    /// Live per-function statistics (calls, time, percentiles) aggregated in the kernel.
    #[command(after_help = examples::TOP)]
    Top(top::TopArgs),
    /// Wait for a collector and trace for it on this host.
    #[command(after_help = examples::AGENT)]
    Agent(cluster::AgentArgs),
    /// Trace on several hosts at once through their agents, and merge into one timeline.
    #[command(after_help = examples::COLLECT)]
    Collect(cluster::CollectArgs),
    /// Show a trace in the browser: flame graphs, the function table, call trees, processes.
    #[command(after_help = examples::VIEW)]
    View(view::ViewArgs),
    /// Write the man pages and shell completions into DIR (`cargo xtask dist` does).
    #[command(hide = true)]
    Docs { dir: PathBuf },
}

#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Trace this running process (repeatable, or a comma list: -p 1,2).
    #[arg(short, long = "pid", value_name = "PID", value_delimiter = ',')]
    pub pids: Vec<u32>,
    /// Trace every process that runs this executable, now or later (repeatable).
    #[arg(short, long = "binary", value_name = "PATH")]
    pub binaries: Vec<PathBuf>,
    #[command(flatten)]
    pub trace: TraceOptions,
    /// Output file ('-' for standard output); the format comes from --format or the extension.
    #[arg(short, long, value_name = "PATH", default_value = "trace.jsonl")]
    pub output: PathBuf,
    /// The name of this host in the trace (every event's `host`), so that traces recorded on
    /// several machines can be told apart (default: this machine's host name).
    #[arg(long, value_name = "NAME", value_parser = parse_host_name)]
    pub host_name: Option<String>,
    /// Print the eBPF programs' diagnostics of their rare failures (a payload they could not read)
    /// on stderr, as `tracer: kernel: ...` lines.
    #[arg(long)]
    pub debug_kernel: bool,
    /// Write only the native calls that last at least this long (1.5 = seconds, 10ms, 250us),
    /// with their returns; decided in the kernel at each return (docs/record.md).
    #[arg(long, value_name = "DURATION", value_parser = values::duration)]
    pub min_duration: Option<Duration>,
    /// With --min-duration: write the calls made inside a call long enough too, whatever
    /// their own duration (held per thread in user space, at most 16384 events: docs/record.md).
    #[arg(long, requires = "min_duration")]
    pub min_duration_keep_children: bool,
    /// Say on stderr what start-up did: the kernel's mechanisms, the ring buffer's size, the
    /// programs loaded; and, when some probes are slow, how to make them fast (said without -v
    /// only the first time on a machine).
    #[arg(short, long)]
    pub verbose: bool,
    /// Attach probes this way instead of the best way the kernel has (to compare the two on one
    /// kernel: tests and benches).
    #[arg(long, value_enum, hide = true)]
    pub attach: Option<tracer_user::kernel::features::AttachMechanism>,
    /// Probe native returns this way instead of the way the traced programs need (`exits` where
    /// they unwind stacks, else `return_address`): to compare the two (tests and benches).
    #[arg(long, value_enum, hide = true)]
    pub returns: Option<tracer_user::functions::unwinding::ReturnProbes>,
    /// Read strings without faulting their pages in, as on a kernel without sleepable uprobes
    /// (tests and benches).
    #[arg(long, hide = true)]
    pub no_sleepable: bool,
    #[command(flatten)]
    pub serve: view::ServeArgs,
    /// The command to launch and trace, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// What to record and how: the options `record` and `collect` share.
#[derive(Debug, Args)]
pub struct TraceOptions {
    /// Functions to probe (repeatable): a glob over demangled names, optionally prefixed by a
    /// module or by a source file glob (ending in .c .cc .cpp .cxx .h .hpp .rs: the functions
    /// its DWARF says are defined there), e.g. 'fib', 'app::*', 'libc.so.6:malloc',
    /// 'src/net.c:*'; or a comma list of them. Default: every function of the main executable.
    #[arg(short, long = "functions", visible_alias = "function", value_name = "PATTERN", value_parser = pattern_list::parse)]
    pub functions: Vec<PatternList>,
    #[command(flatten)]
    pub triggers: Triggers,
    /// USDT probes to trace (repeatable): [MODULE:]PROVIDER:NAME with globs, in the targets and
    /// their libraries, e.g. 'libc:setjmp', 'libstdc++.so.6:libstdcxx:throw'; or a comma list.
    #[arg(short, long = "usdt", value_name = "PATTERN", value_parser = pattern_list::parse)]
    pub usdt: Vec<PatternList>,
    /// A breakpoint (repeatable): FILE:LINE or FUNCTION+OFFSET in the traced executable (on each
    /// host, under `collect`), found through its DWARF; every time a thread gets there, a `break` event with the parameters
    /// and locals in scope (`char *` and `char[N]` read as strings, as parameters are).
    #[arg(short = 'B', long = "break", value_name = "FILE:LINE", value_parser = parse_break)]
    pub breaks: Vec<BreakSpec>,
    /// Watch a global or static variable (repeatable, at most 4): VARIABLE, VARIABLE:rw (reads
    /// too) or ADDRESS:LENGTH; every write is a `watch` event with the value written and the
    /// function and line that wrote it (hardware breakpoints). A process that execs another
    /// program is no longer watched.
    #[arg(short = 'w', long = "watch", value_name = "VARIABLE", value_parser = parse_watch)]
    pub watches: Vec<WatchSpec>,
    /// Comma list of call,return,spawn,exit,ipc,log,usdt,break,watch (ipc: send,recv,signal; log:
    /// what the targets say through tracer-events; usdt: the -u probes; break, watch: the -B
    /// breakpoints and -w watchpoints).
    #[arg(short, long, value_name = "LIST", value_delimiter = ',', default_value = "call,return,spawn,exit,ipc,log,usdt,break,watch", value_parser = EventKind::parse_list_item)]
    pub events: Vec<Vec<EventKind>>,
    /// Do not follow children (following forks and execs is the default).
    #[arg(long)]
    pub no_follow: bool,
    /// Output format (default: from the output's extension: .jsonl, .json, .flame.json, .folded,
    /// .svg, .pftrace, .speedscope.json, .trc, .pcapng).
    #[arg(long, value_parser = values::format(), value_name = "FMT")]
    pub format: Option<Format>,
    /// Stop after this long: 1.5 (seconds), 250ms, 2m.
    #[arg(short, long, value_name = "DURATION", value_parser = values::duration)]
    pub duration: Option<Duration>,
    /// Size of the kernel's ring buffer: a power of two, e.g. 32M (default: fitted to the trace,
    /// 4 MiB a CPU with function or USDT probes or IPC events, 512 KiB a CPU without, 1-64 MiB).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub buffer_size: Option<u32>,
    /// Refuse to probe more functions than this without -f.
    #[arg(long, value_name = "N", default_value_t = plan::DEFAULT_MAX_PROBES)]
    pub max_probes: usize,
    /// Bytes read of each string parameter (C `char *`, Rust `&str`), string return value and
    /// string local at a breakpoint at most; a longer one is marked truncated.
    #[arg(long, value_name = "BYTES", default_value_t = tracer_user::debuginfo::layout::DEFAULT_STRING_SIZE,
          value_parser = clap::value_parser!(u16).range(1..=tracer_user::debuginfo::layout::MAX_STRING_SIZE as i64))]
    pub string_size: u16,
    /// Copy the first N bytes of every traced send and receive (0: none; at most 4096): JSON lines
    /// get `payload` (base64) and `payload_truncated`.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub capture_bytes: u32,
    /// pcapng output: also write the events that are not messages (calls, returns, spawns,
    /// exits, signals) as packets holding their JSON lines.
    #[arg(long)]
    pub pcap_events: bool,
    #[command(flatten)]
    pub otlp: OtlpOptions,
}

/// Triggers and depth (`record`, `collect`, `top`): which calls of each thread are written (or,
/// in `top`, timed). Decided in the kernel.
#[derive(Args, Clone, Debug, Default)]
pub struct Triggers {
    /// On each thread, take function calls only from its entry into a function matching this
    /// pattern on, that call included (repeatable, or a comma list; patterns as -f's, probed
    /// even if no -f names them): uftrace's trace_on.
    #[arg(long, value_name = "PATTERN", value_parser = pattern_list::parse)]
    pub start_at: Vec<PatternList>,
    /// When a thread enters a function matching this pattern, stop taking its function calls
    /// (that call included) until it enters a --start-at function (repeatable, or a comma list):
    /// uftrace's trace_off. With --stop-at alone, threads start taking calls.
    #[arg(long, value_name = "PATTERN", value_parser = pattern_list::parse)]
    pub stop_at: Vec<PatternList>,
    /// Take only the native calls nested at most N traced calls deep on their thread (1: only
    /// the outermost traced calls; 1 to 64), with their returns.
    #[arg(long, value_name = "N")]
    pub depth: Option<u32>,
}

/// Sending the trace to an OpenTelemetry collector as well.
#[derive(Debug, Args, Clone, Default)]
pub struct OtlpOptions {
    /// Send the trace's spans and program log records to this OpenTelemetry collector too
    /// (OTLP/HTTP protobuf), e.g. http://127.0.0.1:4318 (`/v1/traces` and `/v1/logs` are appended
    /// when the URL names no path; a `.../v1/traces` URL sends log records to `.../v1/logs`).
    #[arg(long, value_name = "URL", value_parser = parse_otlp_url)]
    pub otlp: Option<String>,
    /// The `service.name` of the spans sent with --otlp (default: each process's command name).
    #[arg(long, value_name = "NAME", requires = "otlp")]
    pub service_name: Option<String>,
}

impl OtlpOptions {
    /// The OTLP sink asked for, if any, joined to `sink`.
    /// `live`: the trace is being recorded (a full export queue drops batches rather than hold
    /// the recording up); otherwise it is read from a file, and the queue waits.
    pub(crate) fn add_to(&self, sink: Box<dyn Sink + Send>, live: bool) -> Box<dyn Sink + Send> {
        match self.sink(live) {
            Some(otlp) => Box::new(vec![sink, otlp]),
            None => sink,
        }
    }

    pub(crate) fn config(&self, live: bool) -> Option<otlp::OtlpConfig> {
        let url = self.otlp.clone()?;
        Some(otlp::OtlpConfig {
            url,
            service_name: self.service_name.clone(),
            retry: Default::default(),
            wait_when_full: !live,
            ids: otlp::IdKey::random(),
            exporting: Default::default(),
        })
    }

    pub(crate) fn sink(&self, live: bool) -> Option<Box<dyn Sink + Send>> {
        // The URL was checked when parsed.
        Some(Box::new(otlp::OtlpSink::new(self.config(live)?).expect("a URL parse_otlp_url accepted")))
    }
}

fn parse_otlp_url(s: &str) -> Result<String, otlp::UrlError> {
    otlp::traces_endpoint(s).map(|_| s.to_string())
}

impl TraceOptions {
    /// The event kinds asked for (`ipc` stands for send, recv and signal).
    pub fn event_kinds(&self) -> BTreeSet<EventKind> {
        self.events.iter().flatten().copied().collect()
    }
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// A JSON lines trace written by `tracer record`.
    pub input: PathBuf,
    /// Output file ('-' for standard output); optional with --otlp.
    #[arg(short, long, value_name = "PATH", required_unless_present = "otlp")]
    pub output: Option<PathBuf>,
    /// Output format (default: from the output's extension).
    #[arg(long, value_parser = values::format(), value_name = "FMT")]
    pub format: Option<Format>,
    /// pcapng output: also write the events that are not messages as packets (see `record`).
    #[arg(long)]
    pub pcap_events: bool,
    #[command(flatten)]
    pub otlp: OtlpOptions,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A trace written by `tracer record` (JSON lines or native).
    #[arg(default_value = "trace.jsonl")]
    pub input: PathBuf,
    /// One row per process and function.
    #[arg(long)]
    pub by_process: bool,
    /// Sort the function table by this column (numbers biggest first).
    #[arg(long, value_parser = values::sort_column(), value_name = "COLUMN", default_value = "total")]
    pub sort: SortColumn,
    /// Write the report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CallsArgs {
    /// A trace written by `tracer record` (JSON lines or native).
    #[arg(default_value = "trace.jsonl")]
    pub input: PathBuf,
    /// Only this process.
    #[arg(short, long, value_name = "PID")]
    pub pid: Option<u32>,
    /// Only this thread.
    #[arg(short, long, value_name = "TID")]
    pub tid: Option<u32>,
    /// Only calls of functions matching this glob, with their callees.
    #[arg(short, long = "function", value_name = "PATTERN")]
    pub function: Option<String>,
    /// Hide calls shorter than this, e.g. 500ns, 20us, 1.5ms, 2s (a bare number is seconds).
    #[arg(long, value_name = "DURATION", value_parser = values::duration, default_value = "0")]
    pub min_duration: Duration,
    /// Show calls at most this many levels below the outermost call shown (0: only those).
    #[arg(long, value_name = "N")]
    pub max_depth: Option<usize>,
}

fn parse_break(s: &str) -> Result<BreakSpec, BreakpointError> {
    BreakSpec::parse(s)
}

fn parse_watch(s: &str) -> Result<WatchSpec, BreakpointError> {
    WatchSpec::parse(s)
}

fn parse_host_name(s: &str) -> Result<String, host::NameError> {
    host::check_name(s).map(|()| s.to_string())
}

pub(crate) fn parse_bytes(s: &str) -> Result<u32, String> {
    let n = parse_size::Config::new().with_binary().parse_size(s).map_err(|e| format!("'{s}' is not a size ({e})"))?;
    u32::try_from(n).map_err(|_| format!("'{s}' is more than 4 GiB"))
}

/// SIGINT, SIGTERM and SIGHUP as they arrive, each with whether the kernel sent it (a terminal's
/// Ctrl-C or hang-up, which reached the whole foreground process group) or a process did. The
/// handlers are installed at once, so that a signal arriving before it is awaited is not lost.
pub(crate) struct StopSignals {
    received: tokio::sync::mpsc::UnboundedReceiver<(i32, bool)>,
}

impl StopSignals {
    pub(crate) fn install() -> anyhow::Result<StopSignals> {
        use signal_hook::iterator::{SignalsInfo, exfiltrator::WithOrigin};
        let mut signals = SignalsInfo::<WithOrigin>::new([libc::SIGINT, libc::SIGTERM, libc::SIGHUP])
            .context("cannot handle signals")?;
        let (tx, received) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for origin in signals.forever() {
                let from_kernel = matches!(origin.cause, signal_hook::low_level::siginfo::Cause::Kernel);
                if tx.send((origin.signal, from_kernel)).is_err() {
                    return;
                }
            }
        });
        Ok(StopSignals { received })
    }

    /// The next signal and whether the kernel sent it.
    async fn next(&mut self) -> (i32, bool) {
        match self.received.recv().await {
            Some(s) => s,
            None => std::future::pending().await,
        }
    }

    /// Runs blocking start-up `work` (planning, loading, attaching: seconds on a loaded machine)
    /// on a thread of its own, so that a signal meanwhile is acted on at once: `Err(signal)`.
    /// The work cannot be cancelled mid-way; the caller ends the process (see
    /// [`interrupted_at_start`]).
    async fn unless_interrupted<T: Send + 'static>(
        &mut self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, i32> {
        let work = tokio::task::spawn_blocking(work);
        tokio::select! {
            done = work => Ok(done.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))),
            (signal, _) = self.next() => Err(signal),
        }
    }

    /// Runs [`Recording::start`](record::Recording::start) like [`Self::unless_interrupted`], except that a
    /// signal after the start has traced its targets cannot cut it short (see
    /// [`record::StartGate`]): then the start is waited for, and its recording comes back with the
    /// signal, to be ended at once.
    async fn start_unless_interrupted(
        &mut self,
        plan: plan::Plan,
    ) -> Result<(Result<record::Recording, plan::RecordError>, Option<i32>), i32> {
        let gate = Arc::new(record::StartGate::default());
        let mut work = tokio::task::spawn_blocking({
            let gate = gate.clone();
            move || record::Recording::start_gated(plan, &gate)
        });
        let finished = |done: Result<_, tokio::task::JoinError>| {
            done.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
        };
        tokio::select! {
            done = &mut work => Ok((finished(done), None)),
            (signal, _) = self.next() => match gate.abandon() {
                true => Err(signal),
                false => Ok((finished(work.await), Some(signal))),
            },
        }
    }

    /// The next signal, as the reason a trace ends.
    pub(crate) async fn stop(mut self) -> EndReason {
        end_reason(self.next().await.0)
    }

    /// With a launched command still running, the first signal goes to it (unless the terminal
    /// already sent it to the whole process group) and the trace goes on until the command exits;
    /// a second one stops the trace at once. Once the command has exited (the trace goes on for
    /// `-b`, `-p` or its traced descendants), the first signal stops the trace.
    async fn forward_then_stop(mut self, command: Option<u32>, progress: Arc<record::Progress>) -> EndReason {
        let Some(pid) = command else { return self.stop().await };
        let (signal, from_terminal) = self.next().await;
        if progress.command_exited() {
            return end_reason(signal);
        }
        let name = nix::sys::signal::Signal::try_from(signal).map_or("a signal", |s| s.as_str());
        if !from_terminal {
            // SAFETY: kill(2) on the command we launched (and have not reaped: it has not exited).
            unsafe { libc::kill(pid as i32, signal) };
        }
        status::say(&format!(
            "tracer: {name} {} the command (pid {pid}); tracing goes on until it exits (signal again to stop now)",
            if from_terminal { "reached" } else { "passed on to" }
        ));
        self.stop().await
    }
}

/// Ends the process after a signal during start-up, which is still running on its own thread and
/// cannot be stopped mid-way: exiting releases what it set up (the kernel detaches probes when
/// their descriptors close; a launched command that has not exec'd yet exits 127 when its start
/// pipe closes), and nothing was traced.
fn interrupted_at_start(signal: i32) -> ! {
    let name = nix::sys::signal::Signal::try_from(signal).map_or("a signal", |s| s.as_str());
    status::say(&format!("tracer: {name} during start-up: stopped before anything was traced"));
    std::process::exit(128 + signal)
}

fn end_reason(signal: i32) -> EndReason {
    match signal {
        libc::SIGINT => EndReason::Interrupted,
        libc::SIGHUP => EndReason::HungUp,
        _ => EndReason::Terminated,
    }
}

/// Resolves on SIGINT, SIGTERM or SIGHUP, saying which.
pub(crate) fn stop_signal() -> anyhow::Result<impl Future<Output = EndReason>> {
    Ok(StopSignals::install()?.stop())
}

/// The exit status of a trace whose launched command was still running at its end: 128 + the
/// signal that stopped tracing, else 0 (`--duration`, or the collector stopped it).
pub(crate) fn still_running_code(reason: EndReason) -> i32 {
    match reason {
        EndReason::Interrupted => 128 + libc::SIGINT,
        EndReason::Terminated => 128 + libc::SIGTERM,
        EndReason::HungUp => 128 + libc::SIGHUP,
        _ => 0,
    }
}

/// Runs a parsed command line; returns the process exit code.
pub fn run(cli: Cli) -> anyhow::Result<i32> {
    // The commands whose standard output is what they make: a reader that stops reading
    // (`tracer report --json | head -1`) is not a failure. Not the agent's and collector's, whose
    // broken pipes are their network connections.
    let writes_stdout = |result: anyhow::Result<i32>| match result {
        Err(e) if is_broken_pipe(&e) => Ok(0),
        other => other,
    };
    match cli.command {
        Command::Record(args) => writes_stdout(record(args)),
        Command::List(args) => writes_stdout(list::list(args)),
        Command::Export(args) => writes_stdout(export(args)),
        Command::Report(args) => writes_stdout(report(args)),
        Command::Calls(args) => writes_stdout(calls(args)),
        Command::Top(args) => writes_stdout(top::top(args)),
        Command::Agent(args) => cluster::agent(args),
        Command::Collect(args) => cluster::collect(args),
        Command::View(args) => view::view(args),
        Command::Docs { dir } => docs::generate(&dir),
    }
}

/// The format for an output path: `--format`, else the extension.
pub(crate) fn output_format(path: &Path, format: Option<Format>) -> anyhow::Result<Format> {
    if let Some(f) = format {
        return Ok(f);
    }
    if path == Path::new("-") {
        return Ok(Format::Jsonl);
    }
    match Format::from_path(path) {
        Some(f) => Ok(f),
        None => bail!(
            "cannot tell the output format from '{}'; add --format (jsonl, chrome, flamegraph, folded, svg, perfetto, speedscope, native or pcapng)",
            path.display()
        ),
    }
}

/// Opens the output (before anything is attached, so that an unwritable path costs nothing): the
/// writer, and the file to [`OutputFile::commit`] once the trace is complete (none: standard output).
pub(crate) fn open_output(path: &Path, keep: Previous) -> anyhow::Result<(Box<dyn Write + Send>, Option<OutputFile>)> {
    if path == Path::new("-") {
        return Ok((Box::new(std::io::stdout()), None));
    }
    let mut file = OutputFile::create(path, "the trace")?;
    if keep == Previous::Keep {
        file = file.keeping_previous();
    }
    Ok((Box::new(file.writer()?), Some(file)))
}

/// What becomes of a file the output replaces: recordings keep it as `NAME.old`, conversions
/// replace it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Previous {
    Keep,
    Replace,
}

pub(crate) fn describe_output(path: &Path) -> String {
    if path == Path::new("-") { "standard output".to_string() } else { path.display().to_string() }
}

fn record(args: RecordArgs) -> anyhow::Result<i32> {
    plan::check_root()?;
    args.serve.check()?;
    let format = output_format(&args.output, args.trace.format)?;
    let options = RecordOptions {
        pids: args.pids,
        binaries: args.binaries,
        command: args.command,
        events: args.trace.event_kinds(),
        functions: pattern_list::flatten(args.trace.functions),
        usdt: pattern_list::flatten(args.trace.usdt),
        breaks: args.trace.breaks,
        watches: args.trace.watches,
        follow_children: !args.trace.no_follow,
        duration: args.trace.duration,
        buffer_size: args.trace.buffer_size,
        max_probes: args.trace.max_probes,
        string_size: args.trace.string_size,
        capture_bytes: args.trace.capture_bytes,
        host: args.host_name.unwrap_or_else(host::default_name),
        debug_kernel: args.debug_kernel,
        attach: args.attach,
        return_probes: args.returns,
        no_sleepable: args.no_sleepable,
        min_duration_ns: args.min_duration.map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        keep_children: args.min_duration_keep_children,
        start_at: pattern_list::flatten(args.trace.triggers.start_at),
        stop_at: pattern_list::flatten(args.trace.triggers.stop_at),
        depth: args.trace.triggers.depth,
        // With `-o -`, standard output is the trace: the command's goes to stderr.
        start: if args.output == Path::new("-") { Start::InheritStdoutToStderr } else { Start::Inherit },
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async move {
        let mut signals = StopSignals::install()?;
        let plan = signals
            .unless_interrupted(move || plan::plan(options))
            .await
            .unwrap_or_else(|s| interrupted_at_start(s))?;
        let (out, output_file) = open_output(&args.output, Previous::Keep)?;
        print_warnings(&plan.warnings);
        if let Some(summary) = &plan.probe_summary {
            advice::print_probe_summary(summary, args.verbose);
        }
        let mut sink = args.trace.otlp.add_to(format.sink_with_events(out, args.trace.pcap_events), true);
        // Formats that are only readable once complete get their events in a JSON lines spool
        // as well, flushed as they come: what a crash leaves is there.
        let spool = spool_path(&args.output, format);
        let spool_file = spool.as_deref().map(|path| OutputFile::create_in_place(path, "the spool")).transpose()?;
        if let Some(file) = &spool_file {
            sink = Box::new(vec![sink, Box::new(jsonl::JsonlWriter::new(file.writer()?)) as Box<dyn Sink + Send>]);
        }
        let (recording, interrupted) = match signals.start_unless_interrupted(plan).await {
            Ok((recording, interrupted)) => (recording?, interrupted),
            Err(signal) => {
                // Nothing was written: the empty output is removed as it is dropped, the spool here.
                drop((output_file, spool_file));
                if let Some(path) = &spool {
                    let _ = std::fs::remove_file(path);
                }
                interrupted_at_start(signal)
            }
        };
        print_warnings(&recording.warnings);
        let served = {
            let progress = recording.progress();
            let counters = Arc::new(move || (progress.events_written(), progress.lost()));
            args.serve.start(tracer_user::view::model::ViewModel::default(), counters)?
        };
        let viewer = served.map(|(model_sink, viewer)| {
            let file = std::mem::replace(&mut sink, Box::new(Vec::new()));
            sink = Box::new(vec![file, Box::new(model_sink) as Box<dyn Sink + Send>]);
            viewer
        });
        if args.verbose {
            stderr::info(recording.startup_details());
        }
        stderr::info(format_args!(
            "tracing {} function(s){}; writing {} to {}{}",
            recording.trace_start().probes,
            match recording.usdt_sites {
                0 => String::new(),
                n => format!(" and {n} USDT probe site(s)"),
            },
            format.describe(),
            describe_output(&args.output),
            spool
                .as_ref()
                .map_or(String::new(), |p| format!(" (and, until it is complete, JSON lines to {})", p.display()))
        ));
        let progress = recording.progress();
        let stop = {
            let (command, progress) = (recording.command_pid(), recording.progress());
            async move {
                match interrupted {
                    // A signal that came once the start was past walking away: the trace ends at once.
                    Some(signal) => end_reason(signal),
                    None => signals.forward_then_stop(command, progress).await,
                }
            }
        };
        let counts = || (progress.events_written(), progress.lost());
        let outcome = match status::with_status("written", counts, recording.run(&mut *sink, stop)).await {
            // A reader that stopped reading (`tracer record -o - | head`): not a failure.
            Err(plan::RecordError::Output(e))
                if args.output == Path::new("-") && e.kind() == std::io::ErrorKind::BrokenPipe =>
            {
                return Ok(0);
            }
            other => other?,
        };
        drop(sink);
        // The page open on the live view gets the whole trace before tracer exits.
        if let Some(viewer) = viewer {
            viewer.finish();
        }
        output_file.map(OutputFile::commit).transpose()?;
        if let Some(path) = &spool {
            drop(spool_file);
            let _ = std::fs::remove_file(path);
        }
        print_summary(&outcome.end, &args.output);
        if let Some(pid) = outcome.command_still_running {
            stderr::info(format_args!("the command (pid {pid}) is still running, untraced"));
        }
        Ok(match outcome.command_exit {
            Some(exit) => exit.shell_code(),
            None if outcome.command_still_running.is_some() => still_running_code(outcome.end.reason),
            None => 0,
        })
    })
}

/// Where `record` spools the events of a trace written in a format that is only readable once
/// complete: beside the output, removed when the trace is.
fn spool_path(output: &Path, format: Format) -> Option<PathBuf> {
    (!format.streams() && output != Path::new("-"))
        .then(|| PathBuf::from(format!("{}.partial.jsonl", output.display())))
}

fn print_warnings(warnings: &[String]) {
    for w in warnings {
        stderr::warning(w);
    }
}

/// The end of a trace on stderr: how many events, why it ended, and anything lost.
pub(crate) fn print_summary(end: &TraceEnd, output: &Path) {
    stderr::info(format_args!("{} events written to {} ({})", end.events_written, describe_output(output), end.reason));
    let lost = end.total_lost();
    if lost > 0 {
        stderr::warning(format_args!("{lost} events were lost:"));
        for (kind, n) in end.lost_events.iter().filter(|(_, n)| **n > 0) {
            stderr::info(format_args!("  {kind}: {n}: {}", why_lost(kind)));
        }
    }
    for (function, f) in end.filters.iter().filter(|(_, f)| f.entries_lost > 0 || f.returns_not_dropped > 0) {
        stderr::warning(format_args!(
            "{function}: {} calls decided at their return were not written (their held entry was pushed out of the kernel's full map, or began before tracing), {} returns of refused calls were written unpaired",
            f.entries_lost, f.returns_not_dropped
        ));
    }
    if let Some(u) = &end.unmatched_functions {
        let patterns: Vec<String> = u.patterns.iter().map(|p| format!("'{p}'")).collect();
        let suggestions = match u.suggestions.is_empty() {
            true => String::new(),
            false => format!("; did you mean {}?", u.suggestions.join(", ")),
        };
        stderr::warning(format_args!(
            "no function matching {} in any program the trace saw ({}){suggestions}",
            patterns.join(", "),
            u.images.join(", ")
        ));
    }
    if end.calls_without_return_probe > 0 {
        stderr::info(format_args!(
            "note: {} calls were nested more than {} probed calls deep: the kernel gives them no return probe, so they have no return event",
            end.calls_without_return_probe,
            tracer_user::assemble::pairing::MAX_URETPROBE_DEPTH
        ));
    }
}

type Trace = read::AnyReader<BufReader<File>>;

/// Opens a recorded trace (before any output is created, so that a wrong path costs nothing).
fn open_trace(input: &Path) -> anyhow::Result<Trace> {
    let file = File::open(input).with_context(|| format!("cannot read {}", input.display()))?;
    read::AnyReader::detect(BufReader::with_capacity(1 << 20, file)).map_err(|e| match e {
        read::OpenError::NotATrace(what) => anyhow::anyhow!(
            "{} is {what}, not a trace: report, calls and export read the JSON lines (.jsonl) and native (.trc) traces that tracer record writes",
            input.display()
        ),
        e => anyhow::Error::from(e).context(format!("cannot read {}", input.display())),
    })
}

/// Replays a recorded trace into a sink, saying on stderr if it was cut short.
fn replay(input: &Path, trace: Trace, sink: &mut dyn Sink) -> anyhow::Result<read::Replayed> {
    let replayed = read::replay(trace, sink).map_err(|e| match e {
        read::ReadError::Write(_) => anyhow::Error::from(e),
        e => anyhow::Error::from(e).context(format!("{} is not a valid trace", input.display())),
    })?;
    if replayed.end_missing {
        stderr::warning(format_args!(
            "{} was cut short (no trace_end{}): read {} events",
            input.display(),
            replayed.torn.as_ref().map_or(String::new(), |torn| format!(", and {torn}")),
            replayed.events
        ));
    }
    Ok(replayed)
}

fn export(args: ExportArgs) -> anyhow::Result<i32> {
    let format = args.output.as_deref().map(|output| output_format(output, args.format)).transpose()?;
    let trace = open_trace(&args.input)?;
    let mut sinks: Vec<Box<dyn Sink + Send>> = Vec::new();
    let mut output_file = None;
    if let (Some(output), Some(format)) = (&args.output, format) {
        let (out, file) = open_output(output, Previous::Replace)?;
        sinks.push(format.sink_with_events(out, args.pcap_events));
        output_file = file;
    }
    let mut otlp_counters = None;
    if let Some(config) = args.otlp.config(false) {
        // The URL was checked when parsed.
        let sink = otlp::OtlpSink::new(config).expect("a URL parse_otlp_url accepted");
        otlp_counters = Some(sink.counters());
        sinks.push(Box::new(sink));
    }
    let replayed = replay(&args.input, trace, &mut sinks)?;
    drop(sinks);
    output_file.map(OutputFile::commit).transpose()?;
    if let Some(output) = &args.output {
        stderr::info(format_args!("{} events written to {}", replayed.events, describe_output(output)));
    }
    // The OTLP sink has said on stderr how many were lost, and why: the exit code says it to scripts.
    Ok(if otlp_counters.is_some_and(|c| c.lost() > 0) { EXIT_OTLP_LOST } else { 0 })
}

/// `export --otlp`'s exit code when spans or log records were lost on the way to the collector
/// (an error is 1).
pub(crate) const EXIT_OTLP_LOST: i32 = 3;

/// Whether an error is standard output closing early (`tracer report t.jsonl | head`): not a failure.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        let kind = match cause.downcast_ref::<read::ReadError>() {
            Some(read::ReadError::Io(io) | read::ReadError::Write(io)) => Some(io.kind()),
            _ => cause
                .downcast_ref::<std::io::Error>()
                .map(std::io::Error::kind)
                .or_else(|| cause.downcast_ref::<serde_json::Error>().and_then(serde_json::Error::io_error_kind)),
        };
        kind == Some(std::io::ErrorKind::BrokenPipe)
    })
}

fn report(args: ReportArgs) -> anyhow::Result<i32> {
    // Two hosts' pid 7 are two processes: grouped by host, as the visual exports are.
    let mut builder = HostGrouping::new(ReportBuilder::new(args.by_process));
    replay(&args.input, open_trace(&args.input)?, &mut builder)?;
    let mut report = builder.into_inner().into_report().context("the trace has no end")?;
    stats::sort_functions(&mut report.functions, args.sort);
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        stats::write_table(&report, &mut Printable::new(&mut out))?;
    }
    Ok(0)
}

fn calls(args: CallsArgs) -> anyhow::Result<i32> {
    let function = match &args.function {
        Some(pattern) => Some(
            globset::Glob::new(pattern)
                .with_context(|| format!("'{pattern}' is not a valid function pattern"))?
                .compile_matcher(),
        ),
        None => None,
    };
    let filter = CallFilter {
        pid: args.pid,
        tid: args.tid,
        function,
        min_duration_ns: u64::try_from(args.min_duration.as_nanos()).unwrap_or(u64::MAX),
        max_depth: args.max_depth,
    };
    let trace = open_trace(&args.input)?;
    let mut printer =
        HostGrouping::new(CallPrinter::new(Printable::new(std::io::BufWriter::new(std::io::stdout().lock())), filter));
    replay(&args.input, trace, &mut printer)?;
    if let Some(missing) = printer.into_inner().not_in_trace() {
        bail!("{}: {missing}", args.input.display());
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_record_contract() {
        let cli = Cli::try_parse_from([
            "tracer",
            "record",
            "-p",
            "1",
            "--pid",
            "2",
            "-b",
            "/bin/x",
            "-f",
            "fib",
            "-f",
            "libc.so.6:malloc",
            "-e",
            "call,exit",
            "--no-follow",
            "-o",
            "t.json",
            "--format",
            "chrome",
            "-d",
            "1.5",
            "--buffer-size",
            "64M",
            "--",
            "prog",
            "--flag",
        ])
        .unwrap();
        let Command::Record(r) = cli.command else { panic!("record") };
        assert_eq!(r.pids, [1, 2]);
        assert_eq!(r.binaries, [PathBuf::from("/bin/x")]);
        assert_eq!(pattern_list::flatten(r.trace.functions.clone()), ["fib", "libc.so.6:malloc"]);
        assert_eq!(r.trace.event_kinds(), BTreeSet::from([EventKind::Call, EventKind::Exit]));
        assert!(r.trace.no_follow);
        assert_eq!(r.trace.format, Some(Format::Chrome));
        assert_eq!(r.trace.duration, Some(Duration::from_millis(1500)));
        assert_eq!(r.trace.buffer_size, Some(64 << 20));
        assert_eq!(r.command, [OsString::from("prog"), OsString::from("--flag")]);
    }

    /// Comma lists of pids, and one duration syntax, in every subcommand.
    #[test]
    fn comma_lists_and_durations() {
        let Command::Record(r) =
            Cli::try_parse_from(["tracer", "record", "-p", "1,2", "-p", "3", "-d", "250ms"]).unwrap().command
        else {
            panic!("record")
        };
        assert_eq!(r.pids, [1, 2, 3]);
        assert_eq!(r.trace.duration, Some(Duration::from_millis(250)));
        // Patterns too, in every subcommand that takes them, with --function as -f.
        let Command::Record(r) = Cli::try_parse_from([
            "tracer",
            "record",
            "-f",
            "fib,f(int, char)",
            "--function",
            "main",
            "-u",
            "p:a,p:b",
            "--start-at",
            "on_,x",
            "--",
            "prog",
        ])
        .unwrap()
        .command
        else {
            panic!("record")
        };
        assert_eq!(pattern_list::flatten(r.trace.functions), ["fib", "f(int, char)", "main"]);
        assert_eq!(pattern_list::flatten(r.trace.usdt), ["p:a", "p:b"]);
        assert_eq!(pattern_list::flatten(r.trace.triggers.start_at), ["on_", "x"]);
        for (subcommand, rest) in [("top", &["-p", "1"][..]), ("list", &["-p", "1"][..])] {
            let mut args = vec!["tracer", subcommand, "--function", "a,b"];
            args.extend(rest);
            assert!(Cli::try_parse_from(&args).is_ok(), "{args:?}");
        }
        let Command::Calls(c) = Cli::try_parse_from(["tracer", "calls", "--min-duration", "1.5ms"]).unwrap().command
        else {
            panic!("calls")
        };
        assert_eq!(c.min_duration, Duration::from_micros(1500));
        let Command::Top(t) =
            Cli::try_parse_from(["tracer", "top", "-p", "4,5", "-i", "0.5", "-d", "1m"]).unwrap().command
        else {
            panic!("top")
        };
        assert_eq!(
            (t.pids, t.interval, t.duration),
            (vec![4, 5], Duration::from_millis(500), Some(Duration::from_secs(60)))
        );
    }

    #[test]
    fn defaults() {
        let Command::Record(r) = Cli::try_parse_from(["tracer", "record", "--", "ls"]).unwrap().command else {
            panic!("record")
        };
        assert_eq!(r.trace.events.concat(), EventKind::ALL);
        assert_eq!(r.output, PathBuf::from("trace.jsonl"));
        assert_eq!(r.trace.buffer_size, None, "fitted to the trace");
        assert!(!r.trace.no_follow);
    }

    #[test]
    fn rejects_bad_values() {
        for bad in [
            vec!["tracer", "record", "-e", "call,bogus"],
            vec!["tracer", "record", "--format", "xml"],
            vec!["tracer", "record", "-d", "soon"],
            vec!["tracer", "record", "--buffer-size", "lots"],
        ] {
            assert!(Cli::try_parse_from(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn output_formats() {
        assert_eq!(output_format(Path::new("a.json"), None).unwrap(), Format::Chrome);
        assert_eq!(output_format(Path::new("a.txt"), Some(Format::Jsonl)).unwrap(), Format::Jsonl);
        assert_eq!(output_format(Path::new("-"), None).unwrap(), Format::Jsonl);
        let err = output_format(Path::new("a.txt"), None).unwrap_err().to_string();
        assert_eq!(
            err,
            "cannot tell the output format from 'a.txt'; add --format (jsonl, chrome, flamegraph, folded, svg, perfetto, speedscope, native or pcapng)"
        );
    }
}
