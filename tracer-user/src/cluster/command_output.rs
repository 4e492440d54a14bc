//! Where the stdout and stderr of a command the agent launches go: to the collector that asked,
//! and to a file of the command's user, `DIR/UID/trace-ID.out` (`DIR` is
//! `--command-output-dir`, [`DEFAULT_DIR`] unless said).
//!
//! The command writes to two pipes; the agent's [`Relay`] reads them as they fill (never
//! waiting on the collector, so a command that writes a lot is never blocked by a slow or absent
//! one), appends everything to the file, and queues it for the collector in an [`OutputQueue`]
//! of at most [`MAX_QUEUED`] bytes. What does not fit is dropped from the stream, counted, and
//! the count sent in place of the bytes: the collector says how many bytes of which stream it
//! did not get, and the file has them. When the trace ends the relay reads what the pipes hold
//! then (the command's last words), and the stream to the collector ends before the trace's end
//! does; what the command's survivors write after that goes to the file only.
//!
//! The agent makes the file, not the command: as root, in directories only root can write (so
//! nobody can put a link or another file at the name first), new (`O_EXCL | O_NOFOLLOW`), mode
//! 0600, then hands it to the user with `fchown`. The user reads it, and can delete it only
//! through root; nobody else can read it. The file is the record on the host: it keeps
//! everything, whatever the collector got, as long as the disk has room.

use std::{
    cell::{Cell, RefCell},
    collections::VecDeque,
    fs::File,
    io::{self, Write as _},
    os::{
        fd::OwnedFd,
        unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _},
    },
    path::{Path, PathBuf},
    rc::Rc,
};

use tokio::io::unix::AsyncFd;

use super::protocol::{Message, OutputStream};
use crate::targets::launch::OutputPipes;

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

/// Makes the (empty) output file of trace `trace_id`'s command, owned by `uid`:`gid`; returns
/// its path and the file, open for appending.
pub fn create(base: &Path, uid: u32, gid: u32, trace_id: u64) -> Result<(PathBuf, File), CommandOutputError> {
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
        // Appended to: its user may truncate it while the command runs.
        nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_APPEND))
            .map_err(|e| io_error(e.into()))?;
        return Ok((path, file));
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

/// Bytes of output in one [`Message::CommandOutput`], at most: what a collector takes.
pub const MAX_CHUNK: usize = 64 << 10;
/// Bytes of output the agent keeps for a collector that is slow or away, at most; beyond, the
/// stream drops them (counted) and only the file has them.
pub const MAX_QUEUED: usize = 1 << 20;
/// Bytes the relay reads from the pipes when the trace ends, at most: what they hold then, not
/// what a command that keeps writing adds while they are read.
const MAX_FINAL_READ: usize = 4 << 20;

/// Output on its way to the collector: chunks of both streams in the order they were read, at
/// most [`MAX_QUEUED`] bytes, and per stream the bytes dropped since its last chunk.
#[derive(Debug, Default)]
pub struct OutputQueue {
    chunks: VecDeque<Chunk>,
    queued: usize,
    /// Per stream: bytes dropped and not yet told.
    dropped: [u64; 2],
    /// The trace ended: nothing more is queued.
    closed: bool,
}

#[derive(Debug, PartialEq, Eq)]
struct Chunk {
    stream: OutputStream,
    /// Bytes of `stream` dropped just before these.
    dropped: u64,
    bytes: Vec<u8>,
}

impl OutputQueue {
    /// Queues what the command wrote to `stream` next, or drops it (counted) if it does not fit.
    /// Nothing is queued once the queue is closed.
    pub fn push(&mut self, stream: OutputStream, mut bytes: &[u8]) {
        if self.closed || bytes.is_empty() {
            return;
        }
        let i = stream.index();
        if self.queued + bytes.len() > MAX_QUEUED {
            self.dropped[i] += bytes.len() as u64;
            return;
        }
        self.queued += bytes.len();
        while !bytes.is_empty() {
            let dropped = std::mem::take(&mut self.dropped[i]);
            // Small writes share a frame, unless a drop comes between them.
            if let Some(last) = self.chunks.back_mut()
                && dropped == 0
                && last.stream == stream
                && last.bytes.len() < MAX_CHUNK
            {
                let n = (MAX_CHUNK - last.bytes.len()).min(bytes.len());
                last.bytes.extend_from_slice(&bytes[..n]);
                bytes = &bytes[n..];
                continue;
            }
            let n = bytes.len().min(MAX_CHUNK);
            self.chunks.push_back(Chunk { stream, dropped, bytes: bytes[..n].to_vec() });
            bytes = &bytes[n..];
        }
    }

