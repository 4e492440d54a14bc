//! `tracer agent` and `tracer collect`.

use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::{Context as _, bail};
use clap::Args;

use super::{
    TraceOptions, describe_output, open_output, output_format, parse_bytes, pattern_list, print_summary,
    still_running_code, stop_signal, values,
};
use tracer_user::{
    cluster::{
        agent::{self, AgentOptions, Listen},
        auth::Secret,
        collector::{self, AgentSpec, ClientOptions, Cluster},
        command_output, listener, outbox,
        output_lines::OutputHandler,
        protocol::{OutputStream, TraceRequest},
        tls,
    },
    event::EndReason,
    event::host,
    output_file::OutputFile,
    plan,
};

/// `collect`'s exit code when some host's trace could not be collected whole (`EX_TEMPFAIL`:
/// collecting again may work). It wins over the command's exit code.
pub const EXIT_INCOMPLETE: i32 = 75;

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Unix socket to wait for collectors on; only root (and --socket-group) may connect.
    #[arg(long, value_name = "PATH", default_value = listener::DEFAULT_SOCKET, conflicts_with = "listen")]
    pub socket: PathBuf,
    /// Let members of this group use the socket too (mode 0660). They can trace any process on
    /// this host: that is root's power to read any process's memory.
    #[arg(long, value_name = "GROUP", conflicts_with = "listen")]
    pub socket_group: Option<String>,
    /// Wait on this TCP address instead (loopback included, it needs --secret-file).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// File holding the secret shared with the collectors (at least 32 bytes, mode 0600; it never
    /// crosses the wire).
    #[arg(long, value_name = "PATH")]
    pub secret_file: Option<PathBuf>,
    /// Write a new secret (32 random bytes, hex, mode 0600) to this file, and exit.
    #[arg(long, value_name = "FILE", exclusive = true)]
    pub gen_secret: Option<PathBuf>,
    /// Launch commands that collectors ask for (-c): whoever can connect then runs any command
    /// on this host, as root (a socket-group member: as itself).
    #[arg(long)]
    pub allow_commands: bool,
    /// Where a launched command's stdout and stderr go: DIR/UID/trace-ID.out, a file of the
    /// command's user (DIR and DIR/UID only root may write).
    #[arg(long, value_name = "DIR", default_value = command_output::DEFAULT_DIR)]
    pub command_output_dir: PathBuf,
    /// TLS certificate chain (PEM) to present to collectors (with --listen).
    #[arg(long, value_name = "PATH", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, value_name = "PATH", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Stop a trace (and detach its probes) after this long without a word from its collector.
    #[arg(long, value_name = "DURATION", value_parser = values::duration, default_value = "30")]
    pub orphan_timeout: Duration,
    /// Events kept for a collector that is away (kept encoded, a call in about 20 bytes, at most
    /// --buffer-bytes of them); older ones are dropped and counted as lost.
    #[arg(long, value_name = "N", default_value_t = 2_000_000)]
    pub buffer_events: usize,
    /// Encoded bytes of those events kept at most, from 1M to 4G.
    #[arg(long, value_name = "BYTES", value_parser = parse_buffer_bytes, default_value = "256M")]
    pub buffer_bytes: usize,
    #[command(flatten)]
    pub otlp: super::OtlpOptions,
    /// FOR TESTS: pretend this host's clock is ahead by this many nanoseconds.
    #[arg(long, value_name = "NS", default_value_t = 0, allow_negative_numbers = true)]
    pub test_clock_skew_ns: i64,
}

