//! OTLP export checked by a real OpenTelemetry collector: `rotel-agent` (from PyPI, installed by
//! `cargo xtask setup`, named by `ROTEL_AGENT`) receives what `tracer` sends and prints every span
//! and log record (`--debug-log traces --debug-log logs --debug-log-verbosity detailed`); the
//! tests read that print-out.

use std::collections::HashMap;

use tracer_tests::{
    LocalAgent, Trace, fixture,
    rotel::{Rotel, Span, sent, spans_sent},
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

/// `events_c run` makes 5 program events in its function `run`, calling `line` after each: traced
/// with `-f run,line`, each event's log record is in `run`'s span (not in a `line` span, which has
/// returned by then); traced with `-f line` only, in the process's span.
#[test]
fn otlp_log_events_become_log_records_in_the_span_of_the_call_they_happened_in() {
    let events = fixture("events_c");
    for (functions, spans) in [(&["run", "line"][..], 7), (&["line"][..], 6)] {
        let dir = temp_dir();
        let rotel = Rotel::start(dir.path());
        let trace = dir.path().join("t.jsonl");
        let mut args: Vec<std::ffi::OsString> = vec!["record".into()];
        for f in functions {
            args.extend(["-f".into(), f.into()]);
        }
        args.extend(["-e", "call,return,log", "--otlp", &rotel.url, "-o"].map(Into::into));
        args.extend([trace.clone().into(), "--".into(), events.clone().into(), "run".into()]);
        let run = tracer(&args);
        assert_eq!(run.code(), 0, "{run:?}");
        // The process, run (when traced), and line 5 times.
        assert_eq!(spans_sent(&run.stderr), spans, "{functions:?}: {run:?}");
        assert_eq!(sent(&run.stderr, "log records"), 5, "{functions:?}: {run:?}");
        let recorded = Trace::load(&trace);
        let messages: Vec<&str> = recorded.of_kind("log").map(|l| l["message"].as_str().unwrap()).collect();
        assert_eq!(messages.len(), 5, "{:#?}", recorded.events);
        let spans = rotel.spans(spans);
        let mut logs = rotel.logs(5);
        assert_eq!(logs.len(), 5, "{functions:?}: {logs:#?}");
        // In time order (rotel prints them by scope, as they were sent).
        logs.sort_by_key(|l| l.fields["Timestamp"].parse::<u64>().unwrap());
        let process = spans.iter().find(|s| s.name == "process events_c").unwrap_or_else(|| panic!("{spans:#?}"));
        let in_run = functions.contains(&"run");
        let home = match in_run {
            true => spans.iter().find(|s| s.name == "run").unwrap_or_else(|| panic!("{spans:#?}")),
            _ => process,
        };
        let lines: Vec<&Span> = spans.iter().filter(|s| s.name == "line").collect();
        assert_eq!(lines.len(), 5, "{spans:#?}");
        let bodies: Vec<String> = logs.iter().map(|l| l.fields["Body"].clone()).collect();
        let expected: Vec<String> = messages.iter().map(|m| format!("Str({m})")).collect();
        assert_eq!(bodies, expected, "{functions:?}: in the order they were said");
        assert_eq!(&bodies[..4], ["Str(plain from C)", "Str(with data)", "Str(formatted 42 x)", "Str(slow peer)"]);
        let severities: Vec<&str> = logs.iter().map(|l| l.fields["SeverityText"].as_str()).collect();
        assert_eq!(severities, ["INFO", "INFO", "INFO", "WARN", "INFO"]);
        let numbers: Vec<&str> = logs.iter().map(|l| l.fields["SeverityNumber"].as_str()).collect();
        assert_eq!(
            numbers,
            [
                "SEVERITY_NUMBER_INFO(9)",
                "SEVERITY_NUMBER_INFO(9)",
                "SEVERITY_NUMBER_INFO(9)",
                "SEVERITY_NUMBER_WARN(13)",
                "SEVERITY_NUMBER_INFO(9)"
            ]
        );
        for l in &logs {
            assert_eq!(
                (&l.fields["Trace ID"], &l.fields["Span ID"]),
                (&home.trace_id, &home.id),
                "{functions:?}: {l:?}"
            );
            assert!(lines.iter().all(|s| s.id != l.fields["Span ID"]));
            assert_eq!(l.resource, process.resource, "the process's resource");
            assert_eq!(l.attributes["code.function"], "Str(run)");
        }
        // The C header's log call: its logger as the scope, its fields as attributes.
        assert_eq!(logs[3].scope, "c.net");
        assert_eq!(logs[3].attributes["retry"], "Int(2)");
        assert_eq!(logs[3].attributes["tracer.log.type"], "Str(log)");
        assert_eq!(logs[0].scope, "tracer");
        assert_eq!(logs[1].attributes["n"], "Int(5)");
        assert_eq!(logs[4].attributes["tracer.truncated"], "Bool(true)");
        if in_run {
            assert_eq!(home.parent_id, process.id, "run is the process's child");
            assert!(lines.iter().all(|s| s.parent_id == home.id), "{lines:#?}");
        }
    }
}

/// `tracer agent --otlp URL` sends its host's spans itself: the collector (without `--otlp`)
/// gets the trace, the OpenTelemetry collector the spans, whole.
#[test]
fn otlp_from_an_agent_arrives_whole_while_the_collector_sends_nothing() {
    let dir = temp_dir();
    let rotel = Rotel::start(dir.path());
    let agent = LocalAgent::start(dir.path(), "h", &["--allow-commands", "--otlp", &rotel.url]);
    let out = dir.path().join("t.jsonl");
    let command = format!("h:{} deep 5", fixture("calls").display());
    let run = tracer(&[
        "collect",
        "--agent",
        &agent.spec("h"),
        "-f",
        "deep",
        "-e",
        "call,return,spawn,exit",
        "-c",
        &command,
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(run.code(), 0, "{run:?}");
    assert!(!run.stderr.contains("sent to"), "the collector exports nothing: {run:?}");
    let collected = Trace::load(&out);
    assert_eq!(collected.of_kind("call").count(), 5, "{:#?}", collected.events);
    let line = agent.wait_for_log(" spans sent to ");
    assert!(line.contains(&format!(" 6 spans sent to {}/v1/traces", rotel.url)), "{line}");
    let spans = rotel.spans(6);
    assert_eq!(spans.len(), 6, "{spans:#?}");
    let process = spans.iter().find(|s| s.name == "process calls").unwrap_or_else(|| panic!("{spans:#?}"));
    assert_eq!(process.parent_id, "", "the process span is the root");
    let pid = collected.of_kind("call").next().unwrap()["pid"].clone();
    assert_eq!(process.resource["process.pid"], format!("Int({pid})"));
    assert!(spans.iter().all(|s| s.trace_id == process.trace_id && s.resource == process.resource));
    let by_parent: HashMap<&str, &Span> = spans.iter().map(|s| (s.parent_id.as_str(), s)).collect();
    let mut parent = process;
    for n in (1..=5).rev() {
        let s = by_parent.get(parent.id.as_str()).unwrap_or_else(|| panic!("no child of {parent:?}"));
        assert_eq!((s.name.as_str(), s.attributes["tracer.retval"].as_str()), ("deep", format!("Int({n})").as_str()));
        parent = s;
    }
}
