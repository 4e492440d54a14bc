//! Flame graphs, folded stacks, SVG, Perfetto, `tracer report` and `tracer calls` on a real trace
//! of a fixture whose call graph and timing are known (tests/fixtures/c/timing.c).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde_json::{Value, json};
use tracer_tests::{
    fixture,
    perfetto::{TracePacket, TrackDescriptor, TrackEvent, trace_packet, track_event},
    record, temp_dir, tracer, u64_field,
};

const FUNCTIONS: [&str; 6] = ["run", "step", "leaf", "recurse", "worker", "child_main"];

fn pattern_args() -> Vec<String> {
    FUNCTIONS.iter().flat_map(|f| ["-f".to_string(), f.to_string()]).collect()
}

/// Records the timing fixture; returns the trace's path, the main pid and the child's pid.
fn record_timing(dir: &Path) -> (PathBuf, u64, u64) {
    let mut args = pattern_args();
    args.extend(["--".to_string(), fixture("timing").display().to_string()]);
    let (run, t) = record(dir, &args);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.lost(), 0, "{}", t.end);
    let main_pid = t.start["targets"][0]["pid"].as_u64().unwrap();
    let fork = t.of_kind("spawn").find(|e| e["how"] == "fork").expect("a fork");
    (dir.join("trace.jsonl"), main_pid, u64_field(fork, "child_pid"))
}

fn export(input: &Path, output: &Path) {
    let run = tracer(&["export".as_ref(), input.as_os_str(), "-o".as_ref(), output.as_os_str()]);
    assert_eq!(run.code(), 0, "{run:?}");
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// A flame graph node's shape: its name and its children's shapes (values left out).
fn shape(node: &Value) -> String {
    let children: Vec<String> = node["children"].as_array().expect("children").iter().map(shape).collect();
    if children.is_empty() {
        node["name"].as_str().unwrap().to_string()
    } else {
        format!("{}[{}]", node["name"].as_str().unwrap(), children.join(","))
    }
}

fn child<'a>(node: &'a Value, name: &str) -> &'a Value {
    node["children"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {name} under {}", node["name"]))
}

/// Checks that no node's children sum to more than it; returns the number of nodes.
fn check_inclusive(node: &Value) -> usize {
    let children = node["children"].as_array().unwrap();
    let sum: u64 = children.iter().map(|c| u64_field(c, "value")).sum();
    assert!(sum <= u64_field(node, "value"), "children of {} sum to more than it", node["name"]);
    1 + children.iter().map(check_inclusive).sum::<usize>()
}

fn expected_shape(main_pid: u64, child_pid: u64) -> Vec<String> {
    vec![
        format!("timing ({main_pid})[run[recurse[recurse[recurse[recurse]]],step[leaf]],worker[leaf]]"),
        format!("timing ({child_pid})[child_main[leaf]]"),
    ]
}

