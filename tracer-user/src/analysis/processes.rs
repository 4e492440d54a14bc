//! What a process is called: the trace's targets, then what spawns, execs and exits say.

use crate::event::data;
use std::collections::HashMap;

use crate::event::{Event, EventData, SpawnHow, TargetInfo, TraceStart};

/// The latest known command name (`comm`) of each process.
#[derive(Debug, Default)]
pub struct ProcessNames {
    names: HashMap<u32, String>,
}

impl ProcessNames {
    pub fn begin(&mut self, start: &TraceStart) {
        for target in &start.targets {
            match target {
                TargetInfo::Process { pid, comm, .. } => {
                    self.names.insert(*pid, comm.clone());
                }
                TargetInfo::Command { pid, exe, .. } => {
                    // The kernel's comm is the executable's name, cut to 15 bytes.
                    let name = exe.rsplit('/').next().unwrap_or(exe);
                    let cut = name.char_indices().take_while(|(i, c)| i + c.len_utf8() <= 15).count();
                    self.names.insert(*pid, name.chars().take(cut).collect());
                }
                TargetInfo::Binary { .. } => {}
            }
        }
    }

    /// Learns from a spawn or exit; returns whether a process's name changed.
    pub fn event(&mut self, e: &Event) -> Option<u32> {
        let (pid, comm) = match &e.data {
            // A forked child starts with its parent's name; an exec renames the process.
            EventData::Spawn(data::Spawn { child_pid, how: SpawnHow::Fork, comm, .. }) => (*child_pid, comm),
            EventData::Spawn(data::Spawn { how: SpawnHow::Exec, comm, .. }) => (e.pid, comm),
            EventData::Exit(data::Exit { thread: false, comm, .. }) => (e.pid, comm),
            _ => return None,
        };
        if comm.is_empty() || self.names.get(&pid) == Some(comm) {
            return None;
        }
        self.names.insert(pid, comm.clone());
        Some(pid)
    }

    pub fn get(&self, pid: u32) -> Option<&str> {
        self.names.get(&pid).map(String::as_str)
    }

    /// `"comm (pid)"`, or `"pid N"` for a process never named.
    pub fn label(&self, pid: u32) -> String {
        match self.get(pid) {
            Some(name) => format!("{name} ({pid})"),
            None => format!("pid {pid}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::test_events::ev;

    #[test]
    fn names_follow_targets_forks_execs_and_exits() {
        let mut names = ProcessNames::default();
        let mut start = crate::event::test_events::start(0);
        start.targets =
            vec![TargetInfo::Command { pid: 1, argv: vec![], exe: "/usr/bin/a_very_long_program_name".into() }];
        names.begin(&start);
        assert_eq!(names.label(1), "a_very_long_pro (1)");
        let fork = EventData::Spawn(data::Spawn {
            parent_pid: 1,
            child_pid: 2,
            child_tid: 2,
            how: SpawnHow::Fork,
            comm: "a_very_long_pro".into(),
            filename: None,
        });
        assert_eq!(names.event(&ev(1, 1, 1, fork)), Some(2));
        let exec = EventData::Spawn(data::Spawn {
            parent_pid: 1,
            child_pid: 2,
            child_tid: 2,
            how: SpawnHow::Exec,
            comm: "child".into(),
            filename: Some("/bin/child".into()),
        });
        assert_eq!(names.event(&ev(2, 2, 2, exec)), Some(2));
        assert_eq!(names.label(2), "child (2)");
        let exit =
            EventData::Exit(data::Exit { exit_code: Some(0), signal: None, thread: false, comm: "child".into() });
        assert_eq!(names.event(&ev(3, 2, 2, exit)), None, "same name");
        assert_eq!(names.label(3), "pid 3");
    }
}
