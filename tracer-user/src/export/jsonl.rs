//! JSON lines: writing a trace, and reading one back.

use std::io::{self, BufRead, BufWriter, Write};

use crate::{
    event::{
        EndReason, Event, Interner, TraceEnd, TraceItem, TraceStart, fast_line,
        json::{self, Line},
    },
    sink::Sink,
};

pub struct JsonlWriter<W: Write> {
    out: BufWriter<W>,
    /// A call's or return's line, built here and written with one copy (see `event::fast_line`).
    buf: Vec<u8>,
}

impl<W: Write> JsonlWriter<W> {
    pub fn new(out: W) -> Self {
        JsonlWriter { out: BufWriter::with_capacity(1 << 20, out), buf: Vec::with_capacity(512) }
    }

    fn line(&mut self, line: Line) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, &line)?;
        self.out.write_all(b"\n")
    }
}

impl<W: Write> Sink for JsonlWriter<W> {
    fn begin(&mut self, start: &TraceStart) -> io::Result<()> {
        self.line(Line::Start(start))
    }
    fn event(&mut self, event: &Event) -> io::Result<()> {
        self.buf.clear();
        if fast_line::write(event, &mut self.buf) {
            self.buf.push(b'\n');
            return self.out.write_all(&self.buf);
        }
        self.line(Line::Event(event))
    }
    fn end(&mut self, end: &TraceEnd) -> io::Result<()> {
        self.line(Line::End(end))?;
        self.out.flush()
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("line {line}: {message}")]
    Malformed { line: u64, message: String },
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
    #[error("batch {batch}: {message}")]
    Batch { batch: u64, message: String },
    #[error("not a native trace: {0}")]
    Header(String),
}

/// A reader of a trace's items, in any format, for [`replay`].
pub trait ItemReader: Iterator<Item = Result<TraceItem, ReadError>> {
    /// What was left out at the end because the writer was killed while writing it, if anything.
    fn torn(&self) -> Option<String>;
    /// An error at the reader's position.
    fn error_here(&self, message: &str) -> ReadError;
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

impl<R: BufRead> ItemReader for TraceReader<R> {
    fn torn(&self) -> Option<String> {
        self.torn.then(|| "its last line is torn".to_string())
    }
    fn error_here(&self, message: &str) -> ReadError {
        ReadError::Malformed { line: self.line, message: message.to_string() }
    }
}

/// Reads a JSON lines trace, one line at a time (memory does not grow with the trace).
///
/// A last line that has no newline and does not parse is the torn tail of a trace whose writer
/// was killed mid-write: it ends the trace (see [`ItemReader::torn`]) instead of failing it.
pub struct TraceReader<R: BufRead> {
    input: R,
    buf: String,
    line: u64,
    interner: Interner,
    torn: bool,
}

impl<R: BufRead> TraceReader<R> {
    pub fn new(input: R) -> Self {
        TraceReader { input, buf: String::new(), line: 0, interner: Interner::default(), torn: false }
    }

