//! JSON lines: reading a trace back, one line at a time.

use std::io::BufRead;

use super::{ItemReader, LineError, Misplaced, ReadError};
use crate::event::{Interner, TraceItem, json};

impl<R: BufRead> ItemReader for TraceReader<R> {
    fn torn(&self) -> Option<String> {
        self.torn.then(|| "its last line is torn".to_string())
    }
    fn error_here(&self, misplaced: Misplaced) -> ReadError {
        ReadError::Malformed { line: self.line, problem: LineError::Misplaced(misplaced) }
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
            .map_err(|e| ReadError::Malformed { line: self.line, problem: LineError::Parse(e) })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        event::{EndReason, Event, TraceEnd, TraceStart, json::Line, test_events},
        export::jsonl::JsonlWriter,
        sink::Sink,
        trace::read::{Replayed, replay},
    };

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
                w.flush().unwrap();
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
            execs_probed_late: None,
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