#[test]
fn flame_graph_report_calls_and_folded_stacks_match_the_fixture() {
    let dir = temp_dir();
    let (trace, main_pid, child_pid) = record_timing(dir.path());

    // Flame graph: the call graph exactly, the main process first (it has more time).
    let flame_path = dir.path().join("t.flame.json");
    export(&trace, &flame_path);
    let flame: Value = serde_json::from_str(&read(&flame_path)).expect("flame graph JSON");
    let roots = flame.as_array().expect("an array of roots");
    assert_eq!(roots.iter().map(shape).collect::<Vec<_>>(), expected_shape(main_pid, child_pid));
    let nodes: usize = roots.iter().map(check_inclusive).sum();
    assert_eq!(nodes, 13);
    // Sleeps make lower bounds: step 3 x (2 ms + 2 x 0.5 ms), recurse 4 x 0.3 ms, leaf 0.5 ms.
    let run = child(&roots[0], "run");
    let step = child(run, "step");
    assert!(u64_field(step, "value") >= 9_000_000, "{step}");
    assert!(u64_field(child(step, "leaf"), "value") >= 3_000_000, "{step}");
    assert!(u64_field(child(run, "recurse"), "value") >= 1_200_000, "{run}");
    assert!(u64_field(child(child(&roots[0], "worker"), "leaf"), "value") >= 1_000_000);
    assert!(u64_field(child(child(&roots[1], "child_main"), "leaf"), "value") >= 500_000);
    let active: u64 = roots.iter().map(|r| u64_field(r, "value")).sum();

    // Report: exact call counts per process, no unfinished call, and self times that add up to
    // the active time of the flame graph.
    let run = tracer(&["report".as_ref(), trace.as_os_str(), "--by-process".as_ref(), "--json".as_ref()]);
    assert_eq!(run.code(), 0, "{run:?}");
    let report: Value = serde_json::from_str(&run.stdout).expect("report JSON");
    let counts: BTreeMap<(u64, String), u64> = report["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| ((u64_field(f, "pid"), f["function"].as_str().unwrap().to_string()), u64_field(f, "calls")))
        .collect();
    let expected: BTreeMap<(u64, String), u64> = [
        (main_pid, "run", 1),
        (main_pid, "step", 3),
        (main_pid, "leaf", 8),
        (main_pid, "recurse", 4),
        (main_pid, "worker", 1),
        (child_pid, "child_main", 1),
        (child_pid, "leaf", 1),
    ]
    .into_iter()
    .map(|(p, f, n)| ((p, f.to_string()), n))
    .collect();
    assert_eq!(counts, expected);
    let functions = report["functions"].as_array().unwrap();
    assert!(functions.iter().all(|f| f["unfinished"] == 0 && f["exact_percentiles"] == true), "{report}");
    let self_sum: u64 = functions.iter().map(|f| u64_field(f, "self_ns")).sum();
    assert_eq!(self_sum, active, "self times add up to the time in traced calls");
    for f in functions {
        let (min, p50, max) = (u64_field(f, "min_ns"), u64_field(f, "p50_ns"), u64_field(f, "max_ns"));
        assert!(min <= p50 && p50 <= max, "{f}");
    }
    let process = |pid: u64| report["processes"].as_array().unwrap().iter().find(|p| p["pid"] == pid).unwrap().clone();
    assert_eq!((process(main_pid)["children"].clone(), process(main_pid)["threads"].clone()), (json!(1), json!(1)));
    assert_eq!(process(main_pid)["exit_code"], 0);
    assert_eq!(process(child_pid)["exit_code"], 3);
    assert!(u64_field(&process(main_pid), "lifetime_ns") >= active - u64_field(&roots[1], "value"));

    // The table names every function.
    let run = tracer(&["report".as_ref(), trace.as_os_str(), "--sort".as_ref(), "calls".as_ref()]);
    assert_eq!(run.code(), 0, "{run:?}");
    let table: Vec<&str> = run.stdout.lines().collect();
    assert!(table[1].starts_with("function") && table[1].contains("p99"), "{}", run.stdout);
    assert!(table[2].starts_with("leaf ") && table[2].contains(" 9 "), "most calls first: {}", run.stdout);

    // Folded stacks: self times, summing to the same total.
    let folded_path = dir.path().join("t.folded");
    export(&trace, &folded_path);
    let folded = read(&folded_path);
    let mut folded_sum = 0;
    for line in folded.lines() {
        let (stack, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("not a folded line: {line}"));
        assert!(stack.starts_with("timing ("), "{line}");
        folded_sum += value.parse::<u64>().unwrap_or_else(|_| panic!("not a count: {line}"));
    }
    assert_eq!(folded_sum, active);
    assert!(folded.contains(&format!("timing ({main_pid});run;step;leaf ")), "{folded}");

    // The call sequence of the main thread, in call order.
    let run = tracer(&["calls".as_ref(), trace.as_os_str(), "--tid".as_ref(), main_pid.to_string().as_ref()]);
    assert_eq!(run.code(), 0, "{run:?}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines[0], format!("timing ({main_pid}), thread {main_pid}:"));
    // Each line is `+S.NNNNNNNNN DURATION  NAME`, the name indented by depth, at character 24.
    let name_column = |l: &&str| l.chars().skip(24).collect::<String>();
    let tree: Vec<String> = lines[1..].iter().map(name_column).collect();
    assert_eq!(
        tree,
        [
            "run",
            "  step",
            "    leaf",
            "    leaf",
            "  step",
            "    leaf",
            "    leaf",
            "  step",
            "    leaf",
            "    leaf",
            "  recurse",
            "    recurse",
            "      recurse",
            "        recurse",
        ],
        "{}",
        run.stdout
    );
    let run = tracer(&[
        "calls".as_ref(),
        trace.as_os_str(),
        "-f".as_ref(),
        "rec*".as_ref(),
        "--max-depth".as_ref(),
        "1".as_ref(),
        "--min-duration".as_ref(),
        "1us".as_ref(),
    ]);
    assert_eq!(run.code(), 0, "{run:?}");
    let names: Vec<String> = run.stdout.lines().collect::<Vec<_>>()[1..].iter().map(name_column).collect();
    assert_eq!(names, ["recurse", "  recurse"], "{}", run.stdout);
}

/// fib(10) under main (the calls fixture): 177 calls of fib, 176 of them inside another call of
/// fib. Its total counts the outermost call only, so it is not more than main's, which holds it;
/// the table says so.
#[test]
fn report_counts_a_recursive_function_once() {
    let dir = temp_dir();
    let calls = fixture("calls").display().to_string();
    let (run, t) = record(dir.path(), &["-f", "fib", "-f", "main", "--no-follow", "--", &calls, "run", "0"]);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.calls("fib").len(), 177);
    let trace = dir.path().join("trace.jsonl");
    let run = tracer(&["report".as_ref(), trace.as_os_str(), "--json".as_ref()]);
    assert_eq!(run.code(), 0, "{run:?}");
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    let function =
        |name: &str| report["functions"].as_array().unwrap().iter().find(|f| f["function"] == name).unwrap().clone();
    let (fib, main) = (function("fib"), function("main"));
    assert_eq!((u64_field(&fib, "calls"), u64_field(&fib, "recursive_calls")), (177, 176), "{fib}");
    assert!(u64_field(&fib, "total_ns") <= u64_field(&main, "total_ns"), "fib {fib}\nmain {main}");
    assert!(u64_field(&fib, "self_ns") <= u64_field(&fib, "total_ns"), "{fib}");
    assert!(main.get("recursive_calls").is_none(), "{main}");
    let run = tracer(&["report".as_ref(), trace.as_os_str()]);
    assert!(
        run.stdout.contains("note: total is the time in the outermost calls of a recursive function (fib)"),
        "{}",
        run.stdout
    );
}

/// The frames of an inferno SVG: each frame is a `<g>` with a `<title>` and a `<rect>`.
fn svg_frames(svg: &str) -> Vec<String> {
    let options = roxmltree::ParsingOptions { allow_dtd: true, ..roxmltree::ParsingOptions::default() };
    let doc = roxmltree::Document::parse_with_options(svg, options).expect("well-formed XML");
    doc.descendants()
        .filter(|n| n.has_tag_name("g") && n.children().any(|c| c.has_tag_name("rect")))
        .map(|g| g.children().find(|c| c.has_tag_name("title")).and_then(|t| t.text()).unwrap_or("").to_string())
        .collect()
}

#[test]
fn svg_has_one_frame_per_stack_node() {
    let dir = temp_dir();
    let (trace, main_pid, _) = record_timing(dir.path());
    let svg_path = dir.path().join("t.svg");
    export(&trace, &svg_path);
    let frames = svg_frames(&read(&svg_path));
    // 13 nodes and inferno's "all".
    assert_eq!(frames.len(), 14, "{frames:#?}");
    assert_eq!(frames.iter().filter(|t| t.starts_with("recurse (")).count(), 4, "{frames:#?}");
    assert_eq!(frames.iter().filter(|t| t.starts_with("leaf (")).count(), 3, "{frames:#?}");
    assert!(frames.iter().any(|t| t.starts_with(&format!("timing ({main_pid}) ("))), "{frames:#?}");
}

fn decode(path: &Path) -> Vec<TracePacket> {
    tracer_tests::perfetto::read(path)
}

fn descriptors(packets: &[TracePacket]) -> Vec<&TrackDescriptor> {
    packets
        .iter()
        .filter_map(|p| match &p.data {
            Some(trace_packet::Data::TrackDescriptor(t)) => Some(t),
            _ => None,
        })
        .collect()
}

fn track_events(packets: &[TracePacket]) -> Vec<(u64, &TrackEvent)> {
    let mut events: Vec<(u64, &TrackEvent)> = packets
        .iter()
        .filter_map(|p| match &p.data {
            Some(trace_packet::Data::TrackEvent(e)) => Some((p.timestamp.expect("a timestamp"), e)),
            _ => None,
        })
        .collect();
    // Perfetto orders by timestamp (stably) before building slices.
    events.sort_by_key(|(ts, _)| *ts);
    events
}

fn name(e: &TrackEvent) -> &str {
    match &e.name_field {
        Some(track_event::NameField::Name(n)) => n,
        _ => "",
    }
}

#[test]
fn perfetto_tracks_and_slices_match_the_fixture_recorded_or_exported() {
    let dir = temp_dir();
    let (trace, main_pid, child_pid) = record_timing(dir.path());
    let exported = dir.path().join("t.pftrace");
    export(&trace, &exported);
    // Straight from record too.
    let direct = dir.path().join("direct.pftrace");
    let mut args: Vec<String> =
        vec!["record".into(), "-o".into(), direct.display().to_string(), "--format".into(), "perfetto".into()];
    args.extend(pattern_args());
    args.extend(["--".to_string(), fixture("timing").display().to_string()]);
    let run = tracer(&args);
    assert_eq!(run.code(), 0, "{run:?}");

    for (path, main_pid, child_pid) in [(exported, main_pid, child_pid), (direct, 0, 0)] {
        let packets = decode(&path);
        let tracks = descriptors(&packets);
        let processes: Vec<&TrackDescriptor> = tracks.iter().copied().filter(|t| t.process.is_some()).collect();
        let threads: Vec<&TrackDescriptor> = tracks.iter().copied().filter(|t| t.thread.is_some()).collect();
        let pids: std::collections::BTreeSet<i32> =
            processes.iter().map(|t| t.process.as_ref().unwrap().pid()).collect();
        assert_eq!(pids.len(), 2, "the process and its child: {processes:?}");
        if main_pid != 0 {
            assert_eq!(pids, [main_pid as i32, child_pid as i32].into());
        }
        assert!(processes.iter().all(|p| p.process.as_ref().unwrap().process_name() == "timing"), "{processes:?}");
        assert_eq!(threads.len(), 3, "main thread, worker thread, child: {threads:?}");
        for t in &threads {
            let pid = t.thread.as_ref().unwrap().pid();
            let parent = processes.iter().find(|p| p.process.as_ref().unwrap().pid() == pid).expect("its process");
            assert_eq!(t.parent_uuid, parent.uuid, "a thread's track is under its process's: {t:?}");
        }

        // Slices: as many begins as calls, each ended, properly nested on every thread track.
        let events = track_events(&packets);
        let mut calls: BTreeMap<&str, u64> = BTreeMap::new();
        let mut open: BTreeMap<u64, usize> = BTreeMap::new();
        for (_, e) in &events {
            let track = e.track_uuid.expect("a track");
            assert!(threads.iter().any(|t| t.uuid == Some(track)), "events are on thread tracks: {e:?}");
            match e.r#type() {
                track_event::Type::SliceBegin => {
                    *calls.entry(name(e)).or_default() += 1;
                    *open.entry(track).or_default() += 1;
                }
                track_event::Type::SliceEnd => {
                    let depth = open.get_mut(&track).expect("an end after a begin");
                    *depth = depth.checked_sub(1).expect("no more ends than begins");
                }
                _ => {}
            }
        }
        assert!(open.values().all(|&d| d == 0), "every slice ended: {open:?}");
        let expected: BTreeMap<&str, u64> =
            [("run", 1), ("step", 3), ("leaf", 9), ("recurse", 4), ("worker", 1), ("child_main", 1)].into();
        assert_eq!(calls, expected, "{}", path.display());
        let instants: Vec<&str> =
            events.iter().filter(|(_, e)| e.r#type() == track_event::Type::Instant).map(|(_, e)| name(e)).collect();
        for expected in ["exit 3", "exit 0", "thread exit 0"] {
            assert!(instants.contains(&expected), "{expected}: {instants:?}");
        }
        assert!(instants.iter().any(|i| i.starts_with("fork ")) && instants.iter().any(|i| i.starts_with("thread ")));
    }
}

#[test]
fn flame_graph_straight_from_record_has_the_same_shape() {
    let dir = temp_dir();
    let out = dir.path().join("direct.flame.json");
    let mut args: Vec<String> = vec!["record".into(), "-o".into(), out.display().to_string()];
    args.extend(pattern_args());
    args.extend(["--".to_string(), fixture("timing").display().to_string()]);
    let run = tracer(&args);
    assert_eq!(run.code(), 0, "{run:?}");
    assert!(run.stderr.contains("writing flame graph data to"), "{run:?}");
    let flame: Value = serde_json::from_str(&read(&out)).expect("flame graph JSON");
    let shapes: Vec<String> = flame.as_array().unwrap().iter().map(shape).collect();
    // The pids are the run's own: compare without them.
    let unpid = |s: &str| s.split_once(')').map(|(_, rest)| rest.to_string()).unwrap();
    assert_eq!(
        shapes.iter().map(|s| unpid(s)).collect::<Vec<_>>(),
        expected_shape(1, 2).iter().map(|s| unpid(s)).collect::<Vec<_>>()
    );
}

#[test]
fn perfetto_flows_link_sends_to_receives_and_signals() {
    // IPC events from a hand-written trace, through the real binary.
    let dir = temp_dir();
    let trace = dir.path().join("ipc.jsonl");
    let pipe = json!({"type": "pipe", "id": 9});
    let base = |kind: &str, ts: u64, pid: u64| json!({"kind": kind, "ts": ts, "host": "h", "pid": pid, "tid": pid});
    let with = |mut v: Value, fields: Value| {
        v.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
        v
    };
    let lines = [
        json!({"kind": "trace_start", "format_version": 1, "host": "h", "tracer_version": "t", "ts": 1000,
               "clock": {"source": "t", "offset_ns": 0, "uncertainty_ns": 0},
               "targets": [{"type": "process", "pid": 1, "comm": "writer", "exe": "/w"},
                           {"type": "process", "pid": 2, "comm": "reader", "exe": "/r"}],
               "probes": 0, "events": ["send", "recv", "signal"], "follow_children": false}),
        with(
            base("send", 2000, 1),
            json!({"channel": pipe, "fd": 4, "bytes": 8, "syscall": "write", "flow_id": 70, "syscall_ns": 100}),
        ),
        with(
            base("recv", 3000, 2),
            json!({"channel": pipe, "fd": 3, "bytes": 4, "syscall": "read", "flow_ids": [70], "syscall_ns": 100}),
        ),
        with(
            base("recv", 4000, 2),
            json!({"channel": pipe, "fd": 3, "bytes": 4, "syscall": "read", "flow_ids": [70], "syscall_ns": 100}),
        ),
        with(
            base("signal", 5000, 1),
            json!({"signal": {"number": 10, "name": "SIGUSR1"}, "sender_pid": 1, "target_pid": 2, "target_tid": 2, "delivered": false, "flow_id": 5}),
        ),
        with(
            base("signal", 6000, 2),
            json!({"signal": {"number": 10, "name": "SIGUSR1"}, "sender_pid": 1, "target_pid": 2, "target_tid": 2, "delivered": true, "flow_id": 5}),
        ),
        json!({"kind": "trace_end", "ts": 7000, "reason": "duration", "events_written": 5, "lost_events": {}}),
    ];
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&trace, text).unwrap();
    let out = dir.path().join("ipc.pftrace");
    export(&trace, &out);
    let packets = decode(&out);
    let events = track_events(&packets);
    // Every flow starts once and ends once, from the writer's track to the reader's.
    let mut starts: BTreeMap<u64, (&str, u64)> = BTreeMap::new();
    let mut ends: BTreeMap<u64, (&str, u64)> = BTreeMap::new();
    for (_, e) in &events {
        for id in &e.flow_ids {
            assert!(starts.insert(*id, (name(e), e.track_uuid())).is_none(), "flow {id} starts twice");
        }
        for id in &e.terminating_flow_ids {
            assert!(ends.insert(*id, (name(e), e.track_uuid())).is_none(), "flow {id} ends twice");
        }
    }
    assert_eq!(starts.len(), 3, "{starts:?}");
    assert_eq!(starts.keys().collect::<Vec<_>>(), ends.keys().collect::<Vec<_>>());
    let pairs: Vec<(&str, &str)> = starts.iter().map(|(id, (from, _))| (*from, ends[id].0)).collect();
    assert_eq!(
        pairs,
        [("send 8 B", "recv 4 B"), ("send (more bytes read)", "recv 4 B"), ("send SIGUSR1", "deliver SIGUSR1")]
    );
    let writer = descriptors(&packets).iter().find(|t| t.thread.as_ref().is_some_and(|t| t.pid() == 1)).unwrap().uuid();
    assert!(starts.values().all(|(_, track)| *track == writer) && ends.values().all(|(_, track)| *track != writer));
}

