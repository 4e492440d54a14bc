//! What happens to events between the assembler (or the network, for a collector) and the sink:
//! with `--min-duration-keep-children`, the short calls are held and decided ([`KeepChildren`]);
//! they are put in time order ([`Reorder`]), linked ([`FlowMatcher`]) unless the sink passes them
//! on to be linked further on ([`Sink::wants_flow_links`]: an agent's), and filtered to the kinds
//! the user asked for (IPC records come both ways even when only sends were asked for).

pub mod flows;
pub mod keep_children;
pub mod order;

use std::{collections::BTreeSet, io};

use crate::{
    event::{Event, EventKind, IpcStats},
    pipeline::flows::FlowMatcher,
    pipeline::keep_children::KeepChildren,
    pipeline::order::Reorder,
    sink::Sink,
};

pub struct EventPipeline {
    keep_children: Option<KeepChildren>,
    reorder: Reorder,
    matcher: FlowMatcher,
    kinds: BTreeSet<EventKind>,
    /// Events passed to the sink.
    pub written: u64,
}

impl EventPipeline {
    pub fn new(kinds: BTreeSet<EventKind>) -> Self {
        EventPipeline {
            keep_children: None,
            reorder: Reorder::default(),
            matcher: FlowMatcher::default(),
            kinds,
            written: 0,
        }
    }

    /// Calls go through `stage` first (`--min-duration-keep-children`).
    pub fn with_keep_children(mut self, stage: Option<KeepChildren>) -> Self {
        self.keep_children = stage;
        self
    }

    pub fn push(&mut self, event: Event) {
        match &mut self.keep_children {
            Some(stage) => stage.push(event, &mut |e| self.reorder.push(e)),
            None => self.reorder.push(event),
        }
    }

    /// What `--min-duration-keep-children` decided, per function.
    pub fn keep_children(&self) -> Option<&KeepChildren> {
        self.keep_children.as_ref()
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
        if let Some(stage) = &mut self.keep_children {
            stage.finish();
        }
        while let Some(e) = self.reorder.pop_any() {
            self.emit(e, sink)?;
        }
        Ok(())
    }

    fn emit(&mut self, mut event: Event, sink: &mut dyn Sink) -> io::Result<()> {
        if sink.wants_flow_links() {
            self.matcher.process(&mut event);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        event::{EventData, TraceEnd, TraceStart, data},
        pipeline::flows::tests::{recv, send, tcp},
    };

    /// Keeps the events, and says whether it wants them linked.
    struct Kept {
        links: bool,
        events: Vec<Event>,
    }

    impl Sink for Kept {
        fn begin(&mut self, _: &TraceStart) -> io::Result<()> {
            Ok(())
        }
        fn event(&mut self, event: &Event) -> io::Result<()> {
            self.events.push(event.clone());
            Ok(())
        }
        fn end(&mut self, _: &TraceEnd) -> io::Result<()> {
            Ok(())
        }
        fn wants_flow_links(&self) -> bool {
            self.links
        }
    }

    fn through(links: bool) -> (Vec<Event>, IpcStats) {
        let mut pipeline = EventPipeline::new(EventKind::ALL.into_iter().collect());
        pipeline.push(send("h", tcp(), 10, Some(100), None));
        let mut r = recv("h", tcp(), 10, Some(100), None);
        r.ts = 1;
        pipeline.push(r);
        let mut sink = Kept { links, events: Vec::new() };
        pipeline.flush_all(&mut sink).unwrap();
        (sink.events, pipeline.ipc_stats())
    }

    #[test]
    fn flows_are_linked_only_for_a_sink_that_wants_the_links() {
        let link = |e: &Event| match &e.data {
            EventData::Send(data::Send { flow_id, .. }) => vec![*flow_id],
            EventData::Recv(data::Recv { flow_ids, .. }) => flow_ids.clone(),
            other => panic!("not IPC: {other:?}"),
        };
        let (linked, stats) = through(true);
        assert_eq!(linked.iter().map(link).collect::<Vec<_>>(), [vec![1], vec![1]]);
        assert_eq!((stats.sends, stats.linked_recvs), (1, 1));
        // An agent's sink: its collector links them.
        let (unlinked, stats) = through(false);
        assert_eq!(unlinked.iter().map(link).collect::<Vec<_>>(), [vec![0], vec![]]);
        assert_eq!(stats, IpcStats::default());
    }
}
