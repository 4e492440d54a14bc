//! `tracer top`: statistics aggregated in the kernel, against fixtures with known counts and
//! known sleeps.

use serde_json::Value;
use tracer_tests::{fixture, temp_dir, tracer, u64_field};

/// Runs `tracer top --json ARGS` to its end; returns every snapshot (the last one is final).
fn top(args: &[&str]) -> Vec<Value> {
    let mut all = vec!["top", "--json"];
    all.extend_from_slice(args);
    let run = tracer(&all);
    assert_eq!(run.code(), 0, "{run:?}");
    assert!(run.stderr.contains("tracer: tracing "), "{run:?}");
    // Standard output is the statistics alone: the traced command's own output (the bench
    // fixture prints its loop time) goes to stderr.
    let snapshots: Vec<Value> =
        run.stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect();
    let (last, rest) = snapshots.split_last().unwrap_or_else(|| panic!("no snapshot: {run:?}"));
    assert_eq!(last["final"], true, "{last}");
    assert!(rest.iter().all(|s| s["final"] == false), "{run:?}");
    for s in &snapshots {
        assert_eq!(s["kind"], "top", "{s}");
        for field in ["elapsed_ns", "interval_ns"] {
            assert!(s[field].is_u64(), "{field} in {s}");
        }
        let lost = s["lost"].as_object().unwrap_or_else(|| panic!("no lost in {s}"));
        for field in ["threads_full", "keys_full", "too_deep", "no_return", "untraced_children"] {
            assert_eq!(lost[field], 0, "{field} in {s}");
        }
        for row in s["functions"].as_array().unwrap() {
            for field in [
                "function",
                "module",
                "calls",
                "calls_per_s",
                "returns",
                "total_ns",
                "mean_ns",
                "p50_ns",
                "p90_ns",
                "p99_ns",
            ] {
                assert!(!row[field].is_null(), "{field} in {row}");
            }
        }
    }
    snapshots
}

fn row<'a>(snapshot: &'a Value, function: &str) -> &'a Value {
    snapshot["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["function"] == function)
        .unwrap_or_else(|| panic!("no row for {function}: {snapshot}"))
}

const MS: u64 = 1_000_000;
/// A percentile is a bucket's midpoint: within 3.2% of the durations in that bucket.
fn at_least(value: u64, floor_ns: u64) -> bool {
    value as f64 >= floor_ns as f64 * 0.968
}

#[test]
fn counts_are_exact_and_percentiles_match_known_sleeps() {
    let timing = fixture("timing");
    let mut args = vec!["-i", "0.2"];
    for f in ["run", "step", "leaf", "recurse", "worker", "child_main"] {
        args.extend(["-f", f]);
    }
    args.extend(["--", timing.to_str().unwrap()]);
    let snapshots = top(&args);
    let last = snapshots.last().unwrap();
    for (function, calls) in [("run", 1), ("step", 3), ("leaf", 9), ("recurse", 4), ("worker", 1), ("child_main", 1)] {
        let r = row(last, function);
        assert_eq!(u64_field(r, "calls"), calls, "{function}: {r}");
        assert_eq!(u64_field(r, "returns"), calls, "{function}: {r}");
        assert!(r.get("pid").is_none(), "{r}");
    }
    // leaf sleeps 500 µs; step 2 ms and two leaves; recurse(3) 4 x 300 µs, recurse(0) 300 µs.
    let leaf = row(last, "leaf");
    for p in ["p50_ns", "p90_ns", "p99_ns", "mean_ns"] {
        assert!(at_least(u64_field(leaf, p), MS / 2), "leaf {p}: {leaf}");
        assert!(u64_field(leaf, p) < 100 * MS, "leaf {p}: {leaf}");
    }
    assert!(u64_field(leaf, "total_ns") >= 9 * MS / 2, "{leaf}");
    let step = row(last, "step");
    assert!(at_least(u64_field(step, "p50_ns"), 3 * MS), "{step}");
    let recurse = row(last, "recurse");
    // Nearest rank over 4 calls: p50 is the second shortest (recurse(1), 600 µs), p90 and p99
    // the longest (1.2 ms).
    assert!(at_least(u64_field(recurse, "p50_ns"), 6 * MS / 10), "{recurse}");
    assert!(at_least(u64_field(recurse, "p99_ns"), 12 * MS / 10), "{recurse}");
    assert!(u64_field(recurse, "p50_ns") < u64_field(recurse, "p99_ns"), "{recurse}");
    let run = row(last, "run");
    assert!(at_least(u64_field(run, "total_ns"), 3 * 3 * MS + 12 * MS / 10), "{run}");
    // Most total time first.
    let totals: Vec<u64> = last["functions"].as_array().unwrap().iter().map(|r| u64_field(r, "total_ns")).collect();
    assert!(totals.windows(2).all(|w| w[0] >= w[1]), "{totals:?}");
}

