//! The library API of multi-host tracing (`tracer_user::cluster::collector`), driven from Rust
//! against a real agent on loopback tracing a real fixture.

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use serde_json::Value;
use tracer_tests::{fixture, temp_dir, tracer_bin};
use tracer_user::{
    cluster::{
        collector::{AgentSpec, ClientOptions, Cluster},
        protocol::TraceRequest,
    },
    event::{Event, EventData},
};

/// `tracer agent` on a free loopback port, stopped on drop.
struct LoopbackAgent {
    child: Child,
    addr: String,
}

impl LoopbackAgent {
    fn start(name: &str) -> LoopbackAgent {
        let mut child = Command::new(tracer_bin())
            .args(["agent", "--listen", "127.0.0.1:0", "--name", name])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start agent");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while !line.contains("listening on ") {
            line.clear();
            assert!(stderr.read_line(&mut line).unwrap() > 0, "the agent exited before listening");
        }
        // "tracer agent: listening on 127.0.0.1:PORT as NAME"
        let addr = line.split("listening on ").nth(1).unwrap().split(' ').next().unwrap().to_string();
        // Keep reading the agent's log so that it never blocks on a full pipe.
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        LoopbackAgent { child, addr }
    }

    fn spec(&self, name: &str) -> AgentSpec {
        format!("{name}={}", self.addr).parse().unwrap()
    }
}

impl Drop for LoopbackAgent {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

fn is_call_of(e: &Event, name: &str) -> bool {
    matches!(&e.data, EventData::Call { function, .. } if &**function == name)
}

fn is_return_of(e: &Event, name: &str) -> bool {
    matches!(&e.data, EventData::Return { function, .. } if &**function == name)
}

#[tokio::test]
async fn trace_a_command_then_follow_a_trace_live() {
    let agent = LoopbackAgent::start("lib");
    let cluster = Cluster::connect(vec![agent.spec("lib")], ClientOptions::default()).await.expect("connect");
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
    let dir = temp_dir();
    let path = dir.path().join("merged.json");
    merged.export_chrome(&path).expect("export");
    let chrome: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let slices = chrome["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X" && e["name"] == "fib");
    assert_eq!(slices.count(), 177);
}
