//! `tracer agent`: waits for a collector, records what it asks for, streams the events.
//!
//! Who may talk to it: by default only root and, with a socket group, that group's members, on
//! a Unix socket whose peers the kernel names; over TCP only collectors that prove they hold the
//! secret ([`super::session`]), every frame after that encrypted and authenticated. Before a peer has proved itself it
//! gets a few seconds, a few KiB per frame and one of [`MAX_UNAUTHENTICATED`] places, at most
//! [`admission::MAX_PER_SOURCE`] per uid or address ([`admission`]: an idle peer makes room for
//! a newcomer, one that has started its handshake never does), so that idle or hostile
//! connections never keep a collector out or grow the agent's memory; whoever is refused or
//! closed is told why, and whatever a bound drops is counted and logged.
//!
//! One trace at a time, owned by the connection that started it: only that connection, or a
//! reconnection that proves it is the same collector (a resume proof made with the first
//! connection's key), receives, acknowledges or stops it. Its events are numbered and kept in an
//! [`Outbox`] until acknowledged, so a collector that loses the connection resumes without
//! duplicates or holes. A trace whose collector has sent nothing for `orphan_timeout` (gone,
//! stopped, or behind a dead link: writes to it time out) is stopped and its probes detached; its
//! targets keep running. Commands it launched that outlive their trace are reaped.
//!
//! Runs on one thread (`serve` must be polled inside a `tokio::task::LocalSet`): connections,
//! the recording and the watchdog share the agent's state without locks.

use std::{
    cell::{Cell, RefCell},
    collections::{BTreeSet, HashMap},
    ffi::OsString,
    future::Future,
    net::SocketAddr,
    path::PathBuf,
    rc::Rc,
    time::{Duration, Instant},
};

use tokio::sync::{mpsc, oneshot, watch};
use tokio_rustls::TlsAcceptor;

use super::{
    admission::{self, Admission, Refused},
    auth::{self, Key, Secret},
    command_output,
    listener::{self, ListenError, Listener, Peer, PeerCreds},
    outbox::{self, Outbox},
    protocol::{FrameError, Message, TraceRequest},
    request_limits,
    session::{self, HANDSHAKE_TIMEOUT, Session, SessionWriter},
    tls::{self, Transport},
    wire,
};
use crate::{
    assemble::clock::BootClock,
    breakpoints::spec::{BreakSpec, WatchSpec},
    errors::report,
    event::{EndReason, Event, EventKind, TraceEnd, TraceStart},
    plan::{self, Plan, RecordError, RecordOptions},
    record::Recording,
    sink::Sink,
    targets::detached::Detached,
    targets::launch::{RunAs, Start, try_reap},
};

/// A collector that says nothing for this long (it probes the clock every second) is gone.
const SILENCE: Duration = Duration::from_secs(10);
pub use super::admission::MAX_UNAUTHENTICATED;
/// Authenticated collectors connected at once, at most.
pub const MAX_COLLECTORS: usize = 8;
/// Longest pause after `accept` failed (out of descriptors, say) before trying again.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Log lines per kind of dropped connection per second, at most (the counts are exact).
const LOGS_PER_SECOND: u32 = 10;
/// Refusals being told at once, at most: each holds its connection a tenth of a second (up to a
/// second if the peer does not read); beyond, a refused peer is closed without a word (and
/// counted).
const MAX_REFUSING: usize = 64;

/// Where the agent waits for collectors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// A Unix socket; members of `group` may connect besides root.
    Unix { path: PathBuf, group: Option<String> },
    /// A TCP address (needs a secret).
    Tcp(SocketAddr),
}

pub struct AgentOptions {
    pub listen: Listen,
    pub secret: Option<Secret>,
    pub tls: Option<TlsAcceptor>,
    /// Launch commands for collectors (`-c`); without it a request with a command is refused.
    pub allow_commands: bool,
    /// What this agent calls its host (the machine's host name): in its own log lines and its
    /// welcome to collectors, as information. Collectors name the hosts they trace themselves
    /// (`--agent NAME=ADDR`) and stamp that name on every event they receive.
    pub host: String,
    /// For tests on one machine: pretend this host's clock is ahead by this much (events, trace
    /// lines and clock answers all shift).
    pub test_clock_skew_ns: i64,
    /// Stop a trace whose collector has sent nothing for this long.
    pub orphan_timeout: Duration,
    /// Events kept for a collector that is not connected; older ones are dropped and counted.
    pub max_buffered: usize,
    /// Encoded bytes of those events kept at most ([`outbox::DEFAULT_MAX_BYTES`] unless said).
    pub max_buffered_bytes: usize,
    /// Send every trace's spans straight to this OpenTelemetry collector as well (`--otlp`). Only
    /// the operator's command line sets it: no collector peer can name where this host's spans go.
    pub otlp: Option<crate::export::otlp::OtlpConfig>,
    /// Where launched commands' stdout and stderr go, one directory per user
    /// ([`command_output`]).
    pub command_output_dir: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(
        "refusing to listen on {0} without a secret: give a --secret-file (every TCP address needs one, loopback included; make one with --gen-secret FILE)"
    )]
    Unauthenticated(SocketAddr),
    #[error("TLS is for TCP (--listen): a Unix socket never leaves the machine")]
    TlsOnUnixSocket,
    #[error(transparent)]
    Listen(#[from] ListenError),
}

