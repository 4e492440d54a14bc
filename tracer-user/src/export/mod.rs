//! File formats a trace can be written in, chosen by name or by the output's extension.

pub mod chrome;
pub mod flame;
pub mod folded;
pub mod hosts;
pub mod jsonl;
pub mod native;
pub mod otlp;
pub mod pcapng;
pub mod perfetto;
pub mod speedscope;
pub mod svg;

use crate::event::data;
use std::{io::Write, path::Path};

use crate::{
    event::{EventData, SpawnHow},
    sink::Sink,
};

/// Most sends remembered for links to receives yet to come; older ones are forgotten first.
pub(crate) const MAX_REMEMBERED_SENDS: usize = 1 << 20;

/// The file formats a trace can be written in; what each is: [`Format::summary`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Jsonl,
    Chrome,
    Flamegraph,
    Folded,
    Svg,
    Perfetto,
    Native,
    Speedscope,
    Pcapng,
}

impl Format {
    /// Every format, in the order the command line lists them.
    pub const ALL: [Format; 9] = [
        Format::Jsonl,
        Format::Chrome,
        Format::Flamegraph,
        Format::Folded,
        Format::Svg,
        Format::Perfetto,
        Format::Native,
        Format::Speedscope,
        Format::Pcapng,
    ];

    /// The format's name on the command line (`--format NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Format::Jsonl => "jsonl",
            Format::Chrome => "chrome",
            Format::Flamegraph => "flamegraph",
            Format::Folded => "folded",
            Format::Svg => "svg",
            Format::Perfetto => "perfetto",
            Format::Native => "native",
            Format::Speedscope => "speedscope",
            Format::Pcapng => "pcapng",
        }
    }

    /// What the format is and its extension, for help texts.
    pub fn summary(self) -> &'static str {
        match self {
            Format::Jsonl => "JSON lines: one event per line (`.jsonl`)",
            Format::Chrome => "Chrome/Perfetto Trace Event Format, JSON object form (`.json`)",
            Format::Flamegraph => "Flame graph data: a JSON tree of time per call stack and process (`.flame.json`)",
            Format::Folded => "Folded stacks for inferno, flamegraph.pl and speedscope (`.folded`)",
            Format::Svg => "An interactive flame graph (`.svg`)",
            Format::Perfetto => "Perfetto's native protobuf trace (`.pftrace`)",
            Format::Native => {
                "The tracer's own compact binary format (`.trc`), read back by `report`, `calls`, `export`"
            }
            Format::Speedscope => {
                "speedscope's own format: an evented profile per thread on shared frames (`.speedscope.json`)"
            }
            Format::Pcapng => "A packet capture for Wireshark: every message as a packet (`.pcapng`)",
        }
    }

    /// The format an output path's extension implies.
    pub fn from_path(path: &Path) -> Option<Format> {
        let name = path.file_name()?.to_string_lossy().to_lowercase();
        // Longest suffix first: `.flame.json` is not a Chrome trace.
        [
            (".flame.json", Format::Flamegraph),
            (".speedscope.json", Format::Speedscope),
            (".jsonl", Format::Jsonl),
            (".json", Format::Chrome),
            (".folded", Format::Folded),
            (".svg", Format::Svg),
            (".pftrace", Format::Perfetto),
            (".trc", Format::Native),
            (".pcapng", Format::Pcapng),
        ]
        .into_iter()
        .find_map(|(ext, format)| name.ends_with(ext).then_some(format))
    }

    /// Whether a trace in this format is readable while it is written (so `record` needs no
    /// spool beside it).
    pub fn streams(self) -> bool {
        matches!(self, Format::Jsonl | Format::Native)
    }

    /// What the format is, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            Format::Jsonl => "JSON lines",
            Format::Chrome => "a Chrome trace",
            Format::Flamegraph => "flame graph data",
            Format::Folded => "folded stacks",
            Format::Svg => "a flame graph SVG",
            Format::Perfetto => "a Perfetto trace",
            Format::Native => "a native trace",
            Format::Speedscope => "a speedscope profile",
            Format::Pcapng => "a pcapng capture",
        }
    }

    /// A sink writing this format to `out`. The visual formats group a multi-host trace's
    /// processes by host ([`hosts::HostGrouping`]).
    pub fn sink<W: Write + Send + 'static>(self, out: W) -> Box<dyn Sink + Send> {
        use hosts::HostGrouping;
        match self {
            Format::Jsonl => Box::new(jsonl::JsonlWriter::new(out)),
            Format::Chrome => Box::new(HostGrouping::new(chrome::ChromeWriter::new(out))),
            Format::Flamegraph => Box::new(HostGrouping::new(flame::StackSink::new(out, flame::write))),
            Format::Folded => Box::new(HostGrouping::new(flame::StackSink::new(out, folded::write))),
            Format::Svg => Box::new(HostGrouping::new(flame::StackSink::new(out, svg::write))),
            Format::Perfetto => Box::new(HostGrouping::new(perfetto::PerfettoWriter::new(out))),
            Format::Native => Box::new(native::NativeWriter::new(out)),
            Format::Speedscope => Box::new(HostGrouping::new(speedscope::SpeedscopeWriter::new(out))),
            Format::Pcapng => Box::new(pcapng::PcapngWriter::new(out, false)),
        }
    }

    /// As [`Format::sink`], with `--pcap-events`: a capture also holds the events that are not
    /// messages (other formats have them anyway).
    pub fn sink_with_events<W: Write + Send + 'static>(self, out: W, pcap_events: bool) -> Box<dyn Sink + Send> {
        match self {
            Format::Pcapng => Box::new(pcapng::PcapngWriter::new(out, pcap_events)),
            other => other.sink(out),
        }
    }
}

