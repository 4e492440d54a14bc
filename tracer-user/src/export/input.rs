//! Reading a recorded trace in whichever format it was written, told by its first bytes (not by
//! its name): JSON lines, or the native format.

use std::io::{self, BufRead};

use super::{
    jsonl::{ItemReader, ReadError, TraceReader},
    native::{self, NativeReader},
};
use crate::event::TraceItem;

/// A trace being read.
pub enum AnyReader<R: BufRead> {
    Jsonl(TraceReader<R>),
    Native(NativeReader<R>),
}

impl<R: BufRead> AnyReader<R> {
    /// Looks at the input's first bytes to tell its format.
    pub fn detect(mut input: R) -> io::Result<AnyReader<R>> {
        let head = input.fill_buf()?;
        Ok(if native::is_native(head) {
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
    fn error_here(&self, message: &str) -> ReadError {
        match self {
            AnyReader::Jsonl(r) => r.error_here(message),
            AnyReader::Native(r) => r.error_here(message),
        }
    }
    fn feed_events(
        &mut self,
        each: &mut dyn FnMut(&crate::event::Event) -> io::Result<()>,
    ) -> Option<Result<TraceItem, ReadError>> {
        match self {
            AnyReader::Jsonl(r) => r.feed_events(each),
            AnyReader::Native(r) => r.feed_events(each),
        }
    }
}
