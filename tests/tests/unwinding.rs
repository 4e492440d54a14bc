//! Return probes that never harm a program: C++ exceptions, `longjmp` and Rust panics through
//! traced frames, in the real kernel. Programs that unwind get their returns probed where they
//! happen (each `ret` and jump out), so the unwinder never meets a trampoline's address; frames
//! left by unwinding get a return marked `unwound`, so every call has exactly one return.

use std::process::Command;

use serde_json::Value;
use tracer_tests::{Trace, fixture, record, temp_dir};

fn untraced(program: &str, arg: &str) -> (i32, String) {
    let out = Command::new(fixture(program)).arg(arg).output().expect("run the fixture");
    (out.status.code().expect("exited"), String::from_utf8_lossy(&out.stdout).into_owned())
}

fn flag(e: &Value, field: &str) -> bool {
    e[field] == true
}

/// Every call of `function` returned once: `unwound` of them marked so, the rest not.
fn assert_returns(t: &Trace, function: &str, calls: usize, unwound: usize) {
    assert_eq!(t.calls(function).len(), calls, "calls of {function}");
    let returns = t.returns(function);
    assert_eq!(returns.len(), calls, "returns of {function}");
    let marked: Vec<&&Value> = returns.iter().filter(|r| flag(r, "unwound")).collect();
    assert_eq!(marked.len(), unwound, "unwound returns of {function}");
    assert!(marked.iter().all(|r| r["retval"] == 0), "{marked:?}");
}

#[test]
fn cpp_exceptions_through_traced_frames_leave_the_program_whole() {
    let (code, stdout) = untraced("unwinds_cpp", "100");
    assert_eq!((code, stdout.as_str()), (7, "caught 100 cleanups 100 sum 24950\n"));
    let dir = temp_dir();
    let program = fixture("unwinds_cpp");
    let (run, t) =
        record(dir.path(), &["-f", "level*", "-f", "leaf", "-f", "tail", "--", program.to_str().unwrap(), "100"]);
    // The program's own exit code and output: no `terminate called`, no abort.
    assert_eq!(run.code(), 7, "{run:?}");
    assert_eq!(run.stdout, stdout, "{run:?}");
    assert!(!run.stderr.contains("terminate"), "{run:?}");
    assert!(run.stderr.contains("returns probed where they happen"), "the choice is said: {run:?}");
    assert!(run.stderr.contains("unwinds_cpp uses __cxa_throw"), "and why: {run:?}");
    assert_eq!(t.lost(), 0, "{}", t.end);
    // Each level was left by the exception, never by a `ret`.
    for level in ["level1", "level2", "level3"] {
        assert_returns(&t, level, 100, 100);
    }
    // leaf: called by main and through tail's jump, each returning.
    assert_returns(&t, "leaf", 200, 0);
    assert_returns(&t, "tail", 100, 0);
    let tails = t.returns("tail");
    assert!(tails.iter().all(|r| flag(r, "tail_call") && r["retval"] == 0), "{tails:?}");
    let leaf_values: Vec<u64> = t.returns("leaf").iter().map(|r| r["retval"].as_u64().unwrap()).collect();
    assert_eq!(leaf_values.iter().sum::<u64>(), 2 * 4950 + 2 * 5050, "leaf(i) and leaf(i + 1)");
    // Every return ends the innermost open call, its duration the time since that call.
    t.check_nesting();
}

#[test]
fn return_address_probes_are_what_would_abort_it() {
    // The hazard the choice avoids, shown once: forced to uretprobes, the first exception through
    // a traced frame finds the trampoline's address and the C++ runtime aborts the program.
    let dir = temp_dir();
    let program = fixture("unwinds_cpp");
    let (run, _) =
        record(dir.path(), &["--returns", "return_address", "-f", "level*", "--", program.to_str().unwrap(), "3"]);
    assert_eq!(run.code(), 128 + 6, "SIGABRT: {run:?}");
    assert!(run.stderr.contains("terminate called"), "{run:?}");
}

#[test]
fn longjmp_out_of_traced_frames_returns_every_call() {
    let (code, stdout) = untraced("longjmps", "100");
    assert_eq!((code, stdout.as_str()), (7, "jumped 100\n"));
    let dir = temp_dir();
    let program = fixture("longjmps");
    let (run, t) = record(dir.path(), &["-f", "f?", "-f", "leaf", "--", program.to_str().unwrap(), "100"]);
    assert_eq!((run.code(), run.stdout.as_str()), (7, stdout.as_str()), "{run:?}");
    assert!(run.stderr.contains("uses longjmp"), "{run:?}");
    assert_eq!(t.lost(), 0, "{}", t.end);
    for f in ["f1", "f2", "f3"] {
        assert_returns(&t, f, 100, 100);
    }
    assert_returns(&t, "leaf", 100, 0);
    t.check_nesting();
}

#[test]
fn rust_panics_through_traced_frames_are_caught_as_untraced() {
    let (code, stdout) = untraced("unwinds_rust", "100");
    assert_eq!((code, stdout.as_str()), (7, "caught 100\n"));
    let dir = temp_dir();
    let program = fixture("unwinds_rust");
    let (run, t) =
        record(dir.path(), &["-f", "unwinds::level*", "-f", "unwinds::leaf", "--", program.to_str().unwrap(), "100"]);
    assert_eq!((run.code(), run.stdout.as_str()), (7, stdout.as_str()), "{run:?}");
    assert!(run.stderr.contains("unwinds_rust uses _Unwind_"), "{run:?}");
    assert_eq!(t.lost(), 0, "{}", t.end);
    // rustc (1.9x, -O) compiles level1 to a lone `jmp level2`: then its return is that tail jump,
    // before the panic; compiled as a call, the panic unwinds it. Either way, one return each.
    let level1 = t.returns("unwinds::level1");
    assert_eq!((t.calls("unwinds::level1").len(), level1.len()), (100, 100));
    assert!(level1.iter().all(|r| flag(r, "tail_call") != flag(r, "unwound")), "{level1:?}");
    for level in ["unwinds::level2", "unwinds::level3"] {
        assert_returns(&t, level, 100, 100);
    }
    assert_returns(&t, "unwinds::leaf", 100, 0);
    t.check_nesting();
}

#[test]
fn programs_that_do_not_unwind_keep_return_address_probes() {
    let dir = temp_dir();
    let calls = fixture("calls");
    let (run, t) = record(dir.path(), &["-f", "fib", "--", calls.to_str().unwrap(), "run", "5"]);
    assert_eq!(run.code(), 5, "{run:?}");
    assert!(!run.stderr.contains("returns probed where they happen"), "{run:?}");
    assert_eq!(t.returns("fib").len(), 177);
    assert!(t.returns("fib").iter().all(|r| r.get("unwound").is_none() && r.get("tail_call").is_none()));
    // Forced to probe exits, the same program gives the same calls, returns and values.
    let (run, forced) =
        record(dir.path(), &["--returns", "exits", "-f", "fib", "--", calls.to_str().unwrap(), "run", "5"]);
    assert_eq!(run.code(), 5, "{run:?}");
    assert!(run.stderr.contains("returns probed where they happen"), "{run:?}");
    let values = |t: &Trace| {
        let mut v: Vec<u64> = t.returns("fib").iter().map(|r| r["retval"].as_u64().unwrap()).collect();
        v.sort();
        v
    };
    assert_eq!(values(&forced), values(&t));
    assert_returns(&forced, "fib", 177, 0);
    forced.check_nesting();
}
