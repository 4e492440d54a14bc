//! What the user asked to trace, checked and resolved: processes, executables, a command; the ELF
//! file a module name means ([`modules`]); and launching a traced command stopped at its first
//! instruction ([`launch`]; for the agent, as a service manager would, [`detached`]).

pub mod detached;
pub mod launch;
pub mod modules;

use std::{
    ffi::{OsStr, OsString},
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use tracer_common::InodeKey;

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("no process with pid {0} exists")]
    NoSuchProcess(u32),
    #[error("pid {pid} is a kernel thread ({comm}): it runs no user code to trace")]
    KernelThread { pid: u32, comm: String },
    #[error("pid {0} is the tracer itself")]
    SelfTrace(u32),
    #[error("cannot inspect process {pid}")]
    Inspect { pid: u32, source: std::io::Error },
    #[error("{0} does not exist")]
    NoSuchFile(PathBuf),
    #[error("{0} is not a regular file")]
    NotAFile(PathBuf),
    #[error("{0} is not executable")]
    NotExecutable(PathBuf),
    #[error("command '{0}' was not found in PATH")]
    CommandNotFound(String),
    #[error("cannot read {path}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// A running process, as found in `/proc`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    pub comm: String,
    /// The executable: its path if it still exists, else `/proc/PID/exe` (which the kernel resolves
    /// to the file even when it was deleted).
    pub exe: PathBuf,
}

/// A file's identity (device and inode), as `stat` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

impl FileId {
    pub fn of(path: &Path) -> Result<FileId, TargetError> {
        let meta = std::fs::metadata(path).map_err(|source| io_error(path, source))?;
        Ok(FileId { dev: meta.dev(), ino: meta.ino() })
    }

    /// The key the kernel side compares with `inode->i_sb->s_dev` and `inode->i_ino`: the kernel
    /// encodes a `dev_t` as `major << 20 | minor`, user space's `st_dev` differently.
    pub fn kernel_key(&self) -> InodeKey {
        let (major, minor) = (libc::major(self.dev) as u64, libc::minor(self.dev) as u64);
        InodeKey { dev: (major << 20) | minor, ino: self.ino }
    }
}

fn io_error(path: &Path, source: std::io::Error) -> TargetError {
    if source.kind() == std::io::ErrorKind::NotFound {
        TargetError::NoSuchFile(path.to_owned())
    } else {
        TargetError::Io { path: path.to_owned(), source }
    }
}

/// The thread-group id of `pid` (a user may name a thread; its whole process is traced).
fn tgid_of(pid: u32) -> Result<u32, TargetError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            TargetError::NoSuchProcess(pid)
        } else {
            TargetError::Inspect { pid, source }
        }
    })?;
    Ok(status.lines().find_map(|l| l.strip_prefix("Tgid:")).and_then(|v| v.trim().parse().ok()).unwrap_or(pid))
}

/// Looks a process up by pid (or by one of its threads' ids).
pub fn inspect_process(pid: u32) -> Result<Process, TargetError> {
    if pid == 0 {
        return Err(TargetError::NoSuchProcess(0));
    }
    let pid = tgid_of(pid)?;
    if pid == std::process::id() {
        return Err(TargetError::SelfTrace(pid));
    }
    // The process can exit between any two of these reads (a slow or loaded host makes that
    // likely): a read that fails after it is gone means it does not exist, not that it could not
    // be inspected.
    let inspect = |source| {
        if !process_alive(pid) { TargetError::NoSuchProcess(pid) } else { TargetError::Inspect { pid, source } }
    };
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).map_err(inspect)?.trim_end().to_string();
    let link = PathBuf::from(format!("/proc/{pid}/exe"));
    let exe = match std::fs::read_link(&link) {
        Ok(target) if target.exists() => target,
        Ok(_) => link,
        Err(_) if is_kernel_thread(pid) => return Err(TargetError::KernelThread { pid, comm }),
        Err(source) => return Err(inspect(source)),
    };
    Ok(Process { pid, comm, exe })
}

