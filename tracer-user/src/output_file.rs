//! Files a trace is written to: private, and never written through something another user put
//! in the way.
//!
//! A trace holds other processes' memory (arguments, strings, message bytes), and `record` runs as
//! root, often in a directory others can write. So an output file is:
//! - created new, mode 0600, with `O_EXCL | O_NOFOLLOW | O_CLOEXEC`, under a temporary name beside
//!   its target (`NAME.XXXXXX.partial`), and renamed over the target only once complete
//!   ([`OutputFile::commit`]): the target holds the old file or the whole new one, never a mix. A
//!   crash (or an error after events were written) leaves the target as it was and the partial
//!   file beside it, readable by its owner only; formats that stream (JSON lines, native) can be
//!   read from it as they are from a trace cut short.
//! - refused, with one sentence, when the target is a symbolic link (whoever can write the
//!   directory may have planted it) or a file of another user (who would then read the trace).
//!   The target is checked with `lstat` first; the rename replaces whatever name is there by then,
//!   a link included, never what a link points to, so a race cannot redirect the write.
//! - written in place when the target is an existing device or FIFO of the user's or root's
//!   (`-o /dev/null`, a named pipe a reader waits on): nothing to rename there.
//!
//! Standard output (`-o -`) is the caller's business and does not come here.

use std::{
    fs::File,
    io,
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

/// Why an output file could not be written; `what` is the thing written ("the trace").
#[derive(Debug, thiserror::Error)]
pub enum OutputFileError {
    #[error("cannot write {what} to {path}")]
    Io { what: &'static str, path: PathBuf, source: io::Error },
    #[error(
        "refusing to write {what} to {path}: it is a symbolic link, which whoever can write its directory may have planted (remove it, or give the path of a file)"
    )]
    Symlink { what: &'static str, path: PathBuf },
    #[error(
        "refusing to write {what} to {path}: it belongs to uid {owner}, not to you (uid {me}), who could then read it (remove it, or give another path)"
    )]
    NotYours { what: &'static str, path: PathBuf, owner: u32, me: u32 },
    #[error("cannot write {what} to {path}: it is a directory")]
    Directory { what: &'static str, path: PathBuf },
    #[error(
        "{what} was not written to {path}: its temporary file {temp} was swapped for another file before it was renamed into place (someone else can write that directory; write to one only you can write)"
    )]
    Swapped { what: &'static str, path: PathBuf, temp: PathBuf },
}

/// An output file being written: the open file, and where it goes once complete.
#[derive(Debug)]
pub struct OutputFile {
    what: &'static str,
    target: PathBuf,
    /// The temporary name the file has until [`OutputFile::commit`] (none: written in place).
    temp: Option<PathBuf>,
    file: File,
    /// A regular file at the target is kept as `TARGET.old` by the commit.
    keep_previous: bool,
}

/// What is at the target now, as far as writing there goes.
enum Existing {
    Nothing,
    /// A regular file of ours: replaced by the rename.
    OurFile,
    /// A device or FIFO of ours or root's: written in place.
    Special,
}

impl OutputFile {
    /// Starts writing `what` (for messages: "the trace") to `target`, under a temporary name
    /// beside it.
    pub fn create(target: &Path, what: &'static str) -> Result<OutputFile, OutputFileError> {
        let io_error = |source| OutputFileError::Io { what, path: target.to_owned(), source };
        match inspect(target, what)? {
            Existing::Special => {
                // No O_CREAT: if the device or FIFO was swapped for something else meanwhile, the
                // open fails or (O_NOFOLLOW) refuses a link; a regular file put there is written
                // in place, which its owner (checked above) could do anyway.
                let file = File::options()
                    .write(true)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(target)
                    .map_err(io_error)?;
                Ok(OutputFile { what, target: target.to_owned(), temp: None, file, keep_previous: false })
            }
            Existing::Nothing | Existing::OurFile => {
                let (temp, file) = create_temp(target).map_err(io_error)?;
                Ok(OutputFile { what, target: target.to_owned(), temp: Some(temp), file, keep_previous: false })
            }
        }
    }

    /// Creates `target` itself, new and private, after the same checks: for files that are
    /// removed rather than renamed when done (`record`'s spool). A file of ours already there
    /// (left by a crash) is replaced.
    pub fn create_in_place(target: &Path, what: &'static str) -> Result<OutputFile, OutputFileError> {
        let io_error = |source| OutputFileError::Io { what, path: target.to_owned(), source };
        if let Existing::OurFile = inspect(target, what)? {
            std::fs::remove_file(target).map_err(io_error)?;
        }
        // O_EXCL: if anything appeared at the name since, this fails instead of writing into it.
        let file = private_new(target).map_err(io_error)?;
        Ok(OutputFile { what, target: target.to_owned(), temp: None, file, keep_previous: false })
    }

    /// A handle to write through (the same open file: writes through it land in this file).
    pub fn writer(&self) -> Result<File, OutputFileError> {
        self.file.try_clone().map_err(|source| self.io_error(source))
    }

    /// Where the file is being written until it is committed.
    pub fn partial_path(&self) -> &Path {
        self.temp.as_deref().unwrap_or(&self.target)
    }

