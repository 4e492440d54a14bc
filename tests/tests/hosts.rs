//! Hosts are who the user says they are. Two agents in two network namespaces that share one host
//! name (each in a UTS namespace of its own, as two VMs cloned from one image), each tracing a copy
//! of the timing fixture (tests/fixtures/c/timing.c) whose main process is given the same pid on
//! both: the trace has two hosts named as the user named them, two process groups, and exact
//! per-host counts in JSON lines, Chrome, Perfetto, flame graphs and folded stacks. And names are
//! checked wherever they come in.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::Value;
use tracer_tests::{
    TracerRun, fixture, gen_secret,
    netns::{AGENT_PORT, NetAgent, Network},
    perfetto::{trace_packet, track_event},
    record, temp_dir, tracer, tracer_bin, u64_field,
};

/// What both machines call themselves.
const TWIN: &str = "twin";
/// Host `i` of a visual export adds `i * 2^22` to its ids.
const PID_SPACE: u64 = 1 << 22;
const FUNCTIONS: [&str; 6] = ["run", "step", "leaf", "recurse", "worker", "child_main"];
/// Calls per function in one run of the timing fixture.
const CALLS: [(&str, u64); 6] =
    [("child_main", 1), ("leaf", 9), ("recurse", 4), ("run", 1), ("step", 3), ("worker", 1)];

/// An agent in a host's network namespace and a UTS namespace of its own named [`TWIN`].
fn twin_agent(net: &Network, host: usize, secret: &Path, dir: &Path) -> NetAgent {
    // `ip netns exec`, `unshare` (without --fork) and `sh`'s exec all exec: the child is the agent.
    let mut command = net.command(host, Path::new("unshare"));
    command
        .args(["--uts", "--", "sh", "-c", &format!("hostname {TWIN} && exec \"$0\" \"$@\"")])
        .arg(tracer_bin())
        .args(["agent", "--listen", &format!("{}:{AGENT_PORT}", net.hosts[host].addr), "--secret-file"])
        .arg(secret);
    NetAgent::spawn(command, dir.join(format!("agent-{host}.log")))
}

fn pid_in_use(pid: u32) -> bool {
    (pid..pid + 4).any(|p| Path::new(&format!("/proc/{p}")).exists())
}

/// Runs `program` to its end as process `pid`, by setting the pid the kernel hands out next;
/// `false` if another process took the pid first (the machine is shared).
fn run_as_pid(program: &Path, pid: u32) -> bool {
    std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).expect("write ns_last_pid");
    let mut child = Command::new(program).stdout(Stdio::null()).spawn().expect("run the fixture");
    let got = child.id();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    got == pid
}

