//! The mapping, checked on the requests a local HTTP listener receives, and the retry and queue
//! rules, against a listener that answers what each test scripts.

use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Read, Write},
    net::TcpListener,
    sync::{Arc, Mutex, atomic::Ordering, mpsc},
    thread,
    time::Duration,
};

use prost::Message as _;

use super::{
    proto::{
        collector::{logs::v1::ExportLogsServiceRequest, trace::v1::ExportTraceServiceRequest},
        common::v1::{KeyValue, any_value},
        logs::v1::{LogRecord, SeverityNumber},
        resource::v1::Resource,
        trace::v1::{Span, span},
    },
    *,
};
use crate::{
    event::{
        Channel, Event, EventData, Syscall, data,
        test_events::{call, end, ev, ret, start},
    },
    sink::Sink,
};

/// A collector stand-in: answers each request with the next status of `statuses` (then 200),
/// after `hold` lets it (when given), and keeps every request it got (status, path, body).
pub(crate) struct Listener {
    pub(crate) url: String,
    requests: Arc<Mutex<Vec<Received>>>,
}

/// A request the listener got: the status it answered, the path, the body.
type Received = (u16, String, Vec<u8>);

impl Listener {
    pub(crate) fn start(statuses: Vec<u16>, hold: Option<mpsc::Receiver<()>>) -> Listener {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        thread::spawn(move || {
            let mut statuses = statuses.into_iter();
            let mut hold = hold;
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut out = stream;
                loop {
                    let mut length = None;
                    let mut line = String::new();
                    let mut path = String::new();
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            break;
                        }
                        if path.is_empty() {
                            path = line.split(' ').nth(1).unwrap_or_default().to_string();
                            assert!(path == "/v1/traces" || path == "/v1/logs", "{line}");
                        }
                        if line == "\r\n" {
                            break;
                        }
                        let lower = line.to_ascii_lowercase();
                        if let Some(v) = lower.strip_prefix("content-length:") {
                            length = Some(v.trim().parse::<usize>().unwrap());
                        }
                    }
                    let Some(length) = length else { break };
                    let mut body = vec![0; length];
                    reader.read_exact(&mut body).unwrap();
                    if let Some(h) = hold.take() {
                        let _ = h.recv();
                    }
                    let status = statuses.next().unwrap_or(200);
                    seen.lock().unwrap().push((status, path, body));
                    let reply = format!("HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n");
                    if out.write_all(reply.as_bytes()).is_err() {
                        break;
                    }
                }
            }
        });
        Listener { url, requests }
    }

    /// The spans of the requests answered 200.
    pub(crate) fn spans(&self) -> Vec<(Resource, Span)> {
        let requests = self.requests.lock().unwrap();
        requests
            .iter()
            .filter(|(status, path, _)| *status == 200 && path == "/v1/traces")
            .map(|(_, _, body)| ExportTraceServiceRequest::decode(&body[..]).unwrap())
            .flat_map(|r| r.resource_spans)
            .flat_map(|rs| {
                let resource = rs.resource.unwrap();
                rs.scope_spans.into_iter().flat_map(move |s| {
                    let resource = resource.clone();
                    s.spans.into_iter().map(move |sp| (resource.clone(), sp))
                })
            })
            .collect()
    }

    /// The log records of the requests answered 200, with their resource and scope name.
    fn logs(&self) -> Vec<(Resource, String, LogRecord)> {
        let requests = self.requests.lock().unwrap();
        requests
            .iter()
            .filter(|(status, path, _)| *status == 200 && path == "/v1/logs")
            .map(|(_, _, body)| ExportLogsServiceRequest::decode(&body[..]).unwrap())
            .flat_map(|r| r.resource_logs)
            .flat_map(|rl| {
                let resource = rl.resource.unwrap();
                rl.scope_logs.into_iter().flat_map(move |s| {
                    let (resource, scope) = (resource.clone(), s.scope.unwrap().name);
                    s.log_records.into_iter().map(move |l| (resource.clone(), scope.clone(), l))
                })
            })
            .collect()
    }
}

fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        attempts: 3,
        first_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(4),
        timeout: Duration::from_secs(5),
    }
}

