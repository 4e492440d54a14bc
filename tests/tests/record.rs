//! `tracer record` against fixtures with exactly known behaviour, in the real kernel.

use std::{collections::BTreeSet, path::Path, time::Duration};

use serde_json::Value;
use tracer_tests::{Background, TracerRun, args, fixture, record, temp_dir, u64_field};

fn pid_of(e: &Value) -> u64 {
    u64_field(e, "pid")
}

#[test]
fn c_fixture_calls_returns_spawns_and_exits_are_exact() {
    let dir = temp_dir();
    let calls = fixture("calls");
    let (run, t) = record(
        dir.path(),
        &[
            "-f",
            "fib",
            "-f",
            "add3",
            "-f",
            "mix6",
            "-f",
            "child_work",
            "-f",
            "thread_work",
            "--",
            calls.to_str().unwrap(),
            "run",
            "5",
        ],
    );
    assert_eq!(run.code(), 5, "tracer exits with the command's code: {run:?}");
    assert_eq!(t.lost(), 0, "{}", t.end);
    assert_eq!(t.end["reason"], "command_exited");
    assert_eq!(t.end["command_exit_code"], 5);
    assert_eq!(t.start["probes"], 5);
    let main_pid = t.start["targets"][0]["pid"].as_u64().unwrap();
    assert_eq!(t.start["targets"][0]["type"], "command");

    // fib(10): 177 calls, each returned, 10 deep.
    assert_eq!(t.calls("fib").len(), 177);
    assert_eq!(t.returns("fib").len(), 177);
    let deepest = t.check_nesting();
    assert_eq!(deepest["fib"], 10);
    let fib10 = t.returns("fib").into_iter().max_by_key(|r| u64_field(r, "duration_ns")).unwrap();
    assert_eq!(fib10["retval"], 55);
    assert!(t.calls("fib").iter().all(|c| pid_of(c) == main_pid && c["module"] == calls.to_str().unwrap()));

    // Arguments and return values.
    let add3 = t.calls("add3");
    assert_eq!(add3.len(), 1);
    assert_eq!(args(add3[0])[..3], [1, 2, 3]);
    assert_eq!(t.returns("add3")[0]["retval"], 6);
    let mix6 = t.calls("mix6");
    assert_eq!(args(mix6[0]), [1, 2, 3, 4, 5, 6]);
    assert_eq!(t.returns("mix6")[0]["retval"], 91);

    // The forked child: 5 calls, in its own process, then exit 7.
    let forks: Vec<&Value> = t.of_kind("spawn").filter(|e| e["how"] == "fork").collect();
    assert_eq!(forks.len(), 2, "two children");
    assert!(forks.iter().all(|f| f["parent_pid"] == main_pid && pid_of(f) == main_pid));
    let worker_pid = u64_field(forks[0], "child_pid");
    let victim_pid = u64_field(forks[1], "child_pid");
    let child_work = t.calls("child_work");
    assert_eq!(child_work.iter().map(|c| args(c)[0]).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
    assert!(child_work.iter().all(|c| pid_of(c) == worker_pid));
    let rets: Vec<u64> = t.returns("child_work").iter().map(|r| u64_field(r, "retval")).collect();
    assert_eq!(rets, [0, 1, 4, 9, 16]);

    // The thread: 3 calls on a thread of the main process.
    let threads: Vec<&Value> = t.of_kind("spawn").filter(|e| e["how"] == "thread").collect();
    assert_eq!(threads.len(), 1);
    assert_eq!(threads[0]["child_pid"], main_pid);
    let thread_tid = u64_field(threads[0], "child_tid");
    assert_ne!(thread_tid, main_pid);
    let tw = t.calls("thread_work");
    assert_eq!(tw.len(), 3);
    assert!(tw.iter().all(|c| pid_of(c) == main_pid && u64_field(c, "tid") == thread_tid));
    let rets: Vec<u64> = t.returns("thread_work").iter().map(|r| u64_field(r, "retval")).collect();
    assert_eq!(rets, [100, 101, 102]);

    // The exec that started it all, and how everything ended.
    let execs: Vec<&Value> = t.of_kind("spawn").filter(|e| e["how"] == "exec").collect();
    assert_eq!(execs.len(), 1);
    assert_eq!(execs[0]["filename"], calls.to_str().unwrap());
    assert_eq!(execs[0]["comm"], "calls");
    let exits: Vec<(u64, u64, Value, Value, bool)> = t
        .of_kind("exit")
        .map(|e| (pid_of(e), u64_field(e, "tid"), e["exit_code"].clone(), e["signal"].clone(), e["thread"] == true))
        .collect();
    assert_eq!(
        exits[..2],
        [
            (worker_pid, worker_pid, Value::from(7), Value::Null, false),
            (victim_pid, victim_pid, Value::Null, Value::from(15), false),
        ]
    );
    // The main process: its thread (joined, so already on its way out) and its main thread, which
    // calls `exit(5)`, end in whichever order the kernel gets them there (on a slow VM the main
    // thread is often first). The last of the two ends the process, with the process's status.
    assert_eq!(exits.len(), 4, "{exits:?}");
    let (first, last) = (&exits[2], &exits[3]);
    assert_eq!((first.0, first.4, last.0, last.4), (main_pid, true, main_pid, false), "{exits:?}");
    let mut tids = [first.1, last.1];
    tids.sort();
    assert_eq!(tids, [main_pid.min(thread_tid), main_pid.max(thread_tid)], "{exits:?}");
    assert_eq!((&last.2, &last.3), (&Value::from(5), &Value::Null), "{exits:?}");
    // Only the probed functions appear.
    let names: BTreeSet<&str> = t.of_kind("call").map(|c| c["function"].as_str().unwrap()).collect();
    assert_eq!(names, BTreeSet::from(["add3", "child_work", "fib", "mix6", "thread_work"]));
}

#[test]
fn rust_fixture_names_are_demangled_and_counts_exact() {
    let dir = temp_dir();
    let (run, t) = record(dir.path(), &["-f", "rust_fixture::*", "--", env!("CARGO_BIN_EXE_rust_fixture")]);
    assert_eq!(run.code(), 4, "{run:?}");
    assert_eq!(t.lost(), 0);
    // fib(12): 2 * fib(13) - 1 calls.
    assert_eq!(t.calls("rust_fixture::fib").len(), 465);
    assert_eq!(t.returns("rust_fixture::fib").len(), 465);
    let deepest = t.check_nesting();
    assert_eq!(deepest["rust_fixture::fib"], 12);
    let scale: Vec<Vec<u64>> = t.calls("rust_fixture::scale").iter().map(|c| args(c)[..2].to_vec()).collect();
    assert_eq!(scale, [[10, 3], [20, 3], [30, 3]]);
    let rets: Vec<u64> = t.returns("rust_fixture::scale").iter().map(|r| u64_field(r, "retval")).collect();
    assert_eq!(rets, [30, 60, 90]);
    let worker = t.calls("rust_fixture::worker");
    assert_eq!(worker.len(), 4);
    let main_pid = t.start["targets"][0]["pid"].as_u64().unwrap();
    assert!(worker.iter().all(|w| pid_of(w) == main_pid && u64_field(w, "tid") != main_pid), "worker runs on a thread");
    let exit = t.of_kind("exit").find(|e| e["thread"] == false).unwrap();
    assert_eq!(exit["exit_code"], 4);
}

#[test]
fn cpp_names_are_demangled() {
    let dir = temp_dir();
    let (run, t) = record(dir.path(), &["-f", "shapes::*", "--", fixture("shapes").to_str().unwrap()]);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.calls("shapes::Circle::area() const").len(), 3);
    let sides: Vec<u64> = t.calls("shapes::count_sides(int)").iter().map(|c| args(c)[0]).collect();
    assert_eq!(sides, [3, 4]);
    t.check_nesting();
}

