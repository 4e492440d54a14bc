//! Triggers and depth (`--start-at`, `--stop-at`, `--depth`), decided in the kernel: on the
//! `filters` fixture's `triggers` run (its calls are listed in `fixtures/c/filters.c`: `work` on
//! two threads one after the other, then a recursion five levels deep), each option gives exactly
//! the calls it should on each thread, every call written has its return and no other return is
//! written, the counters in `trace_end` add up, and bad values are refused with one sentence.

use std::collections::BTreeMap;

use serde_json::Value;
use tracer_tests::{LocalAgent, Trace, fixture, gen_secret, record, temp_dir, tracer};

fn traced(args: &[&str]) -> Trace {
    let dir = temp_dir();
    let exe = fixture("filters");
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--", exe.to_str().unwrap(), "triggers"]);
    let (run, trace) = record(dir.path(), &all);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(trace.lost(), 0, "{:?}", trace.end);
    // Every call has its return in order, and no return is without its call.
    trace.check_nesting();
    trace
}

/// Calls of `function` per thread, in the order the threads first appear; checks that the
/// function's returns are as many as its calls on each thread.
fn per_thread(t: &Trace, function: &str) -> Vec<usize> {
    let mut order: Vec<u64> = Vec::new();
    for e in &t.events {
        let tid = e["tid"].as_u64().unwrap();
        if e["kind"] == "call" && !order.contains(&tid) {
            order.push(tid);
        }
    }
    let count = |kind: &str| {
        let mut by: BTreeMap<u64, usize> = BTreeMap::new();
        for e in t.events.iter().filter(|e| e["kind"] == kind && e["function"] == function) {
            *by.entry(e["tid"].as_u64().unwrap()).or_default() += 1;
        }
        by
    };
    let (calls, returns) = (count("call"), count("return"));
    assert_eq!(calls, returns, "{function}: each call has its return, on its thread");
    order.iter().filter_map(|tid| calls.get(tid).copied()).collect()
}

/// (seen, written, filtered_out, by_trigger, by_depth) of `function`, checking that seen =
/// written + filtered_out and that no return went unmatched.
fn counters(t: &Trace, function: &str) -> (u64, u64, u64, u64, u64) {
    let c: &Value = &t.end["filters"][function];
    let n = |field: &str| c[field].as_u64().unwrap_or_else(|| panic!("{field} of {function}: {}", t.end));
    assert_eq!(n("seen"), n("written") + n("filtered_out"), "{function}: {c}");
    assert_eq!(n("returns_unmatched"), 0, "{function}: {c}");
    (n("seen"), n("written"), n("filtered_out"), n("by_trigger"), n("by_depth"))
}

#[test]
fn start_at_writes_each_threads_calls_from_its_entry_on() {
    let t = traced(&["-f", "a", "--start-at", "on_"]);
    // Per thread: on_'s two a(), off_'s one, the last four; not the first three, on the second
    // thread either (a new thread starts not recording).
    assert_eq!(per_thread(&t, "a"), [7, 7]);
    assert_eq!(per_thread(&t, "on_"), [1, 1]);
    assert!(t.calls("off_").is_empty() && t.calls("work").is_empty(), "only -f and trigger functions");
    assert_eq!(counters(&t, "a"), (20, 14, 6, 6, 0));
    assert_eq!(counters(&t, "on_"), (2, 2, 0, 0, 0));
}

