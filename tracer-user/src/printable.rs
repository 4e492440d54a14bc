//! Text for a terminal whose words came from somewhere else. A function name is whatever bytes a
//! traced program's symbol table holds, a path is whatever a local user named a file, a trace
//! file's strings are whatever its writer put there, and an agent's names reach the collector's
//! stderr: any of them can carry a terminal's control characters (`ESC ]0;...BEL` retitles the
//! window, `ESC ]52` writes the clipboard on some terminals, `\r` overwrites the line before it).
//! Everything tracer shows people on stdout and stderr goes through here, so that such a character
//! is shown as `\u{1b}` and never acted on; newlines and tabs, which tracer's own layouts use, pass.
//!
//! JSON output needs none of this: serde_json escapes every C0 control character, and a program
//! reads it, not a terminal.

use std::{
    borrow::Cow,
    io::{self, Write},
};

/// Whether a terminal would act on `c` instead of showing it: the C0 and C1 controls and DEL
/// (`char::is_control`), except the newline and tab that tracer's layouts are made of.
fn acted_on(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

/// `text` with each control character written as Rust writes it in a string literal (`\u{1b}`).
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    if !text.chars().any(acted_on) {
        return Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if acted_on(c) {
            shown.extend(c.escape_unicode());
        } else {
            shown.push(c);
        }
    }
    Cow::Owned(shown)
}

/// A writer that passes its text through [`escape_controls`] on the way to `W`. A character split
/// across two writes is held until its end arrives; a byte that is not UTF-8 is shown as `\x..`.
pub struct Printable<W: Write> {
    inner: W,
    held: Vec<u8>,
}

impl<W: Write> Printable<W> {
    pub fn new(inner: W) -> Self {
        Self { inner, held: Vec::new() }
    }
}

impl<W: Write> Write for Printable<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.held.is_empty() {
            // The common case: written straight from `buf`, only a split character's start kept.
            let done = write_escaped(&mut self.inner, buf)?;
            self.held.extend_from_slice(&buf[done..]);
        } else {
            self.held.extend_from_slice(buf);
            let done = write_escaped(&mut self.inner, &self.held)?;
            self.held.drain(..done);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Writes `bytes` to `out` with control characters escaped and bytes that are not UTF-8 as `\xNN`;
/// returns how many were written: all but the start of a character whose end is still to come.
fn write_escaped(out: &mut impl Write, bytes: &[u8]) -> io::Result<usize> {
    let mut rest = bytes;
    loop {
        match std::str::from_utf8(rest) {
            Ok(text) => {
                out.write_all(escape_controls(text).as_bytes())?;
                return Ok(bytes.len());
            }
            Err(e) => {
                let (text, after) = rest.split_at(e.valid_up_to());
                // Checked valid just above.
                out.write_all(escape_controls(std::str::from_utf8(text).unwrap_or_default()).as_bytes())?;
                match e.error_len() {
                    Some(bad) => {
                        for b in &after[..bad] {
                            write!(out, "\\x{b:02x}")?;
                        }
                        rest = &after[bad..];
                    }
                    // The start of a character whose end is in the next write.
                    None => return Ok(bytes.len() - after.len()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_shown_and_layout_passes() {
        assert_eq!(escape_controls("fib\tmain\n"), "fib\tmain\n");
        assert!(matches!(escape_controls("plain"), Cow::Borrowed(_)));
        assert_eq!(escape_controls("a\x1b]0;pwned\x07b"), "a\\u{1b}]0;pwned\\u{7}b");
        assert_eq!(escape_controls("over\rwrite\x7f\u{9b}31m"), "over\\u{d}write\\u{7f}\\u{9b}31m");
    }

    #[test]
    fn the_writer_escapes_across_writes_and_keeps_split_characters_whole() {
        let mut out = Printable::new(Vec::new());
        let text = "µs \x1b[2J ok \u{9b}";
        // One byte at a time: each two-byte character arrives in halves.
        for b in text.as_bytes() {
            out.write_all(std::slice::from_ref(b)).unwrap();
        }
        out.write_all(b" \xff end").unwrap();
        assert_eq!(String::from_utf8(out.inner).unwrap(), "µs \\u{1b}[2J ok \\u{9b} \\xff end");
    }
}
