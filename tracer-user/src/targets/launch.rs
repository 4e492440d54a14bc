//! Launching the traced command so that tracing covers its very first instruction.
//!
//! The child is forked, then waits on a pipe before it execs. The tracer adds its pid to the
//! traced set and attaches every probe, then [`StoppedChild::release`]s it. A second pipe (closed
//! on exec) carries the step that failed and its `errno` back if the child cannot exec, so
//! "cannot start" is reported as such.
//!
//! The child starts as if a shell had started it: every signal at its default disposition and
//! none blocked (the tracer itself ignores SIGPIPE, as every Rust program does, and ignored
//! signals survive exec). `tracer record -- CMD` gives it the user's terminal, descriptors,
//! working directory and environment ([`Start::Inherit`]); the agent starts it detached, as
//! another user if so ([`Start::Detached`], see [`super::detached`]).
//!
//! Everything the child needs is allocated before `fork`: after it, only async-signal-safe calls
//! (raw system calls on memory prepared before), since another thread may have held the
//! allocator's lock at the fork.

use std::{
    ffi::{CString, OsString},
    os::{
        fd::{AsRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::{Path, PathBuf},
};

use nix::{
    sys::wait::{WaitPidFlag, WaitStatus, waitpid},
    unistd::{ForkResult, Pid, fork, pipe2},
};

use super::detached::{Detached, Limit, env_entry};

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("cannot start {path}")]
    Start { path: PathBuf, source: std::io::Error },
    #[error("command argument contains a NUL byte")]
    NulInArgument,
    #[error("cannot set up the command's stdin, stdout and stderr")]
    Output { source: std::io::Error },
    #[error("uid {uid} cannot enter the working directory {dir}")]
    WorkingDirectory { dir: PathBuf, uid: u32, source: std::io::Error },
    #[error("cannot start {path}: {step} failed")]
    Prepare { path: PathBuf, step: &'static str, source: std::io::Error },
}

/// How the command starts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Start {
    /// With the tracer's terminal, descriptors, working directory, environment and user
    /// (`tracer record -- CMD`: the user's own command, as its shell would start it).
    #[default]
    Inherit,
    /// The same, but its stdout is the tracer's stderr: the tracer's stdout carries the trace
    /// (`tracer record -o - -- CMD | jq`), which the command's output must not get into.
    InheritStdoutToStderr,
    /// Detached from the tracer (the agent's launches).
    Detached(Detached),
}

/// The read ends of a detached command's stdout and stderr (non-blocking, close-on-exec).
#[derive(Debug)]
pub struct OutputPipes {
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// A forked child that has not exec'd yet.
pub struct StoppedChild {
    pid: u32,
    path: PathBuf,
    /// A detached child's stdout and stderr, until taken.
    output: Option<OutputPipes>,
    /// The working directory and user of a detached child, for the message if it cannot enter it.
    cwd: Option<(PathBuf, u32)>,
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

/// The step of the child's preparation that failed, as it reports it on the status pipe.
#[derive(Clone, Copy)]
#[repr(i32)]
enum Step {
    Exec = 0,
    Session = 1,
    Stdio = 2,
    Limits = 3,
    Credentials = 4,
    WorkingDirectory = 5,
    NoNewPrivs = 6,
}

impl Step {
    fn from_raw(raw: i32) -> Step {
        [Step::Session, Step::Stdio, Step::Limits, Step::Credentials, Step::WorkingDirectory, Step::NoNewPrivs]
            .into_iter()
            .find(|s| *s as i32 == raw)
            .unwrap_or(Step::Exec)
    }