/// A collector's `--start-at` and `--depth` are decided in the agent's kernel as `record`'s
/// are: the merged trace has the same calls per thread and the same counters.
#[test]
fn an_agent_applies_the_triggers_a_collector_asks_for() {
    let dir = temp_dir();
    let secret = gen_secret(dir.path(), "s");
    let secret = secret.to_str().unwrap();
    let agent =
        LocalAgent::start(dir.path(), "h", &["--listen", "127.0.0.1:0", "--secret-file", secret, "--allow-commands"]);
    let exe = fixture("filters");
    let out = dir.path().join("merged.jsonl");
    let (spec, command) = (agent.spec("h"), format!("h:{} triggers", exe.display()));
    let run = tracer(&[
        "collect",
        "--agent",
        &spec,
        "--secret-file",
        secret,
        "-f",
        "a",
        "-f",
        "rec",
        "--start-at",
        "on_",
        "--depth",
        "2",
        "-c",
        &command,
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(run.code(), 0, "{run:?}");
    let t = Trace::load(&out);
    assert_eq!(t.lost(), 0, "{}", t.end);
    t.check_nesting();
    assert_eq!(per_thread(&t, "a"), [7, 7]);
    assert_eq!(counters(&t, "a"), (20, 14, 6, 6, 0));
    // The recursion runs last on the main thread, which records since its on_(): two levels of five.
    assert_eq!(counters(&t, "rec"), (5, 2, 3, 0, 3));
}

#[test]
fn stop_at_stops_each_thread_until_a_start() {
    let t = traced(&["-f", "a", "--stop-at", "off_"]);
    // Per thread: the first three and on_'s two; off_'s call is not written, nor anything after.
    assert_eq!(per_thread(&t, "a"), [5, 5]);
    assert!(t.calls("off_").is_empty() && t.returns("off_").is_empty());
    assert_eq!(counters(&t, "a"), (20, 10, 10, 10, 0));
    assert_eq!(counters(&t, "off_"), (2, 0, 2, 2, 0));
}

#[test]
fn a_stop_inside_a_written_call_keeps_its_return() {
    let t = traced(&["-f", "a", "--start-at", "work", "--stop-at", "off_"]);
    // work's call is written, recording stops inside it (off_), and its return is still written.
    assert_eq!(per_thread(&t, "work"), [1, 1]);
    assert_eq!(per_thread(&t, "a"), [5, 5]);
    assert_eq!(counters(&t, "work"), (2, 2, 0, 0, 0));
    assert_eq!(counters(&t, "a"), (20, 10, 10, 10, 0));
}

#[test]
fn a_start_inside_an_unwritten_call_writes_no_return_for_it() {
    let t = traced(&["-f", "a", "--stop-at", "work", "--start-at", "on_"]);
    // work's call is not written, recording starts inside it (on_): its return is not written.
    assert!(t.calls("work").is_empty() && t.returns("work").is_empty(), "{:?}", t.end);
    assert_eq!(per_thread(&t, "on_"), [1, 1]);
    assert_eq!(per_thread(&t, "a"), [7, 7]);
    assert_eq!(counters(&t, "work"), (2, 0, 2, 2, 0));
}

#[test]
fn depth_writes_exactly_that_many_levels() {
    for depth in 1..=3u64 {
        let t = traced(&["-f", "rec", "--depth", &depth.to_string()]);
        let levels: Vec<i64> = t.calls("rec").iter().map(|c| c["params"]["n"].as_i64().unwrap()).collect();
        let expected: Vec<i64> = (0..depth as i64).map(|i| 5 - i).collect();
        assert_eq!(levels, expected, "--depth {depth}");
        assert_eq!(per_thread(&t, "rec"), [depth as usize]);
        assert_eq!(counters(&t, "rec"), (5, depth, 5 - depth, 0, 5 - depth), "--depth {depth}");
    }
}

#[test]
fn depth_counts_the_traced_calls_a_thread_has_open() {
    // work is level 1, on_ and off_ level 2: their a() are level 3 and not written; work's own
    // seven a() are level 2.
    let t = traced(&["-f", "a", "-f", "work", "-f", "on_", "-f", "off_", "--depth", "2"]);
    assert_eq!(per_thread(&t, "a"), [7, 7]);
    assert_eq!(per_thread(&t, "on_"), [1, 1]);
    assert_eq!(counters(&t, "a"), (20, 14, 6, 0, 6));
}

#[test]
fn bad_values_are_refused_with_one_sentence() {
    let exe = fixture("filters");
    let exe = exe.to_str().unwrap();
    let dir = temp_dir();
    let out = dir.path().join("t.jsonl");
    let cases: &[(&[&str], &str)] = &[
        (&["--depth", "0"], "--depth must be between 1 (only the outermost traced calls) and 64, got 0"),
        (&["--depth", "65"], "--depth must be between 1 (only the outermost traced calls) and 64, got 65"),
        (&["-f", "a", "--start-at", "no_such_fn"], "--start-at 'no_such_fn' matches no function in "),
        (&["-f", "a", "--stop-at", "nope*"], "--stop-at 'nope*' matches no function in "),
        (
            &["-e", "call", "--depth", "2"],
            "--start-at, --stop-at and --depth match each call to its return: --events must include return",
        ),
    ];
    for (args, sentence) in cases {
        let mut all = vec!["record", "-o", out.to_str().unwrap()];
        all.extend_from_slice(args);
        all.extend(["--", exe, "triggers"]);
        let run = tracer(&all);
        assert_ne!(run.code(), 0, "{args:?}: {run:?}");
        let lines: Vec<&str> = run.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: one sentence: {run:?}");
        assert!(lines[0].starts_with(&format!("tracer: error: {sentence}")), "{args:?}: {run:?}");
        assert!(!out.exists(), "nothing is written");
    }
}
