//! USDT probes in the real kernel, through `tracer record`: a program's own events (`log`
//! events, from the `tracer-events` crate and its C header) and `<sys/sdt.h>` and libstdc++
//! probes (`usdt` events). Payloads and arguments are checked exactly, and so are the semaphores:
//! zero untraced, raised while traced (launched or attached), zero again after.

use std::{
    collections::HashMap,
    ffi::OsStr,
    io::{BufRead as _, BufReader, Write as _},
    path::Path,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
};

use serde_json::{Value, json};
use tracer_tests::{Run, Trace, fixture, start_tracing, temp_dir, tracer, u64_field, wait_with_timeout};

/// `tracer record -o DIR/trace.jsonl ARGS`, which must succeed and lose nothing: the run (whose
/// stdout is the command's) and the trace.
fn record<S: AsRef<OsStr>>(dir: &Path, args: &[S]) -> (Run, Trace) {
    let (run, trace) = tracer_tests::record(dir, args);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(trace.lost(), 0, "nothing lost: {}", trace.end);
    (run, trace)
}

/// The arguments of every `usdt` event of the probe `name`.
fn usdt(trace: &Trace, name: &str) -> Vec<Vec<Value>> {
    trace.of_kind("usdt").filter(|r| r["name"] == name).map(|r| r["args"].as_array().unwrap().clone()).collect()
}

fn logs(trace: &Trace) -> Vec<&Value> {
    trace.of_kind("log").collect()
}

/// The `line NAME N` lines a fixture printed, and its other `KEY VALUE` lines.
fn printed(stdout: &str) -> (HashMap<String, u64>, HashMap<String, String>) {
    let (mut lines, mut values) = (HashMap::new(), HashMap::new());
    for l in stdout.lines() {
        let mut parts = l.splitn(3, ' ');
        match (parts.next(), parts.next(), parts.next()) {
            (Some("line"), Some(name), Some(n)) => {
                lines.insert(name.to_string(), n.parse().unwrap());
            }
            (Some(key), Some(a), b) => {
                values.insert(key.to_string(), b.map_or(a.to_string(), |b| format!("{a} {b}")));
            }
            _ => {}
        }
    }
    (lines, values)
}

/// A program event's fields, as the test compares them.
fn event(r: &Value) -> Value {
    json!({
        "type": r["type"], "level": r["level"], "source": r["source"], "message": r["message"],
        "function": r["function"], "file": r["file"], "line": r["line"], "spans": r["spans"],
        "data": r["data"], "truncated": r["truncated"],
    })
}

#[test]
fn rust_events_arrive_with_their_exact_fields() {
    let dir = temp_dir();
    let exe = env!("CARGO_BIN_EXE_events_fixture");
    let (run, r) = record(dir.path(), &["-e", "log", "--", exe, "run"]);
    let (line, value) = printed(&run.stdout);
    assert_eq!(value["listening"], "1", "the semaphore is raised before the program's first instruction");
    assert!(run.stderr.contains("tracing 0 function(s) and 1 USDT probe site(s)"), "{}", run.stderr);
    let file = &value["file"];
    let logs = logs(&r);
    assert_eq!(logs.len(), 10, "{:#?}", r.events);
    assert_eq!(r.events.len(), 10, "only program events: {:#?}", r.events);
    let pid = u64_field(logs[0], "pid");
    assert!(logs.iter().all(|l| u64_field(l, "pid") == pid));

    let trace = |message: &str, function: Value, line: u64, data: Value| {
        json!({"type": "trace", "level": "info", "source": null, "message": message, "function": function,
               "file": file, "line": line, "spans": [], "data": data, "truncated": false})
    };
    let log = |level: &str, source: &str, message: &str, line: u64, spans: Value, data: Value| {
        json!({"type": "log", "level": level, "source": source, "message": message, "function": "events_fixture",
               "file": file, "line": line, "spans": spans, "data": data, "truncated": false})
    };
    let expected = [
        trace("plain message", Value::Null, line["print"], Value::Null),
        trace("with data", Value::Null, line["data"], json!({"count": 3, "name": "widget"})),
        trace("formatted 42 and \"x\"", json!("events_fixture"), line["printf"], Value::Null),
        trace("batch 7 done", json!("events_fixture"), line["printf_data"], json!({"id": 7, "tags": ["a", "b"]})),
        log(
            "warn",
            "events_fixture",
            "slow client 9",
            line["tracing_warn"],
            json!(["outer", "inner"]),
            json!({"bytes": 512, "peer": "10.0.0.2", "ok": true, "delta": -3}),
        ),
        log("error", "events_fixture", "no fields", line["tracing_error"], json!([]), Value::Null),
        log("info", "app::db", "logged in", line["log_info"], json!([]), json!({"user": "ada", "attempts": 3})),
        log("debug", "events_fixture", "debug from log", line["log_debug"], json!([]), Value::Null),
    ];
    for (got, want) in logs.iter().zip(&expected) {
        assert_eq!(event(got), *want);
    }

    // 10,000 bytes of message: the kernel keeps 4096 bytes of payload, and says it cut it.
    let long = logs[8];
    assert_eq!(long["truncated"], true);
    let message = long["message"].as_str().unwrap();
    assert_eq!(message.len(), 4096 - 8 - 5 * 4 - file.len(), "the message fills what is left");
    assert!(message.bytes().all(|b| b == b'x'));
    assert_eq!((long["line"].as_u64(), &long["data"]), (Some(line["long"]), &Value::Null));

    // From the second thread: its own tid, in the same process.
    let thread = logs[9];
    assert_eq!(event(thread), trace("from thread", Value::Null, line["thread"], Value::Null));
    assert_eq!(thread["tid"].as_u64().unwrap().to_string(), value["thread"]);
    assert_ne!(u64_field(thread, "tid"), pid);
    assert_eq!(r.end["reason"], "command_exited");
}

