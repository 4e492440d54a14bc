//! The library API of multi-host tracing (`tracer_user::cluster::collector`), driven from Rust
//! against a real agent on loopback tracing a real fixture.

use std::{
    os::unix::process::CommandExt as _,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};
use tracer_user::event::data;

use serde_json::Value;
use tracer_tests::{Background, LocalAgent, fixture, temp_dir};
use tracer_user::{
    cluster::{
        collector::{AgentSpec, ClientOptions, Cluster, connect_session},
        protocol::{Message, TraceRequest},
    },
    event::{Event, EventData},
};

fn spec(agent: &LocalAgent, name: &str) -> AgentSpec {
    agent.spec(name).parse().unwrap()
}

fn is_call_of(e: &Event, name: &str) -> bool {
    matches!(&e.data, EventData::Call(data::Call { function, .. }) if &**function == name)
}

fn is_return_of(e: &Event, name: &str) -> bool {
    matches!(&e.data, EventData::Return(data::Return { function, .. }) if &**function == name)
}

#[tokio::test]
async fn trace_a_command_then_follow_a_trace_live() {
    let dir = temp_dir();
    let agent = LocalAgent::start(dir.path(), "lib", &["--allow-commands"]);
    let cluster = Cluster::connect(vec![spec(&agent, "lib")], ClientOptions::default()).await.expect("connect");
    assert_eq!(cluster.agents(), ["lib"]);
    let calls = fixture("calls").display().to_string();
    let request = TraceRequest { functions: vec!["fib".into()], ..Default::default() };

    // One command on one host: its exit status and the events it caused. The fixture exits with
    // the code it is given and calls fib 177 times.
    let (status, events) = cluster
        .trace_command("lib", vec![calls.clone(), "run".into(), "3".into()], request.clone())
        .await
        .expect("trace_command");
    assert_eq!(status, Some(3));
    assert_eq!(events.iter().filter(|e| is_call_of(e, "fib")).count(), 177);
    assert_eq!(events.iter().filter(|e| is_return_of(e, "fib")).count(), 177);
    assert!(events.iter().all(|e| &*e.host == "lib"));

    // A trace on every agent, followed live by a channel and a callback, both subscribed after
    // the start: each sees every event exactly once.
    let trace = cluster
        .start_all(TraceRequest { command: vec![calls, "run".into(), "0".into()], ..request })
        .await
        .expect("start_all");
    let mut live = trace.subscribe();
    let seen = Arc::new(AtomicUsize::new(0));
    let fib_seen = Arc::new(AtomicUsize::new(0));
    let callback = trace.on_event({
        let (seen, fib_seen) = (seen.clone(), fib_seen.clone());
        move |e| {
            seen.fetch_add(1, Ordering::Relaxed);
            if is_call_of(e, "fib") {
                fib_seen.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    trace.finished().await;
    let so_far = trace.events_so_far().len();
    let merged = trace.stop().await.expect("stop");
    assert_eq!(merged.end.total_lost(), 0);
    assert_eq!(merged.events.iter().filter(|e| is_call_of(e, "fib")).count(), 177);
    assert_eq!(so_far, merged.events.len());
    // Stopping closes the subscriptions, so these end.
    let mut live_events = Vec::new();
    while let Some(e) = live.recv().await {
        live_events.push(e);
    }
    callback.join().expect("callback thread");
    assert_eq!(live_events.len(), merged.events.len());
    assert_eq!(live_events.iter().filter(|e| is_call_of(e, "fib")).count(), 177);
    assert_eq!(seen.load(Ordering::Relaxed), merged.events.len());
    assert_eq!(fib_seen.load(Ordering::Relaxed), 177);

    // The Chrome export of the merged trace: a slice per call, in the host's process group.
    let path = dir.path().join("merged.json");
    merged.export_chrome(&path).expect("export");
    let chrome: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let slices = chrome["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X" && e["name"] == "fib");
    assert_eq!(slices.count(), 177);
}

/// While a trace runs, each host's stream spills to a file in a private directory (mode 0700)
/// where the collector was told; the directory is gone once the trace is.
#[tokio::test]
async fn the_spill_directory_is_private_and_removed_after_the_run() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = temp_dir();
    let agent = LocalAgent::start(dir.path(), "h", &["--allow-commands"]);
    let spill_in = dir.path().join("spill-here");
    std::fs::create_dir(&spill_in).unwrap();
    let options = ClientOptions { spill_in: Some(spill_in.clone()), ..Default::default() };
    let cluster = Cluster::connect(vec![spec(&agent, "h")], options).await.expect("connect");
    let calls = fixture("calls").display().to_string();
    let request = TraceRequest {
        functions: vec!["fib".into()],
        command: vec![calls, "run".into(), "0".into()],
        ..Default::default()
    };
    let trace = cluster.start_all(request).await.expect("start");
    let spill = trace.spill_dir().to_path_buf();
    assert_eq!(spill.parent(), Some(spill_in.as_path()));
    assert_eq!(std::fs::metadata(&spill).unwrap().permissions().mode() & 0o777, 0o700, "{}", spill.display());
    trace.finished().await;
    let so_far = trace.events_so_far();
    let files: Vec<String> =
        std::fs::read_dir(&spill).unwrap().map(|f| f.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(files, ["host-0.trc"]);
    let bytes = std::fs::metadata(spill.join("host-0.trc")).unwrap().len();
    assert!(bytes > 0 && (bytes as usize) < 40 * so_far.len(), "{bytes} bytes for {} events", so_far.len());
    let merged = trace.stop().await.expect("stop");
    assert_eq!(merged.events.iter().filter(|e| is_call_of(e, "fib")).count(), 177);
    assert_eq!(merged.events.len(), so_far.len());
    drop(trace);
    assert!(!spill.exists(), "{} is left behind", spill.display());
    assert_eq!(std::fs::read_dir(&spill_in).unwrap().count(), 0);
}

/// Receives messages for a while; returns them.
async fn receive_for(session: &mut tracer_user::cluster::session::Session, how_long: Duration) -> Vec<Message> {
    let mut got = Vec::new();
    while let Ok(Ok(m)) = tokio::time::timeout(how_long, session.reader.recv()).await {
        got.push(m);
    }
    got
}

/// A second collector, authenticated on the same agent, can neither receive, resume nor stop the
/// first one's trace, whose events all reach the first collector.
#[tokio::test]
async fn one_trace_per_connection() {
    let dir = temp_dir();
    let agent = LocalAgent::start(dir.path(), "h", &[]);
    let target = Background::start(&fixture("calls"), &["loop"]);
    let first = Cluster::connect(vec![spec(&agent, "h")], ClientOptions::default()).await.expect("connect");
    let request = TraceRequest { pids: vec![target.pid()], functions: vec!["tick".into()], ..Default::default() };
    let trace = first.start_all(request.clone()).await.expect("start");
    let id = trace.id();

    let mut second = connect_session(&spec(&agent, "h"), &ClientOptions::default()).await.expect("second");
    for attack in [
        Message::Resume { trace_id: id, next_seq: 0, proof: [0; 32] },
        Message::Stop { trace_id: id },
        Message::Ack { next_seq: u64::MAX },
        Message::Start { trace_id: id, request: Box::new(request.clone()) },
    ] {
        second.writer.send(&attack).await.unwrap();
    }
    let answers = receive_for(&mut second, Duration::from_millis(1500)).await;
    let failures: Vec<String> = answers
        .iter()
        .filter_map(|m| match m {
            Message::Failed { error, .. } => Some(error.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        failures,
        [
            format!("this agent has no trace {id} that this collector can resume"),
            format!("trace {id} is not this connection's"),
            "a trace is already running on this agent".to_string(),
        ],
        "{answers:?}"
    );
    assert!(answers.iter().all(|m| matches!(m, Message::Failed { .. })), "no events for the second: {answers:?}");

    // The first collector's trace went on, whole.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let merged = trace.stop().await.expect("stop");
    let ticks: Vec<u64> = merged
        .events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::Call(data::Call { function, args, .. }) if &**function == "tick" => Some(args[0]),
            _ => None,
        })
        .collect();
    assert!(ticks.len() > 200, "{} ticks", ticks.len());
    assert!(ticks.windows(2).all(|w| w[1] == w[0] + 1), "nothing was acknowledged away or lost");
    assert!(merged.end.hosts[0].complete, "{:?}", merged.end.hosts);
}

/// Out of file descriptors, `accept` fails: the agent backs off instead of spinning, frees the
/// place of the oldest unauthenticated peer, and a collector still gets in.
#[tokio::test]
async fn accept_failures_back_off_and_a_collector_still_gets_in() {
    let dir = temp_dir();
    let agent = LocalAgent::start_with(dir.path(), "h", &[], |command| {
        // SAFETY: setrlimit is async-signal-safe.
        unsafe {
            command.pre_exec(|| {
                let limit = libc::rlimit { rlim_cur: 24, rlim_max: 24 };
                libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
                Ok(())
            });
        }
    });
    let cpu = |pid: u32| -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let fields: Vec<u64> =
            stat.rsplit_once(") ").unwrap().1.split(' ').skip(11).take(2).map(|f| f.parse().unwrap()).collect();
        fields[0] + fields[1]
    };
    let flood: Vec<std::os::unix::net::UnixStream> =
        (0..100).filter_map(|_| std::os::unix::net::UnixStream::connect(&agent.socket).ok()).collect();
    agent.wait_for_log("accept failed (Too many open files");
    let before = cpu(agent.pid());
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Clock ticks (1/100 s): spinning on accept would burn most of the two seconds.
    let spent = cpu(agent.pid()) - before;
    assert!(spent < 50, "the agent used {spent} ticks of CPU in 2 s while out of descriptors");
    let mut session =
        connect_session(&spec(&agent, "h"), &ClientOptions::default()).await.expect("a collector gets in");
    session.writer.send(&Message::ClockProbe { id: 1 }).await.unwrap();
    assert!(matches!(session.reader.recv().await.unwrap(), Message::ClockEcho { id: 1, .. }));
    drop(flood);
}

/// The agent bounds what a collector asks of it with the rules `record` applies: a capture
/// larger than the kernel programs' limit is refused, and nothing is traced.
#[tokio::test]
async fn an_agent_refuses_a_capture_beyond_the_limit() {
    let dir = temp_dir();
    let agent = LocalAgent::start(dir.path(), "cap", &[]);
    let cluster = Cluster::connect(vec![spec(&agent, "cap")], ClientOptions::default()).await.expect("connect");
    let request = TraceRequest {
        pids: vec![std::process::id()],
        events: vec!["ipc".into()],
        capture_bytes: 1 << 20,
        ..Default::default()
    };
    let error = cluster.start_all(request).await.err().expect("refused").to_string();
    assert!(error.contains("--capture-bytes is at most 4096, got 1048576"), "{error}");
    assert!(!agent.log().contains("started"), "nothing was traced: {}", agent.log());
}

/// The string size of a request is bounded like `--string-size`: zero and beyond the kernel
/// programs' 4096 are refused from the network with one sentence, and nothing is traced.
#[tokio::test]
async fn an_agent_refuses_a_string_size_out_of_range() {
    let dir = temp_dir();
    let agent = LocalAgent::start(dir.path(), "str", &[]);
    for size in [0u16, 4097, u16::MAX] {
        let cluster = Cluster::connect(vec![spec(&agent, "str")], ClientOptions::default()).await.expect("connect");
        let request = TraceRequest {
            pids: vec![std::process::id()],
            functions: vec!["main".into()],
            string_size: size,
            ..Default::default()
        };
        let error = cluster.start_all(request).await.err().expect("refused").to_string();
        assert!(error.contains(&format!("--string-size must be between 1 and 4096, got {size}")), "{error}");
    }
    assert!(!agent.log().contains("started"), "nothing was traced: {}", agent.log());
}