/// `-f libc.so.6:__write`: the events carry the name asked for, not the function's first name
/// (`write`), which `trace_start.aliases` lists. libc is stripped, but its debug file (libc6-dbg)
/// gives the parameters: no "is stripped" line, which would say the opposite.
#[test]
fn a_function_is_named_as_asked_and_a_stripped_library_with_debug_info_is_not_called_stripped() {
    let dir = temp_dir();
    let (run, t) = record(dir.path(), &["-f", "libc.so.6:__write", "--", fixture("ipc").to_str().unwrap(), "pipe"]);
    assert_eq!(run.code(), 0, "{run:?}");
    let calls = t.calls("__write");
    assert_eq!(calls.len(), 4, "{run:?}");
    assert_eq!(t.returns("__write").len(), 4);
    assert!(t.calls("write").is_empty());
    assert_eq!(t.start["aliases"], serde_json::json!({"__write": ["write"]}));
    // glibc 2.36's `__libc_write (int fd, const void *buf, size_t nbytes)`.
    let names: Vec<&String> = calls[0]["params"].as_object().expect("params from libc6-dbg").keys().collect();
    assert_eq!(names, ["buf", "fd", "nbytes"], "(sorted: the tests' serde_json map)");
    assert!(calls.iter().all(|c| c["params"]["nbytes"] == 256), "{calls:?}");
    assert!(!run.stderr.contains("is stripped"), "{}", run.stderr);
}

