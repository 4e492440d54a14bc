//! Writes the seed corpus of every fuzz target (`fuzz/fuzz_targets/*`) into `DIR/<target>/`, in
//! the current encodings, so that the fuzzer starts from inputs the decoders accept:
//! `cargo xtask fuzz-seeds` runs it on `fuzz/corpus`.
//!
//! - `frame`: one body per protocol message, as the target decodes it: the postcard message
//!   alone. Frames after the handshake are encrypted (Noise), and the session opens them before
//!   it decodes; the target fuzzes the decoder, so the encryption is not part of its input.
//! - `trace_line`: a JSON lines trace with one event of each kind.
//! - `record`: one ring-buffer record of each kind.
//! - `event_payload`: program-event payloads.
//! - `native`: the same trace in the native format, in one batch of events and in one per event.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use tracer_common::{RecordHeader, RecordKind};
use tracer_user::{
    cluster::{
        protocol::{Message, OutputStream, PROTOCOL_VERSION, TraceRequest, decode, encode_body},
        wire::{self, Decoder, Encoder, EventBatch},
    },
    event::{
        Channel, ClockInfo, EndReason, Event, EventData, EventKind, ProbePaths, SignalId, SpawnHow, Syscall,
        TargetInfo, TraceEnd, TraceStart, data,
    },
    export::{jsonl::JsonlWriter, native::NativeWriter},
    sink::Sink,
    trace::read::{jsonl::TraceReader, native::NativeReader},
};

fn main() -> Result<()> {
    let dir = PathBuf::from(std::env::args().nth(1).context("usage: fuzz_seeds DIR")?);
    let events = events();
    let frames = frames(&events)?;
    let traces = vec![trace(false, &events, false)?];
    let natives = vec![trace(true, &events, false)?, trace(true, &events, true)?];
    let records = records();
    let payloads = payloads();
    // A seed the decoder refuses would only teach the fuzzer the first error path: check each
    // one the way its target reads it.
    for (i, f) in frames.iter().enumerate() {
        if let Message::Events(batch) = decode(f).with_context(|| format!("frame seed {i} does not decode"))? {
            Decoder::default().events(&"h".into(), batch).with_context(|| format!("frame seed {i}: bad batch"))?;
        }
    }
    for t in &traces {
        let lines = TraceReader::new(&t[..]).collect::<Result<Vec<_>, _>>().context("trace seed does not read")?;
        anyhow::ensure!(lines.len() == events.len() + 2, "trace seed: {} lines", lines.len());
    }
    for (i, t) in natives.iter().enumerate() {
        let items = NativeReader::new(&t[..]).collect::<Result<Vec<_>, _>>();
        let items = items.with_context(|| format!("native seed {i} does not read"))?;
        anyhow::ensure!(items.len() == events.len() + 2, "native seed {i}: {} items", items.len());
    }
    for (i, r) in records.iter().enumerate() {
        tracer_common::decode::decode(r).map_err(|e| anyhow::anyhow!("record seed {i}: {e}"))?;
    }
    for (i, p) in payloads.iter().enumerate() {
        tracer_events::payload::decode(p).map_err(|e| anyhow::anyhow!("payload seed {i}: {e:?}"))?;
    }
    write(&dir.join("frame"), frames)?;
    write(&dir.join("trace_line"), traces)?;
    write(&dir.join("record"), records)?;
    write(&dir.join("event_payload"), payloads)?;
    write(&dir.join("native"), natives)?;
    Ok(())
}

/// Replaces the seeds in `dir` (files `seed-N`) with `seeds`.
fn write(dir: &Path, seeds: Vec<Vec<u8>>) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for old in fs::read_dir(dir)? {
        let old = old?.path();
        if old.file_name().is_some_and(|n| n.to_string_lossy().starts_with("seed-")) {
            fs::remove_file(&old).with_context(|| format!("cannot remove {}", old.display()))?;
        }
    }
    for (i, seed) in seeds.iter().enumerate() {
        let path = dir.join(format!("seed-{i}"));
        fs::write(&path, seed).with_context(|| format!("cannot write {}", path.display()))?;
    }
    println!("fuzz_seeds: {} seeds in {}", seeds.len(), dir.display());
    Ok(())
}

