//! File formats a trace can be written in, chosen by name or by the output's extension.

pub mod chrome;
pub mod jsonl;

use std::{io::Write, path::Path};

use crate::sink::Sink;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// JSON lines: one event per line (`.jsonl`).
    Jsonl,
    /// Chrome/Perfetto Trace Event Format, JSON object form (`.json`).
    Chrome,
}

impl Format {
    /// The format an output path's extension implies.
    pub fn from_path(path: &Path) -> Option<Format> {
        let name = path.file_name()?.to_string_lossy().to_lowercase();
        if name.ends_with(".jsonl") {
            Some(Format::Jsonl)
        } else if name.ends_with(".json") {
            Some(Format::Chrome)
        } else {
            None
        }
    }

    /// A sink writing this format to `out`.
    pub fn sink<W: Write + Send + 'static>(self, out: W) -> Box<dyn Sink + Send> {
        match self {
            Format::Jsonl => Box::new(jsonl::JsonlWriter::new(out)),
            Format::Chrome => Box::new(chrome::ChromeWriter::new(out)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_follow_extensions() {
        assert_eq!(Format::from_path(Path::new("a/trace.jsonl")), Some(Format::Jsonl));
        assert_eq!(Format::from_path(Path::new("trace.JSON")), Some(Format::Chrome));
        assert_eq!(Format::from_path(Path::new("trace.txt")), None);
        assert_eq!(Format::from_path(Path::new("trace")), None);
    }
}