    fn name(self) -> &'static str {
        match self {
            Step::Exec => "exec",
            Step::Session => "setsid",
            Step::Stdio => "setting up its stdin, stdout and stderr",
            Step::Limits => "setting its resource limits",
            Step::Credentials => "switching to its user",
            Step::WorkingDirectory => "entering its working directory",
            Step::NoNewPrivs => "PR_SET_NO_NEW_PRIVS",
        }
    }
}

/// What a detached child needs, prepared before fork.
struct DetachedPrepared {
    stdin: OwnedFd,
    /// The write ends of its stdout and stderr pipes.
    stdout: OwnedFd,
    stderr: OwnedFd,
    cwd: CString,
    /// Keeps the strings `envp` points to.
    _env: Vec<CString>,
    envp: Vec<*const libc::c_char>,
    limits: Vec<Limit>,
    no_new_privs: bool,
}

fn prepare_detached(d: &Detached) -> Result<(DetachedPrepared, OutputPipes), LaunchError> {
    let output_error = |source| LaunchError::Output { source };
    let stdin = std::fs::File::open("/dev/null").map_err(output_error)?.into();
    // Pipes, not a file: the agent reads them as they fill, so that it can stream them. The read
    // ends are non-blocking (the agent's one thread never waits on them); the command's ends
    // stay blocking, as a pipe a shell gives it is.
    let pipe = || -> Result<(OwnedFd, OwnedFd), LaunchError> {
        let (read, write) = pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| output_error(e.into()))?;
        let flags = nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(&read, nix::fcntl::FcntlArg::F_SETFL(flags)).map_err(|e| output_error(e.into()))?;
        Ok((read, write))
    };
    let (stdout_read, stdout) = pipe()?;
    let (stderr_read, stderr) = pipe()?;
    let cwd = CString::new(d.cwd.as_os_str().as_bytes()).map_err(|_| LaunchError::NulInArgument)?;
    let env: Vec<CString> =
        d.env.iter().map(|(n, v)| env_entry(n, v).ok_or(LaunchError::NulInArgument)).collect::<Result<_, _>>()?;
    let mut envp: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    let prepared = DetachedPrepared {
        stdin,
        stdout,
        stderr,
        cwd,
        _env: env,
        envp,
        limits: super::detached::default_limits(),
        no_new_privs: d.no_new_privs,
    };
    Ok((prepared, OutputPipes { stdout: stdout_read, stderr: stderr_read }))
}

/// Closes every descriptor from 3 up but the two in `keep` (both at least 3).
///
/// # Safety
/// Async-signal-safe: raw system calls only.
unsafe fn close_all_but(keep: [i32; 2], max_fd: i32) {
    let mut low = 3;
    for k in [keep[0].min(keep[1]), keep[0].max(keep[1])] {
        if k > low {
            // SAFETY: as this function's.
            unsafe { close_range(low, k - 1, max_fd) };
        }
        low = low.max(k + 1);
    }
    // SAFETY: as this function's.
    unsafe { close_range(low, u32::MAX as i32, max_fd) };
}

/// `close_range(first, last, 0)`, or a loop of `close` up to `max_fd` on a kernel without it
/// (before 5.9).
///
/// # Safety
/// Async-signal-safe: raw system calls only.
unsafe fn close_range(first: i32, last: i32, max_fd: i32) {
    // SAFETY: the system call takes integers.
    if unsafe { libc::syscall(libc::SYS_close_range, first as u32, last as u32, 0u32) } == 0 {
        return;
    }
    let end = if last as u32 == u32::MAX { max_fd } else { last.saturating_add(1).min(max_fd) };
    for fd in first..end {
        // SAFETY: closing a descriptor number; one not open is EBADF.
        unsafe { libc::close(fd) };
    }
}

/// Closes the close-on-exec descriptors from 3 up but those in `keep`; the others (the user's,
/// which `Start::Inherit` passes on) stay. They are found in `/proc/self/fd` (a few dozen), not by
/// asking each number up to the descriptor limit, which the tracer raises for its probes (to
/// tens of thousands: a `fcntl` each, in every launch); without `/proc`, by that loop.
///
/// # Safety
/// Async-signal-safe: raw system calls only, on a buffer on the stack.
unsafe fn close_cloexec_but(keep: [i32; 5], max_fd: i32) {
    let close_if_cloexec = |fd: i32| {
        // SAFETY: fcntl and close on a descriptor number; one not open is EBADF.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 && flags & libc::FD_CLOEXEC != 0 && !keep.contains(&fd) {
                libc::close(fd);
            }
        }
    };
    // SAFETY: a constant NUL-terminated path.
    let dir = unsafe { libc::open(c"/proc/self/fd".as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if dir < 0 {
        (3..max_fd).for_each(close_if_cloexec);
        return;
    }
    // `linux_dirent64`s: inode (8 bytes), offset (8), record length (2), type (1), NUL-terminated
    // name. Procfs lists a directory of descriptors by number, so closing one while reading does
    // not make the listing skip another.
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: the buffer's length is passed with it.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, dir, buf.as_mut_ptr(), buf.len()) };
        if n <= 0 {
            break;
        }
        let mut at = 0usize;
        while at + 19 < n as usize {
            let len = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
            if len == 0 {
                break;
            }
            let mut fd: i32 = 0;
            let mut digits = 0;
            for &b in buf[at + 19..(at + len).min(n as usize)].iter().take_while(|&&b| b != 0) {
                if !b.is_ascii_digit() || digits == 9 {
                    digits = 0;
                    break;
                }
                fd = fd * 10 + (b - b'0') as i32;
                digits += 1;
            }
            if digits > 0 && fd >= 3 && fd != dir {
                close_if_cloexec(fd);
            }
            at += len;
        }
    }
    // SAFETY: our own descriptor, closed once.
    unsafe { libc::close(dir) };
}

