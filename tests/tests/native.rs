//! The native trace format (`.trc`), end to end through the binary: lossless against JSON lines
//! on the golden traces and on a trace recorded live with every event kind, read by every command,
//! told by its magic rather than its name.

use std::path::{Path, PathBuf};

use tracer_tests::{Trace, fixture, temp_dir, tracer};

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/golden").join(name)
}

fn run_ok(args: &[&str]) -> String {
    let run = tracer(args);
    assert_eq!(run.code(), 0, "tracer {args:?}: {run:?}");
    run.stdout
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// JSON lines → native → JSON lines gives back the same file as JSON lines → JSON lines (the
/// golden `trace.jsonl`), and `report` and `calls` print the same from either.
fn check_golden(input: &str) {
    let dir = temp_dir();
    let source = golden(&format!("{input}.jsonl"));
    let expected = golden("expected").join(input);
    // An extension that says nothing: the reader goes by the magic.
    let native = dir.path().join("t.bin");
    let back = dir.path().join("back.jsonl");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    run_ok(&["export", &s(&source), "--format", "native", "-o", &s(&native)]);
    assert!(read(&native).starts_with(b"\x89TRACER\n"), "no magic");
    run_ok(&["export", &s(&native), "-o", &s(&back)]);
    assert!(read(&back) == read(&expected.join("trace.jsonl")), "{input}: the round trip differs");
    assert_eq!(run_ok(&["report", &s(&native)]).as_bytes(), read(&expected.join("report.txt")));
    assert_eq!(run_ok(&["calls", &s(&native)]).as_bytes(), read(&expected.join("calls.txt")));
    // Every exporter reads it as it reads JSON lines.
    let pftrace = dir.path().join("trace.pftrace");
    run_ok(&["export", &s(&native), "-o", &s(&pftrace)]);
    assert!(read(&pftrace) == read(&expected.join("trace.pftrace")), "{input}: the Perfetto export differs");
    // And it is smaller (these traces are small: their JSON first line weighs much).
    let (n, j) = (read(&native).len(), read(&source).len());
    assert!(n * 3 < j, "{n} bytes native against {j} of JSON lines");
}

#[test]
fn native_golden_demo_round_trips_exactly() {
    check_golden("demo");
}

#[test]
fn native_golden_signals_round_trips_exactly() {
    check_golden("signals");
}

/// `record -o t.trc` writes the native format; it converts to JSON lines and back without
/// changing an event, with every kind the fixture makes.
#[test]
fn native_record_writes_it_with_every_kind() {
    let dir = temp_dir();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let trc = dir.path().join("t.trc");
    let ipc = fixture("ipc");
    run_ok(&["record", "-o", &s(&trc), "-e", "call,return,spawn,exit,ipc", "--", ipc.to_str().unwrap(), "signals"]);
    assert!(read(&trc).starts_with(b"\x89TRACER\n"), "record -o t.trc wrote no native trace");
    assert!(!dir.path().join("t.trc.partial.jsonl").exists(), "a streamed format needs no spool");
    let back = dir.path().join("back.jsonl");
    run_ok(&["export", &s(&trc), "-o", &s(&back)]);
    let again = dir.path().join("again.trc");
    run_ok(&["export", &s(&back), "--format", "native", "-o", &s(&again)]);
    let back2 = dir.path().join("back2.jsonl");
    run_ok(&["export", &s(&again), "-o", &s(&back2)]);
    assert!(read(&back) == read(&back2), "JSON lines → native → JSON lines changed the trace");
    let t = Trace::load(&back);
    assert_eq!(t.lost(), 0, "{}", t.end);
    for kind in ["call", "return", "spawn", "exit", "send", "recv", "signal"] {
        assert!(t.of_kind(kind).count() > 0, "no {kind} event");
    }
    // The fixture's handlers ran: two SIGUSR1 and one SIGUSR2 (see ipc.c), as in the golden trace.
    assert_eq!(t.of_kind("call").filter(|c| c["function"] == "on_usr1").count(), 2);
    assert_eq!(t.of_kind("call").filter(|c| c["function"] == "on_usr2").count(), 1);
    assert_eq!(t.end["events_written"].as_u64().unwrap() as usize, t.events.len());
}

/// A trace cut mid-batch (a writer killed while writing) reads up to its last whole batch, with
/// a warning that says so.
#[test]
fn native_torn_trace_is_read_with_a_warning() {
    let dir = temp_dir();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let native = dir.path().join("t.trc");
    run_ok(&["export", &s(&golden("demo.jsonl")), "-o", &s(&native)]);
    let bytes = read(&native);
    std::fs::write(&native, &bytes[..bytes.len() - 10]).unwrap();
    let run = tracer(&["report", &s(&native)]);
    assert_eq!(run.code(), 0, "{run:?}");
    assert!(run.stderr.contains("was cut short (no trace_end, and batch 3 is cut short"), "{}", run.stderr);
    std::fs::write(&native, b"\x89TRACER\n\x07\0\0\0").unwrap();
    let run = tracer(&["report", &s(&native)]);
    assert_eq!(run.code(), 1, "{run:?}");
    assert!(run.stderr.contains("not a native trace: native format version 7, this tracer reads 3"), "{}", run.stderr);
}
