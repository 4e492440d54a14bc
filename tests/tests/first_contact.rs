//! What a newcomer meets first: the readers' default input, and pipes closed early (`| head`).
//! No kernel needed: traces are written here.

use std::{
    io::Read as _,
    path::Path,
    process::{Command, Stdio},
};

use tracer_tests::{temp_dir, tracer_bin};

/// A trace of `n` functions called once each, between the golden demo trace's first and last
/// lines: large enough that no reader's output fits in a pipe.
fn many_functions_trace(path: &Path, n: u64) {
    let golden =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/golden/demo.jsonl")).unwrap();
    let (start, end) = (golden.lines().next().unwrap(), golden.lines().last().unwrap());
    let start_ts: u64 = serde_json::from_str::<serde_json::Value>(start).unwrap()["ts"].as_u64().unwrap();
    let mut text = format!("{start}\n");
    for i in 0..n {
        let ts = start_ts + 1000 + i * 100;
        let common =
            format!(r#""host":"vm","pid":27352,"tid":27352,"function":"function_number_{i}","module":"/opt/x""#);
        text += &format!("{{\"kind\":\"call\",\"ts\":{ts},{common},\"args\":[{i}]}}\n");
        text += &format!("{{\"kind\":\"return\",\"ts\":{},{common},\"retval\":0,\"duration_ns\":50}}\n", ts + 50);
    }
    text += &format!("{end}\n");
    std::fs::write(path, text).unwrap();
}

/// Runs tracer in `dir`, reads the first 100 bytes of its output and closes the pipe: the exit
/// code and stderr.
fn head(dir: &Path, args: &[&str]) -> (i32, String) {
    let mut child = Command::new(tracer_bin())
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 100];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    (child.wait().unwrap().code().unwrap_or(-1), stderr)
}

/// `report`, `calls` and `export -o -` into a reader that stops after its first line end quietly
/// with 0, as `cat` would; `report` and `calls` read `trace.jsonl` when given no trace, as
/// perf and uftrace read their data file.
#[test]
fn readers_default_to_trace_jsonl_and_end_quietly_when_the_pipe_closes() {
    let dir = temp_dir();
    many_functions_trace(&dir.path().join("trace.jsonl"), 5000);
    for args in [
        &["report"][..],
        &["report", "--json"],
        &["calls"],
        &["export", "trace.jsonl", "-o", "-", "--format", "jsonl"],
        &["export", "trace.jsonl", "-o", "-", "--format", "chrome"],
    ] {
        assert_eq!(head(dir.path(), args), (0, String::new()), "tracer {args:?} | head -c 100");
    }
    let out = Command::new(tracer_bin()).args(["report", "--json"]).current_dir(dir.path()).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["functions"].as_array().unwrap().len(), 5000);
    // A file that is not there is named, once.
    let empty = temp_dir();
    let out = Command::new(tracer_bin()).arg("calls").current_dir(empty.path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.starts_with("tracer: error: cannot read trace.jsonl"), "{stderr}");
}

/// `tracer list` shows what `record -f` would probe, as its DWARF declares it: `greet` of the
/// params fixture with its typed parameter, return type, source line and probe path, in text and
/// JSON alike.
#[test]
fn list_shows_functions_with_their_parameters() {
    let params = tracer_tests::fixture("params");
    let out = Command::new(tracer_bin()).arg("list").arg("-f").arg("greet").arg(&params).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let line = stdout.lines().find(|l| l.trim_start().starts_with("greet(")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.contains("greet(who: name_t) -> const char *"), "{line}");
    assert!(line.contains("params.c:48"), "{line}");
    // One function asked for, one listed, and no USDT section without -u.
    assert!(stdout.contains("1 function(s)"), "{stdout}");
    assert!(!stdout.contains("USDT"), "{stdout}");

    let out = Command::new(tracer_bin())
        .args(["list", "--json", "--function", "greet", "--function", "text", "-b"])
        .arg(&params)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let listing: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let functions = listing["functions"].as_array().unwrap();
    assert_eq!(functions.len(), 2, "{listing}");
    let greet = functions.iter().find(|f| f["name"] == "greet").unwrap();
    assert_eq!(greet["params"], serde_json::json!([{"name": "who", "type": "name_t"}]));
    assert_eq!(greet["returns"], "const char *");
    assert_eq!(greet["line"], 48);
    assert!(greet["file"].as_str().unwrap().ends_with("params.c"), "{greet}");
    assert_eq!(greet["module"], std::fs::canonicalize(&params).unwrap().to_str().unwrap());
    assert!(["optimized", "emulated", "trap"].contains(&greet["probe"].as_str().unwrap()), "{greet}");
    let text = functions.iter().find(|f| f["name"] == "text").unwrap();
    let names: Vec<&str> = text["params"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["c", "name", "buf", "bytes", "col", "lv", "p"]);
    assert_eq!(text["params"][1]["type"], "const char *");

    // Without -f, what record probes by default: the fixture's functions, not its start-up code.
    let out = Command::new(tracer_bin()).args(["list", "--json"]).arg(&params).output().unwrap();
    let listing: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> =
        listing["functions"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"greet") && names.contains(&"main"), "{names:?}");
    assert!(!names.contains(&"_start"), "{names:?}");

    // A pattern that matches nothing is record's sentence, and a non-zero exit.
    let out = Command::new(tracer_bin()).args(["list", "-f", "no_such_function"]).arg(&params).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("tracer: error: function pattern 'no_such_function' matches nothing"), "{stderr}");
    let out = Command::new(tracer_bin()).arg("list").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing to list"), "{out:?}");
}

/// `tracer list -u` shows python3.11's USDT probes (the interpreter Debian ships is built with
/// them) with their argument counts and semaphores, as `readelf -n` lists them.
#[test]
fn list_shows_usdt_probes_with_arguments_and_semaphores() {
    let python = std::fs::canonicalize("/usr/bin/python3.11").expect("python3.11 is installed");
    // A command after `--` (not run), by its path: PATH may lead to a pyenv shim, a script.
    let out =
        Command::new(tracer_bin()).args(["list", "--json", "-u", "python:*", "--"]).arg(&python).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let listing: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listing["functions"], serde_json::json!([]), "-u alone lists no functions");
    let probes: Vec<(String, u64, bool)> = listing["usdt"]
        .as_array()
        .unwrap()
        .iter()
        .inspect(|p| assert_eq!(p["module"], python.to_str().unwrap()))
        .map(|p| (p["name"].as_str().unwrap().to_string(), p["args"].as_u64().unwrap(), p["semaphore"] == true))
        .collect();
    let expected = [
        ("audit", 2),
        ("function__entry", 3),
        ("function__return", 3),
        ("gc__done", 1),
        ("gc__start", 1),
        ("import__find__load__done", 2),
        ("import__find__load__start", 1),
        ("line", 3),
    ];
    let expected: Vec<(String, u64, bool)> = expected.iter().map(|&(n, a)| (n.to_string(), a, true)).collect();
    assert_eq!(probes, expected);
    let out = Command::new(tracer_bin()).args(["list", "-u", "python:gc__*"]).arg(&python).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.contains("python:gc__start (1 args, semaphore)"), "{stdout}");
    assert_eq!(stdout.lines().filter(|l| l.starts_with("  python:")).count(), 2, "{stdout}");
}