#[test]
fn stripped_binaries_use_dynsym() {
    let dir = temp_dir();
    let (run, t) = record(dir.path(), &["-f", "fib", "--", fixture("calls_stripped").to_str().unwrap(), "run", "0"]);
    assert_eq!(run.code(), 0, "{run:?}");
    assert!(run.stderr.contains("is stripped: only its exported functions (.dynsym) can be probed"), "{run:?}");
    assert_eq!(t.calls("fib").len(), 177);
    assert_eq!(t.returns("fib").len(), 177);
}

#[test]
fn without_patterns_the_programs_own_functions_are_probed() {
    let dir = temp_dir();
    let (run, t) = record(dir.path(), &["--", fixture("calls").to_str().unwrap(), "run", "0"]);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.lost(), 0);
    assert_eq!(t.calls("fib").len(), 177);
    assert_eq!(t.calls("main").len(), 1);
    assert_eq!(t.calls("thread_main").len(), 1);
    // The C runtime's start-up code is not the program's: left out unless asked for.
    for startup in ["_start", "_init", "_fini", "frame_dummy", "register_tm_clones", "__do_global_dtors_aux"] {
        assert_eq!(t.calls(startup).len(), 0, "{startup}");
    }
    assert!(t.start["probes"].as_u64().unwrap() >= 6, "{}", t.start);
    // Asked for, the entry point gets an entry probe but no return probe.
    let (run, t) =
        record(dir.path(), &["-f", "_start", "-f", "main", "--", fixture("calls").to_str().unwrap(), "run", "0"]);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!((t.calls("_start").len(), t.returns("_start").len(), t.calls("main").len()), (1, 0, 1));
    // main returns 0 (the exit code given on the command line).
    assert_eq!(t.returns("main")[0]["retval"], 0);
}

#[test]
fn no_follow_leaves_children_alone() {
    let dir = temp_dir();
    let (run, t) = record(
        dir.path(),
        &["--no-follow", "-f", "child_work", "-f", "fib", "--", fixture("calls").to_str().unwrap(), "run", "0"],
    );
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.calls("fib").len(), 177);
    assert_eq!(t.calls("child_work").len(), 0, "the child is not traced");
    assert_eq!(t.of_kind("spawn").filter(|e| e["how"] == "fork").count(), 2, "forks are still seen");
    let main_pid = t.start["targets"][0]["pid"].as_u64().unwrap();
    assert!(t.of_kind("exit").all(|e| pid_of(e) == main_pid), "only the main process's exits");
    assert_eq!(t.start["follow_children"], false);
}

