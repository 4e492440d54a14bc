//! Where an agent waits for collectors: a Unix socket that only root (or one group) may open,
//! whose every peer the kernel names (`SO_PEERCRED`, `SO_PEERGROUPS`), or a TCP port (which the
//! agent opens only with a secret).

use std::{
    net::SocketAddr,
    os::{
        fd::AsRawFd as _,
        unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _},
    },
    path::{Path, PathBuf},
};

use tokio::net::{TcpListener, UnixListener};

use super::{
    admission::{Refused, Source},
    tls::Transport,
};

/// The default socket of `tracer agent`.
pub const DEFAULT_SOCKET: &str = "/run/tracer/agent.sock";

/// What the kernel says about a Unix socket's peer, as it was when the peer connected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerCreds {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl PeerCreds {
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// A connection's other end.
pub struct Peer {
    /// For logs: `10.0.0.1:4567`, or `uid 1000 (pid 4242)`.
    pub name: String,
    /// For Unix socket peers.
    pub creds: Option<PeerCreds>,
    /// Whose share of the places to authenticate it takes ([`super::admission`]).
    pub source: Source,
}

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("cannot listen on {addr}")]
    Bind { addr: String, source: std::io::Error },
    #[error("cannot prepare the socket's directory {path}")]
    Directory { path: PathBuf, source: std::io::Error },
    #[error(
        "the socket's directory {0} can be written by users other than root: choose a directory only root can write (the default is {DEFAULT_SOCKET})"
    )]
    UnsafeDirectory(PathBuf),
    #[error("another agent is listening on {0}")]
    InUse(PathBuf),
    #[error("no group named {0}")]
    NoSuchGroup(String),
    #[error(
        "members of group {group} cannot reach a socket in {dir}: the directory does not let them in (make it mode 0750 and group {group}, or choose another --socket)"
    )]
    GroupCannotEnter { dir: PathBuf, group: String },
}

pub enum Listener {
    Tcp(TcpListener),
    Unix {
        listener: UnixListener,
        path: PathBuf,
        /// Members of this group may connect, besides root.
        group: Option<(String, u32)>,
    },
}

/// Looks up a group by name or number.
pub fn group(name: &str) -> Result<(String, u32), ListenError> {
    let found = match name.parse::<u32>() {
        Ok(gid) => nix::unistd::Group::from_gid(gid.into()),
        Err(_) => nix::unistd::Group::from_name(name),
    };
    match found {
        Ok(Some(g)) => Ok((g.name, g.gid.as_raw())),
        _ => Err(ListenError::NoSuchGroup(name.to_string())),
    }
}

impl Listener {
    pub async fn tcp(addr: SocketAddr) -> Result<Listener, ListenError> {
        let listener =
            TcpListener::bind(addr).await.map_err(|source| ListenError::Bind { addr: addr.to_string(), source })?;
        Ok(Listener::Tcp(listener))
    }