#[derive(Debug, Args)]
pub struct CollectArgs {
    /// An agent to trace on, as NAME=HOST:PORT or NAME=unix:PATH (repeatable).
    #[arg(long = "agent", value_name = "NAME=ADDR", required = true)]
    pub agents: Vec<AgentSpec>,
    /// Trace this process on that host (repeatable).
    #[arg(short, long = "pid", value_name = "NAME:PID")]
    pub pids: Vec<String>,
    /// Trace every process that runs this executable on that host (repeatable).
    #[arg(short, long = "binary", value_name = "NAME:PATH")]
    pub binaries: Vec<String>,
    /// Launch and trace this command on that host, e.g. 'web:./server --port 80' (repeatable).
    #[arg(short, long = "command", value_name = "NAME:COMMAND")]
    pub commands: Vec<String>,
    /// The working directory of that host's command, an absolute path its user may enter
    /// (default: /), e.g. 'web:/srv/app' (repeatable).
    #[arg(long = "cwd", value_name = "NAME:DIR")]
    pub cwds: Vec<String>,
    /// Functions, events and limits, as for `record`, on every host.
    #[command(flatten)]
    pub trace: TraceOptions,
    /// Output file; the format comes from --format or the extension.
    #[arg(short, long, value_name = "PATH", default_value = "merged.jsonl")]
    pub output: PathBuf,
    /// File holding the secret shared with the agents.
    #[arg(long, value_name = "PATH")]
    pub secret_file: Option<PathBuf>,
    /// Connect over TLS, trusting this certificate authority (PEM).
    #[arg(long, value_name = "PATH")]
    pub tls_ca: Option<PathBuf>,
    /// The name in the agents' certificates (default: the host part of each address).
    #[arg(long, value_name = "NAME")]
    pub tls_server_name: Option<String>,
    /// How long to keep trying to reach an agent whose connection dropped, before its part of the
    /// trace is given up as incomplete.
    #[arg(long, value_name = "DURATION", value_parser = values::duration, default_value = "60")]
    pub reconnect_for: Duration,
    /// The live page (`--serve [ADDR]`), fed by every host's events as they arrive.
    #[command(flatten)]
    pub serve: super::view::ServeArgs,
}

/// `--buffer-bytes`: a size of at least [`outbox::LEAST_MAX_BYTES`] (and, as every size, at
/// most 4 GiB).
fn parse_buffer_bytes(s: &str) -> Result<usize, String> {
    let n = parse_bytes(s)? as usize;
    if n < outbox::LEAST_MAX_BYTES {
        return Err(format!("'{s}' is less than {} MiB", outbox::LEAST_MAX_BYTES >> 20));
    }
    Ok(n)
}

pub fn agent(args: AgentArgs) -> anyhow::Result<i32> {
    if let Some(path) = &args.gen_secret {
        Secret::generate(path)?;
        super::stderr::info(format_args!("wrote a new secret to {} (mode 0600)", path.display()));
        return Ok(0);
    }
    plan::check_root()?;
    plan::check_pid_namespace()?;
    let secret = args.secret_file.as_deref().map(Secret::from_file).transpose()?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(tls::acceptor(cert, key)?),
        _ => None,
    };
    let listen = match args.listen {
        Some(addr) => Listen::Tcp(addr),
        None => Listen::Unix { path: args.socket, group: args.socket_group },
    };
    let options = AgentOptions {
        listen,
        secret,
        tls,
        allow_commands: args.allow_commands,
        host: host::default_name(),
        test_clock_skew_ns: args.test_clock_skew_ns,
        orphan_timeout: args.orphan_timeout,
        max_buffered: args.buffer_events,
        max_buffered_bytes: args.buffer_bytes,
        otlp: args.otlp.config(true),
        command_output_dir: args.command_output_dir,
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let shutdown = stop_signal()?;
        agent::serve(options, async {
            shutdown.await;
        })
        .await?;
        Ok(0)
    })
}

/// Splits `NAME:VALUE` and checks the name is one of the agents.
fn per_host<'a>(what: &str, item: &'a str, agents: &[AgentSpec]) -> anyhow::Result<(String, &'a str)> {
    let Some((name, value)) = item.split_once(':') else { bail!("{what} '{item}' is not NAME:VALUE") };
    if !agents.iter().any(|a| a.name == name) {
        bail!("{what} '{item}' names no --agent called {name}");
    }
    Ok((name.to_string(), value))
}

