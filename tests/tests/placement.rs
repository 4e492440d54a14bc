//! Probe placement (issue 12): `work()` of the overhead bench built four ways, each probed at the
//! point of its fastest path, classified by the path the kernel takes, and traced exactly through
//! the moved probe.

use serde_json::{Value, json};
use std::process::Command;

use tracer_tests::{fixture, kernel_optimizes_nop5, nop5_path, record, temp_dir, tracer_bin, u64_field};

/// Calls per run: the plain build traps twice a call (about 30 µs here).
const CALLS: u64 = 2000;

/// Records `work()` of `build` and checks every call and return: `work(acc)` is called with
/// `acc = 0, 1, 2, ...` and returns `acc + 1`. Returns the trace's start line and the stderr.
fn trace_work(build: &str) -> (Value, String) {
    let dir = temp_dir();
    let exe = fixture(build);
    let n = CALLS.to_string();
    let (run, t) = record(dir.path(), &["-e", "call,return", "-f", "work", "--", exe.to_str().unwrap(), &n]);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.lost(), 0, "{run:?}");
    let calls = t.calls("work");
    let returns = t.returns("work");
    assert_eq!(calls.len() as u64, CALLS, "{build}: calls");
    assert_eq!(returns.len() as u64, CALLS, "{build}: returns");
    for (i, (call, ret)) in calls.iter().zip(&returns).enumerate() {
        assert_eq!(call["args"][0].as_u64(), Some(i as u64), "{build}: argument of call {i}: {call}");
        assert_eq!(u64_field(ret, "retval"), i as u64 + 1, "{build}: return value of call {i}: {ret}");
    }
    t.check_nesting();
    (t.start, run.stderr)
}

fn paths(start: &Value) -> &Value {
    &start["probe_paths"]
}

/// The paths with `work` on the one a 5-byte nop takes on this kernel (optimized from 6.18,
/// emulated before), and the status line that says so.
fn on_nop5_path(moved: Option<u64>) -> (Value, &'static str) {
    let mut expected = json!({"optimized": [], "emulated": [], "trap": []});
    expected[nop5_path()] = json!(["work"]);
    if let Some(by) = moved {
        expected["moved"] = json!({"work": by});
    }
    let line = if kernel_optimizes_nop5() {
        "tracer: probes: 1 optimized, 0 emulated, 0 trap\n"
    } else {
        "tracer: probes: 0 optimized, 1 emulated, 0 trap\n"
    };
    (expected, line)
}

#[test]
fn nop5_entry_is_optimized_where_the_kernel_can() {
    let (start, stderr) = trace_work("bench");
    let (expected, line) = on_nop5_path(None);
    assert_eq!(paths(&start), &expected, "{start}");
    assert!(stderr.contains(line), "{stderr}");
    assert_eq!(start["kernel"]["optimized_probes"], kernel_optimizes_nop5(), "{start}");
}

#[test]
fn cet_entry_moves_past_endbr64_onto_the_nop() {
    let (start, stderr) = trace_work("bench_cet");
    let (expected, line) = on_nop5_path(Some(4));
    assert_eq!(paths(&start), &expected, "{start}");
    assert!(stderr.contains(line), "{stderr}");
}

#[test]
fn plain_entry_traps_and_stderr_says_what_to_do() {
    let (start, stderr) = trace_work("bench_plain");
    assert_eq!(paths(&start), &json!({"optimized": [], "emulated": [], "trap": ["work"]}), "{start}");
    let line = stderr.lines().find(|l| l.starts_with("tracer: probes:")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        line.starts_with("tracer: probes: 0 optimized, 0 emulated, 1 trap; slow (a trap and a single-step"),
        "{line}"
    );
    assert!(line.contains("~15 µs a hit): work"), "{line}");
}

/// The advice on slow probes is a paragraph: shown the first time on a machine and with `-v`,
/// otherwise the line says that `-v` shows it.
#[test]
fn the_advice_on_slow_probes_is_shown_once_and_with_v() {
    let dir = temp_dir();
    let state = dir.path().join("state");
    let exe = fixture("bench_plain");
    let stderr_of = |extra: &[&str]| {
        let out = dir.path().join("t.jsonl");
        let mut args = vec!["record", "-o", out.to_str().unwrap(), "-e", "call", "-f", "work"];
        args.extend(extra);
        args.extend(["--", exe.to_str().unwrap(), "10"]);
        let output = Command::new(tracer_bin()).args(&args).env("XDG_STATE_HOME", &state).output().unwrap();
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stderr).unwrap()
    };
    let advice = |stderr: &str| {
        stderr
            .lines()
            .find(|l| l.starts_with("tracer: For the fast path give functions a 5-byte nop entry"))
            .map(str::to_owned)
    };
    let first = stderr_of(&[]);
    let text = advice(&first).unwrap_or_else(|| panic!("no advice the first time: {first}"));
    assert!(text.contains("-pg -mfentry -mnop-mcount") && text.contains("-C force-frame-pointers=yes"), "{text}");
    assert!(state.join("tracer/probe-path-advice-shown").exists());

    let second = stderr_of(&[]);
    assert_eq!(advice(&second), None, "{second}");
    assert!(second.contains("~15 µs a hit): work (-v says how to make them fast)\n"), "{second}");

    let verbose = stderr_of(&["-v"]);
    assert_eq!(advice(&verbose), Some(text), "{verbose}");
}

#[test]
fn patchable_entry_nops_are_emulated() {
    let (start, _) = trace_work("bench_pfe5");
    assert_eq!(paths(&start), &json!({"optimized": [], "emulated": ["work"], "trap": []}), "{start}");
}
