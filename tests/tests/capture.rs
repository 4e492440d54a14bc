//! `--capture-bytes`: the first bytes of every traced send and receive, copied in the kernel,
//! checked byte for byte against the fixture's known messages (tests/fixtures/c/ipc.c).

use base64::Engine as _;
use serde_json::Value;
use tracer_tests::{Trace, fixture, record, temp_dir, tracer, u64_field};

fn record_ipc(capture: &str, mode: &[&str]) -> (Trace, tempfile::TempDir) {
    let dir = temp_dir();
    let ipc = fixture("ipc");
    let mut args = vec!["-e", "ipc,spawn,exit", "--capture-bytes", capture, "--", ipc.to_str().unwrap()];
    args.extend(mode);
    let (run, t) = record(dir.path(), &args);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.lost(), 0, "{}", t.end);
    (t, dir)
}

/// The payload of a send or receive, decoded, and whether it was cut.
fn payload(e: &Value) -> (Vec<u8>, bool) {
    let text = e["payload"].as_str().unwrap_or_else(|| panic!("no payload: {e}"));
    let bytes = base64::engine::general_purpose::STANDARD.decode(text).expect("base64 payload");
    (bytes, e["payload_truncated"].as_bool().unwrap_or(false))
}

fn payloads<'a>(t: &'a Trace, kind: &'a str) -> Vec<(Vec<u8>, bool)> {
    t.of_kind(kind).map(payload).collect()
}

fn repeat(byte: u8, n: usize) -> Vec<u8> {
    vec![byte; n]
}

#[test]
fn udp_datagrams_are_captured_whole_including_multi_message_syscalls() {
    let (t, _dir) = record_ipc("100", &["udp"]);
    let expected: Vec<(Vec<u8>, bool)> =
        [(b'b', 10), (b'c', 20), (b'd', 30), (b'e', 40), (b'A', 11), (b'B', 22), (b'C', 33)]
            .into_iter()
            .map(|(byte, n)| (repeat(byte, n), false))
            .collect();
    assert_eq!(payloads(&t, "send"), expected);
    assert_eq!(payloads(&t, "recv"), expected);
}

#[test]
fn tcp_stream_payloads_are_cut_at_the_limit_and_say_so() {
    let (t, _dir) = record_ipc("64", &["tcp4"]);
    let client = t.of_kind("spawn").find(|s| s["how"] == "fork").map(|s| u64_field(s, "child_pid")).unwrap();
    let (to_server, from_server): (Vec<&Value>, Vec<&Value>) =
        t.of_kind("send").partition(|s| u64_field(s, "pid") == client);
    assert!(to_server.iter().all(|s| payload(s) == (repeat(b'c', 64), true)), "{to_server:?}");
    assert_eq!(from_server.iter().map(|s| payload(s)).collect::<Vec<_>>(), [(repeat(b's', 64), true)]);
    let (at_client, at_server): (Vec<&Value>, Vec<&Value>) =
        t.of_kind("recv").partition(|r| u64_field(r, "pid") == client);
    // The server reads 7 x 64 + 52: each whole; the client reads 2 x 150: cut at 64.
    let mut expected = vec![(repeat(b'c', 64), false); 7];
    expected.push((repeat(b'c', 52), false));
    assert_eq!(at_server.iter().map(|r| payload(r)).collect::<Vec<_>>(), expected);
    assert_eq!(at_client.iter().map(|r| payload(r)).collect::<Vec<_>>(), vec![(repeat(b's', 64), true); 2]);
}

#[test]
fn http_exchange_is_captured_exactly() {
    let (t, _dir) = record_ipc("4096", &["http"]);
    let request = b"GET /index.html HTTP/1.1\r\nHost: localhost\r\nUser-Agent: ipc-fixture\r\n\r\n".to_vec();
    let response =
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 12\r\nConnection: close\r\n\r\nhello, pcap\n"
            .to_vec();
    assert_eq!(payloads(&t, "send"), [(request.clone(), false), (response.clone(), false)]);
    // The client's last read returns 0 bytes (end of stream): not a transfer.
    assert_eq!(payloads(&t, "recv"), [(request, false), (response, false)]);
}

#[test]
fn vectored_syscalls_capture_their_first_buffer() {
    let dir = temp_dir();
    let (t, _out) = record_ipc("4096", &["unix_stream", dir.path().to_str().unwrap()]);
    // writev(50 x 'x', 50 x 'y'): the first iovec only, marked cut.
    assert_eq!(payloads(&t, "send"), vec![(repeat(b'x', 50), true); 3]);
    // readv into one 120-byte buffer: all of it.
    let stream: Vec<u8> = [repeat(b'x', 50), repeat(b'y', 50)].concat().repeat(3);
    assert_eq!(
        payloads(&t, "recv"),
        [(stream[..120].to_vec(), false), (stream[120..240].to_vec(), false), (stream[240..].to_vec(), false)]
    );
}

#[test]
fn pipes_are_captured_and_capture_off_writes_no_payload_fields() {
    let (t, _dir) = record_ipc("10", &["pipe"]);
    assert_eq!(payloads(&t, "send"), vec![(repeat(b'p', 10), true); 4]);
    assert_eq!(payloads(&t, "recv"), vec![(repeat(b'p', 10), true); 4]);
    let (t, _dir) = record_ipc("0", &["pipe"]);
    assert_eq!(t.of_kind("send").count(), 4);
    assert!(
        t.of_kind("send")
            .chain(t.of_kind("recv"))
            .all(|e| e.get("payload").is_none() && e.get("payload_truncated").is_none())
    );
}

#[test]
fn capture_beyond_the_limit_is_one_clear_error() {
    let (ipc, dir) = (fixture("ipc"), temp_dir());
    let out = dir.path().join("trace.jsonl");
    let run = tracer(&[
        "record",
        "--capture-bytes",
        "4097",
        "-o",
        out.to_str().unwrap(),
        "--",
        ipc.to_str().unwrap(),
        "pipe",
    ]);
    run.assert_error("--capture-bytes is at most 4096, got 4097");
}