/// One request per agent, from the per-host targets and the shared options (the names are
/// unique: [`collector::check_names`]).
fn requests(args: &CollectArgs) -> anyhow::Result<Vec<(String, TraceRequest)>> {
    let events: Vec<String> = args.trace.event_kinds().iter().map(|k| k.name().to_string()).collect();
    let mut requests: BTreeMap<String, TraceRequest> = args
        .agents
        .iter()
        .map(|a| {
            let request = TraceRequest {
                functions: pattern_list::flatten(args.trace.functions.clone()),
                usdt: pattern_list::flatten(args.trace.usdt.clone()),
                events: events.clone(),
                follow_children: !args.trace.no_follow,
                // 0: the agent fits the ring to the trace.
                buffer_size: args.trace.buffer_size.unwrap_or(0),
                max_probes: args.trace.max_probes as u32,
                capture_bytes: args.trace.capture_bytes,
                string_size: args.trace.string_size,
                start_at: pattern_list::flatten(args.trace.triggers.start_at.clone()),
                stop_at: pattern_list::flatten(args.trace.triggers.stop_at.clone()),
                depth: args.trace.triggers.depth.unwrap_or(0),
                breaks: args.trace.breaks.iter().map(ToString::to_string).collect(),
                watches: args.trace.watches.iter().map(ToString::to_string).collect(),
                ..Default::default()
            };
            (a.name.clone(), request)
        })
        .collect();
    for item in &args.pids {
        let (name, pid) = per_host("--pid", item, &args.agents)?;
        let pid = pid.parse().with_context(|| format!("--pid '{item}': '{pid}' is not a process id"))?;
        requests.get_mut(&name).expect("checked").pids.push(pid);
    }
    for item in &args.binaries {
        let (name, path) = per_host("--binary", item, &args.agents)?;
        requests.get_mut(&name).expect("checked").binaries.push(path.to_string());
    }
    for item in &args.commands {
        let (name, command) = per_host("--command", item, &args.agents)?;
        let words = shell_words::split(command).with_context(|| format!("--command '{item}' does not parse"))?;
        let request = requests.get_mut(&name).expect("checked");
        if !request.command.is_empty() {
            bail!("--command: host {name} already has a command to launch");
        }
        request.command = words;
    }
    for item in &args.cwds {
        let (name, dir) = per_host("--cwd", item, &args.agents)?;
        let request = requests.get_mut(&name).expect("checked");
        if request.command.is_empty() {
            bail!("--cwd: host {name} has no command to launch (give -c {name}:COMMAND)");
        }
        if request.cwd.is_some() {
            bail!("--cwd: host {name} already has a working directory");
        }
        if !dir.starts_with('/') {
            bail!("--cwd '{item}': the working directory must be an absolute path");
        }
        request.cwd = Some(dir.to_string());
    }
    for (name, r) in &requests {
        if r.pids.is_empty() && r.binaries.is_empty() && r.command.is_empty() {
            bail!("agent {name} has nothing to trace: give -p {name}:PID, -b {name}:PATH or -c {name}:COMMAND");
        }
    }
    // In the order of the --agent options: host `i` of the trace is the `i`th agent given.
    Ok(args.agents.iter().map(|a| (a.name.clone(), requests.remove(&a.name).expect("one per agent"))).collect())
}

/// The live page of a collection: its server, and the thread that feeds its model every host's
/// events as they arrive (on their hosts' clocks, receives not yet linked to their sends: the
/// merge does that once the trace stops).
struct Live {
    viewer: tracer_user::view::server::Viewer,
    model: tracer_user::view::model::SharedSink,
    feeding: std::thread::JoinHandle<()>,
}

impl Live {
    /// Once the trace is stopped (its subscription closed): the page shows the trace whole.
    fn end(self, end: &tracer_user::event::TraceEnd) {
        use tracer_user::sink::Sink as _;
        let _ = self.feeding.join();
        let mut model = self.model;
        // The model only aggregates: it has no output that could fail.
        let _ = model.end(end);
        self.viewer.finish();
    }
}

fn serve_live(args: &super::view::ServeArgs, trace: &collector::ClusterTrace) -> anyhow::Result<Option<Live>> {
    use tracer_user::{
        sink::Sink as _,
        view::model::{SharedSink, ViewModel},
    };
    let Some((mut sink, viewer)) = args.start(ViewModel::per_host(), Arc::new(trace.progress()))? else {
        return Ok(None);
    };
    let _ = sink.begin(&trace.start_so_far());
    let model = SharedSink(sink.0.clone());
    let feeding = trace.on_event(move |e| {
        let _ = sink.event(e);
    });
    Ok(Some(Live { viewer, model, feeding }))
}

/// The merged trace's first and last lines: what the summary reads.
struct Merged {
    start: tracer_user::event::TraceStart,
    end: tracer_user::event::TraceEnd,
}