struct TraceSlot {
    id: u64,
    outbox: Outbox,
    start: Box<TraceStart>,
    /// The trace's last line and event count, once it is over.
    end: Option<(TraceEnd, u64)>,
    stop: Option<oneshot::Sender<EndReason>>,
    /// The connection streaming it, if one is.
    owner: Option<u64>,
    /// When its collector last sent a frame (the owning connection's clock).
    heard: Rc<Cell<Instant>>,
    /// The resume key of the connection that started it.
    resume_key: Key,
    /// Its launched command's output on its way to the collector (none without a command).
    output: Option<Rc<RefCell<command_output::OutputQueue>>>,
}

/// One authenticated connection.
struct Conn {
    id: u64,
    heard: Rc<Cell<Instant>>,
    transcript: [u8; 32],
    resume_key: Key,
    creds: Option<PeerCreds>,
}

/// Counts what the bounds drop, and logs it without letting a flood flood the log.
#[derive(Default)]
struct Drops {
    counts: RefCell<HashMap<&'static str, (u64, Instant, u32)>>,
}

impl Drops {
    fn note(&self, what: &'static str, detail: impl std::fmt::Display) {
        let mut counts = self.counts.borrow_mut();
        let (total, window, logged) = counts.entry(what).or_insert((0, Instant::now(), 0));
        *total += 1;
        if window.elapsed() >= Duration::from_secs(1) {
            *window = Instant::now();
            *logged = 0;
        }
        if *logged < LOGS_PER_SECOND {
            *logged += 1;
            tracing::info!(target: LOG, "{detail} ({total} {what} so far)");
        }
    }
}

struct Agent {
    opts: AgentOptions,
    slot: RefCell<Option<TraceSlot>>,
    /// Bumped whenever there is something new to send.
    changed: watch::Sender<u64>,
    /// Whether `changed` was bumped for events that no connection has looked at since: a bump per
    /// event (a wake of every connection) cost more than encoding it.
    wake_pending: Cell<bool>,
    clock: BootClock,
    /// Connections that have not proved themselves yet.
    admission: RefCell<Admission>,
    /// Refusals being told.
    refusing: Rc<Cell<usize>>,
    collectors: Cell<usize>,
    /// A trace is being planned (its slot is filled once it starts).
    starting: Cell<bool>,
    next_conn: Cell<u64>,
    drops: Drops,
    /// Commands that outlived their trace, to be reaped when they exit.
    launched: RefCell<Vec<u32>>,
}

/// The `tracing` target of the agent's events: the binary prints them as `tracer agent: …`.
pub const LOG: &str = "tracer agent";

impl Agent {
    fn now_ns(&self) -> u64 {
        (self.clock.now_unix_ns() as i64 + self.opts.test_clock_skew_ns) as u64
    }