    /// Binds a Unix socket at `path`, mode 0600 (0660 and owned by `group` if one is given), in a
    /// directory that only root can write (made, mode 0700 or 0750, if missing).
    pub fn unix(path: &Path, group: Option<(String, u32)>) -> Result<Listener, ListenError> {
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let dir_error = |source| ListenError::Directory { path: dir.to_path_buf(), source };
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(if group.is_some() { 0o750 } else { 0o700 })
                .create(dir)
                .map_err(dir_error)?;
            if let Some((_, gid)) = &group {
                std::os::unix::fs::chown(dir, Some(0), Some(*gid)).map_err(dir_error)?;
            }
        }
        let meta = std::fs::metadata(dir).map_err(dir_error)?;
        // Whoever may write the directory may replace the socket with one of their own.
        if meta.uid() != 0 || meta.permissions().mode() & 0o022 != 0 {
            return Err(ListenError::UnsafeDirectory(dir.to_path_buf()));
        }
        if let Some((name, gid)) = &group {
            let mode = meta.permissions().mode();
            let group_enters = mode & 0o001 != 0 || (meta.gid() == *gid && mode & 0o010 != 0);
            if !group_enters {
                // Our own directory, made private by an agent started without a group: let the
                // group in (search and read, never write). Anyone else's is the operator's call.
                if dir != Path::new(DEFAULT_SOCKET).parent().unwrap() {
                    return Err(ListenError::GroupCannotEnter { dir: dir.to_path_buf(), group: name.clone() });
                }
                std::os::unix::fs::chown(dir, Some(0), Some(*gid)).map_err(dir_error)?;
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750)).map_err(dir_error)?;
            }
        }
        if std::fs::symlink_metadata(path).is_ok() {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(ListenError::InUse(path.to_path_buf()));
            }
            // Left by an agent that did not shut down cleanly.
            let _ = std::fs::remove_file(path);
        }
        let bind_error = |source| ListenError::Bind { addr: format!("unix:{}", path.display()), source };
        // Created private: nobody can connect between bind and chmod.
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
        let bound = UnixListener::bind(path);
        nix::sys::stat::umask(old);
        let listener = bound.map_err(bind_error)?;
        if let Some((_, gid)) = &group {
            std::os::unix::fs::chown(path, Some(0), Some(*gid)).map_err(bind_error)?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(bind_error)?;
        }
        Ok(Listener::Unix { listener, path: path.to_path_buf(), group })
    }

    /// Where it listens, for logs and for collectors: `ADDR:PORT` or `unix:PATH`.
    pub fn describe(&self) -> String {
        match self {
            Listener::Tcp(l) => l.local_addr().map_or_else(|_| "?".to_string(), |a| a.to_string()),
            Listener::Unix { path, .. } => format!("unix:{}", path.display()),
        }
    }

    pub fn is_network(&self) -> bool {
        matches!(self, Listener::Tcp(_))
    }

    /// The next connection. A Unix peer that is neither root nor in the group is returned with
    /// `Err(reason)` inside, to be told and closed.
    pub async fn accept(&self) -> std::io::Result<(Box<dyn Transport>, Peer, Result<(), Refused>)> {
        match self {
            Listener::Tcp(l) => {
                let (tcp, addr) = l.accept().await?;
                let _ = tcp.set_nodelay(true);
                let peer = Peer { name: addr.to_string(), creds: None, source: Source::Ip(addr.ip()) };
                Ok((Box::new(tcp), peer, Ok(())))
            }
            Listener::Unix { listener, group, .. } => {
                let (stream, _) = listener.accept().await?;
                let creds = peer_creds(&stream)?;
                let name = format!("uid {} (pid {})", creds.uid, creds.pid);
                let allowed = creds.is_root() || group.as_ref().is_some_and(|(_, gid)| creds.in_group(*gid));
                let verdict = if allowed {
                    Ok(())
                } else {
                    Err(match group {
                        Some((g, _)) => Refused::NotInGroup { uid: creds.uid, group: g.clone() },
                        None => Refused::NotRoot(creds.uid),
                    })
                };
                let source = Source::Uid(creds.uid);
                Ok((Box::new(stream), Peer { name, creds: Some(creds), source }, verdict))
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix { path, .. } = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The peer's credentials from when it connected: `SO_PEERCRED` and `SO_PEERGROUPS`.
pub fn peer_creds(stream: &impl std::os::fd::AsFd) -> std::io::Result<PeerCreds> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let cred = getsockopt(stream, PeerCredentials).map_err(std::io::Error::from)?;
    let fd = stream.as_fd().as_raw_fd();
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = (groups.len() * size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `groups`, which holds that many.
        let rc = unsafe {
            libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERGROUPS, groups.as_mut_ptr().cast(), &mut len)
        };
        if rc == 0 {
            groups.truncate(len as usize / size_of::<libc::gid_t>());
            break;
        }
        let e = std::io::Error::last_os_error();
        // Too small: `len` says how much is needed.
        if e.raw_os_error() == Some(libc::ERANGE) && (len as usize) > groups.len() * size_of::<libc::gid_t>() {
            groups.resize(len as usize / size_of::<libc::gid_t>(), 0);
            continue;
        }
        return Err(e);
    }
    Ok(PeerCreds { pid: cred.pid(), uid: cred.uid(), gid: cred.gid(), groups })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_socket_is_private_and_names_its_peers() {
        let dir = std::env::temp_dir().join(format!("tracer-listener-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("sub/agent.sock");
        let listener = Listener::unix(&path, None).unwrap();
        let dir_mode = std::fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o777;
        assert_eq!(dir_mode, 0o700);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(matches!(Listener::unix(&path, None), Err(ListenError::InUse(_))));
        let client = tokio::net::UnixStream::connect(&path).await.unwrap();
        let (_, peer, verdict) = listener.accept().await.unwrap();
        let me = nix::unistd::geteuid().as_raw();
        assert_eq!(peer.creds.as_ref().unwrap().uid, me);
        assert_eq!(peer.creds.as_ref().unwrap().pid, std::process::id() as i32);
        assert_eq!(verdict.is_ok(), me == 0);
        drop(client);
        drop(listener);
        assert!(!path.exists(), "the socket is removed with its listener");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
