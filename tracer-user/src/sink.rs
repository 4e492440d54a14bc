//! Where a trace goes: anything that takes the start, each event, and the end. File formats
//! (see [`crate::export`]) are sinks; so are a channel and a callback, for library users.

use std::io;

use crate::event::{Event, TraceEnd, TraceItem, TraceStart};

pub trait Sink {
    fn begin(&mut self, start: &TraceStart) -> io::Result<()>;
    fn event(&mut self, event: &Event) -> io::Result<()>;
    fn end(&mut self, end: &TraceEnd) -> io::Result<()>;
    /// Hands what is buffered to the file, so that a crash of the tracer loses none of it
    /// (called every [`crate::record`] flush interval). Formats that are only readable once
    /// complete need not.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
    /// An event of a merged multi-host trace, whose `ts` is on the collector's clock, with its
    /// time on its own host's clock (`host_ts`): for sinks that must name it as the host's agent
    /// did (OTLP ids). Others take the event.
    fn event_on_host_clock(&mut self, event: &Event, host_ts: u64) -> io::Result<()> {
        let _ = host_ts;
        self.event(event)
    }
    /// Whether the events this sink takes need their flow links ([`crate::pipeline::flows`]):
    /// false for a sink that passes them on to be linked further on (an agent's: its collector
    /// links flows across hosts, once).
    fn wants_flow_links(&self) -> bool {
        true
    }
}

/// Sends every item to a channel. A closed receiver is an error (the trace would be lost).
pub struct ChannelSink {
    tx: std::sync::mpsc::Sender<TraceItem>,
}

impl ChannelSink {
    pub fn new(tx: std::sync::mpsc::Sender<TraceItem>) -> Self {
        ChannelSink { tx }
    }

    fn send(&self, item: TraceItem) -> io::Result<()> {
        self.tx.send(item).map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the trace's receiver was dropped"))
    }
}

impl Sink for ChannelSink {
    fn begin(&mut self, start: &TraceStart) -> io::Result<()> {
        self.send(TraceItem::Start(Box::new(start.clone())))
    }
    fn event(&mut self, event: &Event) -> io::Result<()> {
        self.send(TraceItem::Event(event.clone()))
    }
    fn end(&mut self, end: &TraceEnd) -> io::Result<()> {
        self.send(TraceItem::End(end.clone()))
    }
}

/// Calls a function with every event (start and end are ignored).
pub struct CallbackSink<F: FnMut(&Event)> {
    f: F,
}

impl<F: FnMut(&Event)> CallbackSink<F> {
    pub fn new(f: F) -> Self {
        CallbackSink { f }
    }
}

impl<F: FnMut(&Event)> Sink for CallbackSink<F> {
    fn begin(&mut self, _: &TraceStart) -> io::Result<()> {
        Ok(())
    }
    fn event(&mut self, event: &Event) -> io::Result<()> {
        (self.f)(event);
        Ok(())
    }
    fn end(&mut self, _: &TraceEnd) -> io::Result<()> {
        Ok(())
    }
}

/// Passes everything to several sinks in turn.
impl Sink for Vec<Box<dyn Sink + Send>> {
    fn begin(&mut self, start: &TraceStart) -> io::Result<()> {
        self.iter_mut().try_for_each(|s| s.begin(start))
    }
    fn event(&mut self, event: &Event) -> io::Result<()> {
        self.iter_mut().try_for_each(|s| s.event(event))
    }
    fn event_on_host_clock(&mut self, event: &Event, host_ts: u64) -> io::Result<()> {
        self.iter_mut().try_for_each(|s| s.event_on_host_clock(event, host_ts))
    }
    fn end(&mut self, end: &TraceEnd) -> io::Result<()> {
        self.iter_mut().try_for_each(|s| s.end(end))
    }
    fn flush(&mut self) -> io::Result<()> {
        self.iter_mut().try_for_each(|s| s.flush())
    }
}
