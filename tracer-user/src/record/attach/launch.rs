//! Launching the traced command so that tracing covers its very first instruction.
//!
//! The child is forked, then waits on a pipe before it execs. The tracer adds its pid to the
//! traced set and attaches every probe, then [`StoppedChild::release`]s it. A second pipe (closed
//! on exec) carries the `errno` back if exec fails, so "cannot start" is reported as such.
//!
//! The child starts as if a shell had started it: every signal at its default disposition and
//! none blocked (the tracer itself ignores SIGPIPE, as every Rust program does, and ignored
//! signals survive exec), optionally as another user ([`RunAs`]).

use std::{
    ffi::{CString, OsString},
    os::{fd::AsRawFd as _, fd::OwnedFd, unix::ffi::OsStrExt as _},
    path::{Path, PathBuf},
};

use nix::{
    sys::wait::{WaitPidFlag, WaitStatus, waitpid},
    unistd::{ForkResult, Pid, fork, pipe2},
};

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("cannot start {path}")]
    Start { path: PathBuf, source: std::io::Error },
    #[error("command argument contains a NUL byte")]
    NulInArgument,
}

/// A forked child that has not exec'd yet.
pub struct StoppedChild {
    pid: u32,
    path: PathBuf,
    go: Option<OwnedFd>,
    exec_status: Option<OwnedFd>,
}

/// How a launched child ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildExit {
    Code(i32),
    Signal(i32),
}

impl ChildExit {
    /// As a shell reports it: the code, or 128 + the signal.
    pub fn shell_code(self) -> i32 {
        match self {
            ChildExit::Code(c) => c,
            ChildExit::Signal(s) => 128 + s,
        }
    }
}

/// `struct sigaction` as the kernel takes it (x86-64).
#[repr(C)]
struct KernelSigaction {
    handler: libc::sighandler_t,
    flags: u64,
    restorer: usize,
    mask: u64,
}

/// The user a command runs as (instead of the tracer's own).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// Forks a child that will exec `path` with `argv` (argv[0] included) once released, as
/// `run_as` if given.
pub fn spawn_stopped(path: &Path, argv: &[OsString], run_as: Option<&RunAs>) -> Result<StoppedChild, LaunchError> {
    let start_error = |source: std::io::Error| LaunchError::Start { path: path.to_owned(), source };
    // Everything the child needs is allocated before fork: after it, only async-signal-safe calls.
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| LaunchError::NulInArgument)?;
    let c_args: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_bytes()).map_err(|_| LaunchError::NulInArgument))
        .collect::<Result<_, _>>()?;
    let mut c_argv: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
    c_argv.push(std::ptr::null());

    let (go_read, go_write) = pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| start_error(e.into()))?;
    let (status_read, status_write) = pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| start_error(e.into()))?;
    let max_fd = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft.min(1 << 20) as i32)
        .unwrap_or(1024);
    let groups: Vec<libc::gid_t> = run_as.map(|r| r.groups.clone()).unwrap_or_default();

    // SAFETY: the child only calls async-signal-safe functions (fcntl, close, sigaction,
    // sigprocmask, read, setgroups, setgid, setuid, execv, write, _exit) on memory prepared above.
    match unsafe { fork() }.map_err(|e| start_error(e.into()))? {
        ForkResult::Child => {
            let mut byte = 0u8;
            // SAFETY: plain syscalls on valid fds and buffers.
            unsafe {
                // Close now what exec would close anyway: while this child waits, it must not hold
                // other threads' close-on-exec descriptors open (another launch's go pipe, say).
                for fd in 3..max_fd {
                    let flags = libc::fcntl(fd, libc::F_GETFD);
                    if flags >= 0
                        && flags & libc::FD_CLOEXEC != 0
                        && fd != go_read.as_raw_fd()
                        && fd != status_write.as_raw_fd()
                    {
                        libc::close(fd);
                    }
                }
                // Default dispositions (exec keeps ignored signals ignored) and an empty mask. The
                // raw system call, because the C library refuses 32 and 33 (its own), which the
                // tracer may have inherited ignored all the same.
                let default = KernelSigaction { handler: libc::SIG_DFL, flags: 0, restorer: 0, mask: 0 };
                for sig in 1..=64 {
                    if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                        libc::syscall(libc::SYS_rt_sigaction, sig, &raw const default, std::ptr::null_mut::<u8>(), 8);
                    }
                }
                let mut empty: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut empty);
                libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
                if libc::read(go_read.as_raw_fd(), (&raw mut byte).cast(), 1) != 1 {
                    // The tracer went away before releasing us: never run untraced.
                    libc::_exit(127);
                }
                let dropped = match run_as {
                    None => true,
                    Some(r) => {
                        libc::setgroups(groups.len(), groups.as_ptr()) == 0
                            && libc::setgid(r.gid) == 0
                            && libc::setuid(r.uid) == 0
                    }
                };
                if dropped {
                    libc::execv(c_path.as_ptr(), c_argv.as_ptr());
                }
                let errno = *libc::__errno_location();
                libc::write(status_write.as_raw_fd(), (&raw const errno).cast(), size_of::<i32>());
                libc::_exit(127);
            }
        }
        ForkResult::Parent { child } => {
            drop(go_read);
            drop(status_write);
            Ok(StoppedChild {
                pid: child.as_raw() as u32,
                path: path.to_owned(),
                go: Some(go_write),
                exec_status: Some(status_read),
            })
        }
    }
}

