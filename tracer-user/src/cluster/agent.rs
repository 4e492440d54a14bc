//! `tracer agent`: waits for a collector, records what it asks for, streams the events.
//!
//! One trace at a time. Its events are numbered and kept in an [`Outbox`] until the collector
//! acknowledges them, so a collector that loses the connection reconnects and resumes without
//! duplicates or holes. Without any collector for `orphan_timeout`, the trace is stopped and its
//! probes detached: targets are never left probed by a collector that went away.
//!
//! Runs on one thread (`serve` must be polled inside a `tokio::task::LocalSet`): connections,
//! the recording and the watchdog share the agent's state without locks.

use std::{
    cell::{Cell, RefCell},
    collections::BTreeSet,
    ffi::OsString,
    future::Future,
    net::SocketAddr,
    path::PathBuf,
    rc::Rc,
    time::{Duration, Instant},
};

use tokio::{
    net::TcpListener,
    sync::{mpsc, oneshot, watch},
};
use tokio_rustls::TlsAcceptor;

use super::{
    auth::{self, Secret},
    outbox::Outbox,
    protocol::{Message, PROTOCOL_VERSION, TraceRequest, read_message, write_message},
    tls,
    wire::Encoder,
};
use crate::{
    clock::BootClock,
    event::{EndReason, Event, EventKind, TraceEnd, TraceStart},
    record::{self, RecordOptions},
    sink::Sink,
};

/// Events sent in one frame.
const BATCH: usize = 4096;
/// A collector that says nothing for this long (it probes the clock every second) is gone.
const SILENCE: Duration = Duration::from_secs(10);

pub struct AgentOptions {
    pub listen: SocketAddr,
    pub secret: Option<Secret>,
    pub tls: Option<TlsAcceptor>,
    /// The name events carry.
    pub host: String,
    /// For tests on one machine: pretend this host's clock is ahead by this much (events, trace
    /// lines and clock answers all shift).
    pub test_clock_skew_ns: i64,
    /// Stop a trace that has had no collector for this long.
    pub orphan_timeout: Duration,
    /// Events kept for a collector that is not connected; older ones are dropped and counted.
    pub max_buffered: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(
        "refusing to listen on {0} without authentication: give a --secret-file (only loopback addresses may go without)"
    )]
    Unauthenticated(SocketAddr),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
}

struct TraceSlot {
    id: u64,
    outbox: Outbox,
    start_json: String,
    /// The trace's last line and event count, once it is over.
    end: Option<(String, u64)>,
    stop: Option<oneshot::Sender<EndReason>>,
}

struct Agent {
    opts: AgentOptions,
    slot: RefCell<Option<TraceSlot>>,
    /// Bumped whenever there is something new to send.
    changed: watch::Sender<u64>,
    connections: Cell<u32>,
    last_collector: Cell<Instant>,
    clock: BootClock,
}

fn log(message: impl std::fmt::Display) {
    eprintln!("tracer agent: {message}");
}

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
}

/// Serves collectors until `shutdown` resolves; a running trace is then stopped and detached.
pub async fn serve(opts: AgentOptions, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
    if opts.secret.is_none() && !opts.listen.ip().is_loopback() {
        return Err(AgentError::Unauthenticated(opts.listen));
    }
    let listener =
        TcpListener::bind(opts.listen).await.map_err(|source| AgentError::Bind { addr: opts.listen, source })?;
    let local = listener.local_addr().map_err(|source| AgentError::Bind { addr: opts.listen, source })?;
    log(format_args!(
        "listening on {local} as {}{}{}",
        opts.host,
        if opts.secret.is_some() { ", authentication on" } else { "" },
        if opts.tls.is_some() { ", TLS" } else { "" }
    ));
    let agent = Rc::new(Agent {
        opts,
        slot: RefCell::new(None),
        changed: watch::channel(0).0,
        connections: Cell::new(0),
        last_collector: Cell::new(Instant::now()),
        clock: BootClock::calibrate(),
    });
    tokio::task::spawn_local(watchdog(agent.clone()));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    let agent = agent.clone();
                    tokio::task::spawn_local(async move {
                        let _ = tcp.set_nodelay(true);
                        match tls::accept(agent.opts.tls.as_ref(), tcp).await {
                            Ok(stream) => serve_collector(agent, stream, peer).await,
                            Err(e) => log(format_args!("closed the connection from {peer}: {e}")),
                        }
                    });
                }
                Err(e) => log(format_args!("accept failed: {e}")),
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

