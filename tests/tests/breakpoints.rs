//! Breakpoints (`-B`) and hardware watchpoints (`-w`) in the real kernel, through `tracer
//! record`, on `breakpoints.c`: `bump(i)` writes `counter = i * 2` on the line marked
//! `BUMP_LINE` for i = 1..50, then a thread writes 7 into `shared` and a forked child 9, then
//! `label(name, n)` has strings in scope at the line marked `LABEL_LINE`, then the program execs
//! its argument if it has one. Values, functions, lines and counts are checked exactly, at -O0
//! (locals in the frame) and -O1 (in registers).

use std::{ffi::OsStr, path::Path};

use serde_json::{Value, json};
use tracer_tests::{
    LocalAgent, Run, Trace, fixture,
    rotel::{Rotel, SpanEvent},
    temp_dir, tracer, u64_field,
};

const SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/c/breakpoints.c");

/// The line of the fixture marked `/* MARKER */`.
fn marked_line(marker: &str) -> u64 {
    let text = std::fs::read_to_string(SOURCE).unwrap();
    text.lines().position(|l| l.contains(&format!("/* {marker} */"))).expect("the marker") as u64 + 1
}

/// The line of the fixture that writes `counter`.
fn bump_line() -> u64 {
    marked_line("BUMP_LINE")
}

/// Why this machine cannot run the watchpoint tests, if it cannot (they then say so and stop): a
/// hardware breakpoint on a variable of this thread is refused with the errno of a kernel without
/// them (no breakpoint PMU: `ENOENT` or `ENODEV`; none for this CPU: `EOPNOTSUPP`). Any other
/// failure is a real one, and fails the test rather than skip it.
fn no_hardware_breakpoints() -> Option<String> {
    const PERF_TYPE_BREAKPOINT: u64 = 5;
    const HW_BREAKPOINT_W: u64 = 2;
    const ATTR_SIZE: u64 = 72; // PERF_ATTR_SIZE_VER1: up to `bp_len`.
    const DISABLED: u64 = 1;
    let watched = 0u64;
    // `struct perf_event_attr` up to `bp_len`, as u64 words: type | size << 32, config,
    // sample_period, sample_type, read_format, flags, wakeup_events | bp_type << 32, bp_addr,
    // bp_len.
    let attr: [u64; 9] = [
        PERF_TYPE_BREAKPOINT | ATTR_SIZE << 32,
        0,
        1,
        0,
        0,
        DISABLED,
        HW_BREAKPOINT_W << 32,
        &raw const watched as u64,
        8,
    ];
    // SAFETY: perf_event_open reads ATTR_SIZE bytes of `attr`; the event is on this thread, any CPU.
    let fd = unsafe { libc::syscall(libc::SYS_perf_event_open, attr.as_ptr(), 0, -1, -1, 0) };
    if fd >= 0 {
        // SAFETY: the descriptor just opened, closed once.
        unsafe { libc::close(fd as i32) };
        return None;
    }
    let error = std::io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::ENOENT | libc::ENODEV | libc::EOPNOTSUPP) => {
            Some(format!("this kernel has no hardware breakpoints (perf_event_open: {error})"))
        }
        _ => panic!("a hardware breakpoint could not be opened, for a reason other than its absence: {error}"),
    }
}

macro_rules! require_hardware_breakpoints {
    () => {
        if let Some(why) = no_hardware_breakpoints() {
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
}

/// `tracer ARGS` in a process where the kernel answers every `perf_event_open` with `ENODEV`, as
/// a kernel without a breakpoint PMU answers a hardware breakpoint: a seccomp filter, installed
/// between fork and exec, makes this machine one without hardware breakpoints for tracer alone.
fn tracer_without_perf_events<S: AsRef<OsStr>>(args: &[S]) -> Run {
    use std::os::unix::process::CommandExt;
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const ARCH: u32 = 4; // offsetof(struct seccomp_data, arch)
    const NR: u32 = 0; // offsetof(struct seccomp_data, nr)
    let stmt = |code: u32, k: u32| libc::sock_filter { code: code as u16, jt: 0, jf: 0, k };
    let jump = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let filter = [
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, ARCH),
        jump(AUDIT_ARCH_X86_64, 0, 3),
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, NR),
        jump(libc::SYS_perf_event_open as u32, 0, 1),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ERRNO | libc::ENODEV as u32),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
    ];
    let mut command = std::process::Command::new(tracer_tests::tracer_bin());
    command
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    // SAFETY: between fork and exec only two prctl calls run, on the closure's own `filter`.
    unsafe {
        command.pre_exec(move || {
            let program = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr().cast_mut() };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &program as *const libc::sock_fprog)
                    != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    tracer_tests::wait_with_timeout(command.spawn().expect("start tracer"), "tracer")
}