    /// The commit keeps the regular file it replaces as `TARGET.old` (as `perf record` keeps
    /// `perf.data.old`): a second `record` does not silently take the first one's trace.
    pub fn keeping_previous(mut self) -> OutputFile {
        self.keep_previous = true;
        self
    }

    /// The name the replaced file is kept under: `TARGET.old`.
    pub fn previous_path(target: &Path) -> PathBuf {
        let mut name = target.as_os_str().to_owned();
        name.push(".old");
        PathBuf::from(name)
    }

    /// Puts the complete file in place of the target (every writer must have flushed).
    pub fn commit(mut self) -> Result<(), OutputFileError> {
        let Some(temp) = self.temp.take() else { return Ok(()) };
        if self.keep_previous && std::fs::symlink_metadata(&self.target).is_ok_and(|m| m.is_file()) {
            // A rename replaces a file or link at the `.old` name (a link is not followed). Best
            // effort: what stops it (a directory planted there) must not cost the new trace.
            let _ = std::fs::rename(&self.target, Self::previous_path(&self.target));
        }
        std::fs::rename(&temp, &self.target).map_err(|source| self.io_error(source))?;
        // In a directory others can write, someone may have put their own file at the temporary
        // name: the rename then moved theirs into place, and the trace is in no file any more.
        let ours = self.file.metadata().map_err(|source| self.io_error(source))?;
        let placed = std::fs::symlink_metadata(&self.target).map_err(|source| self.io_error(source))?;
        if (ours.dev(), ours.ino()) != (placed.dev(), placed.ino()) {
            return Err(OutputFileError::Swapped { what: self.what, path: self.target.clone(), temp });
        }
        Ok(())
    }

    fn io_error(&self, source: io::Error) -> OutputFileError {
        OutputFileError::Io { what: self.what, path: self.target.clone(), source }
    }
}

impl Drop for OutputFile {
    /// Not committed: an empty temporary file (nothing was written yet) is removed; one with
    /// something in it is left as what a crash would leave.
    fn drop(&mut self) {
        let Some(temp) = &self.temp else { return };
        let (Ok(ours), Ok(there)) = (self.file.metadata(), std::fs::symlink_metadata(temp)) else { return };
        if ours.len() == 0 && (ours.dev(), ours.ino()) == (there.dev(), there.ino()) {
            let _ = std::fs::remove_file(temp);
        }
    }
}

/// Checks what is at `target` (without following a link).
fn inspect(target: &Path, what: &'static str) -> Result<Existing, OutputFileError> {
    let meta = match std::fs::symlink_metadata(target) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Existing::Nothing),
        Err(source) => return Err(OutputFileError::Io { what, path: target.to_owned(), source }),
    };
    let kind = meta.file_type();
    if kind.is_symlink() {
        return Err(OutputFileError::Symlink { what, path: target.to_owned() });
    }
    if kind.is_dir() {
        return Err(OutputFileError::Directory { what, path: target.to_owned() });
    }
    let me = nix::unistd::geteuid().as_raw();
    // A device or FIFO of root's is as safe as one of ours (`/dev/null`); a regular file must be
    // ours: even root's own file in another user's directory is theirs to decide about.
    let owner_ok = meta.uid() == me || (!kind.is_file() && meta.uid() == 0);
    if !owner_ok {
        return Err(OutputFileError::NotYours { what, path: target.to_owned(), owner: meta.uid(), me });
    }
    Ok(if kind.is_file() { Existing::OurFile } else { Existing::Special })
}

/// Creates `path`: new (never an existing file or a link), mode 0600, closed on exec.
pub(crate) fn private_new(path: &Path) -> io::Result<File> {
    File::options().write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path)
}

