//! `tracer record --debug-kernel`: the eBPF programs' diagnostics of their rare failures, made to
//! happen for real. The fixture (`ipc unmapped`, tests/fixtures/c/ipc.c) unmaps a write's buffer
//! while the write waits on a full pipe, so `--capture-bytes` cannot read the payload when the
//! write returns: that is counted as `ipc_payload_unreadable` in every run, and said on stderr as
//! one `tracer: kernel: ...` line only with the flag.

use tracer_tests::{Run, Trace, fixture, record, temp_dir};

/// Traces `ipc unmapped` with `--capture-bytes 64` (and `extra`); returns the run, the trace and
/// the fixture's "unmapped FD ADDRESS" line's fd and address.
fn record_unmapped(extra: &[&str]) -> (Run, Trace, String, String) {
    let dir = temp_dir();
    let ipc = fixture("ipc");
    let mut args = vec!["--capture-bytes", "64", "-e", "ipc,spawn,exit"];
    args.extend(extra);
    args.extend(["--", ipc.to_str().unwrap(), "unmapped"]);
    let (run, t) = record(dir.path(), &args);
    assert_eq!(run.code(), 0, "{run:?}");
    // The failure happened (in the kernel's count), whether or not it is logged.
    assert_eq!(t.end["lost_events"]["ipc_payload_unreadable"], 1, "{}", t.end);
    let write = t.of_kind("send").find(|e| e["syscall"] == "write").expect("the write is recorded");
    assert_eq!(write["bytes"], 65536, "{write}");
    assert_eq!(write["payload"], "", "{write}");
    let line = run.stdout.lines().find_map(|l| l.strip_prefix("unmapped ")).expect("fixture output").to_string();
    let (fd, address) = line.split_once(' ').unwrap();
    (run, t, fd.to_string(), address.to_string())
}

fn kernel_lines(run: &Run) -> Vec<&str> {
    run.stderr.lines().filter(|l| l.starts_with("tracer: kernel: ")).collect()
}

#[test]
fn debug_kernel_says_which_payload_read_failed() {
    let (run, t, fd, address) = record_unmapped(&["--debug-kernel"]);
    let pid = t.start["targets"][0]["pid"].as_u64().unwrap();
    assert_eq!(
        kernel_lines(&run),
        [format!("tracer: kernel: ipc payload unreadable: pid {pid} fd {fd} address {address} length 64 error -14")],
        "{}",
        run.stderr
    );
}

#[test]
fn without_debug_kernel_the_failure_is_only_counted() {
    let (run, _t, _, _) = record_unmapped(&[]);
    assert_eq!(kernel_lines(&run), Vec::<&str>::new(), "{}", run.stderr);
    assert!(run.stderr.contains("ipc_payload_unreadable: 1"), "{}", run.stderr);
}