#[test]
fn event_selection() {
    let dir = temp_dir();
    let (run, t) =
        record(dir.path(), &["-e", "call,exit", "-f", "fib", "--", fixture("calls").to_str().unwrap(), "run", "0"]);
    assert_eq!(run.code(), 0, "{run:?}");
    let kinds: BTreeSet<&str> = t.events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, BTreeSet::from(["call", "exit"]));
    assert_eq!(t.calls("fib").len(), 177);
    assert_eq!(t.of_kind("exit").count(), 4);

    let (run, t) =
        record(dir.path(), &["-e", "return", "-f", "fib", "--", fixture("calls").to_str().unwrap(), "run", "0"]);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.events.len(), 177);
    // Without call events the durations are unknown.
    assert!(t.events.iter().all(|e| e["kind"] == "return" && e["duration_ns"].is_null()));
}

/// `-o -`: standard output is the trace alone, every line JSON; what the command prints goes
/// to stderr (`tracer record -o - -- CMD | jq` works).
#[test]
fn with_the_trace_on_stdout_the_commands_output_goes_to_stderr() {
    let run =
        tracer_tests::tracer(&["record", "-o", "-", "-e", "spawn,exit", "--", "sh", "-c", "echo from-the-command"]);
    assert_eq!(run.code(), 0, "{run:?}");
    let lines: Vec<Value> =
        run.stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
    assert_eq!(lines.first().unwrap()["kind"], "trace_start");
    assert_eq!(lines.last().unwrap()["kind"], "trace_end");
    assert!(run.stderr.contains("from-the-command\n"), "{}", run.stderr);
}

/// The CPUs online, as `/sys/devices/system/cpu/online` lists them (`0-1,4`).
fn online_cpus() -> u32 {
    let list = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    list.trim()
        .split(',')
        .map(|range| match range.split_once('-') {
            Some((a, b)) => b.parse::<u32>().unwrap() - a.parse::<u32>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

/// Start-up does only what the trace asks for: process events alone load the three scheduler
/// programs and no uprobe program, with a ring buffer fitted to them (512 KiB a CPU, at least
/// 1 MiB); calls add the call programs and a larger ring (4 MiB a CPU); tracer parses the
/// kernel's BTF once either way (`record -v` says so, and `trace_start.kernel.ring_bytes`).
#[test]
fn start_up_loads_what_the_trace_asks_for() {
    let dir = temp_dir();
    let cpus = online_cpus();
    let fitted = |per_cpu: u32| (per_cpu * cpus).next_power_of_two().clamp(1 << 20, 64 << 20);
    let (run, t) = record(dir.path(), &["-v", "-e", "spawn,exit", "--", "/bin/true"]);
    assert_eq!(run.code(), 0, "{run:?}");
    let exit = t.start["kernel"]["process_exit"].as_str().unwrap();
    let exit_program = if exit == "group_dead" { "sched_exit" } else { "sched_exit_1arg" };
    let line = format!("programs loaded: sched_fork, sched_exec, {exit_program}; ");
    assert!(run.stderr.contains(&line), "{line} in {}", run.stderr);
    assert!(run.stderr.contains("the kernel's BTF parsed once by tracer"), "{}", run.stderr);
    assert_eq!(t.start["kernel"]["ring_bytes"], fitted(512 << 10), "{}", t.start);
    assert!(run.stderr.contains(&format!("ring buffer {} KiB", fitted(512 << 10) >> 10)), "{}", run.stderr);

    let calls = fixture("calls");
    let (run, t) =
        record(dir.path(), &["-v", "-e", "call,return", "-f", "fib", "--", calls.to_str().unwrap(), "run", "0"]);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.calls("fib").len(), 177);
    let line = format!("programs loaded: sched_fork, sched_exec, {exit_program}, call_return, call_entry; ");
    assert!(run.stderr.contains(&line), "{line} in {}", run.stderr);
    assert!(run.stderr.contains("the kernel's BTF parsed once by tracer"), "{}", run.stderr);
    assert_eq!(t.start["kernel"]["ring_bytes"], fitted(4 << 20), "{}", t.start);
    // greet's entry reads a string (its `name`) and its return does not: only the sleepable entry
    // program and the plain return program are loaded, or the plain pair where there are no
    // sleepable uprobes.
    let filters = fixture("filters");
    let (run, t) = record(dir.path(), &["-v", "-e", "call,return", "-f", "greet", "--", filters.to_str().unwrap()]);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.calls("greet").len(), 7);
    let entry =
        if run.stderr.contains("cannot be read and is marked unreadable") { "call_entry" } else { "call_entry_s" };
    let line = format!("programs loaded: sched_fork, sched_exec, {exit_program}, call_return, {entry}; ");
    assert!(run.stderr.contains(&line), "{line} in {}", run.stderr);
    // --buffer-size still decides when given.
    let (run, t) = record(dir.path(), &["--buffer-size", "256K", "-e", "spawn,exit", "--", "/bin/true"]);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.start["kernel"]["ring_bytes"], 256 << 10);
}

