//! pcapng captures read back by Wireshark's own reader (`tshark`): HTTP dissected with the right
//! ports, a TCP stream reassembled to the exact bytes sent, UDP datagrams with their sizes, pids
//! in the packet comments, Unix sockets, pipes and the other events on their own link types.

use std::{path::Path, process::Command};

use serde_json::Value;
use tracer_tests::{Trace, fixture, record, temp_dir, tracer, u64_field};

const REQUEST: &[u8] = b"GET /index.html HTTP/1.1\r\nHost: localhost\r\nUser-Agent: ipc-fixture\r\n\r\n";
const RESPONSE: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 12\r\nConnection: close\r\n\r\nhello, pcap\n";

/// Records an `ipc` fixture mode as JSON lines and exports it as pcapng (`extra`: export flags).
fn capture(dir: &Path, record_args: &[&str], mode: &[&str], extra: &[&str]) -> (Trace, std::path::PathBuf) {
    let ipc = fixture("ipc");
    let mut args = vec!["-e", "ipc,spawn,exit"];
    args.extend(record_args);
    args.extend(["--", ipc.to_str().unwrap()]);
    args.extend(mode);
    let (run, t) = record(dir, &args);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.lost(), 0, "{}", t.end);
    let pcap = dir.join("trace.pcapng");
    let jsonl = dir.join("trace.jsonl");
    let mut export = vec!["export", jsonl.to_str().unwrap(), "-o", pcap.to_str().unwrap()];
    export.extend(extra);
    let run = tracer(&export);
    assert_eq!(run.code(), 0, "{run:?}");
    (t, pcap)
}