    fn skew(&self, ts: u64) -> u64 {
        (ts as i64 + self.opts.test_clock_skew_ns) as u64
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    /// Tells a peer why it is refused and closes it, on a task of its own, unless
    /// [`MAX_REFUSING`] refusals are being told already (then it is closed at once).
    fn refuse(&self, mut stream: Box<dyn Transport>, reason: String) {
        if self.refusing.get() >= MAX_REFUSING {
            self.drops.note("peers closed without a word", format_args!("{MAX_REFUSING} refusals are being told"));
            return;
        }
        self.refusing.set(self.refusing.get() + 1);
        let refusing = self.refusing.clone();
        tokio::task::spawn_local(async move {
            session::refuse(&mut stream, &reason).await;
            refusing.set(refusing.get() - 1);
        });
    }
}

async fn bind(opts: &AgentOptions) -> Result<Listener, AgentError> {
    match &opts.listen {
        Listen::Tcp(addr) => {
            if opts.secret.is_none() {
                return Err(AgentError::Unauthenticated(*addr));
            }
            Ok(Listener::tcp(*addr).await?)
        }
        Listen::Unix { path, group } => {
            if opts.tls.is_some() {
                return Err(AgentError::TlsOnUnixSocket);
            }
            let group = group.as_deref().map(listener::group).transpose()?;
            Ok(Listener::unix(path, group)?)
        }
    }
}

/// Serves collectors until `shutdown` resolves; a running trace is then stopped and detached.
pub async fn serve(opts: AgentOptions, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
    let listener = bind(&opts).await?;
    let who = match (&listener, &opts.listen) {
        (Listener::Unix { group: Some((g, _)), .. }, _) => format!(", for root and group {g}"),
        (Listener::Unix { .. }, _) => ", for root only".to_string(),
        _ => String::new(),
    };
    tracing::info!(
                target: LOG,
        "listening on {} (host {}){who}{}{}{}",
        listener.describe(),
        opts.host,
        if opts.secret.is_some() { ", secret required" } else { "" },
        if opts.tls.is_some() { ", TLS" } else { "" },
        if opts.allow_commands { ", launching commands" } else { "" },
    );
    let agent = Rc::new(Agent {
        opts,
        slot: RefCell::new(None),
        changed: watch::channel(0).0,
        wake_pending: Cell::new(false),
        clock: BootClock::calibrate(),
        admission: RefCell::new(Admission::default()),
        refusing: Rc::new(Cell::new(0)),
        collectors: Cell::new(0),
        starting: Cell::new(false),
        next_conn: Cell::new(1),
        drops: Drops::default(),
        launched: RefCell::new(Vec::new()),
    });
    tokio::task::spawn_local(watchdog(agent.clone()));
    tokio::pin!(shutdown);
    let mut backoff = Duration::ZERO;
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer, verdict)) => {
                    backoff = Duration::ZERO;
                    admit(&agent, stream, peer, verdict);
                }
                Err(e) => {
                    let out_of_fds = matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
                    backoff = (backoff * 2).clamp(Duration::from_millis(10), MAX_BACKOFF);
                    agent.drops.note("accept failures", format_args!("accept failed ({e}): waiting {backoff:?}"));
                    // Frees a descriptor for the next peer, who may be the collector.
                    if out_of_fds && agent.admission.borrow_mut().evict_any_idle() {
                        agent.drops.note(
                            "unauthenticated connections closed early",
                            "closed the oldest connection that had not authenticated, to free a descriptor",
                        );
                    }
                    tokio::select! {
                        _ = &mut shutdown => break,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                }
            },
        }
    }
    stop_trace(&agent, EndReason::Terminated);
    // Let the recording detach and finish.
    while agent.slot.borrow().as_ref().is_some_and(|s| s.end.is_none()) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Starts serving a new connection, within the bounds on unauthenticated ones.
fn admit(agent: &Rc<Agent>, stream: Box<dyn Transport>, peer: Peer, verdict: Result<(), Refused>) {
    if let Err(reason) = verdict {
        agent.drops.note("peers refused", format_args!("refused {}: {reason}", peer.name));
        agent.refuse(stream, reason.to_string());
        return;
    }
    let id = agent.next_conn.get();
    agent.next_conn.set(id + 1);
    let (evict, evicted) = oneshot::channel();
    let admitted = agent.admission.borrow_mut().admit(id, peer.source, evict);
    if let Err(reason) = admitted {
        agent.drops.note("connections refused at admission", format_args!("refused {}: {reason}", peer.name));
        agent.refuse(stream, reason.to_string());
        return;
    }
    tokio::task::spawn_local(connection(agent.clone(), id, stream, peer, evicted));
}

fn stop_trace(agent: &Agent, reason: EndReason) {
    if let Some(stop) = agent.slot.borrow_mut().as_mut().and_then(|s| s.stop.take()) {
        let _ = stop.send(reason);
    }
}

/// Stops a trace nobody collects, forgets a finished one nobody will collect, and reaps
/// commands that outlived their trace.
async fn watchdog(agent: Rc<Agent>) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        agent.launched.borrow_mut().retain(|&pid| try_reap(pid).is_none());
        let (running, forget) = match agent.slot.borrow().as_ref() {
            Some(s) if s.heard.get().elapsed() >= agent.opts.orphan_timeout => {
                (s.end.is_none(), s.end.is_some() && s.owner.is_none())
            }
            _ => (false, false),
        };
        if running {
            tracing::info!(
                target: LOG,
                "no word from the collector for {:?}: stopping the trace and detaching",
                agent.opts.orphan_timeout
            );
            stop_trace(&agent, EndReason::Terminated);
        } else if forget {
            *agent.slot.borrow_mut() = None;
        }
    }
}

/// How a handshake ended without a session.
enum NoSession {
    /// Closed to make room for a newer connection before it said hello (and told so, unless
    /// it was still in its TLS handshake).
    Evicted,
    Failed(String),
}

