//! What happens to events between the assembler (or the network, for a collector) and the sink:
//! they are put in time order ([`Reorder`]), linked ([`FlowMatcher`]), and filtered to the kinds the
//! user asked for (IPC records come both ways even when only sends were asked for).

pub mod flows;
pub mod order;

use std::{collections::BTreeSet, io};

use crate::{
    event::{Event, EventKind, IpcStats},
    pipeline::flows::FlowMatcher,
    pipeline::order::Reorder,
    sink::Sink,
};

pub struct EventPipeline {
    reorder: Reorder,
    matcher: FlowMatcher,
    kinds: BTreeSet<EventKind>,
    /// Events passed to the sink.
    pub written: u64,
}

impl EventPipeline {
    pub fn new(kinds: BTreeSet<EventKind>) -> Self {
        EventPipeline { reorder: Reorder::default(), matcher: FlowMatcher::default(), kinds, written: 0 }
    }

    pub fn push(&mut self, event: Event) {
        self.reorder.push(event);
    }

    /// Passes on the events the trace has moved a window past.
    pub fn flush_ready(&mut self, sink: &mut dyn Sink) -> io::Result<()> {
        while let Some(e) = self.reorder.pop_ready() {
            self.emit(e, sink)?;
        }
        Ok(())
    }

    /// Passes on the events older than `cutoff` (Unix ns): for quiet moments, when no newer
    /// event pushes older ones out.
    pub fn flush_older_than(&mut self, cutoff: u64, sink: &mut dyn Sink) -> io::Result<()> {
        while let Some(e) = self.reorder.pop_older_than(cutoff) {
            self.emit(e, sink)?;
        }
        Ok(())
    }

    /// Passes on everything (the trace is over).
    pub fn flush_all(&mut self, sink: &mut dyn Sink) -> io::Result<()> {
        while let Some(e) = self.reorder.pop_any() {
            self.emit(e, sink)?;
        }
        Ok(())
    }

    fn emit(&mut self, mut event: Event, sink: &mut dyn Sink) -> io::Result<()> {
        self.matcher.process(&mut event);
        if self.kinds.contains(&event.data.kind()) {
            sink.event(&event)?;
            self.written += 1;
        }
        Ok(())
    }

    pub fn ipc_stats(&self) -> IpcStats {
        self.matcher.stats.clone()
    }
}
