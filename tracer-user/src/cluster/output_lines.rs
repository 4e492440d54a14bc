//! What a collector makes of a launched command's output: lines, each handed to
//! [`ClientOptions::command_output`](super::collector::ClientOptions::command_output) with its
//! host and stream (`collect` prints them as `HOST: LINE`, as `pdsh` does).
//!
//! An agent is trusted to trace, not to make the collector allocate without bound: a message of
//! more than [`MAX_CHUNK`] bytes (an honest agent never sends one) breaks a bound, and the agent's
//! host ends there, incomplete ([`super::reconnect`]). A line that never ends is handed on in
//! pieces of [`MAX_LINE`] bytes (a command may write one honestly): each host holds at most that
//! much of a partial line per stream.

use std::sync::Arc;

pub use super::command_output::MAX_CHUNK;
use super::protocol::OutputStream;

/// Bytes of one line held before it is handed on in pieces.
pub const MAX_LINE: usize = 64 << 10;

/// Receives each line of a launched command's output (without its newline): the host's name,
/// the stream, the line. A last line without a newline comes once the command's output ends;
/// a line longer than [`MAX_LINE`] comes in pieces.
pub type OutputHandler = Arc<dyn Fn(&str, OutputStream, &[u8]) + Send + Sync>;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("a message of the command's output holds {len} bytes: an agent sends at most {MAX_CHUNK}")]
pub struct ChunkTooLarge {
    pub len: usize,
}

/// One host's partial lines, per stream.
#[derive(Debug, Default)]
pub struct OutputLines {
    partial: [Vec<u8>; 2],
}

impl OutputLines {
    /// Takes the next bytes of `stream`: hands on the lines they complete, keeps the rest.
    pub fn take(
        &mut self,
        stream: OutputStream,
        bytes: &[u8],
        emit: &mut dyn FnMut(OutputStream, &[u8]),
    ) -> Result<(), ChunkTooLarge> {
        if bytes.len() > MAX_CHUNK {
            return Err(ChunkTooLarge { len: bytes.len() });
        }
        let partial = &mut self.partial[stream.index()];
        let mut rest = bytes;
        while let Some(newline) = rest.iter().position(|&b| b == b'\n') {
            let line = &rest[..newline];
            if partial.is_empty() {
                emit(stream, line);
            } else {
                partial.extend_from_slice(line);
                emit(stream, partial);
                partial.clear();
            }
            rest = &rest[newline + 1..];
        }
        partial.extend_from_slice(rest);
        while partial.len() >= MAX_LINE {
            emit(stream, &partial[..MAX_LINE]);
            partial.drain(..MAX_LINE);
        }
        Ok(())
    }

    /// Hands on `stream`'s partial line, if any (its output ended, or a gap follows).
    pub fn flush(&mut self, stream: OutputStream, emit: &mut dyn FnMut(OutputStream, &[u8])) {
        let partial = &mut self.partial[stream.index()];
        if !partial.is_empty() {
            emit(stream, partial);
            partial.clear();
        }
    }

    /// Bytes held, in all.
    pub fn held(&self) -> usize {
        self.partial.iter().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use OutputStream::{Stderr, Stdout};

    fn lines(o: &mut OutputLines, pieces: &[(OutputStream, &[u8])]) -> Vec<(OutputStream, String)> {
        let mut got = Vec::new();
        for (stream, bytes) in pieces {
            o.take(*stream, bytes, &mut |s, l| got.push((s, String::from_utf8_lossy(l).into_owned()))).unwrap();
        }
        got
    }

    #[test]
    fn lines_are_joined_across_messages_per_stream() {
        let mut o = OutputLines::default();
        let got = lines(&mut o, &[(Stdout, b"a\nb"), (Stderr, b"e1"), (Stdout, b"c\n\nd"), (Stderr, b"\n")]);
        assert_eq!(got, [(Stdout, "a".into()), (Stdout, "bc".into()), (Stdout, "".into()), (Stderr, "e1".into())]);
        let mut last = Vec::new();
        o.flush(Stdout, &mut |s, l| last.push((s, l.to_vec())));
        o.flush(Stderr, &mut |s, l| last.push((s, l.to_vec())));
        assert_eq!(last, [(Stdout, b"d".to_vec())]);
        assert_eq!(o.held(), 0);
    }

    /// An agent that sends a line without end, or a message over the bound: the collector holds
    /// at most MAX_LINE per stream, and refuses the message.
    #[test]
    fn a_line_without_end_is_held_bounded_and_a_large_message_is_refused() {
        let mut o = OutputLines::default();
        let chunk = vec![b'x'; MAX_CHUNK];
        let mut pieces = 0;
        for _ in 0..1000 {
            o.take(Stdout, &chunk, &mut |_, l| {
                assert_eq!(l.len(), MAX_LINE);
                pieces += 1;
            })
            .unwrap();
            assert!(o.held() < MAX_LINE);
        }
        assert_eq!(pieces, 1000 * MAX_CHUNK / MAX_LINE);
        let err = o.take(Stderr, &vec![b'y'; MAX_CHUNK + 1], &mut |_, _| panic!("nothing taken")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "a message of the command's output holds 65537 bytes: an agent sends at most 65536"
        );
    }
}