#[test]
fn untraced_program_events_cost_nothing_and_show_nothing() {
    // Without `log` events the probe is not attached: its semaphore stays zero, and the program
    // formats nothing.
    let dir = temp_dir();
    let exe = env!("CARGO_BIN_EXE_events_fixture");
    let (run, r) = record(dir.path(), &["-e", "spawn,exit", "--", exe, "run"]);
    assert_eq!(printed(&run.stdout).1["listening"], "0");
    assert_eq!(logs(&r).len(), 0, "{:#?}", r.events);
    assert!(r.of_kind("exit").count() >= 1, "the process was traced: {:#?}", r.events);
}

#[test]
fn c_and_cxx_events_through_the_header() {
    for name in ["events_c", "events_cxx"] {
        let dir = temp_dir();
        let (run, r) = record(
            dir.path(),
            &["-e".as_ref(), "log".as_ref(), "--".as_ref(), fixture(name).as_os_str(), "run".as_ref()],
        );
        let (line, value) = printed(&run.stdout);
        assert_eq!(value["enabled"], "1", "{name}");
        let file = &value["file"];
        let logs = logs(&r);
        assert_eq!(logs.len(), 5, "{name}: {:#?}", r.events);
        let trace = |message: &str, line: u64, data: Value| {
            json!({"type": "trace", "level": "info", "source": null, "message": message, "function": "run",
                   "file": file, "line": line, "spans": [], "data": data, "truncated": false})
        };
        assert_eq!(event(logs[0]), trace("plain from C", line["print"], Value::Null), "{name}");
        assert_eq!(event(logs[1]), trace("with data", line["data"], json!({"n": 5, "ok": true})), "{name}");
        assert_eq!(event(logs[2]), trace("formatted 42 x", line["printf"], Value::Null), "{name}");
        assert_eq!(
            event(logs[3]),
            json!({"type": "log", "level": "warn", "source": "c.net", "message": "slow peer", "function": "run",
                   "file": file, "line": line["log"], "spans": [], "data": {"retry": 2}, "truncated": false}),
            "{name}"
        );
        let long = logs[4];
        assert_eq!(long["truncated"].as_bool(), Some(true), "{name}");
        let message = long["message"].as_str().unwrap();
        assert_eq!(message.len(), 4096 - 8 - 5 * 4 - 3 - file.len(), "{name}");
        assert!(message.bytes().all(|b| b == b'y'), "{name}");
    }
}

#[test]
fn sdt_probe_arguments_are_exact_in_memory_registers_and_globals() {
    for name in ["sdt_probes_o0", "sdt_probes_o2"] {
        let dir = temp_dir();
        let (run, r) = record(
            dir.path(),
            &[
                "-e".as_ref(),
                "usdt".as_ref(),
                "-u".as_ref(),
                "fixture:*".as_ref(),
                "--".as_ref(),
                fixture(name).as_os_str(),
                "run".as_ref(),
                "3".as_ref(),
            ],
        );
        assert!(run.stderr.contains("and 4 USDT probe site(s)"), "{name}: {}", run.stderr);
        let (_, value) = printed(&run.stdout);
        assert_eq!(value["semaphore"], "1", "{name}: fixture:gated's semaphore is raised");
        assert_eq!(r.events.len(), 10, "{name}: {:#?}", r.events);
        let module = std::fs::canonicalize(fixture(name)).unwrap();
        assert!(r.events.iter().all(|x| x["provider"] == "fixture" && x["module"] == module.to_str().unwrap()));
        let rounds = 0..3i64;
        assert_eq!(
            usdt(&r, "loop"),
            rounds.clone().map(|i| vec![json!(i), json!(-i), json!(i * 1000), json!(-i)]).collect::<Vec<_>>(),
            "{name}"
        );
        assert_eq!(usdt(&r, "global"), rounds.clone().map(|i| vec![json!(i + 1)]).collect::<Vec<_>>(), "{name}");
        assert_eq!(usdt(&r, "gated"), rounds.map(|i| vec![json!(i)]).collect::<Vec<_>>(), "{name}");
        assert_eq!(
            usdt(&r, "constants"),
            [vec![json!(-7), json!(-123456789012i64), json!(200), json!(-300), json!(0xfedcba9876543210u64)]],
            "{name}"
        );
        // One thread, in program order.
        let order: Vec<&str> = r.events.iter().map(|x| x["name"].as_str().unwrap()).collect();
        assert_eq!(order[..3], ["loop", "global", "gated"], "{name}");
    }
}

