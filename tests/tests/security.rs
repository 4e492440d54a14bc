//! Attacks on a real agent on this machine: an unprivileged user, a relay that injects or
//! replays frames, an eavesdropper on the link, a flood of idle connections and a huge partial frame, a secret file that is a
//! FIFO; what an allowed user gets (commands run as itself, detached from the agent, exit codes
//! passed through, nothing left a zombie); and on `record`'s output: a link or a file another
//! user planted where the trace goes.

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    os::unix::fs::PermissionsExt as _,
    path::Path,
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tracer_tests::{
    Background, LocalAgent, Run, fixture, gen_secret, temp_dir, tracer, tracer_bin, wait_with_timeout, zombie_children,
};
use tracer_user::cluster::protocol::{Message, TraceRequest, encode_body};
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

/// The next unit of a connection, its length included: during the handshake (the first two each
/// way: the hello and the collector's Noise message, the terms and the agent's) a plain frame
/// with a `u32` length, after it a Noise transport message with a `u16` length.
fn read_unit(s: &mut TcpStream, handshake: bool) -> Option<Vec<u8>> {
    let width = if handshake { 4 } else { 2 };
    let mut unit = vec![0u8; width];
    s.read_exact(&mut unit).ok()?;
    let mut len = [0u8; 4];
    len[..width].copy_from_slice(&unit);
    unit.resize(width + u32::from_le_bytes(len) as usize, 0);
    s.read_exact(&mut unit[width..]).ok()?;
    Some(unit)
}