/// The name of the instant that marks a spawn or an exit on a timeline.
pub(crate) fn lifecycle_name(data: &EventData) -> Option<String> {
    Some(match data {
        EventData::Spawn(data::Spawn { child_pid, child_tid, how, comm, filename, .. }) => match how {
            SpawnHow::Fork => format!("fork {child_pid}"),
            SpawnHow::Thread => format!("thread {child_tid}"),
            SpawnHow::Exec => format!("exec {}", filename.as_deref().unwrap_or(comm)),
        },
        EventData::Exit(data::Exit { exit_code, signal, thread, .. }) => {
            let name = match (exit_code, signal) {
                (_, Some(sig)) => format!("killed by signal {sig}"),
                (Some(code), None) => format!("exit {code}"),
                (None, None) => "exit".to_string(),
            };
            if *thread { format!("thread {name}") } else { name }
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_follow_extensions() {
        assert_eq!(Format::from_path(Path::new("a/trace.jsonl")), Some(Format::Jsonl));
        assert_eq!(Format::from_path(Path::new("trace.JSON")), Some(Format::Chrome));
        assert_eq!(Format::from_path(Path::new("trace.flame.json")), Some(Format::Flamegraph));
        assert_eq!(Format::from_path(Path::new("trace.folded")), Some(Format::Folded));
        assert_eq!(Format::from_path(Path::new("trace.svg")), Some(Format::Svg));
        assert_eq!(Format::from_path(Path::new("trace.pftrace")), Some(Format::Perfetto));
        assert_eq!(Format::from_path(Path::new("trace.trc")), Some(Format::Native));
        assert_eq!(Format::from_path(Path::new("trace.speedscope.json")), Some(Format::Speedscope));
        assert_eq!(Format::from_path(Path::new("trace.pcapng")), Some(Format::Pcapng));
        assert_eq!(Format::from_path(Path::new("trace.txt")), None);
        assert_eq!(Format::from_path(Path::new("trace")), None);
    }

    #[test]
    fn every_format_has_a_name_of_its_own() {
        let names: std::collections::BTreeSet<_> = Format::ALL.map(Format::name).into();
        assert_eq!(names.len(), Format::ALL.len());
    }
}