fn sink(url: &str, service_name: Option<&str>) -> OtlpSink {
    OtlpSink::new(OtlpConfig {
        url: url.to_string(),
        service_name: service_name.map(String::from),
        retry: fast_retry(),
        wait_when_full: false,
        ids: IdKey::random(),
        exporting: HashMap::new(),
    })
    .unwrap()
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn str_attr(attrs: &[KeyValue], key: &str) -> String {
    match attr(attrs, key) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        other => panic!("{key}: {other:?}"),
    }
}

fn int_attr(attrs: &[KeyValue], key: &str) -> i64 {
    match attr(attrs, key) {
        Some(any_value::Value::IntValue(v)) => *v,
        other => panic!("{key}: {other:?}"),
    }
}

fn pipe() -> Channel {
    Channel::Pipe { id: 9 }
}

#[test]
fn calls_become_nested_spans_in_one_trace_per_process_and_receives_link_to_sends() {
    let listener = Listener::start(vec![], None);
    let mut s = sink(&listener.url, None);
    s.begin(&start(100)).unwrap();
    for e in [
        call(100, 1, "main"),
        call(110, 1, "work"),
        ev(
            120,
            1,
            1,
            EventData::Send(data::Send {
                channel: pipe(),
                fd: 4,
                bytes: 5,
                syscall: Syscall::Write,
                flow_id: 77,
                syscall_ns: 3,
                seq: Some(0),
                digest: None,
                payload: None,
                payload_truncated: None,
            }),
        ),
        ret(130, 1, "work", Some(20)),
        ev(
            140,
            2,
            2,
            EventData::Recv(data::Recv {
                channel: pipe(),
                fd: 3,
                bytes: 5,
                syscall: Syscall::Read,
                flow_ids: vec![77],
                syscall_ns: 4,
                seq: Some(0),
                digest: None,
                payload: None,
                payload_truncated: None,
                peek: false,
                discarded: None,
            }),
        ),
        ev(
            145,
            1,
            1,
            EventData::Spawn(data::Spawn {
                parent_pid: 1,
                child_pid: 3,
                child_tid: 3,
                how: data::SpawnHow::Fork,
                comm: "app".into(),
                filename: None,
            }),
        ),
        ret(150, 1, "main", Some(50)),
        ev(
            160,
            1,
            1,
            EventData::Exit(data::Exit { exit_code: Some(0), signal: None, thread: false, comm: "app".into() }),
        ),
    ] {
        s.event(&e).unwrap();
    }
    s.end(&end(200)).unwrap();
    let spans = listener.spans();
    let by_name = |name: &str| -> Vec<&(Resource, Span)> { spans.iter().filter(|(_, s)| s.name == name).collect() };
    let names: std::collections::BTreeSet<&str> = spans.iter().map(|(_, s)| s.name.as_str()).collect();
    // pid 1: its process span, main, work, the send; pid 2: its process span and the receive;
    // pid 3 (forked, nothing else seen): its process span.
    assert_eq!(spans.len(), 7, "{names:?}");
    let (res, process) =
        by_name("process app").into_iter().find(|(r, _)| int_attr(&r.attributes, "process.pid") == 1).unwrap();
    assert_eq!(str_attr(&res.attributes, "service.name"), "app");
    assert_eq!(str_attr(&res.attributes, "host.name"), "h");
    assert_eq!(str_attr(&res.attributes, "process.executable.name"), "app");
    assert!(process.parent_span_id.is_empty());
    assert_eq!((process.start_time_unix_nano, process.end_time_unix_nano), (100, 160));
    let events: Vec<&str> = process.events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(events, ["fork 3", "exit 0"]);

    let main = by_name("main")[0].1.clone();
    let work = by_name("work")[0].1.clone();
    assert_eq!(main.parent_span_id, process.span_id);
    assert_eq!(work.parent_span_id, main.span_id);
    assert_eq!(main.trace_id, process.trace_id);
    assert_eq!(work.trace_id, process.trace_id);
    assert_eq!((work.start_time_unix_nano, work.end_time_unix_nano), (110, 130));
    assert_eq!(str_attr(&work.attributes, "code.function"), "work");
    assert_eq!(str_attr(&work.attributes, "tracer.module"), "/bin/app");
    assert_eq!(int_attr(&work.attributes, "tracer.retval"), 7);
    assert_eq!(int_attr(&work.attributes, "thread.id"), 1);
    let Some(any_value::Value::ArrayValue(args)) = attr(&work.attributes, "tracer.args") else { panic!() };
    let args: Vec<_> = args.values.iter().map(|v| v.value.clone().unwrap()).collect();
    assert_eq!(args[0], any_value::Value::IntValue(110));
    assert_eq!(args[5], any_value::Value::IntValue(-1), "u64::MAX keeps its bits");

    let send = by_name("send pipe")[0].1.clone();
    assert_eq!(send.parent_span_id, work.span_id, "the send happened inside work");
    assert_eq!(send.kind, span::SpanKind::Producer as i32);
    assert_eq!((send.start_time_unix_nano, send.end_time_unix_nano), (120, 123));
    let (recv_res, recv) = by_name("recv pipe")[0].clone();
    assert_eq!(int_attr(&recv_res.attributes, "process.pid"), 2);
    assert_eq!(str_attr(&recv_res.attributes, "process.executable.name"), "pid 2", "no comm known for pid 2");
    assert_eq!(recv.kind, span::SpanKind::Consumer as i32);
    assert_ne!(recv.trace_id, send.trace_id, "one trace per process");
    assert_eq!(recv.links.len(), 1);
    assert_eq!((&recv.links[0].trace_id, &recv.links[0].span_id), (&send.trace_id, &send.span_id));
    assert_eq!(s.counters().spans_sent.load(Ordering::Relaxed), 7);
}