/// The refusal itself, on every machine: where `perf_event_open` answers `ENODEV` (here made so
/// for tracer alone), `-w` is refused with one sentence and exit 1, before the command runs.
#[test]
fn watch_is_refused_with_one_sentence_where_perf_event_open_answers_enodev() {
    let dir = temp_dir();
    let out = dir.path().join("trace.jsonl");
    let marker = dir.path().join("ran");
    // The fixture execs its arguments when it ends: `touch MARKER` says whether it ran.
    let run = tracer_without_perf_events(&[
        "record".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
        "-w".as_ref(),
        "counter".as_ref(),
        "--".as_ref(),
        fixture("breakpoints_o0").as_os_str(),
        "/usr/bin/touch".as_ref(),
        marker.as_os_str(),
    ]);
    assert_eq!(run.code(), 1, "{run:?}");
    run.assert_error(
        "-w cannot watch on this machine: it gives no hardware breakpoints (perf_event_open of one answers: No such device (os error 19))",
    );
    assert!(!marker.exists(), "the command ran although -w was refused");
    assert!(!out.exists(), "a trace was written although -w was refused");
}

/// `tracer record -o DIR/trace.jsonl ARGS`, which must succeed and lose nothing.
fn record<S: AsRef<OsStr>>(dir: &Path, args: &[S]) -> (Run, Trace) {
    let (run, trace) = tracer_tests::record(dir, args);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(trace.lost(), 0, "nothing lost: {}", trace.end);
    (run, trace)
}

fn file_name(e: &Value) -> &str {
    e["file"].as_str().unwrap_or_default().rsplit('/').next().unwrap()
}

/// tracer's own check agrees with this test's: where the machine has no hardware breakpoints, `-w`
/// is refused with one sentence and exit 1 before anything runs; where it has them, `-w` records.
#[test]
fn watch_is_refused_with_one_sentence_exactly_where_the_machine_has_no_breakpoints() {
    let dir = temp_dir();
    let exe = fixture("breakpoints_o0");
    let args = ["-e".as_ref(), "watch".as_ref(), "-w".as_ref(), "counter".as_ref(), "--".as_ref(), exe.as_os_str()];
    match no_hardware_breakpoints() {
        Some(why) => {
            eprintln!("this machine: {why}");
            let out = dir.path().join("trace.jsonl");
            let mut all = vec!["record".as_ref(), "-o".as_ref(), out.as_os_str()];
            all.extend(args);
            let run = tracer_tests::tracer(&all);
            assert_eq!(run.code(), 1, "{run:?}");
            run.assert_error(
                "-w cannot watch on this machine: it gives no hardware breakpoints (perf_event_open of one answers: ",
            );
        }
        None => {
            let (_, trace) = record(dir.path(), &args);
            assert_eq!(trace.of_kind("watch").count(), 50, "{}", trace.end);
        }
    }
}

#[test]
fn every_write_of_a_watched_variable_is_seen_with_its_value_and_line() {
    require_hardware_breakpoints!();
    for build in ["breakpoints_o0", "breakpoints_o1"] {
        let dir = temp_dir();
        let exe = fixture(build);
        let (_, trace) = record(
            dir.path(),
            &["-e".as_ref(), "watch".as_ref(), "-w".as_ref(), "counter".as_ref(), "--".as_ref(), exe.as_os_str()],
        );
        let watches: Vec<&Value> = trace.of_kind("watch").collect();
        assert_eq!(watches.len(), 50, "{build}: one event per write: {:#?}", trace.events);
        let values: Vec<u64> = watches.iter().map(|w| u64_field(w, "value")).collect();
        assert_eq!(values, (1..=50).map(|i| i * 2).collect::<Vec<_>>(), "{build}");
        for w in &watches {
            assert_eq!(w["variable"], "counter");
            assert_eq!(w["function"], "bump", "{build}: {w}");
            assert_eq!(file_name(w), "breakpoints.c", "{build}: {w}");
            assert_eq!(u64_field(w, "line"), bump_line(), "{build}: {w}");
        }
    }
}

