//! Probe placement (issue 12): `work()` of the overhead bench built four ways, each probed at the
//! point of its fastest path, classified by the path the kernel takes, and traced exactly through
//! the moved probe.

use serde_json::{Value, json};
use tracer_tests::{fixture, kernel_optimizes_nop5, nop5_path, record, temp_dir, u64_field};

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
    assert!(line.contains(": work. For the fast path"), "{line}");
    assert!(line.contains("-pg -mfentry -mnop-mcount") && line.contains("-C force-frame-pointers=yes"), "{line}");
}

#[test]
fn patchable_entry_nops_are_emulated() {
    let (start, _) = trace_work("bench_pfe5");
    assert_eq!(paths(&start), &json!({"optimized": [], "emulated": ["work"], "trap": []}), "{start}");
}