/// Whether a process with this pid is running: it exists and is not a zombie (a zombie has
/// exited; only its parent has not collected it yet).
pub fn process_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // "pid (comm) state ...": comm may contain anything, so look after the last ')'.
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z' | 'X') | None)
}

/// Whether `pid` is a kernel thread (`PF_KTHREAD` in the flags of `/proc/PID/stat`).
fn is_kernel_thread(pid: u32) -> bool {
    const PF_KTHREAD: u64 = 0x0020_0000;
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // After "pid (comm) ": state, ppid, pgrp, session, tty_nr, tpgid, flags.
    let flags = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(6)?.parse::<u64>().ok());
    flags.is_some_and(|f| f & PF_KTHREAD != 0)
}

/// Every process whose executable is `file`.
pub fn processes_running(file: FileId) -> Vec<Process> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let own = std::process::id();
    let mut found: Vec<Process> = dir
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != own)
        .filter(|pid| {
            std::fs::metadata(format!("/proc/{pid}/exe"))
                .map(|m| m.dev() == file.dev && m.ino() == file.ino)
                .unwrap_or(false)
        })
        .filter_map(|pid| inspect_process(pid).ok())
        .collect();
    found.sort_by_key(|p| p.pid);
    found
}

/// An executable named by the user: must exist, be a regular file and be executable.
pub fn check_executable(path: &Path) -> Result<PathBuf, TargetError> {
    let meta = std::fs::metadata(path).map_err(|source| io_error(path, source))?;
    if !meta.is_file() {
        return Err(TargetError::NotAFile(path.to_owned()));
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(TargetError::NotExecutable(path.to_owned()));
    }
    std::fs::canonicalize(path).map_err(|source| io_error(path, source))
}

/// The executable a command line starts: a path as given, or a name looked up in `PATH`.
pub fn resolve_command(program: &OsStr) -> Result<PathBuf, TargetError> {
    let as_path = Path::new(program);
    if as_path.components().count() > 1 || program.to_string_lossy().contains('/') {
        return check_executable(as_path);
    }
    let found =
        which::which(program).map_err(|_| TargetError::CommandNotFound(program.to_string_lossy().into_owned()))?;
    check_executable(&found)
}

/// As [`resolve_command`] for a command started elsewhere: a relative path from `cwd`, a name
/// looked up in `search_path` (a detached command's, not the tracer's own `PATH`).
pub fn resolve_command_in(program: &OsStr, search_path: &str, cwd: &Path) -> Result<PathBuf, TargetError> {
    let as_path = Path::new(program);
    if as_path.components().count() > 1 || program.to_string_lossy().contains('/') {
        return check_executable(&cwd.join(as_path));
    }
    let found = which::which_in(program, Some(search_path), cwd)
        .map_err(|_| TargetError::CommandNotFound(program.to_string_lossy().into_owned()))?;
    check_executable(&found)
}

/// Shared libraries mapped executable by a process, from `/proc/PID/maps`.
pub fn mapped_files(pid: u32) -> Vec<PathBuf> {
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else { return Vec::new() };
    let mut files: Vec<PathBuf> = maps
        .lines()
        .filter_map(|line| {
            // address perms offset dev inode path
            let mut fields = line.split_whitespace();
            let perms = fields.nth(1)?;
            let path = fields.nth(3)?;
            (perms.contains('x') && path.starts_with('/')).then(|| PathBuf::from(path))
        })
        .collect();
    files.sort();
    files.dedup();
    files
}