/// The handshake: TLS and the hello, during which a newer connection may take this one's place
/// ([`admission`]), then the rest, during which none may.
async fn handshake(
    agent: &Agent,
    id: u64,
    stream: Box<dyn Transport>,
    evicted: &mut oneshot::Receiver<Refused>,
) -> Result<Session, NoSession> {
    let failed = |e: &(dyn std::error::Error + 'static)| NoSession::Failed(report(e));
    let mut stream = tokio::select! {
        stream = tls::accept(agent.opts.tls.as_ref(), stream) => stream.map_err(|e| failed(&e))?,
        // Inside TLS nothing can be said in the clear.
        _ = &mut *evicted => return Err(NoSession::Evicted),
    };
    let hello = tokio::select! {
        hello = session::read_hello(&mut stream) => hello.map_err(|e| failed(&e))?,
        reason = &mut *evicted => {
            session::refuse(&mut stream, &reason.unwrap_or(Refused::Evicted).to_string()).await;
            return Err(NoSession::Evicted);
        }
    };
    agent.admission.borrow_mut().started(id);
    session::server_after_hello(stream, hello, agent.opts.secret.as_ref(), &agent.opts.host)
        .await
        .map_err(|e| failed(&e))
}

/// One connection: the handshake within its deadline, then the session.
async fn connection(
    agent: Rc<Agent>,
    id: u64,
    stream: Box<dyn Transport>,
    peer: Peer,
    mut evicted: oneshot::Receiver<Refused>,
) {
    let result = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&agent, id, stream, &mut evicted)).await;
    agent.admission.borrow_mut().done(id);
    let mut session = match result {
        Err(_) => {
            let detail = format_args!("closed {}: no handshake within {HANDSHAKE_TIMEOUT:?}", peer.name);
            agent.drops.note("handshakes timed out", detail);
            return;
        }
        Ok(Err(NoSession::Evicted)) => {
            let detail = format_args!(
                "closed the oldest connection that had not authenticated ({}): a newer one took its place (at most {} per uid or address, {MAX_UNAUTHENTICATED} in all, wait to authenticate)",
                peer.name,
                admission::MAX_PER_SOURCE
            );
            agent.drops.note("unauthenticated connections closed early", detail);
            return;
        }
        Ok(Err(NoSession::Failed(reason))) => {
            agent.drops.note("handshakes failed", format_args!("refused {}: {reason}", peer.name));
            return;
        }
        Ok(Ok(session)) => session,
    };
    if agent.collectors.get() >= MAX_COLLECTORS {
        let reason = format!("{MAX_COLLECTORS} collectors are connected already");
        agent.drops.note("collectors refused", format_args!("refused {}: {reason}", peer.name));
        // Told, encrypted (the collector has proved itself), before the connection closes.
        session.writer.refuse(&reason).await;
        session.reader.drain().await;
        return;
    }
    tracing::info!(target: LOG, "collector {} connected", peer.name);
    agent.collectors.set(agent.collectors.get() + 1);
    // Boxed: its state is large, and every connection's task holds this future from `accept`
    // on, so a flood of connections that never authenticate would pay for it (about 3 MB for the
    // 1,000 of security.rs's flood test).
    let reason = Box::pin(serve_session(&agent, id, session, peer.creds.clone())).await;
    agent.collectors.set(agent.collectors.get() - 1);
    tracing::info!(target: LOG, "collector {} disconnected: {reason}", peer.name);
}

/// What this connection has sent of the trace it streams.
#[derive(Default)]
struct Streaming {
    /// The next sequence number to send, once this connection streams the trace.
    cursor: Option<u64>,
    sent_end: bool,
    /// Entries of the trace's string table this connection has sent.
    strings_sent: usize,
}

enum Wake {
    Frame(Option<Result<Message, FrameError>>),
    Changed,
}

/// Exchanges messages with an authenticated collector until the connection ends; returns why.
async fn serve_session(agent: &Rc<Agent>, id: u64, session: Session, creds: Option<PeerCreds>) -> String {
    let Session { reader, mut writer, transcript, resume_key, .. } = session;
    let conn = Conn { id, heard: Rc::new(Cell::new(Instant::now())), transcript, resume_key, creds };
    // Frames are read by a task of their own: a read cut short by `select!` would lose bytes. Only
    // frames from the collector count as hearing from it.
    let (tx, mut incoming) = mpsc::channel(64);
    let heard = conn.heard.clone();
    let reading = tokio::task::spawn_local(reader.forward(tx, move || heard.set(Instant::now())));
    let mut changed = agent.changed.subscribe();
    let mut streaming = Streaming::default();
    let reason = loop {
        let silent_until = tokio::time::Instant::from_std(conn.heard.get() + SILENCE);
        let wake = tokio::select! {
            message = incoming.recv() => Wake::Frame(message),
            _ = changed.changed() => Wake::Changed,
            _ = tokio::time::sleep_until(silent_until) => break format!("silent for {SILENCE:?}"),
        };
        match wake {
            Wake::Frame(None) => break "connection closed".to_string(),
            Wake::Frame(Some(Err(e))) => break report(&e),
            // Planning may take seconds: awaited here, it keeps this connection waiting for its
            // answer, and nothing else.
            Wake::Frame(Some(Ok(Message::Start { trace_id, request }))) => {
                let reply = match start_trace(agent, &conn, trace_id, *request).await {
                    Ok(start) => {
                        streaming = Streaming { cursor: Some(0), ..Default::default() };
                        let exports_otlp = agent.opts.otlp.is_some();
                        Message::Started { trace_id, trace_start: start, exports_otlp }
                    }
                    Err(error) => Message::Failed { trace_id, error: report(&error) },
                };
                if let Err(e) = writer.send(&reply).await {
                    break report(&e);
                }
            }
            Wake::Frame(Some(Ok(m))) => match handle(agent, &conn, m, &mut streaming) {
                Ok(Some(reply)) => {
                    if let Err(e) = writer.send(&reply).await {
                        break report(&e);
                    }
                }
                Ok(None) => {}
                Err(reason) => break reason,
            },
            Wake::Changed => {}
        }
        if let Err(e) = send_pending(agent, &conn, &mut writer, &mut streaming).await {
            break report(&e);
        }
    };
    reading.abort();
    if let Some(s) = agent.slot.borrow_mut().as_mut()
        && s.owner == Some(conn.id)
    {
        s.owner = None;
    }
    reason
}

