//! Go programs traced without harm: no uretprobe in Go code (its runtime walks and copies
//! goroutine stacks), returns from probes on `ret` instructions, calls paired per goroutine.
//! The fixture is built with the Go toolchain `cargo xtask setup` installs (tests/fixtures/go).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;
use tracer_tests::{Trace, args, fixture, record, temp_dir, u64_field};
use tracer_user::functions::symbols::{NamesFrom, SymbolTable};

/// The fixture's `deep` mode: goroutine `g`'s `i`-th `work(g, i)` recurses this deep.
fn depth(g: u64, i: u64) -> u64 {
    200 + (g * 7 + i) % 51
}

/// Checks per goroutine that calls and returns nest exactly, each return ending the innermost open
/// call of its goroutine (whatever thread it ran on) with the function's name and a duration equal
/// to the time since that call, and that only the functions in `open_at_end` (which never return:
/// `main.main` calls `os.Exit`) are still open at the end. Returns, per goroutine, its calls in
/// order and the deepest nesting.
fn check_goroutine_nesting<'a>(t: &'a Trace, open_at_end: &[&str]) -> BTreeMap<u64, (Vec<&'a Value>, usize)> {
    let mut stacks: HashMap<u64, Vec<(&str, u64)>> = HashMap::new();
    let mut out: BTreeMap<u64, (Vec<&Value>, usize)> = BTreeMap::new();
    for e in &t.events {
        let kind = e["kind"].as_str().unwrap();
        if kind != "call" && kind != "return" {
            continue;
        }
        let goid = u64_field(e, "goid");
        assert_ne!(goid, 0, "a Go function's call runs on a goroutine: {e}");
        let ts = u64_field(e, "ts");
        let f = e["function"].as_str().unwrap();
        let stack = stacks.entry(goid).or_default();
        let entry = out.entry(goid).or_default();
        if kind == "call" {
            stack.push((f, ts));
            entry.0.push(e);
            entry.1 = entry.1.max(stack.len());
        } else {
            let (top, call_ts) =
                stack.pop().unwrap_or_else(|| panic!("return without a call on goroutine {goid}: {e}"));
            assert_eq!(top, f, "return does not end the innermost call of its goroutine: {e}");
            assert_eq!(u64_field(e, "duration_ns"), ts - call_ts, "duration of {e}");
        }
    }
    let open: Vec<&str> = stacks.values().flatten().map(|(f, _)| *f).collect();
    assert_eq!(open, open_at_end, "calls that did not return");
    out
}