fn stop_trace(agent: &Agent, reason: EndReason) {
    if let Some(stop) = agent.slot.borrow_mut().as_mut().and_then(|s| s.stop.take()) {
        let _ = stop.send(reason);
    }
}

/// Stops a trace nobody collects, and forgets a finished one nobody will collect.
async fn watchdog(agent: Rc<Agent>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        if agent.connections.get() > 0 || agent.last_collector.get().elapsed() < agent.opts.orphan_timeout {
            continue;
        }
        let ended = agent.slot.borrow().as_ref().map(|s| s.end.is_some());
        match ended {
            Some(false) => {
                log(format_args!("no collector for {:?}: stopping the trace and detaching", agent.opts.orphan_timeout));
                stop_trace(&agent, EndReason::Terminated);
            }
            Some(true) => *agent.slot.borrow_mut() = None,
            None => {}
        }
    }
}

/// Proves who we are and checks who the collector is.
async fn handshake(agent: &Agent, stream: &mut Box<dyn tls::Transport>) -> Result<(), String> {
    let Message::Hello { version, nonce: theirs } = read_message(stream).await.map_err(|e| e.to_string())? else {
        return Err("it did not start with a hello".to_string());
    };
    if version != PROTOCOL_VERSION {
        let reason = format!("protocol version {version} is not {PROTOCOL_VERSION}");
        let _ = write_message(stream, &Message::Refused { reason: reason.clone() }).await;
        return Err(reason);
    }
    let ours = auth::nonce();
    let proof = agent.opts.secret.as_ref().map(|s| s.prove(auth::AGENT, &theirs, &ours));
    let challenge = Message::Challenge { version, proof, nonce: ours, host: agent.opts.host.clone() };
    write_message(stream, &challenge).await.map_err(|e| e.to_string())?;
    let proof = match read_message(stream).await.map_err(|e| e.to_string())? {
        Message::Answer { proof } => proof,
        Message::Refused { reason } => return Err(format!("the collector refused: {reason}")),
        _ => return Err("it did not answer the challenge".to_string()),
    };
    if let Some(secret) = &agent.opts.secret {
        let good = proof.is_some_and(|p| secret.verify(auth::COLLECTOR, &ours, &theirs, &p));
        if !good {
            let reason = "authentication failed: wrong or missing secret".to_string();
            let _ = write_message(stream, &Message::Refused { reason: reason.clone() }).await;
            return Err(reason);
        }
    }
    write_message(stream, &Message::Welcome).await.map_err(|e| e.to_string())
}

async fn serve_collector(agent: Rc<Agent>, mut stream: Box<dyn tls::Transport>, peer: SocketAddr) {
    if let Err(reason) = handshake(&agent, &mut stream).await {
        log(format_args!("refused {peer}: {reason}"));
        return;
    }
    log(format_args!("collector {peer} connected"));
    agent.connections.set(agent.connections.get() + 1);
    let reason = session(&agent, stream).await;
    agent.connections.set(agent.connections.get() - 1);
    agent.last_collector.set(Instant::now());
    log(format_args!("collector {peer} disconnected: {reason}"));
}