#[test]
fn perfetto_flows_from_a_real_ipc_trace() {
    // The pipe fixture: 4 writes of 256 bytes read as 300, 300, 300, 124: seven links.
    let dir = temp_dir();
    let out = dir.path().join("pipe.pftrace");
    let ipc = fixture("ipc");
    let run = tracer_tests::tracer(&[
        "record",
        "-e",
        "ipc",
        "-o",
        out.to_str().unwrap(),
        "--",
        ipc.to_str().unwrap(),
        "pipe",
    ]);
    assert_eq!(run.code(), 0, "{run:?}");
    let packets = decode(&out);
    let events = track_events(&packets);
    let mut starts = BTreeMap::new();
    let mut ends = BTreeMap::new();
    for (_, e) in &events {
        for id in &e.flow_ids {
            assert!(starts.insert(*id, e.track_uuid()).is_none(), "flow {id} starts twice");
        }
        for id in &e.terminating_flow_ids {
            assert!(ends.insert(*id, e.track_uuid()).is_none(), "flow {id} ends twice");
        }
    }
    assert_eq!(starts.len(), 7, "{starts:?}");
    assert_eq!(starts.keys().collect::<Vec<_>>(), ends.keys().collect::<Vec<_>>());
    // From the writing child to the reading parent.
    assert!(starts.iter().all(|(id, from)| ends[id] != *from));
    let names: Vec<&str> = events.iter().map(|(_, e)| name(e)).filter(|n| n.starts_with("recv")).collect();
    assert_eq!(names, ["recv 300 B", "recv 300 B", "recv 300 B", "recv 124 B"]);
}

