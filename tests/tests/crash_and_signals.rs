//! What a user sees when things go wrong around `tracer record`: the tracer killed with SIGKILL
//! (the partial file beside the output holds every event up to about a second before, and the
//! output is as it was), a torn last line (read, with a warning), signals (passed on to the
//! command; during start-up, ending it at once), and a reader that stops reading.

use std::{
    io::{BufRead, Read as _},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;
use tracer_tests::{
    Background, TracerRun, fixture, spawn_tracer, start_tracing, temp_dir, tracer, tracer_bin, u64_field,
};

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// Every whole line of a file that may end in a torn one.
fn whole_lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    text.split_inclusive('\n').filter(|l| l.ends_with('\n')).map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// `tick(i)` arguments in order: the fixture calls tick(0), tick(1), ... every 2 ms.
fn ticks(lines: &[Value]) -> Vec<(u64, u64)> {
    lines
        .iter()
        .filter(|e| e["kind"] == "call" && e["function"] == "tick")
        .map(|e| (e["args"][0].as_u64().unwrap(), u64_field(e, "ts")))
        .collect()
}

/// The one partial file a killed recording to `dir/name` left beside it (`name.XXXXXX.partial`).
fn partial_file(dir: &Path, name: &str) -> std::path::PathBuf {
    let partial: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let file = p.file_name().unwrap().to_str().unwrap();
            file.starts_with(&format!("{name}.")) && file.ends_with(".partial") && file.len() == name.len() + 15
        })
        .collect();
    assert_eq!(partial.len(), 1, "{partial:?}");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&partial[0]).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "private also while written");
    partial[0].clone()
}

fn check_crash_file(path: &Path, killed_at: u64) -> usize {
    let lines = whole_lines(path);
    assert_eq!(lines[0]["kind"], "trace_start", "the first line is there");
    let ticks = ticks(&lines);
    assert!(ticks.windows(2).all(|w| w[1].0 == w[0].0 + 1), "no hole in the ticks");
    let last = ticks.last().expect("ticks were written").1;
    assert!(
        last + 1_000_000_000 >= killed_at,
        "the last event is {} ms before the kill",
        (killed_at - last) / 1_000_000
    );
    ticks.len()
}

#[test]
fn a_killed_recording_keeps_the_events_up_to_a_second_before() {
    let dir = temp_dir();
    let target = Background::start(&fixture("calls"), &["loop"]);
    let pid = target.pid().to_string();
    let run = TracerRun::start(dir.path(), &["-p", &pid, "-f", "tick", "-e", "call,return,spawn,exit"]);
    std::thread::sleep(Duration::from_millis(2500));
    let killed_at = now_ns();
    run.kill();
    // The output appears only once complete: the events are in the partial file beside it.
    assert!(!dir.path().join("trace.jsonl").exists());
    let file = partial_file(dir.path(), "trace.jsonl");
    let ticks = check_crash_file(&file, killed_at);
    assert!(ticks > 500, "{ticks} ticks");
    // report, calls and export read it, and say how much they read.
    for args in [vec!["report"], vec!["calls"], vec!["export", "-o", dir.path().join("t.json").to_str().unwrap()]] {
        let mut all = args.clone();
        all.insert(1, file.to_str().unwrap());
        let run = tracer(&all);
        assert_eq!(run.code(), 0, "{run:?}");
        let warning = run.stderr.lines().find(|l| l.contains("was cut short")).unwrap_or_else(|| panic!("{run:?}"));
        assert!(warning.contains(": read ") && warning.ends_with(" events"), "{warning}");
    }

    // A format only readable once complete: the events are in a JSON lines spool beside it.
    let chrome = dir.path().join("t.json");
    let run = TracerRun::spawn(&["record", "-p", &pid, "-f", "tick", "-o", chrome.to_str().unwrap()], chrome.clone());
    std::thread::sleep(Duration::from_millis(2000));
    let killed_at = now_ns();
    run.kill();
    let spool = dir.path().join("t.json.partial.jsonl");
    check_crash_file(&spool, killed_at);
    let recovered = dir.path().join("recovered.json");
    let run = tracer(&["export", spool.to_str().unwrap(), "-o", recovered.to_str().unwrap()]);
    assert_eq!(run.code(), 0, "{run:?}");
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(&recovered).unwrap()).unwrap();
    assert!(trace["traceEvents"].as_array().unwrap().iter().any(|e| e["name"] == "tick"));
    // A clean end removes the spool.
    let run = tracer(&["record", "-p", &pid, "-f", "tick", "-d", "0.3", "-o", chrome.to_str().unwrap()]);
    assert_eq!(run.code(), 0, "{run:?}");
    assert!(!spool.exists(), "the spool of a complete trace is removed");
}