#[test]
fn go_deep_recursion_with_stack_growth_runs_to_completion_with_every_return() {
    let dir = temp_dir();
    let gofixture = fixture("gofixture");
    let (run, t) = record(
        dir.path(),
        &[
            "-e",
            "call,return,spawn,exit",
            "-f",
            "main.work",
            "-f",
            "main.deep",
            "--",
            gofixture.to_str().unwrap(),
            "deep",
            "3",
        ],
    );
    // The program was not harmed: it computed what it computes untraced, and exited as it does.
    assert_eq!(run.code(), 3, "{run:?}");
    let expected_sum: u64 = (0..8).flat_map(|g| (0..200).map(move |i| depth(g, i))).sum();
    assert!(run.stdout.contains(&format!("deep {expected_sum}")), "{run:?}");
    assert_eq!(t.end["command_exit_code"], 3);
    assert_eq!(t.lost(), 0, "{}", t.end);
    assert_eq!(t.end["calls_without_return_probe"], 0);
    assert!(!run.stderr.contains("unexpected return pc"), "{run:?}");

    // Exact counts: 1600 work() calls, each recursing depth + 1 levels into deep(), every one
    // with its return (no 64-deep limit).
    let deep_calls: u64 = (0..8).flat_map(|g| (0..200).map(move |i| depth(g, i) + 1)).sum();
    assert_eq!(t.calls("main.work").len(), 1600);
    assert_eq!(t.returns("main.work").len(), 1600);
    assert_eq!(t.calls("main.deep").len() as u64, deep_calls);
    assert_eq!(t.returns("main.deep").len() as u64, deep_calls);

    // Per goroutine: 8 goroutines, each with its 200 work(g, i) in order, nesting exactly.
    let per_goroutine = check_goroutine_nesting(&t, &[]);
    let workers: Vec<(&u64, &(Vec<&Value>, usize))> =
        per_goroutine.iter().filter(|(_, (calls, _))| calls.iter().any(|c| c["function"] == "main.work")).collect();
    assert_eq!(workers.len(), 8, "eight goroutines call work()");
    let mut seen_g = BTreeSet::new();
    for (goid, (calls, deepest)) in workers {
        let works: Vec<Vec<u64>> =
            calls.iter().filter(|c| c["function"] == "main.work").map(|c| args(c)[..2].to_vec()).collect();
        let g = works[0][0];
        assert!(seen_g.insert(g), "goroutine {goid}: work(g = {g}, ..) on one goroutine only");
        assert_eq!(works, (0..200).map(|i| vec![g, i]).collect::<Vec<_>>(), "goroutine {goid}");
        // work + deep(d) .. deep(0); the deepest is d = 250 when (7g + i) % 51 == 50.
        let max_depth = (0..200).map(|i| depth(g, i)).max().unwrap();
        assert_eq!(*deepest as u64, max_depth + 2, "goroutine {goid}");
    }
    // work(g, i) returns its recursion depth.
    let rets: BTreeSet<u64> = t.returns("main.work").iter().map(|r| u64_field(r, "retval")).collect();
    assert_eq!(rets, (200..=250).collect::<BTreeSet<u64>>());
}

#[test]
fn go_call_that_blocks_and_resumes_on_another_thread_stays_paired() {
    let dir = temp_dir();
    let (run, t) = record(dir.path(), &["-f", "main.blocker", "--", fixture("gofixture").to_str().unwrap(), "block"]);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.lost(), 0);
    // The fixture's own account, `blocker K TID0 TID1` for each call: the threads its entry and its
    // return ran on (it holds the goroutine to its thread at both, so those are the threads the
    // probes ran on), and it called blocker() until four calls had moved.
    let threads: Vec<(u64, u64)> = run
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("blocker "))
        .map(|l| {
            let w: Vec<u64> = l.split_whitespace().map(|w| w.parse().unwrap()).collect();
            (w[1], w[2])
        })
        .collect();
    assert!(run.stdout.contains("moved 4"), "{run:?}");
    assert_eq!(threads.iter().filter(|(a, b)| a != b).count(), 4, "{run:?}");
    let calls = t.calls("main.blocker");
    let returns = t.returns("main.blocker");
    assert_eq!((calls.len(), returns.len()), (threads.len(), threads.len()), "{run:?}");
    for (k, ((c, r), (entry_tid, return_tid))) in calls.iter().zip(&returns).zip(&threads).enumerate() {
        assert_eq!(c["goid"], r["goid"], "{c} / {r}");
        assert_eq!(u64_field(c, "tid"), *entry_tid, "the call is on the thread the fixture saw: {c}");
        assert_eq!(u64_field(r, "tid"), *return_tid, "the return is on the thread the fixture saw: {r}");
        assert_eq!(u64_field(r, "duration_ns"), u64_field(r, "ts") - u64_field(c, "ts"));
        // It blocked until main sent, 20 ms after starting it.
        assert!(u64_field(r, "duration_ns") > 10_000_000, "{r}");
        assert_eq!(u64_field(r, "retval"), 42 + k as u64);
    }
    check_goroutine_nesting(&t, &[]);

    // In the Chrome export each call is one slice, on its goroutine's track.
    let chrome = dir.path().join("trace.json");
    let run = tracer_tests::tracer(&[
        "export",
        dir.path().join("trace.jsonl").to_str().unwrap(),
        "-o",
        chrome.to_str().unwrap(),
    ]);
    assert_eq!(run.code(), 0, "{run:?}");
    let chrome: Value = serde_json::from_str(&std::fs::read_to_string(&chrome).unwrap()).unwrap();
    let slices: Vec<&Value> =
        chrome["traceEvents"].as_array().unwrap().iter().filter(|e| e["name"] == "main.blocker").collect();
    assert_eq!(slices.len(), threads.len());
    for (s, r) in slices.iter().zip(&returns) {
        let goid = u64_field(r, "goid");
        assert_eq!(s["args"]["goid"], goid);
        assert_eq!(u64_field(s, "tid"), (1 << 30) + goid, "{s}");
        assert_eq!(s["args"]["return_tid"], r["tid"]);
        let dur_ns = (s["dur"].as_f64().unwrap() * 1000.0).round() as u64;
        assert_eq!(dur_ns, u64_field(r, "duration_ns"));
    }
    let names: Vec<&Value> =
        chrome["traceEvents"].as_array().unwrap().iter().filter(|e| e["name"] == "thread_name").collect();
    assert!(names.iter().any(|n| n["args"]["name"].as_str().is_some_and(|s| s.starts_with("goroutine "))), "{names:?}");
}