#[test]
fn a_watchpoint_follows_threads_and_children_created_later() {
    require_hardware_breakpoints!();
    let dir = temp_dir();
    let exe = fixture("breakpoints_o0");
    let (_, trace) = record(
        dir.path(),
        &["-e".as_ref(), "watch".as_ref(), "-w".as_ref(), "shared".as_ref(), "--".as_ref(), exe.as_os_str()],
    );
    let command = u64_field(&trace.start["targets"][0], "pid");
    let watches: Vec<&Value> = trace.of_kind("watch").collect();
    assert_eq!(watches.len(), 2, "the thread's write and the child's: {:#?}", trace.events);
    let thread = watches.iter().find(|w| w["value"] == 7).expect("the thread's write");
    assert_eq!(u64_field(thread, "pid"), command, "{thread}");
    assert_ne!(u64_field(thread, "tid"), command, "a thread other than the main one: {thread}");
    assert_eq!(thread["function"], "writer");
    let child = watches.iter().find(|w| w["value"] == 9).expect("the child's write");
    assert_ne!(u64_field(child, "pid"), command, "the forked child: {child}");
    assert_eq!(child["function"], "main");
    assert_eq!(thread["address"], child["address"], "the same variable, at the same address after fork");
}

/// The watchpoints survive an exec, but in another program the address is not the variable: the
/// second image (`counter` renamed `tally`, at the same address, written 50 times with 3, 6, ...,
/// 150) is not reported.
#[test]
fn a_watchpoint_ends_where_its_process_execs_another_program() {
    require_hardware_breakpoints!();
    let dir = temp_dir();
    let exe = fixture("breakpoints_o0");
    let other = fixture("breakpoints_renamed");
    let (_, trace) = record(
        dir.path(),
        &[
            "-e".as_ref(),
            "watch,spawn".as_ref(),
            "-w".as_ref(),
            "counter".as_ref(),
            "--".as_ref(),
            exe.as_os_str(),
            other.as_os_str(),
        ],
    );
    let command = u64_field(&trace.start["targets"][0], "pid");
    let execs: Vec<&Value> = trace
        .of_kind("spawn")
        .filter(|e| e["how"] == "exec" && u64_field(e, "pid") == command && e["filename"] == other.to_str().unwrap())
        .collect();
    assert_eq!(execs.len(), 1, "the command execs the renamed build: {:#?}", trace.events);
    let watches: Vec<(u64, &str)> =
        trace.of_kind("watch").map(|w| (u64_field(w, "value"), w["function"].as_str().unwrap_or("?"))).collect();
    assert_eq!(watches, (1..=50).map(|i| (i * 2, "bump")).collect::<Vec<_>>(), "only the first image's writes");
}

#[test]
fn more_variables_than_debug_registers_are_refused() {
    let dir = temp_dir();
    let out = dir.path().join("trace.jsonl");
    let exe = fixture("breakpoints_o0");
    let mut args: Vec<&OsStr> = vec!["record".as_ref(), "-o".as_ref(), out.as_os_str()];
    for v in ["w1", "w2", "w3", "w4", "w5"] {
        args.extend(["-w".as_ref(), OsStr::new(v)]);
    }
    args.extend(["--".as_ref(), exe.as_os_str()]);
    tracer(&args).assert_error("5 variables to watch: x86-64 has 4 debug registers per thread");
}

#[test]
fn a_breakpoint_gives_the_locals_in_scope_at_o0_and_o1() {
    let line = bump_line();
    for build in ["breakpoints_o0", "breakpoints_o1"] {
        let dir = temp_dir();
        let exe = fixture(build);
        let at = format!("breakpoints.c:{line}");
        let (_, trace) = record(
            dir.path(),
            &["-e".as_ref(), "break".as_ref(), "-B".as_ref(), at.as_ref(), "--".as_ref(), exe.as_os_str()],
        );
        let breaks: Vec<&Value> = trace.of_kind("break").collect();
        assert_eq!(breaks.len(), 50, "{build}: {:#?}", trace.events);
        for (n, b) in breaks.iter().enumerate() {
            assert_eq!(b["locals"], json!({"i": n + 1}), "{build}: {b}");
            assert_eq!(b["function"], "bump");
            assert_eq!(u64_field(b, "line"), line);
            assert_eq!(file_name(b), "breakpoints.c");
        }
    }
}

/// `const char *name` and `char tag[16]` at a breakpoint: read as strings, as call parameters
/// are (a null pointer as `null`, a string longer than the limit cut, with the same marker).
#[test]
fn a_breakpoint_reads_the_strings_in_scope_at_o0_and_o1() {
    let line = marked_line("LABEL_LINE");
    let long = "a name of eighty bytes, longer than the string limit of sixty-four bytes: cut here";
    let names = [
        json!("item-1"),
        json!("item-2"),
        json!("item-3"),
        Value::Null,
        json!({"string": &long[..64], "truncated": true}),
    ];
    for build in ["breakpoints_o0", "breakpoints_o1"] {
        let dir = temp_dir();
        let exe = fixture(build);
        let at = format!("breakpoints.c:{line}");
        let (run, trace) = record(
            dir.path(),
            &["-e".as_ref(), "break".as_ref(), "-B".as_ref(), at.as_ref(), "--".as_ref(), exe.as_os_str()],
        );
        assert!(!run.stderr.contains("warning"), "{build}: {}", run.stderr);
        let locals: Vec<&Value> = trace.of_kind("break").map(|b| &b["locals"]).collect();
        let expected: Vec<Value> = names
            .iter()
            .enumerate()
            .map(|(i, name)| json!({"name": name, "n": i + 1, "tag": format!("tag-{}", i + 1)}))
            .collect();
        assert_eq!(locals, expected.iter().collect::<Vec<_>>(), "{build}");
    }
}