#[test]
fn by_process_splits_rows_per_process() {
    let timing = fixture("timing");
    let snapshots = top(&["--by-process", "-f", "leaf", "--", timing.to_str().unwrap()]);
    let last = snapshots.last().unwrap();
    let rows = last["functions"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{last}");
    let mut calls: Vec<u64> = rows.iter().map(|r| u64_field(r, "calls")).collect();
    calls.sort();
    assert_eq!(calls, [1, 8], "the child calls leaf once, the parent's threads eight times: {last}");
    let pids: Vec<u64> = rows.iter().map(|r| u64_field(r, "pid")).collect();
    assert_ne!(pids[0], pids[1], "{last}");
}

#[test]
fn many_calls_through_the_optimized_probe_are_counted_exactly() {
    let bench = fixture("bench");
    let snapshots = top(&["-f", "work", "--", bench.to_str().unwrap(), "100000"]);
    let work = row(snapshots.last().unwrap(), "work");
    assert_eq!(u64_field(work, "calls"), 100_000, "{work}");
    assert_eq!(u64_field(work, "returns"), 100_000, "{work}");
}

#[test]
fn exceptions_through_timed_frames_leave_the_program_whole_and_are_not_timed() {
    // Three levels left by a C++ exception on each of 100 turns: their calls are counted, never
    // timed (their returns never come), and the program runs as untraced, without an abort.
    let unwinds = fixture("unwinds_cpp");
    let run =
        tracer(&["top", "--json", "-f", "level*", "-f", "leaf", "-f", "tail", "--", unwinds.to_str().unwrap(), "100"]);
    assert_eq!(run.code(), 7, "the command's own exit code: {run:?}");
    // With --json the statistics alone are on stdout; the command's own output is on stderr.
    assert!(run.stderr.contains("caught 100 cleanups 100 sum 24950\n"), "{run:?}");
    assert!(run.stdout.lines().all(|l| l.starts_with('{')), "{run:?}");
    let last: Value = serde_json::from_str(run.stdout.lines().last().unwrap()).unwrap();
    for (function, calls, returns) in
        [("level1", 100, 0), ("level2", 100, 0), ("level3", 100, 0), ("leaf", 200, 200), ("tail", 100, 100)]
    {
        let r = row(&last, function);
        assert_eq!((u64_field(r, "calls"), u64_field(r, "returns")), (calls, returns), "{function}: {r}");
    }
    assert_eq!(last["lost"]["no_return"], 300, "{last}");
    assert_eq!(last["lost"]["too_deep"], 0, "{last}");
    assert!(run.stderr.contains("no_return: 300"), "said on stderr: {run:?}");
}

#[test]
fn bad_input_is_refused_in_one_sentence() {
    let timing = fixture("timing");
    let t = timing.to_str().unwrap();
    tracer(&["top", "-f", "no_such_function", "--", t])
        .assert_error("function pattern 'no_such_function' matches nothing");
    tracer(&["top"]).assert_error("nothing to trace");
    tracer(&["top", "-i", "0", "--", t]).assert_error("--interval must be more than 0 seconds");
    tracer(&["top", "-p", "4999999"]).assert_error("no process with pid 4999999 exists");
    let dir = temp_dir();
    let script = dir.path().join("script.sh");
    std::fs::write(&script, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    tracer(&["top", "-b", script.to_str().unwrap()])
        .assert_error(&format!("{} is not an ELF executable", script.display()));
    let gofixture = fixture("gofixture");
    tracer(&["top", "-f", "main.work", "--", gofixture.to_str().unwrap()])
        .assert_error("tracer top cannot time Go functions yet");
}

#[test]
fn triggers_and_depth_time_only_the_calls_record_would_write() {
    // The `filters` fixture's `triggers` run (fixtures/c/filters.c): `work` on two threads, then
    // a recursion five levels deep. As `record --start-at on_ -f a` writes them: per thread,
    // on_'s two a(), off_'s one and the last four.
    let exe = fixture("filters");
    let exe = exe.to_str().unwrap();
    let snapshots = top(&["-f", "a", "--start-at", "on_", "--", exe, "triggers"]);
    let last = snapshots.last().unwrap();
    assert_eq!((u64_field(row(last, "a"), "calls"), u64_field(row(last, "a"), "returns")), (14, 14), "{last}");
    assert_eq!(u64_field(row(last, "on_"), "calls"), 2, "{last}");
    let snapshots = top(&["-f", "rec", "--depth", "2", "--", exe, "triggers"]);
    let last = snapshots.last().unwrap();
    assert_eq!((u64_field(row(last, "rec"), "calls"), u64_field(row(last, "rec"), "returns")), (2, 2), "{last}");
}

#[test]
fn predicates_count_and_time_only_the_calls_that_pass() {
    // The `filters` fixture (fixtures/c/filters.c): seven greet() calls, two with name "bob",
    // two of them inside visit(0) and visit(5).
    let exe = fixture("filters");
    let exe = exe.to_str().unwrap();
    let snapshots = top(&["-f", r#"greet if name == "bob""#, "--", exe]);
    let last = snapshots.last().unwrap();
    let greet = row(last, "greet");
    assert_eq!((u64_field(greet, "calls"), u64_field(greet, "returns")), (2, 2), "{last}");
    let f = &last["filters"]["greet"];
    assert_eq!(f["predicate"], r#"name == "bob""#, "{last}");
    assert_eq!((u64_field(f, "seen"), u64_field(f, "filtered_out")), (7, 5), "{last}");
    // A refused call's callees are decided on their own: visit(0) is refused, its greet is not.
    let snapshots = top(&["-f", "visit if keep > 0", "-f", "greet", "--", exe]);
    let last = snapshots.last().unwrap();
    let (visit, greet) = (row(last, "visit"), row(last, "greet"));
    assert_eq!((u64_field(visit, "calls"), u64_field(visit, "returns")), (1, 1), "{last}");
    assert_eq!((u64_field(greet, "calls"), u64_field(greet, "returns")), (7, 7), "{last}");
    assert!(last["filters"].get("greet").is_none(), "{last}");
    assert_eq!(u64_field(&last["filters"]["visit"], "filtered_out"), 1, "{last}");
    // Decided at the return: refused in one sentence.
    tracer(&["top", "-f", "greet ret-if ret < 0", "--", exe])
        .assert_error("tracer top decides calls at their entry only");
}

#[test]
fn min_duration_counts_and_times_only_the_long_calls() {
    // The `filters` fixture's main lasts at least 200 ms; its 200 tick() calls a few µs each.
    let exe = fixture("filters");
    let snapshots = top(&["-f", "main", "-f", "tick", "--min-duration", "100ms", "--", exe.to_str().unwrap()]);
    let last = snapshots.last().unwrap();
    let main = row(last, "main");
    assert_eq!((u64_field(main, "calls"), u64_field(main, "returns")), (1, 1), "{last}");
    assert!(at_least(u64_field(main, "total_ns"), 200 * MS), "{main}");
    let rows = last["functions"].as_array().unwrap();
    assert!(rows.iter().all(|r| r["function"] != "tick"), "no tick lasted 100 ms: {last}");
}
