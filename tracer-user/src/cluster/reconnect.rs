//! The collector's side of one agent connection: the session (commands out, events in, clock
//! probes and acknowledgements), and reconnecting and resuming the trace when it drops.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::{
    io::WriteHalf,
    sync::{mpsc, oneshot},
};

use super::{
    auth::{self, Key},
    clock_sync::ClockSample,
    collector::{AgentSpec, ClientOptions, Command, HostState, LOG, Shared, connect_session},
    command_output::MAX_QUEUED,
    event_bounds::{self, BoundError, Window},
    output_lines::ChunkTooLarge,
    protocol::{FrameError, Message, OutputStream},
    session::{Session, SessionWriter},
    tls::Transport,
    wire::{Decoder, EventBatch},
};
use crate::{
    errors::report,
    event::host::Machine,
    event::{Event, LossCause, TraceStart},
};

/// How long an agent may be silent while it starts a trace.
const START_SILENCE: Duration = Duration::from_secs(30);

/// Serves one agent: the connection, and reconnections.
pub(super) async fn agent_task(
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
            Err(Ended::Lost(reason)) => {
                tracing::info!(target: LOG, "connection to {} lost ({reason}); reconnecting", spec.name);
            }
            Err(Ended::BoundBroken(reason)) => {
                // Not reconnected: this agent sends what no host sends, or more than we hold.
                let mut h = shared.hosts[index].lock().unwrap();
                let detail = format!("the agent broke a bound, its part of the trace ends here: {reason}");
                if h.trace_id.is_some() && !h.finished() {
                    h.given_up = true;
                    h.lose(LossCause::BoundBroken, detail);
                } else {
                    tracing::warn!(target: LOG, "warning: host {}: {detail}", spec.name);
                }
                drop(h);
                shared.changed.notify_waiters();
                return;
            }
        }
    }
}