#[test]
fn a_line_without_code_names_the_nearest_lines_with_code() {
    // The blank line after `bump`'s closing brace; its brace and `writer`'s opening line have code.
    let blank = bump_line() + 2;
    let dir = temp_dir();
    let out = dir.path().join("trace.jsonl");
    let exe = fixture("breakpoints_o0");
    let at = format!("breakpoints.c:{blank}");
    let run = tracer(&[
        "record".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
        "-B".as_ref(),
        at.as_ref(),
        "--".as_ref(),
        exe.as_os_str(),
    ]);
    run.assert_error(&format!(
        "-B: line {blank} of breakpoints.c has no code; the nearest lines with code are {} and {}",
        blank - 1,
        blank + 1
    ));
}

/// Both kinds in every format: Chrome and Perfetto instant events on the thread, the native
/// format and back, `tracer calls` inline.
#[test]
fn break_and_watch_events_reach_every_format() {
    require_hardware_breakpoints!();
    let dir = temp_dir();
    let exe = fixture("breakpoints_o0");
    let at = format!("breakpoints.c:{}", bump_line());
    let (_, trace) = record(
        dir.path(),
        &[
            "-e".as_ref(),
            "break,watch".as_ref(),
            "-B".as_ref(),
            at.as_ref(),
            "-w".as_ref(),
            "counter".as_ref(),
            "--".as_ref(),
            exe.as_os_str(),
        ],
    );
    assert_eq!(trace.of_kind("break").count(), 50);
    // Each write once: the uprobe's single-step after a write does not report it again (QEMU's
    // emulated CPU does, see docs/breakpoints.md).
    let watches: Vec<(u64, &str)> =
        trace.of_kind("watch").map(|w| (u64_field(w, "value"), w["function"].as_str().unwrap_or("?"))).collect();
    assert_eq!(watches, (1..=50).map(|i| (i * 2, "bump")).collect::<Vec<_>>());
    let jsonl = dir.path().join("trace.jsonl");
    let export = |name: &str| {
        let out = dir.path().join(name);
        let run = tracer(&["export".as_ref(), jsonl.as_os_str(), "-o".as_ref(), out.as_os_str()]);
        assert_eq!(run.code(), 0, "{run:?}");
        out
    };

    let chrome: Value = serde_json::from_str(&std::fs::read_to_string(export("trace.json")).unwrap()).unwrap();
    let instants: Vec<&Value> = chrome["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "i").collect();
    let named = |name: &str| instants.iter().filter(|e| e["name"] == name).count();
    assert_eq!(named("watch counter = 2"), 1, "{instants:#?}");
    assert_eq!(named(&format!("break breakpoints.c:{}", bump_line())), 50);
    let first_watch = instants.iter().find(|e| e["cat"] == "watch").unwrap();
    assert_eq!(first_watch["tid"], trace.of_kind("watch").next().unwrap()["tid"], "on the thread's track");

    let packets = tracer_tests::perfetto::read(&export("trace.pftrace"));
    let names: Vec<String> = packets
        .iter()
        .filter_map(|p| match &p.data {
            Some(tracer_tests::perfetto::trace_packet::Data::TrackEvent(t)) => match &t.name_field {
                Some(tracer_tests::perfetto::track_event::NameField::Name(n)) => Some(n.clone()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert_eq!(names.iter().filter(|n| n.starts_with("watch counter = ")).count(), 50);
    assert_eq!(names.iter().filter(|n| n.starts_with("break breakpoints.c:")).count(), 50);

    // Native and back: the same events.
    let native = export("trace.trc");
    let back = dir.path().join("back.jsonl");
    let run = tracer(&["export".as_ref(), native.as_os_str(), "-o".as_ref(), back.as_os_str()]);
    assert_eq!(run.code(), 0, "{run:?}");
    let again = Trace::load(&back);
    assert_eq!(again.events, trace.events);

    let run = tracer(&["calls".as_ref(), jsonl.as_os_str()]);
    assert_eq!(run.code(), 0, "{run:?}");
    let line = bump_line();
    assert!(run.stdout.contains(&format!("watch counter = 100 by bump (breakpoints.c:{line})")), "{}", run.stdout);
    assert!(run.stdout.contains(&format!("break breakpoints.c:{line} {{i = 50}}")), "{}", run.stdout);
}

/// `collect -B -w`: the texts travel in the trace request, and the agent parses and resolves them
/// against its own executable as `record` does: the same 50 breaks and 50 writes, from host `h`.
/// A line without code on the agent's executable is its one sentence, through the collector.
#[test]
fn a_collector_sets_breakpoints_and_watchpoints_on_its_agents() {
    require_hardware_breakpoints!();
    let dir = temp_dir();
    let agent = LocalAgent::start(dir.path(), "h", &["--allow-commands"]);
    let out = dir.path().join("t.jsonl");
    let command = format!("h:{}", fixture("breakpoints_o0").display());
    let at = format!("breakpoints.c:{}", bump_line());
    let collect = |at: &str| {
        tracer(&[
            "collect",
            "--agent",
            &agent.spec("h"),
            "-e",
            "break,watch",
            "-B",
            at,
            "-w",
            "counter",
            "-c",
            &command,
            "-o",
            out.to_str().unwrap(),
        ])
    };
    let run = collect(&at);
    assert_eq!(run.code(), 0, "{run:?}");
    let trace = Trace::load(&out);
    assert_eq!(trace.lost(), 0, "{}", trace.end);
    let locals: Vec<&Value> = trace.of_kind("break").map(|b| &b["locals"]).collect();
    let expected: Vec<Value> = (1..=50).map(|i| json!({"i": i})).collect();
    assert_eq!(locals, expected.iter().collect::<Vec<_>>());
    let watches: Vec<(u64, &str)> =
        trace.of_kind("watch").map(|w| (u64_field(w, "value"), w["function"].as_str().unwrap_or("?"))).collect();
    assert_eq!(watches, (1..=50).map(|i| (i * 2, "bump")).collect::<Vec<_>>());
    assert!(trace.of_kind("break").chain(trace.of_kind("watch")).all(|e| e["host"] == "h"));

    let run = collect("breakpoints.c:1");
    run.assert_error("agent h could not start tracing: -B: line 1 of breakpoints.c has no code");
}

/// Both kinds reach a real OpenTelemetry collector as events of the process span, with where
/// they happened and what they saw.
#[test]
fn break_and_watch_events_reach_a_real_otlp_collector() {
    require_hardware_breakpoints!();
    let dir = temp_dir();
    let rotel = Rotel::start(dir.path());
    let exe = fixture("breakpoints_o0");
    let line = bump_line();
    let at = format!("breakpoints.c:{line}");
    let args = ["-e", "break,watch", "-B", &at, "-w", "counter", "--", exe.to_str().unwrap()];
    record(dir.path(), &args);
    let jsonl = dir.path().join("trace.jsonl");
    let run = tracer(&["export".as_ref(), jsonl.as_os_str(), "--otlp".as_ref(), rotel.url.as_ref()]);
    assert_eq!(run.code(), 0, "{run:?}");
    let spans = rotel.spans(1);
    let process = spans.iter().find(|s| s.name == "process breakpoints_o0").unwrap_or_else(|| panic!("{spans:#?}"));
    let named =
        |prefix: &str| -> Vec<&SpanEvent> { process.events.iter().filter(|e| e.name.starts_with(prefix)).collect() };
    let breaks = named("break ");
    assert_eq!(breaks.len(), 50, "{:#?}", process.events);
    for (i, b) in (1..=50).zip(&breaks) {
        assert_eq!(b.name, format!("break breakpoints.c:{line}"));
        assert_eq!(b.attributes["code.line.number"], format!("Int({line})"));
        assert_eq!(b.attributes["code.function"], "Str(bump)");
        assert_eq!(b.attributes["tracer.locals"], format!("Str(i = {i})"));
    }
    let watches = named("watch ");
    assert_eq!(watches.len(), 50, "{:#?}", process.events);
    for (i, w) in (1..=50u64).zip(&watches) {
        assert_eq!(w.name, format!("watch counter = {}", i * 2));
        assert_eq!(w.attributes["tracer.variable"], "Str(counter)");
        assert_eq!(w.attributes["tracer.value"], format!("Str({})", i * 2));
        assert_eq!(w.attributes["code.function"], "Str(bump)");
        assert_eq!(w.attributes["code.line.number"], format!("Int({line})"));
    }
}
