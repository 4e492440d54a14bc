//! What a newcomer meets first: the readers' default input, and pipes closed early (`| head`).
//! No kernel needed: traces are written here.

use std::{
    io::Read as _,
    path::Path,
    process::{Command, Stdio},
};

use tracer_tests::{temp_dir, tracer_bin};

/// A trace of `n` functions called once each, between the golden demo trace's first and last
/// lines: large enough that no reader's output fits in a pipe.
fn many_functions_trace(path: &Path, n: u64) {
    let golden =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/golden/demo.jsonl")).unwrap();
    let (start, end) = (golden.lines().next().unwrap(), golden.lines().last().unwrap());
    let start_ts: u64 = serde_json::from_str::<serde_json::Value>(start).unwrap()["ts"].as_u64().unwrap();
    let mut text = format!("{start}\n");
    for i in 0..n {
        let ts = start_ts + 1000 + i * 100;
        let common =
            format!(r#""host":"vm","pid":27352,"tid":27352,"function":"function_number_{i}","module":"/opt/x""#);
        text += &format!("{{\"kind\":\"call\",\"ts\":{ts},{common},\"args\":[{i}]}}\n");
        text += &format!("{{\"kind\":\"return\",\"ts\":{},{common},\"retval\":0,\"duration_ns\":50}}\n", ts + 50);
    }
    text += &format!("{end}\n");
    std::fs::write(path, text).unwrap();
}

/// Runs tracer in `dir`, reads the first 100 bytes of its output and closes the pipe: the exit
/// code and stderr.
fn head(dir: &Path, args: &[&str]) -> (i32, String) {
    let mut child = Command::new(tracer_bin())
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 100];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    (child.wait().unwrap().code().unwrap_or(-1), stderr)
}

/// `report`, `calls` and `export -o -` into a reader that stops after its first line end quietly
/// with 0, as `cat` would; `report` and `calls` read `trace.jsonl` when given no trace, as
/// perf and uftrace read their data file.
#[test]
fn readers_default_to_trace_jsonl_and_end_quietly_when_the_pipe_closes() {
    let dir = temp_dir();
    many_functions_trace(&dir.path().join("trace.jsonl"), 5000);
    for args in [
        &["report"][..],
        &["report", "--json"],
        &["calls"],
        &["export", "trace.jsonl", "-o", "-", "--format", "jsonl"],
        &["export", "trace.jsonl", "-o", "-", "--format", "chrome"],
    ] {
        assert_eq!(head(dir.path(), args), (0, String::new()), "tracer {args:?} | head -c 100");
    }
    let out = Command::new(tracer_bin()).args(["report", "--json"]).current_dir(dir.path()).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["functions"].as_array().unwrap().len(), 5000);
    // A file that is not there is named, once.
    let empty = temp_dir();
    let out = Command::new(tracer_bin()).arg("calls").current_dir(empty.path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.starts_with("tracer: error: cannot read trace.jsonl"), "{stderr}");
}