#[test]
fn a_torn_last_line_is_read_with_a_warning() {
    let dir = temp_dir();
    let file = dir.path().join("t.jsonl");
    let calls = fixture("calls");
    let run = tracer(&["record", "-o", file.to_str().unwrap(), "-f", "fib", "--", calls.to_str().unwrap(), "run", "0"]);
    assert_eq!(run.code(), 0, "{run:?}");
    let text = std::fs::read_to_string(&file).unwrap();
    // Cut inside the 101st line.
    let cut: usize = text.split_inclusive('\n').take(100).map(str::len).sum::<usize>() + 20;
    std::fs::write(&file, &text[..cut]).unwrap();
    let run = tracer(&["report", file.to_str().unwrap()]);
    assert_eq!(run.code(), 0, "{run:?}");
    assert!(run.stderr.contains("was cut short (no trace_end, and its last line is torn): read 99 events"), "{run:?}");
}

/// The command starts with default dispositions and no blocked signal (the tracer ignores
/// SIGPIPE, as Rust programs do), and SIGINT, SIGTERM and SIGHUP sent to the tracer reach it.
#[test]
fn the_command_runs_as_if_started_by_a_shell() {
    let dir = temp_dir();
    let out = dir.path().join("t.jsonl");
    let output = Command::new(tracer_bin())
        .args([
            "record",
            "-e",
            "exit",
            "-o",
            out.to_str().unwrap(),
            "--",
            "grep",
            "-E",
            "^Sig(Blk|Ign)",
            "/proc/self/status",
        ])
        .stderr(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout), "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n");

    let calls = fixture("calls");
    for (signal, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGINT, "SIGINT"), (libc::SIGHUP, "SIGHUP")] {
        let run = TracerRun::start(dir.path(), &["-e", "spawn,exit", "--", calls.to_str().unwrap(), "sleep", "20000"]);
        std::thread::sleep(Duration::from_millis(200));
        run.signal(signal);
        let (run, t) = run.finish();
        assert_eq!(run.code(), 128 + signal, "{name}: {run:?}");
        assert!(run.stderr.contains(&format!("tracer: {name} passed on to the command")), "{run:?}");
        assert_eq!(t.end["reason"], "command_exited", "{}", t.end);
        let exit = t.of_kind("exit").find(|e| e["thread"] == false).expect("the command's exit");
        assert_eq!(exit["signal"], signal, "{exit}");
    }
}

/// Once the launched command has exited and the trace goes on (`-b`: every process running the
/// binary), the first signal ends the trace: there is no command left to pass it on to.
#[test]
fn after_the_command_exits_the_first_signal_stops_the_trace() {
    let dir = temp_dir();
    let calls = fixture("calls");
    let run = TracerRun::start(
        dir.path(),
        &["-e", "spawn,exit", "-b", calls.to_str().unwrap(), "--", calls.to_str().unwrap(), "sleep", "10"],
    );
    // Well after the command's 10 ms and the reaping tick that notices it.
    std::thread::sleep(Duration::from_millis(1500));
    run.signal(libc::SIGINT);
    let (run, t) = run.finish();
    assert_eq!(t.end["reason"], "interrupted", "{}", t.end);
    assert_eq!(t.end["command_exit_code"], 0, "{}", t.end);
    assert!(!run.stderr.contains("passed on to the command"), "{run:?}");
    assert_eq!(run.code(), 0, "{run:?}");
}

