//! Where the stdout and stderr of a command the agent launches go: a file of the command's user,
//! `DIR/UID/trace-ID.out` (`DIR` is `--command-output-dir`, [`DEFAULT_DIR`] unless said).
//!
//! The agent makes the file, not the command: as root, in directories only root can write (so
//! nobody can put a link or another file at the name first), new (`O_EXCL | O_NOFOLLOW`), mode
//! 0600, then hands it to the user with `fchown`. The user reads it, and can delete it only
//! through root; nobody else can read it. Sending it back to the collector is not done yet.

use std::{
    fs::File,
    io,
    os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

/// Where command output goes unless `tracer agent --command-output-dir` says otherwise.
pub const DEFAULT_DIR: &str = "/var/log/tracer-agent";

/// Another name is tried when `trace-ID.out` exists (a collector reusing a trace id): at most
/// this many.
const MAX_NAMES: u32 = 1000;

#[derive(Debug, thiserror::Error)]
pub enum CommandOutputError {
    #[error("cannot make the command's output file in {dir}")]
    Io { dir: PathBuf, source: io::Error },
    #[error(
        "the command output directory {dir} is {why}: it must be a directory only root can write (give another with --command-output-dir)"
    )]
    NotRoots { dir: PathBuf, why: String },
}

/// Makes the (empty) output file of trace `trace_id`'s command, owned by `uid`:`gid`.
pub fn create(base: &Path, uid: u32, gid: u32, trace_id: u64) -> Result<PathBuf, CommandOutputError> {
    root_dir(base)?;
    let dir = base.join(uid.to_string());
    root_dir(&dir)?;
    let io_error = |source| CommandOutputError::Io { dir: dir.clone(), source };
    for n in 0..MAX_NAMES {
        let name = if n == 0 { format!("trace-{trace_id}.out") } else { format!("trace-{trace_id}.{n}.out") };
        let path = dir.join(name);
        let file: File = match crate::output_file::private_new(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_error(e)),
        };
        std::os::unix::fs::fchown(&file, Some(uid), Some(gid)).map_err(io_error)?;
        return Ok(path);
    }
    Err(io_error(io::Error::from(io::ErrorKind::AlreadyExists)))
}

/// Makes `dir` (mode 0755) if it is missing, and checks that only root can write it.
fn root_dir(dir: &Path) -> Result<(), CommandOutputError> {
    let io_error = |source| CommandOutputError::Io { dir: dir.to_owned(), source };
    match std::fs::DirBuilder::new().mode(0o755).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_error(e)),
    }
    let meta = std::fs::symlink_metadata(dir).map_err(io_error)?;
    let refuse = |why: String| Err(CommandOutputError::NotRoots { dir: dir.to_owned(), why });
    if meta.file_type().is_symlink() {
        return refuse("a symbolic link".to_string());
    }
    if !meta.is_dir() {
        return refuse("not a directory".to_string());
    }
    if meta.uid() != 0 {
        return refuse(format!("owned by uid {}", meta.uid()));
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        return refuse(format!("writable by others than root (mode {mode:03o})"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_new_private_and_the_users() {
        let base = tempfile::tempdir().unwrap();
        let first = create(base.path(), 65534, 65534, 7).unwrap();
        assert_eq!(first, base.path().join("65534/trace-7.out"));
        let meta = std::fs::metadata(&first).unwrap();
        assert_eq!((meta.uid(), meta.gid(), meta.mode() & 0o7777, meta.len()), (65534, 65534, 0o600, 0));
        let dir = std::fs::metadata(base.path().join("65534")).unwrap();
        assert_eq!((dir.uid(), dir.mode() & 0o7777), (0, 0o755));
        // The same trace id again: another name, never the same file.
        assert_eq!(create(base.path(), 65534, 65534, 7).unwrap(), base.path().join("65534/trace-7.1.out"));
    }

    #[test]
    fn a_directory_others_control_is_refused() {
        let base = tempfile::tempdir().unwrap();
        let users = base.path().join("65534");
        std::fs::create_dir(&users).unwrap();
        std::os::unix::fs::chown(&users, Some(65534), None).unwrap();
        assert_eq!(
            create(base.path(), 65534, 65534, 1).unwrap_err().to_string(),
            format!(
                "the command output directory {} is owned by uid 65534: it must be a directory only root can write (give another with --command-output-dir)",
                users.display()
            )
        );
        std::fs::remove_dir(&users).unwrap();
        std::os::unix::fs::symlink("/tmp", &users).unwrap();
        assert!(create(base.path(), 65534, 65534, 1).unwrap_err().to_string().contains("is a symbolic link"));
        std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(
            create(base.path(), 65534, 65534, 1)
                .unwrap_err()
                .to_string()
                .contains("is writable by others than root (mode 777)")
        );
    }
}