/// Answers one message from the collector (but `Start`: [`start_trace`]).
fn handle(
    agent: &Rc<Agent>,
    conn: &Conn,
    message: Message,
    streaming: &mut Streaming,
) -> Result<Option<Message>, String> {
    let owns = |s: &TraceSlot, trace_id: u64| s.id == trace_id && s.owner == Some(conn.id);
    Ok(match message {
        Message::ClockProbe { id } => Some(Message::ClockEcho { id, agent_ns: agent.now_ns() }),
        Message::Stop { trace_id } => {
            if agent.slot.borrow().as_ref().is_some_and(|s| owns(s, trace_id)) {
                stop_trace(agent, EndReason::Stopped);
                None
            } else {
                Some(Message::Failed { trace_id, error: format!("trace {trace_id} is not this connection's") })
            }
        }
        Message::Resume { trace_id, next_seq, proof } => {
            let mut slot = agent.slot.borrow_mut();
            match slot.as_mut() {
                Some(s)
                    if s.id == trace_id && auth::verify_resume(&s.resume_key, &conn.transcript, trace_id, &proof) =>
                {
                    // The same collector, back: this connection takes the trace over.
                    s.owner = Some(conn.id);
                    s.heard = conn.heard.clone();
                    s.outbox.ack(next_seq);
                    *streaming = Streaming { cursor: Some(next_seq), ..Default::default() };
                    // Again, in case the first one was lost with the connection.
                    Some(Message::Started {
                        trace_id,
                        trace_start: s.start.clone(),
                        exports_otlp: agent.opts.otlp.is_some(),
                    })
                }
                _ => Some(Message::Failed {
                    trace_id,
                    error: format!("this agent has no trace {trace_id} that this collector can resume"),
                }),
            }
        }
        Message::Ack { next_seq } => {
            if let Some(s) = agent.slot.borrow_mut().as_mut()
                && s.owner == Some(conn.id)
            {
                s.outbox.ack(next_seq);
            }
            None
        }
        other => return Err(format!("unexpected {}", message_name(&other))),
    })
}

fn message_name(m: &Message) -> &'static str {
    match m {
        Message::Hello { .. } => "hello",
        Message::Terms { .. } => "terms",
        Message::Noise { .. } => "handshake message",
        Message::Welcome { .. } => "welcome",
        Message::Refused { .. } => "refusal",
        Message::ClockProbe { .. } => "clock probe",
        Message::ClockEcho { .. } => "clock echo",
        Message::Start { .. } => "start",
        Message::Started { .. } => "started",
        Message::Failed { .. } => "failure",
        Message::Events(_) => "events",
        Message::Gap { .. } => "gap",
        Message::Ack { .. } => "ack",
        Message::Stop { .. } => "stop",
        Message::Ended { .. } => "end",
        Message::Resume { .. } => "resume",
        Message::CommandOutput { .. } => "command output",
    }
}