/// Reports the step that failed, with `errno`, on the status pipe, and exits.
///
/// # Safety
/// Async-signal-safe: raw system calls only.
unsafe fn fail(status: i32, step: Step) -> ! {
    // SAFETY: errno is this thread's; write and _exit take plain values.
    unsafe {
        let report = [step as i32, *libc::__errno_location()];
        libc::write(status, report.as_ptr().cast(), size_of_val(&report));
        libc::_exit(127)
    }
}

/// `fd`, or a copy of it at 3 or above if it is one of 0-2 (-1 if that fails).
///
/// # Safety
/// Async-signal-safe: raw system calls only.
unsafe fn above_stdio(fd: i32) -> i32 {
    // SAFETY: fcntl on a descriptor number.
    if fd < 3 { unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) } } else { fd }
}

/// Forks a child that will exec `path` with `argv` (`argv[0]` included) once released, started as
/// `start` says.
pub fn spawn_stopped(path: &Path, argv: &[OsString], start: &Start) -> Result<StoppedChild, LaunchError> {
    let start_error = |source: std::io::Error| LaunchError::Start { path: path.to_owned(), source };
    // Everything the child needs is allocated before fork: after it, only async-signal-safe calls.
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| LaunchError::NulInArgument)?;
    let c_args: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_bytes()).map_err(|_| LaunchError::NulInArgument))
        .collect::<Result<_, _>>()?;
    let mut c_argv: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
    c_argv.push(std::ptr::null());
    let stdout_to_stderr = matches!(start, Start::InheritStdoutToStderr);
    let (detached, output) = match start {
        Start::Inherit | Start::InheritStdoutToStderr => (None, None),
        Start::Detached(d) => {
            let (prepared, pipes) = prepare_detached(d)?;
            (Some((d, prepared)), Some(pipes))
        }
    };

    let (go_read, go_write) = pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| start_error(e.into()))?;
    let (status_read, status_write) = pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| start_error(e.into()))?;
    let max_fd = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft.min(1 << 20) as i32)
        .unwrap_or(1024);
    let groups: Vec<libc::gid_t> = detached.as_ref().map(|(d, _)| d.user.groups.clone()).unwrap_or_default();
    let cwd = detached.as_ref().map(|(d, _)| (d.cwd.clone(), d.user.uid));

    // SAFETY: the child only calls async-signal-safe functions (raw system calls, sigemptyset,
    // _exit) on memory prepared above.
    match unsafe { fork() }.map_err(|e| start_error(e.into()))? {
        ForkResult::Child => {
            let mut byte = 0u8;
            let mut go = go_read.as_raw_fd();
            let mut status = status_write.as_raw_fd();
            // SAFETY: plain syscalls on valid fds and buffers.
            unsafe {
                let (mut stdin, mut stdout, mut stderr) = match &detached {
                    Some((_, p)) => (p.stdin.as_raw_fd(), p.stdout.as_raw_fd(), p.stderr.as_raw_fd()),
                    None => (-1, -1, -1),
                };
                // Close now what exec would close anyway: while this child waits, it must not hold
                // other threads' close-on-exec descriptors open (another launch's go pipe, say, or
                // the read ends of its own output pipes).
                close_cloexec_but([go, status, stdin, stdout, stderr], max_fd);
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
                if let Some((_, p)) = &detached {
                    // Its own session: no controlling terminal, so no TIOCSTI into the agent's,
                    // and no signal from it.
                    if libc::setsid() < 0 {
                        fail(status, Step::Session);
                    }
                    // Out of the way of 0-2 before those are replaced (an agent started with a
                    // standard descriptor closed got one of these numbers).
                    status = above_stdio(status);
                    if status < 0 {
                        libc::_exit(127);
                    }
                    (go, stdin) = (above_stdio(go), above_stdio(stdin));
                    (stdout, stderr) = (above_stdio(stdout), above_stdio(stderr));
                    if go < 0 || stdin < 0 || stdout < 0 || stderr < 0 {
                        fail(status, Step::Stdio);
                    }
                    if libc::dup2(stdin, 0) < 0 || libc::dup2(stdout, 1) < 0 || libc::dup2(stderr, 2) < 0 {
                        fail(status, Step::Stdio);
                    }
                    // Nothing of the agent's but the two pipes to it, which exec closes.
                    close_all_but([go, status], max_fd);
                    for limit in &p.limits {
                        let value = libc::rlimit { rlim_cur: limit.soft, rlim_max: limit.hard };
                        if libc::setrlimit(limit.resource, &value) != 0 {
                            fail(status, Step::Limits);
                        }
                    }
                }
                if libc::read(go, (&raw mut byte).cast(), 1) != 1 {
                    // The tracer went away before releasing us: never run untraced.
                    libc::_exit(127);
                }
                match &detached {
                    None => {
                        if stdout_to_stderr && libc::dup2(2, 1) < 0 {
                            fail(status, Step::Stdio);
                        }
                        libc::execv(c_path.as_ptr(), c_argv.as_ptr());
                    }
                    Some((d, p)) => {
                        if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                            || libc::setgid(d.user.gid) != 0
                            || libc::setuid(d.user.uid) != 0
                        {
                            fail(status, Step::Credentials);
                        }
                        // After setuid: the directory must let the user in, not root.
                        if libc::chdir(p.cwd.as_ptr()) != 0 {
                            fail(status, Step::WorkingDirectory);
                        }
                        if p.no_new_privs && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                            fail(status, Step::NoNewPrivs);
                        }
                        libc::execve(c_path.as_ptr(), c_argv.as_ptr(), p.envp.as_ptr());
                    }
                }
                fail(status, Step::Exec)
            }
        }
        ForkResult::Parent { child } => {
            drop(go_read);
            drop(status_write);
            // The command's ends of its pipes: with them closed here, the agent reads the end of
            // its output once the command (and whoever it gave them to) has closed them.
            drop(detached);
            Ok(StoppedChild {
                pid: child.as_raw() as u32,
                path: path.to_owned(),
                output,
                cwd,
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

    /// The read ends of a detached child's stdout and stderr (once).
    pub fn take_output(&mut self) -> Option<OutputPipes> {
        self.output.take()
    }

    /// Lets the child exec, and reports whether exec succeeded.
    pub fn release(mut self) -> Result<u32, LaunchError> {
        let go = self.go.take().expect("released once");
        let status = self.exec_status.take().expect("released once");
        let start_error = |source| LaunchError::Start { path: self.path.clone(), source };
        nix::unistd::write(&go, &[1]).map_err(|e| start_error(e.into()))?;
        drop(go);
        let mut report = [0u8; 8];
        let n = loop {
            match nix::unistd::read(&status, &mut report) {
                Err(nix::errno::Errno::EINTR) => continue,
                other => break other.map_err(|e| start_error(e.into()))?,
            }
        };
        if n == 0 {
            return Ok(self.pid);
        }
        let _ = waitpid(Pid::from_raw(self.pid as i32), None);
        let step = Step::from_raw(i32::from_ne_bytes(report[..4].try_into().expect("4 bytes")));
        let source = std::io::Error::from_raw_os_error(i32::from_ne_bytes(report[4..].try_into().expect("4 bytes")));
        Err(match (step, &self.cwd) {
            (Step::Exec, _) => start_error(source),
            (Step::WorkingDirectory, Some((dir, uid))) => {
                LaunchError::WorkingDirectory { dir: dir.clone(), uid: *uid, source }
            }
            (step, _) => LaunchError::Prepare { path: self.path.clone(), step: step.name(), source },
        })
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
        let child =
            spawn_stopped(Path::new("/bin/sh"), &["sh".into(), "-c".into(), script.into()], &Start::Inherit).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!marker.exists(), "the child ran before it was released");
        let pid = child.release().unwrap();
        assert_eq!(wait(pid), ChildExit::Code(7));
        assert!(marker.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// While it waits to be released, the child holds the user's descriptors (no close-on-exec:
    /// the command gets them) and none of the tracer's (close-on-exec: another launch's pipes).
    #[test]
    fn a_waiting_child_holds_only_what_exec_would_keep() {
        let file = std::fs::File::open("/etc/hostname").unwrap();
        let tracers = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(900)).unwrap();
        let users = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_DUPFD(900)).unwrap();
        let child = spawn_stopped(Path::new("/bin/true"), &["true".into()], &Start::Inherit).unwrap();
        let fds = format!("/proc/{}/fd", child.pid());
        let open = |fd: i32| Path::new(&fds).join(fd.to_string()).exists();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while open(tracers) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let (tracers_open, users_open) = (open(tracers), open(users));
        drop(child);
        // SAFETY: our own descriptors, closed once.
        unsafe { (libc::close(tracers), libc::close(users)) };
        assert!(!tracers_open, "the waiting child holds the tracer's descriptor {tracers}");
        assert!(users_open, "the waiting child closed the user's descriptor {users}");
    }

    #[test]
    fn dropping_an_unreleased_child_never_runs_it() {
        let child = spawn_stopped(Path::new("/bin/true"), &["true".into()], &Start::Inherit).unwrap();
        let pid = child.pid();
        drop(child);
        assert!(!crate::targets::process_alive(pid));
    }

    #[test]
    fn exec_failure_is_reported() {
        let child = spawn_stopped(Path::new("/etc/passwd"), &["passwd".into()], &Start::Inherit).unwrap();
        let err = anyhow::Error::from(child.release().unwrap_err());
        assert_eq!(format!("{err:#}"), "cannot start /etc/passwd: Permission denied (os error 13)");
    }

    #[test]
    fn signals_are_reported_as_such() {
        let child =
            spawn_stopped(Path::new("/bin/sh"), &["sh".into(), "-c".into(), "kill -9 $$".into()], &Start::Inherit)
                .unwrap();
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
        let child =
            spawn_stopped(Path::new("/bin/sh"), &["sh".into(), "-c".into(), script.into()], &Start::Inherit).unwrap();
        blocked.thread_unblock().unwrap();
        assert_eq!(wait(child.release().unwrap()), ChildExit::Code(0));
        let status = std::fs::read_to_string(&out).unwrap();
        assert_eq!(status, "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A detached command of nobody's.
    fn detached_as_nobody() -> Detached {
        Detached::new(RunAs { uid: 65534, gid: 65534, groups: vec![4] })
    }

    /// Everything a pipe holds now (its writers are gone).
    fn read_all(fd: OwnedFd) -> String {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(fd), &mut text).unwrap();
        text
    }

    #[test]
    fn the_command_can_run_as_another_user() {
        let script = "test \"$(id -u):$(id -g):$(id -G)\" = '65534:65534:65534 4'";
        let start = Start::Detached(detached_as_nobody());
        let child = spawn_stopped(Path::new("/bin/sh"), &["sh".into(), "-c".into(), script.into()], &start).unwrap();
        assert_eq!(wait(child.release().unwrap()), ChildExit::Code(0));
    }

    /// What a detached command has of the tracer's: nothing. It reports on its own stdout.
    #[test]
    fn a_detached_command_starts_clean() {
        let detached = detached_as_nobody();
        // Something of the tracer's that a command must not see: a descriptor without
        // close-on-exec, and a raised limit.
        let leaked = std::fs::File::open("/etc/hostname").unwrap();
        let leaked = nix::fcntl::fcntl(&leaked, nix::fcntl::FcntlArg::F_DUPFD(20)).unwrap();
        let script = "ls /proc/self/fd; readlink /proc/self/fd/0; \
                      echo sid=$(($(cut -d' ' -f6 /proc/self/stat) == $$)) tty=$(cut -d' ' -f7 /proc/self/stat); \
                      grep NoNewPrivs /proc/self/status; ulimit -n; ulimit -c; pwd; env | sort; echo err >&2";
        let mut child =
            spawn_stopped(Path::new("/bin/sh"), &["sh".into(), "-c".into(), script.into()], &Start::Detached(detached))
                .unwrap();
        let pipes = child.take_output().expect("a detached child's pipes");
        assert_eq!(wait(child.release().unwrap()), ChildExit::Code(0));
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(leaked) };
        // Nonblocking, but the command has exited: all it wrote is there.
        assert_eq!(read_all(pipes.stderr), "err\n");
        let text = read_all(pipes.stdout);
        // `ls` itself opens /proc/self/fd as 3.
        let expected = "0\n1\n2\n3\n/dev/null\nsid=1 tty=0\nNoNewPrivs:\t1\n1024\n0\n/\n\
                        HOME=/nonexistent\nLOGNAME=nobody\nPATH=/usr/local/bin:/usr/bin:/bin\nPWD=/\nSHELL=/usr/sbin/nologin\nUSER=nobody\n";
        assert_eq!(text, expected);
    }

    #[test]
    fn a_working_directory_the_user_cannot_enter_fails_the_launch() {
        let dir = tempfile::tempdir().unwrap();
        let mut detached = detached_as_nobody();
        let private = dir.path().join("private");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        detached.cwd = private.clone();
        let child = spawn_stopped(Path::new("/bin/true"), &["true".into()], &Start::Detached(detached)).unwrap();
        let err = anyhow::Error::from(child.release().unwrap_err());
        assert_eq!(
            format!("{err:#}"),
            format!(
                "uid 65534 cannot enter the working directory {}: Permission denied (os error 13)",
                private.display()
            )
        );
    }
}
