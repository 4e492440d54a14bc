//! IPC events in the real kernel: exact transfers, byte totals per channel, and the exact links
//! between sends and receives, for every kind of channel (tests/fixtures/c/ipc.c).

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
};

use serde_json::Value;
use tracer_tests::{Trace, TracerRun, fixture, record, temp_dir, tracer, u64_field};

/// The send and receive events of a trace, in file (time) order.
struct Transfers<'a> {
    sends: Vec<&'a Value>,
    recvs: Vec<&'a Value>,
}

fn transfers(t: &Trace) -> Transfers<'_> {
    Transfers { sends: t.of_kind("send").collect(), recvs: t.of_kind("recv").collect() }
}

fn sizes(events: &[&Value]) -> Vec<u64> {
    events.iter().map(|e| u64_field(e, "bytes")).collect()
}

fn syscalls(events: &[&Value]) -> Vec<String> {
    events.iter().map(|e| e["syscall"].as_str().unwrap().to_string()).collect()
}

/// For each receive, the indexes (into `sends`) of the sends it is linked to.
fn links(t: &Transfers) -> Vec<Vec<usize>> {
    let index: BTreeMap<u64, usize> = t.sends.iter().enumerate().map(|(i, s)| (u64_field(s, "flow_id"), i)).collect();
    t.recvs
        .iter()
        .map(|r| {
            let ids = r["flow_ids"].as_array().expect("flow_ids");
            let first = &r["flow_id"];
            assert_eq!(first, ids.first().unwrap_or(&Value::Null), "flow_id is the first of flow_ids: {r}");
            ids.iter().map(|id| index[&id.as_u64().unwrap()]).collect()
        })
        .collect()
}

/// The links a byte stream must have: sends of `send_sizes` read by receives of `recv_sizes`.
fn stream_links(send_sizes: &[u64], recv_sizes: &[u64]) -> Vec<Vec<usize>> {
    let mut bounds = Vec::new();
    let mut pos = 0;
    for s in send_sizes {
        bounds.push((pos, pos + s));
        pos += s;
    }
    let mut start = 0;
    recv_sizes
        .iter()
        .map(|r| {
            let end = start + r;
            let linked =
                bounds.iter().enumerate().filter(|(_, (a, b))| *a < end && *b > start).map(|(i, _)| i).collect();
            start = end;
            linked
        })
        .collect()
}

/// Total bytes per channel (as JSON text) and direction.
fn totals(events: &[&Value]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for e in events {
        *out.entry(e["channel"].to_string()).or_insert(0) += u64_field(e, "bytes");
    }
    out
}

fn record_ipc(mode: &[&str]) -> (Trace, tempfile::TempDir) {
    let dir = temp_dir();
    let ipc = fixture("ipc");
    let mut args = vec!["-e", "ipc,spawn,exit", "--", ipc.to_str().unwrap()];
    args.extend(mode);
    let (run, t) = record(dir.path(), &args);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.lost(), 0, "{}", t.end);
    (t, dir)
}

fn tcp(mode: &str, loopback: &str) {
    let (t, _dir) = record_ipc(&[mode]);
    let x = transfers(&t);
    let client = t.of_kind("spawn").find(|s| s["how"] == "fork").map(|s| u64_field(s, "child_pid")).unwrap();
    let (to_server, from_server): (Vec<&Value>, Vec<&Value>) =
        x.sends.iter().partition(|s| u64_field(s, "pid") == client);
    assert_eq!(sizes(&to_server), [100; 5]);
    assert_eq!(syscalls(&to_server), ["write"; 5]);
    assert_eq!(sizes(&from_server), [300]);
    assert_eq!(syscalls(&from_server), ["sendto"]);
    let (at_client, at_server): (Vec<&Value>, Vec<&Value>) =
        x.recvs.iter().partition(|r| u64_field(r, "pid") == client);
    assert_eq!(sizes(&at_server), [64, 64, 64, 64, 64, 64, 64, 52]);
    assert_eq!(sizes(&at_client), [150, 150]);
    assert_eq!(syscalls(&at_server), ["recvfrom"; 8]);

    // Both ends name the channel the same way, from the sender's view.
    let channel = &to_server[0]["channel"];
    assert_eq!(channel["type"], "tcp");
    assert!(channel["src"].as_str().unwrap().starts_with(loopback), "{channel}");
    assert!(at_server.iter().all(|r| r["channel"] == *channel), "{channel}");
    assert_eq!(from_server[0]["channel"]["src"], channel["dst"]);
    assert_eq!(from_server[0]["channel"]["dst"], channel["src"]);
    assert_eq!(totals(&x.sends), totals(&x.recvs), "bytes per channel");

    let requests = Transfers { sends: to_server, recvs: at_server };
    assert_eq!(links(&requests), stream_links(&[100; 5], &[64, 64, 64, 64, 64, 64, 64, 52]));
    let replies = Transfers { sends: from_server, recvs: at_client };
    assert_eq!(links(&replies), [vec![0], vec![0]]);
    assert_eq!(t.end["ipc"]["linked_recvs"], 10);
    assert_eq!(t.end["ipc"]["unlinked_recvs"], 0);
}