/// A command line to launch, as `OsString`s.
pub fn command_display(argv: &[OsString]) -> Vec<String> {
    argv.iter().map(|a| a.to_string_lossy().into_owned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `sleep` child, returned once it has exec'd.
    fn sleeping_child() -> std::process::Child {
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let sleep = resolve_command(OsStr::new("sleep")).unwrap();
        for _ in 0..500 {
            if std::fs::read_link(format!("/proc/{}/exe", child.id())).is_ok_and(|exe| exe == sleep) {
                return child;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("sleep did not start");
    }

    #[test]
    fn finds_processes_by_executable() {
        // The scan skips the tracer's own pid, so look for a child.
        let mut child = sleeping_child();
        let sleep = resolve_command(OsStr::new("sleep")).unwrap();
        let found = processes_running(FileId::of(&sleep).unwrap());
        let _ = child.kill();
        let _ = child.wait();
        assert!(found.iter().any(|p| p.pid == child.id() && p.comm == "sleep"), "{found:?}");
    }

    #[test]
    fn zombies_are_not_alive() {
        let mut child = sleeping_child();
        assert!(process_alive(child.id()));
        child.kill().unwrap();
        // Not yet reaped: a zombie.
        for _ in 0..500 {
            if !process_alive(child.id()) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert!(!process_alive(child.id()));
        assert!(std::fs::metadata(format!("/proc/{}", child.id())).is_ok(), "still a zombie");
        child.wait().unwrap();
        assert!(!process_alive(child.id()));
    }

    #[test]
    fn inspects_processes_and_rejects_missing_ones() {
        let mut child = sleeping_child();
        let p = inspect_process(child.id()).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(p.comm, "sleep");
        assert!(p.exe.ends_with("sleep"), "{p:?}");
        // pid_max is at most 2^22: this pid cannot exist.
        assert!(matches!(inspect_process(5_000_000), Err(TargetError::NoSuchProcess(5_000_000))));
        assert!(matches!(inspect_process(0), Err(TargetError::NoSuchProcess(0))));
        assert!(matches!(inspect_process(std::process::id()), Err(TargetError::SelfTrace(_))));
        // kthreadd is pid 2 in the initial pid namespace, where the tracer runs.
        let err = inspect_process(2).unwrap_err();
        assert_eq!(err.to_string(), "pid 2 is a kernel thread (kthreadd): it runs no user code to trace");
    }

    #[test]
    fn a_process_that_exits_while_inspected_does_not_exist() {
        let mut child = sleeping_child();
        child.kill().unwrap();
        child.wait().unwrap();
        // Reaped: every /proc read now fails as it would midway through an inspection.
        assert!(matches!(inspect_process(child.id()), Err(TargetError::NoSuchProcess(_))));
        // A zombie still has /proc/PID/status and comm, but no exe: the case of the race.
        let mut zombie = sleeping_child();
        zombie.kill().unwrap();
        while process_alive(zombie.id()) {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let result = inspect_process(zombie.id());
        zombie.wait().unwrap();
        assert!(matches!(result, Err(TargetError::NoSuchProcess(_))), "{result:?}");
    }

    #[test]
    fn resolves_commands() {
        assert!(resolve_command(OsStr::new("sh")).unwrap().is_absolute());
        assert!(matches!(resolve_command(OsStr::new("no-such-command-xyz")), Err(TargetError::CommandNotFound(_))));
        assert!(matches!(resolve_command(OsStr::new("/no/such/file")), Err(TargetError::NoSuchFile(_))));
        assert!(matches!(resolve_command(OsStr::new("/etc")), Err(TargetError::NotAFile(_))));
        assert!(matches!(resolve_command(OsStr::new("/etc/passwd")), Err(TargetError::NotExecutable(_))));
    }

    #[test]
    fn kernel_dev_encoding() {
        // major 8, minor 1 (sda1): user-space st_dev 0x801, kernel 8 << 20 | 1.
        let id = FileId { dev: libc::makedev(8, 1), ino: 5 };
        assert_eq!(id.kernel_key(), InodeKey { dev: (8 << 20) | 1, ino: 5 });
    }

    #[test]
    fn lists_mapped_libraries() {
        let files = mapped_files(std::process::id());
        assert!(files.iter().any(|f| f.to_string_lossy().contains("libc")), "{files:?}");
    }
}
