//! JSON lines: writing a trace (read back by [`crate::trace::read::jsonl`]).

use std::io::{self, BufWriter, Write};

use crate::{
    event::{Event, TraceEnd, TraceStart, fast_line, json::Line},
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
