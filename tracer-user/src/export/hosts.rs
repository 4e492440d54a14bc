//! Several hosts in one visual trace. Process and thread ids are unique only within a host, so for
//! the visual formats each host's ids move into a range of their own (host `i` adds
//! `i * 2^22`, above any Linux pid) and process and thread names start with the host's name:
//! each host's processes sort together, under its name. A single-host trace passes through as is.

use std::io;

use crate::{
    event::{Event, EventData, TargetInfo, TraceEnd, TraceStart},
    sink::Sink,
};

/// Linux pids are below `PID_MAX_LIMIT` (2^22).
const PID_SPACE: u32 = 1 << 22;

pub struct HostGrouping<S> {
    inner: S,
    hosts: Vec<String>,
}

impl<S: Sink> HostGrouping<S> {
    pub fn new(inner: S) -> Self {
        HostGrouping { inner, hosts: Vec::new() }
    }

    fn index(&mut self, host: &str) -> u32 {
        match self.hosts.iter().position(|h| h == host) {
            Some(i) => i as u32,
            None => {
                self.hosts.push(host.to_string());
                self.hosts.len() as u32 - 1
            }
        }
    }
}

fn named(host: &str, comm: &mut String) {
    if !comm.is_empty() {
        *comm = format!("{host}: {comm}");
    }
}

impl<S: Sink> Sink for HostGrouping<S> {
    fn begin(&mut self, start: &TraceStart) -> io::Result<()> {
        if start.hosts.len() < 2 {
            return self.inner.begin(start);
        }
        let mut start = start.clone();
        self.hosts = start.hosts.iter().map(|h| h.name.clone()).collect();
        // The exporters name processes from the targets: give them each host's, moved.
        for (i, host) in start.hosts.iter().enumerate() {
            let offset = i as u32 * PID_SPACE;
            for target in &host.targets {
                start.targets.push(match target.clone() {
                    TargetInfo::Process { pid, comm, exe } => {
                        TargetInfo::Process { pid: pid + offset, comm: format!("{}: {comm}", host.name), exe }
                    }
                    TargetInfo::Command { pid, argv, exe } => TargetInfo::Command {
                        pid: pid + offset,
                        argv,
                        exe: format!("{}: {}", host.name, exe.rsplit('/').next().unwrap_or(&exe)),
                    },
                    other => other,
                });
            }
        }
        self.inner.begin(&start)
    }

    fn event(&mut self, event: &Event) -> io::Result<()> {
        if self.hosts.len() < 2 {
            return self.inner.event(event);
        }
        let offset = self.index(&event.host) * PID_SPACE;
        let host = event.host.clone();
        let mut e = event.clone();
        e.pid += offset;
        e.tid += offset;
        match &mut e.data {
            EventData::Spawn { parent_pid, child_pid, child_tid, comm, .. } => {
                *parent_pid += offset;
                *child_pid += offset;
                *child_tid += offset;
                named(&host, comm);
            }
            EventData::Exit { comm, .. } => named(&host, comm),
            EventData::Signal { sender_pid, target_pid, target_tid, .. } => {
                *sender_pid += offset;
                *target_pid += offset;
                *target_tid += offset;
            }
            _ => {}
        }
        self.inner.event(&e)
    }

    fn end(&mut self, end: &TraceEnd) -> io::Result<()> {
        self.inner.end(end)
    }
}