    /// The next message for the collector: queued output, or, once none is left, what was
    /// dropped since.
    pub fn pop(&mut self) -> Option<Message> {
        let chunk = match self.chunks.pop_front() {
            Some(chunk) => {
                self.queued -= chunk.bytes.len();
                chunk
            }
            None => {
                let stream = OutputStream::BOTH.into_iter().find(|s| self.dropped[s.index()] > 0)?;
                Chunk { stream, dropped: std::mem::take(&mut self.dropped[stream.index()]), bytes: Vec::new() }
            }
        };
        Some(Message::CommandOutput { stream: chunk.stream, dropped: chunk.dropped, bytes: chunk.bytes })
    }

    /// The trace ended: what is queued is still sent, nothing more is queued.
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// Closed, and everything in it sent.
    pub fn finished(&self) -> bool {
        self.closed && self.chunks.is_empty() && self.dropped == [0, 0]
    }
}

/// Reads a launched command's stdout and stderr as they fill: appends them to its output file
/// and queues them for the collector.
pub struct Relay {
    pipes: [AsyncFd<OwnedFd>; 2],
    eof: [Cell<bool>; 2],
    /// `None` once a write failed (said once in the agent's log).
    file: RefCell<Option<File>>,
    path: PathBuf,
    queue: Rc<RefCell<OutputQueue>>,
    /// Tells the agent's connections there is something to send.
    wake: Box<dyn Fn()>,
}

impl Relay {
    /// A relay of `pipes` to `file` (at `path`) and `queue`; must be made on the agent's runtime.
    pub fn new(
        pipes: OutputPipes,
        file: File,
        path: PathBuf,
        queue: Rc<RefCell<OutputQueue>>,
        wake: Box<dyn Fn()>,
    ) -> io::Result<Rc<Relay>> {
        // SAFETY: an `OwnedFd` keeps its descriptor open, and returns it from `as_raw_fd`, until it
        // (held by the `AsyncFd`) is dropped.
        let register = |fd: OwnedFd| unsafe { AsyncFd::register(fd) };
        Ok(Rc::new(Relay {
            pipes: [register(pipes.stdout)?, register(pipes.stderr)?],
            eof: Default::default(),
            file: RefCell::new(Some(file)),
            path,
            queue,
            wake,
        }))
    }

    /// Relays until both pipes are closed (the command and everything it gave them to exited).
    pub async fn run(self: Rc<Self>) {
        let mut buf = vec![0u8; MAX_CHUNK];
        loop {
            let (out, err) = (!self.eof[0].get(), !self.eof[1].get());
            if !out && !err {
                return;
            }
            let (i, ready) = tokio::select! {
                ready = self.pipes[0].readable(), if out => (0, ready),
                ready = self.pipes[1].readable(), if err => (1, ready),
            };
            let Ok(mut guard) = ready else {
                self.eof[i].set(true);
                continue;
            };
            if let Ok(read) = guard.try_io(|fd| nix::unistd::read(fd.get_ref(), &mut buf).map_err(io::Error::from)) {
                self.took(i, read, &buf);
            }
        }
    }

    /// The trace ended: reads what the pipes hold now (without waiting, at most
    /// [`MAX_FINAL_READ`] bytes), then closes the stream to the collector.
    pub fn finish_stream(&self) {
        let mut buf = vec![0u8; MAX_CHUNK];
        let mut read_so_far = 0;
        for i in 0..2 {
            while !self.eof[i].get() && read_so_far < MAX_FINAL_READ {
                let read = nix::unistd::read(self.pipes[i].get_ref(), &mut buf).map_err(io::Error::from);
                if read.as_ref().is_err_and(|e| e.kind() == io::ErrorKind::WouldBlock) {
                    break;
                }
                read_so_far += read.as_ref().map_or(0, |n| *n);
                self.took(i, read, &buf);
            }
        }
        self.queue.borrow_mut().close();
        (self.wake)();
    }

