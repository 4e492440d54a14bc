//! How the agent starts a command a collector asked for: detached from the agent, as a service
//! manager starts a service, so that the command gets nothing of the agent's but what it is given.
//!
//! The agent is root, was perhaps started from root's shell, and holds its log open. A command
//! that kept the agent's terminal could push a line into that shell (`TIOCSTI`) for root to run;
//! one that kept its descriptors could rewrite the agent's log; its environment and working
//! directory are root's. So a detached command gets ([`super::launch::spawn_stopped`] applies it):
//! - a new session with no controlling terminal (`setsid`), stdin from `/dev/null`, stdout and
//!   stderr to two pipes whose read ends the agent keeps ([`super::launch::OutputPipes`]: it
//!   streams them to the collector and appends them to a file of the user's), no other
//!   descriptor;
//! - the working directory `/` or the one the request names, entered with the user's own
//!   credentials;
//! - an environment made only from the user's account ([`account_env`]): `HOME`, `USER`,
//!   `LOGNAME`, `SHELL` from its passwd entry and `PATH` [`CLEAN_PATH`];
//! - resource limits back at the kernel's defaults where the agent may have changed them
//!   ([`default_limits`]);
//! - for a user other than root, `PR_SET_NO_NEW_PRIVS`: no set-uid program or file capability
//!   gives it more than it has.

use std::{
    ffi::OsString,
    os::unix::ffi::OsStringExt as _,
    path::{Path, PathBuf},
};

use super::launch::RunAs;

/// The `PATH` of a detached command, also where its program is looked up.
pub const CLEAN_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// A command's start, detached from the agent (see the module's documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detached {
    /// Who it runs as (root included: root's commands are detached too).
    pub user: RunAs,
    /// Its working directory, entered as `user`.
    pub cwd: PathBuf,
    /// Its whole environment.
    pub env: Vec<(OsString, OsString)>,
    /// `PR_SET_NO_NEW_PRIVS` (every user but root).
    pub no_new_privs: bool,
}

impl Detached {
    /// A command of `user`'s, in `/`, with its account's environment.
    pub fn new(user: RunAs) -> Detached {
        let env = account_env(user.uid);
        let no_new_privs = user.uid != 0;
        Detached { user, cwd: PathBuf::from("/"), env, no_new_privs }
    }
}

/// The environment of `uid`'s commands: its account's `HOME`, `USER`, `LOGNAME` and `SHELL`
/// (without a passwd entry: `HOME=/`, `SHELL=/bin/sh`, no names), and [`CLEAN_PATH`].
pub fn account_env(uid: u32) -> Vec<(OsString, OsString)> {
    let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)).ok().flatten();
    let mut env = Vec::new();
    let path = |p: &Path| p.as_os_str().to_owned();
    match user {
        Some(u) => {
            env.push(("HOME".into(), path(&u.dir)));
            env.push(("USER".into(), u.name.clone().into()));
            env.push(("LOGNAME".into(), u.name.into()));
            env.push(("SHELL".into(), path(&u.shell)));
        }
        None => {
            env.push(("HOME".into(), "/".into()));
            env.push(("SHELL".into(), "/bin/sh".into()));
        }
    }
    env.push(("PATH".into(), CLEAN_PATH.into()));
    env
}

/// `NAME=VALUE`, as `execve` takes it (`None` if either holds a NUL byte).
pub(crate) fn env_entry(name: &OsString, value: &OsString) -> Option<std::ffi::CString> {
    let mut bytes = name.clone().into_vec();
    bytes.push(b'=');
    bytes.extend_from_slice(value.as_encoded_bytes());
    std::ffi::CString::new(bytes).ok()
}

/// One resource limit a detached command gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    pub resource: libc::__rlimit_resource_t,
    pub soft: libc::rlim_t,
    pub hard: libc::rlim_t,
}

/// Soft limits a detached command starts with, the kernel's defaults for a new login; hard limits
/// stay what the agent's are (the soft limit never above it):
/// - `RLIMIT_NOFILE` 1024: the tracer raises its own to hold its probes' descriptors, and a
///   program that `select()`s breaks above 1024;
/// - `RLIMIT_CORE` 0: no core file unless the command asks (as a login shell starts);
/// - `RLIMIT_STACK` 8 MiB: an unlimited stack changes the address-space layout;
/// - `RLIMIT_MEMLOCK` 8 MiB: BPF loaders (aya included, on older kernels) raise theirs.
pub fn default_limits() -> Vec<Limit> {
    const DEFAULTS: [(libc::__rlimit_resource_t, libc::rlim_t); 4] = [
        (libc::RLIMIT_NOFILE, 1024),
        (libc::RLIMIT_CORE, 0),
        (libc::RLIMIT_STACK, 8 << 20),
        (libc::RLIMIT_MEMLOCK, 8 << 20),
    ];
    DEFAULTS
        .into_iter()
        .filter_map(|(resource, soft)| {
            let mut current = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            // SAFETY: getrlimit writes the struct it is given.
            (unsafe { libc::getrlimit(resource, &mut current) } == 0).then_some(Limit {
                resource,
                soft: soft.min(current.rlim_max),
                hard: current.rlim_max,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_is_the_accounts_own() {
        let nobody = account_env(65534);
        let get = |name: &str| nobody.iter().find(|(n, _)| n == name).map(|(_, v)| v.to_str().unwrap().to_string());
        assert_eq!(get("USER").as_deref(), Some("nobody"));
        assert_eq!(get("LOGNAME").as_deref(), Some("nobody"));
        assert_eq!(get("HOME").as_deref(), Some("/nonexistent"));
        assert_eq!(get("SHELL").as_deref(), Some("/usr/sbin/nologin"));
        assert_eq!(get("PATH").as_deref(), Some(CLEAN_PATH));
        assert_eq!(nobody.len(), 5, "nothing else: {nobody:?}");
        let unknown = account_env(4_000_000_000);
        assert_eq!(
            unknown,
            [("HOME".into(), "/".into()), ("SHELL".into(), "/bin/sh".into()), ("PATH".into(), CLEAN_PATH.into())]
        );
    }

    #[test]
    fn limits_are_the_defaults_under_the_current_hard_ones() {
        let limits = default_limits();
        let nofile = limits.iter().find(|l| l.resource == libc::RLIMIT_NOFILE).unwrap();
        assert_eq!(nofile.soft, 1024.min(nofile.hard));
        let core = limits.iter().find(|l| l.resource == libc::RLIMIT_CORE).unwrap();
        assert_eq!(core.soft, 0);
        assert_eq!(limits.len(), 4);
    }
}
