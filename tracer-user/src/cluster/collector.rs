//! The collector side, and the library API for multi-host traces.
//!
//! A [`Cluster`] holds authenticated connections to agents. [`Cluster::start`] starts one trace
//! on a set of hosts and returns a [`ClusterTrace`]: events arrive as they are recorded (to
//! [`ClusterTrace::events_so_far`], to channels from [`ClusterTrace::subscribe`], and to
//! callbacks from [`ClusterTrace::on_event`]); [`ClusterTrace::stop`] stops every host at once and
//! returns the [`MergedTrace`]: clocks corrected, cross-host messages linked, one time order.
//!
//! Each agent connection is served by a task that measures the agent's clock every second,
//! acknowledges what it received, and reconnects and resumes if the connection drops.
//!
//! ```no_run
//! use tracer_user::cluster::{
//!     collector::{AgentSpec, ClientOptions, Cluster},
//!     protocol::TraceRequest,
//! };
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let agents = vec!["web=10.0.0.1:7070".parse::<AgentSpec>()?, "db=10.0.0.2:7070".parse()?];
//! let cluster = Cluster::connect(agents, ClientOptions::default()).await?;
//! let request = TraceRequest { pids: vec![4121], events: vec!["ipc".into()], ..Default::default() };
//! let trace = cluster.start(vec![("web".into(), request.clone()), ("db".into(), request)]).await?;
//! // or, the same request on every connected agent: cluster.start_all(request).await?
//! let mut live = trace.subscribe();
//! tokio::spawn(async move {
//!     while let Some(event) = live.recv().await {
//!         println!("{} {} {:?}", event.host, event.pid, event.data.kind());
//!     }
//! });
//! let sends = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
//! let counter = sends.clone();
//! let callback = trace.on_event(move |event| {
//!     if event.data.kind() == tracer_user::event::EventKind::Send {
//!         counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
//!     }
//! });
//! tokio::time::sleep(std::time::Duration::from_secs(5)).await;
//! println!("trace {} has {} events so far", trace.id(), trace.events_so_far().len());
//! let merged = trace.stop().await?;
//! merged.export_chrome(std::path::Path::new("merged.json"))?;
//! callback.join().unwrap(); // the trace is stopped: the callback has seen every event
//! println!("{} sends", sends.load(std::sync::atomic::Ordering::Relaxed));
//! # Ok(())
//! # }
//! ```
//!
//! Tracing one command on one host:
//!
//! ```no_run
//! # use tracer_user::cluster::{collector::{AgentSpec, ClientOptions, Cluster}, protocol::TraceRequest};
//! # async fn example(cluster: Cluster) -> Result<(), Box<dyn std::error::Error>> {
//! let request = TraceRequest { functions: vec!["handle_*".into()], ..Default::default() };
//! let (status, events) = cluster.trace_command("web", vec!["./client".into(), "--once".into()], request).await?;
//! println!("exit code {status:?}, {} events", events.len());
//! # Ok(())
//! # }
//! ```

use std::{
    path::{Path, PathBuf},
    str::FromStr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::{
    net::{TcpStream, UnixStream},
    sync::{Notify, mpsc, oneshot},
};
use tokio_rustls::TlsConnector;

use super::{
    auth::{Key, Secret},
    clock_sync::ClockSample,
    listener::peer_creds,
    merge::{HostEvents, HostTrace, MergedTrace, merge, merge_into},
    output_lines::{OutputHandler, OutputLines},
    protocol::{Message, TraceRequest},
    reconnect,
    session::{self, HandshakeError, Session},
    spill::{HostSpill, SpillDir},
    tls,
};
use crate::{
    assemble::clock::BootClock,
    errors::report,
    event::host::{self, Machine, NameError},
    event::{EndReason, Event, EventKind, FORMAT_VERSION, HostLoss, LossCause, TraceEnd, TraceStart},
    sink::Sink,
};

/// Where an agent listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentAddr {
    /// `HOST:PORT`.
    Tcp(String),
    /// `unix:PATH`: an agent on this machine.
    Unix(PathBuf),
}

impl std::fmt::Display for AgentAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentAddr::Tcp(a) => f.write_str(a),
            AgentAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// An agent to connect to: `NAME=HOST:PORT`, or `NAME=unix:PATH` for one on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentSpec {
    pub name: String,
    pub addr: AgentAddr,
}