/// A call at source level: its span carries where the function is defined, by the semantic
/// conventions' current names, and its parameters and return value by name; a call without
/// DWARF carries none of them.
#[test]
fn calls_at_source_level_carry_file_line_params_and_return() {
    let listener = Listener::start(vec![], None);
    let mut s = sink(&listener.url, None);
    s.begin(&start(100)).unwrap();
    let mut greet = call(110, 1, "greet");
    if let EventData::Call(c) = &mut greet.data {
        c.file = Some("/src/app/greet.c".into());
        c.line = Some(12);
        c.params = data::Params(vec![("who".into(), data::SourceValue(serde_json::json!("carol")))]);
    }
    let mut greet_ret = ret(130, 1, "greet", Some(20));
    if let EventData::Return(r) = &mut greet_ret.data {
        r.ret = Some(data::SourceValue(serde_json::json!("hello")));
    }
    for e in [call(100, 1, "main"), greet, greet_ret, ret(150, 1, "main", Some(50))] {
        s.event(&e).unwrap();
    }
    s.end(&end(200)).unwrap();
    let spans = listener.spans();
    let span = |name: &str| spans.iter().find(|(_, s)| s.name == name).unwrap().1.clone();
    let greet = span("greet");
    assert_eq!(str_attr(&greet.attributes, "code.file.path"), "/src/app/greet.c");
    assert_eq!(int_attr(&greet.attributes, "code.line.number"), 12);
    assert_eq!(str_attr(&greet.attributes, "code.param.who"), r#""carol""#);
    assert_eq!(str_attr(&greet.attributes, "code.return"), r#""hello""#);
    let main = span("main");
    for key in ["code.file.path", "code.line.number", "code.filepath", "code.lineno", "code.return"] {
        assert!(attr(&main.attributes, key).is_none(), "main has no {key}");
    }
}

#[test]
fn the_service_name_option_names_every_resource() {
    let listener = Listener::start(vec![], None);
    let mut s = sink(&listener.url, Some("checkout"));
    s.begin(&start(100)).unwrap();
    s.event(&call(100, 1, "main")).unwrap();
    s.end(&end(200)).unwrap();
    let spans = listener.spans();
    assert_eq!(spans.len(), 2, "main (ended by the end of tracing) and the process");
    for (res, _) in &spans {
        assert_eq!(str_attr(&res.attributes, "service.name"), "checkout");
        assert_eq!(str_attr(&res.attributes, "process.executable.name"), "app");
    }
    let main = spans.iter().find(|(_, s)| s.name == "main").unwrap();
    assert_eq!(str_attr(&main.1.attributes, "tracer.unfinished"), "tracing stopped");
}

#[test]
fn a_503_is_retried_and_the_batch_then_sent() {
    let listener = Listener::start(vec![503, 503], None);
    let mut s = sink(&listener.url, None);
    s.begin(&start(100)).unwrap();
    s.event(&call(100, 1, "main")).unwrap();
    s.event(&ret(150, 1, "main", Some(50))).unwrap();
    s.end(&end(200)).unwrap();
    let c = s.counters();
    assert_eq!(c.retries.load(Ordering::Relaxed), 2);
    assert_eq!(c.spans_sent.load(Ordering::Relaxed), 2);
    assert_eq!(c.spans_dropped_export_failed.load(Ordering::Relaxed), 0);
    let statuses: Vec<u16> = listener.requests.lock().unwrap().iter().map(|(s, _, _)| *s).collect();
    assert_eq!(statuses, [503, 503, 200]);
    assert_eq!(listener.spans().len(), 2);
}

#[test]
fn a_batch_failing_every_attempt_or_refused_is_counted_as_lost() {
    // Three attempts answered 503: given up.
    let listener = Listener::start(vec![503, 503, 503], None);
    let mut s = sink(&listener.url, None);
    s.begin(&start(100)).unwrap();
    s.event(&call(100, 1, "main")).unwrap();
    s.end(&end(200)).unwrap();
    let c = s.counters();
    assert_eq!(c.spans_dropped_export_failed.load(Ordering::Relaxed), 2);
    assert_eq!(c.spans_sent.load(Ordering::Relaxed), 0);
    // A 400 is not retried.
    let listener = Listener::start(vec![400], None);
    let mut s = sink(&listener.url, None);
    s.begin(&start(100)).unwrap();
    s.event(&call(100, 1, "main")).unwrap();
    s.end(&end(200)).unwrap();
    let c = s.counters();
    assert_eq!(c.retries.load(Ordering::Relaxed), 0);
    assert_eq!(c.spans_dropped_export_failed.load(Ordering::Relaxed), 2);
    assert_eq!(listener.requests.lock().unwrap().len(), 1);
}

#[test]
fn an_unreachable_collector_is_retried_then_counted() {
    // A port nobody listens on: bound, then closed.
    let url = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let mut s = sink(&url, None);
    s.begin(&start(100)).unwrap();
    s.event(&call(100, 1, "main")).unwrap();
    s.end(&end(200)).unwrap();
    let c = s.counters();
    assert_eq!(c.retries.load(Ordering::Relaxed), 2);
    assert_eq!(c.spans_dropped_export_failed.load(Ordering::Relaxed), 2);
}

#[test]
fn a_full_queue_drops_whole_batches_and_counts_their_spans() {
    let (release, hold) = mpsc::channel();
    let listener = Listener::start(vec![], Some(hold));
    // A timeout longer than the test takes to fill the queue: a held request that timed out would
    // be sent again (OTLP delivery is at least once), and counted twice by the listener.
    let retry = RetryPolicy { timeout: Duration::from_secs(300), ..fast_retry() };
    let mut s = OtlpSink::new(OtlpConfig {
        url: listener.url.clone(),
        service_name: None,
        retry,
        wait_when_full: false,
        ids: IdKey::random(),
        exporting: HashMap::new(),
    })
    .unwrap();
    s.begin(&start(0)).unwrap();
    // The first batch holds the exporter (the listener answers it only when released); the queue
    // takes QUEUE_BATCHES more; the rest find it full.
    let batches = QUEUE_BATCHES as u64 + 10;
    for i in 0..batches * BATCH_SPANS as u64 {
        s.event(&call(i * 10, 1, "f")).unwrap();
        s.event(&ret(i * 10 + 5, 1, "f", Some(5))).unwrap();
    }
    release.send(()).unwrap();
    s.end(&end(batches * BATCH_SPANS as u64 * 10)).unwrap();
    let c = s.counters();
    let (sent, dropped) = (c.spans_sent.load(Ordering::Relaxed), c.spans_dropped_queue_full.load(Ordering::Relaxed));
    let calls = batches * BATCH_SPANS as u64;
    assert_eq!(sent + dropped, calls + 1, "every call and the process span, sent or counted");
    // The exporter had taken the first batch, or not yet, when the queue filled.
    let queued = (sent - 1) / BATCH_SPANS as u64;
    assert!(queued == QUEUE_BATCHES as u64 || queued == QUEUE_BATCHES as u64 + 1, "{queued} batches sent");
    assert_eq!(dropped % BATCH_SPANS as u64, 0);
    assert_eq!(listener.spans().len() as u64, sent);
}

#[test]
fn urls_must_be_plain_http_with_a_host() {
    assert_eq!(traces_endpoint("http://127.0.0.1:4318").unwrap(), "http://127.0.0.1:4318/v1/traces");
    assert_eq!(traces_endpoint("http://c:4318/").unwrap(), "http://c:4318/v1/traces");
    assert_eq!(traces_endpoint("http://c:4318/otlp/v1/traces").unwrap(), "http://c:4318/otlp/v1/traces");
    assert_eq!(
        traces_endpoint("https://c:4318").unwrap_err().to_string(),
        "'https://c:4318' is not an http:// URL (OTLP/HTTP without TLS is what tracer speaks)"
    );
    assert!(matches!(traces_endpoint("http://"), Err(UrlError::NoHost(_))));
    assert!(matches!(traces_endpoint("http://user@c:1"), Err(UrlError::NoHost(_))));
}

#[test]
fn statuses_are_classified_as_otlp_http_says() {
    assert_eq!(classify(200), Outcome::Sent);
    for s in [429, 502, 503, 504] {
        assert!(matches!(classify(s), Outcome::Retry(_)), "{s}");
    }
    for s in [400, 401, 404, 413, 500] {
        assert!(matches!(classify(s), Outcome::Refused(_)), "{s}");
    }
}

#[test]
fn a_trace_read_from_a_file_waits_for_room_instead_of_dropping() {
    let (release, hold) = mpsc::channel();
    let listener = Listener::start(vec![], Some(hold));
    let retry = RetryPolicy { timeout: Duration::from_secs(300), ..fast_retry() };
    let mut s = OtlpSink::new(OtlpConfig {
        url: listener.url.clone(),
        service_name: None,
        retry,
        wait_when_full: true,
        ids: IdKey::random(),
        exporting: HashMap::new(),
    })
    .unwrap();
    s.begin(&start(0)).unwrap();
    let calls = (QUEUE_BATCHES as u64 + 3) * BATCH_SPANS as u64;
    // The listener is released from another thread while this one waits for room.
    let releaser = thread::spawn(move || {
        thread::sleep(Duration::from_millis(200));
        release.send(()).unwrap();
    });
    for i in 0..calls {
        s.event(&call(i * 10, 1, "f")).unwrap();
        s.event(&ret(i * 10 + 5, 1, "f", Some(5))).unwrap();
    }
    s.end(&end(calls * 10)).unwrap();
    releaser.join().unwrap();
    let c = s.counters();
    assert_eq!(c.spans_dropped_queue_full.load(Ordering::Relaxed), 0);
    assert_eq!(c.spans_sent.load(Ordering::Relaxed), calls + 1);
    assert_eq!(listener.spans().len() as u64, calls + 1);
}

#[test]
fn a_signal_raised_in_an_exited_child_goes_on_its_target_and_opens_no_second_process_span() {
    let listener = Listener::start(vec![], None);
    let mut s = sink(&listener.url, None);
    s.begin(&start(100)).unwrap();
    let exit = || EventData::Exit(data::Exit { exit_code: Some(0), signal: None, thread: false, comm: "app".into() });
    let sigchld = EventData::Signal(data::Signal {
        signal: crate::event::SignalId::new(libc::SIGCHLD),
        sender_pid: 2,
        target_pid: 1,
        target_tid: 0,
        delivered: false,
        flow_id: None,
        group: true,
        queued: true,
    });
    s.event(&ev(110, 2, 2, exit())).unwrap();
    // The kernel raises SIGCHLD in the exiting child's context.
    s.event(&ev(111, 2, 2, sigchld)).unwrap();
    s.event(&ev(120, 1, 1, exit())).unwrap();
    s.end(&end(200)).unwrap();
    let spans = listener.spans();
    assert_eq!(spans.len(), 2, "one span per process: {spans:?}");
    let parent = spans.iter().find(|(r, _)| int_attr(&r.attributes, "process.pid") == 1).unwrap();
    let events: Vec<&str> = parent.1.events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(events, ["signal SIGCHLD generated", "exit 0"]);
}

/// A program's `log` event of `level` from thread `tid` of pid 1.
fn log_event(
    ts: u64,
    tid: u32,
    level: data::Level,
    source: Option<&str>,
    message: &str,
    fields: serde_json::Value,
) -> Event {
    ev(
        ts,
        1,
        tid,
        EventData::Log(data::Log {
            log_type: if source.is_some() { data::LogType::Log } else { data::LogType::Trace },
            level,
            source: source.map(String::from),
            message: message.into(),
            function: Some("work".into()),
            file: Some("app.rs".into()),
            line: Some(12),
            spans: if source.is_some() { vec!["outer".into()] } else { vec![] },
            data: fields,
            truncated: false,
        }),
    )
}

#[test]
fn log_events_become_log_records_in_the_span_of_the_call_they_happened_in() {
    let listener = Listener::start(vec![], None);
    let mut s = sink(&listener.url, Some("svc"));
    s.begin(&start(100)).unwrap();
    for e in [
        log_event(105, 1, data::Level::Info, None, "before any call", serde_json::Value::Null),
        call(110, 1, "main"),
        call(120, 1, "work"),
        log_event(
            125,
            1,
            data::Level::Warn,
            Some("app::db"),
            "slow",
            serde_json::json!({"ms": 30, "peer": "a", "ok": true}),
        ),
        // Another thread, in no call: its process's span.
        log_event(126, 2, data::Level::Error, Some("app::db"), "from thread 2", serde_json::json!([1, 2])),
        ret(130, 1, "work", Some(10)),
        log_event(135, 1, data::Level::Debug, Some("app"), "back in main", serde_json::Value::Null),
        ret(140, 1, "main", Some(30)),
        log_event(145, 1, data::Level::Trace, None, "after", serde_json::Value::Null),
    ] {
        s.event(&e).unwrap();
    }
    s.end(&end(200)).unwrap();
    let c = s.counters();
    assert_eq!(c.log_records_sent.load(Ordering::Relaxed), 5);
    assert_eq!(c.spans_sent.load(Ordering::Relaxed), 3, "main, work, the process: no span event for a log");
    let spans = listener.spans();
    let span = |name: &str| spans.iter().find(|(_, s)| s.name == name).unwrap().1.clone();
    let (main, work, process) = (span("main"), span("work"), span("process app"));
    assert!(process.events.is_empty(), "{:?}", process.events);
    let mut logs = listener.logs();
    logs.sort_by_key(|(_, _, l)| l.time_unix_nano);
    let got: Vec<(String, i32, String, Vec<u8>, String)> = logs
        .iter()
        .map(|(_, scope, l)| {
            let body = match l.body.as_ref().and_then(|b| b.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => s.clone(),
                other => panic!("{other:?}"),
            };
            (body, l.severity_number, l.severity_text.clone(), l.span_id.clone(), scope.clone())
        })
        .collect();
    let row = |body: &str, n: SeverityNumber, text: &str, span: &Span, scope: &str| {
        (body.to_string(), n as i32, text.to_string(), span.span_id.clone(), scope.to_string())
    };
    assert_eq!(
        got,
        [
            row("before any call", SeverityNumber::Info, "INFO", &process, "tracer"),
            row("slow", SeverityNumber::Warn, "WARN", &work, "app::db"),
            row("from thread 2", SeverityNumber::Error, "ERROR", &process, "app::db"),
            row("back in main", SeverityNumber::Debug, "DEBUG", &main, "app"),
            row("after", SeverityNumber::Trace, "TRACE", &process, "tracer"),
        ]
    );
    for (resource, _, l) in &logs {
        assert_eq!(l.trace_id, process.trace_id, "the process's trace");
        assert_eq!(l.observed_time_unix_nano, l.time_unix_nano);
        assert_eq!(str_attr(&resource.attributes, "service.name"), "svc");
        assert_eq!(int_attr(&resource.attributes, "process.pid"), 1);
        assert_eq!(str_attr(&l.attributes, "code.function"), "work");
        assert_eq!(str_attr(&l.attributes, "code.file.path"), "app.rs");
        assert_eq!(int_attr(&l.attributes, "code.line.number"), 12);
    }
    let slow = &logs.iter().find(|(_, _, l)| l.time_unix_nano == 125).unwrap().2;
    assert_eq!(int_attr(&slow.attributes, "ms"), 30);
    assert_eq!(str_attr(&slow.attributes, "peer"), "a");
    assert_eq!(attr(&slow.attributes, "ok"), Some(&any_value::Value::BoolValue(true)));
    assert_eq!(int_attr(&slow.attributes, "thread.id"), 1);
    assert_eq!(str_attr(&slow.attributes, "tracer.log.type"), "log");
    assert!(
        matches!(attr(&slow.attributes, "tracer.log.spans"), Some(any_value::Value::ArrayValue(a)) if a.values.len() == 1)
    );
    let thread2 = &logs.iter().find(|(_, _, l)| l.time_unix_nano == 126).unwrap().2;
    assert_eq!(int_attr(&thread2.attributes, "thread.id"), 2);
    assert!(
        matches!(attr(&thread2.attributes, "tracer.data"), Some(any_value::Value::ArrayValue(a)) if a.values.len() == 2)
    );
    let first = &logs.iter().find(|(_, _, l)| l.time_unix_nano == 105).unwrap().2;
    assert_eq!(str_attr(&first.attributes, "tracer.log.type"), "trace");
    assert!(attr(&first.attributes, "tracer.log.spans").is_none());
}

#[test]
fn log_records_lost_are_counted_apart_from_spans() {
    // Three attempts answered 503 for the spans' request, then three for the logs'.
    let listener = Listener::start(vec![503; 6], None);
    let mut s = sink(&listener.url, None);
    s.begin(&start(100)).unwrap();
    s.event(&call(100, 1, "main")).unwrap();
    s.event(&log_event(105, 1, data::Level::Info, None, "a", serde_json::Value::Null)).unwrap();
    s.event(&log_event(106, 1, data::Level::Info, None, "b", serde_json::Value::Null)).unwrap();
    s.event(&log_event(107, 1, data::Level::Info, None, "c", serde_json::Value::Null)).unwrap();
    s.end(&end(200)).unwrap();
    let c = s.counters();
    assert_eq!(c.spans_dropped_export_failed.load(Ordering::Relaxed), 2);
    assert_eq!(c.log_records_dropped_export_failed.load(Ordering::Relaxed), 3);
    assert_eq!(c.spans_sent.load(Ordering::Relaxed) + c.log_records_sent.load(Ordering::Relaxed), 0);
    let paths: Vec<String> = listener.requests.lock().unwrap().iter().map(|(_, p, _)| p.clone()).collect();
    assert_eq!(paths, ["/v1/traces", "/v1/traces", "/v1/traces", "/v1/logs", "/v1/logs", "/v1/logs"]);
}

#[test]
fn the_logs_endpoint_is_derived_as_the_traces_endpoint_is() {
    assert_eq!(logs_endpoint("http://127.0.0.1:4318").unwrap(), "http://127.0.0.1:4318/v1/logs");
    assert_eq!(logs_endpoint("http://c:4318/").unwrap(), "http://c:4318/v1/logs");
    assert_eq!(logs_endpoint("http://c:4318/otlp/v1/traces").unwrap(), "http://c:4318/otlp/v1/logs");
    assert_eq!(logs_endpoint("http://c:4318/v1/traces").unwrap(), "http://c:4318/v1/logs");
    for url in ["http://c:4318/ingest", "http://c:4318/xv1/traces"] {
        assert_eq!(
            traces_endpoint(url).unwrap_err().to_string(),
            format!(
                "'{url}' names a path that does not end in /v1/traces, so tracer cannot tell where its log records go: give the collector's base URL (http://host:4318) or its traces endpoint (.../v1/traces)"
            )
        );
    }
}