/// Where `collect` makes its spill directory: beside the output, or in `$TMPDIR` for stdout.
fn spill_parent(output: &std::path::Path) -> PathBuf {
    match output.parent() {
        _ if output == std::path::Path::new("-") => std::env::temp_dir(),
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Prints each line of a launched command's output as `HOST: LINE`, its stdout's on stdout
/// (on stderr when the trace goes to stdout) and its stderr's on stderr, a line at a time.
fn print_output(trace_on_stdout: bool) -> OutputHandler {
    use std::io::Write as _;
    Arc::new(move |host: &str, stream: OutputStream, line: &[u8]| {
        let mut text = Vec::with_capacity(host.len() + line.len() + 3);
        text.extend_from_slice(host.as_bytes());
        text.extend_from_slice(b": ");
        text.extend_from_slice(line);
        text.push(b'\n');
        // A reader that went away (`| head`) costs the command's output, not the trace.
        let _ = match stream {
            OutputStream::Stdout if !trace_on_stdout => std::io::stdout().lock().write_all(&text),
            _ => std::io::stderr().lock().write_all(&text),
        };
    })
}

pub fn collect(args: CollectArgs) -> anyhow::Result<i32> {
    // Before anything else: with a name given twice, the targets below could go to either host.
    collector::check_names(&args.agents)?;
    args.serve.check()?;
    let format = output_format(&args.output, args.trace.format)?;
    // The key of every host's OTLP ids: an agent that exports its own spans makes them with its
    // host's, and this collector the same ids of the same events, to link receives to sends
    // across hosts.
    let run_key = tracer_user::export::otlp::random_key();
    let requests: Vec<(String, TraceRequest)> = requests(&args)?
        .into_iter()
        .map(|(name, r)| {
            let otlp_key = tracer_user::export::otlp::host_key(&run_key, &name);
            (name, TraceRequest { otlp_key, ..r })
        })
        .collect();
    let secret = args.secret_file.as_deref().map(Secret::from_file).transpose()?;
    let tls = args.tls_ca.as_deref().map(tls::connector).transpose()?;
    let options = ClientOptions {
        secret,
        tls,
        tls_server_name: args.tls_server_name.clone(),
        reconnect_for: args.reconnect_for,
        // Each host's stream spills beside the output (on the same disk the trace goes to).
        spill_in: Some(spill_parent(&args.output)),
        command_output: Some(print_output(args.output == std::path::Path::new("-"))),
        ..Default::default()
    };
    let (out, output_file) = open_output(&args.output, super::Previous::Keep)?;
    // One worker per host up to the machine's cores: each host's session decodes its frames and
    // writes its spill file, and one thread for all of them falls behind two busy hosts.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.agents.len().clamp(1, cores))
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let stop = stop_signal()?;
        let cluster = Cluster::connect(args.agents.clone(), options).await?;
        let trace = cluster.start(requests).await?;
        let live = serve_live(&args.serve, &trace)?;
        super::stderr::info(format_args!(
            "tracing on {} host{}; writing {} to {}",
            args.agents.len(),
            if args.agents.len() == 1 { "" } else { "s" },
            format.describe(),
            describe_output(&args.output)
        ));
        let deadline = tracer_user::record::pace::Deadline::after(args.trace.duration).reached();
        let until_done = async {
            tokio::select! {
                reason = stop => reason,
                _ = deadline => EndReason::Duration,
                _ = trace.finished() => EndReason::TargetsExited,
            }
        };
        let reason = super::status::with_status("received", || trace.received_and_lost(), until_done).await;
        for (host, events, seconds) in trace.ingest() {
            super::stderr::info(format_args!(
                "host {host}: received {events} events in {seconds:.3} s{}",
                collector::rate(events, seconds)
            ));
        }
        let exporting = trace.exporting_hosts();
        let file = format.sink_with_events(out, args.trace.pcap_events);
        let mut sink: Box<dyn tracer_user::sink::Sink + Send> = match args.trace.otlp.config(false) {
            Some(config) => {
                let ids = tracer_user::export::otlp::IdKey::Run(run_key);
                let config = tracer_user::export::otlp::OtlpConfig { ids, exporting, ..config };
                let otlp = tracer_user::export::otlp::OtlpSink::new(config).expect("a URL parse_otlp_url accepted");
                Box::new(vec![file, Box::new(otlp)])
            }
            None => {
                if !exporting.is_empty() {
                    let mut names: Vec<&str> = exporting.keys().map(String::as_str).collect();
                    names.sort();
                    super::stderr::warning(format_args!("the agents of {} send their spans to OpenTelemetry themselves, but no receive there is linked to its sends on other hosts: only a collector sees both ends; give collect --otlp URL to send those links",
                        names.join(", ")
                    ));
                }
                file
            }
        };
        let (start, end) = trace.stop_into(reason, &mut *sink).await?;
        drop(sink);
        if let Some(live) = live {
            live.end(&end);
        }
        output_file.map(OutputFile::commit).transpose()?;
        let merged = Merged { start, end };
        for host in &merged.start.hosts {
            super::stderr::info(format_args!(
                "host {}: {} events, clock offset {} ns ± {} ns (± {} ns from round trips alone)",
                host.name, host.events, host.offset_ns, host.uncertainty_ns, host.round_trip_uncertainty_ns
            ));
        }
        print_summary(&merged.end, &args.output);
        let incomplete: Vec<_> = merged.end.hosts.iter().filter(|h| !h.complete).collect();
        for host in &incomplete {
            let why: Vec<&str> = host.lost.iter().map(|l| l.detail.as_str()).collect();
            super::stderr::warning(format_args!("host {}: the trace is incomplete: {}", host.name, why.join("; ")));
        }
        if !incomplete.is_empty() {
            super::stderr::info(format_args!(
                "the trace is incomplete on {} of {} hosts (see trace_end.hosts)",
                incomplete.len(),
                merged.end.hosts.len()
            ));
            return Ok(EXIT_INCOMPLETE);
        }
        let launched = !args.commands.is_empty();
        Ok(match merged.end.command_exit_code {
            Some(code) => code,
            None if launched => still_running_code(reason),
            None => 0,
        })
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cli::{Cli, Command};

    fn collect_args(args: &[&str]) -> CollectArgs {
        let mut all = vec!["tracer", "collect"];
        all.extend(args);
        let Command::Collect(c) = Cli::try_parse_from(all).unwrap().command else { panic!("collect") };
        c
    }

    #[test]
    fn the_outbox_byte_bound_is_a_size_from_one_mib_to_four_gib() {
        assert_eq!(parse_buffer_bytes("256M"), Ok(256 << 20));
        assert_eq!(parse_buffer_bytes("1M"), Ok(1 << 20));
        assert_eq!(parse_buffer_bytes("1023K"), Err("'1023K' is less than 1 MiB".to_string()));
        assert!(parse_buffer_bytes("5G").unwrap_err().contains("more than 4 GiB"));
        assert!(parse_buffer_bytes("lots").unwrap_err().contains("is not a size"));
        let Command::Agent(a) = Cli::try_parse_from(["tracer", "agent"]).unwrap().command else { panic!("agent") };
        assert_eq!(a.buffer_bytes, outbox::DEFAULT_MAX_BYTES);
    }

    #[test]
    fn targets_go_to_their_hosts() {
        let args = collect_args(&[
            "--agent",
            "a=10.0.0.1:7070",
            "--agent",
            "b=10.0.0.2:7070",
            "-p",
            "a:12",
            "-b",
            "b:/bin/srv",
            "-c",
            "a:./client --n 5",
            "-f",
            "fib",
            "-e",
            "call,ipc",
        ]);
        let r = requests(&args).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].0, "a");
        assert_eq!(r[0].1.pids, [12]);
        assert_eq!(r[0].1.command, ["./client", "--n", "5"]);
        assert_eq!(r[1].1.binaries, ["/bin/srv"]);
        assert_eq!(r[1].1.functions, ["fib"]);
        assert_eq!(r[1].1.events, ["call", "send", "recv", "signal"]);
    }

    #[test]
    fn a_working_directory_goes_with_its_hosts_command() {
        let base = ["--agent", "a=10.0.0.1:7070", "--agent", "b=10.0.0.2:7070", "-c", "a:pwd", "-p", "b:1"];
        let with = |extra: &[&str]| requests(&collect_args(&[&base[..], extra].concat()));
        let r = with(&["--cwd", "a:/srv/app"]).unwrap();
        assert_eq!((r[0].1.cwd.as_deref(), r[1].1.cwd.as_deref()), (Some("/srv/app"), None));
        assert_eq!(with(&[]).unwrap()[0].1.cwd, None);
        let err = |extra: &[&str]| with(extra).unwrap_err().to_string();
        assert_eq!(err(&["--cwd", "b:/srv"]), "--cwd: host b has no command to launch (give -c b:COMMAND)");
        assert_eq!(err(&["--cwd", "a:srv"]), "--cwd 'a:srv': the working directory must be an absolute path");
        assert_eq!(err(&["--cwd", "a:/x", "--cwd", "a:/y"]), "--cwd: host a already has a working directory");
    }

    #[test]
    fn every_host_needs_a_target_and_targets_need_a_host() {
        let err = requests(&collect_args(&["--agent", "a=1.2.3.4:5", "--agent", "b=1.2.3.5:5", "-p", "a:1"]))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("agent b has nothing to trace"), "{err}");
        let err = requests(&collect_args(&["--agent", "a=1.2.3.4:5", "-p", "c:1"])).unwrap_err().to_string();
        assert_eq!(err, "--pid 'c:1' names no --agent called c");
        assert!(requests(&collect_args(&["--agent", "a=1.2.3.4:5", "-p", "a:x"])).is_err());
    }
}