impl FromStr for AgentSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<AgentSpec, String> {
        let bad = || format!("'{s}' is not NAME=HOST:PORT or NAME=unix:PATH");
        match s.split_once('=') {
            Some((name, addr)) if !name.is_empty() => {
                host::check_name(name).map_err(|e| e.to_string())?;
                let addr = match addr.strip_prefix("unix:") {
                    Some(path) if !path.is_empty() => AgentAddr::Unix(PathBuf::from(path)),
                    Some(_) => return Err(bad()),
                    None if addr.contains(':') => AgentAddr::Tcp(addr.to_string()),
                    None => return Err(bad()),
                };
                Ok(AgentSpec { name: name.to_string(), addr })
            }
            _ => Err(bad()),
        }
    }
}

#[derive(Clone)]
pub struct ClientOptions {
    pub secret: Option<Secret>,
    /// TLS to every agent reached over TCP; the agent's certificate must name the host part of
    /// its address (or `tls_server_name`).
    pub tls: Option<TlsConnector>,
    pub tls_server_name: Option<String>,
    /// How long to keep trying to reach an agent whose connection dropped.
    pub reconnect_for: Duration,
    /// An agent that sends nothing for this long (it answers a clock probe every second) is taken
    /// for disconnected.
    pub silence: Duration,
    /// How long [`ClusterTrace::stop`] waits for every host's last events.
    pub stop_timeout: Duration,
    /// Where each trace's private spill directory is made (default: `$TMPDIR`).
    pub spill_in: Option<PathBuf>,
    /// Receives each line a launched command writes (default: none; the agent's output file on
    /// its host keeps them). Called on the host's connection task: a handler that blocks holds
    /// that host's stream back (and its agent then drops output beyond its bound, and says so).
    pub command_output: Option<OutputHandler>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            secret: None,
            tls: None,
            tls_server_name: None,
            reconnect_for: Duration::from_secs(60),
            silence: Duration::from_secs(3),
            stop_timeout: Duration::from_secs(30),
            spill_in: None,
            command_output: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot reach agent {agent} at {addr}: {reason}")]
    Connect { agent: String, addr: String, reason: String },
    #[error("agent {agent} refused the connection: {reason}")]
    Refused { agent: String, reason: String },
    #[error("agent {agent}: authentication failed: the secrets differ (give both sides the same --secret-file)")]
    AgentNotAuthenticated { agent: String },
    #[error("agent {agent} has a secret configured: give the collector the same --secret-file")]
    SecretNeeded { agent: String },
    #[error("no agent named {0}")]
    NoSuchAgent(String),
    #[error("agent {agent} could not start tracing: {error}")]
    StartFailed { agent: String, error: String },
    #[error("agent {agent}: {reason}")]
    Protocol { agent: String, reason: String },
    #[error("writing the trace failed")]
    Output(#[from] std::io::Error),
    #[error(transparent)]
    OutputFile(#[from] crate::output_file::OutputFileError),
    #[error(transparent)]
    Name(#[from] NameError),
}

/// Everything one host has sent for the current trace.
#[derive(Default)]
pub(super) struct HostState {
    pub(super) host: String,
    pub(super) samples: Vec<ClockSample>,
    pub(super) trace_id: Option<u64>,
    pub(super) start: Option<TraceStart>,
    /// The trace's window on the agent's clock, from its first `Started` (event timestamps are
    /// checked against it).
    pub(super) window: Option<super::event_bounds::Window>,
    /// The agent sends this trace's spans to an OpenTelemetry collector itself.
    pub(super) exports_otlp: bool,
    pub(super) end: Option<TraceEnd>,
    /// Events the agent says it produced (known once it ended).
    pub(super) total: Option<u64>,
    /// The events received, on disk: memory holds one batch.
    pub(super) spill: Option<HostSpill>,
    pub(super) next_seq: u64,
    pub(super) lost_in_transit: u64,
    /// What makes this host's trace incomplete, so far.
    pub(super) losses: Vec<HostLoss>,
    /// Nothing more will come for this trace (the agent is lost, or dropped or failed it).
    pub(super) given_up: bool,
    /// The resume key of the connection that started the trace.
    pub(super) resume_key: Option<Key>,
    /// When the first and the latest events arrived (ingest rate).
    pub(super) first_arrival: Option<Instant>,
    pub(super) last_arrival: Option<Instant>,
    /// The launched command's partial lines.
    pub(super) output: OutputLines,
}

impl HostState {
    pub(super) fn finished(&self) -> bool {
        self.given_up || self.total.is_some_and(|t| self.next_seq >= t)
    }

    pub(super) fn lose(&mut self, cause: LossCause, detail: String) {
        tracing::warn!(target: LOG, "host {}: {detail}", self.host);
        self.losses.push(HostLoss { cause, detail });
    }
}

/// A receiver of one trace's events as they arrive.
pub(super) struct Subscriber {
    pub(super) trace_id: u64,
    pub(super) events: mpsc::Sender<Event>,
    /// Events it was not given because its channel was full.
    pub(super) dropped: u64,
}

pub(super) struct Shared {
    pub(super) hosts: Vec<Mutex<HostState>>,
    /// The collector's own machine.
    pub(super) machine: Machine,
    pub(super) subscribers: Mutex<Vec<Subscriber>>,
    pub(super) changed: Notify,
    pub(super) clock: BootClock,
    pub(super) stop_timeout: Duration,
    pub(super) spill_in: Option<PathBuf>,
}

pub(super) enum Command {
    Start { trace_id: u64, request: Box<TraceRequest>, reply: oneshot::Sender<Result<(), String>> },
    Stop { trace_id: u64 },
}

struct AgentHandle {
    spec: AgentSpec,
    commands: mpsc::Sender<Command>,
}

/// Connections to a set of agents.
pub struct Cluster {
    agents: Vec<AgentHandle>,
    shared: Arc<Shared>,
    next_trace: AtomicU64,
}

/// The shortest interval a rate is given for: over less, timer resolution and one batch's
/// arrival decide the number, which then means nothing (a thousand events that arrive in one
/// batch are not "a billion events per second").
pub const MIN_RATE_INTERVAL: Duration = Duration::from_millis(100);

/// `" (R events/s)"` for `events` over `seconds`, or nothing when the interval is shorter than
/// [`MIN_RATE_INTERVAL`].
pub fn rate(events: u64, seconds: f64) -> String {
    if seconds < MIN_RATE_INTERVAL.as_secs_f64() {
        return String::new();
    }
    format!(" ({:.0} events/s)", events as f64 / seconds)
}

/// The `tracing` target of the collector's events: the binary prints them as `tracer collect: …`.
pub const LOG: &str = "tracer collect";

/// Checks the agents' names: each valid, none given twice.
pub fn check_names(agents: &[AgentSpec]) -> Result<(), NameError> {
    for a in agents {
        host::check_name(&a.name)?;
    }
    host::check_unique(agents.iter().map(|a| a.name.as_str()))
}

/// Connects to an agent and authenticates both ways: a raw session, for tools that speak the
/// protocol themselves ([`Cluster`] is the way to trace).
pub async fn connect_session(spec: &AgentSpec, options: &ClientOptions) -> Result<Session, ClusterError> {
    let unreachable =
        |reason: String| ClusterError::Connect { agent: spec.name.clone(), addr: spec.addr.to_string(), reason };
    let timeout = Duration::from_secs(5);
    let (stream, network): (Box<dyn tls::Transport>, bool) = match &spec.addr {
        AgentAddr::Tcp(addr) => {
            let tcp = tokio::time::timeout(timeout, TcpStream::connect(addr))
                .await
                .map_err(|_| unreachable("timed out".to_string()))?
                .map_err(|e| unreachable(e.to_string()))?;
            let _ = tcp.set_nodelay(true);
            let server_name = options.tls_server_name.clone().unwrap_or_else(|| {
                addr.rsplit_once(':').map_or(addr.clone(), |(h, _)| h.trim_matches(['[', ']']).to_string())
            });
            let stream = tls::connect(options.tls.as_ref(), &server_name, Box::new(tcp))
                .await
                .map_err(|e| unreachable(report(&e)))?;
            (stream, true)
        }
        AgentAddr::Unix(path) => {
            let unix = tokio::time::timeout(timeout, UnixStream::connect(path))
                .await
                .map_err(|_| unreachable("timed out".to_string()))?
                .map_err(|e| unreachable(e.to_string()))?;
            // Only root runs an agent: a socket served by anyone else is not one.
            let creds = peer_creds(&unix).map_err(|e| unreachable(e.to_string()))?;
            if !creds.is_root() {
                return Err(unreachable(format!("the socket is served by uid {}, not by root", creds.uid)));
            }
            (Box::new(unix), false)
        }
    };
    let agent = || spec.name.clone();
    session::client(stream, options.secret.as_ref(), network).await.map_err(|e| match e {
        HandshakeError::Refused(reason) if reason == session::AUTH_FAILED => {
            ClusterError::AgentNotAuthenticated { agent: agent() }
        }
        HandshakeError::Refused(reason) => ClusterError::Refused { agent: agent(), reason },
        HandshakeError::SecretNeeded => ClusterError::SecretNeeded { agent: agent() },
        HandshakeError::AgentNotAuthenticated => ClusterError::AgentNotAuthenticated { agent: agent() },
        other => ClusterError::Protocol { agent: agent(), reason: report(&other) },
    })
}

/// Round trips before the first trace: the tightest gives the offset.
const FIRST_PROBES: u32 = 16;

/// Measures an agent's clock a few times on a fresh connection; an agent silent for `silence`
/// is an error.
async fn probe_clock(conn: &mut Session, clock: &BootClock, silence: Duration) -> Result<Vec<ClockSample>, Probe> {
    let mut samples = Vec::new();
    for id in 0..FIRST_PROBES {
        let t0 = clock.now_unix_ns();
        conn.writer.send(&Message::ClockProbe { id }).await.map_err(|e| report(&e))?;
        let echo = tokio::time::timeout(silence, conn.reader.recv())
            .await
            .map_err(|_| format!("no answer to a clock probe within {silence:?}"))?
            .map_err(|e| report(&e))?;
        match echo {
            Message::ClockEcho { id: echoed, agent_ns } if echoed == id => {
                samples.push(ClockSample { t0, t1: clock.now_unix_ns(), agent_ns });
            }
            // The agent took our proof but has no place for us (too many collectors).
            Message::Refused { reason } => return Err(Probe::Refused(reason)),
            _ => {}
        }
    }
    Ok(samples)
}

/// Why a first clock measurement failed.
enum Probe {
    Refused(String),
    Failed(String),
}

impl From<String> for Probe {
    fn from(reason: String) -> Probe {
        Probe::Failed(reason)
    }
}

impl Cluster {
    /// Connects to every agent, authenticates, and measures its clock. Fails if any agent cannot
    /// be reached or authenticated, and, before connecting to any, if a name is not valid or is
    /// given twice: each agent's name is its host's identity in the trace (every event's `host`,
    /// `trace_start.hosts`, the exports' process groups), whatever the machine calls itself.
    pub async fn connect(agents: Vec<AgentSpec>, options: ClientOptions) -> Result<Cluster, ClusterError> {
        check_names(&agents)?;
        let clock = BootClock::calibrate();
        let mut connections = Vec::new();
        for spec in &agents {
            let mut conn = connect_session(spec, &options).await?;
            let samples = probe_clock(&mut conn, &clock, options.silence).await.map_err(|e| match e {
                Probe::Refused(reason) => ClusterError::Refused { agent: spec.name.clone(), reason },
                Probe::Failed(reason) => ClusterError::Protocol { agent: spec.name.clone(), reason },
            })?;
            connections.push((conn, samples));
        }
        let shared = Arc::new(Shared {
            hosts: connections
                .iter()
                .zip(&agents)
                .map(|((_, samples), spec)| {
                    Mutex::new(HostState { host: spec.name.clone(), samples: samples.clone(), ..Default::default() })
                })
                .collect(),
            machine: Machine::read(),
            subscribers: Mutex::new(Vec::new()),
            changed: Notify::new(),
            clock,
            stop_timeout: options.stop_timeout,
            spill_in: options.spill_in.clone(),
        });
        let mut handles = Vec::new();
        for (index, ((conn, _), spec)) in connections.into_iter().zip(agents).enumerate() {
            let (tx, rx) = mpsc::channel(16);
            tokio::spawn(reconnect::agent_task(index, spec.clone(), options.clone(), shared.clone(), rx, conn));
            handles.push(AgentHandle { spec, commands: tx });
        }
        Ok(Cluster { agents: handles, shared, next_trace: AtomicU64::new(1) })
    }

    /// The agents' names, as given to [`Cluster::connect`].
    pub fn agents(&self) -> Vec<String> {
        self.agents.iter().map(|a| a.spec.name.clone()).collect()
    }

    fn index(&self, agent: &str) -> Result<usize, ClusterError> {
        self.agents
            .iter()
            .position(|a| a.spec.name == agent)
            .ok_or_else(|| ClusterError::NoSuchAgent(agent.to_string()))
    }

    /// Starts one trace: each named agent with its own request (use [`Cluster::agents`] for all).
    /// If any agent cannot start, those that did are stopped again.
    pub async fn start(&self, requests: Vec<(String, TraceRequest)>) -> Result<ClusterTrace, ClusterError> {
        let trace_id = self.next_trace.fetch_add(1, Ordering::Relaxed) ^ (std::process::id() as u64) << 32;
        let mut indexes = Vec::new();
        for (agent, _) in &requests {
            indexes.push(self.index(agent)?);
        }
        let spill = SpillDir::create(self.shared.spill_in.as_deref())?;
        for &i in &indexes {
            let file = spill.host(i)?;
            let mut h = self.shared.hosts[i].lock().unwrap();
            let samples = std::mem::take(&mut h.samples);
            let host = std::mem::take(&mut h.host);
            *h = HostState { host, samples, trace_id: Some(trace_id), spill: Some(file), ..Default::default() };
        }
        let mut started: Vec<usize> = Vec::new();
        for ((agent, request), &i) in requests.into_iter().zip(&indexes) {
            let (reply, answer) = oneshot::channel();
            let command = Command::Start { trace_id, request: Box::new(request), reply };
            let result = match self.agents[i].commands.send(command).await {
                Ok(()) => answer.await.unwrap_or_else(|_| Err("the connection to the agent was lost".to_string())),
                Err(_) => Err("the connection to the agent was lost".to_string()),
            };
            if let Err(error) = result {
                for &j in &started {
                    let _ = self.agents[j].commands.send(Command::Stop { trace_id }).await;
                }
                return Err(ClusterError::StartFailed { agent, error });
            }
            started.push(i);
        }
        let commands = indexes.iter().map(|&i| self.agents[i].commands.clone()).collect();
        Ok(ClusterTrace { id: trace_id, hosts: indexes, shared: self.shared.clone(), commands, spill })
    }

    /// Starts one trace with the same request on every connected agent.
    pub async fn start_all(&self, request: TraceRequest) -> Result<ClusterTrace, ClusterError> {
        self.start(self.agents().into_iter().map(|agent| (agent, request.clone())).collect()).await
    }

    /// Runs `command` on one agent's host, traced, and returns its exit code (128 + signal if
    /// killed; `None` if it is unknown) with the events it caused.
    pub async fn trace_command(
        &self,
        agent: &str,
        command: Vec<String>,
        mut request: TraceRequest,
    ) -> Result<(Option<i32>, Vec<Event>), ClusterError> {
        request.command = command;
        let trace = self.start(vec![(agent.to_string(), request)]).await?;
        trace.finished().await;
        let exit = trace.shared.hosts[trace.hosts[0]].lock().unwrap().end.as_ref().and_then(|e| e.command_exit_code);
        let merged = trace.stop().await?;
        Ok((exit, merged.events))
    }
}

/// A trace running on several hosts.
pub struct ClusterTrace {
    id: u64,
    hosts: Vec<usize>,
    shared: Arc<Shared>,
    commands: Vec<mpsc::Sender<Command>>,
    spill: Arc<SpillDir>,
}

/// Events a subscriber's channel holds; beyond, events are dropped for it and counted.
pub const SUBSCRIBER_CHANNEL: usize = 1 << 16;

/// The `lost_events` kind of what live subscribers were not given.
pub const LOST_BY_SUBSCRIBERS: &str = "live_subscribers";

impl ClusterTrace {
    /// This trace's id, unique per collector process; agents tag everything they send with it.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The hosts whose agents send this trace's spans to an OpenTelemetry collector themselves
    /// (`tracer agent --otlp`), each with the name the agent gives its host (its spans'
    /// `host.name`).
    pub fn exporting_hosts(&self) -> std::collections::HashMap<String, String> {
        self.hosts
            .iter()
            .filter_map(|&i| {
                let h = self.shared.hosts[i].lock().unwrap();
                h.exports_otlp.then(|| (h.host.clone(), h.start.as_ref().map_or_else(String::new, |s| s.host.clone())))
            })
            .collect()
    }

    /// Every event received so far, on the collector's clock (as measured so far) and in one time
    /// order. Flows are linked only in [`ClusterTrace::stop`]'s result. Empty if the spill files
    /// cannot be read (said as a warning).
    pub fn events_so_far(&self) -> Vec<Event> {
        match self.snapshot(EndReason::InputEnded) {
            Ok(m) => m.events,
            Err(e) => {
                tracing::warn!(target: LOG, "warning: cannot read the events so far: {}", report(&e));
                Vec::new()
            }
        }
    }

    /// The trace so far, merged: clocks corrected, flows linked.
    pub fn snapshot(&self, reason: EndReason) -> Result<MergedTrace, ClusterError> {
        let hosts = self.host_traces(false)?;
        let collector = self.collector_start(&hosts);
        Ok(merge(hosts, &collector, reason)?)
    }

    /// The private directory this trace's hosts spill to (removed once the trace and what was
    /// read from it are dropped).
    pub fn spill_dir(&self) -> &Path {
        self.spill.path()
    }

    /// What the hosts sent. `finish`: the trace is over, its spill files are taken (later
    /// arrivals are dropped).
    fn host_traces(&self, finish: bool) -> std::io::Result<Vec<HostTrace>> {
        self.hosts
            .iter()
            .map(|&i| {
                let mut h = self.shared.hosts[i].lock().unwrap();
                let mut spill = if finish { h.spill.take() } else { None };
                let events = match spill.as_mut().or(h.spill.as_mut()) {
                    Some(s) => HostEvents::Spilled(s.flushed()?),
                    None => HostEvents::default(),
                };
                Ok(HostTrace {
                    host: h.host.clone(),
                    samples: h.samples.clone(),
                    start: h.start.clone(),
                    end: h.end.clone(),
                    events,
                    lost_in_transit: h.lost_in_transit,
                    losses: h.losses.clone(),
                })
            })
            .collect()
    }

    /// The start of the merged trace: the collector's clock and machine.
    fn collector_start(&self, hosts: &[HostTrace]) -> TraceStart {
        let starts: Vec<&TraceStart> = hosts.iter().filter_map(|h| h.start.as_ref()).collect();
        self.start_of(&starts)
    }

    /// The start a merge of the hosts started so far would have (for a live view of the trace,
    /// whose events come from [`ClusterTrace::subscribe`]).
    pub fn start_so_far(&self) -> TraceStart {
        let starts: Vec<TraceStart> =
            self.hosts.iter().filter_map(|&i| self.shared.hosts[i].lock().unwrap().start.clone()).collect();
        self.start_of(&starts.iter().collect::<Vec<_>>())
    }

    fn start_of(&self, starts: &[&TraceStart]) -> TraceStart {
        let kinds = starts.iter().flat_map(|s| s.events.clone()).collect::<std::collections::BTreeSet<EventKind>>();
        TraceStart {
            format_version: FORMAT_VERSION,
            host: host::default_name(),
            tracer_version: env!("CARGO_PKG_VERSION").to_string(),
            ts: self.shared.clock.now_unix_ns(),
            clock: self.shared.clock.info(),
            targets: Vec::new(),
            probes: 0,
            events: kinds.into_iter().collect(),
            follow_children: starts.iter().any(|s| s.follow_children),
            probe_paths: Default::default(),
            aliases: Default::default(),
            hosts: Vec::new(),
            machine: Some(self.shared.machine.clone()),
            kernel: None,
        }
    }

    /// Every event of this trace as it arrives (on its host's clock, flows not yet linked): first
    /// those received so far, then the rest. The channel holds [`SUBSCRIBER_CHANNEL`] events: a
    /// subscriber that falls further behind misses events, counted in the merged trace's
    /// `lost_events` as [`LOST_BY_SUBSCRIBERS`] and said on stop. It closes when the trace is
    /// stopped.
    pub fn subscribe(&self) -> mpsc::Receiver<Event> {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_CHANNEL);
        // Holding the trace's hosts (in index order, as everywhere) while replaying and
        // registering: no batch can arrive in between, so nothing is missed or sent twice.
        let mut indexes = self.hosts.clone();
        indexes.sort_unstable();
        let mut hosts: Vec<_> = indexes.iter().map(|&i| self.shared.hosts[i].lock().unwrap()).collect();
        let mut subscriber = Subscriber { trace_id: self.id, events: tx, dropped: 0 };
        for h in hosts.iter_mut() {
            let so_far = h.spill.as_mut().map(|s| s.flushed().and_then(|f| f.read().map(|r| r.collect::<Vec<_>>())));
            match so_far {
                None => {}
                Some(Ok(events)) => {
                    for e in events {
                        match e {
                            Ok(e) => {
                                subscriber.give(e);
                            }
                            Err(_) => subscriber.dropped += 1,
                        }
                    }
                }
                Some(Err(e)) => {
                    subscriber.dropped += h.spill.as_ref().map_or(0, |s| s.len());
                    tracing::warn!(target: LOG, "warning: cannot replay host {}'s events so far: {e}", h.host);
                }
            }
        }
        self.shared.subscribers.lock().unwrap().push(subscriber);
        rx
    }

    /// Calls `f` with every event of this trace, as [`ClusterTrace::subscribe`] delivers them, on a
    /// thread of its own. The thread ends once the trace is stopped and `f` has seen every event:
    /// join it to wait for that.
    pub fn on_event(&self, mut f: impl FnMut(&Event) + Send + 'static) -> std::thread::JoinHandle<()> {
        let mut events = self.subscribe();
        std::thread::spawn(move || {
            while let Some(e) = events.blocking_recv() {
                f(&e);
            }
        })
    }

    /// Per host: its name, the events received, and the seconds between the first and the last
    /// arrival.
    pub fn ingest(&self) -> Vec<(String, u64, f64)> {
        self.hosts
            .iter()
            .map(|&i| {
                let h = self.shared.hosts[i].lock().unwrap();
                let seconds = match (h.first_arrival, h.last_arrival) {
                    (Some(a), Some(b)) => (b - a).as_secs_f64(),
                    _ => 0.0,
                };
                (h.host.clone(), h.next_seq - h.lost_in_transit, seconds)
            })
            .collect()
    }

    /// Events received so far from all hosts, and those known lost on the way (an agent's
    /// buffer overflowed while its collector was away); for a status line.
    pub fn received_and_lost(&self) -> (u64, u64) {
        received_and_lost(&self.shared, &self.hosts)
    }

    /// [`ClusterTrace::received_and_lost`] as a function that outlives this borrow, for a status
    /// shown from another thread (the live page's).
    pub fn progress(&self) -> impl Fn() -> (u64, u64) + Send + Sync + 'static {
        let (shared, hosts) = (self.shared.clone(), self.hosts.clone());
        move || received_and_lost(&shared, &hosts)
    }

    /// Whether every host's trace has ended (its targets are gone, or it failed).
    pub fn is_finished(&self) -> bool {
        self.hosts.iter().all(|&i| self.shared.hosts[i].lock().unwrap().finished())
    }

    /// Waits until every host's trace has ended by itself.
    pub async fn finished(&self) {
        loop {
            let notified = self.shared.changed.notified();
            if self.is_finished() {
                return;
            }
            notified.await;
        }
    }

    /// Stops every host, waits for their last events, and merges (the events move into the
    /// result: [`ClusterTrace::events_so_far`] is empty afterwards).
    pub async fn stop(&self) -> Result<MergedTrace, ClusterError> {
        self.stop_because(EndReason::Stopped).await
    }

    /// Like [`ClusterTrace::stop`], naming why in the merged trace's end. A host whose trace
    /// could not be collected whole is named in the end's `hosts`, with what was lost and why.
    pub async fn stop_because(&self, reason: EndReason) -> Result<MergedTrace, ClusterError> {
        let (hosts, collector, reason, dropped) = self.finish(reason).await?;
        let merging = Instant::now();
        let mut merged = merge(hosts, &collector, reason)?;
        add_subscriber_drops(&mut merged.end, dropped);
        self.merged_in(merging, merged.events.len() as u64);
        Ok(merged)
    }

    /// Like [`ClusterTrace::stop_because`], writing the merged trace into `sink` as it is merged
    /// instead of returning its events: memory holds what links need, not the trace.
    pub async fn stop_into(
        &self,
        reason: EndReason,
        sink: &mut dyn Sink,
    ) -> Result<(TraceStart, TraceEnd), ClusterError> {
        let (hosts, collector, reason, dropped) = self.finish(reason).await?;
        let merging = Instant::now();
        let mut sink = AddSubscriberDrops { sink, dropped };
        let (start, mut end) = merge_into(hosts, &collector, reason, &mut sink)?;
        add_subscriber_drops(&mut end, dropped);
        self.merged_in(merging, end.events_written);
        Ok((start, end))
    }

    /// Stops every host and waits for their last events; returns what they sent, the merged
    /// trace's start and end reason, and what live subscribers missed. Closes the subscriptions.
    async fn finish(&self, reason: EndReason) -> Result<(Vec<HostTrace>, TraceStart, EndReason, u64), ClusterError> {
        let ended_by_itself = self.is_finished();
        for c in &self.commands {
            let _ = c.send(Command::Stop { trace_id: self.id }).await;
        }
        let timeout = self.shared.stop_timeout;
        let _ = tokio::time::timeout(timeout, self.finished()).await;
        for &i in &self.hosts {
            let mut h = self.shared.hosts[i].lock().unwrap();
            if !h.finished() {
                h.given_up = true;
                let detail = match h.total {
                    Some(total) => format!(
                        "the trace did not end within {timeout:?} of the stop: {} of its {total} events arrived",
                        h.next_seq
                    ),
                    None => format!("the trace did not end within {timeout:?} of the stop (no end from the agent)"),
                };
                h.lose(LossCause::StopTimedOut, detail);
            }
        }
        let reason = if ended_by_itself { EndReason::TargetsExited } else { reason };
        // The trace is over: its spill files move into the merge.
        let hosts = self.host_traces(true)?;
        let collector = self.collector_start(&hosts);
        let mut dropped = 0;
        self.shared.subscribers.lock().unwrap().retain(|s| {
            if s.trace_id == self.id {
                dropped += s.dropped;
            }
            s.trace_id != self.id
        });
        if dropped > 0 {
            tracing::warn!(
                target: LOG,
                "warning: live subscribers missed {dropped} events: {}",
                crate::event::why_lost(LOST_BY_SUBSCRIBERS)
            );
        }
        Ok((hosts, collector, reason, dropped))
    }

    fn merged_in(&self, since: Instant, events: u64) {
        let seconds = since.elapsed().as_secs_f64();
        tracing::info!(
            target: LOG,
            "merged {events} events from {} host{} in {seconds:.3} s{}",
            self.hosts.len(),
            if self.hosts.len() == 1 { "" } else { "s" },
            rate(events, seconds)
        );
    }
}

fn received_and_lost(shared: &Shared, hosts: &[usize]) -> (u64, u64) {
    hosts.iter().fold((0, 0), |(received, lost), &i| {
        let h = shared.hosts[i].lock().unwrap();
        (received + h.next_seq - h.lost_in_transit, lost + h.lost_in_transit)
    })
}

impl Subscriber {
    /// Gives an event to the subscriber, or counts it as dropped if its channel is full.
    /// `false`: the subscriber has hung up.
    pub(super) fn give(&mut self, event: Event) -> bool {
        match self.events.try_send(event) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.dropped += 1;
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }
}

fn add_subscriber_drops(end: &mut TraceEnd, dropped: u64) {
    if dropped > 0 {
        *end.lost_events.entry(LOST_BY_SUBSCRIBERS.to_string()).or_default() += dropped;
    }
}

/// Passes a merge on to a sink, adding what live subscribers missed to its end.
struct AddSubscriberDrops<'a> {
    sink: &'a mut dyn Sink,
    dropped: u64,
}

