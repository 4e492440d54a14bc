//! A real OpenTelemetry collector for the OTLP tests: `rotel-agent` (from PyPI, installed by
//! `cargo xtask setup`, named by `ROTEL_AGENT`) receives what `tracer` sends and prints every span
//! and log record (`--debug-log traces --debug-log logs --debug-log-verbosity detailed`);
//! [`parse`] and [`parse_logs`] read that print-out.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// A running rotel-agent, stopped (by its pid) when dropped.
pub struct Rotel {
    child: Child,
    out: PathBuf,
    pub url: String,
}

fn free_port(ip: IpAddr) -> u16 {
    TcpListener::bind((ip, 0)).unwrap().local_addr().unwrap().port()
}

impl Rotel {
    /// Listening on loopback.
    pub fn start(dir: &Path) -> Rotel {
        Rotel::start_on(dir, IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// Listening on `ip` (the bridge address of a test network, for agents in its namespaces).
    pub fn start_on(dir: &Path, ip: IpAddr) -> Rotel {
        let agent = std::env::var_os("ROTEL_AGENT").expect(
            "ROTEL_AGENT is not set: run the integration tests with `cargo xtask test` (after `cargo xtask setup`)",
        );
        let (http, grpc) = (free_port(ip), free_port(ip));
        let out = dir.join("rotel.out");
        let child = Command::new(agent)
            .args(["start", "--exporter", "blackhole", "--debug-log", "traces", "--debug-log", "logs"])
            .args(["--debug-log-verbosity", "detailed"])
            .args(["--otlp-http-endpoint", &format!("{ip}:{http}")])
            .args(["--otlp-grpc-endpoint", &format!("{ip}:{grpc}")])
            .arg("--pid-file")
            .arg(dir.join("rotel.pid"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start rotel-agent");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect((ip, http)).is_err() {
            assert!(Instant::now() < deadline, "rotel-agent did not listen on {http}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Rotel { child, out, url: format!("http://{ip}:{http}") }
    }

    /// The spans rotel printed, once it has printed `count` (it batches for a moment).
    pub fn spans(&self, count: usize) -> Vec<Span> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let spans = parse(&std::fs::read_to_string(&self.out).unwrap());
            if spans.len() >= count || Instant::now() > deadline {
                return spans;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The log records rotel printed, once it has printed `count`.
    pub fn logs(&self, count: usize) -> Vec<LogRecord> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let logs = parse_logs(&std::fs::read_to_string(&self.out).unwrap());
            if logs.len() >= count || Instant::now() > deadline {
                return logs;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Rotel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A span as rotel prints it.
#[derive(Debug, Default, Clone)]
pub struct Span {
    pub resource: BTreeMap<String, String>,
    pub trace_id: String,
    pub parent_id: String,
    pub id: String,
    pub name: String,
    pub kind: String,
    pub attributes: BTreeMap<String, String>,
    /// (trace id, span id) of each link.
    pub links: Vec<(String, String)>,
    pub events: Vec<SpanEvent>,
}

/// A span event as rotel prints it: its name, and its attributes as `-> key: Value` lines.
#[derive(Debug, Default, Clone)]
pub struct SpanEvent {
    pub name: String,
    pub attributes: BTreeMap<String, String>,
}

/// Reads rotel's detailed debug log: `Resource attributes:` then `-> key: Value` lines, and per
/// span `Span #N`, `Trace ID : ..`, `Parent ID : ..`, `ID : ..`, `Name : ..`, `Kind : ..`,
/// `Attributes:`, `Events:` with `SpanEvent #N` blocks (`-> Name: ..`, `-> Timestamp: ..`,
/// `-> Attributes::` then `-> key: Value`) and `Links:` with `SpanLink #N` blocks.
pub fn parse(text: &str) -> Vec<Span> {
    #[derive(PartialEq)]
    enum In {
        Resource,
        Span,
        Event,
        Link,
        Other,
    }
    let mut spans: Vec<Span> = Vec::new();
    let mut resource = BTreeMap::new();
    let mut at = In::Other;
    for line in text.lines() {
        let t = line.trim();
        if t == "Resource attributes:" {
            resource = BTreeMap::new();
            at = In::Resource;
        } else if t.starts_with("ScopeSpans") || t.starts_with("ResourceSpans") || t.starts_with("LogRecord #") {
            at = In::Other;
        } else if t.starts_with("Span #") {
            spans.push(Span { resource: resource.clone(), ..Default::default() });
            at = In::Span;
        } else if t.starts_with("SpanEvent #") {
            spans.last_mut().unwrap().events.push(Default::default());
            at = In::Event;
        } else if t.starts_with("SpanLink #") {
            spans.last_mut().unwrap().links.push(Default::default());
            at = In::Link;
        } else if let Some(kv) = t.strip_prefix("-> ") {
            let (k, v) = kv.split_once(": ").unwrap_or((kv, ""));
            match at {
                In::Resource => {
                    resource.insert(k.to_string(), v.to_string());
                }
                In::Span => {
                    spans.last_mut().unwrap().attributes.insert(k.to_string(), v.to_string());
                }
                In::Event => {
                    let event = spans.last_mut().unwrap().events.last_mut().unwrap();
                    match k {
                        "Name" => event.name = v.to_string(),
                        "Timestamp" | "DroppedAttributesCount" | "Attributes::" => {}
                        _ => {
                            event.attributes.insert(k.to_string(), v.to_string());
                        }
                    }
                }
                In::Link => {
                    let link = spans.last_mut().unwrap().links.last_mut().unwrap();
                    match k {
                        "Trace ID" => link.0 = v.to_string(),
                        "ID" => link.1 = v.to_string(),
                        _ => {}
                    }
                }
                In::Other => {}
            }
        } else if at == In::Span
            && let Some((k, v)) = t.split_once(':')
        {
            let span = spans.last_mut().unwrap();
            let v = v.trim().to_string();
            match k.trim() {
                "Trace ID" => span.trace_id = v,
                "Parent ID" => span.parent_id = v,
                "ID" => span.id = v,
                "Name" => span.name = v,
                "Kind" => span.kind = v,
                _ => {}
            }
        }
    }
    spans
}

/// A log record as rotel prints it: its `Key: value` lines (`Body`, `SeverityText`,
/// `SeverityNumber`, `Trace ID`, `Span ID`, ...), its attributes, and its resource's.
#[derive(Debug, Default, Clone)]
pub struct LogRecord {
    pub resource: BTreeMap<String, String>,
    pub scope: String,
    pub fields: BTreeMap<String, String>,
    pub attributes: BTreeMap<String, String>,
}

/// Reads rotel's detailed debug log for log records: `Resource attributes:`, `InstrumentationScope
/// NAME`, then per record `LogRecord #N`, its `Key: value` lines and `Attributes:` `-> key: Value`.
pub fn parse_logs(text: &str) -> Vec<LogRecord> {
    let mut logs: Vec<LogRecord> = Vec::new();
    let (mut resource, mut scope) = (BTreeMap::new(), String::new());
    let (mut in_resource, mut in_record) = (false, false);
    for line in text.lines() {
        let t = line.trim();
        if t == "Resource attributes:" {
            (resource, in_resource, in_record) = (BTreeMap::new(), true, false);
        } else if t.starts_with("Span #") || t.starts_with("ResourceSpans") || t.starts_with("ResourceLog") {
            (in_resource, in_record) = (false, false);
        } else if let Some(name) = t.strip_prefix("InstrumentationScope ") {
            scope = name.split(' ').next().unwrap_or_default().to_string();
            (in_resource, in_record) = (false, false);
        } else if t.starts_with("LogRecord #") {
            logs.push(LogRecord { resource: resource.clone(), scope: scope.clone(), ..Default::default() });
            (in_resource, in_record) = (false, true);
        } else if let Some(kv) = t.strip_prefix("-> ") {
            let (k, v) = kv.split_once(": ").unwrap_or((kv, ""));
            if in_resource {
                resource.insert(k.to_string(), v.to_string());
            } else if in_record {
                logs.last_mut().unwrap().attributes.insert(k.to_string(), v.to_string());
            }
        } else if in_record && let Some((k, v)) = t.split_once(':') {
            logs.last_mut().unwrap().fields.insert(k.trim().to_string(), v.trim().to_string());
        }
    }
    logs
}

/// The number in `tracer: N WHAT sent to ...` (`spans`, `log records`).
pub fn sent(stderr: &str, what: &str) -> usize {
    stderr
        .lines()
        .find_map(|l| l.split_once(&format!(" {what} sent to "))?.0.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no '{what} sent' line: {stderr}"))
}

/// The number in `tracer: N spans sent to ...`.
pub fn spans_sent(stderr: &str) -> usize {
    sent(stderr, "spans")
}