/// Sends what the collector does not have yet: a gap, events, and the end; only to the
/// connection that owns the trace.
async fn send_pending<W: tokio::io::AsyncWrite + Unpin>(
    agent: &Agent,
    conn: &Conn,
    writer: &mut SessionWriter<W>,
    streaming: &mut Streaming,
) -> Result<(), FrameError> {
    let Some(mut from) = streaming.cursor else { return Ok(()) };
    // Events pushed from now on wake this connection again.
    agent.wake_pending.set(false);
    loop {
        let (frames, done) = {
            let slot = agent.slot.borrow();
            let Some(slot) = slot.as_ref().filter(|s| s.owner == Some(conn.id)) else {
                // Taken over by a reconnection of the same collector.
                streaming.cursor = None;
                return Ok(());
            };
            let pending = slot.outbox.pending(from);
            let mut frames = Vec::new();
            // The command's output, in the order it was read; before the trace's end.
            if let Some(output) = &slot.output {
                let mut output = output.borrow_mut();
                frames.extend(std::iter::from_fn(|| output.pop()));
            }
            let output_done = slot.output.as_ref().is_none_or(|o| o.borrow().finished());
            if let Some((first_seq, count)) = pending.gap {
                frames.push(Message::Gap { first_seq, count });
            }
            // A resumed connection gets the whole string table first: in frames of at most a
            // chunk's worth of text, and of no more strings than a collector takes in one.
            let mut sent = streaming.strings_sent;
            while pending.strings.len() > sent {
                let (mut end, mut text) = (sent, 0);
                while end < pending.strings.len()
                    && (end == sent || (text < outbox::CHUNK_BYTES && end - sent < wire::MAX_STRINGS_PER_BATCH))
                {
                    text += pending.strings[end].len();
                    end += 1;
                }
                let events = if end == pending.strings.len() { pending.events } else { &[] };
                frames.push(Message::Events(wire::batch(pending.first_seq, &pending.strings[..end], sent, events)));
                sent = end;
            }
            if !pending.events.is_empty() && sent == streaming.strings_sent {
                frames.push(Message::Events(wire::batch(pending.first_seq, &[], 0, pending.events)));
            }
            streaming.strings_sent = sent;
            let n = pending.count;
            from = pending.first_seq + n;
            let all_sent = from == slot.outbox.next_seq();
            let mut done = n == 0;
            if all_sent
                && output_done
                && !streaming.sent_end
                && let Some((end, total)) = &slot.end
            {
                frames.push(Message::Ended { trace_id: slot.id, trace_end: end.clone(), total_events: *total });
                streaming.sent_end = true;
                done = true;
            }
            (frames, done)
        };
        for frame in &frames {
            writer.send(frame).await?;
        }
        streaming.cursor = Some(from);
        if done {
            return Ok(());
        }
    }
}

/// The recording's sink: numbers events into the outbox, and hands them to the OTLP exporter
/// when the agent has one.
struct OutboxSink {
    agent: Rc<Agent>,
    otlp: Option<crate::export::otlp::OtlpSink>,
    /// The launched command's output, whose stream to the collector ends with the trace.
    relay: Option<Rc<command_output::Relay>>,
}

impl Sink for OutboxSink {
    fn begin(&mut self, start: &TraceStart) -> std::io::Result<()> {
        if let Some(otlp) = &mut self.otlp {
            let mut start = start.clone();
            start.ts = self.agent.skew(start.ts);
            otlp.begin(&start)?;
        }
        Ok(())
    }

    fn event(&mut self, event: &Event) -> std::io::Result<()> {
        let ts = self.agent.skew(event.ts);
        // The exporter sees what the collector gets (skewed, in tests): its ids are made of it.
        if let Some(otlp) = &mut self.otlp {
            if ts == event.ts {
                otlp.event(event)?;
            } else {
                let mut skewed = event.clone();
                skewed.ts = ts;
                otlp.event(&skewed)?;
            }
        }
        if let Some(slot) = self.agent.slot.borrow_mut().as_mut() {
            slot.outbox.push(event, ts);
        }
        if !self.agent.wake_pending.replace(true) {
            self.agent.bump();
        }
        Ok(())
    }

    /// The collector links flows, across hosts; the agent does only for its own OTLP exporter,
    /// which shows this host's links.
    fn wants_flow_links(&self) -> bool {
        self.otlp.is_some()
    }

    fn end(&mut self, end: &TraceEnd) -> std::io::Result<()> {
        if let Some(mut otlp) = self.otlp.take() {
            // Sending what is queued may take a while (at most the exporter's drain deadline): not
            // on the agent's one thread.
            let mut end = end.clone();
            end.ts = self.agent.skew(end.ts);
            drop(tokio::task::spawn_blocking(move || otlp.end(&end)));
        }
        // The command's last words, before the end: the collector prints them before it stops.
        if let Some(relay) = self.relay.take() {
            relay.finish_stream();
        }
        let mut end = end.clone();
        end.ts = self.agent.skew(end.ts);
        if let Some(slot) = self.agent.slot.borrow_mut().as_mut() {
            slot.end = Some((end, slot.outbox.next_seq()));
            let peak = slot.outbox.peak();
            tracing::info!(
                target: LOG,
                "trace {}: the outbox held at most {} events ({:.1} MiB encoded) waiting for the collector (bounds: --buffer-events {}, --buffer-bytes {:.1} MiB)",
                slot.id,
                peak.events,
                peak.bytes as f64 / (1 << 20) as f64,
                self.agent.opts.max_buffered,
                self.agent.opts.max_buffered_bytes as f64 / (1 << 20) as f64
            );
            if peak.dropped_at_max_events + peak.dropped_at_max_bytes > 0 {
                tracing::warn!(
                    target: LOG,
                    "trace {}: the outbox dropped {} events at --buffer-events and {} at --buffer-bytes before the collector received them: a larger --buffer-events helps with the first, a larger --buffer-bytes with the second, a collector that keeps up (or is closer) with both",
                    slot.id,
                    peak.dropped_at_max_events,
                    peak.dropped_at_max_bytes
                );
            }
        }
        self.agent.bump();
        Ok(())
    }
}

