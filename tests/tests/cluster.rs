//! Several hosts, one timeline: agents in network namespaces (made and removed by each test), a
//! collector in the root namespace, a client on one host talking TCP to a server on another.

use std::{
    collections::BTreeMap,
    io::Write as _,
    net::TcpStream,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use serde_json::Value;
use tracer_tests::{
    Trace, TracerRun, bpf_fds, fixture, gen_secret,
    netns::{AGENT_PORT, NetAgent, Network},
    process_state, temp_dir, tracer, tracer_bin, u64_field, wait_with_timeout,
};

fn secret(dir: &Path, name: &str) -> PathBuf {
    gen_secret(dir, name)
}

fn agent_arg(net: &Network, host: usize, name: &str) -> String {
    format!("{name}={}:{AGENT_PORT}", net.hosts[host].addr)
}

fn transfers<'a>(t: &'a Trace, host: &str, kind: &'a str) -> Vec<&'a Value> {
    t.of_kind(kind).filter(|e| e["host"] == host).collect()
}

fn sizes(events: &[&Value]) -> Vec<u64> {
    events.iter().map(|e| u64_field(e, "bytes")).collect()
}

/// Checks the clock correction of hosts that share one physical clock: no drift is invented and
/// the message links agree with the round trips.
fn check_clocks(t: &Trace) {
    assert!(!t.start["clock"]["source"].as_str().unwrap().contains("contradict"), "{}", t.start["clock"]);
    for h in t.start["hosts"].as_array().unwrap() {
        assert_eq!(h["drift_ppm"], 0.0, "{h}");
    }
}

/// Checks that each receive is linked to the send at the same index, and never precedes it.
fn check_links(t: &Trace, sends: &[&Value], recvs: &[&Value]) {
    assert_eq!(sends.len(), recvs.len());
    for (s, r) in sends.iter().zip(recvs) {
        assert_eq!(r["flow_ids"], Value::from(vec![s["flow_id"].clone()]), "send {s}\nrecv {r}");
        assert!(
            u64_field(r, "ts") >= u64_field(s, "ts"),
            "a receive precedes its send:\n{s}\n{r}\nclocks: {} {}",
            t.start["clock"],
            t.start["hosts"]
        );
    }
}

#[test]
fn three_hosts_one_timeline_with_cross_host_links_and_skew_removed() {
    let dir = temp_dir();
    let net = Network::new(3);
    let s = secret(dir.path(), "swordfish");
    let s = s.to_str().unwrap();
    let _a = NetAgent::start(&net, 0, "a", dir.path(), &["--secret-file", s]);
    let _b = NetAgent::start(&net, 1, "b", dir.path(), &["--secret-file", s, "--test-clock-skew-ns", "5000000"]);
    let _c = NetAgent::start(&net, 2, "c", dir.path(), &["--secret-file", s, "--test-clock-skew-ns", "-3000000"]);
    let ipc = fixture("ipc");
    let ipc = ipc.to_str().unwrap();
    let server = net.hosts[1].addr;
    let out = dir.path().join("merged.jsonl");
    let run = tracer(&[
        "collect",
        "--agent",
        &agent_arg(&net, 0, "a"),
        "--agent",
        &agent_arg(&net, 1, "b"),
        "--agent",
        &agent_arg(&net, 2, "c"),
        "--secret-file",
        s,
        "-e",
        "ipc,spawn,exit",
        "-c",
        &format!("b:sh -c '{ipc} serve {server} 7001 & {ipc} serve {server} 7002 & wait'"),
        "-c",
        &format!("a:{ipc} connect {server} 7001"),
        "-c",
        &format!("c:{ipc} connect {server} 7002"),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(run.code(), 0, "{run:?}");
    let t = Trace::load(&out);
    assert_eq!(t.lost(), 0, "{}", t.end);
    assert_eq!(t.end["reason"], "targets_exited");

    // One time order across hosts.
    let ts: Vec<u64> = t.events.iter().map(|e| u64_field(e, "ts")).collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]), "merged events are in time order");
    let hosts: BTreeMap<String, usize> = t.events.iter().fold(BTreeMap::new(), |mut m, e| {
        *m.entry(e["host"].as_str().unwrap().to_string()).or_default() += 1;
        m
    });
    assert_eq!(hosts.keys().collect::<Vec<_>>(), ["a", "b", "c"]);
    let infos = t.start["hosts"].as_array().expect("hosts in trace_start");
    for info in infos {
        assert_eq!(u64_field(info, "events") as usize, hosts[info["name"].as_str().unwrap()], "{info}");
    }

    // Exact transfers per host, and every cross-host link.
    for client in ["a", "c"] {
        let port = if client == "a" { ":7001" } else { ":7002" };
        let requests = transfers(&t, client, "send");
        let answers = transfers(&t, client, "recv");
        assert_eq!(sizes(&requests), [100; 5], "{client}");
        assert_eq!(sizes(&answers), [200; 5], "{client}");
        let served: Vec<&Value> = transfers(&t, "b", "recv")
            .into_iter()
            .filter(|r| r["channel"]["dst"].as_str().unwrap().ends_with(port))
            .collect();
        let replies: Vec<&Value> = transfers(&t, "b", "send")
            .into_iter()
            .filter(|r| r["channel"]["src"].as_str().unwrap().ends_with(port))
            .collect();
        assert_eq!(sizes(&served), [100; 5]);
        assert_eq!(sizes(&replies), [200; 5]);
        check_links(&t, &requests, &served);
        check_links(&t, &replies, &answers);
        assert!(requests.iter().all(|r| r["channel"]["dst"] == format!("{server}{port}")));
    }
    assert_eq!(t.end["ipc"]["linked_recvs"], 20);

    // The skew was found and removed: within the round trips' bound, and no looser with the links.
    check_clocks(&t);
    let info = |name: &str| infos.iter().find(|h| h["name"] == name).unwrap();
    for (name, skew) in [("a", 0i64), ("b", 5_000_000), ("c", -3_000_000)] {
        let h = info(name);
        let offset = h["offset_ns"].as_i64().unwrap();
        let bound = h["round_trip_uncertainty_ns"].as_i64().unwrap();
        assert!((offset - skew).abs() <= bound, "host {name}: offset {offset}, skew {skew}, bound {bound}");
        assert!(h["uncertainty_ns"].as_i64().unwrap() <= bound, "{h}");
    }

    // The Chrome export groups each host's processes under its name, with distinct ids.
    let chrome = dir.path().join("merged.json");
    let run = tracer(&["export", out.to_str().unwrap(), "-o", chrome.to_str().unwrap()]);
    assert_eq!(run.code(), 0, "{run:?}");
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(&chrome).unwrap()).unwrap();
    let names: Vec<(u64, String)> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| (u64_field(e, "pid"), e["args"]["name"].as_str().unwrap().to_string()))
        .collect();
    for host in ["a", "b", "c"] {
        assert!(names.iter().any(|(_, n)| n.starts_with(&format!("{host}: "))), "{names:?}");
    }
    let mut pids: Vec<u64> = names.iter().map(|(p, _)| *p).collect();
    pids.sort();
    pids.dedup();
    assert_eq!(pids.len(), names.len(), "one name per process: {names:?}");
    let arrows = trace["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "s").count();
    assert!(arrows >= 20, "{arrows} arrows");
}

