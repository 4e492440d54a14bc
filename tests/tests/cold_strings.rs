//! Strings in pages the traced program has not touched yet (`tests/fixtures/c/cold_strings.c`):
//! a uprobe program's fast read cannot fault a page in, so the sleepable programs fault it in with
//! `bpf_copy_from_user` and read every string exactly (Linux 6.0+, which every kernel these tests
//! run on has); without them (`--no-sleepable`, as on an older kernel) each is marked unreadable
//! and stderr says why, once.

use serde_json::{Value, json};
use tracer_tests::{Run, Trace, fixture, record, temp_dir};

const CALLS: [&str; 5] = ["alice", "bob", "carol", "dave", "across pages"];

fn run(extra: &[&str]) -> (Run, Trace) {
    let dir = temp_dir();
    let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    args.extend(["-e".into(), "call".into(), "-f".into(), "hello".into(), "--".into()]);
    args.push(fixture("cold_strings").display().to_string());
    let (run, trace) = record(dir.path(), &args);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(trace.lost(), 0);
    (run, trace)
}

fn names(trace: &Trace) -> Vec<Value> {
    let calls = trace.calls("hello");
    assert_eq!(calls.len(), CALLS.len(), "{calls:?}");
    for (n, call) in calls.iter().enumerate() {
        assert_eq!(call["params"]["n"], json!(n), "{call}");
    }
    calls.iter().map(|c| c["params"]["name"].clone()).collect()
}

#[test]
fn strings_in_untouched_pages_are_read_exactly() {
    let (run, trace) = run(&[]);
    let expected: Vec<Value> = CALLS.iter().map(|s| json!(s)).collect();
    assert_eq!(names(&trace), expected);
    assert!(!run.stderr.contains("marked unreadable"), "{}", run.stderr);
}

/// A breakpoint's `char *` local in an untouched page: read exactly, through the sleepable USDT
/// program, as a call's parameter is.
#[test]
fn a_breakpoint_reads_strings_in_untouched_pages() {
    let source = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/c/cold_strings.c")).unwrap();
    let line = source.lines().position(|l| l.contains("sink = name[0] + n;")).expect("hello's line") + 1;
    let dir = temp_dir();
    let at = format!("cold_strings.c:{line}");
    let exe = fixture("cold_strings").display().to_string();
    let (run, trace) = record(dir.path(), &["-e", "break", "-B", &at, "--", &exe]);
    assert_eq!(run.code(), 0, "{run:?}");
    assert!(!run.stderr.contains("marked unreadable"), "{}", run.stderr);
    let locals: Vec<Value> = trace.of_kind("break").map(|b| b["locals"].clone()).collect();
    let expected: Vec<Value> = CALLS.iter().enumerate().map(|(n, s)| json!({"name": s, "n": n})).collect();
    assert_eq!(locals, expected);
}

#[test]
fn without_sleepable_probes_they_stay_unreadable_and_stderr_says_why_once() {
    let (run, trace) = run(&["--no-sleepable"]);
    for name in names(&trace) {
        let why = name["unreadable"].as_str().unwrap_or_else(|| panic!("read without faulting: {name}"));
        assert!(why.starts_with("memory at 0x") && why.ends_with(" could not be read"), "{why}");
    }
    let said = run.stderr.lines().filter(|l| l.contains("marked unreadable")).collect::<Vec<_>>();
    assert_eq!(
        said,
        [
            "tracer: warning: a string in a page the traced program has not touched yet (of .rodata, say) cannot be read and is marked unreadable: --no-sleepable asks for the non-faulting read only"
        ],
        "{}",
        run.stderr
    );
}
