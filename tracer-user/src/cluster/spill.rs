//! Where the collector keeps each host's stream while a trace runs: one file per host in the
//! native format ([`crate::export::native`]), in a private directory (mode 0700, whatever the
//! umask) that is removed with the trace, also when the collector fails or is stopped by a signal
//! it handles. Memory holds one batch per host, not the trace; the merge at the stop reads the
//! files back ([`super::merge`]).

use std::{
    fs::{File, Permissions},
    io,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    sync::Arc,
};

use crate::{
    event::{Event, TraceItem},
    export::native::NativeWriter,
    sink::Sink as _,
    trace::read::native::NativeReader,
};

/// The private directory of one trace's spill files; removed when the last of its files is
/// dropped.
#[derive(Debug)]
pub struct SpillDir {
    dir: tempfile::TempDir,
}

impl SpillDir {
    /// Creates `.tracer-collect-XXXXXX` in `parent` (the output's directory), or in `$TMPDIR`.
    pub fn create(parent: Option<&Path>) -> io::Result<Arc<SpillDir>> {
        let parent = match parent {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => std::env::temp_dir(),
        };
        let dir = tempfile::Builder::new()
            .prefix(".tracer-collect-")
            .permissions(Permissions::from_mode(0o700))
            .tempdir_in(&parent)
            .map_err(|e| {
                io::Error::new(e.kind(), format!("cannot create a spill directory in {}: {e}", parent.display()))
            })?;
        Ok(Arc::new(SpillDir { dir }))
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The spill file of host `index`.
    pub fn host(self: &Arc<Self>, index: usize) -> io::Result<HostSpill> {
        let path = self.dir.path().join(format!("host-{index}.trc"));
        let file = File::options().write(true).create_new(true).open(&path)?;
        Ok(HostSpill { path, writer: NativeWriter::new(file), events: 0, _dir: self.clone() })
    }
}

/// One host's stream, appended as batches arrive.
pub struct HostSpill {
    path: PathBuf,
    writer: NativeWriter<File>,
    events: u64,
    /// Keeps the directory until every file in it is done with.
    _dir: Arc<SpillDir>,
}

impl HostSpill {
    pub fn push(&mut self, event: &Event) -> io::Result<()> {
        self.events += 1;
        self.writer.event(event)
    }

    /// Events written so far.
    pub fn len(&self) -> u64 {
        self.events
    }

    pub fn is_empty(&self) -> bool {
        self.events == 0
    }

    /// Hands what is buffered to the file and returns where to read it: every event pushed so far
    /// is then readable with [`read`].
    pub fn flushed(&mut self) -> io::Result<SpilledEvents> {
        self.writer.flush()?;
        Ok(SpilledEvents { path: self.path.clone(), events: self.events, _dir: self._dir.clone() })
    }
}

/// The first `events` events of a spill file (more may be appended meanwhile).
#[derive(Clone, Debug)]
pub struct SpilledEvents {
    path: PathBuf,
    events: u64,
    _dir: Arc<SpillDir>,
}

impl SpilledEvents {
    pub fn len(&self) -> u64 {
        self.events
    }

    pub fn is_empty(&self) -> bool {
        self.events == 0
    }

    /// Reads the events back, in the order they were pushed.
    pub fn read(&self) -> io::Result<impl Iterator<Item = io::Result<Event>> + use<>> {
        read(&self.path, self.events)
    }
}

/// The first `events` events of the spill file at `path`.
pub fn read(path: &Path, events: u64) -> io::Result<impl Iterator<Item = io::Result<Event>> + use<>> {
    let file = io::BufReader::with_capacity(1 << 20, File::open(path)?);
    let spill = path.display().to_string();
    let items = NativeReader::new(file).filter_map(move |item| match item {
        Ok(TraceItem::Event(e)) => Some(Ok(e)),
        Ok(_) => None,
        Err(e) => Some(Err(io::Error::other(format!("reading the spill file {spill}: {e}")))),
    });
    Ok(items.take(events as usize))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::test_events::thread_exit;

    #[test]
    fn a_spill_is_private_read_back_in_order_and_removed_with_its_files() {
        let parent = tempfile::tempdir().unwrap();
        let dir = SpillDir::create(Some(parent.path())).unwrap();
        let path = dir.path().to_path_buf();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o700);
        let mut host = dir.host(0).unwrap();
        drop(dir);
        for ts in 0..10_000 {
            host.push(&thread_exit(ts, 1)).unwrap();
        }
        let first = host.flushed().unwrap();
        host.push(&thread_exit(10_000, 1)).unwrap();
        let ts: Vec<u64> = first.read().unwrap().map(|e| e.unwrap().ts).collect();
        assert_eq!(ts, (0..10_000).collect::<Vec<_>>(), "what was flushed, not what came after");
        assert_eq!(host.flushed().unwrap().read().unwrap().count(), 10_001);
        drop((host, first));
        assert!(!path.exists(), "removed with the last file");
    }
}
