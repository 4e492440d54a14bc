//! Commands behind wrappers: `-f` patterns apply to every image the traced processes exec, so a
//! program launched through a `#!` script, `sh -c`, `env`, `timeout` or `nice` is traced as if it
//! were launched directly, and patterns naming a library to the libraries those programs need.
//! `calls run 0` makes exactly 177 `fib` calls and exits 0.

use std::{os::unix::fs::PermissionsExt as _, path::Path};

use serde_json::Value;
use tracer_tests::{Trace, fixture, record, temp_dir};

/// A `#!/bin/sh` script in `dir` with `body`.
fn script(dir: &Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

/// The file names of the trace's exec events, in order.
fn execs(trace: &Trace) -> Vec<String> {
    trace
        .of_kind("spawn")
        .filter(|e| e["how"] == "exec")
        .map(|e| e["filename"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// `record -f fib -- COMMAND`: its run and trace, after checking that the command exited 0
/// (it was not left stopped, nor broken by the stop).
fn record_fib(dir: &Path, command: &[String]) -> (tracer_tests::Run, Trace) {
    let mut args = vec!["-f".to_string(), "fib".to_string(), "--".to_string()];
    args.extend(command.iter().cloned());
    let (run, trace) = record(dir, &args);
    assert_eq!(run.code(), 0, "{command:?}: {run:?}");
    assert_eq!(trace.end["command_exit_code"], 0, "{command:?}: {}", trace.end);
    (run, trace)
}

fn words(command: &[&str]) -> Vec<String> {
    command.iter().map(|s| s.to_string()).collect()
}

#[test]
fn fib_is_traced_through_every_wrapper() {
    let dir = temp_dir();
    let calls = fixture("calls").display().to_string();
    let run_line = format!("{calls} run 0");
    let exec_script = script(dir.path(), "run.sh", &format!("exec {run_line}"));
    let cases: Vec<(&str, Vec<String>, Vec<String>)> = vec![
        ("direct", words(&[&calls, "run", "0"]), vec![calls.clone()]),
        ("#! script that execs", vec![exec_script.clone()], vec![exec_script.clone(), calls.clone()]),
        ("sh -c", words(&["sh", "-c", &run_line]), vec!["dash".into(), calls.clone()]),
        ("env", words(&["env", &calls, "run", "0"]), vec!["env".into(), calls.clone()]),
        ("timeout 30", words(&["timeout", "30", &calls, "run", "0"]), vec!["timeout".into(), calls.clone()]),
        ("nice", words(&["nice", &calls, "run", "0"]), vec!["nice".into(), calls.clone()]),
    ];
    for (what, command, images) in cases {
        let (run, trace) = record_fib(dir.path(), &command);
        assert_eq!(trace.calls("fib").len(), 177, "{what}: {run:?}");
        assert_eq!(trace.returns("fib").len(), 177, "{what}: {run:?}");
        assert_eq!(trace.lost(), 0, "{what}");
        // The exec events name the images (a wrapper found in PATH, by its file: sh is dash).
        let named = execs(&trace);
        for image in &images {
            let found = named.iter().any(|n| n == image || n.ends_with(&format!("/{image}")));
            assert!(found, "{what}: exec events {named:?} lack {image}");
        }
        // Every pattern matched somewhere: nothing to report at the end.
        assert!(trace.end.get("unmatched_functions").is_none(), "{what}: {}", trace.end);
    }
}

/// A script that runs the program twice (no exec: two children of the shell) gives both runs'
/// calls: the second child execs an image already resolved, which is not stopped again.
#[test]
fn script_that_runs_the_program_twice() {
    let dir = temp_dir();
    let calls = fixture("calls").display().to_string();
    let twice = script(dir.path(), "twice.sh", &format!("{calls} run 0\n{calls} run 0"));
    let (run, trace) = record_fib(dir.path(), &[twice]);
    assert_eq!(trace.calls("fib").len(), 354, "{run:?}");
    assert_eq!(trace.returns("fib").len(), 354, "{run:?}");
    let pids: std::collections::BTreeSet<u64> = trace.calls("fib").iter().map(|e| e["pid"].as_u64().unwrap()).collect();
    assert_eq!(pids.len(), 2, "two processes ran fib");
    // The stops for resolution (the shell's and the first run's) are tracer's: not in the trace.
    let own: Vec<&Value> = trace
        .of_kind("signal")
        .filter(|e| ["SIGSTOP", "SIGCONT"].contains(&e["signal"]["name"].as_str().unwrap()))
        .collect();
    assert!(own.is_empty(), "{own:#?}");
}

/// Only tracer's own stop and continue are left out: a shell (stopped for resolution at its exec)
/// that later stops itself, and is continued by its background child, has that `SIGSTOP`
/// (generated and delivered) and that `SIGCONT` in the trace, once each.
#[test]
fn a_program_s_own_stop_and_continue_stay_in_the_trace() {
    let dir = temp_dir();
    let script = "(sleep 0.2; kill -CONT $$) & kill -STOP $$; wait";
    let (run, trace) = record(dir.path(), &words(&["-f", "fib", "--", "sh", "-c", script]));
    assert_eq!(run.code(), 0, "{run:?}");
    let shell = trace.start["targets"][0]["pid"].as_u64().unwrap();
    let signals = |name: &str, delivered: bool| -> Vec<&Value> {
        trace.of_kind("signal").filter(|e| e["signal"]["name"] == name && e["delivered"] == delivered).collect()
    };
    let stop = signals("SIGSTOP", false);
    assert_eq!(stop.len(), 1, "{stop:#?}");
    assert_eq!(stop[0]["sender_pid"], shell);
    assert_eq!(stop[0]["target_pid"], shell);
    assert_eq!(signals("SIGSTOP", true).len(), 1, "{:#?}", trace.of_kind("signal").collect::<Vec<_>>());
    let cont = signals("SIGCONT", false);
    assert_eq!(cont.len(), 1, "{cont:#?}");
    assert_eq!(cont[0]["target_pid"], shell);
    assert_ne!(cont[0]["sender_pid"], shell, "the background child continues it");
}

/// A pattern that matches nothing in any image is reported once at the end, with the images the
/// trace saw, on stderr and in `trace_end`; the command still runs and the exit is its own (0).
#[test]
fn pattern_that_matches_nothing_anywhere_is_reported_at_the_end() {
    let dir = temp_dir();
    let calls = fixture("calls").display().to_string();
    let command = words(&["-f", "nosuchfn", "--", "sh", "-c", &format!("{calls} run 0")]);
    let (run, trace) = record(dir.path(), &command);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(trace.end["command_exit_code"], 0);
    tracer_tests::check_schema(&trace.end).unwrap_or_else(|e| panic!("trace_end: {e}"));
    let unmatched = &trace.end["unmatched_functions"];
    assert_eq!(unmatched["patterns"], serde_json::json!(["nosuchfn"]), "{}", trace.end);
    let images: Vec<&str> = unmatched["images"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(images.iter().any(|i| i.ends_with("/dash")), "{images:?}");
    assert!(images.contains(&calls.as_str()), "{images:?}");
    assert!(
        run.stderr.contains("no function matching 'nosuchfn' in any program the trace saw"),
        "said on stderr: {run:?}"
    );
    assert_eq!(trace.calls("nosuchfn").len(), 0);
}

/// A pattern naming a library that only the exec'd program loads (`libstdc++`, which `throws`
/// needs and `sh` does not) is looked for in the libraries each exec'd image needs, and attached
/// once however many processes exec it. `throws 7` throws and catches 7 exceptions: 7
/// `__cxa_begin_catch` calls, each with its return. A library no image needs is reported at the
/// end like any pattern that matched nothing.
#[test]
fn a_library_only_the_exec_d_program_loads_is_traced_through_a_wrapper() {
    let dir = temp_dir();
    let throws = fixture("throws").display().to_string();
    let cases = [
        ("direct", words(&[&throws, "7"]), 7),
        ("sh -c", words(&["sh", "-c", &format!("{throws} 7")]), 7),
        ("sh -c, twice", words(&["sh", "-c", &format!("{throws} 7; {throws} 7")]), 14),
    ];
    for (what, command, count) in cases {
        let mut args = words(&["-f", "libstdc++:__cxa_begin_catch", "--"]);
        args.extend(command);
        let (run, trace) = record(dir.path(), &args);
        assert_eq!(run.code(), 0, "{what}: {run:?}");
        assert_eq!(trace.calls("__cxa_begin_catch").len(), count, "{what}: {run:?}");
        assert_eq!(trace.returns("__cxa_begin_catch").len(), count, "{what}: {run:?}");
        assert_eq!(trace.lost(), 0, "{what}");
        assert!(trace.end.get("unmatched_functions").is_none(), "{what}: {}", trace.end);
    }

    let (run, trace) = record(dir.path(), &words(&["-f", "libnosuch:f", "--", "sh", "-c", &format!("{throws} 1")]));
    assert_eq!(run.code(), 0, "{run:?}");
    assert!(
        run.stderr.contains(
            "no file the command loads is module 'libnosuch': it is looked for in the libraries of each program the command executes"
        ),
        "said at start: {run:?}"
    );
    assert_eq!(trace.end["unmatched_functions"]["patterns"], serde_json::json!(["libnosuch:f"]), "{}", trace.end);
}

/// Without function patterns nothing is resolved at exec, so nothing is ever stopped.
#[test]
fn without_patterns_nothing_is_stopped() {
    let dir = temp_dir();
    let calls = fixture("calls").display().to_string();
    let (run, trace) = record(dir.path(), &words(&["--", "sh", "-c", &format!("{calls} run 0")]));
    assert_eq!(run.code(), 0, "{run:?}");
    let stops: Vec<&Value> = trace.of_kind("signal").filter(|e| e["signal"]["name"] == "SIGSTOP").collect();
    assert!(stops.is_empty(), "{stops:?}");
    assert!(execs(&trace).contains(&calls), "the exec is followed all the same");
}

/// A process under ptrace is not stopped at exec: its debugger would see the stop (gdb stops
/// there). Under `strace -f`, `sh` and then `calls loop` exec new images and run on; tracer
/// resolves each as it reads the exec, and counts them in `trace_end.execs_probed_late` (2). Once
/// a `tick` call is in the trace, the fixture is told to stop: every call from the first one
/// traced to its last (`ticks N`: N - 1) is there, each with its return, the earlier ones are
/// missed (the price of not stopping), and strace saw no `SIGSTOP` or `SIGCONT` (before this
/// change it showed tracer's stop and continue of both processes, and gdb would stop there).
#[test]
fn a_process_under_strace_is_not_stopped_at_exec() {
    let dir = temp_dir();
    let calls = fixture("calls").display().to_string();
    let strace_out = dir.path().join("strace.txt");
    let fixture_out = dir.path().join("loop.txt");
    let shell = format!("{calls} loop > {}", fixture_out.display());
    let strace = ["strace", "-f", "-o", strace_out.to_str().unwrap(), "sh", "-c", &shell];
    let mut args = words(&["-f", "tick", "--"]);
    args.extend(words(&strace));
    let tracing = tracer_tests::TracerRun::start(dir.path(), &args);
    // The trace so far is in `trace.jsonl.XXXXXX.partial` until the recording ends.
    let partial = || {
        std::fs::read_dir(dir.path()).unwrap().filter_map(Result::ok).map(|e| e.path()).find(|p| {
            p.file_name().unwrap().to_str().unwrap().starts_with("trace.jsonl.")
                && p.extension() == Some("partial".as_ref())
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let looping = loop {
        let text = partial().map(|p| std::fs::read_to_string(p).unwrap_or_default()).unwrap_or_default();
        let first_call = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|e| e["kind"] == "call" && e["function"] == "tick");
        if let Some(call) = first_call {
            break call["pid"].as_u64().unwrap() as i32;
        }
        assert!(std::time::Instant::now() < deadline, "no tick call traced within 60 s");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    // SAFETY: kill(2) on the fixture this test started (through tracer, strace and sh).
    unsafe { libc::kill(looping, libc::SIGUSR1) };
    let (run, trace) = tracing.finish();
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(trace.end["command_exit_code"], 0, "{}", trace.end);
    let strace_said = std::fs::read_to_string(&strace_out).unwrap();
    let stops: Vec<&str> = strace_said.lines().filter(|l| l.contains("SIGSTOP") || l.contains("SIGCONT")).collect();
    assert!(stops.is_empty(), "strace saw tracer's stop: {stops:#?}");
    assert_eq!(trace.end["execs_probed_late"], 2, "sh and calls: {}", trace.end);
    tracer_tests::check_schema(&trace.end).unwrap_or_else(|e| panic!("trace_end: {e}"));
    let said = std::fs::read_to_string(&fixture_out).unwrap();
    let ticks: u64 = said.lines().find_map(|l| l.strip_prefix("ticks ")).unwrap().parse().unwrap();
    let called: Vec<u64> = trace.calls("tick").iter().map(|e| tracer_tests::args(e)[0]).collect();
    let first = called[0];
    assert_eq!(called, (first..ticks).collect::<Vec<u64>>(), "every tick from the first traced one");
    // Return probes are attached before entry probes (never a call without its return): the
    // returns may start earlier, and go on to the last without a gap.
    let returned: Vec<u64> = trace.returns("tick").iter().map(|e| e["retval"].as_u64().unwrap() / 2).collect();
    assert!(returned[0] <= first, "{returned:?}");
    assert_eq!(returned, (returned[0]..ticks).collect::<Vec<u64>>(), "every return from the first traced one");
    eprintln!("ticks {ticks}, calls traced from tick({first}), returns from tick({})", returned[0]);
}