#[test]
fn non_pie_fixture_with_nop_entries() {
    let dir = temp_dir();
    let (run, t) = record(dir.path(), &["-f", "work", "--", fixture("bench").to_str().unwrap(), "1000"]);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.calls("work").len(), 1000);
    let rets: Vec<u64> = t.returns("work").iter().map(|r| u64_field(r, "retval")).collect();
    assert_eq!(rets, (1..=1000).collect::<Vec<u64>>());
}

/// Calls and returns are written to per-CPU call rings, everything else to the shared ring; a call
/// ring that is full sends what follows to the shared ring, and user space merges the two by time
/// (`record/drain.rs`). Here the drain starts 3 s late (`TRACER_TEST_DRAIN_DELAY_MS`, a test-only
/// hook), so of 100,000 calls and returns (14.4 MB of records) the two 1 MiB call rings hold at
/// most a seventh: the rest go through the shared ring, interleaved with them in time. Each
/// return must still follow its own call and pair with it.
#[test]
fn calls_past_a_full_call_ring_go_to_the_shared_ring_and_stay_in_order() {
    let dir = temp_dir();
    let out = dir.path().join("t.jsonl");
    let run = tracer_tests::wait_with_timeout(
        std::process::Command::new(tracer_tests::tracer_bin())
            .env("TRACER_TEST_DRAIN_DELAY_MS", "3000")
            .args(["record", "-f", "work", "--buffer-size", "64M", "-o"])
            .arg(&out)
            .arg("--")
            .arg(fixture("bench"))
            .arg("100000")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("tracer starts"),
        "tracer record",
    );
    assert_eq!(run.code(), 0, "{run:?}");
    let t = tracer_tests::Trace::load(&out);
    assert_eq!(t.lost(), 0);
    let calls: Vec<&Value> = t.of_kind("call").collect();
    let returns: Vec<&Value> = t.of_kind("return").collect();
    assert_eq!((calls.len(), returns.len()), (100_000, 100_000));
    // In the file, call, return, call, return...: each return right after its call, with the
    // duration measured from it, and the k-th returning k.
    t.check_nesting();
    let order: Vec<&str> =
        t.events.iter().filter_map(|e| e["kind"].as_str()).filter(|k| *k == "call" || *k == "return").collect();
    for (i, pair) in order.chunks(2).enumerate() {
        assert_eq!(pair, ["call", "return"], "pair {i}");
    }
    for (i, (c, r)) in calls.iter().zip(&returns).enumerate() {
        assert_eq!(u64_field(r, "duration_ns"), u64_field(r, "ts") - u64_field(c, "ts"), "pair {i}");
        assert_eq!(u64_field(r, "retval"), i as u64 + 1, "pair {i}");
    }
}

