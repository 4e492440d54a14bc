//! `tracer view`, `record --serve` and `collect --serve` in a real headless Chromium (Debian's
//! `chromium`: `--dump-dom` for a recorded trace, the page as its scripts left it; the DevTools
//! protocol for a live one, whose event stream never ends): the flame graph and the function
//! table of a recorded fixture, a live recording whose counts grow (in the page and in the event
//! stream read by a plain HTTP client), a live collection of two hosts, two hosts with the same
//! pid, sends and receives inline in the call tree, the token, TLS, and trace content that must
//! stay text.

use std::{
    ffi::OsStr,
    fs::File,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpStream,
    os::{fd::AsRawFd as _, unix::process::CommandExt as _},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{Value, json};

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
    let at = line.find("http://").or_else(|| line.find("https://"))?;
    Some(line[at..].split_whitespace().next()?.to_string())
}

/// A headless Chromium driven through the DevTools protocol over a pipe
/// (`--remote-debugging-pipe`: JSON messages ended by a NUL byte, commands on its fd 3, answers on
/// its fd 4), for a page whose event stream stays open (`--dump-dom` waits for the network to be
/// idle, which a live page never is).
struct Browser {
    child: Child,
    commands: File,
    answers: BufReader<File>,
    next_id: u64,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn open(url: &str) -> Browser {
        let profile = temp_dir();
        let (commands_in, commands) = std::io::pipe().unwrap();
        let (answers, answers_out) = std::io::pipe().unwrap();
        let (read_fd, write_fd) = (commands_in.as_raw_fd(), answers_out.as_raw_fd());
        let mut command = Command::new("chromium");
        command
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--remote-debugging-pipe"])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls (fcntl, dup2) between fork and exec.
        unsafe {
            command.pre_exec(move || {
                // Moved above 10 first: dup2 onto its own number would leave close-on-exec set.
                let (r, w) = (libc::fcntl(read_fd, libc::F_DUPFD, 10), libc::fcntl(write_fd, libc::F_DUPFD, 10));
                if r < 0 || w < 0 || libc::dup2(r, 3) < 0 || libc::dup2(w, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().expect("run chromium (`cargo xtask setup --test` installs it)");
        drop((commands_in, answers_out));
        let mut browser = Browser {
            child,
            commands: File::from(std::os::fd::OwnedFd::from(commands)),
            answers: BufReader::new(File::from(std::os::fd::OwnedFd::from(answers))),
            next_id: 0,
            session: String::new(),
            _profile: profile,
        };
        let target = browser.call(false, "Target.createTarget", json!({ "url": url }))["targetId"].clone();
        let attached = browser.call(false, "Target.attachToTarget", json!({ "targetId": target, "flatten": true }));
        browser.session = attached["sessionId"].as_str().unwrap().to_string();
        browser
    }

    /// Sends a command (to the page when `in_page`) and returns its answer's result.
    fn call(&mut self, in_page: bool, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let mut message = json!({ "id": self.next_id, "method": method, "params": params });
        if in_page {
            message["sessionId"] = self.session.clone().into();
        }
        let mut bytes = serde_json::to_vec(&message).unwrap();
        bytes.push(0);
        self.commands.write_all(&bytes).expect("write to chromium");
        loop {
            let mut answer = Vec::new();
            self.answers.read_until(0, &mut answer).expect("read from chromium");
            assert!(answer.pop() == Some(0), "chromium closed its pipe");
            let answer: Value = serde_json::from_slice(&answer).unwrap();
            if answer["id"] == self.next_id {
                assert!(answer.get("error").is_none(), "{method}: {answer}");
                return answer["result"].clone();
            }
        }
    }

    fn eval(&mut self, expression: &str) -> Value {
        let result = self.call(true, "Runtime.evaluate", json!({ "expression": expression, "returnByValue": true }));
        result["result"]["value"].clone()
    }

    /// The page's HTML once `ready` (a script's expression) is true; at most 30 s.
    fn html_when(&mut self, ready: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.eval(ready) != Value::Bool(true) {
            assert!(Instant::now() < deadline, "the page was never ready ({ready})");
            std::thread::sleep(Duration::from_millis(100));
        }
        self.eval("document.documentElement.outerHTML").as_str().unwrap().to_string()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The event stream (`/api/events`), read by a plain HTTP client holding `token`.
struct EventStream {
    reader: BufReader<TcpStream>,
}

impl EventStream {
    fn open(base: &str, token: &str) -> EventStream {
        let mut stream = TcpStream::connect(base.trim_start_matches("http://")).expect("connect to the viewer");
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(stream, "GET /api/events HTTP/1.1\r\nHost: x\r\nCookie: tracer_token={token}\r\n\r\n").unwrap();
        let mut reader = BufReader::new(stream);
        let mut head = String::new();
        while !head.ends_with("\r\n\r\n") {
            assert!(reader.read_line(&mut head).unwrap() > 0, "the stream closed in its head: {head}");
        }
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
        assert!(head.contains("\r\nContent-Type: text/event-stream"), "{head}");
        EventStream { reader }
    }

    /// The next message: its event's name and its data.
    fn next(&mut self) -> (String, Value) {
        let (mut event, mut data) = (String::new(), None);
        loop {
            let mut line = String::new();
            assert!(self.reader.read_line(&mut line).unwrap() > 0, "the event stream ended");
            let line = line.trim_end_matches('\n');
            if line.is_empty()
                && let Some(data) = data.take()
            {
                return (event, data);
            }
            if let Some(name) = line.strip_prefix("event: ") {
                event = name.to_string();
            } else if let Some(json) = line.strip_prefix("data: ") {
                data = Some(serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}")));
            }
        }
    }
}

/// Calls of `function` in a state.
fn calls_in(state: &Value, function: &str) -> u64 {
    state["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["function"] == function)
        .map(|f| f["calls"].as_u64().unwrap())
        .sum()
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
    // The address's fragment opens a tab (it survives the token's redirect), and only that one.
    let viewer = Viewer::start(&jsonl);
    let page = dom(&format!("{}#functions", viewer.url), 5000);
    assert!(page.contains(r#"<section id="functions" class="tab active">"#), "{page}");
    assert!(page.contains(r#"<section id="flame" class="tab">"#), "{page}");
    assert!(page.contains(r#"<button data-tab="functions" class="active">"#), "{page}");
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
        ("/api/events", String::new()),
        ("/api/events", format!("Cookie: tracer_token={wrong}\r\n")),
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
    // A recorded trace's event stream is its final state, once.
    let (event, state) = EventStream::open(&base, &token).next();
    assert_eq!(event, "end");
    assert_eq!(calls_in(&state, "rust_fixture::fib"), 465);
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
    // A message on a Unix socket of the same name, carrying the same kind of bytes.
    let channel = r#"{"type":"unix_stream","id":1,"to":2,"path":"<img src=x onerror=\"document.documentElement.setAttribute('data-pwned','channel')\">"}"#;
    let payload = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .encode(r#"<img src=x onerror="document.documentElement.setAttribute('data-pwned','payload')">"#)
    };
    let lines = [
        r#"{"kind":"trace_start","format_version":1,"host":"vm","tracer_version":"0.1.0","ts":1000000000,"clock":{"source":"test","offset_ns":0,"uncertainty_ns":0},"targets":[{"type":"binary","path":"/bin/x"}],"probes":2,"events":["call","return"],"follow_children":true}"#.to_string(),
        r#"{"kind":"call","ts":1000001000,"host":"vm","pid":7,"tid":7,"function":"main","module":"/bin/x","args":[0,0,0,0,0,0]}"#.to_string(),
        format!(r#"{{"kind":"call","ts":1000002000,"host":"vm","pid":7,"tid":7,"function":"{name}","module":"/bin/x","args":[0,0,0,0,0,0],"params":{{"who":"{value}"}}}}"#),
        format!(r#"{{"kind":"send","ts":1000003000,"host":"vm","pid":7,"tid":7,"channel":{channel},"fd":3,"bytes":80,"syscall":"write","flow_id":1,"syscall_ns":10,"seq":0,"digest":null,"payload":"{payload}"}}"#),
        format!(r#"{{"kind":"recv","ts":1000004000,"host":"vm","pid":7,"tid":7,"channel":{channel},"fd":4,"bytes":80,"syscall":"read","flow_id":1,"flow_ids":[1],"syscall_ns":10,"seq":0,"digest":null}}"#),
        format!(r#"{{"kind":"return","ts":1000005000,"host":"vm","pid":7,"tid":7,"function":"{name}","module":"/bin/x","retval":0,"duration_ns":3000}}"#),
        r#"{"kind":"return","ts":1000009000,"host":"vm","pid":7,"tid":7,"function":"main","module":"/bin/x","retval":0,"duration_ns":8000}"#.to_string(),
        r#"{"kind":"trace_end","ts":1000010000,"reason":"duration","events_written":6,"lost_events":{},"calls_without_return_probe":0,"command_exit_code":null,"ipc":{"sends":0,"recvs":0,"linked_recvs":0,"unlinked_recvs":0,"linked_signals":0}}"#.to_string(),
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
    // The message's channel and bytes, inline in the call, as text.
    assert!(calls.contains("      send 80 B on unix stream &lt;img src=x onerror="), "{calls}");
    assert!(calls.contains("'data-pwned','channel')\"&gt; (write) \"&lt;img src=x onerror="), "{calls}");
    assert!(calls.contains("'data-pwned','payload')"), "{calls}");
    assert!(calls.contains("      recv 80 B on unix stream &lt;img src=x onerror="), "{calls}");
    assert!(calls.contains("(read) from pid 7 thread 7"), "{calls}");
    // Never run: no element was made of it, and neither handler set its attribute.
    assert!(!page.contains("<img"), "{page}");
    assert!(!page.contains("data-pwned=\""), "{page}");
}

/// `tracer record --serve` of `calls loop` (tick() every 2 ms): the event stream, read by a
/// plain HTTP client, says more calls of tick in a message a second after the first; so does the
/// page in Chromium, fed by the same stream, whose status line shows the recording's figures.
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
    let (base, token) = (url.split("/?").next().unwrap(), url.split("token=").nth(1).unwrap());

    // The stream: a state message, then another a second later with more calls.
    let mut stream = EventStream::open(base, token);
    let (event, first) = stream.next();
    assert_eq!(event, "state");
    assert_eq!(first["live"], true, "{first}");
    let first_read = Instant::now();
    let second = loop {
        let (event, state) = stream.next();
        assert_eq!(event, "state");
        if first_read.elapsed() >= Duration::from_secs(1) {
            break state;
        }
    };
    assert!(second["written"].as_u64().unwrap() > 0, "{second}");
    let (first, second) = (calls_in(&first, "tick"), calls_in(&second, "tick"));
    assert!(second > first, "tick calls in the stream: {first}, then {second}");
    drop(stream);

    // The page: its table's count grows between two reads a second apart.
    let mut browser = Browser::open(&url);
    let ready = "document.getElementById('status').textContent.includes('events/s') && \
                 document.querySelector('#function-table td[data-col=\"function\"]') !== null";
    let ticks = |page: &str| -> u64 {
        let row = table_row(page, "tick").unwrap_or_else(|| panic!("no tick row in {page}"));
        cell(&row, "calls").parse().unwrap()
    };
    let first_page = browser.html_when(ready);
    let first = ticks(&first_page);
    assert!(first_page.contains("recording · "), "{first_page}");
    assert!(first_page.contains("written "), "{first_page}");
    std::thread::sleep(Duration::from_secs(1));
    let second = ticks(&browser.html_when(ready));
    assert!(first > 0 && second > first, "tick calls in the page: {first}, then {second}");
    drop(browser);

    // A stream open when the recording ends gets the final state as its `end` message before
    // tracer exits: as many tick calls as the trace file has returns of tick.
    let mut stream = EventStream::open(base, token);
    assert_eq!(stream.next().0, "state");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let end = loop {
        match stream.next() {
            (event, state) if event == "end" => break state,
            (event, _) => assert_eq!(event, "state"),
        }
    };
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    let run = wait_with_timeout(child, "tracer");
    assert!(run.code() == 0 || run.code() == 130, "{run:?} {rest}");
    assert_eq!(end["live"], false, "{end}");
    assert!(end["end"].is_object(), "{end}");
    let returns = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["kind"] == "return" && e["function"] == "tick")
        .count() as u64;
    assert!(returns > 0);
    assert_eq!(calls_in(&end, "tick"), returns, "the end message against {}", out.display());
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
    let page = Browser::open(&url)
        .html_when("document.querySelectorAll('#host-function-table td[data-col=\"function\"]').length >= 2");
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

/// The ipc fixture's `pipe` mode inside `pipe_mode()`: the child write()s 4 x 256 bytes, the
/// parent read()s 300, 300, 300, 124. The call tree of the parent's thread shows its four
/// receives inline under pipe_mode, each naming the child as the sender; the child's thread
/// shows its four sends. In Chromium too (the first thread is the parent's).
#[test]
fn sends_and_receives_are_inline_in_the_call_tree() {
    let dir = temp_dir();
    let ipc = fixture("ipc");
    let (run, t) = record(dir.path(), &["-f", "pipe_mode", "--", ipc.to_str().unwrap(), "pipe"]);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.lost(), 0);
    let parent = t.start["targets"][0]["pid"].as_u64().unwrap();
    let child = t.of_kind("spawn").find(|s| s["how"] == "fork").map(|s| s["child_pid"].as_u64().unwrap()).unwrap();
    let host = t.start["host"].as_str().unwrap().to_string();
    let viewer = Viewer::start(&dir.path().join("trace.jsonl"));
    let cookie = format!("Cookie: tracer_token={}\r\n", viewer.token());
    let lines = |tid: u64| -> Vec<String> {
        let (head, body) = get(viewer.base(), &format!("/api/calls?host={host}&tid={tid}"), &cookie);
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
        let page: Value = serde_json::from_str(&body).unwrap();
        page["lines"].as_array().unwrap().iter().map(|l| l.as_str().unwrap().to_string()).collect()
    };
    let at_parent = lines(parent);
    let call = at_parent.iter().position(|l| l.ends_with("  pipe_mode")).unwrap_or_else(|| panic!("{at_parent:#?}"));
    let recvs: Vec<&String> = at_parent.iter().filter(|l| l.contains(" recv ")).collect();
    assert_eq!(recvs.len(), 4, "{at_parent:#?}");
    let sender = format!("(read) from ipc ({child}) thread {child}");
    for (line, bytes) in recvs.iter().zip([300, 300, 300, 124]) {
        assert!(line.contains(&format!("    recv {bytes} B on pipe ")), "{line}");
        assert!(line.ends_with(&sender), "{line}");
    }
    assert!(at_parent.iter().position(|l| l.contains(" recv ")).unwrap() > call, "{at_parent:#?}");
    let at_child = lines(child);
    let sends: Vec<&String> = at_child.iter().filter(|l| l.contains(" send ")).collect();
    assert_eq!(sends.len(), 4, "{at_child:#?}");
    assert!(sends.iter().all(|l| l.contains("send 256 B on pipe ") && l.ends_with(" (write)")), "{at_child:#?}");
    // The page's call tree of the first thread: the parent's, with its four receives.
    let page = dom(&viewer.url, 5000);
    let tree = page.split("id=\"call-lines\">").nth(1).expect("the call tree").split("</pre>").next().unwrap();
    assert_eq!(tree.matches(" recv ").count(), 4, "{tree}");
    assert_eq!(tree.matches(&sender as &str).count(), 4, "{tree}");
    // The messages table: one row per send a receive read from. The four 256-byte writes are read
    // as 300, 300, 300 and 124 bytes, so the first three reads each take from two writes: 7 links,
    // each named as the call tree names them, on the pipe.
    let count = page.split("id=\"message-count\">").nth(1).unwrap().split('<').next().unwrap();
    assert_eq!(count, "7 send → receive links", "{page}");
    let table = page.split("id=\"message-table\">").nth(1).unwrap().split("</table>").next().unwrap();
    let rows: Vec<&str> = table.split("<tr>").skip(2).collect();
    assert_eq!(rows.len(), 7, "{table}");
    for row in rows {
        assert!(row.contains(&format!(">ipc ({child}) thread {child}</td>")), "{row}");
        assert!(row.contains(&format!(">ipc ({parent}) thread {parent}</td>")), "{row}");
        assert!(row.contains(">pipe "), "{row}");
    }
}

/// A merged trace of two hosts whose processes have the same pid (7): two processes, two flame
/// graphs named `web (7) on a` and `db (7) on b`, two rows, two threads, each call tree its own.
#[test]
fn two_hosts_with_the_same_pid_are_kept_apart() {
    let dir = temp_dir();
    let trace = dir.path().join("two.jsonl");
    tracer_tests::write_two_host_trace(&trace);
    let viewer = Viewer::start(&trace);
    let state = state(viewer.base(), viewer.token());
    let list = |key: &str, fields: &[&str]| -> Vec<String> {
        let mut rows: Vec<String> = state[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| fields.iter().map(|f| v[*f].to_string()).collect::<Vec<_>>().join(" "))
            .collect();
        rows.sort();
        rows
    };
    assert_eq!(list("functions", &["host", "pid", "function", "calls"]), [r#""a" 7 "serve" 1"#, r#""b" 7 "query" 2"#]);
    assert_eq!(list("flame", &["host", "pid", "name", "value"]), [r#""a" 7 "web (7)" 4000"#, r#""b" 7 "db (7)" 7500"#]);
    assert_eq!(list("processes", &["host", "pid", "name", "exit_code"]), [r#""a" 7 "web" 0"#, r#""b" 7 "db" 3"#]);
    assert_eq!(list("threads", &["host", "tid"]), [r#""a" 7"#, r#""b" 7"#]);
    // Each host's thread 7 has its own call tree.
    let cookie = format!("Cookie: tracer_token={}\r\n", viewer.token());
    for (host, only, not) in [("a", "serve", "query"), ("b", "query", "serve")] {
        let (_, body) = get(viewer.base(), &format!("/api/calls?host={host}&tid=7"), &cookie);
        assert!(body.contains(only) && !body.contains(not), "{host}: {body}");
    }
    // The page names each root with its host.
    let page = dom(&viewer.url, 5000);
    for (host, title) in [("a", "web (7) on a · "), ("b", "db (7) on b · ")] {
        let section = page.split(&format!("data-host=\"{host}\"><h3>")).nth(1).unwrap_or_else(|| panic!("{page}"));
        assert!(section.starts_with(title), "{section}");
    }
}

/// `--serve` on an address other than loopback with `--tls-cert/--tls-key` (a self-signed
/// certificate, as the cluster tests make): a rustls client that trusts it gets the page's state
/// with the token and 403 without; a plain HTTP request gets no page.
#[test]
fn serving_beyond_loopback_over_tls() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let dir = temp_dir();
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.key_pair.serialize_pem()).unwrap();
    let out = dir.path().join("trace.jsonl");
    let calls = fixture("calls");
    let args: Vec<&OsStr> = vec![
        "record".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
        "--serve".as_ref(),
        "0.0.0.0:0".as_ref(),
        "--tls-cert".as_ref(),
        cert_path.as_os_str(),
        "--tls-key".as_ref(),
        key_path.as_os_str(),
        "-f".as_ref(),
        "tick".as_ref(),
        "--".as_ref(),
        calls.as_os_str(),
        "loop".as_ref(),
    ];
    let (child, mut stderr, startup) = start_tracing(&args);
    let url = startup.lines().find_map(url_in).unwrap_or_else(|| panic!("no address in {startup}"));
    assert!(url.starts_with("https://0.0.0.0:"), "{url}");
    let port: u16 = url.trim_start_matches("https://0.0.0.0:").split('/').next().unwrap().parse().unwrap();
    let token = url.split("token=").nth(1).unwrap().to_string();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let get_tls = |path: &str, headers: &str| -> String {
        runtime.block_on(async {
            let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            let connector = tracer_user::cluster::tls::connector(&cert_path).unwrap();
            let mut tls =
                tracer_user::cluster::tls::connect(Some(&connector), "127.0.0.1", Box::new(tcp)).await.unwrap();
            tls.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n").as_bytes()).await.unwrap();
            let mut answer = Vec::new();
            let _ = tls.read_to_end(&mut answer).await;
            String::from_utf8_lossy(&answer).into_owned()
        })
    };
    let answer = get_tls("/api/state", &format!("Cookie: tracer_token={token}\r\n"));
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    assert!(answer.contains("\"live\":true"), "{answer}");
    let answer = get_tls(&format!("/?token={token}"), "");
    assert!(answer.starts_with("HTTP/1.1 303 "), "{answer}");
    assert!(answer.contains("; HttpOnly; SameSite=Strict; Secure\r\n"), "{answer}");
    for (path, headers) in [
        ("/api/state", String::new()),
        ("/api/events", String::new()),
        ("/api/state", "Cookie: tracer_token=00\r\n".to_string()),
    ] {
        let answer = get_tls(path, &headers);
        assert!(answer.starts_with("HTTP/1.1 403 "), "{path} {headers}: {answer}");
    }
    // Plain HTTP to the TLS port: the handshake fails, no page is sent.
    let mut plain = TcpStream::connect(("127.0.0.1", port)).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = write!(plain, "GET /api/state?token={token} HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(!answer.contains("HTTP/1.1") && !answer.contains("live"), "{answer}");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    let run = wait_with_timeout(child, "tracer");
    assert!(run.code() == 0 || run.code() == 130, "{run:?} {rest}");
}
