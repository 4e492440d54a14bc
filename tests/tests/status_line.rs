//! The status line of `tracer record`: on a terminal (a pseudo-terminal made by util-linux's
//! `script`), a line on stderr redrawn about once a second and cleared at the end; without a
//! terminal, nothing.

use std::process::{Command, Stdio};

use tracer_tests::{Trace, temp_dir, tracer, tracer_bin, wait_with_timeout};

/// Starts every redraw and is left when the work ends.
const CLEAR: &str = "\r\x1b[K";

/// The numbers of every status line in `output`: (seconds, events/s, events written, lost).
fn status_lines(output: &str) -> Vec<[u64; 4]> {
    output
        .split(CLEAR)
        .filter_map(|part| {
            let rest = part.strip_prefix("tracer: ")?;
            let (seconds, rest) = rest.split_once(" s, ")?;
            let (rate, rest) = rest.split_once(" events/s, ")?;
            let (events, rest) = rest.split_once(" events written, ")?;
            let lost = rest.strip_suffix(" lost")?;
            Some([seconds.parse().ok()?, rate.parse().ok()?, events.parse().ok()?, lost.parse().ok()?])
        })
        .collect()
}

/// `tracer record` of a command that runs 2.5 s, spawning a child every 0.2 s: its exec and
/// the children's forks and exits are events while it runs.
fn record_args(out: &str) -> Vec<String> {
    let script = "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do /bin/true; sleep 0.2; done";
    ["record", "-e", "spawn,exit", "-o", out, "--", "/bin/sh", "-c", script].map(String::from).to_vec()
}

#[test]
fn status_line_is_drawn_on_a_terminal_and_cleared_at_the_end() {
    let dir = temp_dir();
    let out = dir.path().join("trace.jsonl");
    let mut line = tracer_bin().display().to_string();
    for arg in record_args(out.to_str().unwrap()) {
        line.push_str(&format!(" '{arg}'"));
    }
    // `script -qfec CMD /dev/null` runs CMD on a new pseudo-terminal and copies what it writes
    // there (stdout and stderr) to its own stdout.
    let child = Command::new("script")
        .args(["-qfec", &line, "/dev/null"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start script (util-linux)");
    let run = wait_with_timeout(child, "script");
    assert_eq!(run.code(), 0, "{run:?}");
    let terminal = run.stdout;
    let lines = status_lines(&terminal);
    assert!(lines.len() >= 2, "a status line about once a second for 2.5 s: {terminal:?}");
    assert!(lines.iter().all(|l| l[3] == 0), "nothing lost: {terminal:?}");
    assert!(lines.windows(2).all(|w| w[0][0] < w[1][0] && w[0][2] <= w[1][2]), "time and events grow: {terminal:?}");
    let last = lines.last().unwrap();
    assert!(last[2] > 0 && last[1] > 0, "the line counts the events written as they are: {terminal:?}");

    // Cleared at the end: the summary line starts where the last status line was erased, and no
    // status text follows it.
    let summary = terminal.find("events written to").expect("the summary line");
    let summary_start = terminal[..summary].rfind("tracer: ").unwrap();
    assert!(terminal[..summary_start].ends_with(CLEAR), "the last status line was cleared: {terminal:?}");
    assert!(!terminal[summary..].contains("events/s"), "{terminal:?}");

    let trace = Trace::load(&out);
    assert!(trace.end["events_written"].as_u64().unwrap() >= last[2], "{}", trace.end);
}

#[test]
fn no_status_line_without_a_terminal() {
    let dir = temp_dir();
    let out = dir.path().join("trace.jsonl");
    let run = tracer(&record_args(out.to_str().unwrap()));
    assert_eq!(run.code(), 0, "{run:?}");
    assert!(!run.stderr.contains("events/s") && !run.stderr.contains('\x1b') && !run.stderr.contains('\r'), "{run:?}");
    assert!(run.stderr.contains("events written to"), "{run:?}");
}

/// What `script` copies from a new pseudo-terminal on which `sh -c SHELL_LINE` runs (with `env`).
fn on_a_terminal(shell_line: &str, env: &[(&str, &str)]) -> String {
    let quoted = format!("/bin/sh -c '{}'", shell_line.replace('\'', r"'\''"));
    let child = Command::new("script")
        .args(["-qfec", &quoted, "/dev/null"])
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start script (util-linux)");
    wait_with_timeout(child, "script").stdout
}

/// A message that comes while the status line is drawn (here: a signal passed on to the
/// command) erases the line first instead of being appended to it.
#[test]
fn a_message_erases_the_status_line_first() {
    let dir = temp_dir();
    let out = dir.path().join("trace.jsonl");
    let tracer = tracer_bin().display().to_string();
    let terminal = on_a_terminal(
        &format!(
            "{tracer} record -e spawn,exit -o {} -- /bin/sleep 30 & pid=$!; sleep 2.5; kill -INT $pid; wait $pid",
            out.display()
        ),
        &[],
    );
    assert!(!status_lines(&terminal).is_empty(), "a status line was drawn: {terminal:?}");
    let message = terminal.find("tracer: SIGINT passed on to the command").unwrap_or_else(|| panic!("{terminal:?}"));
    assert!(terminal[..message].ends_with(CLEAR), "the status line was erased first: {terminal:?}");
}

/// On a terminal the labels of errors and warnings are coloured; `NO_COLOR` and a pipe leave the
/// colour out.
#[test]
fn errors_are_coloured_on_a_terminal_unless_no_color() {
    let line = format!("{} report /no/such/trace.jsonl", tracer_bin().display());
    let coloured = on_a_terminal(&line, &[]);
    assert!(
        coloured.starts_with("tracer: \x1b[1m\x1b[31merror: \x1b[0mcannot read /no/such/trace.jsonl"),
        "{coloured:?}"
    );
    let plain = on_a_terminal(&line, &[("NO_COLOR", "1")]);
    assert!(plain.starts_with("tracer: error: cannot read /no/such/trace.jsonl"), "{plain:?}");
    let piped = tracer(&["report", "/no/such/trace.jsonl"]);
    assert!(piped.stderr.starts_with("tracer: error: cannot read /no/such/trace.jsonl"), "{piped:?}");
}
