//! Reading a recorded trace back, in every format tracer reads: JSON lines ([`jsonl`]), the
//! native format ([`native`]), and Perfetto's protobuf ([`perfetto`], which tests and exports
//! check their output with). `report`, `calls`, `export`, the viewer and the collector's spill all
//! read through here.
//!
//! A trace's format is told by its first bytes (not by its name): JSON lines, or the native
//! format. A file that is neither is told apart by its first bytes too, so that the user hears
//! what it is (a packet capture, a Perfetto or Chrome trace) rather than a parser's complaint
//! about its first byte.

pub mod jsonl;
pub mod native;
pub mod perfetto;

use std::io::{self, BufRead};

use self::{
    jsonl::TraceReader,
    native::{NativeReader, is_native},
};
use crate::{
    event::{EndReason, Event, TraceEnd, TraceItem, json},
    sink::Sink,
};

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("line {line}: {problem}")]
    Malformed { line: u64, problem: LineError },
    #[error("cannot read the trace")]
    Io(#[from] io::Error),
    /// The output the trace was replayed into failed (a full disk, a reader that went away):
    /// not the trace's fault.
    #[error("cannot write the output")]
    Write(#[source] io::Error),
    #[error("the trace is empty")]
    Empty,
    #[error("line 1: a trace must start with a trace_start line")]
    NoStart,
    #[error("batch {batch}: {problem}")]
    Batch { batch: u64, problem: native::BatchError },
    #[error("not a native trace: {0}")]
    Header(native::HeaderError),
}

/// What is wrong with a line of JSON lines. Said in the line's error, not as its source: it is
/// the whole cause.
#[derive(Debug, thiserror::Error)]
pub enum LineError {
    #[error("{0}")]
    Parse(json::ParseError),
    #[error("{0}")]
    Misplaced(Misplaced),
}

/// An item where a trace may not have it, whatever the format.
#[derive(Debug, thiserror::Error)]
pub enum Misplaced {
    #[error("a second trace_start")]
    SecondStart,
}

/// A reader of a trace's items, in any format, for [`replay`].
pub trait ItemReader: Iterator<Item = Result<TraceItem, ReadError>> {
    /// What was left out at the end because the writer was killed while writing it, if anything.
    fn torn(&self) -> Option<String>;
    /// An error at the reader's position.
    fn error_here(&self, misplaced: Misplaced) -> ReadError;
    /// Hands each event to `each` until an item that is not an event, which it returns (`None`
    /// at the end). A reader that decodes events one by one overrides it to skip the moves of
    /// [`TraceItem`]s, which dominate replaying a compact trace.
    fn feed_events(&mut self, each: &mut dyn FnMut(&Event) -> io::Result<()>) -> Option<Result<TraceItem, ReadError>> {
        loop {
            match self.next()? {
                Ok(TraceItem::Event(e)) => {
                    if let Err(e) = each(&e) {
                        return Some(Err(ReadError::Write(e)));
                    }
                }
                other => return Some(other),
            }
        }
    }
}

/// What replaying a trace into a sink found.
#[derive(Debug, PartialEq, Eq)]
pub struct Replayed {
    pub events: u64,
    /// The trace had no `trace_end` (it was cut short); one was made up from the last event.
    pub end_missing: bool,
    /// What was torn at its end (the writer was killed while writing it) and left out.
    pub torn: Option<String>,
}

/// Feeds a whole trace to a sink: the start line, each event, the end line.
pub fn replay(reader: impl ItemReader, sink: &mut dyn Sink) -> Result<Replayed, ReadError> {
    let mut lines = reader;
    let start = match lines.next() {
        None => return Err(ReadError::Empty),
        Some(Ok(TraceItem::Start(start))) => start,
        Some(Ok(_)) => return Err(ReadError::NoStart),
        Some(Err(e)) => return Err(e),
    };
    sink.begin(&start).map_err(ReadError::Write)?;
    let mut events = 0;
    let mut last_ts = start.ts;
    let mut each = |e: &Event| {
        last_ts = last_ts.max(e.ts);
        events += 1;
        sink.event(e)
    };
    while let Some(item) = lines.feed_events(&mut each) {
        match item? {
            TraceItem::Event(e) => each(&e).map_err(ReadError::Write)?,
            TraceItem::End(end) => {
                sink.end(&end).map_err(ReadError::Write)?;
                return Ok(Replayed { events, end_missing: false, torn: None });
            }
            TraceItem::Start(_) => {
                return Err(lines.error_here(Misplaced::SecondStart));
            }
        }
    }
    sink.end(&TraceEnd::new(last_ts, EndReason::InputEnded, events)).map_err(ReadError::Write)?;
    Ok(Replayed { events, end_missing: true, torn: lines.torn() })
}

/// A trace being read.
pub enum AnyReader<R: BufRead> {
    Jsonl(TraceReader<R>),
    Native(NativeReader<R>),
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Io(#[from] io::Error),
    /// What the file is instead, as [`not_a_trace`] tells it.
    #[error("{0}, not a trace")]
    NotATrace(&'static str),
}

/// What a file is when its first bytes show it is not a trace `tracer record` wrote (JSON lines or
/// native); `None` when it may be one (the readers then say what is wrong with it, and where).
pub fn not_a_trace(head: &[u8]) -> Option<&'static str> {
    if head.is_empty() || is_native(head) {
        return None;
    }
    match head {
        [0x0A, 0x0D, 0x0D, 0x0A, ..] => return Some("a pcapng packet capture"),
        [0xD4, 0xC3, 0xB2, 0xA1, ..]
        | [0xA1, 0xB2, 0xC3, 0xD4, ..]
        | [0x4D, 0x3C, 0xB2, 0xA1, ..]
        | [0xA1, 0xB2, 0x3C, 0x4D, ..] => return Some("a pcap packet capture"),
        [0x1F, 0x8B, ..] => return Some("gzip-compressed"),
        [0x28, 0xB5, 0x2F, 0xFD, ..] => return Some("zstd-compressed"),
        [0x7F, b'E', b'L', b'F', ..] => return Some("an ELF file (a program or library)"),
        _ => {}
    }
    // Text: valid UTF-8 (but for a character cut at the end of `head`) without control bytes
    // other than whitespace.
    let text = match std::str::from_utf8(head) {
        Ok(text) => text,
        Err(e) if e.error_len().is_none() => std::str::from_utf8(&head[..e.valid_up_to()]).unwrap_or_default(),
        Err(_) => "",
    };
    let is_text = text.len() + 4 > head.len() && !text.bytes().any(|b| b < 0x20 && !b"\n\r\t".contains(&b));
    if !is_text {
        // A Perfetto trace is a `Trace` message: its packets are field 1, length-delimited (0x0A).
        return Some(if head[0] == 0x0A {
            "a Perfetto protobuf trace"
        } else {
            "binary data of no format tracer reads"
        });
    }
    let first_line = text.trim_start().lines().next().unwrap_or_default();
    if first_line.starts_with('[') {
        return Some("a JSON array (a Chrome trace or a flame graph)");
    }
    if first_line.starts_with('{') {
        return if first_line.contains("\"traceEvents\"") {
            Some("a Chrome trace (JSON)")
        } else if first_line.contains("speedscope") {
            Some("a speedscope profile")
        } else {
            None
        };
    }
    Some("text that is not JSON lines (its first line is not a JSON object)")
}

impl<R: BufRead> AnyReader<R> {
    /// Looks at the input's first bytes to tell its format.
    pub fn detect(mut input: R) -> Result<AnyReader<R>, OpenError> {
        let head = input.fill_buf()?;
        if let Some(what) = not_a_trace(head) {
            return Err(OpenError::NotATrace(what));
        }
        Ok(if is_native(head) {
            AnyReader::Native(NativeReader::new(input))
        } else {
            AnyReader::Jsonl(TraceReader::new(input))
        })
    }
}

impl<R: BufRead> Iterator for AnyReader<R> {
    type Item = Result<TraceItem, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            AnyReader::Jsonl(r) => r.next(),
            AnyReader::Native(r) => r.next(),
        }
    }
}

