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
    collections::HashMap,
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
    auth::{self, Key, Secret},
    clock_sync::ClockSample,
    listener::peer_creds,
    merge::{HostTrace, MergedTrace, merge},
    protocol::{Message, TraceRequest},
    session::{self, HandshakeError, Session},
    tls,
    wire::Decoder,
};
use crate::{
    assemble::clock::BootClock,
    errors::report,
    event::host::{self, Machine, NameError},
    event::{EndReason, Event, EventKind, FORMAT_VERSION, HostLoss, LossCause, TraceEnd, TraceStart},
    export::Format,
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
    Name(#[from] NameError),
}

/// Everything one host has sent for the current trace.
#[derive(Default)]
struct HostState {
    host: String,
    samples: Vec<ClockSample>,
    trace_id: Option<u64>,
    start: Option<TraceStart>,
    end: Option<TraceEnd>,
    /// Events the agent says it produced (known once it ended).
    total: Option<u64>,
    events: Vec<Event>,
    next_seq: u64,
    lost_in_transit: u64,
    /// What makes this host's trace incomplete, so far.
    losses: Vec<HostLoss>,
    /// Nothing more will come for this trace (the agent is lost, or dropped or failed it).
    given_up: bool,
    /// The resume key of the connection that started the trace.
    resume_key: Option<Key>,
    /// When the first and the latest events arrived (ingest rate).
    first_arrival: Option<Instant>,
    last_arrival: Option<Instant>,
}

impl HostState {
    fn finished(&self) -> bool {
        self.given_up || self.total.is_some_and(|t| self.next_seq >= t)
    }

    fn lose(&mut self, cause: LossCause, detail: String) {
        log(format_args!("host {}: {detail}", self.host));
        self.losses.push(HostLoss { cause, detail });
    }
}

/// A receiver of one trace's events as they arrive.
struct Subscriber {
    trace_id: u64,
    events: mpsc::UnboundedSender<Event>,
}

struct Shared {
    hosts: Vec<Mutex<HostState>>,
    /// The collector's own machine.
    machine: Machine,
    subscribers: Mutex<Vec<Subscriber>>,
    changed: Notify,
    clock: BootClock,
    stop_timeout: Duration,
}

enum Command {
    Start { trace_id: u64, request: TraceRequest, reply: oneshot::Sender<Result<(), String>> },
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

fn log(message: impl std::fmt::Display) {
    eprintln!("tracer collect: {message}");
}

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

/// How long an agent may be silent while it starts a trace.
const START_SILENCE: Duration = Duration::from_secs(30);

/// Round trips before the first trace: the tightest gives the offset.
const FIRST_PROBES: u32 = 16;

/// Measures an agent's clock a few times on a fresh connection; an agent silent for `silence`
/// is an error.
async fn probe_clock(conn: &mut Session, clock: &BootClock, silence: Duration) -> Result<Vec<ClockSample>, String> {
    let mut samples = Vec::new();
    for id in 0..FIRST_PROBES {
        let t0 = clock.now_unix_ns();
        conn.writer.send(&Message::ClockProbe { id }).await.map_err(|e| report(&e))?;
        let echo = tokio::time::timeout(silence, conn.reader.recv())
            .await
            .map_err(|_| format!("no answer to a clock probe within {silence:?}"))?
            .map_err(|e| report(&e))?;
        if let Message::ClockEcho { id: echoed, agent_ns } = echo
            && echoed == id
        {
            samples.push(ClockSample { t0, t1: clock.now_unix_ns(), agent_ns });
        }
    }
    Ok(samples)
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
            let samples = probe_clock(&mut conn, &clock, options.silence)
                .await
                .map_err(|reason| ClusterError::Protocol { agent: spec.name.clone(), reason })?;
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
        });
        let mut handles = Vec::new();
        for (index, ((conn, _), spec)) in connections.into_iter().zip(agents).enumerate() {
            let (tx, rx) = mpsc::channel(16);
            tokio::spawn(agent_task(index, spec.clone(), options.clone(), shared.clone(), rx, conn));
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
        for &i in &indexes {
            let mut h = self.shared.hosts[i].lock().unwrap();
            let samples = std::mem::take(&mut h.samples);
            let host = std::mem::take(&mut h.host);
            *h = HostState { host, samples, trace_id: Some(trace_id), ..Default::default() };
        }
        let mut started: Vec<usize> = Vec::new();
        for ((agent, request), &i) in requests.into_iter().zip(&indexes) {
            let (reply, answer) = oneshot::channel();
            let command = Command::Start { trace_id, request, reply };
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
        Ok(ClusterTrace { id: trace_id, hosts: indexes, shared: self.shared.clone(), commands })
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
}

impl ClusterTrace {
    /// This trace's id, unique per collector process; agents tag everything they send with it.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Every event received so far, on the collector's clock (as measured so far) and in one time
    /// order. Flows are linked only in [`ClusterTrace::stop`]'s result.
    pub fn events_so_far(&self) -> Vec<Event> {
        self.snapshot(EndReason::InputEnded).events
    }

    /// The trace so far, merged: clocks corrected, flows linked.
    pub fn snapshot(&self, reason: EndReason) -> MergedTrace {
        self.merged(reason, |events| events.clone())
    }

    /// Merges what the hosts sent, taking each host's events with `take`.
    fn merged(&self, reason: EndReason, take: impl Fn(&mut Vec<Event>) -> Vec<Event>) -> MergedTrace {
        let hosts: Vec<HostTrace> = self
            .hosts
            .iter()
            .map(|&i| {
                let mut h = self.shared.hosts[i].lock().unwrap();
                HostTrace {
                    host: h.host.clone(),
                    samples: h.samples.clone(),
                    start: h.start.clone(),
                    end: h.end.clone(),
                    events: take(&mut h.events),
                    lost_in_transit: h.lost_in_transit,
                    losses: h.losses.clone(),
                }
            })
            .collect();
        let kinds = hosts
            .iter()
            .filter_map(|h| h.start.as_ref())
            .flat_map(|s| s.events.clone())
            .collect::<std::collections::BTreeSet<EventKind>>();
        let collector = TraceStart {
            format_version: FORMAT_VERSION,
            host: host::default_name(),
            tracer_version: env!("CARGO_PKG_VERSION").to_string(),
            ts: self.shared.clock.now_unix_ns(),
            clock: self.shared.clock.info(),
            targets: Vec::new(),
            probes: 0,
            events: kinds.into_iter().collect(),
            follow_children: hosts.iter().filter_map(|h| h.start.as_ref()).any(|s| s.follow_children),
            probe_paths: Default::default(),
            hosts: Vec::new(),
            machine: Some(self.shared.machine.clone()),
        };
        merge(hosts, &collector, reason)
    }

    /// Every event of this trace as it arrives (on its host's clock, flows not yet linked): first
    /// those received so far, then the rest. The channel closes when the trace is stopped.
    pub fn subscribe(&self) -> mpsc::UnboundedReceiver<Event> {
        let (tx, rx) = mpsc::unbounded_channel();
        // Holding the trace's hosts (in index order, as everywhere) while replaying and
        // registering: no batch can arrive in between, so nothing is missed or sent twice.
        let mut indexes = self.hosts.clone();
        indexes.sort_unstable();
        let hosts: Vec<_> = indexes.iter().map(|&i| self.shared.hosts[i].lock().unwrap()).collect();
        for e in hosts.iter().flat_map(|h| &h.events) {
            let _ = tx.send(e.clone());
        }
        self.shared.subscribers.lock().unwrap().push(Subscriber { trace_id: self.id, events: tx });
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
        self.hosts.iter().fold((0, 0), |(received, lost), &i| {
            let h = self.shared.hosts[i].lock().unwrap();
            (received + h.next_seq - h.lost_in_transit, lost + h.lost_in_transit)
        })
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
        let merging = Instant::now();
        // The trace is over: its events move into the merge instead of being copied.
        let merged = self.merged(reason, std::mem::take);
        // Closes this trace's subscriptions.
        self.shared.subscribers.lock().unwrap().retain(|s| s.trace_id != self.id);
        let seconds = merging.elapsed().as_secs_f64();
        log(format_args!(
            "merged {} events from {} hosts in {seconds:.3} s{}",
            merged.events.len(),
            self.hosts.len(),
            rate(merged.events.len() as u64, seconds)
        ));
        Ok(merged)
    }
}

impl MergedTrace {
    /// Writes the merged trace as a Chrome trace.
    pub fn export_chrome(&self, path: &Path) -> Result<(), ClusterError> {
        self.export(path, Format::Chrome)
    }

    /// Writes the merged trace in any format `record` writes.
    pub fn export(&self, path: &Path, format: Format) -> Result<(), ClusterError> {
        let mut sink = format.sink(std::fs::File::create(path)?);
        self.write(&mut *sink)?;
        Ok(())
    }
}

/// Serves one agent: the connection, and reconnections.
async fn agent_task(
    index: usize,
    spec: AgentSpec,
    options: ClientOptions,
    shared: Arc<Shared>,
    mut commands: mpsc::Receiver<Command>,
    first: Session,
) {
    let mut connection = Some(first);
    loop {
        let conn = match connection.take() {
            Some(c) => c,
            None => match reconnect(&spec, &options).await {
                Some(c) => c,
                None => {
                    let mut h = shared.hosts[index].lock().unwrap();
                    if h.trace_id.is_some() && !h.finished() {
                        h.given_up = true;
                        let detail = format!(
                            "could not reach the agent again within {:?} (the reconnect window): events from #{} on are missing",
                            options.reconnect_for, h.next_seq
                        );
                        h.lose(LossCause::ReconnectWindowUsedUp, detail);
                    }
                    drop(h);
                    shared.changed.notify_waiters();
                    return;
                }
            },
        };
        match session(index, &options, &shared, &mut commands, conn).await {
            Ok(()) => return,
            Err(reason) => {
                log(format_args!("connection to {} lost ({reason}); reconnecting", spec.name));
            }
        }
    }
}

async fn reconnect(spec: &AgentSpec, options: &ClientOptions) -> Option<Session> {
    let deadline = Instant::now() + options.reconnect_for;
    while Instant::now() < deadline {
        match connect_session(spec, options).await {
            Ok(c) => {
                log(format_args!("reconnected to {}", spec.name));
                return Some(c);
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    None
}

/// One connection's life: commands out, events in, clock probes and acks every so often.
/// `Ok` when the cluster is gone; `Err(reason)` when the connection dropped.
async fn session(
    index: usize,
    options: &ClientOptions,
    shared: &Arc<Shared>,
    commands: &mut mpsc::Receiver<Command>,
    conn: Session,
) -> Result<(), String> {
    // The collector stamps each event with the name the user gave the host on receipt (the wire
    // carries no host): an agent cannot speak for another host, and the agents' own names (often
    // equal: machines cloned from one image) are only information, in `trace_start.hosts`.
    let host: Arc<str> = Arc::from(shared.hosts[index].lock().unwrap().host.as_str());
    let Session { mut reader, mut writer, transcript, resume_key, .. } = conn;
    let (tx, mut incoming) = mpsc::channel(256);
    let reading = tokio::spawn(async move {
        loop {
            let message = reader.recv().await;
            let failed = message.is_err();
            if tx.send(message).await.is_err() || failed {
                return;
            }
        }
    });
    let result = async {
        let mut decoder = Decoder::default();
        let mut pending_start: Option<oneshot::Sender<Result<(), String>>> = None;
        let mut resuming = false;
        let mut probes: HashMap<u32, u64> = HashMap::new();
        let mut next_probe = 1_000u32;
        let mut acked = 0;
        // Carry on with a trace the previous connection was streaming, proving with the key of
        // the connection that started it that this is the same collector.
        let resume = {
            let h = shared.hosts[index].lock().unwrap();
            // Only a trace the agent confirmed (a start in flight is answered on this connection).
            match (h.trace_id, h.resume_key) {
                (Some(trace_id), Some(key)) if h.start.is_some() && !h.finished() => Some(Message::Resume {
                    trace_id,
                    next_seq: h.next_seq,
                    proof: auth::resume_proof(&key, &transcript, trace_id),
                }),
                _ => None,
            }
        };
        if let Some(resume) = resume {
            resuming = true;
            writer.send(&resume).await.map_err(|e| report(&e))?;
        }
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut ticks = 0u64;
        let mut last_heard = Instant::now();
        loop {
            tokio::select! {
                command = commands.recv() => match command {
                    None => return Ok(()),
                    Some(Command::Start { trace_id, request, reply }) => {
                        pending_start = Some(reply);
                        writer.send(&Message::Start { trace_id, request }).await.map_err(|e| report(&e))?;
                    }
                    Some(Command::Stop { trace_id }) => {
                        writer.send(&Message::Stop { trace_id }).await.map_err(|e| report(&e))?;
                    }
                },
                message = incoming.recv() => {
                    let message = message.ok_or("connection closed")?.map_err(|e| report(&e))?;
                    last_heard = Instant::now();
                    match message {
                        Message::ClockEcho { id, agent_ns } => {
                            if let Some(t0) = probes.remove(&id) {
                                let sample = ClockSample { t0, t1: shared.clock.now_unix_ns(), agent_ns };
                                shared.hosts[index].lock().unwrap().samples.push(sample);
                            }
                        }
                        Message::Started { trace_id, trace_start } => {
                            let mut h = shared.hosts[index].lock().unwrap();
                            if h.trace_id == Some(trace_id) {
                                let mut trace_start = *trace_start;
                                trace_start.machine = trace_start.machine.map(Machine::from_peer);
                                h.start = Some(trace_start);
                                if !resuming {
                                    // The key that will resume this trace after a dropped connection.
                                    h.resume_key = Some(resume_key);
                                }
                            }
                            resuming = false;
                            drop(h);
                            decoder.reset();
                            if let Some(reply) = pending_start.take() {
                                let _ = reply.send(Ok(()));
                            }
                        }
                        Message::Failed { error, .. } => {
                            match pending_start.take() {
                                Some(reply) => {
                                    let _ = reply.send(Err(error));
                                }
                                None => {
                                    let mut h = shared.hosts[index].lock().unwrap();
                                    if h.trace_id.is_some() && !h.finished() {
                                        h.given_up = true;
                                        let cause = if resuming { LossCause::AgentDroppedTrace } else { LossCause::AgentFailed };
                                        h.lose(cause, format!("the agent says: {error}"));
                                    }
                                }
                            }
                            resuming = false;
                            shared.changed.notify_waiters();
                        }
                        Message::Events(batch) => {
                            let first_seq = batch.first_seq;
                            let events = decoder.events(&host, batch).map_err(|e| e.to_string())?;
                            let mut h = shared.hosts[index].lock().unwrap();
                            // A resumed connection may repeat what was received but not yet acked.
                            let skip = h.next_seq.saturating_sub(first_seq) as usize;
                            if first_seq > h.next_seq {
                                return Err(format!("events {}..{} are missing", h.next_seq, first_seq));
                            }
                            let fresh: Vec<Event> = events.into_iter().skip(skip).collect();
                            h.next_seq += fresh.len() as u64;
                            let now = Instant::now();
                            h.first_arrival.get_or_insert(now);
                            h.last_arrival = Some(now);
                            // Still holding the host: see `ClusterTrace::subscribe`.
                            if let Some(trace_id) = h.trace_id {
                                deliver(shared, trace_id, &fresh);
                            }
                            h.events.extend(fresh);
                        }
                        Message::Gap { first_seq, count } => {
                            let mut h = shared.hosts[index].lock().unwrap();
                            if first_seq == h.next_seq {
                                h.lost_in_transit += count;
                                h.next_seq += count;
                                let detail = format!(
                                    "the agent dropped events #{first_seq} to #{} while the collector was away (its --buffer-events was full)",
                                    first_seq + count - 1
                                );
                                h.lose(LossCause::Gap, detail);
                            }
                        }
                        Message::Ended { trace_id, trace_end, total_events } => {
                            let mut h = shared.hosts[index].lock().unwrap();
                            if h.trace_id == Some(trace_id) {
                                h.end = Some(trace_end);
                                h.total = Some(total_events);
                            }
                        }
                        Message::Refused { reason } => return Err(format!("refused: {reason}")),
                        other => return Err(format!("unexpected {other:?}")),
                    }
                    // Everything is here: say so at once, so that the agent can let the trace go
                    // (it keeps an unacknowledged trace for its collector).
                    let done = {
                        let h = shared.hosts[index].lock().unwrap();
                        h.total.is_some_and(|t| h.next_seq >= t).then_some(h.next_seq)
                    };
                    if let Some(next_seq) = done.filter(|&n| n != acked) {
                        writer.send(&Message::Ack { next_seq }).await.map_err(|e| report(&e))?;
                        acked = next_seq;
                    }
                    shared.changed.notify_waiters();
                },
                _ = tick.tick() => {
                    ticks += 1;
                    // An agent attaching probes answers nothing until it is done: that may take
                    // seconds (large binaries, a loaded machine).
                    let silence = if pending_start.is_some() { options.silence.max(START_SILENCE) } else { options.silence };
                    if last_heard.elapsed() > silence {
                        return Err(format!("silent for {silence:?}"));
                    }
                    let next_seq = shared.hosts[index].lock().unwrap().next_seq;
                    if next_seq != acked {
                        writer.send(&Message::Ack { next_seq }).await.map_err(|e| report(&e))?;
                        acked = next_seq;
                    }
                    if ticks.is_multiple_of(10) {
                        next_probe = next_probe.wrapping_add(1);
                        probes.insert(next_probe, shared.clock.now_unix_ns());
                        writer.send(&Message::ClockProbe { id: next_probe }).await.map_err(|e| report(&e))?;
                    }
                },
            }
        }
    }
    .await;
    reading.abort();
    result
}

/// Passes fresh events of a trace to its subscribers; drops those that hung up.
fn deliver(shared: &Shared, trace_id: u64, events: &[Event]) {
    shared
        .subscribers
        .lock()
        .unwrap()
        .retain(|s| s.trace_id != trace_id || events.iter().all(|e| s.events.send(e.clone()).is_ok()));
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
