//! One page of a thread's call tree, as `tracer calls --tid N` prints it (calls, and inline what
//! the program said and each send and receive): the trace is read again from its file for each
//! page (the server keeps no events), and reading stops once the page and the line after it
//! (which says there is a next page) are in. In a trace of several hosts a thread is named by its
//! host and tid: only that host's events are read (a tid names a thread on one host only).

use std::{
    fs::File,
    io::{self, BufReader, Write},
    path::Path,
};

use serde::Serialize;

use crate::{
    analysis::call_listing::{CallFilter, CallPrinter},
    event::{Event, TraceEnd, TraceStart},
    sink::Sink,
    trace::read::{self, AnyReader},
};

/// Lines in a page.
pub const PAGE_LINES: usize = 200;

#[derive(Debug, Serialize)]
pub struct CallsPage {
    pub host: Option<String>,
    pub tid: u32,
    pub page: u64,
    pub lines: Vec<String>,
    pub has_next: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum CallsPageError {
    #[error("cannot read {path}")]
    Open { path: String, source: io::Error },
    #[error("cannot read {path}")]
    Detect { path: String, source: read::OpenError },
    #[error("{path} is not a valid trace")]
    Read { path: String, source: read::ReadError },
}

/// Keeps the lines of one page; fails once it has them and the next, which ends the replay.
struct PageWriter {
    first: u64,
    seen: u64,
    partial: Vec<u8>,
    lines: Vec<String>,
    has_next: bool,
}

impl Write for PageWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        for &b in buf {
            if b != b'\n' {
                self.partial.push(b);
                continue;
            }
            let line = String::from_utf8_lossy(&self.partial).into_owned();
            self.partial.clear();
            if self.seen >= self.first && self.lines.len() < PAGE_LINES {
                self.lines.push(line);
            } else if self.seen >= self.first {
                self.has_next = true;
                return Err(io::Error::other("page full"));
            }
            self.seen += 1;
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Passes on the events of one host only.
struct OneHost<'h, S> {
    host: &'h str,
    sink: S,
}

impl<S: Sink> Sink for OneHost<'_, S> {
    fn begin(&mut self, start: &TraceStart) -> io::Result<()> {
        self.sink.begin(start)
    }
    fn event(&mut self, e: &Event) -> io::Result<()> {
        if &*e.host == self.host { self.sink.event(e) } else { Ok(()) }
    }
    fn end(&mut self, end: &TraceEnd) -> io::Result<()> {
        self.sink.end(end)
    }
}

/// Page `page` (from 0) of thread `tid`'s calls (on `host`, or on any) in the trace at `path`.
pub fn read(path: &Path, host: Option<&str>, tid: u32, page: u64) -> Result<CallsPage, CallsPageError> {
    let name = || path.display().to_string();
    let file = File::open(path).map_err(|source| CallsPageError::Open { path: name(), source })?;
    let trace = AnyReader::detect(BufReader::with_capacity(1 << 20, file))
        .map_err(|source| CallsPageError::Detect { path: name(), source })?;
    let first = page.saturating_mul(PAGE_LINES as u64);
    let mut writer = PageWriter { first, seen: 0, partial: Vec::new(), lines: Vec::new(), has_next: false };
    let printer = CallPrinter::new(&mut writer, CallFilter { tid: Some(tid), ..CallFilter::default() });
    let mut printer = OneHost { host: host.unwrap_or(""), sink: printer };
    let replayed = match host {
        Some(_) => read::replay(trace, &mut printer),
        None => read::replay(trace, &mut printer.sink),
    };
    match replayed {
        Ok(_) | Err(read::ReadError::Write(_)) => {}
        Err(source) => return Err(CallsPageError::Read { path: name(), source }),
    }
    drop(printer);
    Ok(CallsPage { host: host.map(str::to_string), tid, page, lines: writer.lines, has_next: writer.has_next })
}