impl<R: BufRead> ItemReader for AnyReader<R> {
    fn torn(&self) -> Option<String> {
        match self {
            AnyReader::Jsonl(r) => r.torn(),
            AnyReader::Native(r) => r.torn(),
        }
    }
    fn error_here(&self, misplaced: Misplaced) -> ReadError {
        match self {
            AnyReader::Jsonl(r) => r.error_here(misplaced),
            AnyReader::Native(r) => r.error_here(misplaced),
        }
    }
    fn feed_events(&mut self, each: &mut dyn FnMut(&Event) -> io::Result<()>) -> Option<Result<TraceItem, ReadError>> {
        match self {
            AnyReader::Jsonl(r) => r.feed_events(each),
            AnyReader::Native(r) => r.feed_events(each),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_that_are_not_traces_are_named() {
        assert_eq!(not_a_trace(&[0x0A, 0x0D, 0x0D, 0x0A, 0x1C, 0, 0, 0]), Some("a pcapng packet capture"));
        assert_eq!(not_a_trace(&[0xD4, 0xC3, 0xB2, 0xA1, 2, 0]), Some("a pcap packet capture"));
        assert_eq!(not_a_trace(&[0x0A, 0x85, 0x01, 0xE2, 0x03, 0x00, 0x10]), Some("a Perfetto protobuf trace"));
        assert_eq!(not_a_trace(b"{\"traceEvents\":[{\"name\":\"fib\"}]}"), Some("a Chrome trace (JSON)"));
        assert_eq!(
            not_a_trace(b"[{\"name\":\"fib\",\"ph\":\"X\"}]"),
            Some("a JSON array (a Chrome trace or a flame graph)")
        );
        assert_eq!(
            not_a_trace(b"garbage\n"),
            Some("text that is not JSON lines (its first line is not a JSON object)")
        );
        assert_eq!(not_a_trace(&[0x00, 0xFF, 0x13, 0x37]), Some("binary data of no format tracer reads"));
        assert_eq!(not_a_trace(b"\x7fELF\x02\x01"), Some("an ELF file (a program or library)"));
        // What may be a trace is left to the readers, which say where it is wrong.
        assert_eq!(not_a_trace(b"{\"kind\":\"trace_start\"}\n"), None);
        assert_eq!(not_a_trace(b"{\"kind\":\"trace_start\",\"host\":\"h\xC3"), None, "a character cut at the end");
        assert_eq!(not_a_trace(b""), None);
    }
}