#[test]
fn recursion_past_the_kernel_return_probe_limit_is_reported() {
    let dir = temp_dir();
    let (run, t) = record(dir.path(), &["-f", "deep", "--", fixture("calls").to_str().unwrap(), "deep", "100"]);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.calls("deep").len(), 100);
    // The kernel keeps at most 64 return probes pending per thread.
    let returns = t.returns("deep");
    assert_eq!(returns.len(), 64);
    assert_eq!(t.end["calls_without_return_probe"], 36);
    assert!(run.stderr.contains("36 calls were nested more than 64 probed calls deep"), "{run:?}");
    // deep(k) returns k; the calls 64 deep and shallower, deep(37) to deep(100), got return
    // probes, and each return is paired with its own call, not with the innermost deep().
    let retvals: Vec<u64> = returns.iter().map(|r| u64_field(r, "retval")).collect();
    assert_eq!(retvals, (37..=100).collect::<Vec<u64>>());
    let call_ts: Vec<u64> = t.calls("deep").iter().map(|c| u64_field(c, "ts")).collect();
    for (i, r) in returns.iter().enumerate() {
        // The i-th return belongs to the call at depth 63 - i (0-based).
        let call = call_ts[63 - i];
        assert_eq!(u64_field(r, "duration_ns"), u64_field(r, "ts") - call, "return {i}");
    }
}

#[test]
fn attach_to_a_running_process_and_leave_it_running() {
    let dir = temp_dir();
    let bg = Background::start(&fixture("calls"), &["loop"]);
    let pid = bg.pid().to_string();
    let (run, t) = record(dir.path(), &["-p", &pid, "-f", "tick", "-d", "1"]);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.end["reason"], "duration");
    assert_eq!(t.lost(), 0);
    assert_eq!(t.start["targets"][0]["type"], "process");
    assert_eq!(t.start["targets"][0]["comm"], "calls");
    let ticks: Vec<u64> = t.calls("tick").iter().map(|c| args(c)[0]).collect();
    assert!(ticks.len() >= 50, "a tick every 2 ms for 1 s: {}", ticks.len());
    // Consecutive: not one call missed.
    assert!(ticks.windows(2).all(|w| w[1] == w[0] + 1), "{ticks:?}");
    let returns = t.returns("tick");
    for r in &returns {
        assert_eq!(u64_field(r, "retval") % 2, 0);
    }
    // Every call seen while traced has its return (but the last, if tracing stopped inside it).
    assert!(returns.len() + 1 >= ticks.len());
    // The process outlives the trace and still works.
    let (code, last) = bg.finish();
    assert_eq!(code, 0);
    let total: u64 = last.strip_prefix("ticks ").unwrap().parse().unwrap();
    assert!(total > *ticks.last().unwrap());
}

#[test]
fn a_trace_of_pids_ends_when_they_exit() {
    let dir = temp_dir();
    let bg = Background::start(&fixture("calls"), &["loop"]);
    let pid = bg.pid();
    // The target is told to finish only once the tracer says it is tracing (however long start-up
    // takes on a loaded machine), so its exit is always seen.
    let tracer = TracerRun::start(dir.path(), &["-p", &pid.to_string(), "-f", "tick"]);
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: kill(2).
    unsafe { libc::kill(pid as i32, libc::SIGUSR1) };
    let (run, t) = tracer.finish();
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.end["reason"], "targets_exited");
    let exit = t.of_kind("exit").last().expect("the target's exit");
    assert_eq!(pid_of(exit), pid as u64);
    assert_eq!(exit["exit_code"], 0);
    drop(bg);
}

