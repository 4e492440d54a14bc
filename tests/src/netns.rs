//! Hosts for multi-host tests: network namespaces on a bridge, made and removed by the test.
//!
//! Host `i` is namespace `trc<id>h<i>` with address `10.78.<id>.<i + 1>/24` on `eth0`, a veth
//! whose other end is on bridge `trc<id>br` in the root namespace, which holds `10.78.<id>.254`
//! (the collector's side). Only private test addresses are used, only inside these namespaces.

use std::{
    fs::File,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Removes what a previous run may have left, quietly.
fn ip_quiet(args: &[&str]) {
    let _ =
        Command::new("ip").args(args).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).status();
}

fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("run ip (iproute2)");
    assert!(status.success(), "ip {args:?} failed");
}

pub struct Network {
    id: u32,
    pub hosts: Vec<Host>,
}

pub struct Host {
    pub ns: String,
    pub addr: Ipv4Addr,
    /// The veth end in the root namespace: take it down to cut the host off.
    pub link: String,
}

impl Network {
    pub fn new(hosts: usize) -> Network {
        // Distinct per test process and between consecutive networks (tests run one at a time), and
        // in 100..=227: one octet of an address, three digits of an interface name.
        let id = 100 + (std::process::id() % 64) * 2 + NEXT.fetch_add(1, Ordering::Relaxed) % 2;
        let bridge = format!("trc{id}br");
        ip_quiet(&["link", "del", &bridge]);
        ip(&["link", "add", &bridge, "type", "bridge"]);
        ip(&["addr", "add", &format!("10.78.{id}.254/24"), "dev", &bridge]);
        ip(&["link", "set", &bridge, "up"]);
        let mut net = Network { id, hosts: Vec::new() };
        for i in 0..hosts {
            let ns = format!("trc{id}h{i}");
            let link = format!("trc{id}v{i}");
            ip_quiet(&["netns", "del", &ns]);
            ip(&["netns", "add", &ns]);
            ip(&["link", "add", &link, "type", "veth", "peer", "name", "eth0", "netns", &ns]);
            ip(&["link", "set", &link, "master", &bridge, "up"]);
            let addr = Ipv4Addr::new(10, 78, id as u8, i as u8 + 1);
            ip(&["-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            net.hosts.push(Host { ns, addr, link });
        }
        net
    }

    /// A command run inside host `i`'s namespace.
    pub fn command(&self, i: usize, program: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.hosts[i].ns]).arg(program);
        c
    }

    /// Cuts host `i` off the network, or reconnects it.
    pub fn set_link(&self, i: usize, up: bool) {
        ip(&["link", "set", &self.hosts[i].link, if up { "up" } else { "down" }]);
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for h in &self.hosts {
            ip_quiet(&["netns", "del", &h.ns]);
            ip_quiet(&["link", "del", &h.link]);
        }
        ip_quiet(&["link", "del", &format!("trc{}br", self.id)]);
    }
}

/// Where the tests' agents listen, on their host's address.
pub const AGENT_PORT: u16 = 7070;

/// A `tracer agent` in a host's namespace, its stderr in a file; stopped when dropped (SIGTERM,
/// then SIGKILL after 10 s).
pub struct NetAgent {
    child: Child,
    log: PathBuf,
}

impl NetAgent {
    /// `tracer agent --listen ADDR:AGENT_PORT --allow-commands EXTRA..` in host `host`'s namespace
    /// (the tests launch their workloads through the agents), its stderr in `dir/agent-NAME.log`.
    pub fn start(net: &Network, host: usize, name: &str, dir: &Path, extra: &[&str]) -> NetAgent {
        let mut command = net.command(host, &crate::tracer_bin());
        command
            .args(["agent", "--listen", &format!("{}:{AGENT_PORT}", net.hosts[host].addr), "--allow-commands"])
            .args(extra);
        NetAgent::spawn(command, dir.join(format!("agent-{name}.log")))
    }

    /// Runs `command`, which must exec the agent (so that the child's pid is the agent's, as `ip
    /// netns exec` does), its stderr in `log`; returns once it listens.
    pub fn spawn(mut command: Command, log: PathBuf) -> NetAgent {
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .expect("start agent");
        let agent = NetAgent { child, log };
        agent.wait_for_log("listening on");
        agent
    }

    /// The agent's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the agent has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (up to 40 s) for `text` in the agent's log; returns the log.
    pub fn wait_for_log(&self, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let log = self.log();
            if log.contains(text) {
                return log;
            }
            assert!(Instant::now() < deadline, "agent never logged {text:?}: {log}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NetAgent {
    fn drop(&mut self) {
        // The child is the agent (see `spawn`).
        crate::stop_child(&mut self.child);
    }
}
