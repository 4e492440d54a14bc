//! Probe placement (issue 12): `work()` of the overhead bench built four ways, each probed at the
//! point of its fastest path, classified by the path the kernel takes, and traced exactly through
//! the moved probe.

use serde_json::{Value, json};
use tracer_tests::{fixture, record, temp_dir, u64_field};

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

#[test]
fn nop5_entry_is_optimized_where_it_is() {
    let (start, stderr) = trace_work("bench");
    assert_eq!(paths(&start), &json!({"optimized": ["work"], "emulated": [], "trap": []}), "{start}");
    assert!(stderr.contains("tracer: probes: 1 optimized, 0 emulated, 0 trap\n"), "{stderr}");
}

#[test]
fn cet_entry_moves_past_endbr64_onto_the_nop() {
    let (start, stderr) = trace_work("bench_cet");
    assert_eq!(
        paths(&start),
        &json!({"optimized": ["work"], "emulated": [], "trap": [], "moved": {"work": 4}}),
        "{start}"
    );
    assert!(stderr.contains("tracer: probes: 1 optimized, 0 emulated, 0 trap\n"), "{stderr}");
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
    assert!(line.contains(": work. For the fast path"), "{line}");
    assert!(line.contains("-pg -mfentry -mnop-mcount") && line.contains("-C force-frame-pointers=yes"), "{line}");
}

#[test]
fn patchable_entry_nops_are_emulated() {
    let (start, _) = trace_work("bench_pfe5");
    assert_eq!(paths(&start), &json!({"optimized": [], "emulated": ["work"], "trap": []}), "{start}");
}
