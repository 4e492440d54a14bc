//! OTLP export checked by a real OpenTelemetry collector: `rotel-agent` (from PyPI, installed by
//! `cargo xtask setup`, named by `ROTEL_AGENT`) receives what `tracer` sends and prints every span
//! (`--debug-log traces --debug-log-verbosity detailed`); the tests read that print-out.

use std::collections::HashMap;

use tracer_tests::{
    fixture,
    rotel::{Rotel, Span, spans_sent},
    temp_dir, tracer,
};

#[test]
fn otlp_call_tree_arrives_whole_in_a_real_collector() {
    let dir = temp_dir();
    let rotel = Rotel::start(dir.path());
    let trace = dir.path().join("t.jsonl");
    let calls = fixture("calls");
    let run = tracer(&[
        "record".as_ref(),
        "-f".as_ref(),
        "deep".as_ref(),
        "-e".as_ref(),
        "call,return,spawn,exit".as_ref(),
        "-o".as_ref(),
        trace.as_os_str(),
        "--".as_ref(),
        calls.as_os_str(),
        "deep".as_ref(),
        "5".as_ref(),
    ]);
    assert_eq!(run.code(), 0, "{run:?}");
    let run = tracer(&[
        "export".as_ref(),
        trace.as_os_str(),
        "--otlp".as_ref(),
        rotel.url.as_ref(),
        "--service-name".as_ref(),
        "deeptest".as_ref(),
    ]);
    assert_eq!(run.code(), 0, "{run:?}");
    // deep(5) .. deep(1), and the process.
    assert_eq!(spans_sent(&run.stderr), 6, "{run:?}");
    let spans = rotel.spans(6);
    assert_eq!(spans.len(), 6, "{spans:#?}");
    let process: Vec<&Span> = spans.iter().filter(|s| s.name == "process calls").collect();
    assert_eq!(process.len(), 1, "{spans:#?}");
    let process = process[0];
    assert_eq!(process.parent_id, "", "the process span is the root");
    let pid = &process.resource["process.pid"];
    for s in &spans {
        assert_eq!(s.resource["service.name"], "Str(deeptest)");
        assert_eq!(s.resource["process.executable.name"], "Str(calls)");
        assert_eq!(&s.resource["process.pid"], pid);
        assert_eq!(s.trace_id, process.trace_id, "one trace per process");
    }
    // Walk down from the process: deep(5) is its child, deep(4) deep(5)'s, and so on.
    let by_parent: HashMap<&str, &Span> = spans.iter().map(|s| (s.parent_id.as_str(), s)).collect();
    let mut parent = process;
    for n in (1..=5).rev() {
        let s = by_parent.get(parent.id.as_str()).unwrap_or_else(|| panic!("no child of {parent:?}"));
        assert_eq!(s.name, "deep");
        assert_eq!(s.kind, "SPAN_KIND_INTERNAL");
        assert_eq!(s.attributes["code.function"], "Str(deep)");
        assert!(s.attributes["tracer.args"].starts_with(&format!("Slice(Int({n}), ")), "{s:?}");
        assert_eq!(s.attributes["tracer.retval"], format!("Int({n})"));
        parent = s;
    }
}

#[test]
fn otlp_receives_link_to_their_sends_in_a_real_collector() {
    // The pipe fixture: the child writes 4 x 256 bytes, the parent reads 300, 300, 300, 124.
    let dir = temp_dir();
    let rotel = Rotel::start(dir.path());
    let trace = dir.path().join("t.jsonl");
    let ipc = fixture("ipc");
    let run = tracer(&[
        "record".as_ref(),
        "-e".as_ref(),
        "ipc,spawn,exit".as_ref(),
        "--otlp".as_ref(),
        rotel.url.as_ref(),
        "-o".as_ref(),
        trace.as_os_str(),
        "--".as_ref(),
        ipc.as_os_str(),
        "pipe".as_ref(),
    ]);
    assert_eq!(run.code(), 0, "{run:?}");
    let sent = spans_sent(&run.stderr);
    let spans = rotel.spans(sent);
    assert_eq!(spans.len(), sent, "{spans:#?}");
    let sends: Vec<&Span> = spans.iter().filter(|s| s.name == "send pipe").collect();
    let recvs: Vec<&Span> = spans.iter().filter(|s| s.name == "recv pipe").collect();
    let processes: Vec<&Span> = spans.iter().filter(|s| s.name.starts_with("process ")).collect();
    assert_eq!((sends.len(), recvs.len(), processes.len()), (4, 4, 2), "{spans:#?}");
    assert_eq!(sent, 10, "4 sends, 4 receives, 2 processes");
    let process_of =
        |s: &Span| *processes.iter().find(|p| p.resource["process.pid"] == s.resource["process.pid"]).unwrap();
    for s in sends.iter().chain(&recvs) {
        let p = process_of(s);
        assert_eq!((&s.trace_id, &s.parent_id), (&p.trace_id, &p.id), "{s:?} under its process {p:?}");
    }
    assert!(sends.iter().all(|s| s.kind == "SPAN_KIND_PRODUCER" && s.attributes["tracer.bytes"] == "Int(256)"));
    assert!(recvs.iter().all(|s| s.kind == "SPAN_KIND_CONSUMER"));
    assert_ne!(sends[0].resource["process.pid"], recvs[0].resource["process.pid"]);
    // Each receive links to the sends it read, in order: [0 1] [1 2] [2 3] [3].
    let mut recvs = recvs.clone();
    recvs.sort_by_key(|s| s.links.first().map(|l| sends.iter().position(|x| (&x.trace_id, &x.id) == (&l.0, &l.1))));
    let send_index = |l: &(String, String)| {
        sends
            .iter()
            .position(|s| (&s.trace_id, &s.id) == (&l.0, &l.1))
            .unwrap_or_else(|| panic!("link {l:?} to no send"))
    };
    // Sends in the order rotel printed them are time order (one batch, in event order).
    let linked: Vec<Vec<usize>> = recvs.iter().map(|r| r.links.iter().map(send_index).collect()).collect();
    assert_eq!(linked, [vec![0, 1], vec![1, 2], vec![2, 3], vec![3]]);
}