#[test]
fn tcp_over_ipv4() {
    tcp("tcp4", "127.0.0.1:");
}

#[test]
fn tcp_over_ipv6() {
    tcp("tcp6", "[::1]:");
}

#[test]
fn udp_datagrams_including_multi_message_syscalls() {
    let (t, _dir) = record_ipc(&["udp"]);
    let x = transfers(&t);
    assert_eq!(sizes(&x.sends), [10, 20, 30, 40, 11, 22, 33]);
    assert_eq!(syscalls(&x.sends), ["sendto", "sendto", "sendto", "sendto", "sendmmsg", "sendmmsg", "sendmmsg"]);
    assert_eq!(sizes(&x.recvs), [10, 20, 30, 40, 11, 22, 33]);
    assert_eq!(
        syscalls(&x.recvs),
        ["recvfrom", "recvfrom", "recvfrom", "recvfrom", "recvmmsg", "recvmmsg", "recvmmsg"]
    );
    assert_eq!(links(&x), (0..7).map(|i| vec![i]).collect::<Vec<_>>());
    let channel = &x.sends[0]["channel"];
    assert_eq!(channel["type"], "udp");
    assert!(channel["src"].as_str().unwrap().starts_with("127.0.0.1:"), "the routed source, not 0.0.0.0: {channel}");
    assert!(x.sends.iter().chain(&x.recvs).all(|e| e["channel"] == *channel));
    assert_eq!(totals(&x.sends), totals(&x.recvs));
}

#[test]
fn unix_stream_with_different_chunk_sizes() {
    let dir = temp_dir();
    let (t, _out) = record_ipc(&["unix_stream", dir.path().to_str().unwrap()]);
    let x = transfers(&t);
    assert_eq!(sizes(&x.sends), [100, 100, 100]);
    assert_eq!(syscalls(&x.sends), ["writev"; 3]);
    assert_eq!(sizes(&x.recvs), [120, 120, 60]);
    assert_eq!(syscalls(&x.recvs), ["readv"; 3]);
    assert_eq!(links(&x), stream_links(&[100, 100, 100], &[120, 120, 60]));
    assert_eq!(links(&x), [vec![0, 1], vec![1, 2], vec![2]]);
    let channel = &x.sends[0]["channel"];
    assert_eq!(channel["type"], "unix_stream");
    assert_eq!(channel["path"], dir.path().join("stream.sock").to_str().unwrap());
    assert!(x.recvs.iter().all(|r| r["channel"] == *channel));
}

#[test]
fn unix_datagrams_sent_by_path() {
    let dir = temp_dir();
    let (t, _out) = record_ipc(&["unix_dgram", dir.path().to_str().unwrap()]);
    let x = transfers(&t);
    assert_eq!(sizes(&x.sends), [5, 6, 7]);
    assert_eq!(sizes(&x.recvs), [5, 6, 7]);
    assert_eq!(syscalls(&x.recvs), ["recvmsg"; 3]);
    assert_eq!(links(&x), [vec![0], vec![1], vec![2]]);
    let path = dir.path().join("dgram.sock");
    assert!(
        x.sends
            .iter()
            .chain(&x.recvs)
            .all(|e| e["channel"]["type"] == "unix_dgram" && e["channel"]["path"] == path.to_str().unwrap())
    );
    // A named socket is known by its path at both ends.
    assert!(x.sends.iter().chain(&x.recvs).all(|e| e["channel"]["id"].is_null()));
}

#[test]
fn pipe_between_parent_and_child() {
    let (t, _dir) = record_ipc(&["pipe"]);
    let x = transfers(&t);
    assert_eq!(sizes(&x.sends), [256; 4]);
    assert_eq!(sizes(&x.recvs), [300, 300, 300, 124]);
    assert_eq!(links(&x), [vec![0, 1], vec![1, 2], vec![2, 3], vec![3]]);
    let parent = t.start["targets"][0]["pid"].as_u64().unwrap();
    assert!(x.recvs.iter().all(|r| u64_field(r, "pid") == parent));
    assert!(x.sends.iter().all(|s| u64_field(s, "pid") != parent));
    assert_eq!(x.sends[0]["channel"]["type"], "pipe");
    assert!(x.recvs.iter().all(|r| r["channel"] == x.sends[0]["channel"]));
}