/// Who a command launched for `conn` runs as: a socket-group member as itself, never as root;
/// root (through the socket or a network peer with the secret) as root.
fn command_user(conn: &Conn) -> RunAs {
    match &conn.creds {
        Some(c) => RunAs { uid: c.uid, gid: c.gid, groups: c.groups.clone() },
        None => RunAs { uid: 0, gid: 0, groups: Vec::new() },
    }
}

/// Why an agent does not start the trace a collector asks for: what the collector is told.
#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error(transparent)]
    Limits(#[from] request_limits::RequestError),
    #[error("a trace is being started on this agent")]
    Starting,
    #[error("a trace is already running on this agent")]
    Running,
    #[error("the previous trace has not been collected yet (it waits for its collector)")]
    NotCollected,
    #[error("this agent does not launch commands: start it with --allow-commands")]
    NoCommands,
    /// An event kind the agent does not know (the sentence names it).
    #[error("{0}")]
    EventKind(String),
    #[error(transparent)]
    Output(#[from] command_output::CommandOutputError),
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("cannot start planning")]
    PlanThread(#[source] std::io::Error),
    #[error("planning stopped before it finished")]
    PlanLost,
}

/// `start`: how the request's command (if any) starts.
fn options(agent: &Agent, request: TraceRequest, start: Start) -> Result<RecordOptions, StartError> {
    let mut events = BTreeSet::new();
    for name in &request.events {
        events.extend(EventKind::parse_list_item(name).map_err(StartError::EventKind)?);
    }
    let defaults = RecordOptions::default();
    Ok(RecordOptions {
        pids: request.pids,
        binaries: request.binaries.into_iter().map(PathBuf::from).collect(),
        command: request.command.into_iter().map(OsString::from).collect(),
        functions: request.functions,
        usdt: request.usdt,
        // Parsed here as `record` parses its options; resolved by planning against this
        // host's executables.
        breaks: request
            .breaks
            .iter()
            .map(|b| BreakSpec::parse(b))
            .collect::<Result<_, _>>()
            .map_err(RecordError::from)?,
        watches: request
            .watches
            .iter()
            .map(|w| WatchSpec::parse(w))
            .collect::<Result<_, _>>()
            .map_err(RecordError::from)?,
        events: if events.is_empty() { defaults.events.clone() } else { events },
        follow_children: request.follow_children,
        duration: None,
        buffer_size: (request.buffer_size != 0).then_some(request.buffer_size),
        max_probes: if request.max_probes == 0 { defaults.max_probes } else { request.max_probes as usize },
        string_size: request.string_size,
        capture_bytes: request.capture_bytes,
        host: agent.opts.host.clone(),
        start,
        // The agent has no stderr a requester reads.
        debug_kernel: false,
        // The best the kernel has.
        attach: None,
        return_probes: None,
        no_sleepable: false,
        min_duration_ns: 0,
        keep_children: false,
        start_at: request.start_at,
        stop_at: request.stop_at,
        depth: (request.depth != 0).then_some(request.depth),
    })
}

/// Marks the agent as starting a trace until dropped (the start finished, failed, or its
/// connection went away mid-plan): one start at a time, since the slot is filled only at the end.
struct Starting<'a>(&'a Agent);

impl<'a> Starting<'a> {
    fn mark(agent: &'a Agent) -> Starting<'a> {
        agent.starting.set(true);
        Starting(agent)
    }
}

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        self.0.starting.set(false);
    }
}

/// Resolves targets, symbols and patterns on a thread of its own: that can take seconds (large
/// executables, many patterns), during which the agent's one thread keeps answering other
/// collectors, clock probes and SIGTERM. A plain thread, not tokio's blocking pool: an agent told
/// to stop exits without waiting for a plan nobody will use (planning attaches and launches
/// nothing).
async fn plan_apart(options: RecordOptions) -> Result<Plan, StartError> {
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("tracer-plan".to_string())
        .spawn(move || {
            let plan = plan::check_root().and_then(|()| plan::plan(options));
            let _ = tx.send(plan.map_err(StartError::from));
        })
        .map_err(StartError::PlanThread)?;
    rx.await.unwrap_or(Err(StartError::PlanLost))
}

