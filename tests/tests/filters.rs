//! Predicates in patterns (`-f 'FUNC if EXPR'`), evaluated in the kernel: on the `filters` fixture
//! (its calls and their arguments are listed in `fixtures/c/filters.c`), each predicate gives
//! exactly the matching calls with their returns, calls nested in a refused one are kept, the
//! counters in `trace_end` are exact, and bad expressions are refused with one sentence and a
//! caret.

use serde_json::Value;
use tracer_tests::{Trace, fixture, record, temp_dir, tracer};

fn filtered(patterns: &[&str]) -> Trace {
    let dir = temp_dir();
    let exe = fixture("filters");
    let mut args: Vec<&str> = Vec::new();
    for p in patterns {
        args.extend(["-f", p]);
    }
    args.extend(["--", exe.to_str().unwrap()]);
    let (run, trace) = record(dir.path(), &args);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(trace.lost(), 0, "{:?}", trace.end);
    trace.check_nesting();
    trace
}

/// The `(name, times, loud)` of each `greet` call, in order, and checks each has its return.
fn greets(t: &Trace) -> Vec<(String, i64, bool)> {
    let calls = t.calls("greet");
    assert_eq!(t.returns("greet").len(), calls.len(), "every call has its return");
    calls
        .iter()
        .map(|c| {
            let p = &c["params"];
            (p["name"].as_str().unwrap().to_string(), p["times"].as_i64().unwrap(), p["loud"].as_bool().unwrap())
        })
        .collect()
}

fn owned(list: &[(&str, i64, bool)]) -> Vec<(String, i64, bool)> {
    list.iter().map(|(n, t, l)| (n.to_string(), *t, *l)).collect()
}

fn counters(t: &Trace, function: &str) -> (u64, u64, u64) {
    let c: &Value = &t.end["filters"][function];
    (c["seen"].as_u64().unwrap(), c["written"].as_u64().unwrap(), c["filtered_out"].as_u64().unwrap())
}