#[test]
fn binary_targets_running_and_started_later() {
    let dir = temp_dir();
    let calls = fixture("calls");
    let first = Background::start(&calls, &["loop"]);
    let second = Background::start(&calls, &["loop"]);
    let tracer = TracerRun::start(dir.path(), &["-b", calls.to_str().unwrap(), "-f", "tick", "-d", "1.5"]);
    // Started after the probes are in place: traced from its exec.
    let third = Background::start(&calls, &["loop"]);
    std::thread::sleep(Duration::from_millis(300));
    let third_pid = third.pid() as u64;
    assert_eq!(third.finish().0, 0);
    let (run, t) = tracer.finish();
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.lost(), 0);
    let targets: Vec<u64> = t.start["targets"].as_array().unwrap().iter().filter_map(|x| x["pid"].as_u64()).collect();
    assert!(targets.contains(&(first.pid() as u64)) && targets.contains(&(second.pid() as u64)), "{}", t.start);
    for pid in [first.pid() as u64, second.pid() as u64, third_pid] {
        let ticks: Vec<u64> = t.calls("tick").into_iter().filter(|c| pid_of(c) == pid).map(|c| args(c)[0]).collect();
        assert!(ticks.len() > 20, "pid {pid}: {} ticks", ticks.len());
        assert!(ticks.windows(2).all(|w| w[1] == w[0] + 1), "pid {pid}: {ticks:?}");
    }
    // The late instance was traced from its exec: its first tick is tick(0).
    let third_ticks: Vec<u64> =
        t.calls("tick").into_iter().filter(|c| pid_of(c) == third_pid).map(|c| args(c)[0]).collect();
    assert_eq!(third_ticks[0], 0);
    assert!(t.of_kind("spawn").any(|s| s["how"] == "exec" && pid_of(s) == third_pid));
    assert!(t.of_kind("exit").any(|e| pid_of(e) == third_pid && e["exit_code"] == 0));
    assert_eq!(first.finish().0, 0);
    assert_eq!(second.finish().0, 0);
}

#[test]
fn chrome_export_of_a_real_trace_is_well_formed() {
    let dir = temp_dir();
    let out = dir.path().join("trace.json");
    let run = tracer_tests::tracer(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "-f",
        "fib",
        "-f",
        "thread_work",
        "-f",
        "child_work",
        "--",
        fixture("calls").to_str().unwrap(),
        "run",
        "0",
    ]);
    assert_eq!(run.code(), 0, "{run:?}");
    let direct = check_chrome(&out);

    // The same trace recorded as JSON lines and converted gives the same slices.
    let (_, _) = record(
        dir.path(),
        &["-f", "fib", "-f", "thread_work", "-f", "child_work", "--", fixture("calls").to_str().unwrap(), "run", "0"],
    );
    let converted = dir.path().join("converted.json");
    let run = tracer_tests::tracer(&[
        "export",
        dir.path().join("trace.jsonl").to_str().unwrap(),
        "-o",
        converted.to_str().unwrap(),
    ]);
    assert_eq!(run.code(), 0, "{run:?}");
    let exported = check_chrome(&converted);
    assert_eq!(direct, exported);
}

/// Checks a Chrome trace's structure and returns the number of slices per name.
fn check_chrome(path: &Path) -> std::collections::BTreeMap<String, usize> {
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).expect("valid JSON");
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    assert!(trace["metadata"]["trace_start"]["probes"].as_u64().is_some());
    assert_eq!(trace["metadata"]["trace_end"]["lost_events"]["call"], 0);
    let mut per_thread: std::collections::HashMap<(u64, u64), Vec<(f64, f64)>> = Default::default();
    let mut counts = std::collections::BTreeMap::new();
    for e in events {
        let ph = e["ph"].as_str().expect("ph");
        assert!(e["pid"].is_u64() && e["tid"].is_u64(), "every event is on a thread: {e}");
        assert!(e["name"].as_str().is_some_and(|n| !n.is_empty()), "named: {e}");
        match ph {
            "X" => {
                let ts = e["ts"].as_f64().unwrap();
                let dur = e["dur"].as_f64().unwrap();
                assert!(dur >= 0.0);
                per_thread
                    .entry((e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()))
                    .or_default()
                    .push((ts, ts + dur));
                *counts.entry(e["name"].as_str().unwrap().to_string()).or_insert(0) += 1;
            }
            "i" => assert_eq!(e["s"], "t"),
            "M" => assert!(e["args"]["name"].is_string()),
            other => panic!("unexpected phase {other}"),
        }
    }
    // Proper nesting: sorted by start (longest first on ties), each slice lies inside the
    // enclosing open one or after it.
    for ((pid, tid), mut slices) in per_thread {
        slices.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut open: Vec<(f64, f64)> = Vec::new();
        for s in slices {
            while open.last().is_some_and(|o| o.1 <= s.0) {
                open.pop();
            }
            if let Some(o) = open.last() {
                assert!(s.1 <= o.1 + 1e-9, "slice {s:?} overlaps {o:?} on {pid}/{tid}");
            }
            open.push(s);
        }
    }
    assert_eq!(counts["fib"], 177);
    assert_eq!(counts["thread_work"], 3);
    assert_eq!(counts["child_work"], 5);
    let names: Vec<&Value> = events.iter().filter(|e| e["name"] == "process_name").collect();
    assert!(names.iter().any(|n| n["args"]["name"] == "calls"), "process names: {names:?}");
    counts
}