/// Starts recording for `conn`, which then owns the trace; returns the trace's first line (JSON).
async fn start_trace(
    agent: &Rc<Agent>,
    conn: &Conn,
    trace_id: u64,
    request: TraceRequest,
) -> Result<Box<TraceStart>, StartError> {
    request_limits::check(&request)?;
    if agent.starting.get() {
        return Err(StartError::Starting);
    }
    if let Some(s) = agent.slot.borrow().as_ref() {
        if s.end.is_none() {
            return Err(StartError::Running);
        }
        if s.owner.is_some_and(|o| o != conn.id) || (s.owner.is_none() && !s.outbox.is_empty()) {
            return Err(StartError::NotCollected);
        }
    }
    if !request.command.is_empty() && !agent.opts.allow_commands {
        return Err(StartError::NoCommands);
    }
    // The collector's key for this host's ids, so that it can link to them (all zero: none).
    let ids = match request.otlp_key {
        key if key == [0; 16] => crate::export::otlp::IdKey::random(),
        key => crate::export::otlp::IdKey::Host(key),
    };
    // A command starts detached from the agent, in the directory the request names; its output
    // goes to the collector and to a file of its user's.
    let (start, output) = if request.command.is_empty() {
        (Start::Inherit, None)
    } else {
        let user = command_user(conn);
        let output = command_output::create(&agent.opts.command_output_dir, user.uid, user.gid, trace_id)?;
        let mut detached = Detached::new(user);
        if let Some(cwd) = &request.cwd {
            detached.cwd = PathBuf::from(cwd);
        }
        (Start::Detached(detached), Some(output))
    };
    let _starting = Starting::mark(agent);
    let started = match options(agent, request, start) {
        Ok(options) => plan_apart(options).await.and_then(|plan| {
            for w in &plan.warnings {
                tracing::warn!(target: LOG, "warning: {w}");
            }
            Recording::start(plan).map_err(StartError::from)
        }),
        Err(e) => Err(e),
    };
    let mut recording = match (started, &output) {
        (Ok(recording), _) => recording,
        (Err(e), Some((path, _))) => {
            // Nothing was launched: no file to leave behind.
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
        (Err(e), None) => return Err(e),
    };
    let queue = output.as_ref().map(|_| Rc::new(RefCell::new(command_output::OutputQueue::default())));
    let relay = match (output, recording.take_command_output(), &queue) {
        (Some((path, file)), Some(pipes), Some(queue)) => {
            tracing::info!(
                target: LOG,
                "trace {trace_id}: the command's output goes to its collector and to {}",
                path.display()
            );
            let wake = agent.clone();
            match command_output::Relay::new(pipes, file, path, queue.clone(), Box::new(move || wake.bump())) {
                Ok(relay) => {
                    tokio::task::spawn_local(relay.clone().run());
                    Some(relay)
                }
                Err(e) => {
                    // The command runs (it is released): traced, its output lost, and said so.
                    tracing::warn!(target: LOG, "trace {trace_id}: cannot read the command's output, it is lost: {e}");
                    queue.borrow_mut().close();
                    None
                }
            }
        }
        _ => None,
    };
    for w in &recording.warnings {
        tracing::warn!(target: LOG, "warning: {w}");
    }
    let mut start = recording.trace_start().clone();
    start.ts = agent.skew(start.ts);
    let (stop, stopped) = oneshot::channel();
    *agent.slot.borrow_mut() = Some(TraceSlot {
        id: trace_id,
        outbox: Outbox::new(agent.opts.max_buffered, agent.opts.max_buffered_bytes),
        start: Box::new(start.clone()),
        end: None,
        stop: Some(stop),
        owner: Some(conn.id),
        heard: conn.heard.clone(),
        resume_key: conn.resume_key,
        output: queue,
    });
    tracing::info!(target: LOG, "trace {trace_id} started: {} probes", start.probes);
    let agent = agent.clone();
    tokio::task::spawn_local(async move {
        let config = agent.opts.otlp.clone().map(|c| crate::export::otlp::OtlpConfig { ids, ..c });
        let otlp = config.and_then(|config| match crate::export::otlp::OtlpSink::new(config) {
            Ok(sink) => Some(sink),
            Err(e) => {
                tracing::warn!(target: LOG, "warning: no OTLP export: {e}");
                None
            }
        });
        let mut sink = OutboxSink { agent: agent.clone(), otlp, relay };
        let stop = async { stopped.await.unwrap_or(EndReason::Stopped) };
        match recording.run(&mut sink, stop).await {
            Ok(outcome) => {
                tracing::info!(target: LOG, "trace {trace_id} ended ({})", outcome.end.reason);
                if let Some(pid) = outcome.command_still_running {
                    tracing::info!(target: LOG, "the command (pid {pid}) is still running, untraced");
                    agent.launched.borrow_mut().push(pid);
                }
            }
            Err(e) => {
                tracing::warn!(target: LOG, "trace {trace_id} failed: {}", report(&e));
                // The collector still gets an end, so that it stops waiting.
                let _ = sink.end(&TraceEnd::new(agent.clock.now_unix_ns(), EndReason::Terminated, 0));
            }
        }
        return_freed_heap();
    });
    Ok(Box::new(start))
}

/// Gives the pages of the heap that the finished trace freed (its symbol tables and DWARF, its
/// programs' loader) back to the system. glibc keeps freed memory of an arena for reuse, and an
/// idle agent would stay at its largest trace's size; what waits in the outbox stays.
fn return_freed_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks glibc's own arenas; no pointer of ours is involved.
    unsafe {
        libc::malloc_trim(0);
    }
}