/// Creates `NAME.XXXXXX.partial` beside `target`, with a random `XXXXXX` nobody can guess ahead.
fn create_temp(target: &Path) -> io::Result<(PathBuf, File)> {
    let name = target.file_name().ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut last = None;
    for _ in 0..16 {
        let mut random = [0u8; 6];
        getrandom::fill(&mut random).map_err(|e| io::Error::other(e.to_string()))?;
        let suffix: String = random.iter().map(|b| LETTERS[*b as usize % LETTERS.len()] as char).collect();
        let mut temp_name = name.to_owned();
        temp_name.push(format!(".{suffix}.partial"));
        let temp = target.with_file_name(temp_name);
        match private_new(&temp) {
            Ok(file) => return Ok((temp, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.expect("tried at least once"))
}

#[cfg(test)]
mod tests {
    use std::{
        io::Write as _,
        os::unix::fs::{FileTypeExt as _, PermissionsExt as _},
    };

    use super::*;

    fn dir() -> tempfile::TempDir {
        tempfile::Builder::new().prefix("tracer-output-").tempdir().unwrap()
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    #[test]
    fn a_new_file_is_private_and_appears_only_when_committed() {
        let d = dir();
        let target = d.path().join("t.jsonl");
        let out = OutputFile::create(&target, "the trace").unwrap();
        out.writer().unwrap().write_all(b"hello\n").unwrap();
        assert!(!target.exists());
        let partial = out.partial_path().to_owned();
        assert_eq!(std::fs::read_to_string(&partial).unwrap(), "hello\n", "readable while written");
        assert_eq!(std::fs::metadata(&partial).unwrap().permissions().mode() & 0o777, 0o600);
        out.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "hello\n");
        assert_eq!(std::fs::metadata(&target).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(entries(d.path()), ["t.jsonl"]);
    }

    #[test]
    fn replacing_our_own_file_keeps_it_whole_until_the_commit() {
        let d = dir();
        let target = d.path().join("t.jsonl");
        std::fs::write(&target, "old\n").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
        let out = OutputFile::create(&target, "the trace").unwrap();
        out.writer().unwrap().write_all(b"new\n").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "old\n");
        out.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new\n");
        assert_eq!(std::fs::metadata(&target).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn the_replaced_file_is_kept_as_old_when_asked() {
        let d = dir();
        let target = d.path().join("t.jsonl");
        for (i, keep) in [(1, true), (2, true), (3, false)] {
            let mut out = OutputFile::create(&target, "the trace").unwrap();
            if keep {
                out = out.keeping_previous();
            }
            out.writer().unwrap().write_all(format!("{i}\n").as_bytes()).unwrap();
            out.commit().unwrap();
        }
        assert_eq!(entries(d.path()), ["t.jsonl", "t.jsonl.old"]);
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "3\n");
        assert_eq!(std::fs::read_to_string(d.path().join("t.jsonl.old")).unwrap(), "1\n", "the third did not keep");
    }

    #[test]
    fn an_uncommitted_file_is_left_only_if_something_was_written() {
        let d = dir();
        let target = d.path().join("t.jsonl");
        drop(OutputFile::create(&target, "the trace").unwrap());
        assert_eq!(entries(d.path()), Vec::<String>::new(), "an empty one is removed");
        let out = OutputFile::create(&target, "the trace").unwrap();
        out.writer().unwrap().write_all(b"{}\n").unwrap();
        let partial = out.partial_path().file_name().unwrap().to_string_lossy().into_owned();
        drop(out);
        assert_eq!(entries(d.path()), std::slice::from_ref(&partial), "what a crash would leave");
        assert!(partial.starts_with("t.jsonl.") && partial.ends_with(".partial"), "{partial}");
    }

    #[test]
    fn links_directories_and_other_users_files_are_refused() {
        let d = dir();
        let victim = d.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let link = d.path().join("t.jsonl");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        assert_eq!(
            OutputFile::create(&link, "the trace").unwrap_err().to_string(),
            format!(
                "refusing to write the trace to {}: it is a symbolic link, which whoever can write its directory may have planted (remove it, or give the path of a file)",
                link.display()
            )
        );
        assert!(OutputFile::create_in_place(&link, "the spool").is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(
            OutputFile::create(d.path(), "the trace").unwrap_err().to_string(),
            format!("cannot write the trace to {}: it is a directory", d.path().display())
        );
        // Unit tests run as root, as record does: a file of nobody's.
        let theirs = d.path().join("theirs.jsonl");
        std::fs::write(&theirs, "").unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        assert_eq!(
            OutputFile::create(&theirs, "the trace").unwrap_err().to_string(),
            format!(
                "refusing to write the trace to {}: it belongs to uid 65534, not to you (uid 0), who could then read it (remove it, or give another path)",
                theirs.display()
            )
        );
        assert_eq!(entries(d.path()), ["t.jsonl", "theirs.jsonl", "victim"], "nothing created");
    }

    #[test]
    fn devices_and_fifos_are_written_in_place() {
        let out = OutputFile::create(Path::new("/dev/null"), "the trace").unwrap();
        out.writer().unwrap().write_all(b"gone").unwrap();
        assert_eq!(out.partial_path(), Path::new("/dev/null"));
        out.commit().unwrap();
        assert!(std::fs::metadata("/dev/null").unwrap().file_type().is_char_device(), "still the device");
    }

    #[test]
    fn the_spool_replaces_a_leftover_of_ours_and_is_private() {
        let d = dir();
        let spool = d.path().join("t.json.partial.jsonl");
        std::fs::write(&spool, "left by a crash").unwrap();
        let out = OutputFile::create_in_place(&spool, "the spool").unwrap();
        out.writer().unwrap().write_all(b"x").unwrap();
        out.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&spool).unwrap(), "x");
        assert_eq!(std::fs::metadata(&spool).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn a_temporary_file_swapped_before_the_rename_is_reported() {
        let d = dir();
        let target = d.path().join("t.jsonl");
        let out = OutputFile::create(&target, "the trace").unwrap();
        let temp = out.partial_path().to_owned();
        std::fs::remove_file(&temp).unwrap();
        std::fs::write(&temp, "planted").unwrap();
        assert_eq!(
            out.commit().unwrap_err().to_string(),
            format!(
                "the trace was not written to {}: its temporary file {} was swapped for another file before it was renamed into place (someone else can write that directory; write to one only you can write)",
                target.display(),
                temp.display()
            )
        );
    }
}