/// A frame laid out as the session lays one out, unencrypted, with a guess at the tag.
fn forged(message: &Message) -> Vec<u8> {
    let body = encode_body(message).unwrap();
    let mut piece = (body.len() as u32).to_le_bytes().to_vec();
    piece.extend(body);
    piece.extend([0x5a; 16]);
    let mut unit = (piece.len() as u16).to_le_bytes().to_vec();
    unit.extend(piece);
    unit
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
            while let Some(f) = read_unit(&mut a_in, n < 2) {
                if c_out.write_all(&f).is_err() {
                    break;
                }
                n += 1;
                // The agent's second is its Noise message: the handshake is over.
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
        while let Some(f) = read_unit(&mut c_in, n < 2) {
            if a_out.write_all(&f).is_err() {
                break;
            }
            n += 1;
            match meddle {
                // The collector's second is its Noise message: it has proved itself.
                Meddle::InjectStart if n == 2 => {
                    std::thread::sleep(Duration::from_millis(100));
                    let request = TraceRequest {
                        command: vec!["/bin/sh".into(), "-c".into(), format!("id > {marker}")],
                        ..Default::default()
                    };
                    let _ = a_out.write_all(&forged(&Message::Start { trace_id: 7, request: Box::new(request) }));
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
        (Meddle::InjectStart, "frame 0 failed authentication", "agent h: "),
        (Meddle::Replay, "frame 1 failed authentication", "agent h: "),
        (Meddle::InjectToCollector, "", "agent h: frame 0 failed authentication"),
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

/// Accepts one connection and relays it to `agent` as it comes, keeping a copy of every byte that
/// passes: to the agent, and to the collector.
fn eavesdropper(agent: String) -> (String, Arc<Mutex<[Vec<u8>; 2]>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let heard = Arc::new(Mutex::new([Vec::new(), Vec::new()]));
    let record = heard.clone();
    std::thread::spawn(move || {
        let Ok((collector, _)) = listener.accept() else { return };
        let agent = TcpStream::connect(agent).unwrap();
        let ways = [(collector.try_clone().unwrap(), agent.try_clone().unwrap()), (agent, collector)];
        for (way, (mut from, mut to)) in ways.into_iter().enumerate() {
            let record = record.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 << 10];
                while let Ok(n @ 1..) = from.read(&mut buf) {
                    record.lock().unwrap()[way].extend_from_slice(&buf[..n]);
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = to.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    (addr, heard)
}

/// Without TLS, what crosses the network is still encrypted: a relay that records every byte both
/// ways, while a collector launches a command and receives its events, finds no trace of a word
/// that is in the command's arguments and in the name of the program it runs 50 times (its
/// exec events), though the trace is whole.
#[test]
fn an_eavesdropper_on_the_link_reads_neither_commands_nor_events() {
    let dir = temp_dir();
    let secret = gen_secret(dir.path(), "s");
    let agent = LocalAgent::start(
        dir.path(),
        "h",
        &["--listen", "127.0.0.1:0", "--secret-file", secret.to_str().unwrap(), "--allow-commands"],
    );
    let word = format!("overheard{:08x}", std::process::id().wrapping_mul(2_654_435_761));
    let program = dir.path().join(&word);
    std::fs::copy("/bin/echo", &program).unwrap();
    let (relayed, heard) = eavesdropper(agent.addr.clone());
    let output = dir.path().join("x.jsonl");
    let spec = format!("h={relayed}");
    let command = format!("h:/bin/sh -c 'for i in $(seq 50); do {} {word}-argument; done'", program.display());
    let run = tracer(&[
        "collect",
        "--agent",
        &spec,
        "--secret-file",
        secret.to_str().unwrap(),
        "-e",
        "spawn,exit",
        "-c",
        &command,
        "-o",
        output.to_str().unwrap(),
    ]);
    assert_eq!(run.code(), 0, "{run:?}");
    let t = tracer_tests::Trace::load(&output);
    let filename = program.display().to_string();
    let execs = t.of_kind("spawn").filter(|e| e["how"] == "exec" && e["filename"] == filename.as_str()).count();
    assert_eq!(execs, 50, "the execs of {filename} crossed the link");
    std::thread::sleep(Duration::from_millis(200));
    let heard = heard.lock().unwrap();
    let [to_agent, to_collector] = &*heard;
    eprintln!("the relay saw {} bytes to the agent, {} to the collector", to_agent.len(), to_collector.len());
    // The start with its command, clock probes and acknowledgements; the trace's start, 150
    // events (a fork, an exec and an exit each time) and its end.
    assert!(to_agent.len() > 500 && to_collector.len() > 5_000, "the relay saw the session");
    for (way, bytes) in [("to the agent", to_agent), ("to the collector", to_collector)] {
        assert!(!bytes.windows(word.len()).any(|w| w == word.as_bytes()), "{word} went {way} in the clear");
        assert!(!bytes.windows(7).any(|w| w == b"/bin/sh"), "the command went {way} in the clear");
    }
}

fn rss_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The peak of one `/proc/PID/status` field, sampled every 5 ms from `start` to `stop`.
struct PeakSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl PeakSampler {
    fn start(pid: u32, field: &'static str) -> PeakSampler {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rss_kib(pid, field));
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            peak
        });
        PeakSampler { stop, thread }
    }

    fn stop(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap()
    }
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
    // A small flood first, the same kinds of connection, so that what the big one is measured
    // against already has the admission and refusal code in memory (its pages count in VmHWM the
    // first time they run; under a VM that was most of the difference).
    {
        let warm: Vec<TcpStream> = (0..32).map(|_| TcpStream::connect(&agent.addr).unwrap()).collect();
        let mut oversized = TcpStream::connect(&agent.addr).unwrap();
        let _ = oversized.write_all(&(((8 << 20) - 1) as u32).to_le_bytes());
        agent.wait_for_log("larger than the limit (4096)");
        agent.wait_for_log("closed the oldest connection that had not authenticated");
        drop((warm, oversized));
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let before = rss_kib(agent.pid(), "VmHWM:");
    let idle: Vec<TcpStream> = (0..1000).map(|_| TcpStream::connect(&agent.addr).unwrap()).collect();
    // Announces a frame just under 8 MiB and sends 7 MiB of it: refused on the length alone (a
    // reader that took it would hold those 7 MiB).
    let mut partial = TcpStream::connect(&agent.addr).unwrap();
    let _ = partial.write_all(&(((8 << 20) - 1) as u32).to_le_bytes());
    let _ = partial.write_all(&vec![1u8; 7 << 20]);
    // The second of each: the first came from the small flood.
    agent.wait_for_log_lines("larger than the limit (4096)", 2);
    agent.wait_for_log_lines("closed the oldest connection that had not authenticated", 2);
    let flooded = rss_kib(agent.pid(), "VmHWM:");
    eprintln!("agent memory: {before} KiB before the flood, peak {flooded} KiB during it");
    // Measured: 0.6-1.3 MiB on the host, 3.3-4.1 MiB under the emulated 6.1 VM (6 Dec 2026, 4
    // runs each); a reader that took the partial frame would hold 7 MiB more, so 6 MiB still tells.
    assert!(flooded < before + 6 * 1024, "the flood cost {} KiB", flooded - before);

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

/// A pseudo-terminal: the master (kept by the test) and the path of its other end.
fn pseudo_terminal() -> (std::os::fd::OwnedFd, std::ffi::CString) {
    use std::os::fd::FromRawFd as _;
    // SAFETY: the C library's pseudo-terminal calls, each result checked.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(master >= 0 && libc::grantpt(master) == 0 && libc::unlockpt(master) == 0);
        let name = std::ffi::CStr::from_ptr(libc::ptsname(master)).to_owned();
        (std::os::fd::OwnedFd::from_raw_fd(master), name)
    }
}

/// The issue's attack: an agent started from root's terminal, and a socket-group member's command
/// that would push a line into that shell (TIOCSTI), rewrite the agent's log through an inherited
/// descriptor, or read root's environment. Detached, it has nothing of the agent's.
#[test]
fn a_members_command_starts_detached_from_the_agent() {
    let dir = open_dir();
    let out_dir = temp_dir();
    std::fs::set_permissions(out_dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    // Dropped after the agent: closing it first would hang up the agent's session.
    let (_master, terminal) = pseudo_terminal();
    let agent = tracer_tests::LocalAgent::start_with(
        dir.path(),
        "h",
        &["--socket-group", "adm", "--allow-commands"],
        |command| {
            use std::os::unix::process::CommandExt as _;
            command.env("TRACER_SECRET_MARKER", "1");
            // SAFETY: async-signal-safe calls only, on memory prepared before the fork.
            unsafe {
                command.pre_exec(move || {
                    // A session of its own whose controlling terminal is the pseudo-terminal, on
                    // stdin: as when started from a root shell.
                    libc::setsid();
                    let tty = libc::open(terminal.as_ptr(), libc::O_RDWR);
                    if tty < 0 || libc::dup2(tty, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        },
    );
    let agent_stat = std::fs::read_to_string(format!("/proc/{}/stat", agent.pid())).unwrap();
    let agent_tty = agent_stat.rsplit_once(") ").unwrap().1.split(' ').nth(4).unwrap().to_string();
    assert_ne!(agent_tty, "0", "the agent has a controlling terminal");
    let log = dir.path().join("agent-h.log");
    let output = out_dir.path().join("x.jsonl").display().to_string();
    let spec = agent.spec("h");
    let script = format!(
        "ls /proc/self/fd; readlink /proc/self/fd/0; \
         echo sid=$(($(cut -d\" \" -f6 /proc/self/stat) == $$)) tty=$(cut -d\" \" -f7 /proc/self/stat); \
         (: </dev/tty) 2>/dev/null || echo no terminal to reach; \
         grep NoNewPrivs /proc/self/status; id -u; pwd; env | sort; \
         echo written to stderr >&2; \
         (echo pwned >>{log}) 2>/dev/null || echo the agent log is not writable; \
         (echo pwned >>/proc/{agent}/fd/2) 2>/dev/null || echo nor through the agent; echo and more >&2",
        log = log.display(),
        agent = agent.pid()
    );
    let command = format!("h:sh -c '{script}'");
    let run = tracer_as_nobody(&collect_args(&spec, &output, &["-c", &command]), Some("4"));
    assert_eq!(run.code(), 0, "{run:?}");
    // Descriptors 0-2 only (3 is ls's own directory), stdin /dev/null, a session of its own
    // without a terminal, no new privileges, as nobody, in /, with nobody's environment.
    let stdout = "0\n1\n2\n3\n/dev/null\nsid=1 tty=0\nno terminal to reach\nNoNewPrivs:\t1\n65534\n/\n\
                  HOME=/nonexistent\nLOGNAME=nobody\nPATH=/usr/local/bin:/usr/bin:/bin\nPWD=/\n\
                  SHELL=/usr/sbin/nologin\nUSER=nobody\n\
                  the agent log is not writable\nnor through the agent\n";
    let stderr = "written to stderr\nand more\n";
    // At the collector: each stream on its own, every line prefixed by the host, in order.
    let prefixed = |text: &str| text.lines().map(|l| format!("h: {l}\n")).collect::<String>();
    assert_eq!(run.stdout, prefixed(stdout), "{run:?}");
    let command_stderr: String =
        run.stderr.lines().filter(|l| l.starts_with("h: ")).map(|l| format!("{l}\n")).collect();
    assert_eq!(command_stderr, prefixed(stderr), "{run:?}");
    // And in the member's file on the host: both streams, each in its order.
    let line = agent.wait_for_log("the command's output goes to its collector and to ");
    let file = line.split("the command's output goes to its collector and to ").nth(1).unwrap().trim();
    assert!(file.starts_with(&dir.path().join("command-output/65534/trace-").display().to_string()), "{file}");
    let meta = std::fs::metadata(file).unwrap();
    use std::os::unix::fs::MetadataExt as _;
    assert_eq!((meta.uid(), meta.gid(), meta.mode() & 0o777), (65534, 65534, 0o600), "the member's own file");
    let text = std::fs::read_to_string(file).unwrap();
    let (mut out, mut err) = (String::new(), String::new());
    for l in text.lines() {
        let to = if stderr.lines().any(|e| e == l) { &mut err } else { &mut out };
        to.push_str(l);
        to.push('\n');
    }
    assert_eq!((out.as_str(), err.as_str()), (stdout, stderr), "{text}");
    assert!(!text.contains("TRACER_SECRET_MARKER"));
    assert!(!agent.log().contains("pwned"), "{}", agent.log());
}

/// A command that writes 64 MiB to stdout as fast as it can: the agent reads it as it comes (the
/// command is never blocked on the collector), keeps at most its bound for the collector, and
/// whatever the collector did not get it is told of, to the byte; the file on the host has it all.
#[test]
fn a_command_that_writes_64_mib_finishes_and_what_collect_missed_is_told() {
    const SIZE: usize = 64 << 20;
    let dir = open_dir();
    let agent = LocalAgent::start(dir.path(), "h", &["--allow-commands"]);
    let output = dir.path().join("x.jsonl").display().to_string();
    let spec = agent.spec("h");
    // The agent's anonymous memory (its heap), sampled during a trace whose command writes 5
    // bytes and then during this one: the difference is what the output cost. (VmHWM would also
    // count the trace's ring buffer, which the kernel maps into the agent for each trace and
    // counts as its pages on some kernels and not on others.)
    let sampler = PeakSampler::start(agent.pid(), "RssAnon:");
    let run = tracer(&collect_args(&spec, &output, &["-c", "h:echo warm"]));
    assert_eq!((run.code(), run.stdout.as_str()), (0, "h: warm\n"), "{run:?}");
    let before = sampler.stop();
    let sampler = PeakSampler::start(agent.pid(), "RssAnon:");
    let command = format!("h:sh -c 'head -c {SIZE} /dev/zero | tr \"\\0\" a'");
    let run = tracer(&collect_args(&spec, &output, &["-c", &command]));
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let after = sampler.stop();
    // No newline at all: every line is a piece of at most 64 KiB, all of it the command's bytes.
    let mut received = 0;
    for line in run.stdout.lines() {
        let bytes = line.strip_prefix("h: ").unwrap_or_else(|| panic!("not the host's: {:?}", &line[..40]));
        assert!(bytes.bytes().all(|b| b == b'a') && bytes.len() <= 64 << 10);
        received += bytes.len();
    }
    let told = " bytes of the command's stdout were not sent: the agent keeps at most 1048576 bytes of output";
    let dropped: usize = run
        .stderr
        .lines()
        .filter_map(|l| l.split_once("host h: ")?.1.split_once(told).map(|(n, _)| n.parse::<usize>().unwrap()))
        .sum();
    eprintln!(
        "the collector got {} MiB, was told of {} MiB dropped; the agent's anonymous memory peaked at {before} KiB for 5 bytes and {after} KiB for this",
        received >> 20,
        dropped >> 20
    );
    assert_eq!(received + dropped, SIZE, "{}", run.stderr);
    let line = agent.wait_for_log_lines("the command's output goes to its collector and to ", 2);
    let file = line.split("the command's output goes to its collector and to ").nth(1).unwrap().trim();
    assert_eq!(std::fs::metadata(file).unwrap().len(), SIZE as u64, "the file on the host has everything");
    // The queue for the collector (1 MiB), a read buffer and frames in flight: nothing near the
    // 64 MiB that went through.
    assert!(after.saturating_sub(before) < 16 << 10, "the output cost the agent {after} - {before} KiB");
}

/// `--cwd`: the command starts in a directory its user may enter; one it may not fails the
/// launch with one sentence.
#[test]
fn a_members_command_starts_in_the_directory_collect_names_if_it_may_enter_it() {
    let dir = open_dir();
    let out_dir = temp_dir();
    std::fs::set_permissions(out_dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let agent = LocalAgent::start(dir.path(), "h", &["--socket-group", "adm", "--allow-commands"]);
    let output = out_dir.path().join("x.jsonl").display().to_string();
    let spec = agent.spec("h");
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    let open = open.display().to_string();
    let run =
        tracer_as_nobody(&collect_args(&spec, &output, &["-c", "h:pwd", "--cwd", &format!("h:{open}")]), Some("4"));
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(run.stdout, format!("h: {open}\n"));
    let private = dir.path().join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let private = private.display().to_string();
    let run =
        tracer_as_nobody(&collect_args(&spec, &output, &["-c", "h:pwd", "--cwd", &format!("h:{private}")]), Some("4"));
    run.assert_error(&format!(
        "agent h could not start tracing: uid 65534 cannot enter the working directory {private}: Permission denied (os error 13)"
    ));
    assert_eq!(run.stdout, "", "nothing ran");
}

/// A FIFO as the secret file would block the open until someone writes it: refused at once.
#[test]
fn a_secret_file_that_is_a_fifo_is_refused_at_once() {
    let dir = temp_dir();
    let fifo = dir.path().join("secret");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a valid path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let started = Instant::now();
    tracer(&["agent", "--listen", "127.0.0.1:0", "--secret-file", fifo.to_str().unwrap()])
        .assert_error(&format!("the secret file {} is a FIFO, not a regular file", fifo.display()));
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    // A file of nobody's, mode 0600: nobody could change the secret of root's agent.
    let theirs = dir.path().join("theirs");
    std::fs::write(&theirs, "0123456789abcdefghijklmnopqrstuv\n").unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    tracer(&["agent", "--listen", "127.0.0.1:0", "--secret-file", theirs.to_str().unwrap()]).assert_error(&format!(
        "the secret file {} belongs to uid 65534, neither root nor you (uid 0)",
        theirs.display()
    ));
}

/// `CMD` as nobody.
fn as_nobody(cmd: &[&str]) {
    let status = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(cmd)
        .status()
        .unwrap();
    assert!(status.success(), "{cmd:?}");
}

fn record_to(path: &Path) -> Run {
    tracer(&["record", "-e", "spawn,exit", "-o", path.to_str().unwrap(), "--", "/bin/true"])
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

/// Root records into a directory everyone can write (mode 0777, no sticky bit), where nobody
/// planted a link to a root-only file and pre-created a file to receive the trace.
#[test]
fn record_writes_no_trace_through_a_planted_link_or_into_another_users_file() {
    let private = temp_dir();
    let victim = private.path().join("victim");
    std::fs::write(&victim, "root's own\n").unwrap();
    let shared = temp_dir();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o777)).unwrap();

    let link = shared.path().join("t.jsonl");
    as_nobody(&["ln", "-s", victim.to_str().unwrap(), link.to_str().unwrap()]);
    record_to(&link).assert_error(&format!(
        "refusing to write the trace to {}: it is a symbolic link, which whoever can write its directory may have planted",
        link.display()
    ));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's own\n", "the link's target is unchanged");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    // export and a non-streaming format: the same refusal.
    let chrome = shared.path().join("t.json");
    as_nobody(&["ln", "-s", victim.to_str().unwrap(), chrome.to_str().unwrap()]);
    record_to(&chrome)
        .assert_error(&format!("refusing to write the trace to {}: it is a symbolic link", chrome.display()));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's own\n");

    let planted = shared.path().join("p.jsonl");
    as_nobody(&["touch", planted.to_str().unwrap()]);
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o666)).unwrap();
    record_to(&planted).assert_error(&format!(
        "refusing to write the trace to {}: it belongs to uid 65534, not to you (uid 0), who could then read it",
        planted.display()
    ));
    assert_eq!(std::fs::read_to_string(&planted).unwrap(), "", "nothing written into it");

    // A new trace is root's alone; replacing root's own file needs no --force, keeps the previous
    // one as NAME.old (through a link planted at that name, never into its target), and leaves
    // nothing else behind.
    let mine = shared.path().join("mine.jsonl");
    let old = shared.path().join("mine.jsonl.old");
    as_nobody(&["ln", "-s", victim.to_str().unwrap(), old.to_str().unwrap()]);
    let run = record_to(&mine);
    assert_eq!(run.code(), 0, "{run:?}");
    use std::os::unix::fs::MetadataExt as _;
    let first = std::fs::metadata(&mine).unwrap();
    assert_eq!((first.uid(), first.mode() & 0o777), (0, 0o600));
    let run = record_to(&mine);
    assert_eq!(run.code(), 0, "{run:?}");
    let second = std::fs::metadata(&mine).unwrap();
    assert_ne!(second.ino(), first.ino(), "a new file took the name");
    assert_eq!(second.mode() & 0o777, 0o600);
    let kept = std::fs::symlink_metadata(&old).unwrap();
    assert_eq!((kept.ino(), kept.uid(), kept.mode() & 0o777), (first.ino(), 0, 0o600), "the first trace, as it was");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's own\n");
    tracer_tests::Trace::load(&mine);
    let exported = shared.path().join("e.json");
    let run = tracer(&["export", mine.to_str().unwrap(), "-o", exported.to_str().unwrap()]);
    assert_eq!(run.code(), 0, "{run:?}");
    assert_eq!(std::fs::metadata(&exported).unwrap().mode() & 0o777, 0o600);
    let run = tracer(&["export", mine.to_str().unwrap(), "-o", chrome.to_str().unwrap()]);
    run.assert_error(&format!("refusing to write the trace to {}: it is a symbolic link", chrome.display()));
    assert_eq!(names(shared.path()), ["e.json", "mine.jsonl", "mine.jsonl.old", "p.jsonl", "t.json", "t.jsonl"]);
}

/// `sleep 30` as nobody (in group adm), holding `n` connections to `socket` that each sent a
/// valid hello and read the agent's first answer (its terms, or a refusal): half-open
/// handshakes the kernel names as uid 65534. Opened between fork and exec, so that they are
/// nobody's; `spawn` returns once they all are.
fn half_open_handshakes_as_nobody(socket: &Path, n: usize) -> std::process::Child {
    use std::os::unix::{ffi::OsStrExt as _, process::CommandExt as _};
    let hello = tracer_user::cluster::protocol::encode(&Message::Hello {
        version: tracer_user::cluster::protocol::PROTOCOL_VERSION,
        padding: [0; 32],
    })
    .unwrap();
    let path = socket.as_os_str().as_bytes().to_vec();
    let mut command = Command::new("sleep");
    command.arg("30");
    // SAFETY: between fork and exec only system calls, on memory allocated before the fork.
    unsafe {
        command.pre_exec(move || {
            let groups = [4 as libc::gid_t];
            if libc::setgroups(1, groups.as_ptr()) != 0
                || libc::setresgid(65534, 65534, 65534) != 0
                || libc::setresuid(65534, 65534, 65534) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            let mut addr: libc::sockaddr_un = std::mem::zeroed();
            addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
            for (i, b) in path.iter().enumerate() {
                addr.sun_path[i] = *b as libc::c_char;
            }
            let mut answer = [0u8; 512];
            for _ in 0..n {
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
                if fd < 0 || libc::connect(fd, (&raw const addr).cast(), len) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Not `write`: a refused peer may be closed already, and SIGPIPE would end the flood.
                libc::send(fd, hello.as_ptr().cast(), hello.len(), libc::MSG_NOSIGNAL);
                libc::read(fd, answer.as_mut_ptr().cast(), answer.len());
            }
            Ok(())
        });
    }
    command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("the flood")
}

#[test]
fn a_flood_of_half_open_handshakes_from_one_uid_keeps_no_other_collector_out_and_is_told_why() {
    let dir = open_dir();
    let out_dir = temp_dir();
    std::fs::set_permissions(out_dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let agent = LocalAgent::start(dir.path(), "h", &["--socket-group", "adm"]);
    // Root's own handshake, started (hello sent, terms read) before the flood.
    let mut root = std::os::unix::net::UnixStream::connect(&agent.socket).unwrap();
    let hello = tracer_user::cluster::protocol::encode(&Message::Hello {
        version: tracer_user::cluster::protocol::PROTOCOL_VERSION,
        padding: [0; 32],
    })
    .unwrap();
    root.write_all(&hello).unwrap();
    let mut len = [0u8; 4];
    root.read_exact(&mut len).unwrap();
    let mut terms = vec![0u8; u32::from_le_bytes(len) as usize];
    root.read_exact(&mut terms).unwrap();
    assert!(matches!(tracer_user::cluster::protocol::decode(&terms), Ok(Message::Terms { .. })));

    // A hundred half-open handshakes from nobody: 8 wait (its share), the rest are refused.
    let mut flood = half_open_handshakes_as_nobody(&agent.socket, 100);
    agent.wait_for_log("8 connections from uid 65534 are authenticating already");
    let held = std::fs::read_dir(format!("/proc/{}/fd", flood.id())).unwrap().count();
    assert!(held >= 3 + 8, "the flood holds its connections: {held} descriptors");
    // Root's started handshake was not closed for any of them.
    root.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut byte = [0u8; 1];
    let still_open = matches!(root.read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    assert!(still_open, "root's handshake was closed: {}", agent.log());

    // Another collector of nobody's is told why, in the agent's words.
    let output = out_dir.path().join("x.jsonl").display().to_string();
    let spec = agent.spec("h");
    let victim = Background::start(&fixture("calls"), &["loop"]);
    let pid = format!("h:{}", victim.pid());
    let target = ["-p", pid.as_str(), "-d", "0.3"];
    let nobody = tracer_as_nobody(&collect_args(&spec, &output, &target), Some("4"));
    nobody.assert_error(
        "agent h refused the connection: 8 connections from uid 65534 are authenticating already: try again when one is done",
    );
    // Root's collector gets in and traces (within the flood's 5 s).
    let run = tracer(&collect_args(&spec, &output, &target));
    assert_eq!(run.code(), 0, "{run:?}");
    let _ = flood.kill();
    let _ = flood.wait();
}

#[test]
fn a_collector_over_the_bound_of_collectors_reads_why_it_is_refused() {
    let dir = temp_dir();
    let agent = LocalAgent::start(dir.path(), "h", &[]);
    let spec: tracer_user::cluster::collector::AgentSpec = agent.spec("h").parse().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let options = tracer_user::cluster::collector::ClientOptions::default();
    let _held: Vec<_> = (0..tracer_user::cluster::agent::MAX_COLLECTORS)
        .map(|_| runtime.block_on(tracer_user::cluster::collector::connect_session(&spec, &options)).unwrap())
        .collect();
    agent.wait_for_log("collector uid 0");
    let output = dir.path().join("x.jsonl").display().to_string();
    let victim = Background::start(&fixture("calls"), &["loop"]);
    let pid = format!("h:{}", victim.pid());
    tracer(&collect_args(&agent.spec("h"), &output, &["-p", &pid, "-d", "0.3"]))
        .assert_error("agent h refused the connection: 8 collectors are connected already");
}

/// A local user names a program's function and its directory with a terminal's control sequences
/// (`ESC ]0;...BEL` retitles the window, `\r` overwrites the line, `ESC [31m` colours what follows)
/// and waits for root to trace it. What `record` says on stderr, and what `report`, `calls` and
/// `list` print, show those characters as `\u{1b}` and never send them to root's terminal.
#[test]
fn names_carrying_terminal_controls_are_shown_not_acted_on() {
    let dir = temp_dir();
    let bin_dir = dir.path().join("bin\x1b[31m");
    std::fs::create_dir(&bin_dir).unwrap();
    let program = bin_dir.join("prog");
    let hostile = "fib\x1b]0;pwned\x07\r";
    let status = Command::new("objcopy")
        .arg(format!("--redefine-sym=fib={hostile}"))
        .arg(fixture("calls"))
        .arg(&program)
        .status()
        .expect("objcopy (binutils)");
    assert!(status.success());
    let trace = dir.path().join("t.jsonl");
    let trace = trace.to_str().unwrap();
    let recorded = tracer(&["record", "-f", "fib*,nosuchfn", "-o", trace, "--", program.to_str().unwrap(), "run", "0"]);
    assert_eq!(recorded.code(), 0, "{recorded:?}");
    // The trace keeps the name as the program has it: JSON escapes it.
    let calls = tracer_tests::Trace::load(Path::new(trace)).calls(hostile).len();
    assert_eq!(calls, 177);
    let report = tracer(&["report", trace]);
    let listing = tracer(&["calls", trace]);
    let list = tracer(&["list", program.to_str().unwrap(), "-f", "fib*"]);
    let shown_name = r"fib\u{1b}]0;pwned\u{7}\u{d}";
    let shown_dir = r"bin\u{1b}[31m/prog";
    assert!(
        recorded.stderr.contains(&format!(
            "no function matching 'nosuchfn' in any program the trace saw ({}/{shown_dir})",
            dir.path().display()
        )),
        "{}",
        recorded.stderr
    );
    assert!(report.stdout.contains(&format!("\n{shown_name}  ")), "{}", report.stdout);
    assert_eq!(listing.stdout.matches(shown_name).count(), 177, "{}", listing.stdout);
    assert!(list.stdout.contains(shown_name), "{}", list.stdout);
    for (what, text) in [
        ("record's stderr", &recorded.stderr),
        ("report", &report.stdout),
        ("calls", &listing.stdout),
        ("list", &list.stdout),
        ("list's stderr", &list.stderr),
    ] {
        let acted_on: Vec<char> = text.chars().filter(|c| c.is_control() && *c != '\n').collect();
        assert!(acted_on.is_empty(), "{what} sent {acted_on:?} to the terminal: {text}");
    }
}