#[test]
fn authentication_is_required_and_checked() {
    let dir = temp_dir();
    let net = Network::new(1);
    let good = secret(dir.path(), "swordfish");
    let wrong = secret(dir.path(), "tuna");
    let agent = NetAgent::start(&net, 0, "a", dir.path(), &["--secret-file", good.to_str().unwrap()]);
    let ipc = fixture("ipc");
    let collect = |extra: &[&str]| {
        let mut args = vec!["collect".to_string(), "--agent".into(), agent_arg(&net, 0, "a")];
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend([
            "-c".into(),
            format!("a:{} pipe", ipc.display()),
            "-o".into(),
            dir.path().join("t.jsonl").display().to_string(),
        ]);
        tracer(&args)
    };
    collect(&["--secret-file", wrong.to_str().unwrap()])
        .assert_error("agent a: authentication failed: the secrets differ (give both sides the same --secret-file)");
    collect(&[]).assert_error("agent a has a secret configured: give the collector the same --secret-file");
    let log = agent.log();
    // The agent found the wrong secret itself (the collector proves itself first).
    assert!(log.contains("authentication failed: the secrets differ"), "{log}");
    assert!(log.contains("the peer refused: authentication failed: the collector has no secret"), "{log}");
    assert!(!log.contains("started"), "nothing was traced: {log}");

    // An agent will not listen on TCP without a secret, loopback included.
    for addr in [format!("{}:7071", net.hosts[0].addr), "127.0.0.1:7071".to_string()] {
        let run = wait_with_timeout(
            net.command(0, &tracer_bin())
                .args(["agent", "--listen", &addr])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
            "agent",
        );
        run.assert_error(&format!("refusing to listen on {addr} without a secret"));
    }
    // Nor with a secret that others can read, or a short one: one sentence each.
    let readable = dir.path().join("readable");
    std::fs::write(&readable, "x".repeat(64)).unwrap();
    std::fs::set_permissions(&readable, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let short = dir.path().join("short");
    std::fs::write(&short, "swordfish\n").unwrap();
    std::fs::set_permissions(&short, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    for (file, error) in
        [(&readable, "can be read by other users (mode 644)"), (&short, "holds 9 bytes, fewer than 32")]
    {
        let file = file.to_str().unwrap();
        let expected = format!("the secret file {file} {error}");
        tracer(&["agent", "--listen", "127.0.0.1:7072", "--secret-file", file]).assert_error(&expected);
        tracer(&["collect", "--agent", "a=127.0.0.1:7072", "--secret-file", file, "-p", "a:1"]).assert_error(&expected);
    }
    // --gen-secret never overwrites.
    tracer(&["agent", "--gen-secret", good.to_str().unwrap()])
        .assert_error(&format!("cannot write the secret file {}: File exists", good.display()));
}

#[test]
fn a_dropped_link_is_resumed_without_loss_or_duplicates() {
    let dir = temp_dir();
    let net = Network::new(2);
    let s = secret(dir.path(), "swordfish");
    let s = s.to_str().unwrap();
    let agent_a = NetAgent::start(&net, 0, "a", dir.path(), &["--secret-file", s]);
    let agent_b = NetAgent::start(&net, 1, "b", dir.path(), &["--secret-file", s]);
    let ipc = fixture("ipc");
    let server = net.hosts[1].addr;
    let out = dir.path().join("merged.jsonl");
    let args: Vec<String> = [
        "collect",
        "--agent",
        &agent_arg(&net, 0, "a"),
        "--agent",
        &agent_arg(&net, 1, "b"),
        "--secret-file",
        s,
        "-e",
        "ipc,spawn,exit",
        "-c",
        &format!("b:{} serve {server} 7001", ipc.display()),
        // A request every 800 ms: host a keeps working while it is cut off.
        "-c",
        &format!("a:{} connect {server} 7001 800", ipc.display()),
        "-o",
        out.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let collector = TracerRun::spawn(&args, out.clone());
    // Cut the link once both commands run and the client has had time to connect (a fixed
    // delay from the collector's start was too short on a loaded machine: the cut came before the
    // connection, the client gave up and the server waited for it for ever).
    agent_a.wait_for_log("started");
    agent_b.wait_for_log("started");
    std::thread::sleep(Duration::from_millis(500));
    net.set_link(0, false);
    // Longer than the collector waits for a silent agent (3 s).
    std::thread::sleep(Duration::from_secs(5));
    net.set_link(0, true);
    let (run, t) = collector.finish();
    assert_eq!(run.code(), 0, "{run:?}");
    assert!(run.stderr.contains("connection to a lost"), "the drop was noticed: {run:?}");
    assert!(run.stderr.contains("reconnected to a"), "{run:?}");
    assert_eq!(t.lost(), 0, "{}", t.end);
    assert_eq!(t.end["lost_events"]["in_transit"], 0);
    let requests = transfers(&t, "a", "send");
    let answers = transfers(&t, "a", "recv");
    assert_eq!(sizes(&requests), [100; 5], "nothing lost, nothing twice");
    assert_eq!(sizes(&answers), [200; 5]);
    check_links(&t, &requests, &transfers(&t, "b", "recv"));
    check_links(&t, &transfers(&t, "b", "send"), &answers);
    check_clocks(&t);
    let a_info = t.start["hosts"].as_array().unwrap().iter().find(|h| h["name"] == "a").unwrap();
    assert_eq!(u64_field(a_info, "events") as usize, t.events.iter().filter(|e| e["host"] == "a").count());
}

#[test]
fn garbage_and_oversized_frames_close_only_their_connection() {
    let dir = temp_dir();
    let net = Network::new(1);
    let s = secret(dir.path(), "swordfish");
    let agent = NetAgent::start(&net, 0, "a", dir.path(), &["--secret-file", s.to_str().unwrap()]);
    let calls = fixture("calls");
    let out = dir.path().join("t.jsonl");
    let args: Vec<String> = [
        "collect",
        "--agent",
        &agent_arg(&net, 0, "a"),
        "--secret-file",
        s.to_str().unwrap(),
        "-f",
        "tick",
        "-c",
        &format!("a:{} loop", calls.display()),
        "-d",
        "2",
        "-o",
        out.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let collector = TracerRun::spawn(&args, out.clone());
    let addr = (net.hosts[0].addr, AGENT_PORT);
    let mut oversized = TcpStream::connect(addr).unwrap();
    oversized.write_all(&u32::MAX.to_le_bytes()).unwrap();
    let mut garbage = TcpStream::connect(addr).unwrap();
    garbage.write_all(&[5, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff]).unwrap();
    let mut truncated = TcpStream::connect(addr).unwrap();
    truncated.write_all(&[100, 0, 0, 0, 1, 2]).unwrap();
    drop(truncated);
    // Before authentication, frames of a few KiB at most: nothing is allocated for a larger one.
    agent.wait_for_log("larger than the limit (4096)");
    agent.wait_for_log("malformed frame");
    agent.wait_for_log("truncated");
    let (run, t) = collector.finish();
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.end["reason"], "duration");
    let ticks: Vec<u64> = t.calls("tick").iter().map(|c| c["args"][0].as_u64().unwrap()).collect();
    assert!(ticks.len() > 100, "the trace went on: {} ticks", ticks.len());
    assert!(ticks.windows(2).all(|w| w[1] == w[0] + 1), "and lost nothing");
    // The trace ended by its duration; the command it launched runs on (as a target does): end it.
    let target = format!("{}\0loop\0", calls.display());
    while let Some(pid) = tracer_tests::find_process(|line| line == target) {
        // SAFETY: kill(2).
        unsafe { libc::kill(pid, libc::SIGKILL) };
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_orphaned_trace_is_stopped_and_its_target_keeps_running() {
    let dir = temp_dir();
    let net = Network::new(1);
    let s = secret(dir.path(), "swordfish");
    let agent =
        NetAgent::start(&net, 0, "a", dir.path(), &["--secret-file", s.to_str().unwrap(), "--orphan-timeout", "2"]);
    let calls = fixture("calls");
    let args: Vec<String> = [
        "collect",
        "--agent",
        &agent_arg(&net, 0, "a"),
        "--secret-file",
        s.to_str().unwrap(),
        "-f",
        "tick",
        "-c",
        &format!("a:{} loop", calls.display()),
        "-o",
        dir.path().join("t.jsonl").to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let collector = TracerRun::spawn(&args, dir.path().join("t.jsonl"));
    agent.wait_for_log("trace");
    collector.kill();
    agent.wait_for_log("stopping the trace and detaching");
    agent.wait_for_log("ended");
    // The target still runs, untraced.
    let cmdline = format!("{}\0loop\0", calls.display());
    let pid = tracer_tests::find_process(|line| line == cmdline).expect("the target is still running");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    assert!(!stat.contains(") Z "), "not a zombie: {stat}");
    // SAFETY: kill(2).
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

#[test]
fn tls_protects_links_that_leave_the_machine() {
    let dir = temp_dir();
    let net = Network::new(1);
    let addr = net.hosts[0].addr;
    let cert = rcgen::generate_simple_self_signed(vec![addr.to_string()]).unwrap();
    let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.key_pair.serialize_pem()).unwrap();
    let s = secret(dir.path(), "swordfish");
    let _agent = NetAgent::start(
        &net,
        0,
        "a",
        dir.path(),
        &[
            "--secret-file",
            s.to_str().unwrap(),
            "--tls-cert",
            cert_path.to_str().unwrap(),
            "--tls-key",
            key_path.to_str().unwrap(),
        ],
    );
    let ipc = fixture("ipc");
    let out = dir.path().join("t.jsonl");
    let run = tracer(&[
        "collect",
        "--agent",
        &agent_arg(&net, 0, "a"),
        "--secret-file",
        s.to_str().unwrap(),
        "--tls-ca",
        cert_path.to_str().unwrap(),
        "-e",
        "ipc",
        "-c",
        &format!("a:{} pipe", ipc.display()),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(run.code(), 0, "{run:?}");
    let t = Trace::load(&out);
    assert_eq!(sizes(&transfers(&t, "a", "recv")), [300, 300, 300, 124]);
    // Without TLS the agent's TLS port makes no sense to the collector.
    let run = tracer(&[
        "collect",
        "--agent",
        &agent_arg(&net, 0, "a"),
        "--secret-file",
        s.to_str().unwrap(),
        "-c",
        &format!("a:{} pipe", ipc.display()),
        "-o",
        out.to_str().unwrap(),
    ]);
    run.assert_error("agent a:");
}

/// A collector that stops (SIGSTOP) keeps its connection open but sends nothing: the agent's
/// watchdog counts only the collector's frames, not the events the target keeps producing, so
/// the probes are detached after --orphan-timeout and the target runs on.
#[test]
fn a_stopped_collectors_probes_are_detached_and_its_target_keeps_running() {
    let dir = temp_dir();
    let net = Network::new(1);
    let s = secret(dir.path(), "swordfish");
    let agent =
        NetAgent::start(&net, 0, "a", dir.path(), &["--secret-file", s.to_str().unwrap(), "--orphan-timeout", "2"]);
    let calls = fixture("calls");
    let out = dir.path().join("t.jsonl");
    let args: Vec<String> = [
        "collect",
        "--agent",
        &agent_arg(&net, 0, "a"),
        "--secret-file",
        s.to_str().unwrap(),
        "-f",
        "tick",
        "-c",
        &format!("a:{} loop", calls.display()),
        "-o",
        out.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let collector = TracerRun::spawn(&args, out);
    agent.wait_for_log("started");
    let agent_pid = agent.pid();
    assert!(bpf_fds(agent_pid) > 0, "probes attached");
    let cmdline = format!("{}\0loop\0", calls.display());
    let target = tracer_tests::find_process(|line| line == cmdline).expect("the target runs") as u32;
    collector.signal(libc::SIGSTOP);
    let stopped = Instant::now();
    agent.wait_for_log("stopping the trace and detaching");
    agent.wait_for_log("ended");
    let waited = stopped.elapsed();
    assert!(waited < Duration::from_secs(8), "detached {waited:?} after the collector stopped");
    assert_eq!(bpf_fds(agent_pid), 0, "every probe, map and link is gone");
    // The target was producing events all along, and still runs, untraced.
    std::thread::sleep(Duration::from_millis(200));
    assert!(matches!(process_state(target), Some('S' | 'R')), "target state {:?}", process_state(target));
    collector.kill();
    // SAFETY: kill(2).
    unsafe { libc::kill(target as i32, libc::SIGKILL) };
}

/// A host whose agent cannot be reached again within the reconnect window is reported as
/// incomplete, per host in trace_end, on stderr, and in the exit code; so is one whose agent
/// dropped events while the collector was away.
#[test]
fn an_incomplete_trace_is_never_reported_as_complete() {
    let dir = temp_dir();
    let net = Network::new(2);
    let s = secret(dir.path(), "swordfish");
    let s = s.to_str().unwrap();
    let _a = NetAgent::start(&net, 0, "a", dir.path(), &["--secret-file", s]);
    // An outbox of 5 events: whatever is produced while the link is down beyond that is dropped.
    let agent_b = NetAgent::start(
        &net,
        1,
        "b",
        dir.path(),
        &["--secret-file", s, "--buffer-events", "5", "--buffer-bytes", "1M"],
    );
    let calls = fixture("calls");
    let out = dir.path().join("t.jsonl");
    let args: Vec<String> = [
        "collect",
        "--agent",
        &agent_arg(&net, 0, "a"),
        "--agent",
        &agent_arg(&net, 1, "b"),
        "--secret-file",
        s,
        "--reconnect-for",
        "2",
        "-f",
        "tick",
        "-c",
        &format!("a:{} loop", calls.display()),
        "-c",
        &format!("b:{} loop", calls.display()),
        "-d",
        "12",
        "-o",
        out.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let collector = TracerRun::spawn(&args, out);
    std::thread::sleep(Duration::from_millis(500));
    // a: gone for longer than the collector waits (3 s of silence, then 2 s of reconnecting);
    // b: back after 4 s, with far more than 5 ticks missed.
    net.set_link(0, false);
    net.set_link(1, false);
    std::thread::sleep(Duration::from_secs(4));
    net.set_link(1, true);
    let (run, t) = collector.finish();
    net.set_link(0, true);
    assert_eq!(run.code(), 75, "{run:?}");
    let hosts = t.end["hosts"].as_array().expect("per-host ends");
    let host = |name: &str| hosts.iter().find(|h| h["name"] == name).unwrap();
    let (a, b) = (host("a"), host("b"));
    assert_eq!(a["complete"], false, "{a}");
    assert_eq!(a["lost"][0]["cause"], "reconnect_window_used_up", "{a}");
    assert_eq!(b["complete"], false, "{b}");
    assert_eq!(b["lost"][0]["cause"], "gap", "{b}");
    assert!(u64_field(&t.end["lost_events"], "in_transit") > 0, "{}", t.end);
    assert!(
        run.stderr.contains("tracer: warning: host a: the trace is incomplete: could not reach the agent"),
        "{run:?}"
    );
    assert!(
        run.stderr.contains("tracer: warning: host b: the trace is incomplete: the agent dropped events"),
        "{run:?}"
    );
    assert!(run.stderr.contains("the trace is incomplete on 2 of 2 hosts"), "{run:?}");
    // b's own account, at its trace's end: its outbox's bounds as its command line set them, which
    // of them dropped the events (the event count, not the bytes), and the remedy for each.
    let log = agent_b.wait_for_log("the outbox dropped ");
    assert!(log.contains("(bounds: --buffer-events 5, --buffer-bytes 1.0 MiB)"), "{log}");
    let line = log.lines().find(|l| l.contains("the outbox dropped ")).unwrap();
    let words: Vec<&str> = line.split_once("the outbox dropped ").unwrap().1.split_whitespace().collect();
    let (at_events, at_bytes): (u64, u64) = (words[0].parse().unwrap(), words[5].parse().unwrap());
    assert!(at_events > 0, "{line}");
    assert_eq!(at_bytes, 0, "{line}");
    assert!(
        line.contains("a larger --buffer-events helps with the first, a larger --buffer-bytes with the second"),
        "{line}"
    );
    for target in [format!("{}\0loop\0", calls.display())] {
        while let Some(pid) = tracer_tests::find_process(|line| line == target) {
            // SAFETY: kill(2).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `collect -f` with a pattern that matches nothing on either host (the commands are `sh -c`
/// wrappers, whose execs the agents follow) and one that matches on one host only: the merged
/// `trace_end` names the first, with each host's images as `HOST:PATH`, and the collector says
/// so on stderr; the pattern one host matched is not reported.
#[test]
fn patterns_that_matched_nothing_on_any_host_are_reported_once_by_the_collector() {
    let dir = temp_dir();
    let net = Network::new(2);
    let s = secret(dir.path(), "swordfish");
    let s = s.to_str().unwrap();
    let _a = NetAgent::start(&net, 0, "a", dir.path(), &["--secret-file", s]);
    let _b = NetAgent::start(&net, 1, "b", dir.path(), &["--secret-file", s]);
    let calls = fixture("calls");
    let calls = calls.to_str().unwrap();
    let out = dir.path().join("merged.jsonl");
    let run = tracer(&[
        "collect",
        "--agent",
        &agent_arg(&net, 0, "a"),
        "--agent",
        &agent_arg(&net, 1, "b"),
        "--secret-file",
        s,
        "-f",
        "nosuchfn,fib",
        "-c",
        &format!("a:sh -c '{calls} run 0'"),
        "-c",
        "b:sh -c 'exit 0'",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(run.code(), 0, "{run:?}");
    let t = Trace::load(&out);
    tracer_tests::check_schema(&t.end).unwrap_or_else(|e| panic!("trace_end: {e}"));
    assert_eq!(t.calls("fib").len(), 177, "fib on a");
    let unmatched = &t.end["unmatched_functions"];
    assert_eq!(unmatched["patterns"], serde_json::json!(["nosuchfn"]), "{}", t.end);
    let images: Vec<&str> = unmatched["images"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(images.iter().any(|i| i.starts_with("a:") && i.ends_with("/dash")), "{images:?}");
    assert!(images.contains(&format!("a:{calls}").as_str()), "{images:?}");
    assert!(images.iter().any(|i| i.starts_with("b:") && i.ends_with("/dash")), "{images:?}");
    let said: Vec<&str> = run.stderr.lines().filter(|l| l.contains("no function matching")).collect();
    assert_eq!(said.len(), 1, "once: {run:?}");
    assert!(said[0].contains("no function matching 'nosuchfn' in any program the trace saw (a:"), "{said:?}");
}