    fn took(&self, i: usize, read: io::Result<usize>, buf: &[u8]) {
        let n = match read {
            Ok(0) => {
                self.eof[i].set(true);
                return;
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return,
            Err(e) => {
                tracing::warn!(target: super::agent::LOG, "cannot read the command's {}: {e}", OutputStream::BOTH[i].name());
                self.eof[i].set(true);
                return;
            }
        };
        let bytes = &buf[..n];
        let mut file = self.file.borrow_mut();
        if let Some(f) = file.as_mut()
            && let Err(e) = f.write_all(bytes)
        {
            tracing::warn!(
                target: super::agent::LOG,
                "cannot write the command's output to {} ({e}): from here on it goes to the collector only",
                self.path.display()
            );
            *file = None;
        }
        self.queue.borrow_mut().push(OutputStream::BOTH[i], bytes);
        (self.wake)();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn popped(queue: &mut OutputQueue) -> Vec<(OutputStream, u64, usize)> {
        std::iter::from_fn(|| queue.pop())
            .map(|m| match m {
                Message::CommandOutput { stream, dropped, bytes } => (stream, dropped, bytes.len()),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn the_queue_keeps_order_merges_small_writes_and_splits_large_ones() {
        use OutputStream::{Stderr, Stdout};
        let mut q = OutputQueue::default();
        q.push(Stdout, b"a\n");
        q.push(Stdout, b"b\n");
        q.push(Stderr, b"e\n");
        q.push(Stdout, &vec![b'x'; MAX_CHUNK + 10]);
        assert_eq!(popped(&mut q), [(Stdout, 0, 4), (Stderr, 0, 2), (Stdout, 0, MAX_CHUNK), (Stdout, 0, 10)]);
        assert!(!q.finished(), "not closed");
        q.close();
        q.push(Stdout, b"late");
        assert_eq!(popped(&mut q), []);
        assert!(q.finished());
    }

    /// A collector that takes nothing: the queue holds at most MAX_QUEUED bytes, and whatever it
    /// dropped is told, per stream, before the bytes that follow the drop or once it is empty.
    #[test]
    fn the_queue_is_bounded_and_tells_what_it_dropped() {
        use OutputStream::{Stderr, Stdout};
        let mut q = OutputQueue::default();
        let piece = vec![b'x'; MAX_CHUNK];
        for _ in 0..1000 {
            q.push(Stdout, &piece);
        }
        q.push(Stderr, b"oops");
        assert_eq!(q.queued, MAX_QUEUED);
        let first = popped(&mut q);
        assert_eq!(first.len(), MAX_QUEUED / MAX_CHUNK + 2, "the chunks, then the two drops");
        let kept: usize = first.iter().map(|c| c.2).sum();
        assert_eq!(kept, MAX_QUEUED);
        let drops = [(Stdout, (1000 * MAX_CHUNK - MAX_QUEUED) as u64, 0), (Stderr, 4, 0)];
        assert_eq!(first[first.len() - 2..], drops);
        // Room again: the next bytes go.
        q.push(Stdout, b"back");
        assert_eq!(popped(&mut q), [(Stdout, 0, 4)]);
    }

    #[test]
    fn the_file_is_new_private_and_the_users() {
        let base = tempfile::tempdir().unwrap();
        let (first, _) = create(base.path(), 65534, 65534, 7).unwrap();
        assert_eq!(first, base.path().join("65534/trace-7.out"));
        let meta = std::fs::metadata(&first).unwrap();
        assert_eq!((meta.uid(), meta.gid(), meta.mode() & 0o7777, meta.len()), (65534, 65534, 0o600, 0));
        let dir = std::fs::metadata(base.path().join("65534")).unwrap();
        assert_eq!((dir.uid(), dir.mode() & 0o7777), (0, 0o755));
        // The same trace id again: another name, never the same file.
        assert_eq!(create(base.path(), 65534, 65534, 7).unwrap().0, base.path().join("65534/trace-7.1.out"));
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
