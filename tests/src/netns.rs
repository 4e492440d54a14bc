//! Hosts for multi-host tests: network namespaces on a bridge, made and removed by the test.
//!
//! Host `i` is namespace `trc<id>h<i>` with address `10.78.<id>.<i + 1>/24` on `eth0`, a veth
//! whose other end is on bridge `trc<id>br` in the root namespace, which holds `10.78.<id>.254`
//! (the collector's side). Only private test addresses are used, only inside these namespaces.

use std::{
    net::Ipv4Addr,
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
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