/// Exchanges messages with an authenticated collector until the connection ends; returns why.
async fn session(agent: &Rc<Agent>, stream: Box<dyn tls::Transport>) -> String {
    let (mut reader, mut writer) = tokio::io::split(stream);
    // Frames are read by a task of their own: a read cut short by `select!` would lose bytes.
    let (tx, mut incoming) = mpsc::channel(64);
    let reading = tokio::task::spawn_local(async move {
        loop {
            let message = read_message(&mut reader).await;
            let failed = message.is_err();
            if tx.send(message).await.is_err() || failed {
                return;
            }
        }
    });
    let mut changed = agent.changed.subscribe();
    let mut encoder = Encoder::default();
    // The next sequence number to send on this connection, once a trace is being streamed here.
    let mut cursor: Option<u64> = None;
    let mut sent_end = false;
    let reason = loop {
        let message = tokio::select! {
            message = incoming.recv() => message,
            _ = changed.changed() => None,
            _ = tokio::time::sleep(SILENCE) => break format!("silent for {SILENCE:?}"),
        };
        agent.last_collector.set(Instant::now());
        match message {
            None if incoming.is_closed() => break "connection closed".to_string(),
            None => {}
            Some(Err(e)) => break e.to_string(),
            Some(Ok(m)) => match handle(agent, m, &mut cursor, &mut sent_end, &mut encoder) {
                Ok(Some(reply)) => {
                    if let Err(e) = write_message(&mut writer, &reply).await {
                        break e.to_string();
                    }
                }
                Ok(None) => {}
                Err(reason) => break reason,
            },
        }
        if let Err(e) = send_pending(agent, &mut writer, &mut cursor, &mut sent_end, &mut encoder).await {
            break e.to_string();
        }
    };
    reading.abort();
    reason
}

