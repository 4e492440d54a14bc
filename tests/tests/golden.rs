//! Golden outputs: three fixed traces (recorded once from the demo, the `ipc signals` fixture, and
//! the program-event fixtures with calls, `log` and `usdt` events) go
//! through every exporter (the native `.trc` too, which must also read back as the same JSON lines),
//! `report` and `calls`, and each output must match the committed file byte for byte. A change that alters any output on purpose regenerates them with
//! `TRACER_UPDATE_GOLDEN=1 cargo xtask test --filter golden` and shows the difference in review.

use std::path::{Path, PathBuf};

use tracer_tests::{temp_dir, tracer};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/golden")
}

/// The outputs of one input: (file name in `expected/`, tracer arguments; `{in}` and `{out}` are
/// replaced by the input and the output path). Commands that print write to standard output.
const OUTPUTS: &[(&str, &[&str])] = &[
    ("trace.jsonl", &["export", "{in}", "-o", "{out}"]),
    ("trace.json", &["export", "{in}", "-o", "{out}"]),
    ("trace.pftrace", &["export", "{in}", "-o", "{out}"]),
    ("trace.flame.json", &["export", "{in}", "-o", "{out}"]),
    ("trace.folded", &["export", "{in}", "-o", "{out}"]),
    ("trace.svg", &["export", "{in}", "-o", "{out}"]),
    ("trace.speedscope.json", &["export", "{in}", "-o", "{out}"]),
    ("trace.pcapng", &["export", "{in}", "-o", "{out}"]),
    ("trace.trc", &["export", "{in}", "-o", "{out}"]),
    ("report.txt", &["report", "{in}"]),
    ("report-by-process.json", &["report", "{in}", "--by-process", "--json"]),
    ("calls.txt", &["calls", "{in}"]),
];

fn check(input: &str) {
    let dir = temp_dir();
    let source = golden_dir().join(format!("{input}.jsonl"));
    let expected_dir = golden_dir().join("expected").join(input);
    let update = std::env::var_os("TRACER_UPDATE_GOLDEN").is_some();
    let mut differ = Vec::new();
    for (name, args) in OUTPUTS {
        let out = dir.path().join(name);
        let args: Vec<String> = args
            .iter()
            .map(|a| a.replace("{in}", source.to_str().unwrap()).replace("{out}", out.to_str().unwrap()))
            .collect();
        let run = tracer(&args);
        assert_eq!(run.code(), 0, "tracer {args:?}: {run:?}");
        let produced =
            if args.iter().any(|a| a == "-o") { std::fs::read(&out).unwrap() } else { run.stdout.into_bytes() };
        let golden = expected_dir.join(name);
        if update {
            std::fs::create_dir_all(&expected_dir).unwrap();
            std::fs::write(&golden, &produced).unwrap();
            continue;
        }
        let expected = std::fs::read(&golden).unwrap_or_else(|e| panic!("read {}: {e}", golden.display()));
        if produced != expected {
            let kept = dir.path().join(format!("produced-{name}"));
            std::fs::write(&kept, &produced).unwrap();
            differ.push(format!("{name} ({} bytes, expected {})", produced.len(), expected.len()));
        }
    }
    // The native file read back holds every event as JSON lines say it.
    let (trc, back) = (dir.path().join("trace.trc"), dir.path().join("trace.trc.jsonl"));
    let run = tracer(&["export", trc.to_str().unwrap(), "-o", back.to_str().unwrap()]);
    assert_eq!(run.code(), 0, "export of the native file: {run:?}");
    if std::fs::read(&back).unwrap() != std::fs::read(dir.path().join("trace.jsonl")).unwrap() {
        differ.push("trace.trc read back (differs from trace.jsonl)".to_string());
    }
    if !differ.is_empty() {
        let kept = dir.keep();
        panic!(
            "{input}: outputs differ from {}: {}; what was produced is in {}",
            expected_dir.display(),
            differ.join(", "),
            kept.display()
        );
    }
}

#[test]
fn golden_demo_trace_through_every_exporter() {
    check("demo");
}

#[test]
fn golden_signals_trace_through_every_exporter() {
    check("signals");
}

#[test]
fn golden_program_events_trace_through_every_exporter() {
    // Recorded once: `events_c run` (log events from the C header) and `sdt_probes_o0 run 2`
    // (`fixture:*` USDT probes) with the functions they were made in.
    check("events");
}
