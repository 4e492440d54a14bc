//! Flame graph data (`.flame.json`): a JSON array of root nodes, one per traced process, each node
//! `{"name", "value", "children"}` with `value` in nanoseconds (see [`crate::analysis::flame_stacks`] for
//! what counts). d3-flame-graph reads it as is.
//!
//! The flame graph formats (this one, [`super::folded`], [`super::svg`]) share [`StackSink`]: it
//! aggregates stacks as the trace streams, and renders them when it ends.

use std::io::{self, BufWriter, Write};

use crate::{
    analysis::flame_stacks::{FlameNode, StackCollector},
    event::{Event, TraceEnd, TraceStart},
    sink::Sink,
};

/// Renders the finished flame graph roots to the output.
pub type Render = fn(&[FlameNode], &mut dyn Write) -> io::Result<()>;

/// A sink that aggregates call stacks and renders them at the end of the trace.
pub struct StackSink<W: Write> {
    out: BufWriter<W>,
    stacks: StackCollector,
    render: Render,
}

impl<W: Write> StackSink<W> {
    pub fn new(out: W, render: Render) -> Self {
        StackSink { out: BufWriter::new(out), stacks: StackCollector::default(), render }
    }
}

impl<W: Write> Sink for StackSink<W> {
    fn begin(&mut self, start: &TraceStart) -> io::Result<()> {
        self.stacks.begin(start);
        Ok(())
    }

    fn event(&mut self, event: &Event) -> io::Result<()> {
        self.stacks.event(event);
        Ok(())
    }

    fn end(&mut self, end: &TraceEnd) -> io::Result<()> {
        let roots = self.stacks.finish(end);
        (self.render)(&roots, &mut self.out)?;
        self.out.flush()
    }
}

/// Writes the roots as a JSON array.
pub fn write(roots: &[FlameNode], out: &mut dyn Write) -> io::Result<()> {
    serde_json::to_writer(&mut *out, roots)?;
    out.write_all(b"\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        event::test_events::{call, ret},
        event::test_events::{end, start},
    };

    #[test]
    fn writes_the_tree_as_json() {
        let mut out = Vec::new();
        let mut sink = StackSink::new(&mut out, write);
        sink.begin(&start(0)).unwrap();
        for e in [call(100, 1, "main"), call(200, 1, "work"), ret(300, 1, "work", Some(100))] {
            sink.event(&e).unwrap();
        }
        sink.end(&end(1000)).unwrap();
        drop(sink);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"[{"name":"app (1)","value":900,"children":[{"name":"main","value":900,"children":[{"name":"work","value":100,"children":[]}]}]}]"#.to_string() + "\n"
        );
    }
}