/// Answers one message from the collector.
fn handle(
    agent: &Rc<Agent>,
    message: Message,
    cursor: &mut Option<u64>,
    sent_end: &mut bool,
    encoder: &mut Encoder,
) -> Result<Option<Message>, String> {
    Ok(match message {
        Message::ClockProbe { id } => Some(Message::ClockEcho { id, agent_ns: agent.now_ns() }),
        Message::Start { trace_id, request } => match start_trace(agent, trace_id, request) {
            Ok(start_json) => {
                *cursor = Some(0);
                *sent_end = false;
                encoder.reset();
                Some(Message::Started { trace_id, trace_start: start_json })
            }
            Err(error) => Some(Message::Failed { trace_id, error }),
        },
        Message::Stop { trace_id } => {
            if agent.slot.borrow().as_ref().is_some_and(|s| s.id == trace_id) {
                stop_trace(agent, EndReason::Stopped);
            }
            None
        }
        Message::Resume { trace_id, next_seq } => {
            let slot = agent.slot.borrow();
            match slot.as_ref() {
                Some(s) if s.id == trace_id => {
                    *cursor = Some(next_seq);
                    *sent_end = false;
                    encoder.reset();
                    // Again, in case the first one was lost with the connection.
                    Some(Message::Started { trace_id, trace_start: s.start_json.clone() })
                }
                _ => Some(Message::Failed { trace_id, error: "this agent has no such trace any more".to_string() }),
            }
        }
        Message::Ack { next_seq } => {
            if let Some(s) = agent.slot.borrow_mut().as_mut() {
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
        Message::Challenge { .. } => "challenge",
        Message::Answer { .. } => "answer",
        Message::Welcome => "welcome",
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
    }
}

/// Sends what the collector does not have yet: a gap, events, and the end.
async fn send_pending<W: tokio::io::AsyncWrite + Unpin>(
    agent: &Agent,
    writer: &mut W,
    cursor: &mut Option<u64>,
    sent_end: &mut bool,
    encoder: &mut Encoder,
) -> Result<(), super::protocol::FrameError> {
    let Some(mut from) = *cursor else { return Ok(()) };
    loop {
        let (frames, done) = {
            let slot = agent.slot.borrow();
            let Some(slot) = slot.as_ref() else { return Ok(()) };
            let pending = slot.outbox.pending(from, BATCH);
            let mut frames = Vec::new();
            if let Some((first_seq, count)) = pending.gap {
                frames.push(Message::Gap { first_seq, count });
            }
            let n = pending.events.len() as u64;
            if n > 0 {
                frames.push(Message::Events(encoder.batch(pending.first_seq, pending.events)));
            }
            from = pending.first_seq + n;
            let all_sent = from == slot.outbox.next_seq();
            let mut done = n == 0;
            if all_sent
                && !*sent_end
                && let Some((end, total)) = &slot.end
            {
                frames.push(Message::Ended { trace_id: slot.id, trace_end: end.clone(), total_events: *total });
                *sent_end = true;
                done = true;
            }
            (frames, done)
        };
        for frame in &frames {
            write_message(writer, frame).await?;
        }
        *cursor = Some(from);
        if done {
            return Ok(());
        }
    }
}

/// The recording's sink: numbers events into the outbox.
struct OutboxSink {
    agent: Rc<Agent>,
}

impl Sink for OutboxSink {
    fn begin(&mut self, _: &TraceStart) -> std::io::Result<()> {
        Ok(())
    }

    fn event(&mut self, event: &Event) -> std::io::Result<()> {
        let mut event = event.clone();
        event.ts = self.agent.skew(event.ts);
        if let Some(slot) = self.agent.slot.borrow_mut().as_mut() {
            slot.outbox.push(event);
        }
        self.agent.bump();
        Ok(())
    }

    fn end(&mut self, end: &TraceEnd) -> std::io::Result<()> {
        let mut end = end.clone();
        end.ts = self.agent.skew(end.ts);
        let json = serde_json::to_string(&end)?;
        if let Some(slot) = self.agent.slot.borrow_mut().as_mut() {
            slot.end = Some((json, slot.outbox.next_seq()));
        }
        self.agent.bump();
        Ok(())
    }
}

fn options(agent: &Agent, request: TraceRequest) -> Result<RecordOptions, String> {
    let mut events = BTreeSet::new();
    for name in &request.events {
        events.extend(EventKind::parse_list_item(name)?);
    }
    let defaults = RecordOptions::default();
    Ok(RecordOptions {
        pids: request.pids,
        binaries: request.binaries.into_iter().map(PathBuf::from).collect(),
        command: request.command.into_iter().map(OsString::from).collect(),
        functions: request.functions,
        events: if events.is_empty() { defaults.events.clone() } else { events },
        follow_children: request.follow_children,
        duration: None,
        buffer_size: if request.buffer_size == 0 { defaults.buffer_size } else { request.buffer_size },
        max_probes: if request.max_probes == 0 { defaults.max_probes } else { request.max_probes as usize },
        host: agent.opts.host.clone(),
    })
}

/// Starts recording; returns the trace's first line (JSON).
fn start_trace(agent: &Rc<Agent>, trace_id: u64, request: TraceRequest) -> Result<String, String> {
    if agent.slot.borrow().as_ref().is_some_and(|s| s.end.is_none()) {
        return Err("a trace is already running on this agent".to_string());
    }
    let options = options(agent, request)?;
    record::check_root().map_err(|e| e.to_string())?;
    let plan = record::plan(options).map_err(|e| e.to_string())?;
    for w in &plan.warnings {
        log(format_args!("warning: {w}"));
    }
    let recording = plan.start().map_err(|e| e.to_string())?;
    for w in &recording.warnings {
        log(format_args!("warning: {w}"));
    }
    let mut start = recording.trace_start().clone();
    start.ts = agent.skew(start.ts);
    let start_json = serde_json::to_string(&start).map_err(|e| e.to_string())?;
    let (stop, stopped) = oneshot::channel();
    *agent.slot.borrow_mut() = Some(TraceSlot {
        id: trace_id,
        outbox: Outbox::new(agent.opts.max_buffered),
        start_json: start_json.clone(),
        end: None,
        stop: Some(stop),
    });
    log(format_args!("trace {trace_id} started: {} probes", start.probes));
    let agent = agent.clone();
    tokio::task::spawn_local(async move {
        let mut sink = OutboxSink { agent: agent.clone() };
        let stop = async { stopped.await.unwrap_or(EndReason::Stopped) };
        match recording.run(&mut sink, stop).await {
            Ok(outcome) => log(format_args!("trace {trace_id} ended ({})", outcome.end.reason)),
            Err(e) => {
                log(format_args!("trace {trace_id} failed: {e}"));
                // The collector still gets an end, so that it stops waiting.
                let _ = sink.end(&TraceEnd::new(agent.clock.now_unix_ns(), EndReason::Terminated, 0));
            }
        }
    });
    Ok(start_json)
}
