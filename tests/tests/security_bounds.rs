//! Bounds on what an authenticated peer can make the other side do or hold: a collector's
//! request (patterns, probes, the ring buffer) against a real agent, planned off the agent's
//! connection loop; and a fake agent (the library's own handshake and frames, the real secret)
//! that sends a real collector more strings than it holds, a pid no Linux host has, a
//! timestamp outside the trace, a command's output in a message over the bound, or a line of
//! output without end.

use std::{
    path::Path,
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use tracer_tests::{Background, LocalAgent, fixture, gen_secret, temp_dir, tracer, tracer_bin, wait_with_timeout};
use tracer_user::{
    cluster::{
        auth::Secret,
        collector::{AgentSpec, ClientOptions, Cluster},
        command_output::MAX_CHUNK,
        output_lines::MAX_LINE,
        protocol::{Message, OutputStream, TraceRequest},
        session,
        wire::{self, EventBatch},
    },
    event::{ClockInfo, EndReason, Event, EventData, FORMAT_VERSION, KernelInfo, TraceEnd, TraceStart, data},
};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

async fn connect(agent: &LocalAgent) -> Cluster {
    let spec: AgentSpec = agent.spec("h").parse().unwrap();
    Cluster::connect(vec![spec], ClientOptions::default()).await.unwrap()
}

/// A start refused by the agent: its sentence, as the library reports it.
async fn refused(cluster: &Cluster, request: TraceRequest) -> String {
    match cluster.start(vec![("h".to_string(), request)]).await {
        Ok(_) => panic!("the agent started the trace"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_hundred_thousand_patterns_are_refused_at_once_and_a_large_plan_keeps_no_collector_waiting() {
    let dir = temp_dir();
    let agent = LocalAgent::start(dir.path(), "h", &[]);
    let victim = Background::start(&fixture("calls"), &["loop"]);
    runtime().block_on(async {
        let cluster = connect(&agent).await;
        let request = TraceRequest {
            pids: vec![victim.pid()],
            functions: vec!["P*".to_string(); 100_000],
            ..Default::default()
        };
        let asked = Instant::now();
        let said = refused(&cluster, request).await;
        let took = asked.elapsed();
        assert_eq!(
            said,
            "agent h could not start tracing: the request has more than 1000 patterns (functions, USDT probes, triggers, breakpoints, watchpoints): an agent takes at most 1000 per request"
        );
        assert!(took < Duration::from_secs(1), "refused in {took:?}");
        let probes = TraceRequest { pids: vec![victim.pid()], max_probes: 100_000, ..Default::default() };
        assert_eq!(
            refused(&cluster, probes).await,
            "agent h could not start tracing: the request asks for up to 100000 probes: an agent places at most 4096 per request"
        );

        // A thousand patterns over the tracer's own executable, each matching its ~17,000
        // functions: a second or more of planning (17 million matches, each checked against those
        // chosen already in constant time), on a thread of the agent's own. Meanwhile another collector
        // connects (16 clock round trips), and a second start is told the agent is busy.
        let bin = tracer_bin().display().to_string();
        let heavy = TraceRequest {
            binaries: vec![bin],
            functions: vec!["*".to_string(); 1000],
            ..Default::default()
        };
        let cluster = Arc::new(cluster);
        let planning = tokio::spawn({
            let cluster = cluster.clone();
            async move {
                let started = Instant::now();
                (refused(&cluster, heavy).await, started.elapsed())
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let asked = Instant::now();
        let other = connect(&agent).await;
        let connected_in = asked.elapsed();
        assert!(!planning.is_finished(), "the plan ended before the other collector connected");
        assert!(connected_in < Duration::from_secs(1), "another collector waited {connected_in:?}");
        let busy = TraceRequest { pids: vec![victim.pid()], ..Default::default() };
        assert_eq!(refused(&other, busy).await, "agent h could not start tracing: a trace is being started on this agent");
        let (said, planned_in) = planning.await.unwrap();
        eprintln!("planned in {planned_in:?}; another collector connected in {connected_in:?}");
        assert!(said.starts_with("agent h could not start tracing: "), "{said}");
        assert!(said.contains("functions would be probed, more than --max-probes (4096)"), "{said}");
    });
}

/// The trigger fields of a request (`--start-at`, `--stop-at`, `--depth`) from a hostile
/// collector: each refused with its sentence before anything is probed, the target untouched.
#[test]
fn hostile_trigger_fields_are_refused_with_their_sentence() {
    let dir = temp_dir();
    let agent = LocalAgent::start(dir.path(), "h", &[]);
    let victim = Background::start(&fixture("calls"), &["loop"]);
    runtime().block_on(async {
        let cluster = connect(&agent).await;
        let on_victim = |request: TraceRequest| TraceRequest {
            pids: vec![victim.pid()],
            functions: vec!["tick".to_string()],
            ..request
        };
        // A hundred thousand triggers cost a thousand strings and count with the patterns.
        let many = on_victim(TraceRequest { stop_at: vec!["t*".to_string(); 100_000], ..Default::default() });
        assert_eq!(
            refused(&cluster, many).await,
            "agent h could not start tracing: the request has more than 1000 patterns (functions, USDT probes, triggers, breakpoints, watchpoints): an agent takes at most 1000 per request"
        );
        let split = on_victim(TraceRequest {
            start_at: vec!["t*".to_string(); 500],
            stop_at: vec!["t*".to_string(); 500],
            ..Default::default()
        });
        assert!(refused(&cluster, split).await.contains("more than 1000 patterns (functions"));
        for depth in [u32::MAX, 65] {
            let deep = on_victim(TraceRequest { depth, ..Default::default() });
            assert_eq!(
                refused(&cluster, deep).await,
                format!(
                    "agent h could not start tracing: --depth must be between 1 (only the outermost traced calls) and 64, got {depth}"
                )
            );
        }
        // A trigger over every function of a large program is held to the probe bound.
        let everything = TraceRequest {
            binaries: vec![tracer_bin().display().to_string()],
            functions: vec!["main".to_string()],
            start_at: vec!["*".to_string()],
            ..Default::default()
        };
        let said = refused(&cluster, everything).await;
        assert!(said.contains("functions would be probed, more than --max-probes (4096)"), "{said}");
        let unknown = on_victim(TraceRequest { start_at: vec!["no_such_function".to_string()], ..Default::default() });
        let said = refused(&cluster, unknown).await;
        assert!(
            said.starts_with("agent h could not start tracing: --start-at 'no_such_function' matches no function in "),
            "{said}"
        );
    });
    // Still running, neither stopped nor gone: it prints its line when asked to end.
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", victim.pid())).unwrap();
    let state = stat.rsplit(") ").next().unwrap().chars().next().unwrap();
    assert!(matches!(state, 'R' | 'S'), "the target is in state {state}");
    let (code, _) = victim.finish();
    assert_eq!(code, 0);
}

/// `MemTotal`, in bytes.
fn mem_total() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kb = meminfo.lines().find_map(|l| l.strip_prefix("MemTotal:")).unwrap();
    kb.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap() * 1024
}

#[test]
fn a_ring_buffer_above_a_sixteenth_of_the_memory_is_refused_for_record_and_requests_alike() {
    let mem = mem_total();
    let size: u64 = 1 << 31;
    if mem / 16 >= size {
        eprintln!("skipped: {mem} bytes of memory take any --buffer-size a u32 can say");
        return;
    }
    let max_mib = (1u64 << (mem / 16).ilog2()) >> 20;
    let sentence = format!(
        "--buffer-size 2048 MiB is more than 1/16 of this host's memory ({:.1} GiB): at most {max_mib} MiB here",
        mem as f64 / (1u64 << 30) as f64
    );
    let victim = Background::start(&fixture("calls"), &["loop"]);
    let pid = victim.pid().to_string();
    tracer(&["record", "--buffer-size", &size.to_string(), "-p", &pid, "-d", "1"]).assert_error(&sentence);
    let dir = temp_dir();
    let agent = LocalAgent::start(dir.path(), "h", &[]);
    runtime().block_on(async {
        let cluster = connect(&agent).await;
        let request = TraceRequest { pids: vec![victim.pid()], buffer_size: size as u32, ..Default::default() };
        assert_eq!(refused(&cluster, request).await, format!("agent h could not start tracing: {sentence}"));
    });
}

/// What the fake agent sends once the collector has started its trace.
#[derive(Clone, Copy)]
enum Misbehave {
    /// Strings of 60 KiB, 120 a frame, up to 1 GiB in all.
    Strings,
    /// An event whose pid is 2^22.
    Pid,
    /// An event stamped near `u64::MAX`.
    Timestamp,
    /// A message of command output one byte over the bound.
    LargeOutput,
    /// 64 MiB of command output without a newline, in messages within the bound, then the end.
    EndlessLine,
}

/// The bytes of the fake agent's endless line.
const ENDLESS: usize = 64 << 20;

fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
}

fn trace_start(ts: u64) -> TraceStart {
    TraceStart {
        format_version: FORMAT_VERSION,
        host: "fake".into(),
        tracer_version: "0".into(),
        ts,
        clock: ClockInfo { source: "realtime".into(), offset_ns: 0, uncertainty_ns: 0 },
        targets: Vec::new(),
        probes: 0,
        events: Vec::new(),
        follow_children: false,
        probe_paths: Default::default(),
        aliases: Default::default(),
        hosts: Vec::new(),
        machine: None,
        // Always there from a real agent (postcard has no "absent" for a skipped field).
        kernel: Some(KernelInfo {
            release: "6.18".into(),
            attach: "uprobe_multi".into(),
            process_exit: "group_dead".into(),
            optimized_probes: false,
            ring_bytes: 8 << 20,
        }),
    }
}

/// One exit event of `pid`, stamped `ts`, as an agent encodes it.
fn exit_batch(pid: u32, ts: u64) -> EventBatch {
    let event = Event {
        ts,
        host: "fake".into(),
        pid,
        tid: pid,
        data: EventData::Exit(data::Exit { exit_code: Some(0), signal: None, thread: false, comm: "x".into() }),
    };
    let mut encoder = wire::Encoder::default();
    let mut bytes = Vec::new();
    encoder.encode(&event, ts, &mut bytes);
    wire::batch(0, encoder.strings(), 0, &bytes)
}

/// A fake agent on 127.0.0.1 with the real secret: the library's handshake, clock answers, a
/// trace that "starts", then `misbehave`. Returns its address and the bytes of strings it sent.
fn fake_agent(secret: &Path, misbehave: Misbehave) -> (String, std::thread::JoinHandle<u64>) {
    let secret = Secret::from_file(secret).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            listener.set_nonblocking(true).unwrap();
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let (tcp, _) = listener.accept().await.unwrap();
            let mut s = session::server(Box::new(tcp), Some(&secret), "fake").await.unwrap();
            let mut sent = 0u64;
            loop {
                let Ok(message) = s.reader.recv().await else { return sent };
                match message {
                    Message::ClockProbe { id } => {
                        let _ = s.writer.send(&Message::ClockEcho { id, agent_ns: now_ns() }).await;
                    }
                    Message::Start { trace_id, .. } => {
                        let start = Box::new(trace_start(now_ns()));
                        let started = Message::Started { trace_id, trace_start: start, exports_otlp: false };
                        s.writer.send(&started).await.unwrap();
                        let output =
                            |bytes: Vec<u8>| Message::CommandOutput { stream: OutputStream::Stdout, dropped: 0, bytes };
                        let batch = match misbehave {
                            Misbehave::LargeOutput => {
                                let _ = s.writer.send(&output(vec![b'x'; MAX_CHUNK + 1])).await;
                                continue;
                            }
                            Misbehave::EndlessLine => {
                                for _ in 0..ENDLESS / MAX_CHUNK {
                                    if s.writer.send(&output(vec![b'x'; MAX_CHUNK])).await.is_err() {
                                        return sent;
                                    }
                                    sent += MAX_CHUNK as u64;
                                }
                                let trace_end = TraceEnd::new(now_ns(), EndReason::CommandExited, 0);
                                let _ = s.writer.send(&Message::Ended { trace_id, trace_end, total_events: 0 }).await;
                                continue;
                            }
                            Misbehave::Pid => exit_batch(1 << 22, now_ns()),
                            Misbehave::Timestamp => exit_batch(100, u64::MAX - 1),
                            Misbehave::Strings => {
                                let text = "s".repeat(60 << 10);
                                let mut next = 0u32;
                                while sent < 1 << 30 {
                                    let strings = (next..next + 120).map(|n| (n, text.clone())).collect();
                                    let batch = EventBatch { first_seq: 0, strings, events: Vec::new() };
                                    if s.writer.send(&Message::Events(batch)).await.is_err() {
                                        return sent;
                                    }
                                    next += 120;
                                    sent += 120 * text.len() as u64;
                                }
                                return sent;
                            }
                        };
                        let _ = s.writer.send(&Message::Events(batch)).await;
                    }
                    _ => {}
                }
            }
        })
    });
    (addr, thread)
}

/// `tracer collect` from the fake agent; returns its run and its memory's high-water mark (KiB).
fn collect_from(addr: &str, secret: &Path, output: &Path) -> (tracer_tests::Run, u64) {
    let child = Command::new(tracer_bin())
        .args(["collect", "--agent", &format!("h={addr}"), "--secret-file", secret.to_str().unwrap()])
        .args(["-p", "h:1", "-d", "30", "-o", output.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // VmHWM only grows: its last reading before the exit is the peak.
    let watcher = std::thread::spawn(move || {
        let mut peak = 0;
        while let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            if let Some(kib) = status.lines().find_map(|l| l.strip_prefix("VmHWM:")) {
                peak = kib.trim().trim_end_matches("kB").trim().parse().unwrap_or(peak);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        peak
    });
    let run = wait_with_timeout(child, "tracer collect");
    (run, watcher.join().unwrap())
}

#[test]
fn an_agent_that_sends_a_gigabyte_of_strings_ends_as_an_incomplete_host_and_the_collector_stays_small() {
    let dir = temp_dir();
    let secret = gen_secret(dir.path(), "s");
    let (addr, agent) = fake_agent(&secret, Misbehave::Strings);
    let output = dir.path().join("x.jsonl");
    let started = Instant::now();
    let (run, peak_kib) = collect_from(&addr, &secret, &output);
    let sent = agent.join().unwrap();
    eprintln!("collector peak {peak_kib} KiB; the agent sent {} MiB of strings in {:?}", sent >> 20, started.elapsed());
    assert_eq!(run.code(), 75, "{run:?}");
    assert!(
        run.stderr.contains(
            "host h: the agent broke a bound, its part of the trace ends here: the agent's string table would exceed 64 MiB"
        ),
        "{run:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(20), "given up at once, not at the end of -d 30");
    assert!(sent < 1 << 30, "the collector stopped reading: {sent} bytes sent");
    // The table's 64 MiB, a frame or two in flight, and the collector itself.
    assert!(peak_kib < 128 << 10, "the collector peaked at {peak_kib} KiB");
    let t = tracer_tests::Trace::load(&output);
    let host = &t.end["hosts"][0];
    assert_eq!(host["complete"], false, "{}", t.end);
    assert_eq!(host["lost"][0]["cause"], "bound_broken", "{}", t.end);
}

#[test]
fn an_agent_that_sends_a_pid_or_a_timestamp_no_host_has_ends_as_an_incomplete_host() {
    let dir = temp_dir();
    let secret = gen_secret(dir.path(), "s");
    for (misbehave, says) in [
        (
            Misbehave::Pid,
            "event #0 names pid or thread id 4194304: Linux ids are below 2^22 (PID_MAX_LIMIT)".to_string(),
        ),
        (
            Misbehave::Timestamp,
            format!("event #0 is stamped {} ns, outside the trace's window on the agent's clock (", u64::MAX - 1),
        ),
    ] {
        let (addr, agent) = fake_agent(&secret, misbehave);
        let output = dir.path().join("x.jsonl");
        let (run, _) = collect_from(&addr, &secret, &output);
        drop(agent);
        assert_eq!(run.code(), 75, "{run:?}");
        let expected = format!("host h: the agent broke a bound, its part of the trace ends here: {says}");
        assert!(run.stderr.contains(&expected), "expected {expected:?}: {run:?}");
        let t = tracer_tests::Trace::load(&output);
        assert_eq!(t.events.len(), 0, "the event was not taken: {:?}", t.events);
        assert_eq!(t.end["hosts"][0]["lost"][0]["cause"], "bound_broken", "{}", t.end);
    }
}

#[test]
fn an_agent_that_sends_output_over_the_bound_ends_as_an_incomplete_host() {
    let dir = temp_dir();
    let secret = gen_secret(dir.path(), "s");
    let (addr, agent) = fake_agent(&secret, Misbehave::LargeOutput);
    let output = dir.path().join("x.jsonl");
    let (run, _) = collect_from(&addr, &secret, &output);
    drop(agent);
    assert_eq!(run.code(), 75, "{run:?}");
    let expected = format!(
        "host h: the agent broke a bound, its part of the trace ends here: a message of the command's output holds {} bytes: an agent sends at most {MAX_CHUNK}",
        MAX_CHUNK + 1
    );
    assert!(run.stderr.contains(&expected), "expected {expected:?}: {run:?}");
    assert_eq!(run.stdout, "", "nothing of it printed");
    let t = tracer_tests::Trace::load(&output);
    assert_eq!(t.end["hosts"][0]["lost"][0]["cause"], "bound_broken", "{}", t.end);
}

/// A line that never ends is printed in pieces as it comes: the collector holds at most one
/// piece of it, not the 64 MiB.
#[test]
fn a_line_of_output_without_end_is_printed_in_pieces_and_the_collector_stays_small() {
    let dir = temp_dir();
    let secret = gen_secret(dir.path(), "s");
    let (addr, agent) = fake_agent(&secret, Misbehave::EndlessLine);
    let output = dir.path().join("x.jsonl");
    let (run, peak_kib) = collect_from(&addr, &secret, &output);
    let sent = agent.join().unwrap();
    eprintln!("collector peak {peak_kib} KiB for a line of {} MiB", sent >> 20);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let pieces: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(pieces.len(), ENDLESS / MAX_LINE);
    assert!(pieces.iter().all(|p| p.len() == 3 + MAX_LINE && p.starts_with("h: x") && p.ends_with('x')));
    // The collector itself and a few frames: far below the line's 64 MiB.
    assert!(peak_kib < 48 << 10, "the collector peaked at {peak_kib} KiB");
}