fn start() -> TraceStart {
    TraceStart {
        format_version: tracer_user::event::FORMAT_VERSION,
        host: "h".into(),
        tracer_version: "0".into(),
        ts: 1_000,
        clock: ClockInfo { source: "realtime".into(), offset_ns: 0, uncertainty_ns: 0 },
        targets: vec![TargetInfo::Process { pid: 1, comm: "app".into(), exe: "/bin/app".into() }],
        probes: 1,
        events: EventKind::ALL.to_vec(),
        follow_children: true,
        probe_paths: ProbePaths::default(),
        aliases: [("open64".to_string(), vec!["open".to_string()])].into(),
        hosts: vec![],
        machine: None,
        kernel: None,
    }
}

fn end() -> TraceEnd {
    TraceEnd::new(9_000, EndReason::Stopped, 3)
}

/// One event of each kind.
fn events() -> Vec<Event> {
    let tcp = Channel::Tcp { src: "10.0.0.1:40000".parse().unwrap(), dst: "10.0.0.2:80".parse().unwrap() };
    let ev = |ts, data| Event { ts, host: "h".into(), pid: 1, tid: 1, data };
    vec![
        ev(
            2_000,
            EventData::Call(data::Call {
                function: "f".into(),
                module: "/bin/app".into(),
                args: [1; 6].into(),
                goid: None,
                params: Default::default(),
                file: None,
                line: None,
            }),
        ),
        ev(
            3_000,
            EventData::Return(data::Return {
                function: "f".into(),
                module: "/bin/app".into(),
                retval: 7,
                duration_ns: Some(1_000),
                goid: None,
                ret: None,
                unwound: None,
                tail_call: None,
            }),
        ),
        ev(
            4_000,
            EventData::Spawn(data::Spawn {
                parent_pid: 1,
                child_pid: 2,
                child_tid: 2,
                how: SpawnHow::Fork,
                comm: "app".into(),
                filename: None,
            }),
        ),
        ev(
            5_000,
            EventData::Send(data::Send {
                channel: tcp.clone(),
                fd: 3,
                bytes: 10,
                syscall: Syscall::Write,
                flow_id: 0,
                syscall_ns: 1,
                seq: Some(1),
                digest: Some(9),
                payload: Some(data::Payload(b"GET / HTTP/1.1\r\n".to_vec())),
                payload_truncated: Some(true),
            }),
        ),
        ev(
            6_000,
            EventData::Recv(data::Recv {
                channel: tcp,
                fd: 4,
                bytes: 10,
                syscall: Syscall::Read,
                flow_ids: vec![],
                syscall_ns: 1,
                seq: Some(1),
                digest: Some(9),
                payload: Some(data::Payload(b"GET / HTTP/1.1\r\n".to_vec())),
                payload_truncated: Some(true),
                peek: true,
                discarded: Some(4),
            }),
        ),
        ev(
            7_000,
            EventData::Signal(data::Signal {
                signal: SignalId::new(10),
                sender_pid: 1,
                target_pid: 2,
                target_tid: 2,
                delivered: false,
                flow_id: None,
                group: true,
                queued: false,
            }),
        ),
        ev(8_000, EventData::Exit(data::Exit { exit_code: Some(0), signal: None, thread: false, comm: "app".into() })),
    ]
}

/// `events` as the agent sends them on a new connection.
fn batch(events: &[Event]) -> EventBatch {
    let mut encoder = Encoder::default();
    let mut bytes = Vec::new();
    for e in events {
        encoder.encode(e, e.ts, &mut bytes);
    }
    wire::batch(0, encoder.strings(), 0, &bytes)
}