#[test]
fn a_string_equality_keeps_exactly_the_matching_calls() {
    let t = filtered(&[r#"greet if name == "bob""#]);
    assert_eq!(greets(&t), owned(&[("bob", 2, false), ("bob", -1, true)]));
    assert_eq!(counters(&t, "greet"), (7, 2, 5));
    assert_eq!(t.end["filters"]["greet"]["predicate"], r#"name == "bob""#);
    // Return values are those of the kept calls.
    let rets: Vec<i64> = t.returns("greet").iter().map(|r| r["ret"].as_i64().unwrap()).collect();
    assert_eq!(rets, [4, -2]);
}

#[test]
fn a_prefix_match() {
    let t = filtered(&[r#"greet if name =~ "bob*""#]);
    assert_eq!(greets(&t), owned(&[("bob", 2, false), ("bob", -1, true), ("bobby", 0, true)]));
    assert_eq!(counters(&t, "greet"), (7, 3, 4));
}

#[test]
fn integers_and_bools_combined() {
    let t = filtered(&["greet if times > 0 && loud"]);
    assert_eq!(greets(&t), owned(&[("alice", 1, true), ("dave", 5, true)]));
    assert_eq!(counters(&t, "greet"), (7, 2, 5));
}

#[test]
fn arguments_by_position_take_their_dwarf_type() {
    // arg1 is `int times`: negative as a 32-bit value.
    let t = filtered(&["greet if arg1 < 0"]);
    assert_eq!(greets(&t), owned(&[("bob", -1, true), ("carol", -3, false)]));
    assert_eq!(counters(&t, "greet"), (7, 2, 5));
}

#[test]
fn enumerators_by_name() {
    let t = filtered(&["paint if c == GREEN || c == BLUE"]);
    let calls = t.calls("paint");
    let ns: Vec<i64> = calls.iter().map(|c| c["params"]["n"].as_i64().unwrap()).collect();
    assert_eq!(ns, [2, 3, 4]);
    assert_eq!(t.returns("paint").len(), 3);
    assert_eq!(counters(&t, "paint"), (5, 3, 2));
}

#[test]
fn calls_nested_in_a_refused_call_are_kept_and_unfiltered_functions_untouched() {
    let t = filtered(&["visit if keep > 0", "greet", "tick"]);
    let visits: Vec<i64> = t.calls("visit").iter().map(|c| c["params"]["keep"].as_i64().unwrap()).collect();
    assert_eq!(visits, [5]);
    assert_eq!(t.returns("visit").len(), 1);
    // Both of visit's greets, the refused visit(0)'s too, and the five from main.
    assert_eq!(greets(&t).len(), 7);
    assert_eq!(t.calls("tick").len(), 200);
    assert_eq!(counters(&t, "visit"), (2, 1, 1));
    // Only functions with a predicate are counted.
    assert!(t.end["filters"].get("greet").is_none(), "{}", t.end);
}

#[test]
fn bad_expressions_are_refused_with_a_caret() {
    let exe = fixture("filters");
    let exe = exe.to_str().unwrap();
    let cases: &[(&str, &str, usize)] = &[
        ("greet if name > 3", "`name` is a string", 7),
        ("greet if nmae == 1", "no parameter `nmae` (name, times, loud)", 0),
        ("greet if times = 3", "`=` is not a comparison: write `==`", 6),
        ("paint if c == PURPLE", "`PURPLE` is not a value of", 5),
        ("greet if (times > 0", "`)` is expected here", 10),
    ];
    let dir = temp_dir();
    let out = dir.path().join("t.jsonl");
    for (pattern, sentence, caret) in cases {
        let run = tracer(&["record", "-o", out.to_str().unwrap(), "-f", pattern, "--", exe]);
        assert_ne!(run.code(), 0, "{pattern}: {run:?}");
        let lines: Vec<&str> = run.stderr.lines().collect();
        assert_eq!(lines.len(), 3, "{pattern}: one sentence, the expression, a caret: {run:?}");
        assert!(lines[0].starts_with("tracer: error: bad predicate in -f: "), "{pattern}: {run:?}");
        assert!(lines[0].contains(sentence), "{pattern}: {run:?}");
        assert!(!out.exists(), "nothing is written");
        let expr = pattern.split_once(" if ").unwrap().1;
        assert_eq!(lines[1], format!("  {expr}"), "{pattern}");
        assert_eq!(lines[2], format!("  {}^", " ".repeat(*caret)), "{pattern}: {run:?}");
    }
}

fn held_counters(t: &Trace, function: &str) -> (u64, u64, u64, u64) {
    let c: &Value = &t.end["filters"][function];
    let (seen, written, filtered) = counters(t, function);
    (seen, written, filtered, c["entries_lost"].as_u64().unwrap())
}

#[test]
fn ret_if_keeps_the_calls_whose_return_passes_with_their_entries() {
    let t = filtered(&["greet ret-if ret < 0"]);
    // Each kept call with the arguments its entry saw.
    assert_eq!(greets(&t), owned(&[("bob", -1, true), ("carol", -3, false)]));
    let rets: Vec<i64> = t.returns("greet").iter().map(|r| r["ret"].as_i64().unwrap()).collect();
    assert_eq!(rets, [-2, -6]);
    assert_eq!(held_counters(&t, "greet"), (7, 2, 5, 0));
    assert_eq!(t.end["filters"]["greet"]["ret_predicate"], "ret < 0");
    assert_eq!(t.end["filters"]["greet"]["predicate"], "");
}

#[test]
fn ret_if_after_an_entry_predicate_and_on_the_entry_arguments() {
    // `if loud` refuses bob(2) and carol at entry; `ret-if` then keeps bob(-1) (-2) and bobby
    // (0) of the five left, by their return and their entry's `name`.
    let t = filtered(&[r#"greet if loud ret-if ret <= 0 && name =~ "b*""#]);
    assert_eq!(greets(&t), owned(&[("bob", -1, true), ("bobby", 0, true)]));
    assert_eq!(held_counters(&t, "greet"), (7, 2, 5, 0));
}

#[test]
fn a_held_call_nests_in_its_caller_in_time_order() {
    let t = filtered(&["visit", "greet ret-if ret > 4"]);
    assert_eq!(greets(&t), owned(&[("dave", 5, true)]));
    assert_eq!(t.calls("visit").len(), 2);
    // check_nesting (in `filtered`) saw greet's entry, written at its return, back in its place:
    // after visit(5)'s entry and before visit(5)'s return.
    let at = |e: &Value| e["ts"].as_u64().unwrap();
    let (visit, greet) = (&t.calls("visit")[1], &t.calls("greet")[0]);
    assert!(at(visit) < at(greet) && at(greet) < at(t.returns("visit")[1]));
    assert_eq!(held_counters(&t, "greet"), (7, 1, 6, 0));
    assert!(t.end["filters"].get("visit").is_none(), "{}", t.end);
}

#[test]
fn min_duration_keeps_main_and_drops_the_short_ticks() {
    let dir = temp_dir();
    let exe = fixture("filters");
    let args = ["-f", "main", "-f", "tick", "-f", "greet", "--min-duration", "100ms", "--", exe.to_str().unwrap()];
    let (run, t) = record(dir.path(), &args);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.lost(), 0, "{:?}", t.end);
    // Not `check_nesting`: main's entry, written at its return, is back in time order only when
    // main lasted less than the reordering window (250 ms), and under an emulated VM it does not.
    assert_eq!((t.calls("main").len(), t.returns("main").len()), (1, 1));
    let (call, ret) = (t.calls("main")[0], t.returns("main")[0]);
    let duration = ret["duration_ns"].as_u64().unwrap();
    assert!(duration >= 200_000_000);
    assert_eq!(call["ts"].as_u64().unwrap() + duration, ret["ts"].as_u64().unwrap());
    assert_eq!((t.calls("tick").len(), t.calls("greet").len()), (0, 0));
    assert_eq!(held_counters(&t, "main"), (1, 1, 0, 0));
    assert_eq!(held_counters(&t, "tick"), (200, 0, 200, 0));
    assert_eq!(held_counters(&t, "greet"), (7, 0, 7, 0));
    assert_eq!(t.end["filters"]["tick"]["min_duration_ns"], 100_000_000);
}

#[test]
fn min_duration_keep_children_keeps_main_and_the_calls_inside_it() {
    let dir = temp_dir();
    let exe = fixture("filters");
    let exe = exe.to_str().unwrap();
    let args = [
        "-f",
        "main",
        "-f",
        "tick",
        "-f",
        "greet",
        "--min-duration",
        "100ms",
        "--min-duration-keep-children",
        "--",
        exe,
    ];
    let (run, t) = record(dir.path(), &args);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.lost(), 0, "{:?}", t.end);
    // main lasts 200 ms: it is written with its 200 ticks and 7 greets, each with its return
    // (all of them short, all inside main).
    for (function, n) in [("main", 1), ("tick", 200), ("greet", 7)] {
        assert_eq!((t.calls(function).len(), t.returns(function).len()), (n, n), "{function}");
    }
    let (call, ret) = (t.calls("main")[0], t.returns("main")[0]);
    let duration = ret["duration_ns"].as_u64().unwrap();
    assert!(duration >= 200_000_000);
    assert_eq!(call["ts"].as_u64().unwrap() + duration, ret["ts"].as_u64().unwrap());
    for tick in t.calls("tick") {
        let ts = tick["ts"].as_u64().unwrap();
        assert!(call["ts"].as_u64().unwrap() < ts && ts < ret["ts"].as_u64().unwrap(), "{tick}");
    }
    assert_eq!(held_counters(&t, "main"), (1, 1, 0, 0));
    assert_eq!(held_counters(&t, "tick"), (200, 200, 0, 0));
    assert_eq!(held_counters(&t, "greet"), (7, 7, 0, 0));
    for f in ["main", "tick", "greet"] {
        assert_eq!(t.end["filters"][f]["min_duration_ns"], 100_000_000, "{f}");
        assert_eq!(t.end["filters"][f]["children_dropped"], 0, "{f}");
    }
    // Without --min-duration it means nothing.
    let run = tracer(&["record", "--min-duration-keep-children", "--", exe]);
    assert!(run.code() != 0 && run.stderr.contains("--min-duration <DURATION>"), "{run:?}");
}

#[test]
fn ret_if_mistakes_are_refused_with_a_sentence() {
    let exe = fixture("filters");
    let exe = exe.to_str().unwrap();
    let cases: &[(&str, &str)] = &[
        ("greet if ret < 0", "not known when the call is decided (at its entry): use `ret-if`"),
        ("visit ret-if ret == 0", "`ret`: this function returns nothing"),
        ("greet ret-if ret == \"x\"", "`ret` is a int, not a string"),
    ];
    let dir = temp_dir();
    let out = dir.path().join("t.jsonl");
    for (pattern, sentence) in cases {
        let run = tracer(&["record", "-o", out.to_str().unwrap(), "-f", pattern, "--", exe]);
        assert_ne!(run.code(), 0, "{pattern}: {run:?}");
        assert!(run.stderr.lines().next().unwrap().contains(sentence), "{pattern}: {run:?}");
        assert!(!out.exists(), "nothing is written");
    }
    let run = tracer(&["record", "-o", out.to_str().unwrap(), "-e", "call", "--min-duration", "1ms", "--", exe]);
    assert_ne!(run.code(), 0, "{run:?}");
    assert!(run.stderr.contains("--events must include return"), "{run:?}");
}