impl StoppedChild {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Lets the child exec, and reports whether exec succeeded.
    pub fn release(mut self) -> Result<u32, LaunchError> {
        let go = self.go.take().expect("released once");
        let status = self.exec_status.take().expect("released once");
        let start_error = |source| LaunchError::Start { path: self.path.clone(), source };
        nix::unistd::write(&go, &[1]).map_err(|e| start_error(e.into()))?;
        drop(go);
        let mut errno = [0u8; 4];
        let n = loop {
            match nix::unistd::read(&status, &mut errno) {
                Err(nix::errno::Errno::EINTR) => continue,
                other => break other.map_err(|e| start_error(e.into()))?,
            }
        };
        if n == 0 {
            return Ok(self.pid);
        }
        let _ = waitpid(Pid::from_raw(self.pid as i32), None);
        Err(start_error(std::io::Error::from_raw_os_error(i32::from_ne_bytes(errno))))
    }
}

impl Drop for StoppedChild {
    fn drop(&mut self) {
        // Not released: closing the pipe makes the child exit without exec'ing; reap it.
        if self.go.take().is_some() {
            let _ = waitpid(Pid::from_raw(self.pid as i32), None);
        }
    }
}

/// Reaps `pid` if it has exited (without blocking).
pub fn try_reap(pid: u32) -> Option<ChildExit> {
    match waitpid(Pid::from_raw(pid as i32), Some(WaitPidFlag::WNOHANG)) {
        Ok(WaitStatus::Exited(_, code)) => Some(ChildExit::Code(code)),
        Ok(WaitStatus::Signaled(_, sig, _)) => Some(ChildExit::Signal(sig as i32)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(pid: u32) -> ChildExit {
        loop {
            if let Some(exit) = try_reap(pid) {
                return exit;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn runs_only_when_released() {
        let dir = std::env::temp_dir().join(format!("tracer-launch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let marker = dir.join("ran");
        let script = format!("touch {}; exit 7", marker.display());
        let child = spawn_stopped(Path::new("/bin/sh"), &["sh".into(), "-c".into(), script.into()], None).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!marker.exists(), "the child ran before it was released");
        let pid = child.release().unwrap();
        assert_eq!(wait(pid), ChildExit::Code(7));
        assert!(marker.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn dropping_an_unreleased_child_never_runs_it() {
        let child = spawn_stopped(Path::new("/bin/true"), &["true".into()], None).unwrap();
        let pid = child.pid();
        drop(child);
        assert!(!crate::record::resolve::targets::process_alive(pid));
    }

    #[test]
    fn exec_failure_is_reported() {
        let child = spawn_stopped(Path::new("/etc/passwd"), &["passwd".into()], None).unwrap();
        let err = anyhow::Error::from(child.release().unwrap_err());
        assert_eq!(format!("{err:#}"), "cannot start /etc/passwd: Permission denied (os error 13)");
    }

    #[test]
    fn signals_are_reported_as_such() {
        let child =
            spawn_stopped(Path::new("/bin/sh"), &["sh".into(), "-c".into(), "kill -9 $$".into()], None).unwrap();
        let pid = child.release().unwrap();
        assert_eq!(wait(pid), ChildExit::Signal(9));
        assert_eq!(ChildExit::Signal(9).shell_code(), 137);
    }

    /// The tracer ignores SIGPIPE (Rust does at start-up) and may block signals: the command
    /// inherits neither.
    #[test]
    fn the_command_starts_with_default_signals_and_an_empty_mask() {
        let dir = std::env::temp_dir().join(format!("tracer-launch-sig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("status");
        let mut blocked = nix::sys::signal::SigSet::empty();
        blocked.add(nix::sys::signal::Signal::SIGUSR2);
        blocked.thread_block().unwrap();
        let script = format!("grep -E '^Sig(Blk|Ign)' /proc/self/status > {}", out.display());
        let child = spawn_stopped(Path::new("/bin/sh"), &["sh".into(), "-c".into(), script.into()], None).unwrap();
        blocked.thread_unblock().unwrap();
        assert_eq!(wait(child.release().unwrap()), ChildExit::Code(0));
        let status = std::fs::read_to_string(&out).unwrap();
        assert_eq!(status, "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_command_can_run_as_another_user() {
        let script = "test \"$(id -u):$(id -g):$(id -G)\" = '65534:65534:65534 4'";
        let nobody = RunAs { uid: 65534, gid: 65534, groups: vec![4] };
        let child =
            spawn_stopped(Path::new("/bin/sh"), &["sh".into(), "-c".into(), script.into()], Some(&nobody)).unwrap();
        assert_eq!(wait(child.release().unwrap()), ChildExit::Code(0));
    }
}