/// A signal during start-up (loading and attaching take a while on a loaded machine) stops the
/// tracer at once: the command never runs, no trace is left, the exit code says which signal.
/// Reads `stderr` into `seen` until it holds `text`.
fn read_until(stderr: &mut impl BufRead, seen: &mut String, text: &str) {
    while !seen.contains(text) {
        assert_ne!(stderr.read_line(seen).unwrap(), 0, "{seen}");
    }
}

#[test]
fn a_signal_during_start_up_stops_before_anything_runs() {
    let dir = temp_dir();
    let out = dir.path().join("t.jsonl");
    let marker = dir.path().join("ran");
    let calls = fixture("calls");
    let (mut child, mut stderr) = spawn_tracer(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "-f",
        "fib",
        "--",
        calls.to_str().unwrap(),
        "marker",
        marker.to_str().unwrap(),
    ]);
    // The probes line comes once the functions are chosen, before the programs are loaded and
    // attached (hundreds of milliseconds): the signal lands in that.
    let mut seen = String::new();
    read_until(&mut stderr, &mut seen, "tracer: probes:");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    stderr.read_to_string(&mut seen).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGINT), "{seen}");
    assert!(seen.contains("tracer: SIGINT during start-up: stopped before anything was traced\n"), "{seen}");
    assert!(!seen.contains("tracer: tracing"), "{seen}");
    // The command is released only once tracing is set up: it never ran.
    std::thread::sleep(Duration::from_millis(300));
    assert!(!marker.exists(), "the command ran");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// `tracer record -o - | head`: the reader goes away, the tracer ends quietly.
#[test]
fn a_reader_that_stops_reading_ends_the_trace_quietly() {
    let target = Background::start(&fixture("calls"), &["loop"]);
    let mut child = Command::new(tracer_bin())
        .args(["record", "-o", "-", "-f", "tick", "-p", &target.pid().to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut head = [0u8; 300];
    child.stdout.as_mut().unwrap().read_exact(&mut head).unwrap();
    drop(child.stdout.take());
    let run = tracer_tests::wait_with_timeout(child, "tracer");
    assert_eq!(run.code(), 0, "{run:?}");
    assert!(!run.stderr.contains("error"), "{run:?}");
}

/// The children of `pid` (from `/proc/*/stat`'s parent field).
fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&child| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else { return false };
            stat.rsplit_once(") ").and_then(|(_, rest)| rest.split(' ').nth(1)).is_some_and(|p| p == pid.to_string())
        })
        .collect()
}

