//! Bad input: one clear sentence, a non-zero exit, and nothing attached or launched.

use std::os::unix::fs::PermissionsExt as _;

use tracer_tests::{fixture, temp_dir, tracer};

/// A command that leaves a marker file if it ever runs.
fn marker_command(dir: &std::path::Path) -> (std::path::PathBuf, Vec<String>) {
    let marker = dir.join("ran");
    let cmd = vec![fixture("calls").display().to_string(), "marker".to_string(), marker.display().to_string()];
    (marker, cmd)
}

fn record_args(dir: &std::path::Path, extra: &[&str], command: &[String]) -> Vec<String> {
    let mut args = vec!["record".to_string(), "-o".to_string(), dir.join("t.jsonl").display().to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    if !command.is_empty() {
        args.push("--".to_string());
        args.extend(command.iter().cloned());
    }
    args
}

#[test]
fn not_root() {
    let dir = temp_dir();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let (marker, cmd) = marker_command(dir.path());
    let run = tracer_tests::wait_with_timeout(
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(tracer_tests::tracer_bin())
            .args(record_args(dir.path(), &[], &cmd))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("setpriv"),
        "tracer as nobody",
    );
    run.assert_error("tracer must run as root");
    assert!(!marker.exists());
}

#[test]
fn missing_pid() {
    let dir = temp_dir();
    // pid_max is at most 2^22.
    tracer(&record_args(dir.path(), &["-p", "4999999"], &[])).assert_error("no process with pid 4999999 exists");
}

/// pid 2 is kthreadd, the kernel's thread of threads: it runs no user code.
#[test]
fn kernel_thread() {
    let dir = temp_dir();
    tracer(&record_args(dir.path(), &["-p", "2"], &[]))
        .assert_error("pid 2 is a kernel thread (kthreadd): it runs no user code to trace");
}

#[test]
fn nothing_to_trace() {
    let dir = temp_dir();
    tracer(&record_args(dir.path(), &[], &[])).assert_error("nothing to trace");
}

#[test]
fn binary_that_is_not_elf() {
    let dir = temp_dir();
    let script = dir.path().join("script.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = tracer(&record_args(dir.path(), &["-b", script.to_str().unwrap()], &[]));
    run.assert_error(&format!("{} is not an ELF executable", script.display()));
    // As a command it is no error (a wrapper: what it executes is traced, see wrappers.rs): it
    // runs, with a warning that its own functions cannot be probed.
    let run = tracer(&record_args(dir.path(), &[], &[script.display().to_string()]));
    assert_eq!(run.code(), 0, "{run:?}");
    let warning = format!("warning: {} is not an ELF executable: tracing its processes only", script.display());
    assert!(run.stderr.contains(&warning), "{run:?}");
    // A file that is not executable at all.
    let run = tracer(&record_args(dir.path(), &["-b", "/etc/passwd"], &[]));
    run.assert_error("/etc/passwd is not executable");
    let run = tracer(&record_args(dir.path(), &["-b", "/no/such/binary"], &[]));
    run.assert_error("/no/such/binary does not exist");
}

/// In a process given by pid a pattern must match (an error that suggests near names); in a
/// launched command it need not, as the command may be a wrapper of what it names (see
/// wrappers.rs): the command runs, with a warning at the start and the end that suggests them.
#[test]
fn pattern_that_matches_nothing_suggests_near_names() {
    let dir = temp_dir();
    let calls = tracer_tests::Background::start(&fixture("calls"), &["loop"]);
    let run = tracer(&record_args(dir.path(), &["-f", "fibb", "-p", &calls.pid().to_string()], &[]));
    run.assert_error("function pattern 'fibb' matches nothing in ");
    assert!(run.stderr.contains("did you mean fib"), "{run:?}");
    drop(calls);
    let (marker, cmd) = marker_command(dir.path());
    let run = tracer(&record_args(dir.path(), &["-f", "fibb"], &cmd));
    assert_eq!(run.code(), 0, "{run:?}");
    assert!(run.stderr.contains("defines no function matching 'fibb' (did you mean fib"), "{run:?}");
    assert!(run.stderr.contains("no function matching 'fibb' in any program the trace saw"), "{run:?}");
    assert!(marker.exists(), "the command ran");
    std::fs::remove_file(&marker).unwrap();
    // A module none of the command's files is may be a library a program it execs needs: said,
    // looked for there, and reported at the end (a running process's is an error at once).
    let run = tracer(&record_args(dir.path(), &["-f", "nosuchlib.so:malloc"], &cmd));
    assert_eq!(run.code(), 0, "{run:?}");
    assert!(
        run.stderr.contains("no file the command loads is module 'nosuchlib.so': it is looked for in the libraries"),
        "{run:?}"
    );
    assert!(run.stderr.contains("no function matching 'nosuchlib.so:malloc' in any program the trace saw"), "{run:?}");
    assert!(marker.exists(), "the command ran");
    let calls = tracer_tests::Background::start(&fixture("calls"), &["loop"]);
    let run = tracer(&record_args(dir.path(), &["-f", "nosuchlib.so:malloc", "-p", &calls.pid().to_string()], &[]));
    run.assert_error("module 'nosuchlib.so' matches no executable or library of the targets");
}

#[test]
fn command_that_cannot_start() {
    let dir = temp_dir();
    tracer(&record_args(dir.path(), &[], &["/no/such/command".to_string()]))
        .assert_error("/no/such/command does not exist");
    tracer(&record_args(dir.path(), &[], &["no-such-command-xyz".to_string()]))
        .assert_error("command 'no-such-command-xyz' was not found in PATH");
}

#[test]
fn unwritable_output() {
    let dir = temp_dir();
    let (marker, cmd) = marker_command(dir.path());
    let mut args =
        vec!["record".to_string(), "-o".to_string(), "/proc/no/such/dir/t.jsonl".to_string(), "--".to_string()];
    args.extend(cmd);
    tracer(&args).assert_error("cannot write the trace to /proc/no/such/dir/t.jsonl");
    assert!(!marker.exists());
}

#[test]
fn unknown_formats() {
    let dir = temp_dir();
    let (marker, cmd) = marker_command(dir.path());
    let mut args =
        vec!["record".to_string(), "-o".to_string(), dir.path().join("t.txt").display().to_string(), "--".to_string()];
    args.extend(cmd.clone());
    tracer(&args).assert_error("cannot tell the output format from");
    // clap rejects an unknown --format value, naming it.
    let run = tracer(&record_args(dir.path(), &["--format", "xml"], &cmd));
    assert_eq!(run.code(), 2, "{run:?}");
    assert!(run.stderr.contains("invalid value 'xml' for '--format <FMT>'"), "{run:?}");
    assert!(!marker.exists());
}

#[test]
fn a_target_that_exits_during_attach_ends_the_trace_cleanly() {
    let dir = temp_dir();
    // Lives about as long as the tracer takes to start.
    let mut child = std::process::Command::new(fixture("calls")).args(["sleep", "30"]).spawn().unwrap();
    let run = tracer(&record_args(dir.path(), &["-p", &child.id().to_string()], &[]));
    let _ = child.wait();
    if run.code() != 0 {
        // It was gone before the tracer looked.
        run.assert_error(&format!("no process with pid {} exists", child.id()));
    } else {
        let t = tracer_tests::Trace::load(&dir.path().join("t.jsonl"));
        assert_eq!(t.end["reason"], "targets_exited", "{}", t.end);
    }
}

#[test]
fn malformed_trace_files() {
    let dir = temp_dir();
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"kind\":\"trace_start\"}\n").unwrap();
    let out = dir.path().join("out.json");
    let run = tracer(&["export", bad.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    run.assert_error(&format!("{} is not a valid trace: line 1: missing field", bad.display()));
    std::fs::write(&bad, "{garbage\n").unwrap();
    let run = tracer(&["export", bad.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    run.assert_error(&format!("{} is not a valid trace: line 1: key must be a string", bad.display()));
}

/// A file of another kind given to a reader: one sentence that names the file, says what it is, and
/// which formats are read, from report, calls and export alike.
#[test]
fn files_that_are_not_traces_say_what_they_are() {
    let dir = temp_dir();
    let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/golden/demo.jsonl");
    let chrome = dir.path().join("demo.json");
    let perfetto = dir.path().join("demo.pftrace");
    for out in [&chrome, &perfetto] {
        let run = tracer(&["export".as_ref(), demo.as_os_str(), "-o".as_ref(), out.as_os_str()]);
        assert_eq!(run.code(), 0, "{run:?}");
    }
    let pcapng = dir.path().join("capture.pcapng");
    // A section header block: type, length, byte-order magic.
    std::fs::write(&pcapng, [0x0A, 0x0D, 0x0D, 0x0A, 0x1C, 0, 0, 0, 0x4D, 0x3C, 0x2B, 0x1A]).unwrap();
    let garbage = dir.path().join("notes.txt");
    std::fs::write(&garbage, "garbage\n").unwrap();
    let out = dir.path().join("out.json");
    for (file, what) in [
        (&chrome, "a Chrome trace (JSON)"),
        (&perfetto, "a Perfetto protobuf trace"),
        (&pcapng, "a pcapng packet capture"),
        (&garbage, "text that is not JSON lines (its first line is not a JSON object)"),
    ] {
        let file = file.to_str().unwrap();
        for args in [vec!["report", file], vec!["calls", file], vec!["export", file, "-o", out.to_str().unwrap()]] {
            let run = tracer(&args);
            run.assert_error(&format!(
                "{file} is {what}, not a trace: report, calls and export read the JSON lines (.jsonl) and native (.trc) traces that tracer record writes"
            ));
            assert_eq!(run.code(), 1, "{args:?}");
        }
    }
    assert!(!out.exists(), "nothing is written");
}

/// `calls -p` or `-t` of a process or thread the trace does not have: said, with the ones it has,
/// and a non-zero exit (not an empty listing and 0).
#[test]
fn calls_of_a_pid_not_in_the_trace() {
    let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/golden/demo.jsonl");
    let demo = demo.to_str().unwrap();
    let run = tracer(&["calls", demo, "-p", "424242"]);
    run.assert_error(&format!("{demo}: pid 424242 is not in the trace (its processes are 27352, "));
    assert_eq!(run.stdout, "");
    let run = tracer(&["calls", demo, "-t", "424242"]);
    run.assert_error(&format!("{demo}: thread 424242 is not in the trace (its threads are 27352, "));
    let run = tracer(&["calls", demo, "-p", "27352"]);
    assert_eq!(run.code(), 0, "{run:?}");
}

/// `export --otlp` to a collector that is not there: every span is lost, said on stderr, and the
/// exit code is 3, so that a script can tell a partial export from a whole one.
#[test]
fn export_otlp_loss_exits_3() {
    let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/golden/demo.jsonl");
    // A port nobody listens on: a connection refused, retried, then the batch is dropped.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let run = tracer(&["export", demo.to_str().unwrap(), "--otlp", &url]);
    assert_eq!(run.code(), 3, "{run:?}");
    assert!(run.stderr.contains("spans were lost in OTLP export"), "{run:?}");
}