#[test]
fn go_arguments_follow_the_register_abi_with_and_without_dwarf_and_symbols() {
    // Stripped (`-s -w`), as an executable and position-independent: the functions come from
    // `.gopclntab`, the goroutine id's offset from the Go version.
    for name in ["gofixture", "gofixture_nodwarf", "gofixture_stripped", "gofixture_stripped_pie"] {
        let dir = temp_dir();
        let (run, t) = record(
            dir.path(),
            &[
                "-f",
                "main.add3",
                "-f",
                "main.mix9",
                "-f",
                "main.(*counter).add",
                "--",
                fixture(name).to_str().unwrap(),
                "args",
                "7",
            ],
        );
        assert_eq!(run.code(), 7, "{name}: {run:?}");
        assert!(run.stdout.contains("args 6 285 15"), "{name}: {run:?}");
        assert!(!run.stderr.contains("stripped"), "{name}: no warning, every function is there: {run:?}");
        assert_eq!(t.start["probes"], 3, "{name}");
        let add3 = t.calls("main.add3");
        assert_eq!(add3.len(), 1);
        assert_eq!(args(add3[0]).len(), 9, "Go calls carry nine argument registers");
        assert_eq!(args(add3[0])[..3], [1, 2, 3]);
        assert_eq!(t.returns("main.add3")[0]["retval"], 6);
        let mix9 = t.calls("main.mix9");
        assert_eq!(args(mix9[0]), [1, 2, 3, 4, 5, 6, 7, 8, 9], "{name}: rax, rbx, rcx, rdi, rsi, r8-r11");
        assert_eq!(t.returns("main.mix9")[0]["retval"], 285);
        // A method with a pointer receiver, named as Go programmers write it: the receiver is the
        // first argument.
        let add = t.calls("main.(*counter).add");
        assert_eq!(add.len(), 1);
        assert_eq!(args(add[0])[1], 5);
        assert_eq!(t.returns("main.(*counter).add")[0]["retval"], 15);
        // All on the main goroutine, whose id the runtime gives as 1.
        assert!(t.of_kind("call").chain(t.of_kind("return")).all(|e| e["goid"] == 1), "{name}");
        check_goroutine_nesting(&t, &[]);
    }
}