fn frames(events: &[Event]) -> Result<Vec<Vec<u8>>> {
    let messages = [
        Message::Hello { version: PROTOCOL_VERSION, padding: [0; 32] },
        Message::Terms { version: PROTOCOL_VERSION, secret_required: true },
        Message::Noise { message: vec![2; 48] },
        Message::Welcome { host: "h".into() },
        Message::Refused { reason: "no".into() },
        Message::ClockProbe { id: 1 },
        Message::ClockEcho { id: 1, agent_ns: 5 },
        Message::Start { trace_id: 1, request: Box::new(TraceRequest { pids: vec![1], ..Default::default() }) },
        Message::Start {
            trace_id: 2,
            request: Box::new(TraceRequest {
                command: vec!["pwd".into()],
                cwd: Some("/srv".into()),
                ..Default::default()
            }),
        },
        Message::Started { trace_id: 1, trace_start: Box::new(start()), exports_otlp: true },
        Message::Failed { trace_id: 1, error: "no".into() },
        Message::Events(batch(events)),
        Message::Gap { first_seq: 7, count: 2 },
        Message::Ack { next_seq: 7 },
        Message::Stop { trace_id: 1 },
        Message::Ended { trace_id: 1, trace_end: end(), total_events: events.len() as u64 },
        Message::Resume { trace_id: 1, next_seq: 7, proof: [3; 32] },
        Message::CommandOutput { stream: OutputStream::Stdout, dropped: 0, bytes: b"line\npart".to_vec() },
        Message::CommandOutput { stream: OutputStream::Stderr, dropped: 4096, bytes: Vec::new() },
    ];
    messages.iter().map(|m| encode_body(m).context("cannot encode a message")).collect()
}

/// The trace of `events` in JSON lines (`native: false`) or the native format; `flush_each` ends a
/// batch after every event.
fn trace(native: bool, events: &[Event], flush_each: bool) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut w: Box<dyn Sink + '_> =
        if native { Box::new(NativeWriter::new(&mut out)) } else { Box::new(JsonlWriter::new(&mut out)) };
    w.begin(&start())?;
    for e in events {
        w.event(e)?;
        if flush_each {
            w.flush()?;
        }
    }
    w.end(&end())?;
    drop(w);
    Ok(out)
}

/// A record of `kind` whose layout is `T`: its header, then zeros (valid for every record: all
/// fields are integers, and a zero count or length is in bounds).
fn record<T>(kind: RecordKind) -> Vec<u8> {
    let mut bytes = vec![0u8; size_of::<T>()];
    let header = RecordHeader { kind: kind as u32, _pad: 0, ts_boot_ns: 1_000, pid: 1, tid: 1 };
    bytes[..4].copy_from_slice(&header.kind.to_ne_bytes());
    bytes[8..16].copy_from_slice(&header.ts_boot_ns.to_ne_bytes());
    bytes[16..20].copy_from_slice(&header.pid.to_ne_bytes());
    bytes[20..24].copy_from_slice(&header.tid.to_ne_bytes());
    bytes
}

fn records() -> Vec<Vec<u8>> {
    use tracer_common::*;
    let mut user_event = record::<UserEventRecord>(RecordKind::UserEvent);
    let payload = payloads().swap_remove(0);
    // copied_len: after the header (24), the cookie (8) and payload_len (8).
    user_event[32..40].copy_from_slice(&(payload.len() as u64).to_ne_bytes());
    user_event[40..44].copy_from_slice(&(payload.len() as u32).to_ne_bytes());
    user_event.extend_from_slice(&payload);
    vec![
        record::<CallRecord>(RecordKind::Call),
        record::<ReturnRecord>(RecordKind::Return),
        record::<ForkRecord>(RecordKind::Fork),
        record::<ExecRecord>(RecordKind::Exec),
        record::<ExitRecord>(RecordKind::Exit),
        record::<IpcRecord>(RecordKind::Ipc),
        record::<SignalRecord>(RecordKind::Signal),
        record::<GoCallRecord>(RecordKind::GoCall),
        record::<GoReturnRecord>(RecordKind::GoReturn),
        user_event,
        record::<UsdtRecord>(RecordKind::Usdt),
    ]
}

fn payloads() -> Vec<Vec<u8>> {
    use tracer_events::payload::{Kind, Level, Payload};
    let log = Payload {
        kind: Some(Kind::Log),
        level: Some(Level::Info),
        source: "app",
        function: "main",
        file: "main.rs",
        line: 7,
        spans: &["request", "parse"],
        message: "parsed 3 items",
        data: r#"{"items":3}"#,
    };
    let bare = Payload {
        kind: None,
        level: None,
        source: "",
        function: "",
        file: "",
        line: 0,
        spans: &[],
        message: "hello",
        data: "",
    };
    [log, bare]
        .iter()
        .map(|p| {
            let mut out = Vec::new();
            p.encode(&mut out);
            out
        })
        .collect()
}