/// Each profile's name and its events as `O name` / `C name`.
fn speedscope_events(file: &Value) -> Vec<(String, Vec<String>)> {
    let frames = file["shared"]["frames"].as_array().expect("shared frames");
    file["profiles"]
        .as_array()
        .expect("profiles")
        .iter()
        .map(|p| {
            assert_eq!(p["type"], "evented");
            assert_eq!(p["unit"], "nanoseconds");
            let events: Vec<&Value> = p["events"].as_array().unwrap().iter().collect();
            assert!(events.windows(2).all(|w| w[0]["at"].as_u64() <= w[1]["at"].as_u64()), "in time order: {p}");
            assert_eq!(p["startValue"], events[0]["at"]);
            assert_eq!(p["endValue"], events[events.len() - 1]["at"]);
            let names = events
                .iter()
                .map(|e| {
                    format!(
                        "{} {}",
                        e["type"].as_str().unwrap(),
                        frames[e["frame"].as_u64().unwrap() as usize]["name"].as_str().unwrap()
                    )
                })
                .collect();
            (p["name"].as_str().unwrap().to_string(), names)
        })
        .collect()
}

#[test]
fn speedscope_profiles_match_the_fixture_validate_and_load_in_speedscope() {
    let dir = temp_dir();
    let (trace, main_pid, child_pid) = record_timing(dir.path());
    let out = dir.path().join("timing.speedscope.json");
    export(&trace, &out);
    tracer_tests::speedscope::validate(&out).unwrap_or_else(|e| panic!("the schema refuses {}: {e}", out.display()));
    let file: Value = serde_json::from_str(&read(&out)).unwrap();

    // One frame per function, each in the fixture's binary.
    let frames = file["shared"]["frames"].as_array().unwrap();
    let mut names: Vec<&str> = frames.iter().map(|f| f["name"].as_str().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["child_main", "leaf", "recurse", "run", "step", "worker"], "{frames:?}");
    assert!(frames.iter().all(|f| f["file"].as_str().unwrap().ends_with("/timing")), "{frames:?}");

    let o = |f: &str| format!("O {f}");
    let c = |f: &str| format!("C {f}");
    let leaf = [o("leaf"), c("leaf")];
    let step: Vec<String> = [vec![o("step")], leaf.to_vec(), leaf.to_vec(), vec![c("step")]].concat();
    let main: Vec<String> = [
        vec![o("run")],
        step.clone(),
        step.clone(),
        step,
        vec![o("recurse"), o("recurse"), o("recurse"), o("recurse")],
        vec![c("recurse"), c("recurse"), c("recurse"), c("recurse"), c("run")],
    ]
    .concat();
    let worker: Vec<String> = [vec![o("worker")], leaf.to_vec(), leaf.to_vec(), vec![c("worker")]].concat();
    let child: Vec<String> = [vec![o("child_main")], leaf.to_vec(), vec![c("child_main")]].concat();
    let profiles = speedscope_events(&file);
    assert_eq!(profiles.len(), 3, "{profiles:?}");
    let named = |pid: u64, events: &[String]| {
        profiles
            .iter()
            .find(|(name, got)| name.starts_with(&format!("timing {pid}/")) && got == events)
            .unwrap_or_else(|| panic!("no profile of {pid} with {events:?}: {profiles:?}"))
    };
    assert_eq!(named(main_pid, &main).0, format!("timing {main_pid}/{main_pid}"));
    assert_ne!(named(main_pid, &worker).0, format!("timing {main_pid}/{main_pid}"));
    assert_eq!(named(child_pid, &child).0, format!("timing {child_pid}/{child_pid}"));

    // The schema checker is not a rubber stamp: an event of no known type is refused.
    let broken = dir.path().join("broken.speedscope.json");
    std::fs::write(&broken, read(&out).replacen("\"type\":\"O\"", "\"type\":\"X\"", 1)).unwrap();
    assert!(tracer_tests::speedscope::validate(&broken).is_err(), "the schema accepts an event of type X");

    // speedscope itself: the title is the file's name and the toolbar shows the first profile of
    // three; a file it cannot import shows "Something went wrong" and neither.
    let dom = tracer_tests::speedscope::load_in_browser(&out, 10_000);
    assert!(dom.contains("<title>tracer trace - speedscope</title>"), "{dom}");
    // (The toolbar puts the name and the count in elements of their own.)
    assert!(dom.contains(&format!(">{}<", profiles[0].0)) && dom.contains("(1/3)"), "{dom}");
    assert!(!dom.contains("Something went wrong"), "{dom}");
    // The same file with the main thread's first close naming the wrong frame.
    let mut wrong = file.clone();
    let events = wrong["profiles"][0]["events"].as_array_mut().unwrap();
    let first_close = events.iter().position(|e| e["type"] == "C").unwrap();
    events[first_close]["frame"] = events[0]["frame"].clone();
    std::fs::write(&broken, wrong.to_string()).unwrap();
    let dom = tracer_tests::speedscope::load_in_browser(&broken, 10_000);
    assert!(dom.contains("Something went wrong"), "speedscope loads a file that closes the wrong frame: {dom}");
}