/// A `-p` target that forks and execs all the time (a shell loop running `/bin/true`): the first
/// exec of an unresolved image after the start traces it is stopped for tracer to resolve. A
/// Ctrl-C at any moment of start-up, before or after that point, leaves no process stopped:
/// before, start-up is abandoned with nothing traced; after, the start is waited for and its
/// recording ended at once, which continues what it stopped.
#[test]
fn a_signal_at_any_moment_of_start_up_leaves_no_process_stopped_at_exec() {
    let looping = Background::start(Path::new("/bin/bash"), &["-c", "echo ready; while :; do /bin/true; done"]);
    let shell = looping.pid();
    let dir = temp_dir();
    let out = dir.path().join("t.jsonl");
    // `None`: signalled once it says it is tracing. Returns whether start-up was cut short.
    let interrupted_after = |delay: Option<Duration>| -> bool {
        let args = ["record", "-o", out.to_str().unwrap(), "-f", "xmalloc", "-p", &shell.to_string()];
        let (mut child, mut stderr, mut seen) = match delay {
            Some(delay) => {
                let (child, stderr) = spawn_tracer(&args);
                std::thread::sleep(delay);
                (child, stderr, String::new())
            }
            None => start_tracing(&args),
        };
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        stderr.read_to_string(&mut seen).unwrap();
        let status = child.wait().unwrap();
        // Before its handler is installed (the first milliseconds), the signal ends tracer.
        let killed = std::os::unix::process::ExitStatusExt::signal(&status) == Some(libc::SIGINT);
        let cut_short = killed || seen.contains("SIGINT during start-up: stopped before anything was traced");
        if killed {
            assert_eq!(seen, "");
        } else if cut_short {
            assert_eq!(status.code(), Some(128 + libc::SIGINT), "{seen}");
        } else {
            assert!(status.success(), "{seen}");
            assert!(seen.contains("events written to"), "{seen}");
        }
        std::thread::sleep(Duration::from_millis(50));
        for pid in std::iter::once(shell).chain(children(shell)) {
            assert_ne!(tracer_tests::process_state(pid), Some('T'), "pid {pid} left stopped ({delay:?}): {seen}");
        }
        cut_short
    };
    // How long start-up takes here (seconds on a loaded machine or in a VM), then signals spread
    // over it and a little past it.
    let started = Instant::now();
    assert!(!interrupted_after(None));
    let start_up = started.elapsed();
    let outcomes: Vec<bool> = (0..=12).map(|i| interrupted_after(Some(start_up * i / 10))).collect();
    drop(looping);
    // Both sides of the point were met.
    assert!(outcomes.contains(&true) && outcomes.contains(&false), "{outcomes:?} for a start-up of {start_up:?}");
}

/// An error returned by start-up after it traced its targets leaves no process stopped at exec.
/// The error is a real one: the launched command is a file that is neither ELF nor a script, whose
/// exec fails as start-up lets it run, its last step. Start-up is made to wait 1 s just before
/// that step (`TRACER_TEST_PAUSE_AFTER_COMMIT_MS`, the one test-only hook), so that the `-p` shell
/// loop has a child stopped at its exec of `/bin/true` then, which this test sees (state `T`) before
/// the error; after it, the child has been continued, and tracer exits 1 with one sentence.
#[test]
fn an_error_after_start_up_traced_its_targets_leaves_no_process_stopped_at_exec() {
    let looping = Background::start(Path::new("/bin/bash"), &["-c", "echo ready; while :; do /bin/true; done"]);
    let shell = looping.pid();
    let dir = temp_dir();
    let not_a_program = dir.path().join("not-a-program");
    std::fs::write(&not_a_program, "echo never\n").unwrap();
    std::fs::set_permissions(&not_a_program, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = dir.path().join("t.jsonl");
    let mut child = Command::new(tracer_bin())
        .args(["record", "-o", out.to_str().unwrap(), "-f", "xmalloc", "-p", &shell.to_string(), "--"])
        .arg(&not_a_program)
        .env("TRACER_TEST_PAUSE_AFTER_COMMIT_MS", "1000")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tracer");
    let stopped = |pid: u32| children(pid).into_iter().filter(|&c| tracer_tests::process_state(c) == Some('T'));
    let mut seen_stopped = Vec::new();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        for c in stopped(shell) {
            if !seen_stopped.contains(&c) {
                seen_stopped.push(c);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert_eq!(seen_stopped.len(), 1, "one child of the shell stopped at its exec during start-up: {stderr}");
    assert_eq!(status.code(), Some(1), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert_eq!(
        last,
        format!("tracer: error: cannot start {}: Exec format error (os error 8)", not_a_program.display()),
        "{stderr}"
    );
    std::thread::sleep(Duration::from_millis(50));
    for pid in std::iter::once(shell).chain(children(shell)).chain(seen_stopped) {
        assert_ne!(tracer_tests::process_state(pid), Some('T'), "pid {pid} left stopped: {stderr}");
    }
}