async fn reconnect(spec: &AgentSpec, options: &ClientOptions) -> Option<Session> {
    let deadline = Instant::now() + options.reconnect_for;
    while Instant::now() < deadline {
        match connect_session(spec, options).await {
            Ok(c) => {
                tracing::info!(target: LOG, "reconnected to {}", spec.name);
                return Some(c);
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    None
}

/// Why a connection's life ended, when the cluster still wants it.
enum Ended {
    /// The connection dropped: reconnect and resume.
    Lost(String),
    /// The agent broke a bound ([`super::wire`], [`super::event_bounds`]): give its host up.
    BoundBroken(String),
}

impl From<String> for Ended {
    fn from(reason: String) -> Ended {
        Ended::Lost(reason)
    }
}

impl From<&str> for Ended {
    fn from(reason: &str) -> Ended {
        Ended::Lost(reason.to_string())
    }
}

/// One connection's life: commands out, events in, clock probes and acks every so often.
/// `Ok` when the cluster is gone; `Err` when the connection dropped or the agent broke a bound.
async fn session(
    index: usize,
    options: &ClientOptions,
    shared: &Arc<Shared>,
    commands: &mut mpsc::Receiver<Command>,
    conn: Session,
) -> Result<(), Ended> {
    let Session { reader, writer, transcript, resume_key, .. } = conn;
    let (tx, mut incoming) = mpsc::channel(256);
    let reading = tokio::spawn(reader.forward(tx, || {}));
    let mut link = Link::new(index, options, shared, writer, resume_key);
    let result = link.run(commands, &mut incoming, &transcript).await;
    reading.abort();
    if let Err(Ended::BoundBroken(_)) = &result {
        link.stop_trace().await;
    }
    result
}

/// What one connection's steps share: the host it serves, the sending half, and where the
/// conversation stands (a start awaiting its answer, a resume in flight, clock probes out, the
/// last acknowledgement).
struct Link<'a> {
    index: usize,
    options: &'a ClientOptions,
    shared: &'a Arc<Shared>,
    /// The collector stamps each event with the name the user gave the host on receipt (the wire
    /// carries no host): an agent cannot speak for another host, and the agents' own names (often
    /// equal: machines cloned from one image) are only information, in `trace_start.hosts`.
    host: Arc<str>,
    writer: SessionWriter<WriteHalf<Box<dyn Transport>>>,
    /// This connection's key, which resumes a trace it starts.
    resume_key: Key,
    decoder: Decoder,
    pending_start: Option<oneshot::Sender<Result<(), String>>>,
    resuming: bool,
    /// Clock probes sent and not answered yet: id to the collector's time of sending.
    probes: HashMap<u32, u64>,
    next_probe: u32,
    /// The last `next_seq` acknowledged.
    acked: u64,
    ticks: u64,
    last_heard: Instant,
}

impl<'a> Link<'a> {
    fn new(
        index: usize,
        options: &'a ClientOptions,
        shared: &'a Arc<Shared>,
        writer: SessionWriter<WriteHalf<Box<dyn Transport>>>,
        resume_key: Key,
    ) -> Self {
        let host: Arc<str> = Arc::from(shared.hosts[index].lock().unwrap().host.as_str());
        Link {
            index,
            options,
            shared,
            host,
            writer,
            resume_key,
            decoder: Decoder::default(),
            pending_start: None,
            resuming: false,
            probes: HashMap::new(),
            next_probe: 1_000,
            acked: 0,
            ticks: 0,
            last_heard: Instant::now(),
        }
    }

    fn host(&self) -> std::sync::MutexGuard<'a, HostState> {
        self.shared.hosts[self.index].lock().unwrap()
    }

    async fn send(&mut self, message: &Message) -> Result<(), Ended> {
        self.writer.send(message).await.map_err(|e| Ended::Lost(report(&e)))
    }

    async fn run(
        &mut self,
        commands: &mut mpsc::Receiver<Command>,
        incoming: &mut mpsc::Receiver<Result<Message, FrameError>>,
        transcript: &[u8; 32],
    ) -> Result<(), Ended> {
        if let Some(resume) = self.resume(transcript) {
            self.resuming = true;
            self.send(&resume).await?;
        }
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        self.last_heard = Instant::now();
        loop {
            tokio::select! {
                command = commands.recv() => match command {
                    None => return Ok(()),
                    Some(command) => self.command(command).await?,
                },
                message = incoming.recv() => {
                    let message = message.ok_or("connection closed")?.map_err(|e| report(&e))?;
                    self.last_heard = Instant::now();
                    self.message(message)?;
                    self.ack_if_complete().await?;
                    self.shared.changed.notify_waiters();
                },
                _ = tick.tick() => self.tick().await?,
            }
        }
    }

    /// Carrying on with a trace the previous connection was streaming, proving with the key of
    /// the connection that started it that this is the same collector.
    fn resume(&self, transcript: &[u8; 32]) -> Option<Message> {
        let h = self.host();
        // Only a trace the agent confirmed (a start in flight is answered on this connection).
        match (h.trace_id, h.resume_key) {
            (Some(trace_id), Some(key)) if h.start.is_some() && !h.finished() => Some(Message::Resume {
                trace_id,
                next_seq: h.next_seq,
                proof: auth::resume_proof(&key, transcript, trace_id),
            }),
            _ => None,
        }
    }

    async fn command(&mut self, command: Command) -> Result<(), Ended> {
        match command {
            Command::Start { trace_id, request, reply } => {
                self.pending_start = Some(reply);
                self.send(&Message::Start { trace_id, request }).await
            }
            Command::Stop { trace_id } => self.send(&Message::Stop { trace_id }).await,
        }
    }

    /// Takes one message from the agent.
    fn message(&mut self, message: Message) -> Result<(), Ended> {
        match message {
            Message::ClockEcho { id, agent_ns } => {
                if let Some(t0) = self.probes.remove(&id) {
                    let sample = ClockSample { t0, t1: self.shared.clock.now_unix_ns(), agent_ns };
                    self.host().samples.push(sample);
                }
            }
            Message::Started { trace_id, trace_start, exports_otlp } => {
                self.started(trace_id, *trace_start, exports_otlp)?
            }
            Message::Failed { error, .. } => self.failed(error),
            Message::Events(batch) => self.events(batch)?,
            Message::Gap { first_seq, count } => {
                let mut h = self.host();
                if first_seq == h.next_seq {
                    h.lost_in_transit += count;
                    h.next_seq += count;
                    let detail = format!(
                        "the agent dropped events #{first_seq} to #{} in transit: its outbox (--buffer-events, --buffer-bytes) overflowed before the collector received them (the collector fell behind, or was away); a larger --buffer-events or --buffer-bytes on the agent helps (its log says which bound dropped), --buffer-size does not",
                        first_seq + count - 1
                    );
                    h.lose(LossCause::Gap, detail);
                }
            }
            Message::CommandOutput { stream, dropped, bytes } => {
                let mut h = self.host();
                if h.trace_id.is_some() {
                    command_output(&mut h, self.options, stream, dropped, &bytes)
                        .map_err(|e| Ended::BoundBroken(e.to_string()))?;
                }
            }
            Message::Ended { trace_id, trace_end, total_events } => {
                let mut h = self.host();
                if h.trace_id == Some(trace_id) {
                    h.end = Some(trace_end);
                    h.total = Some(total_events);
                    // The agent sends all of the command's output before the end.
                    for stream in OutputStream::BOTH {
                        let HostState { host, output, .. } = &mut *h;
                        output.flush(stream, &mut emitter(self.options, host));
                    }
                }
            }
            Message::Refused { reason } => return Err(format!("refused: {reason}").into()),
            other => return Err(format!("unexpected {other:?}").into()),
        }
        Ok(())
    }

    /// The agent started a trace, or resumed one.
    fn started(&mut self, trace_id: u64, mut trace_start: TraceStart, exports_otlp: bool) -> Result<(), Ended> {
        event_bounds::check_start(&trace_start).map_err(|e| Ended::BoundBroken(e.to_string()))?;
        let mut h = self.host();
        if h.trace_id == Some(trace_id) {
            h.exports_otlp = exports_otlp;
            trace_start.machine = trace_start.machine.map(Machine::from_peer);
            if !self.resuming || h.window.is_none() {
                h.window = Some(Window { start_ns: trace_start.ts, arrived: Instant::now() });
            }
            h.start = Some(trace_start);
            if !self.resuming {
                // The key that will resume this trace after a dropped connection.
                h.resume_key = Some(self.resume_key);
            }
        }
        self.resuming = false;
        drop(h);
        self.decoder.reset();
        if let Some(reply) = self.pending_start.take() {
            let _ = reply.send(Ok(()));
        }
        Ok(())
    }

    /// The agent could not start the trace asked for, or dropped the one it was recording.
    fn failed(&mut self, error: String) {
        match self.pending_start.take() {
            Some(reply) => {
                let _ = reply.send(Err(error));
            }
            None => {
                let mut h = self.host();
                if h.trace_id.is_some() && !h.finished() {
                    h.given_up = true;
                    let cause = if self.resuming { LossCause::AgentDroppedTrace } else { LossCause::AgentFailed };
                    h.lose(cause, format!("the agent says: {error}"));
                }
            }
        }
        self.resuming = false;
        self.shared.changed.notify_waiters();
    }

    /// A batch of events: checked against the bounds, what is new given to subscribers and
    /// spilled.
    fn events(&mut self, batch: EventBatch) -> Result<(), Ended> {
        let first_seq = batch.first_seq;
        let events = self
            .decoder
            .events(&self.host, batch)
            .map_err(|e| if e.is_bound() { Ended::BoundBroken(e.to_string()) } else { Ended::Lost(e.to_string()) })?;
        let mut h = self.host();
        let bounds = h.window.ok_or(Ended::BoundBroken(BoundError::NoStart.to_string()))?.bounds();
        for (seq, e) in (first_seq..).zip(&events) {
            event_bounds::check(e, seq, bounds).map_err(|e| Ended::BoundBroken(e.to_string()))?;
        }
        // A resumed connection may repeat what was received but not yet acked.
        let skip = h.next_seq.saturating_sub(first_seq) as usize;
        if first_seq > h.next_seq {
            return Err(format!("events {}..{} are missing", h.next_seq, first_seq).into());
        }
        let fresh: Vec<Event> = events.into_iter().skip(skip).collect();
        h.next_seq += fresh.len() as u64;
        let now = Instant::now();
        h.first_arrival.get_or_insert(now);
        h.last_arrival = Some(now);
        // Still holding the host: see `ClusterTrace::subscribe`.
        if let Some(trace_id) = h.trace_id {
            deliver(self.shared, trace_id, &fresh);
        }
        spill(&mut h, &fresh);
        Ok(())
    }

    /// Everything is here: say so at once, so that the agent can let the trace go (it keeps an
    /// unacknowledged trace for its collector).
    async fn ack_if_complete(&mut self) -> Result<(), Ended> {
        let done = {
            let h = self.host();
            h.total.is_some_and(|t| h.next_seq >= t).then_some(h.next_seq)
        };
        if let Some(next_seq) = done.filter(|&n| n != self.acked) {
            self.send(&Message::Ack { next_seq }).await?;
            self.acked = next_seq;
        }
        Ok(())
    }

    /// Every 100 ms: the silence check, an acknowledgement of what arrived, and every second a
    /// clock probe.
    async fn tick(&mut self) -> Result<(), Ended> {
        self.ticks += 1;
        // An agent attaching probes answers nothing until it is done: that may take seconds
        // (large binaries, a loaded machine).
        let silence =
            if self.pending_start.is_some() { self.options.silence.max(START_SILENCE) } else { self.options.silence };
        if self.last_heard.elapsed() > silence {
            return Err(format!("silent for {silence:?}").into());
        }
        let next_seq = self.host().next_seq;
        if next_seq != self.acked {
            self.send(&Message::Ack { next_seq }).await?;
            self.acked = next_seq;
        }
        if self.ticks.is_multiple_of(10) {
            self.next_probe = self.next_probe.wrapping_add(1);
            self.probes.insert(self.next_probe, self.shared.clock.now_unix_ns());
            self.send(&Message::ClockProbe { id: self.next_probe }).await?;
        }
        Ok(())
    }

    /// Best effort, after the agent broke a bound: the agent stops recording for a collector
    /// that will take no more.
    async fn stop_trace(&mut self) {
        let trace_id = self.host().trace_id;
        if let Some(trace_id) = trace_id {
            let _ = tokio::time::timeout(Duration::from_secs(1), self.writer.send(&Message::Stop { trace_id })).await;
        }
    }
}

/// A handler's view of one host's lines (nothing without a handler).
fn emitter<'a>(options: &'a ClientOptions, host: &'a str) -> impl FnMut(OutputStream, &[u8]) + 'a {
    move |stream, line| {
        if let Some(handler) = &options.command_output {
            handler(host, stream, line);
        }
    }
}

/// Takes the next bytes of the launched command's `stream`, after `dropped` bytes the agent did
/// not send (said as a warning, after the partial line before them).
fn command_output(
    h: &mut HostState,
    options: &ClientOptions,
    stream: OutputStream,
    dropped: u64,
    bytes: &[u8],
) -> Result<(), ChunkTooLarge> {
    let HostState { host, output, .. } = h;
    let mut emit = emitter(options, host);
    if dropped > 0 {
        output.flush(stream, &mut emit);
        tracing::warn!(
            target: LOG,
            "host {host}: {dropped} bytes of the command's {} were not sent: the agent keeps at most {} bytes of output for a collector that is slow or away (its output file on the host has everything)",
            stream.name(),
            MAX_QUEUED
        );
    }
    output.take(stream, bytes, &mut emit)
}

/// Passes fresh events of a trace to its subscribers, each as far as its channel has room;
/// drops those that hung up.
fn deliver(shared: &Shared, trace_id: u64, events: &[Event]) {
    shared
        .subscribers
        .lock()
        .unwrap()
        .retain_mut(|s| s.trace_id != trace_id || events.iter().all(|e| s.give(e.clone())));
}

/// Appends fresh events to the host's spill file. One that cannot be written (the disk is full)
/// ends the host's part of the trace, said as its loss.
fn spill(h: &mut HostState, events: &[Event]) {
    let Some(file) = h.spill.as_mut() else { return };
    if let Err(e) = events.iter().try_for_each(|e| file.push(e)) {
        let written = file.len();
        h.spill = None;
        h.given_up = true;
        let detail = format!("the collector could not write its events to the spill file after #{written}: {e}");
        h.lose(LossCause::SpillFailed, detail);
    }
}