#[test]
fn signals_are_linked_from_generation_to_delivery() {
    let (t, _dir) = record_ipc(&["signals"]);
    let parent = t.start["targets"][0]["pid"].as_u64().unwrap();
    let child = t.of_kind("spawn").find(|s| s["how"] == "fork").map(|s| u64_field(s, "child_pid")).unwrap();
    let signals: Vec<&Value> = t
        .of_kind("signal")
        .filter(|s| ["SIGUSR1", "SIGUSR2"].contains(&s["signal"]["name"].as_str().unwrap()))
        .collect();
    let summary: Vec<(String, bool, u64, u64, u64)> = signals
        .iter()
        .map(|s| {
            (
                s["signal"]["name"].as_str().unwrap().to_string(),
                s["delivered"] == true,
                u64_field(s, "sender_pid"),
                u64_field(s, "target_pid"),
                u64_field(s, "pid"),
            )
        })
        .collect();
    let usr1 = |delivered, at| ("SIGUSR1".to_string(), delivered, parent, child, at);
    assert_eq!(
        summary,
        [
            usr1(false, parent),
            usr1(true, child),
            usr1(false, parent),
            usr1(true, child),
            ("SIGUSR2".to_string(), false, child, parent, child),
            ("SIGUSR2".to_string(), true, child, parent, parent),
        ]
    );
    assert_eq!(signals[0]["signal"]["number"], 10);
    // Each generation shares its flow id with its delivery, and the ids differ.
    let flows: Vec<u64> = signals.iter().map(|s| u64_field(s, "flow_id")).collect();
    assert_eq!((flows[0], flows[2], flows[4]), (flows[1], flows[3], flows[5]));
    assert!(flows[0] != flows[2] && flows[2] != flows[4]);
    assert_eq!(t.end["ipc"]["linked_signals"], 3);
}

#[test]
fn regular_files_are_not_ipc() {
    let dir = temp_dir();
    let (t, _out) = record_ipc(&["files", dir.path().to_str().unwrap()]);
    assert_eq!(t.of_kind("send").count() + t.of_kind("recv").count(), 0, "{:?}", t.events);
}

#[test]
fn only_traced_processes_produce_ipc_events() {
    let dir = temp_dir();
    let ipc = fixture("ipc");
    let (run, t) = record(dir.path(), &["--no-follow", "-e", "ipc", "--", ipc.to_str().unwrap(), "pipe"]);
    assert_eq!(run.code(), 0, "{run:?}");
    let x = transfers(&t);
    assert!(x.sends.is_empty(), "the writing child is not traced");
    assert_eq!(sizes(&x.recvs), [300, 300, 300, 124]);
    assert!(links(&x).iter().all(Vec::is_empty));
    assert_eq!(t.end["ipc"]["unlinked_recvs"], 4);
}

/// A stream holding 300 unread bytes when tracing starts: positions count from them.
fn backlog(kind: &str) {
    let dir = temp_dir();
    let mut fixture =
        Command::new(fixture("ipc")).args(["backlog", kind]).stdout(Stdio::piped()).spawn().expect("start fixture");
    let mut line = String::new();
    BufReader::new(fixture.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let pids: Vec<&str> = line.split_whitespace().skip(1).collect();
    let (parent, child) = (pids[0].to_string(), pids[1].to_string());
    let tracer = TracerRun::start(dir.path(), &["-e", "ipc", "-p", &parent, "-p", &child]);
    // SAFETY: kill(2).
    assert_eq!(unsafe { libc::kill(child.parse().unwrap(), libc::SIGUSR1) }, 0);
    let (run, t) = tracer.finish();
    assert!(fixture.wait().unwrap().success());
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.end["reason"], "targets_exited");
    let x = transfers(&t);
    assert_eq!(sizes(&x.sends), [100, 100]);
    assert_eq!(sizes(&x.recvs), [50; 10]);
    // The first 300 bytes were written before tracing: their receives link to nothing.
    let seqs: Vec<u64> = x.sends.iter().map(|s| u64_field(s, "seq")).collect();
    assert_eq!(seqs, [300, 400]);
    assert_eq!(links(&x), [vec![], vec![], vec![], vec![], vec![], vec![], vec![0], vec![0], vec![1], vec![1]]);
}

#[test]
fn a_pipe_that_held_data_before_tracing_started() {
    backlog("pipe");
}

#[test]
fn a_unix_stream_that_held_data_before_tracing_started() {
    backlog("unix");
}

