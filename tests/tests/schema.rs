//! The published JSON Schema of a trace (`docs/schema/event.schema.json`) against traces: it
//! accepts every line of the bundled traces and of every trace the integration tests record
//! (`Trace::load` checks each line), and refuses lines that break it, so it says something.

use std::path::PathBuf;

use serde_json::{Value, json};
use tracer_tests::{Trace, check_schema};

fn golden() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/golden")
}

#[test]
fn every_line_of_the_bundled_traces_matches_the_schema() {
    let mut traces = vec![];
    for dir in
        [golden(), golden().join("expected/demo"), golden().join("expected/events"), golden().join("expected/signals")]
    {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "jsonl") {
                traces.push(path);
            }
        }
    }
    assert!(traces.len() >= 6, "bundled traces: {traces:?}");
    let mut kinds = std::collections::BTreeSet::new();
    for path in &traces {
        let trace = Trace::load(path);
        kinds.extend(trace.events.iter().map(|e| e["kind"].as_str().unwrap().to_string()));
    }
    let seen: Vec<&str> = kinds.iter().map(String::as_str).collect();
    assert_eq!(seen, ["call", "exit", "log", "recv", "return", "send", "signal", "spawn", "usdt"]);
}

/// A line of the demo trace of the given kind.
fn line_of(kind: &str) -> Value {
    let text = std::fs::read_to_string(golden().join("expected/demo/trace.jsonl")).unwrap();
    text.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).find(|v| v["kind"] == kind).unwrap()
}

#[test]
fn lines_that_break_the_schema_are_refused() {
    let call = line_of("call");
    check_schema(&call).unwrap();
    let recv = line_of("recv");
    check_schema(&recv).unwrap();
    let end = line_of("trace_end");
    check_schema(&end).unwrap();

    let broken: Vec<(&str, Value)> = vec![
        ("an unknown field", with(&call, "colour", json!("red"))),
        ("a pid that is a string", with(&call, "pid", json!("1"))),
        ("a negative ts", with(&call, "ts", json!(-1))),
        ("a call without its function", without(&call, "function")),
        ("an unknown kind", with(&call, "kind", json!("teleport"))),
        ("an argument that is not a number", with(&call, "args", json!(["x"]))),
        ("an unknown channel type", with(&recv, "channel", json!({"type": "carrier_pigeon", "id": 1}))),
        ("a channel without its addresses", with(&recv, "channel", json!({"type": "tcp"}))),
        ("an unknown syscall", with(&recv, "syscall", json!("ioctl"))),
        ("an unknown end reason", with(&end, "reason", json!("bored"))),
        ("a lost count that is negative", with(&end, "lost_events", json!({"call": -1}))),
        ("a return marked unwound false (absent unless set)", {
            let mut r = line_of("return");
            r["unwound"] = json!(false);
            r
        }),
    ];
    for (what, line) in broken {
        assert!(check_schema(&line).is_err(), "{what} was accepted: {line}");
    }
}

fn with(line: &Value, field: &str, value: Value) -> Value {
    let mut line = line.clone();
    line[field] = value;
    line
}

fn without(line: &Value, field: &str) -> Value {
    let mut line = line.clone();
    line.as_object_mut().unwrap().remove(field);
    line
}