/// `tshark -r FILE ARGS`: its standard output, one string per line.
fn tshark(file: &Path, args: &[&str]) -> Vec<String> {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args(args)
        .output()
        .expect("run tshark (installed by `cargo xtask setup`)");
    assert!(out.status.success(), "tshark {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect()
}

fn fields(file: &Path, filter: &str, names: &[&str]) -> Vec<Vec<String>> {
    let mut args = vec!["-Y", filter, "-T", "fields", "-E", "separator=|"];
    for n in names {
        args.extend(["-e", n]);
    }
    tshark(file, &args).iter().map(|l| l.split('|').map(str::to_string).collect()).collect()
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}

fn port(addr: &Value) -> String {
    addr.as_str().unwrap().rsplit(':').next().unwrap().to_string()
}

#[test]
fn http_is_dissected_with_its_ports_and_the_stream_reassembles_exactly() {
    let dir = temp_dir();
    let (t, pcap) = capture(dir.path(), &["--capture-bytes", "4096"], &["http"], &[]);
    let sends: Vec<&Value> = t.of_kind("send").collect();
    assert_eq!(sends.len(), 2);
    let (client, server) = (u64_field(sends[0], "pid"), u64_field(sends[1], "pid"));
    let channel = &sends[0]["channel"];
    let (client_port, server_port) = (port(&channel["src"]), port(&channel["dst"]));

    let http = fields(
        &pcap,
        "http",
        &[
            "tcp.srcport",
            "tcp.dstport",
            "http.request.method",
            "http.request.uri",
            "http.response.code",
            "frame.comment",
        ],
    );
    assert_eq!(http.len(), 2, "{http:?}");
    assert_eq!(http[0][..5], [&client_port, &server_port, "GET", "/index.html", ""]);
    assert_eq!(http[1][..5], [&server_port, &client_port, "", "", "200"]);
    assert!(http[0][5].contains(&format!(" pid={client} ")), "{http:?}");
    assert!(http[1][5].contains(&format!(" pid={server} ")), "{http:?}");
    assert!(http[0][5].contains(&format!("flow={}", u64_field(sends[0], "flow_id"))), "{http:?}");

    // Each direction once: two packets, not four (the receives were linked to traced sends).
    assert_eq!(tshark(&pcap, &[]).len(), 2);
    let follow = tshark(&pcap, &["-q", "-z", "follow,tcp,raw,0"]);
    let (mut to_server, mut to_client) = (Vec::new(), Vec::new());
    for line in follow.iter().skip_while(|l| !l.starts_with("Node 1:")).skip(1) {
        if line.starts_with("====") {
            break;
        }
        match line.strip_prefix('\t') {
            Some(h) => to_client.extend(hex(h.trim())),
            None => to_server.extend(hex(line.trim())),
        }
    }
    assert_eq!(to_server, REQUEST, "{follow:?}");
    assert_eq!(to_client, RESPONSE, "{follow:?}");
}

#[test]
fn udp_datagrams_keep_their_sizes_and_cut_payloads_their_original_length() {
    let dir = temp_dir();
    let (t, pcap) = capture(dir.path(), &["--capture-bytes", "16"], &["udp"], &[]);
    let rows = fields(&pcap, "udp", &["udp.length", "udp.dstport", "frame.len", "frame.cap_len", "frame.comment"]);
    let sizes = [10u64, 20, 30, 40, 11, 22, 33];
    assert_eq!(rows.len(), sizes.len(), "{rows:?}");
    let sender = u64_field(t.of_kind("send").next().unwrap(), "pid");
    let dst = port(&t.of_kind("send").next().unwrap()["channel"]["dst"]);
    // Ethernet 14 + IPv4 20 + UDP 8 headers, then the datagram (at most 16 bytes of it captured).
    for (row, size) in rows.iter().zip(sizes) {
        assert_eq!(row[0], (8 + size).to_string());
        assert_eq!(row[1], dst);
        assert_eq!(row[2], (42 + size).to_string());
        assert_eq!(row[3], (42 + size.min(16)).to_string());
        assert!(row[4].contains(&format!(" pid={sender} ")), "{row:?}");
    }
}

#[test]
fn pipes_and_other_events_have_their_own_link_types_in_time_order() {
    let dir = temp_dir();
    let (t, pcap) = capture(dir.path(), &["--capture-bytes", "8"], &["pipe"], &["--pcap-events"]);
    let rows = fields(&pcap, "frame", &["frame.interface_name", "frame.time_epoch", "frame.comment"]);
    let host = t.start["host"].as_str().unwrap().to_string();
    let pipe: Vec<&Vec<String>> = rows.iter().filter(|r| r[0] == format!("{host}/unix+pipes")).collect();
    let events: Vec<&Vec<String>> = rows.iter().filter(|r| r[0] == format!("{host}/events")).collect();
    // Four writes (the reads are linked to them), and every spawn, exit and signal (SIGCHLD).
    assert_eq!(pipe.len(), 4, "{rows:?}");
    let others = ["spawn", "exit", "signal"].iter().map(|k| t.of_kind(k).count()).sum::<usize>();
    assert!(t.of_kind("signal").count() >= 1);
    assert_eq!(events.len(), others, "{rows:?}");
    assert_eq!(rows.len(), 4 + others);
    let times: Vec<f64> = rows.iter().map(|r| r[1].parse().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    let writer = u64_field(t.of_kind("send").next().unwrap(), "pid");
    assert!(pipe.iter().all(|r| r[2].contains(&format!(" pid={writer} "))), "{pipe:?}");
    // The packet: the channel as JSON, a newline, the captured bytes.
    let data = tshark(&pcap, &["-T", "fields", "-e", "data.data"]);
    let id = u64_field(&t.of_kind("send").next().unwrap()["channel"], "id");
    let channel = format!(r#"{{"type":"pipe","id":{id}}}"#);
    let expected = format!("{channel}\npppppppp").bytes().map(|b| format!("{b:02x}")).collect::<String>();
    assert_eq!(data.iter().filter(|d| **d == expected).count(), 4, "{data:?} vs {expected}");
}

#[test]
fn record_writes_pcapng_by_extension() {
    let dir = temp_dir();
    let ipc = fixture("ipc");
    let pcap = dir.path().join("direct.pcapng");
    let run = tracer(&[
        "record",
        "-e",
        "ipc",
        "--capture-bytes",
        "4096",
        "-o",
        pcap.to_str().unwrap(),
        "--",
        ipc.to_str().unwrap(),
        "http",
    ]);
    assert_eq!(run.code(), 0, "{run:?}");
    let http = fields(&pcap, "http", &["http.request.method", "http.response.code"]);
    assert_eq!(http, [vec!["GET".to_string(), String::new()], vec![String::new(), "200".to_string()]]);
}

/// `collect` captures through an agent and writes the capture itself: the payloads travel the
/// wire, and the host's interface is named for the host.
#[test]
fn collect_captures_through_an_agent_and_writes_pcapng() {
    let dir = temp_dir();
    let agent = tracer_tests::LocalAgent::start(dir.path(), "web", &["--allow-commands"]);
    let pcap = dir.path().join("c.pcapng");
    let command = format!("web:{} http", fixture("ipc").display());
    let run = tracer(&[
        "collect",
        "--agent",
        &agent.spec("web"),
        "-e",
        "ipc,spawn,exit",
        "--capture-bytes",
        "4096",
        "-c",
        &command,
        "-o",
        pcap.to_str().unwrap(),
    ]);
    assert_eq!(run.code(), 0, "{run:?}");
    let http = fields(&pcap, "http", &["http.request.method", "http.response.code", "frame.comment"]);
    assert_eq!(http.len(), 2, "{http:?}");
    assert_eq!(http[0][..2], ["GET", ""]);
    assert_eq!(http[1][..2], ["", "200"]);
    assert!(http.iter().all(|row| row[2].contains("host=web ")), "{http:?}");
    let interfaces = tshark(&pcap, &["-T", "fields", "-e", "frame.interface_name"]);
    assert!(interfaces.iter().all(|name| name == "web"), "{interfaces:?}");
}