    fn parse(&mut self) -> Result<TraceItem, ReadError> {
        json::parse_line(self.buf.trim_end(), &mut self.interner)
            .map_err(|message| ReadError::Malformed { line: self.line, message })
    }
}

impl<R: BufRead> Iterator for TraceReader<R> {
    type Item = Result<TraceItem, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            self.buf.clear();
            match self.input.read_line(&mut self.buf) {
                Ok(0) => return None,
                Ok(_) => {
                    self.line += 1;
                    if self.buf.trim().is_empty() {
                        continue;
                    }
                    let parsed = self.parse();
                    if parsed.is_err() && !self.buf.ends_with('\n') {
                        self.torn = true;
                        return None;
                    }
                    return Some(parsed);
                }
                Err(e) => return Some(Err(e.into())),
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
                return Err(lines.error_here("a second trace_start"));
            }
        }
    }
    sink.end(&TraceEnd::new(last_ts, EndReason::InputEnded, events)).map_err(ReadError::Write)?;
    Ok(Replayed { events, end_missing: true, torn: lines.torn() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::test_events;

    fn start() -> TraceStart {
        test_events::start(1_000)
    }

    fn call(ts: u64) -> Event {
        test_events::call(ts, 1, "f")
    }

    fn to_line(e: &Event) -> String {
        serde_json::to_string(&Line::Event(e)).unwrap()
    }

    fn write_trace(events: &[Event], end: Option<&TraceEnd>) -> Vec<u8> {
        let mut out = Vec::new();
        {
            let mut w = JsonlWriter::new(&mut out);
            w.begin(&start()).unwrap();
            for e in events {
                w.event(e).unwrap();
            }
            if let Some(end) = end {
                w.end(end).unwrap();
            } else {
                w.out.flush().unwrap();
            }
        }
        out
    }

    #[test]
    fn round_trips_a_trace() {
        let end = TraceEnd {
            ts: 9,
            reason: EndReason::Duration,
            events_written: 2,
            lost_events: [("call".to_string(), 0)].into(),
            calls_without_return_probe: 0,
            command_exit_code: None,
            ipc: Default::default(),
            hosts: Vec::new(),
            filters: Default::default(),
            unmatched_functions: None,
        };
        let bytes = write_trace(&[call(2), call(3)], Some(&end));
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert_eq!(text.lines().count(), 4);
        assert!(text.starts_with(r#"{"kind":"trace_start""#));
        let lines: Vec<TraceItem> = TraceReader::new(&bytes[..]).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            lines,
            vec![
                TraceItem::Start(Box::new(start())),
                TraceItem::Event(call(2)),
                TraceItem::Event(call(3)),
                TraceItem::End(end)
            ]
        );
    }

    #[test]
    fn replay_makes_up_a_missing_end() {
        let bytes = write_trace(&[call(2_000), call(7_000)], None);
        let mut out = Vec::new();
        let replayed = replay(TraceReader::new(&bytes[..]), &mut JsonlWriter::new(&mut out)).unwrap();
        assert_eq!(replayed, Replayed { events: 2, end_missing: true, torn: None });
        let last = String::from_utf8(out).unwrap().lines().last().unwrap().to_string();
        assert!(
            last.starts_with(r#"{"kind":"trace_end","ts":7000,"reason":"input_ended","events_written":2"#),
            "{last}"
        );
    }

    /// A writer killed mid-line leaves a last line without its newline: the events before it are
    /// read, and the torn line is reported, not taken for a malformed trace.
    #[test]
    fn a_torn_last_line_ends_the_trace() {
        let mut bytes = write_trace(&[call(2_000), call(7_000)], None);
        let whole = to_line(&call(9_000));
        bytes.extend_from_slice(&whole.as_bytes()[..whole.len() / 2]);
        let replayed = replay(TraceReader::new(&bytes[..]), &mut JsonlWriter::new(Vec::new())).unwrap();
        assert_eq!(replayed, Replayed { events: 2, end_missing: true, torn: Some("its last line is torn".into()) });
        // A bad line inside the trace is still an error.
        bytes.extend_from_slice(b"\n");
        bytes.extend_from_slice(to_line(&call(9_500)).as_bytes());
        assert!(replay(TraceReader::new(&bytes[..]), &mut JsonlWriter::new(Vec::new())).is_err());
    }

    #[test]
    fn bad_lines_are_located() {
        let mut bytes = write_trace(&[call(2)], None);
        bytes.extend_from_slice(b"{\"kind\":\"call\",\"ts\":1}\n");
        let err = TraceReader::new(&bytes[..]).collect::<Result<Vec<_>, _>>().unwrap_err();
        assert_eq!(err.to_string(), "line 3: missing field `function`");
        let err = replay(TraceReader::new(&b"not json\n"[..]), &mut JsonlWriter::new(Vec::new())).unwrap_err();
        assert!(err.to_string().starts_with("line 1: "), "{err}");
        let err = replay(TraceReader::new(&b""[..]), &mut JsonlWriter::new(Vec::new())).unwrap_err();
        assert_eq!(err.to_string(), "the trace is empty");
        let only_event = to_line(&call(1));
        let err = replay(TraceReader::new(only_event.as_bytes()), &mut JsonlWriter::new(Vec::new())).unwrap_err();
        assert_eq!(err.to_string(), "line 1: a trace must start with a trace_start line");
    }
}