#[test]
fn libstdcxx_probes_by_module() {
    let dir = temp_dir();
    let throws = fixture("throws");
    let (run, r) = record(
        dir.path(),
        &[
            "-e".as_ref(),
            "usdt".as_ref(),
            "-u".as_ref(),
            "libstdc++.so.6:libstdcxx:*".as_ref(),
            "--".as_ref(),
            throws.as_os_str(),
            "4".as_ref(),
        ],
    );
    let (_, value) = printed(&run.stdout);
    assert_eq!(value["caught"], "6");
    let typeinfo: u64 = value["typeinfo"].parse().unwrap();
    let throw = usdt(&r, "throw");
    let catch = usdt(&r, "catch");
    assert_eq!((throw.len(), catch.len(), usdt(&r, "rethrow").len()), (4, 4, 0), "{:#?}", r.events);
    // The second argument of both is the thrown type's typeinfo (catch reads it from memory,
    // `8@-80(%rbx)`); the first is the same exception object at throw and catch.
    for (t, c) in throw.iter().zip(&catch) {
        assert_eq!((t[1].as_u64(), c[1].as_u64()), (Some(typeinfo), Some(typeinfo)), "{t:?} {c:?}");
        assert_ne!(t[0].as_u64(), Some(0));
    }
    assert!(r.events.iter().all(|x| x["module"].as_str().unwrap().contains("libstdc++")));
}

/// A fixture that serves commands on stdin, and a tracer attached to it in the background.
struct Served {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Served {
    fn start(program: &Path, args: &[&str]) -> Served {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start fixture");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        Served { child, stdin, stdout }
    }

    /// Sends a command and returns the line it answers.
    fn ask(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_string()
    }