#[test]
fn chrome_export_draws_an_arrow_per_link() {
    let dir = temp_dir();
    let out = dir.path().join("trace.json");
    let ipc = fixture("ipc");
    let run = tracer(&["record", "-e", "ipc", "-o", out.to_str().unwrap(), "--", ipc.to_str().unwrap(), "pipe"]);
    assert_eq!(run.code(), 0, "{run:?}");
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let starts: Vec<&Value> = events.iter().filter(|e| e["ph"] == "s").collect();
    let finishes: Vec<&Value> = events.iter().filter(|e| e["ph"] == "f").collect();
    // Pipe links: [0,1], [1,2], [2,3], [3]: seven arrows.
    assert_eq!(starts.len(), 7);
    assert_eq!(finishes.len(), 7);
    for s in &starts {
        let f = finishes.iter().find(|f| f["id"] == s["id"]).expect("every arrow ends");
        assert!(f["ts"].as_f64().unwrap() >= s["ts"].as_f64().unwrap(), "arrows go forward in time");
        assert_eq!(f["bp"], "e");
    }
    let count = |cat: &str| events.iter().filter(|e| e["ph"] == "X" && e["cat"] == cat).count();
    assert_eq!((count("send"), count("recv")), (4, 4));
}

/// `MSG_PEEK` and `MSG_TRUNC` (`ipc peek`): a peek is an event of its own, linked to nothing and
/// counted in no total, and the read after it is linked to its send as if there were no peek; a
/// datagram cut by `MSG_TRUNC` counts what the program got. The report counts each byte once and
/// the capture holds each message once.
#[test]
fn peeks_are_not_receives_and_truncated_datagrams_count_what_was_received() {
    let dir = temp_dir();
    let ipc = fixture("ipc");
    let sock_dir = temp_dir();
    let (run, t) = record(
        dir.path(),
        &["-e", "ipc,spawn,exit", "--", ipc.to_str().unwrap(), "peek", sock_dir.path().to_str().unwrap()],
    );
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.lost(), 0, "{}", t.end);
    let x = transfers(&t);
    let server = u64_field(&t.start["targets"][0], "pid");
    assert_eq!(sizes(&x.sends), [200, 120, 100, 30]);
    assert!(x.recvs.iter().all(|r| u64_field(r, "pid") == server));
    let peek: Vec<bool> = x.recvs.iter().map(|r| r["peek"] == true).collect();
    assert_eq!(peek, [true, false, true, false, true, false, false], "{:?}", x.recvs);
    assert_eq!(sizes(&x.recvs), [50, 200, 40, 120, 64, 40, 16]);
    assert_eq!(syscalls(&x.recvs), ["recvfrom", "recvfrom", "recvmsg", "read", "recvmmsg", "recvfrom", "recvmsg"]);
    let discarded: Vec<Option<u64>> = x.recvs.iter().map(|r| r.get("discarded").and_then(Value::as_u64)).collect();
    assert_eq!(discarded, [None, None, None, None, None, Some(60), Some(14)]);
    // Peeks are linked to nothing and hold no place in the stream; each read after one is
    // linked to its whole send, datagrams cut by MSG_TRUNC too.
    assert_eq!(links(&x), [vec![], vec![0], vec![], vec![1], vec![], vec![2], vec![3]]);
    assert!(x.recvs.iter().filter(|r| r["peek"] == true).all(|r| r["seq"].is_null()), "{:?}", x.recvs);
    assert_eq!(t.end["ipc"]["linked_recvs"], 4);
    assert_eq!(t.end["ipc"]["unlinked_recvs"], 0);
    assert_eq!(t.end["ipc"]["recvs"], 4);

    // The report counts what the server received once: 200 + 120 + 40 + 16.
    let jsonl = dir.path().join("trace.jsonl");
    let report = tracer(&["report", jsonl.to_str().unwrap(), "--by-process", "--json"]);
    assert_eq!(report.code(), 0, "{report:?}");
    let report: Value = serde_json::from_str(&report.stdout).unwrap();
    let process = report["processes"].as_array().unwrap().iter().find(|p| u64_field(p, "pid") == server).unwrap();
    assert_eq!(u64_field(process, "bytes_received"), 376, "{process}");

    // The capture holds each message once, as its send: no segment for a peek.
    let pcap = dir.path().join("trace.pcapng");
    let export = tracer(&["export", jsonl.to_str().unwrap(), "-o", pcap.to_str().unwrap()]);
    assert_eq!(export.code(), 0, "{export:?}");
    let tshark = |filter: &str, field: &str| -> Vec<String> {
        let out = Command::new("tshark")
            .arg("-r")
            .arg(&pcap)
            .args(["-Y", filter, "-T", "fields", "-e", field])
            .output()
            .expect("run tshark (installed by `cargo xtask setup`)");
        assert!(out.status.success(), "tshark: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect()
    };
    assert_eq!(tshark("tcp", "tcp.len"), ["200"]);
    assert_eq!(tshark("udp", "udp.length"), ["108", "38"]);
    assert_eq!(tshark("frame", "frame.number").len(), 4);
}