/// Runs each program in turn as the same process id; returns that pid.
fn run_all_as_one_pid(programs: &[PathBuf]) -> u32 {
    let pid_max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max").unwrap().trim().parse().unwrap();
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid").unwrap().trim().parse().unwrap();
    let mut pid = (last + 5000) % (pid_max - 100) + 50;
    for _ in 0..20 {
        pid = if pid_in_use(pid) { pid + 7 } else { pid };
        // The first one may lose the race for the pid: try another; the others wait for it.
        if !run_as_pid(&programs[0], pid) {
            pid += 7;
            continue;
        }
        for program in &programs[1..] {
            assert!((0..20).any(|_| run_as_pid(program, pid)), "pid {pid} kept being taken");
        }
        return pid;
    }
    panic!("no free pid for the fixtures");
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn export(input: &Path, output: &Path) {
    let run = tracer(&["export".as_ref(), input.as_os_str(), "-o".as_ref(), output.as_os_str()]);
    assert_eq!(run.code(), 0, "{run:?}");
}

fn expected_calls() -> BTreeMap<String, u64> {
    CALLS.iter().map(|(f, n)| (f.to_string(), *n)).collect()
}

#[test]
fn hosts_that_share_a_hostname_and_pids_stay_apart_in_every_format() {
    let dir = temp_dir();
    let net = Network::new(2);
    let secret = gen_secret(dir.path(), "hosts");
    let _agents: Vec<NetAgent> = (0..2).map(|i| twin_agent(&net, i, &secret, dir.path())).collect();
    // A copy of the fixture per host: a binary target is every process that runs that file.
    let programs: Vec<PathBuf> = ["web", "db"]
        .iter()
        .map(|h| {
            std::fs::create_dir_all(dir.path().join(h)).unwrap();
            let copy = dir.path().join(h).join("timing");
            std::fs::copy(fixture("timing"), &copy).unwrap();
            copy
        })
        .collect();
    let out = dir.path().join("merged.jsonl");
    let mut args: Vec<String> = vec!["collect".into(), "-o".into(), out.display().to_string()];
    for (i, name) in ["web", "db"].iter().enumerate() {
        args.extend(["--agent".into(), format!("{name}={}:{AGENT_PORT}", net.hosts[i].addr)]);
        args.extend(["-b".into(), format!("{name}:{}", programs[i].display())]);
    }
    args.extend(["--secret-file".into(), secret.display().to_string(), "-e".into(), "call,return,spawn,exit".into()]);
    args.extend(FUNCTIONS.iter().flat_map(|f| ["-f".to_string(), f.to_string()]));
    let collector = TracerRun::spawn(&args, out.clone());
    let pid = run_all_as_one_pid(&programs);
    // Past the agents' reorder window: every event is on its way.
    std::thread::sleep(Duration::from_secs(2));
    collector.signal(libc::SIGINT);
    let (run, t) = collector.finish();
    assert_eq!(run.code(), 0, "{run:?}");

    // JSON lines: the user's names, and the machines' own names beside them.
    let hosts = t.start["hosts"].as_array().expect("trace_start.hosts");
    let names: Vec<&str> = hosts.iter().map(|h| h["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["web", "db"]);
    for h in hosts {
        assert_eq!(h["machine"]["hostname"], TWIN, "{h}");
        assert_eq!(h["machine"]["boot_id"].as_str().map(str::len), Some(36), "{h}");
    }
    assert_eq!(hosts[0]["machine"], hosts[1]["machine"], "one machine under two names");
    let ends: Vec<&str> = t.end["hosts"].as_array().unwrap().iter().map(|h| h["name"].as_str().unwrap()).collect();
    assert_eq!(ends, ["web", "db"]);
    assert!(t.end["hosts"].as_array().unwrap().iter().all(|h| h["complete"] == true), "{}", t.end);
    assert_eq!(t.lost(), 0, "{}", t.end);
    for host in ["web", "db"] {
        let events: Vec<&Value> = t.events.iter().filter(|e| e["host"] == host).collect();
        let mut calls: BTreeMap<String, u64> = BTreeMap::new();
        for e in events.iter().filter(|e| e["kind"] == "call") {
            *calls.entry(e["function"].as_str().unwrap().to_string()).or_default() += 1;
        }
        assert_eq!(calls, expected_calls(), "host {host}");
        let fork = events.iter().find(|e| e["kind"] == "spawn" && e["how"] == "fork").expect("a fork");
        assert_eq!(u64_field(fork, "pid"), pid as u64, "host {host}: the main process has the chosen pid");
        let info = hosts.iter().find(|h| h["name"] == host).unwrap();
        assert_eq!(u64_field(info, "events") as usize, events.len(), "{info}");
    }
    assert_eq!(t.events.iter().filter(|e| e["host"] != "web" && e["host"] != "db").count(), 0);
    for host in ["web", "db"] {
        assert!(run.stderr.contains(&format!("tracer: host {host}: received ")), "{run:?}");
    }
    assert!(!run.stderr.contains(TWIN), "the machines' name is no host's name: {run:?}");

    // Chrome: a process group per host, named by the user's names, ids in each host's range.
    let chrome = dir.path().join("merged.json");
    export(&out, &chrome);
    let trace: Value = serde_json::from_str(&read(&chrome)).unwrap();
    let mut processes: Vec<(u64, String)> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| (u64_field(e, "pid"), e["args"]["name"].as_str().unwrap().to_string()))
        .collect();
    processes.sort();
    processes.dedup();
    let main: Vec<(u64, String)> = processes.iter().filter(|(p, _)| *p % PID_SPACE == pid as u64).cloned().collect();
    assert_eq!(
        main,
        [(pid as u64, "web: timing".to_string()), (PID_SPACE + pid as u64, "db: timing".to_string())],
        "{processes:?}"
    );
    for (index, host) in ["web", "db"].iter().enumerate() {
        let mut calls: BTreeMap<String, u64> = BTreeMap::new();
        for e in trace["traceEvents"].as_array().unwrap() {
            let slice = e["ph"] == "X" || e["ph"] == "B";
            if slice && u64_field(e, "pid") / PID_SPACE == index as u64 {
                *calls.entry(e["name"].as_str().unwrap().to_string()).or_default() += 1;
            }
        }
        assert_eq!(calls, expected_calls(), "Chrome, host {host}");
    }

    // Perfetto: process tracks per host, slices counted by the host of their thread's process.
    let pftrace = dir.path().join("merged.pftrace");
    export(&out, &pftrace);
    let packets = tracer_tests::perfetto::read(&pftrace);
    let mut process_of_track: BTreeMap<u64, i32> = BTreeMap::new();
    let mut process_names: BTreeMap<i32, String> = BTreeMap::new();
    for p in &packets {
        if let Some(trace_packet::Data::TrackDescriptor(d)) = &p.data {
            if let Some(process) = &d.process {
                process_names.insert(process.pid(), process.process_name().to_string());
            }
            if let Some(thread) = &d.thread {
                process_of_track.insert(d.uuid(), thread.pid());
            }
        }
    }
    assert_eq!(process_names.get(&(pid as i32)).map(String::as_str), Some("web: timing"), "{process_names:?}");
    assert_eq!(
        process_names.get(&((PID_SPACE + pid as u64) as i32)).map(String::as_str),
        Some("db: timing"),
        "{process_names:?}"
    );
    let mut per_host: [BTreeMap<String, u64>; 2] = Default::default();
    for p in &packets {
        if let Some(trace_packet::Data::TrackEvent(e)) = &p.data
            && e.r#type() == track_event::Type::SliceBegin
        {
            let process = process_of_track[&e.track_uuid()];
            let Some(track_event::NameField::Name(name)) = &e.name_field else { panic!("a slice without a name") };
            *per_host[process as usize / PID_SPACE as usize].entry(name.clone()).or_default() += 1;
        }
    }
    assert_eq!(per_host, [expected_calls(), expected_calls()], "Perfetto");

    // Flame graph and folded stacks: each host's processes under its own name.
    let flame = dir.path().join("merged.flame.json");
    export(&out, &flame);
    let roots: Value = serde_json::from_str(&read(&flame)).unwrap();
    let root_names: Vec<&str> = roots.as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    for expected in [format!("web: timing ({pid})"), format!("db: timing ({})", PID_SPACE + pid as u64)] {
        assert!(root_names.contains(&expected.as_str()), "{expected}: {root_names:?}");
    }
    assert_eq!(root_names.len(), 4, "main and child per host: {root_names:?}");
    let folded = dir.path().join("merged.folded");
    export(&out, &folded);
    let folded = read(&folded);
    for host in ["web", "db"] {
        let lines: Vec<&str> = folded.lines().filter(|l| l.starts_with(&format!("{host}: timing ("))).collect();
        // The stacks of one run of the fixture: main thread and worker, and the child.
        let mut stacks: Vec<String> = lines
            .iter()
            .map(|l| {
                let stack = l.rsplit_once(' ').unwrap().0;
                stack.split_once(';').map_or(String::new(), |(_, rest)| rest.to_string())
            })
            .collect();
        stacks.sort();
        stacks.dedup();
        for expected in ["run;step;leaf", "run;recurse;recurse;recurse;recurse", "worker;leaf", "child_main;leaf"] {
            assert!(stacks.iter().any(|s| s == expected), "host {host}: {expected} in {stacks:?}");
        }
    }
}

#[test]
fn host_names_are_checked_before_anything_connects() {
    // Nothing listens at these addresses: the names fail first.
    let run = tracer(&["collect", "--agent", "web=127.0.0.1:1", "--agent", "web=127.0.0.1:2", "-p", "web:1"]);
    run.assert_error("host name web is given twice: each host needs a name of its own");
    assert_eq!(run.code(), 1);
    let run = tracer(&["collect", "--agent", "we\u{1b}[2Jb=127.0.0.1:1", "-p", "web:1"]);
    assert_ne!(run.code(), 0, "{run:?}");
    assert!(run.stderr.contains("use letters, digits, '.', '_' and '-' only"), "{run:?}");
    assert!(!run.stderr.contains('\u{1b}'), "the terminal escape is not echoed raw: {run:?}");
    for bad in ["", "a b", &"x".repeat(65)] {
        let run = tracer(&["record", "--host-name", bad, "--", "/bin/true"]);
        assert_ne!(run.code(), 0, "{run:?}");
        assert!(run.stderr.contains("host name"), "{run:?}");
    }
}

#[test]
fn record_names_its_host_as_told_and_keeps_the_machines_identity() {
    let dir = temp_dir();
    let (run, t) = record(dir.path(), &["--host-name", "node-7", "-e", "spawn,exit", "--", "/bin/true"]);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(t.start["host"], "node-7");
    assert!(!t.events.is_empty());
    assert!(t.events.iter().all(|e| e["host"] == "node-7"), "{:?}", t.events);
    let hostname = read(Path::new("/proc/sys/kernel/hostname"));
    assert_eq!(t.start["machine"]["hostname"], hostname.trim());
    assert_eq!(t.start["machine"]["boot_id"], read(Path::new("/proc/sys/kernel/random/boot_id")).trim());
    let machine_id = std::fs::read_to_string("/etc/machine-id").ok().map(|s| s.trim().to_string());
    match machine_id.filter(|m| m.len() == 32) {
        Some(id) => assert_eq!(t.start["machine"]["machine_id"], id.as_str()),
        None => assert!(t.start["machine"]["machine_id"].is_null()),
    }
}

/// The kernel reports the initial pid namespace's pids: a tracer in another pid namespace is
/// refused rather than left to trace nothing (or the wrong processes).
#[test]
fn a_tracer_in_another_pid_namespace_is_refused() {
    let dir = temp_dir();
    let out = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(tracer_bin())
        .arg("record")
        .arg("-o")
        .arg(dir.path().join("t.jsonl"))
        .args(["--", "/bin/true"])
        .output()
        .expect("run unshare");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("tracer: error: tracer must run in the initial pid namespace"), "{stderr}");
}

/// A merged trace whose start lists no hosts (written by hand, or by another tool) but whose
/// events come from two, each with a process 7 whose thread 7 makes different calls: `serve` once
/// on a, `query` twice (nested) on b. Every analysis and export keeps them two processes with
/// their own calls: a keeps its ids and names, b's move into the second range, named `b: …`.
#[test]
fn a_trace_of_two_hosts_with_the_same_pid_is_two_processes_everywhere() {
    let dir = temp_dir();
    let trace = dir.path().join("two.jsonl");
    tracer_tests::write_two_host_trace(&trace);
    let b_pid = PID_SPACE + 7;

    // report: each host's process with its own exact counts.
    let run = tracer(&["report".as_ref(), trace.as_os_str(), "--by-process".as_ref(), "--json".as_ref()]);
    assert_eq!(run.code(), 0, "{run:?}");
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    let mut functions: Vec<String> = report["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| format!("{} {} {} {}", f["pid"], f["process"], f["function"], f["calls"]))
        .collect();
    functions.sort();
    assert_eq!(functions, [format!("{b_pid} \"b: db\" \"query\" 2"), "7 \"web\" \"serve\" 1".to_string()]);
    let mut processes: Vec<String> = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| format!("{} {} {}", p["pid"], p["name"], p["exit_code"]))
        .collect();
    processes.sort();
    assert_eq!(processes, [format!("{b_pid} \"b: db\" 3"), "7 \"web\" 0".to_string()]);
    let run = tracer(&["report".as_ref(), trace.as_os_str(), "--json".as_ref()]);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    let calls: BTreeMap<String, u64> = report["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["function"].as_str().unwrap().to_string(), u64_field(f, "calls")))
        .collect();
    assert_eq!(calls, BTreeMap::from([("query".to_string(), 2), ("serve".to_string(), 1)]));

    // calls: one tree per host's thread, b's calls not under a's (printed as they end: before the
    // exits name the processes).
    let run = tracer(&["calls".as_ref(), trace.as_os_str()]);
    assert_eq!(run.code(), 0, "{run:?}");
    let trees: Vec<&str> = run.stdout.split_inclusive('\n').collect();
    let tree_of = |header: &str| -> String {
        let at = trees.iter().position(|l| l.starts_with(header)).unwrap_or_else(|| panic!("{header}: {}", run.stdout));
        trees[at + 1..].iter().take_while(|l| l.starts_with('+')).copied().collect()
    };
    let a = tree_of("pid 7, thread 7:");
    let b = tree_of(&format!("pid {b_pid}, thread {b_pid}:"));
    assert_eq!((a.matches("serve").count(), a.matches("query").count()), (1, 0), "a: {}", run.stdout);
    assert_eq!((b.matches("query").count(), b.matches("serve").count()), (2, 0), "b: {}", run.stdout);

    // Chrome: two processes, each with its own slices.
    let chrome = dir.path().join("two.json");
    export(&trace, &chrome);
    let file: Value = serde_json::from_str(&read(&chrome)).unwrap();
    let mut slices: BTreeMap<u64, BTreeMap<String, u64>> = BTreeMap::new();
    for e in file["traceEvents"].as_array().unwrap() {
        if e["ph"] == "X" || e["ph"] == "B" {
            *slices.entry(u64_field(e, "pid")).or_default().entry(e["name"].as_str().unwrap().into()).or_default() += 1;
        }
    }
    let expected = BTreeMap::from([
        (7, BTreeMap::from([("serve".to_string(), 1)])),
        (b_pid, BTreeMap::from([("query".to_string(), 2)])),
    ]);
    assert_eq!(slices, expected, "Chrome");
    let names: BTreeMap<u64, &str> = file["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| (u64_field(e, "pid"), e["args"]["name"].as_str().unwrap()))
        .collect();
    assert_eq!(names, BTreeMap::from([(7, "web"), (b_pid, "b: db")]), "Chrome process names");

    // Perfetto: two process tracks, slices counted by their thread's process.
    let pftrace = dir.path().join("two.pftrace");
    export(&trace, &pftrace);
    let packets = tracer_tests::perfetto::read(&pftrace);
    let mut process_of_track: BTreeMap<u64, i32> = BTreeMap::new();
    // A process's track is described again when it is renamed: the last name stays.
    let mut process_tracks: BTreeMap<i32, String> = BTreeMap::new();
    for p in &packets {
        if let Some(trace_packet::Data::TrackDescriptor(d)) = &p.data {
            if let Some(process) = &d.process {
                process_tracks.insert(process.pid(), process.process_name().to_string());
            }
            if let Some(thread) = &d.thread {
                process_of_track.insert(d.uuid(), thread.pid());
            }
        }
    }
    let b_name = ("b: db").to_string();
    assert_eq!(process_tracks, BTreeMap::from([(7, "web".to_string()), (b_pid as i32, b_name)]), "Perfetto");
    let mut per_process: BTreeMap<u64, BTreeMap<String, u64>> = BTreeMap::new();
    for p in &packets {
        if let Some(trace_packet::Data::TrackEvent(e)) = &p.data
            && e.r#type() == track_event::Type::SliceBegin
        {
            let process = process_of_track[&e.track_uuid()] as u64;
            let Some(track_event::NameField::Name(name)) = &e.name_field else { panic!("a slice without a name") };
            *per_process.entry(process).or_default().entry(name.clone()).or_default() += 1;
        }
    }
    assert_eq!(per_process, expected, "Perfetto");

    // speedscope: a profile per host's thread, each with its own calls (unnamed: written as the
    // calls end, before the exits name the processes).
    let speedscope = dir.path().join("two.speedscope.json");
    export(&trace, &speedscope);
    let file: Value = serde_json::from_str(&read(&speedscope)).unwrap();
    let frames = file["shared"]["frames"].as_array().unwrap();
    let mut profiles: Vec<(String, Vec<String>)> = file["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let opened = p["events"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["type"] == "O")
                .map(|e| frames[e["frame"].as_u64().unwrap() as usize]["name"].as_str().unwrap().to_string())
                .collect();
            (p["name"].as_str().unwrap().to_string(), opened)
        })
        .collect();
    profiles.sort();
    assert_eq!(
        profiles,
        [
            (format!("? {b_pid}/{b_pid}"), vec!["query".to_string(), "query".to_string()]),
            ("? 7/7".to_string(), vec!["serve".to_string()]),
        ],
        "speedscope"
    );
}