#[test]
fn executables_without_function_symbols_are_traced_for_process_events() {
    let dir = temp_dir();
    // Debian's coreutils are stripped and export no functions.
    let (run, t) = record(dir.path(), &["--", "true"]);
    assert_eq!(run.code(), 0, "{run:?}");
    assert!(run.stderr.contains("has no function symbols: tracing its processes only"), "{run:?}");
    assert_eq!(t.start["probes"], 0);
    let kinds: Vec<&str> = t.events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["spawn", "exit"]);
    assert_eq!(t.events[1]["exit_code"], 0);
}

/// How kernels before 6.6 attach probes (one perf-event uprobe per site, the cookie on its BPF
/// link), forced where uprobe-multi links exist: the same calls, returns, arguments and exit as
/// with uprobe-multi links. Under a kernel without them (6.1), the default is perf events and
/// asking for uprobe-multi links is refused in one sentence.
#[test]
fn perf_event_uprobes_trace_the_same_as_uprobe_multi_links() {
    let dir = temp_dir();
    let run_with = |attach: &str| {
        let (run, t) = record(
            dir.path(),
            &["--attach", attach, "-f", "rust_fixture::*", "--", env!("CARGO_BIN_EXE_rust_fixture")],
        );
        assert_eq!(run.code(), 4, "{run:?}");
        assert_eq!(t.lost(), 0);
        assert_eq!(t.start["kernel"]["attach"], attach, "{}", t.start);
        let scale: Vec<Vec<u64>> = t.calls("rust_fixture::scale").iter().map(|c| args(c)[..2].to_vec()).collect();
        let rets: Vec<u64> = t.returns("rust_fixture::scale").iter().map(|r| u64_field(r, "retval")).collect();
        let exit = t.of_kind("exit").find(|e| e["thread"] == false).unwrap()["exit_code"].clone();
        (t.calls("rust_fixture::fib").len(), t.returns("rust_fixture::fib").len(), scale, rets, exit)
    };
    let perf = run_with("perf_event");
    assert_eq!(perf, (465, 465, vec![vec![10, 3], vec![20, 3], vec![30, 3]], vec![30, 60, 90], Value::from(4)));
    if tracer_tests::kernel_version() >= (6, 6) {
        assert_eq!(run_with("uprobe_multi"), perf);
    } else {
        let run = tracer_tests::tracer(&[
            "record",
            "--attach",
            "uprobe_multi",
            "-f",
            "rust_fixture::fib",
            "-o",
            dir.path().join("x.jsonl").to_str().unwrap(),
            "--",
            env!("CARGO_BIN_EXE_rust_fixture"),
        ]);
        // The probe-path line comes first (the plan is made before anything is loaded).
        assert_ne!(run.code(), 0, "{run:?}");
        assert_eq!(
            run.stderr.lines().last(),
            Some(
                "tracer: error: this kernel has no uprobe-multi links (Linux 6.6 and later have them): --attach uprobe_multi cannot work here"
            ),
            "{run:?}"
        );
    }
}
