//! `tracer view`, `record --serve` and `collect --serve` in a real headless Chromium (Debian's
//! `chromium`, `--dump-dom`: the page as its scripts left it): the flame graph and the function
//! table of a recorded fixture, a live recording whose counts grow, a live collection of two
//! hosts, the token, and trace content that must stay text.

use std::{
    ffi::OsStr,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpStream,
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use tracer_tests::{
    LocalAgent, fixture, gen_secret, record, start_tracing, temp_dir, tracer, tracer_bin, wait_with_timeout,
};

/// `tracer view --no-open TRACE`, running; killed when dropped.
struct Viewer {
    child: Child,
    url: String,
}

impl Viewer {
    fn start(trace: &Path) -> Viewer {
        let mut child = Command::new(tracer_bin())
            .args(["view".as_ref(), "--no-open".as_ref(), trace.as_os_str()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tracer view");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        stderr.read_line(&mut line).expect("read tracer view's stderr");
        let url = url_in(&line).unwrap_or_else(|| panic!("no address in {line:?}"));
        Viewer { child, url }
    }

    /// `http://127.0.0.1:PORT`
    fn base(&self) -> &str {
        self.url.split("/?").next().unwrap()
    }

    fn token(&self) -> &str {
        self.url.split("token=").nth(1).unwrap()
    }
}

impl Drop for Viewer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn url_in(line: &str) -> Option<String> {
    let at = line.find("http://")?;
    Some(line[at..].split_whitespace().next()?.to_string())
}

/// The page at `url` once its scripts ran for `budget_ms` of virtual time.
fn dom(url: &str, budget_ms: u32) -> String {
    let profile = temp_dir();
    let out = Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--dump-dom"])
        .arg(format!("--virtual-time-budget={budget_ms}"))
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(url)
        .output()
        .expect("run chromium (`cargo xtask setup --test` installs it)");
    assert!(out.status.success(), "chromium: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The function table's row of `function` in a dumped page (its cells, `data-col` to text).
fn table_row(dom: &str, function: &str) -> Option<Vec<(String, String)>> {
    row_in(dom, "function-table", function)
}

/// The row of `function` in the table with id `table`.
fn row_in(dom: &str, table: &str, function: &str) -> Option<Vec<(String, String)>> {
    let table = dom.split(&format!("id=\"{table}\"")).nth(1)?;
    let row = table.split("<tr>").find(|row| row.contains(&format!("data-col=\"function\">{function}</td>")))?;
    Some(
        row.split("data-col=\"")
            .skip(1)
            .map(|cell| {
                let (column, rest) = cell.split_once('"').unwrap();
                let text = rest.split_once('>').unwrap().1.split_once("</td>").unwrap().0;
                (column.to_string(), text.to_string())
            })
            .collect(),
    )
}

fn cell<'a>(row: &'a [(String, String)], column: &str) -> &'a str {
    &row.iter().find(|(c, _)| c == column).unwrap_or_else(|| panic!("no {column} in {row:?}")).1
}

/// The state the page is drawn from, as the browser holding `token` gets it.
fn state(base: &str, token: &str) -> serde_json::Value {
    let (head, body) = get(base, "/api/state", &format!("Cookie: tracer_token={token}\r\n"));
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// A raw HTTP GET (no browser): the status line and headers, and the body.
fn get(base: &str, path: &str, headers: &str) -> (String, String) {
    let mut stream = TcpStream::connect(base.trim_start_matches("http://")).expect("connect to the viewer");
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read the viewer's answer");
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (head.to_string(), body.to_string())
}

/// fixture_a (tests/src/bin/rust_fixture.rs) calls fib(12): 465 calls under main.
#[test]
fn fixture_a_shows_fib_under_main_with_465_calls_from_json_lines_and_native() {
    let dir = temp_dir();
    let (run, t) = record(dir.path(), &["-f", "rust_fixture::*", "--", env!("CARGO_BIN_EXE_rust_fixture")]);
    assert_eq!(run.code(), 4, "{run:?}");
    assert_eq!(t.lost(), 0);
    let jsonl = dir.path().join("trace.jsonl");
    let native = dir.path().join("trace.trc");
    let export = tracer(&["export".as_ref(), jsonl.as_os_str(), "-o".as_ref(), native.as_os_str()]);
    assert_eq!(export.code(), 0, "{export:?}");
    for trace in [&jsonl, &native] {
        let viewer = Viewer::start(trace);
        let page = dom(&viewer.url, 5000);
        // The flame graph: fib's frame right under main's, and the process's root above main.
        assert!(
            page.contains(r#"data-parent="rust_fixture::main" data-name="rust_fixture::fib""#),
            "{}: no fib under main in {page}",
            trace.display()
        );
        assert!(page.contains(r#"data-name="rust_fixture::main""#), "{page}");
        let row = table_row(&page, "rust_fixture::fib").unwrap_or_else(|| panic!("no fib row in {page}"));
        assert_eq!(cell(&row, "calls"), "465", "{row:?}");
        assert_eq!(cell(&row, "unfinished"), "0", "{row:?}");
        assert!(cell(&row, "process").starts_with("rust_fixture ("), "{row:?}");
        // The call tree of the first thread is shown, fib's calls indented under main's.
        let calls = page.split("id=\"call-lines\">").nth(1).expect("the call tree");
        assert!(calls.contains("rust_fixture::main"), "{calls}");
        assert!(calls.contains("  rust_fixture::fib"), "{calls}");
    }
}

#[test]
fn requests_without_the_token_are_refused() {
    let dir = temp_dir();
    let (run, _) = record(dir.path(), &["-f", "rust_fixture::fib", "--", env!("CARGO_BIN_EXE_rust_fixture")]);
    assert_eq!(run.code(), 4, "{run:?}");
    let viewer = Viewer::start(&dir.path().join("trace.jsonl"));
    let base = viewer.base().to_string();
    let token = viewer.token().to_string();
    let wrong: String = token.chars().rev().collect();
    for (path, headers) in [
        ("/", String::new()),
        ("/api/state", String::new()),
        ("/app.js", String::new()),
        ("/api/calls?tid=1", String::new()),
        (&format!("/?token={wrong}") as &str, String::new()),
        ("/api/state", format!("Cookie: tracer_token={wrong}\r\n")),
        ("/api/state", format!("Cookie: tracer_token={}\r\n", &token[..32])),
    ] {
        let (head, body) = get(&base, path, &headers);
        assert!(head.starts_with("HTTP/1.1 403 "), "{path} {headers}: {head}");
        assert!(!body.contains("fib"), "{body}");
    }
    // The token in the query sets the cookie and sends the browser on to the page without it.
    let (head, _) = get(&base, &format!("/?token={token}"), "");
    assert!(head.starts_with("HTTP/1.1 303 "), "{head}");
    assert!(head.contains("\r\nLocation: /\r\n"), "{head}");
    assert!(
        head.contains(&format!("\r\nSet-Cookie: tracer_token={token}; Path=/; HttpOnly; SameSite=Strict")),
        "{head}"
    );
    let (head, body) = get(&base, "/api/state", &format!("Cookie: a=b; tracer_token={token}\r\n"));
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert!(body.contains("\"function\":\"rust_fixture::fib\""), "{body}");
    // A request head past the bound is refused before anything else.
    let (head, _) = get(&base, "/", &format!("X-Filler: {}\r\n", "a".repeat(20_000)));
    assert!(head.starts_with("HTTP/1.1 431 "), "{head}");
}

/// A function named `<img src=x onerror=...>`, with a string parameter of the same kind, in a
/// trace written by hand: the page shows both as text, and neither script runs.
#[test]
fn hostile_names_and_strings_are_shown_as_text_and_never_run() {
    let dir = temp_dir();
    let trace = dir.path().join("hostile.jsonl");
    let name = r#"<img src=x onerror=\"document.documentElement.setAttribute('data-pwned','name')\">"#;
    let value = r#"<img src=x onerror=\"document.documentElement.setAttribute('data-pwned','param')\">"#;
    let lines = [
        r#"{"kind":"trace_start","format_version":1,"host":"vm","tracer_version":"0.1.0","ts":1000000000,"clock":{"source":"test","offset_ns":0,"uncertainty_ns":0},"targets":[{"type":"binary","path":"/bin/x"}],"probes":2,"events":["call","return"],"follow_children":true}"#.to_string(),
        r#"{"kind":"call","ts":1000001000,"host":"vm","pid":7,"tid":7,"function":"main","module":"/bin/x","args":[0,0,0,0,0,0]}"#.to_string(),
        format!(r#"{{"kind":"call","ts":1000002000,"host":"vm","pid":7,"tid":7,"function":"{name}","module":"/bin/x","args":[0,0,0,0,0,0],"params":{{"who":"{value}"}}}}"#),
        format!(r#"{{"kind":"return","ts":1000005000,"host":"vm","pid":7,"tid":7,"function":"{name}","module":"/bin/x","retval":0,"duration_ns":3000}}"#),
        r#"{"kind":"return","ts":1000009000,"host":"vm","pid":7,"tid":7,"function":"main","module":"/bin/x","retval":0,"duration_ns":8000}"#.to_string(),
        r#"{"kind":"trace_end","ts":1000010000,"reason":"duration","events_written":4,"lost_events":{},"calls_without_return_probe":0,"command_exit_code":null,"ipc":{"sends":0,"recvs":0,"linked_recvs":0,"unlinked_recvs":0,"linked_signals":0}}"#.to_string(),
    ];
    std::fs::write(&trace, lines.join("\n") + "\n").unwrap();
    let viewer = Viewer::start(&trace);
    let page = dom(&viewer.url, 5000);
    // Shown: as a frame, a table row and in the call tree, escaped.
    let text = "&lt;img src=x onerror=\"document.documentElement.setAttribute('data-pwned','name')\"&gt;";
    assert!(page.contains(&format!("data-col=\"function\">{text}</td>")), "{page}");
    assert!(page.contains(&format!("{text}</div>")), "{page}");
    let calls = page.split("id=\"call-lines\">").nth(1).expect("the call tree");
    assert!(calls.contains(&format!("    {text}(who=\"&lt;img src=x onerror=")), "{calls}");
    assert!(calls.contains("'data-pwned','param')"), "{calls}");
    // Never run: no element was made of it, and neither handler set its attribute.
    assert!(!page.contains("<img"), "{page}");
    assert!(!page.contains("data-pwned=\""), "{page}");
}

/// `tracer record --serve` of `calls loop` (tick() every 2 ms): two reads of the page a second
/// apart show more calls the second time; the status line shows the recording's figures.
#[test]
fn a_live_recording_s_counts_grow_between_two_reads() {
    let dir = temp_dir();
    let out = dir.path().join("trace.jsonl");
    let calls = fixture("calls");
    let args: Vec<&OsStr> = vec![
        "record".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
        "--serve".as_ref(),
        "-f".as_ref(),
        "tick".as_ref(),
        "--".as_ref(),
        calls.as_os_str(),
        "loop".as_ref(),
    ];
    let (child, mut stderr, startup) = start_tracing(&args);
    let url = startup.lines().find_map(url_in).unwrap_or_else(|| panic!("no address in {startup}"));
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let ticks = |page: &str| -> u64 {
        let row = table_row(page, "tick").unwrap_or_else(|| panic!("no tick row in {page}"));
        cell(&row, "calls").parse().unwrap()
    };
    std::thread::sleep(Duration::from_millis(500));
    let first_page = dom(&url, 1500);
    let first = ticks(&first_page);
    assert!(first_page.contains("recording · "), "{first_page}");
    assert!(first_page.contains(" events/s"), "{first_page}");
    assert!(first_page.contains("written "), "{first_page}");
    std::thread::sleep(Duration::from_secs(1));
    let second = ticks(&dom(&url, 1500));
    assert!(first > 0 && second > first, "tick calls: {first}, then {second}");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    let run = wait_with_timeout(child, "tracer");
    assert!(run.code() == 0 || run.code() == 130, "{run:?} {rest}");
}

/// Another address than loopback is refused without TLS, before anything is traced.
#[test]
fn serving_beyond_loopback_needs_tls() {
    let dir = temp_dir();
    let marker = dir.path().join("ran");
    let out = dir.path().join("trace.jsonl");
    let calls = fixture("calls");
    let run = tracer(&[
        "record".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
        "--serve".as_ref(),
        "0.0.0.0:0".as_ref(),
        "-f".as_ref(),
        "tick".as_ref(),
        "--".as_ref(),
        calls.as_os_str(),
        "marker".as_ref(),
        marker.as_os_str(),
    ]);
    run.assert_error("0.0.0.0:0 is not a loopback address: serving it needs --tls-cert and --tls-key");
    assert!(!marker.exists(), "the command ran");
}

/// `tracer collect --serve` with two agents on loopback (TCP, a shared secret), each launching
/// the `calls` fixture in its `fib N` mode (fib(N), then it waits): host a fib(10), 177 calls of
/// fib, host b fib(5), 15 calls. The live page shows both hosts' calls with exact counts: a host
/// column, each process named with its host, and the table per host.
#[test]
fn collect_serves_the_page_live_from_every_host() {
    let dir = temp_dir();
    let secret = gen_secret(dir.path(), "s");
    let secret = secret.to_str().unwrap();
    let agent_args = ["--listen", "127.0.0.1:0", "--secret-file", secret, "--allow-commands"];
    let a = LocalAgent::start(dir.path(), "a", &agent_args);
    let b = LocalAgent::start(dir.path(), "b", &agent_args);
    let calls = fixture("calls");
    let calls = calls.to_str().unwrap();
    let out = dir.path().join("merged.jsonl");
    let (a_spec, b_spec) = (a.spec("a"), b.spec("b"));
    let (a_command, b_command) = (format!("a:{calls} fib 10"), format!("b:{calls} fib 5"));
    let args = [
        "collect",
        "--serve",
        "--agent",
        &a_spec,
        "--agent",
        &b_spec,
        "--secret-file",
        secret,
        "-f",
        "fib",
        "-c",
        &a_command,
        "-c",
        &b_command,
        "-o",
        out.to_str().unwrap(),
    ];
    let (child, mut stderr, startup) = start_tracing(&args);
    let url = startup.lines().find_map(url_in).unwrap_or_else(|| panic!("no address in {startup}"));
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let (base, token) = (url.split("/?").next().unwrap(), url.split("token=").nth(1).unwrap());
    // Both commands' calls are in once the per-host table has them all.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let state = state(base, token);
        let rows: Vec<(String, String, u64)> = state["host_functions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["host"].as_str().unwrap().into(),
                    f["function"].as_str().unwrap().into(),
                    f["calls"].as_u64().unwrap(),
                )
            })
            .collect();
        if rows == [("a".into(), "fib".into(), 177), ("b".into(), "fib".into(), 15)] {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not both hosts' calls: {state}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let page = dom(&url, 2000);
    let rows = |table: &str| -> Vec<(String, String, String)> {
        let table = page.split(&format!("id=\"{table}\"")).nth(1).unwrap().split("</table>").next().unwrap();
        table
            .split("<tr>")
            .filter(|row| row.contains("data-col=\"function\">fib</td>"))
            .map(|row| {
                let cell = |column: &str| {
                    let at = row.split(&format!("data-col=\"{column}\">")).nth(1).unwrap();
                    at.split("</td>").next().unwrap().to_string()
                };
                (
                    cell("host"),
                    cell("calls"),
                    if table.contains("data-col=\"process\"") { cell("process") } else { String::new() },
                )
            })
            .collect()
    };
    let mut by_process = rows("function-table");
    by_process.sort();
    assert_eq!(by_process.len(), 2, "{page}");
    assert_eq!((&by_process[0].0[..], &by_process[0].1[..]), ("a", "177"), "{by_process:?}");
    assert_eq!((&by_process[1].0[..], &by_process[1].1[..]), ("b", "15"), "{by_process:?}");
    assert!(by_process.iter().all(|r| r.2.starts_with("calls (")), "{by_process:?}");
    let mut by_host = rows("host-function-table");
    by_host.sort();
    assert_eq!(by_host, [("a".into(), "177".into(), String::new()), ("b".into(), "15".into(), String::new())]);
    // Each process's flame graph, named with its host.
    for host in ["a", "b"] {
        let section = page.split(&format!("data-host=\"{host}\"><h3>")).nth(1).unwrap_or_else(|| panic!("{page}"));
        let title = section.split("</h3>").next().unwrap();
        assert!(title.starts_with("calls (") && title.contains(&format!(") on {host} · ")), "{title}");
    }
    assert!(page.contains("recording · "), "{page}");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    let run = wait_with_timeout(child, "tracer collect");
    assert_eq!(run.code(), 130, "{run:?} {rest}");
    // The fixtures wait for SIGUSR1 (their trace is over: the agents leave them running).
    for n in ["10", "5"] {
        let cmdline = format!("{calls}\0fib\0{n}\0");
        if let Some(pid) = tracer_tests::find_process(|line| line == cmdline) {
            // SAFETY: kill(2) on a fixture this test started.
            unsafe { libc::kill(pid, libc::SIGUSR1) };
        }
    }
}