impl Sink for AddSubscriberDrops<'_> {
    fn begin(&mut self, start: &TraceStart) -> std::io::Result<()> {
        self.sink.begin(start)
    }
    fn event(&mut self, event: &Event) -> std::io::Result<()> {
        self.sink.event(event)
    }
    fn event_on_host_clock(&mut self, event: &Event, host_ts: u64) -> std::io::Result<()> {
        self.sink.event_on_host_clock(event, host_ts)
    }
    fn end(&mut self, end: &TraceEnd) -> std::io::Result<()> {
        let mut end = end.clone();
        add_subscriber_drops(&mut end, self.dropped);
        self.sink.end(&end)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.sink.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_need_an_interval_long_enough_to_mean_something() {
        assert_eq!(rate(937, 0.0), "");
        assert_eq!(rate(937, 0.099), "");
        assert_eq!(rate(1000, 0.1), " (10000 events/s)");
        assert_eq!(rate(30, 2.0), " (15 events/s)");
    }

    #[test]
    fn names_are_checked_before_anything_connects() {
        let specs: Vec<AgentSpec> =
            ["web=10.0.0.1:7070", "web=10.0.0.2:7070"].iter().map(|s| s.parse().unwrap()).collect();
        let err = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(Cluster::connect(specs, ClientOptions::default()))
            .err()
            .unwrap();
        assert_eq!(err.to_string(), "host name web is given twice: each host needs a name of its own");
        assert_eq!(
            "we b=1.2.3.4:5".parse::<AgentSpec>().unwrap_err(),
            "host name \"we b\" has ' ': use letters, digits, '.', '_' and '-' only"
        );
    }

    #[test]
    fn agent_specs() {
        assert_eq!(
            "web=10.0.0.1:7070".parse::<AgentSpec>(),
            Ok(AgentSpec { name: "web".into(), addr: AgentAddr::Tcp("10.0.0.1:7070".into()) })
        );
        assert_eq!("db=[::1]:7070".parse::<AgentSpec>().unwrap().addr, AgentAddr::Tcp("[::1]:7070".into()));
        assert_eq!(
            "h=unix:/run/tracer/agent.sock".parse::<AgentSpec>().unwrap().addr,
            AgentAddr::Unix("/run/tracer/agent.sock".into())
        );
        assert!("h=unix:".parse::<AgentSpec>().is_err());
        assert!("web".parse::<AgentSpec>().is_err());
        assert!("=1.2.3.4:5".parse::<AgentSpec>().is_err());
        assert!("web=host".parse::<AgentSpec>().is_err());
    }
}
