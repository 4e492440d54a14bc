//! Calls at source level through `tracer record`: the real kernel programs read each probed
//! function's parameters (strings from the target's memory, bounded by `--string-size`) and its
//! return value, and every call carries its function's file and line, on the stage-1 fixtures
//! whose values are known (`tests/fixtures/*/params.*`).

use serde_json::{Value, json};
use tracer_tests::{fixture, record, temp_dir};

fn unreadable(why: &str) -> Value {
    json!({ "unreadable": why })
}

/// Pointers differ from run to run: `"0x…"` becomes `"<pointer>"`.
fn without_pointers(v: &Value) -> Value {
    match v {
        Value::String(s) if s.starts_with("0x") && u64::from_str_radix(&s[2..], 16).is_ok() => json!("<pointer>"),
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), without_pointers(v))).collect()),
        other => other.clone(),
    }
}

struct Traced {
    trace: tracer_tests::Trace,
}

impl Traced {
    fn run(program: &str, functions: &[&str], extra: &[&str]) -> Traced {
        let dir = temp_dir();
        let path = fixture(program);
        let mut args: Vec<String> = Vec::new();
        for f in functions {
            args.extend(["-f".to_string(), f.to_string()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        args.push("--".into());
        args.push(path.display().to_string());
        let (run, trace) = record(dir.path(), &args);
        assert_eq!(run.code(), 0, "{run:?}");
        assert_eq!(trace.lost(), 0);
        Traced { trace }
    }

    fn check(&self, function: &str, params: Value, ret: Option<Value>) {
        let calls = self.trace.calls(function);
        assert_eq!(calls.len(), 1, "{function} is called once");
        // A function without parameters has no `params` (left out when empty).
        let got = calls[0].get("params").cloned().unwrap_or(json!({}));
        assert_eq!(without_pointers(&got), params, "{function} parameters");
        let returns = self.trace.returns(function);
        assert_eq!(returns.len(), 1, "{function} returns once");
        assert_eq!(returns[0].get("ret").cloned(), ret, "{function} return value");
        // `args` and `retval` stay.
        assert_eq!(calls[0]["args"].as_array().map(Vec::len), Some(6));
        assert!(returns[0]["retval"].is_u64());
    }

    fn place(&self, function: &str) -> (String, u64) {
        let call = self.trace.calls(function)[0];
        (
            call["file"].as_str().unwrap_or_else(|| panic!("{function} has no file: {call}")).to_string(),
            call["line"].as_u64().unwrap(),
        )
    }
}

const C_FUNCTIONS: &[&str] = &["ints", "text", "greet", "floats", "eight", "nothing"];

fn check_c(program: &str) {
    let t = Traced::run(program, C_FUNCTIONS, &[]);
    let float = unreadable("in a floating-point register");
    let stack_spilled = unreadable("on the stack: no integer register was left");
    t.check(
        "ints",
        json!({"c": -5, "s": -300, "i": -70000, "l": -5_000_000_000i64, "uc": 200, "us": 60000}),
        Some(json!(-42)),
    );
    t.check(
        "text",
        json!({"c": "A", "name": "alice", "buf": "bob", "bytes": "<pointer>", "col": "BLUE", "lv": "HIGH", "p": stack_spilled}),
        Some(json!(true)),
    );
    t.check("greet", json!({"who": "carol"}), Some(json!("hello")));
    t.check(
        "floats",
        json!({"d": float, "f": float, "after": 7, "ld": unreadable("passed in memory, on the stack"), "last": 8}),
        Some(float.clone()),
    );
    t.check(
        "eight",
        json!({"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "g": stack_spilled, "h": stack_spilled}),
        Some(json!(9)),
    );
    t.check("nothing", json!({}), None);
    let (file, line) = t.place("greet");
    assert!(file.ends_with("tests/fixtures/c/params.c"), "{file}");
    assert_eq!(line, 48);
    // A function with no parameters has none in its line (the field is left out when empty).
    assert!(t.trace.calls("nothing")[0].get("params").is_none());
}

#[test]
fn c_calls_carry_params_ret_file_and_line() {
    check_c("params");
}

#[test]
fn c_calls_at_o2_carry_params_ret_file_and_line() {
    check_c("params_o2");
}

#[test]
fn stripped_c_binary_reads_its_debug_file_through_debuglink() {
    check_c("params_stripped");
}

#[test]
fn strings_are_cut_at_string_size_and_marked() {
    let t = Traced::run("params", &["text", "greet"], &["--string-size", "3"]);
    let calls = t.trace.calls("text");
    let params = &calls[0]["params"];
    assert_eq!(params["name"], json!({"string": "ali", "truncated": true}));
    // Exactly three bytes: complete.
    assert_eq!(params["buf"], json!("bob"));
    let greet = t.trace.returns("greet");
    assert_eq!(greet[0]["ret"], json!({"string": "hel", "truncated": true}));
    let rust = Traced::run("rust_params", &["params::greet"], &["--string-size", "2"]);
    assert_eq!(
        rust.trace.calls("params::greet")[0]["params"]["name"],
        json!({"string": "al", "truncated": true, "length": 5})
    );
}

#[test]
fn cpp_calls_carry_params() {
    let add = "shop::Counter::add(char const*, int, shop::Size)";
    let t = Traced::run("params_cpp", &[add], &[]);
    // `what` points into .rodata that may not be paged in yet when the probe fires (a uprobe
    // program cannot fault pages in): then it is marked with its address, never dropped.
    let call = t.trace.calls(add)[0];
    let what = &call["params"]["what"];
    let faulted =
        what["unreadable"].as_str().is_some_and(|w| w.starts_with("memory at 0x") && w.ends_with("could not be read"));
    assert!(what == "apples" || faulted, "{what}");
    let mut params = without_pointers(&call["params"]);
    params["what"] = json!("apples");
    assert_eq!(params, json!({"this": "<pointer>", "what": "apples", "n": 4, "size": "Large"}));
    assert_eq!(t.trace.returns(add)[0]["ret"], json!(14));
    assert!(t.place(add).0.ends_with("tests/fixtures/cpp/params.cpp"));
}

#[test]
fn rust_calls_carry_str_params_and_ret() {
    let t = Traced::run("rust_params", &["params::greet", "params::hello", "params::scaled"], &[]);
    t.check("params::greet", json!({"name": "alice", "times": 3}), Some(json!(15)));
    t.check("params::hello", json!({"name": "bob"}), Some(json!("hello, bob")));
    t.check(
        "params::scaled",
        json!({"x": unreadable("in a floating-point register"), "n": 9}),
        Some(unreadable("in a floating-point register")),
    );
    assert!(t.place("params::greet").0.ends_with("tests/fixtures/rust/params.rs"));
}

/// Where people look: `tracer calls` prints a call as its source reads, and Chrome slices carry
/// the parameters by name and the typed return value.
#[test]
fn calls_and_chrome_show_calls_at_source_level() {
    let dir = temp_dir();
    let program = fixture("params").display().to_string();
    let (run, _) = record(dir.path(), &["-f", "text", "-f", "greet", "--", &program]);
    assert_eq!(run.code(), 0, "{run:?}");
    let trace = dir.path().join("trace.jsonl").display().to_string();
    let calls = tracer_tests::tracer(&["calls", &trace]);
    assert_eq!(calls.code(), 0, "{calls:?}");
    let greet: Vec<&str> = calls.stdout.lines().filter(|l| l.contains("greet(")).collect();
    assert_eq!(greet.len(), 1, "{}", calls.stdout);
    assert!(greet[0].ends_with(r#"greet(who="carol") = "hello""#), "{}", greet[0]);
    let chrome = dir.path().join("t.json").display().to_string();
    let export = tracer_tests::tracer(&["export", &trace, "-o", &chrome]);
    assert_eq!(export.code(), 0, "{export:?}");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&chrome).unwrap()).unwrap();
    let slice = |name: &str| -> Value {
        let found: Vec<&Value> =
            json["traceEvents"].as_array().unwrap().iter().filter(|e| e["name"] == name && e["ph"] == "X").collect();
        assert_eq!(found.len(), 1, "one {name} slice");
        found[0].clone()
    };
    let text = slice("text");
    assert_eq!(text["args"]["params"]["name"], json!("alice"));
    assert_eq!(text["args"]["params"]["col"], json!("BLUE"));
    assert_eq!(text["args"]["ret"], json!(true));
    assert_eq!(slice("greet")["args"]["ret"], json!("hello"));
    // Where the function is: the file and line its call carries.
    let (file, line) = {
        let t = tracer_tests::Trace::load(std::path::Path::new(&trace));
        let call = t.calls("greet")[0].clone();
        (call["file"].as_str().unwrap().to_string(), call["line"].as_u64().unwrap())
    };
    assert!(file.ends_with("tests/fixtures/c/params.c"), "{file}");
    assert_eq!(slice("greet")["args"]["file"], json!(file));
    assert_eq!(slice("greet")["args"]["line"], json!(line));

    // Perfetto: each parameter, the file and the line as debug annotations of the slice's begin.
    use tracer_tests::perfetto::{debug_annotation, trace_packet, track_event};
    let pftrace = dir.path().join("t.pftrace");
    let export = tracer_tests::tracer(&["export".as_ref(), trace.as_ref(), "-o".as_ref(), pftrace.as_os_str()]);
    assert_eq!(export.code(), 0, "{export:?}");
    let packets = tracer_tests::perfetto::read(&pftrace);
    let begins: Vec<_> = packets
        .iter()
        .filter_map(|p| match &p.data {
            Some(trace_packet::Data::TrackEvent(e))
                if e.name_field == Some(track_event::NameField::Name("greet".into())) =>
            {
                Some(e)
            }
            _ => None,
        })
        .collect();
    assert_eq!(begins.len(), 1, "one greet slice begins");
    let annotation = |name: &str| {
        let found: Vec<_> = begins[0]
            .debug_annotations
            .iter()
            .filter(|a| a.name_field == Some(debug_annotation::NameField::Name(name.into())))
            .collect();
        assert_eq!(found.len(), 1, "one {name} annotation: {:?}", begins[0].debug_annotations);
        found[0].value.clone()
    };
    assert_eq!(annotation("who"), Some(debug_annotation::Value::StringValue("carol".into())));
    assert_eq!(annotation("file"), Some(debug_annotation::Value::StringValue(file)));
    assert_eq!(annotation("line"), Some(debug_annotation::Value::UintValue(line)));
}

/// `-f 'FILE_GLOB:NAME'` probes the functions defined in the matching source files (DWARF's
/// decl_file, matched on a suffix after a `/`), and only them; a glob that matches no file is one
/// error naming the files there are.
#[test]
fn functions_are_chosen_by_source_file() {
    let calls_of = |t: &tracer_tests::Trace| -> std::collections::BTreeMap<String, usize> {
        let mut counts = std::collections::BTreeMap::new();
        for e in t.of_kind("call") {
            *counts.entry(e["function"].as_str().unwrap().to_string()).or_default() += 1;
        }
        counts
    };
    let t = Traced::run("twofiles", &["twofiles/net.c:*"], &[]);
    let expected = [("net_close", 1), ("net_recv", 2), ("net_send", 3)];
    assert_eq!(calls_of(&t.trace), expected.iter().map(|&(f, n)| (f.to_string(), n)).collect());
    let (file, line) = t.place("net_send");
    assert!(file.ends_with("tests/fixtures/c/twofiles/net.c"), "{file}");
    assert_eq!(line, 9);

    // A name glob after the file, and a directory glob: `*` within one directory.
    let t = Traced::run("twofiles", &["c/*/main.c:app_*", "net.c:net_r*"], &[]);
    let expected = [("app_run", 1), ("app_step", 4), ("net_recv", 2)];
    assert_eq!(calls_of(&t.trace), expected.iter().map(|&(f, n)| (f.to_string(), n)).collect());

    let dir = temp_dir();
    let out = dir.path().join("t.jsonl");
    let run = tracer_tests::tracer(&[
        "record".as_ref(),
        "-f".as_ref(),
        "nope/*.c:*".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
        "--".as_ref(),
        fixture("twofiles").as_os_str(),
    ]);
    run.assert_error("no function of ");
    assert!(run.stderr.contains("is defined in a source file matching 'nope/*.c'"), "{}", run.stderr);
    for file in ["tests/fixtures/c/twofiles/main.c", "tests/fixtures/c/twofiles/net.c"] {
        assert!(run.stderr.contains(file), "the files there are listed: {}", run.stderr);
    }
}