    fn quit(mut self) {
        writeln!(self.stdin, "quit").unwrap();
        assert!(self.child.wait().unwrap().success());
    }
}

/// `tracer record -p PID -e log,usdt ARGS` in the background, once it is attached.
fn attach(dir: &Path, pid: u32, args: &[&str]) -> (Child, std::path::PathBuf) {
    let out = dir.join("trace.jsonl");
    let pid = pid.to_string();
    let mut all = vec!["record", "-p", &pid, "-e", "log,usdt", "-o", out.to_str().unwrap()];
    all.extend_from_slice(args);
    let (child, mut stderr, _) = start_tracing(&all);
    // Keep reading stderr so the tracer never blocks on it.
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    (child, out)
}

/// Stops a background tracer as Ctrl-C would.
fn interrupt(child: Child) -> Run {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    wait_with_timeout(child, "tracer")
}

#[test]
fn semaphores_rise_while_attached_and_fall_after() {
    // Untraced, every semaphore reads zero (the programs check them themselves).
    let untraced = |program: &Path, args: &[&str]| {
        let out = Command::new(program).args(args).output().unwrap();
        assert!(out.status.success());
        printed(&String::from_utf8(out.stdout).unwrap()).1
    };
    assert_eq!(untraced(Path::new(env!("CARGO_BIN_EXE_events_fixture")), &["run"])["listening"], "0");
    assert_eq!(untraced(&fixture("events_c"), &["run"])["enabled"], "0");
    assert_eq!(untraced(&fixture("sdt_probes_o0"), &["run", "1"])["semaphore"], "0");

    // Attached to running processes: raised while the tracer is attached, zero after it detached.
    let events_fixture = Path::new(env!("CARGO_BIN_EXE_events_fixture"));
    for (program, args, state, raised, pattern) in [
        (events_fixture.to_path_buf(), &["serve"][..], "listening", "listening 1", None),
        (fixture("events_c"), &["serve"][..], "enabled", "enabled 1", None),
        (fixture("sdt_probes_o2"), &["serve"][..], "semaphore", "semaphore 1", Some("fixture:gated")),
    ] {
        let dir = temp_dir();
        let mut served = Served::start(&program, args);
        assert_eq!(served.ask("state"), format!("{state} 0"));
        let usdt_args: Vec<&str> = pattern.into_iter().flat_map(|p| ["-u", p]).collect();
        let (tracer, out) = attach(dir.path(), served.child.id(), &usdt_args);
        assert_eq!(served.ask("state"), raised, "{}", program.display());
        let fire = if pattern.is_some() { "fire" } else { "emit" };
        let answer = served.ask(fire);
        let run = interrupt(tracer);
        assert_eq!(run.code(), 0, "{run:?}");
        assert_eq!(served.ask("state"), format!("{state} 0"), "{}: lowered on detach", program.display());
        // Untraced again: this one is not recorded (the tracer is gone anyway).
        served.ask(fire);
        // A tracer that is killed outright leaves nothing raised either: the kernel closes its
        // links, and with them the semaphores.
        let dir2 = temp_dir();
        let (mut killed, _) = attach(dir2.path(), served.child.id(), &usdt_args);
        assert_eq!(served.ask("state"), raised);
        killed.kill().unwrap();
        killed.wait().unwrap();
        assert_eq!(served.ask("state"), format!("{state} 0"), "{}: lowered when the tracer died", program.display());
        served.quit();
        let r = Trace::load(&out);
        assert_eq!(r.end["reason"], "interrupted");
        assert_eq!(r.lost(), 0, "{}", r.end);
        match pattern {
            None => {
                assert_eq!(answer, "emitted");
                let logs = logs(&r);
                assert_eq!(logs.len(), 1, "{:#?}", r.events);
                assert_eq!(logs[0]["message"], "served");
            }
            Some(_) => {
                assert_eq!(answer, "fired");
                assert_eq!(usdt(&r, "gated"), [vec![json!(0)]], "{:#?}", r.events);
                assert_eq!(r.events.len(), 1, "only fixture:gated was asked for");
            }
        }
    }
}

#[test]
fn hostile_payloads_are_bounded_and_reported() {
    // The program is not trusted: it may fire the probe with any address and length. What cannot
    // be read is counted as lost (`log_unreadable`), and said on stderr.
    let dir = temp_dir();
    let (run, r) = tracer_tests::record(
        dir.path(),
        &["-e".as_ref(), "log".as_ref(), "--".as_ref(), fixture("events_c").as_os_str(), "attack".as_ref()],
    );
    assert_eq!(run.code(), 0, "{run:?}");
    let logs = logs(&r);
    assert_eq!(logs.len(), 2, "{:#?}", r.events);
    // A length of 2^64 - 1: the kernel copies 4096 bytes and says so.
    assert_eq!((logs[0]["truncated"].as_bool(), logs[0]["message"].as_str()), (Some(true), Some("")));
    assert_eq!(logs[1]["message"], "still fine");
    // An address it cannot read, and a payload of an unknown version.
    assert_eq!(r.end["lost_events"]["log_unreadable"], 2, "{}", r.end);
    assert_eq!(r.lost(), 2, "{}", r.end);
    // Said where it was lost, and not blamed on the ring buffer.
    assert!(run.stderr.contains("log_unreadable: 2: program events lost in the probe"), "{}", run.stderr);
    assert!(!run.stderr.contains("--buffer-size"), "{}", run.stderr);
}

#[test]
fn bad_usdt_input_is_one_clear_sentence() {
    let dir = temp_dir();
    let out = dir.path().join("t.jsonl");
    let record = |args: &[&OsStr]| {
        let mut all: Vec<&OsStr> = vec!["record".as_ref(), "-o".as_ref(), out.as_os_str()];
        all.extend_from_slice(args);
        tracer(&all)
    };
    let sdt = fixture("sdt_probes_o0");
    let run = record(&["-u".as_ref(), "fixture:nope".as_ref(), "--".as_ref(), sdt.as_os_str()]);
    run.assert_error("USDT pattern 'fixture:nope' matches no probe in ");
    assert!(
        run.stderr
            .trim_end()
            .ends_with("the probes there are: fixture:constants, fixture:gated, fixture:global, fixture:loop"),
        "{run:?}"
    );
    let run = record(&["-u".as_ref(), "nope".as_ref(), "--".as_ref(), "/bin/true".as_ref()]);
    run.assert_error("invalid USDT pattern 'nope': expected PROVIDER:NAME, optionally after MODULE:");
    let run = record(&["-u".as_ref(), "nomodule.so:a:b".as_ref(), "--".as_ref(), "/bin/true".as_ref()]);
    run.assert_error("module 'nomodule.so' matches no executable or library of the targets");
    let run =
        record(&["-e".as_ref(), "spawn".as_ref(), "-u".as_ref(), "a:b".as_ref(), "--".as_ref(), "/bin/true".as_ref()]);
    run.assert_error("--usdt needs usdt events, but --events does not have them");
    assert!(!out.exists(), "nothing written on bad input");
}
