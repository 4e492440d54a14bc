//! A fleet that sends straight to OpenTelemetry: two agents in two network namespaces (so the TCP
//! connection between them crosses hosts), each `tracer agent --otlp` to one rotel-agent, a client
//! of the ipc fixture on one and its server on the other, and `tracer collect --otlp` to the same
//! rotel: every span once, each agent's spans whole, and from the collector only what it alone
//! sees: one `recv link` span per receive of bytes sent from the other host, linking to the send
//! spans the other agent sent.

use std::{
    collections::{BTreeMap, HashSet},
    net::IpAddr,
    path::Path,
};

use tracer_tests::{
    TracerRun, fixture, gen_secret,
    netns::{AGENT_PORT, NetAgent, Network},
    rotel::{Rotel, Span, spans_sent},
    temp_dir,
};

/// `tracer collect` of the fixture's client on host a and server on host b.
fn collect(net: &Network, secret: &Path, out: &Path, otlp: Option<&str>) -> (tracer_tests::Run, tracer_tests::Trace) {
    let ipc = fixture("ipc");
    let server = net.hosts[1].addr;
    let mut args: Vec<String> = vec![
        "collect".into(),
        "--agent".into(),
        format!("a={}:{AGENT_PORT}", net.hosts[0].addr),
        "--agent".into(),
        format!("b={}:{AGENT_PORT}", net.hosts[1].addr),
        "--secret-file".into(),
        secret.display().to_string(),
        "-e".into(),
        "ipc,spawn,exit".into(),
        "-c".into(),
        format!("b:{} serve {server} 7001", ipc.display()),
        "-c".into(),
        format!("a:{} connect {server} 7001 0", ipc.display()),
        "-o".into(),
        out.display().to_string(),
    ];
    if let Some(url) = otlp {
        args.extend(["--otlp".into(), url.into()]);
    }
    TracerRun::spawn(&args, out.to_path_buf()).finish()
}

fn hex_pid(trace: &tracer_tests::Trace, host: &str) -> String {
    let pids: HashSet<u64> =
        trace.events.iter().filter(|e| e["host"] == host).map(|e| e["pid"].as_u64().unwrap()).collect();
    assert_eq!(pids.len(), 1, "one process on host {host}: {pids:?}");
    format!("Int({})", pids.into_iter().next().unwrap())
}

#[test]
fn agents_export_their_spans_and_the_collector_only_the_cross_host_links() {
    let dir = temp_dir();
    let net = Network::new(2);
    // On the bridge: the agents reach it from their namespaces, the collector from the root one.
    let bridge: IpAddr = {
        let a = net.hosts[0].addr.octets();
        IpAddr::from([a[0], a[1], a[2], 254])
    };
    let rotel = Rotel::start_on(dir.path(), bridge);
    let secret = gen_secret(dir.path(), "fleet");
    let secret_path = secret.to_str().unwrap();
    let agents: Vec<NetAgent> = (0..2)
        .map(|i| {
            NetAgent::start(&net, i, &i.to_string(), dir.path(), &["--secret-file", secret_path, "--otlp", &rotel.url])
        })
        .collect();
    let out = dir.path().join("merged.jsonl");
    let (run, trace) = collect(&net, &secret, &out, Some(&rotel.url));
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(trace.lost(), 0, "{}", trace.end);
    // 5 requests a → b, 5 answers b → a: ten receives of bytes sent from the other host.
    assert_eq!(spans_sent(&run.stderr), 10, "only the link spans: {run:?}");
    assert!(!run.stderr.contains("other hosts"), "no warning: {run:?}");
    let sent: Vec<usize> = agents.iter().map(|a| spans_sent(&a.wait_for_log("spans sent to"))).collect();
    // Each agent: its process, 5 sends and 5 receives.
    assert_eq!(sent, [11, 11], "{}\n{}", agents[0].log(), agents[1].log());
    let spans = rotel.spans(32);
    assert_eq!(spans.len(), 32, "{spans:#?}");
    let ids: HashSet<(&str, &str)> = spans.iter().map(|s| (s.trace_id.as_str(), s.id.as_str())).collect();
    assert_eq!(ids.len(), spans.len(), "no span twice");

    let (client, server) = (hex_pid(&trace, "a"), hex_pid(&trace, "b"));
    let of = |pid: &str, name: &str| -> Vec<&Span> {
        spans.iter().filter(|s| s.resource["process.pid"] == pid && s.name == name).collect()
    };
    let count = |pid: &str| -> BTreeMap<&str, usize> {
        let mut n = BTreeMap::new();
        for s in spans.iter().filter(|s| s.resource["process.pid"] == pid) {
            *n.entry(if s.name.starts_with("process ") { "process" } else { s.name.as_str() }).or_default() += 1;
        }
        n
    };
    let expected: BTreeMap<&str, usize> =
        [("process", 1), ("send tcp", 5), ("recv tcp", 5), ("recv link", 5)].into_iter().collect();
    assert_eq!(count(&client), expected, "host a");
    assert_eq!(count(&server), expected, "host b");

    // Each link span is a child of its host's receive span, in its trace, and links to the send
    // on the other host whose bytes it read: the k-th receive to the k-th send (in order).
    for (receiver, sender, bytes) in [(&server, &client, "Int(100)"), (&client, &server, "Int(200)")] {
        let recvs = of(receiver, "recv tcp");
        let sends = of(sender, "send tcp");
        assert!(recvs.iter().all(|r| r.links.is_empty()), "an agent sees one end of the connection");
        assert!(sends.iter().all(|s| s.attributes["tracer.bytes"] == bytes));
        let links = of(receiver, "recv link");
        for link in &links {
            assert_eq!(link.kind, "SPAN_KIND_CONSUMER");
            let k = recvs.iter().position(|r| r.id == link.parent_id).unwrap_or_else(|| panic!("{link:?}: no parent"));
            assert_eq!(link.trace_id, recvs[k].trace_id, "in the receiver's trace");
            assert_eq!(link.links, [(sends[k].trace_id.clone(), sends[k].id.clone())], "receive {k}: {link:?}");
        }
        let parents: HashSet<&str> = links.iter().map(|l| l.parent_id.as_str()).collect();
        assert_eq!(parents.len(), 5, "one link span per receive");
    }

    // Without --otlp, the collector says what is not sent, once, and how to send it.
    let out = dir.path().join("again.jsonl");
    let (run, _) = collect(&net, &secret, &out, None);
    assert_eq!(run.code(), 0, "{run:?}");
    let warnings: Vec<&str> = run.stderr.lines().filter(|l| l.contains("linked to its sends on other hosts")).collect();
    assert_eq!(warnings.len(), 1, "{run:?}");
    assert!(warnings[0].contains("a, b") && warnings[0].contains("--otlp"), "{run:?}");
}