#[test]
fn go_patterns_and_the_default_selection_are_the_program_own_code() {
    let dir = temp_dir();
    let gofixture = fixture("gofixture");
    let (run, t) = record(dir.path(), &["-f", "main.*", "--", gofixture.to_str().unwrap(), "args"]);
    assert_eq!(run.code(), 0, "{run:?}");
    let names: BTreeSet<&str> = t.of_kind("call").map(|c| c["function"].as_str().unwrap()).collect();
    assert!(
        names.is_superset(&BTreeSet::from(["main.main", "main.add3", "main.mix9", "main.(*counter).add"])),
        "{names:?}"
    );
    assert!(names.iter().all(|n| n.starts_with("main.")), "{names:?}");
    check_goroutine_nesting(&t, &["main.main"]);

    // Without -f: the program's own functions, not the runtime's or the standard library's.
    let (run, t) = record(dir.path(), &["--", gofixture.to_str().unwrap(), "args"]);
    assert_eq!(run.code(), 0, "{run:?}");
    let probed = t.start["probes"].as_u64().unwrap();
    let (_, with_f) = record(dir.path(), &["-f", "main.*", "--", gofixture.to_str().unwrap(), "args"]);
    assert_eq!(probed, with_f.start["probes"].as_u64().unwrap(), "the same functions as -f 'main.*'");
    assert_eq!(t.calls("main.main").len(), 1);
    assert!(t.of_kind("call").all(|c| c["function"].as_str().unwrap().starts_with("main.")));
}

#[test]
fn c_calls_keep_their_json_shape_beside_go() {
    // C calls carry six arguments and no goid, as before Go support.
    let dir = temp_dir();
    let (run, t) = record(dir.path(), &["-f", "mix6", "--", fixture("calls").to_str().unwrap(), "run", "0"]);
    assert_eq!(run.code(), 0, "{run:?}");
    let mix6 = t.calls("mix6");
    assert_eq!(args(mix6[0]), [1, 2, 3, 4, 5, 6]);
    assert!(mix6[0].get("goid").is_none(), "{}", mix6[0]);
    assert!(t.returns("mix6")[0].get("goid").is_none());
}

/// A Go function's symbol as `.gopclntab` names it (as Go's tracebacks do): without the `.abi0`
/// suffix of assembly functions, and with what lies between the first `[` and the last `]`
/// (type arguments, array lengths) written `...`, as Go's linker writes it there.
fn go_name(symbol: &str) -> String {
    let name = symbol.strip_suffix(".abi0").unwrap_or(symbol);
    match (name.find('['), name.rfind(']')) {
        (Some(i), Some(j)) if j > i => format!("{}[...]{}", &name[..i], &name[j + 1..]),
        _ => name.to_string(),
    }
}

/// The functions of a stripped Go file, read from `.gopclntab`, are those of the same program with
/// symbols: the same names, addresses, sizes and probe placements (entry after the stack check,
/// every `ret`).
#[test]
fn stripped_go_files_have_the_functions_and_placements_of_their_symbols() {
    for (stripped, with_symbols) in [("debian_gofmt", "gofmt_symbols"), ("gofixture_stripped", "gofixture_nodwarf")] {
        let stripped = SymbolTable::load(&fixture(stripped)).unwrap();
        let with_symbols = SymbolTable::load(&fixture(with_symbols)).unwrap();
        let label = stripped.path.display();
        assert_eq!(
            (stripped.names_from, with_symbols.names_from),
            (NamesFrom::GoPclntab, NamesFrom::Symtab),
            "{label}"
        );
        assert_eq!(stripped.go, with_symbols.go, "{label}: the same Go version and goroutine id offset");
        assert!(stripped.functions.len() > 1000, "{label}: {}", stripped.functions.len());
        assert_eq!(stripped.functions.len(), with_symbols.functions.len(), "{label}");
        for (s, w) in stripped.functions.iter().zip(&with_symbols.functions) {
            assert_eq!(s.name, go_name(&w.name), "{label}");
            assert_eq!(
                (s.address, s.size, s.file_offset, &s.placement),
                (w.address, w.size, w.file_offset, &w.placement),
                "{label}: {}",
                s.name
            );
        }
    }
}
