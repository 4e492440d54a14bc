//! Attacks on a real agent on this machine: an unprivileged user, a relay that injects or
//! replays frames, a flood of idle connections and a huge partial frame; and what an allowed
//! user gets (commands run as itself, exit codes passed through, nothing left a zombie).

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    os::unix::fs::PermissionsExt as _,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use tracer_tests::{
    Background, LocalAgent, Run, fixture, gen_secret, temp_dir, tracer, tracer_bin, wait_with_timeout, zombie_children,
};
use tracer_user::cluster::protocol::{Message, TraceRequest, encode_body, frame};
use tracer_user::event::{EndReason, TraceEnd};

/// `tracer ARGS` as uid/gid 65534 (nobody), with these supplementary groups.
fn tracer_as_nobody(args: &[&str], groups: Option<&str>) -> Run {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534"]);
    match groups {
        Some(g) => c.arg(format!("--groups={g}")),
        None => c.arg("--clear-groups"),
    };
    c.arg("--").arg(tracer_bin()).args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    wait_with_timeout(c.spawn().expect("setpriv"), "tracer as nobody")
}

/// A directory nobody can enter and write (for its output), holding the agent's socket.
fn open_dir() -> tempfile::TempDir {
    let dir = temp_dir();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn collect_args<'a>(agent: &'a str, output: &'a str, target: &'a [&'a str]) -> Vec<&'a str> {
    let mut args = vec!["collect", "--agent", agent, "-e", "spawn,exit", "-o", output];
    args.extend(target);
    args
}

#[test]
fn an_unprivileged_user_can_neither_trace_nor_launch_through_a_default_agent() {
    let dir = open_dir();
    let out_dir = temp_dir();
    std::fs::set_permissions(out_dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    // Even an agent that launches commands: the socket lets only root in.
    let agent = LocalAgent::start(dir.path(), "h", &["--allow-commands"]);
    assert!(agent.log().contains("for root only"), "{}", agent.log());
    assert_eq!(std::fs::metadata(&agent.socket).unwrap().permissions().mode() & 0o777, 0o600);
    let marker = out_dir.path().join("pwned");
    let command = format!("h:/bin/sh -c 'id > {}'", marker.display());
    let output = out_dir.path().join("x.jsonl").display().to_string();
    let spec = agent.spec("h");
    let target = fixture("calls");
    let victim = Background::start(&target, &["loop"]);
    let pid = format!("h:{}", victim.pid());
    let socket = agent.socket.display().to_string();
    for target in [["-c", command.as_str()], ["-p", pid.as_str()]] {
        let run = tracer_as_nobody(&collect_args(&spec, &output, &target), None);
        run.assert_error(&format!("cannot reach agent h at unix:{socket}: Permission denied (os error 13)"));
    }
    // A careless chmod of the socket: the agent still checks who connects (SO_PEERCRED).
    std::fs::set_permissions(&agent.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    for target in [["-c", command.as_str()], ["-p", pid.as_str()]] {
        let run = tracer_as_nobody(&collect_args(&spec, &output, &target), None);
        run.assert_error("agent h refused the connection: uid 65534 is not root");
    }
    agent.wait_for_log("refused uid 65534");
    assert!(!agent.log().contains("started"), "nothing was traced: {}", agent.log());
    assert!(!marker.exists(), "nothing was launched");
    // Root, through the same socket, gets in.
    let run = tracer(&collect_args(&spec, &output, &["-p", &pid, "-d", "0.3"]));
    assert_eq!(run.code(), 0, "{run:?}");
}

/// A socket-group member may trace (root's power to read any process, documented), and a
/// command it launches runs as itself, not as root; collect passes its exit code through.
#[test]
fn a_socket_group_member_launches_commands_as_itself() {
    let dir = open_dir();
    let out_dir = temp_dir();
    std::fs::set_permissions(out_dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    // adm (4) is a group every Debian system has; nobody is not in it.
    let agent = LocalAgent::start(dir.path(), "h", &["--socket-group", "adm", "--allow-commands"]);
    assert_eq!(std::fs::metadata(&agent.socket).unwrap().permissions().mode() & 0o777, 0o660);
    let output = out_dir.path().join("x.jsonl").display().to_string();
    let spec = agent.spec("h");
    // Exits with its uid modulo 256: 254 as nobody, 0 as root.
    let command = "h:sh -c 'exit $(( $(id -u) % 256 ))'";
    tracer_as_nobody(&collect_args(&spec, &output, &["-c", command]), None)
        .assert_error("cannot reach agent h at unix:");
    let run = tracer_as_nobody(&collect_args(&spec, &output, &["-c", command]), Some("4"));
    assert_eq!(run.code(), 254, "the command ran as nobody: {run:?}");
    let t = tracer_tests::Trace::load(Path::new(&output));
    assert_eq!(t.end["command_exit_code"], 254);
    assert_eq!(t.end["hosts"][0]["complete"], true, "{}", t.end);
}

/// A group given a socket in a directory it cannot enter would get "permission denied" from
/// every client: the agent says so at start instead, and changes nobody's directory.
#[test]
fn a_socket_group_that_cannot_enter_the_directory_is_refused_at_start() {
    let dir = temp_dir();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let socket = dir.path().join("a.sock").display().to_string();
    tracer(&["agent", "--socket", &socket, "--socket-group", "adm"]).assert_error(&format!(
        "members of group adm cannot reach a socket in {}: the directory does not let them in",
        dir.path().display()
    ));
    assert_eq!(std::fs::metadata(dir.path()).unwrap().permissions().mode() & 0o777, 0o700, "left as it was");
}

#[test]
fn collect_passes_the_exit_code_through_and_the_agent_reaps_what_outlives_its_trace() {
    let dir = open_dir();
    let agent = LocalAgent::start(dir.path(), "h", &["--allow-commands"]);
    let output = dir.path().join("x.jsonl").display().to_string();
    let spec = agent.spec("h");
    let run = tracer(&collect_args(&spec, &output, &["-c", "h:sh -c \"exit 7\""]));
    assert_eq!(run.code(), 7, "{run:?}");
    // Without --allow-commands, no command.
    let strict = LocalAgent::start(dir.path(), "s", &[]);
    let marker = dir.path().join("ran");
    let command = format!("s:{} marker {}", fixture("calls").display(), marker.display());
    tracer(&collect_args(&strict.spec("s"), &output, &["-c", &command])).assert_error(
        "agent s could not start tracing: this agent does not launch commands: start it with --allow-commands",
    );
    assert!(!marker.exists());
    // A command still running when its trace ends is reaped by the agent when it exits.
    let sleeper = format!("h:{} sleep 1500", fixture("calls").display());
    let run = tracer(&collect_args(&spec, &output, &["-c", &sleeper, "-d", "0.5"]));
    assert_eq!(run.code(), 0, "stopped by --duration: {run:?}");
    agent.wait_for_log("is still running, untraced");
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(zombie_children(agent.pid()), Vec::<u32>::new(), "no zombies");
}

/// How a relay between collector and agent meddles with the stream.
#[derive(Clone, Copy)]
enum Meddle {
    /// Right after the handshake, an extra frame to the agent: a start that would launch.
    InjectStart,
    /// The collector's first frame after the handshake, once more.
    Replay,
    /// An extra frame to the collector.
    InjectToCollector,
}

fn read_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let mut frame = len.to_vec();
    frame.resize(4 + u32::from_le_bytes(len) as usize, 0);
    s.read_exact(&mut frame[4..]).ok()?;
    Some(frame)
}

/// A frame whose MAC is a guess.
fn forged(message: &Message) -> Vec<u8> {
    frame(&encode_body(message).unwrap(), &[0x5a; 32]).unwrap()
}

/// Accepts one connection and relays it to `agent` frame by frame, meddling as told.
fn relay(agent: String, meddle: Meddle, marker: &Path) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let marker = marker.display().to_string();
    std::thread::spawn(move || {
        let Ok((collector, _)) = listener.accept() else { return };
        let agent = TcpStream::connect(agent).unwrap();
        let (mut c_in, mut a_out) = (collector.try_clone().unwrap(), agent.try_clone().unwrap());
        let (mut a_in, mut c_out) = (agent, collector);
        std::thread::spawn(move || {
            let mut n = 0;
            while let Some(f) = read_frame(&mut a_in) {
                if c_out.write_all(&f).is_err() {
                    break;
                }
                n += 1;
                // Frame 1 from the agent is its welcome: the handshake is over.
                if n == 2 && matches!(meddle, Meddle::InjectToCollector) {
                    let fake = Message::Ended {
                        trace_id: 1,
                        trace_end: TraceEnd::new(0, EndReason::Stopped, 0),
                        total_events: 0,
                    };
                    let _ = c_out.write_all(&forged(&fake));
                }
            }
            // The agent hung up: so does the relay.
            let _ = c_out.shutdown(std::net::Shutdown::Both);
        });
        let mut n = 0;
        while let Some(f) = read_frame(&mut c_in) {
            if a_out.write_all(&f).is_err() {
                break;
            }
            n += 1;
            match meddle {
                // Frame 1 from the collector is its answer: it has proved itself.
                Meddle::InjectStart if n == 2 => {
                    std::thread::sleep(Duration::from_millis(100));
                    let request = TraceRequest {
                        command: vec!["/bin/sh".into(), "-c".into(), format!("id > {marker}")],
                        ..Default::default()
                    };
                    let _ = a_out.write_all(&forged(&Message::Start { trace_id: 7, request }));
                }
                Meddle::Replay if n == 3 => {
                    let _ = a_out.write_all(&f);
                }
                _ => {}
            }
        }
        let _ = a_out.shutdown(std::net::Shutdown::Both);
    });
    addr
}

#[test]
fn a_relay_that_injects_or_replays_frames_is_refused_and_nothing_is_launched() {
    let dir = temp_dir();
    let secret = gen_secret(dir.path(), "s");
    let agent = LocalAgent::start(
        dir.path(),
        "h",
        &["--listen", "127.0.0.1:0", "--secret-file", secret.to_str().unwrap(), "--allow-commands"],
    );
    let marker = dir.path().join("pwned");
    let output = dir.path().join("x.jsonl").display().to_string();
    let victim = Background::start(&fixture("calls"), &["loop"]);
    let pid = format!("h:{}", victim.pid());
    for (meddle, agent_says, collector_says) in [
        (Meddle::InjectStart, "frame 1 failed authentication", "agent h: "),
        (Meddle::Replay, "frame 2 failed authentication", "agent h: "),
        (Meddle::InjectToCollector, "", "agent h: frame 1 failed authentication"),
    ] {
        let relayed = relay(agent.addr.clone(), meddle, &marker);
        let spec = format!("h={relayed}");
        let target = ["-p", pid.as_str(), "-d", "1"];
        let mut args = collect_args(&spec, &output, &target);
        args.extend(["--secret-file", secret.to_str().unwrap()]);
        let run = tracer(&args);
        assert_ne!(run.code(), 0, "{run:?}");
        assert!(run.stderr.contains(collector_says), "{run:?}");
        if !agent_says.is_empty() {
            agent.wait_for_log(agent_says);
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(!marker.exists(), "the injected command never ran");
    assert!(!agent.log().contains("started"), "nothing was traced: {}", agent.log());
}

fn rss_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn raise_fd_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit on a valid struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max.min(8192);
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
}

#[test]
fn a_flood_of_idle_connections_and_a_huge_partial_frame_do_not_keep_a_collector_out() {
    raise_fd_limit();
    let dir = temp_dir();
    let secret = gen_secret(dir.path(), "s");
    let agent =
        LocalAgent::start(dir.path(), "h", &["--listen", "127.0.0.1:0", "--secret-file", secret.to_str().unwrap()]);
    let before = rss_kib(agent.pid(), "VmRSS:");
    let idle: Vec<TcpStream> = (0..1000).map(|_| TcpStream::connect(&agent.addr).unwrap()).collect();
    // Announces a frame just under 8 MiB and sends 7 MiB of it: refused on the length alone (a
    // reader that took it would hold those 7 MiB).
    let mut partial = TcpStream::connect(&agent.addr).unwrap();
    let _ = partial.write_all(&(((8 << 20) - 1) as u32).to_le_bytes());
    let _ = partial.write_all(&vec![1u8; 7 << 20]);
    agent.wait_for_log("larger than the limit (4096)");
    agent.wait_for_log("closed the oldest connection that had not authenticated");
    let flooded = rss_kib(agent.pid(), "VmHWM:");
    eprintln!("agent memory: {before} KiB before the flood, peak {flooded} KiB during it");
    assert!(flooded < before + 4 * 1024, "the flood cost {} KiB", flooded - before);

    // With the thousand connections still open, a collector gets in and traces.
    let victim = Background::start(&fixture("calls"), &["loop"]);
    let output = dir.path().join("x.jsonl");
    let pid = format!("h:{}", victim.pid());
    let spec = agent.spec("h");
    let started = Instant::now();
    let run = tracer(&[
        "collect",
        "--agent",
        &spec,
        "--secret-file",
        secret.to_str().unwrap(),
        "-p",
        &pid,
        "-f",
        "tick",
        "-d",
        "1",
        "-o",
        output.to_str().unwrap(),
    ]);
    assert_eq!(run.code(), 0, "{run:?}");
    let t = tracer_tests::Trace::load(&output);
    assert!(t.calls("tick").len() > 100, "{} ticks", t.calls("tick").len());
    eprintln!("collected in {:?} beside 1000 idle connections", started.elapsed());
    drop(idle);
}
