//! What a process is called: the trace's targets, then what spawns, execs and exits say. Every
//! output that names processes (report, calls, Chrome, Perfetto, speedscope, pcapng, OTLP) names
//! them with [`target_name`] and [`named_by`], so one process has one name everywhere.

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
        self.names.extend(start.targets.iter().filter_map(target_name));
    }

    /// Learns from a spawn or exit; returns whether a process's name changed.
    pub fn event(&mut self, e: &Event) -> Option<u32> {
        let (pid, comm) = named_by(e)?;
        if self.names.get(&pid).map(String::as_str) == Some(comm) {
            return None;
        }
        self.names.insert(pid, comm.to_string());
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

/// A target process and its name: a process's own `comm`, or for the command the tracer launched
/// what the kernel will call it (the executable's file name cut to 15 bytes, at a character
/// boundary); `None` for a binary, which is no process.
pub fn target_name(target: &TargetInfo) -> Option<(u32, String)> {
    match target {
        TargetInfo::Process { pid, comm, .. } => Some((*pid, comm.clone())),
        TargetInfo::Command { pid, exe, .. } => {
            let name = exe.rsplit('/').next().unwrap_or(exe);
            let cut = name.char_indices().map(|(i, c)| i + c.len_utf8()).take_while(|&end| end <= 15).last();
            Some((*pid, name[..cut.unwrap_or(0)].to_string()))
        }
        TargetInfo::Binary { .. } => None,
    }
}

/// The process an event names, and its name: a forked child starts with its parent's name, an
/// exec renames the process, and a process's exit says its last name (it may have renamed
/// itself). A thread's spawn or exit names the thread, not the process.
pub fn named_by(e: &Event) -> Option<(u32, &str)> {
    let (pid, comm) = match &e.data {
        EventData::Spawn(data::Spawn { child_pid, how: SpawnHow::Fork, comm, .. }) => (*child_pid, comm),
        EventData::Spawn(data::Spawn { how: SpawnHow::Exec, comm, .. }) => (e.pid, comm),
        EventData::Exit(data::Exit { thread: false, comm, .. }) => (e.pid, comm),
        _ => return None,
    };
    (!comm.is_empty()).then_some((pid, comm.as_str()))
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
        // Cut at 15 bytes, not characters, and never inside a character.
        let exe = |exe: &str| TargetInfo::Command { pid: 4, argv: vec!["argv0".into()], exe: exe.into() };
        assert_eq!(target_name(&exe("/opt/ééééééééé")), Some((4, "ééééééé".to_string())));
        assert_eq!(target_name(&exe("/opt/aaaaaaaaaaaaaaé")), Some((4, "aaaaaaaaaaaaaa".to_string())));
        assert_eq!(target_name(&exe("x")), Some((4, "x".to_string())));
        assert_eq!(target_name(&TargetInfo::Binary { path: "/bin/x".into() }), None);
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
