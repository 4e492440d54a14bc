//! The bytes one event hands to the tracer: a small versioned binary encoding.
//!
//! The probe fires with a pointer to these bytes and their length; the tracer copies at most
//! 4096 of them (`tracer_common::USER_EVENT_PAYLOAD_MAX`) and decodes them in user space. The C
//! header (`include/tracer_events.h`) writes the same encoding.
//!
//! ```text
//! offset  size  field
//! 0       1     version: 1
//! 1       1     kind: 1 log (a logger's record), 2 trace (print*)
//! 2       1     level: 1 trace, 2 debug, 3 info, 4 warn, 5 error
//! 3       1     number of fields that follow (6 in version 1)
//! 4       4     line (little-endian; 0 when unknown)
//! 8       ...   fields, each a little-endian u32 length and that many bytes of UTF-8:
//!               source, function, file, spans, message, data
//! ```
//!
//! `spans` is the names of the current spans, outermost first, each followed by a NUL byte;
//! `data` is JSON text (empty when there is none). An empty field is absent information. The
//! order puts the short fields first and `data` last, so that a payload cut at the tracer's bound
//! loses the least. A newer writer may append fields (older readers skip them); a reader treats
//! missing trailing fields as empty. Anything else that changes is a new version.

use std::borrow::Cow;

/// The encoding written here.
pub const VERSION: u8 = 1;
/// Fields of version 1, in order.
const FIELDS: u8 = 6;
/// Bytes before the first field.
pub const HEADER_LEN: usize = 8;

/// Where an event came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A record of a logger (`tracing`, `log`, or the C header's `tracer_events_log`).
    Log = 1,
    /// A `print*` call.
    Trace = 2,
}

/// How severe an event is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Trace = 1,
    Debug = 2,
    Info = 3,
    Warn = 4,
    Error = 5,
}

impl Level {
    /// Its name, as in JSON (`info`).
    pub fn name(self) -> &'static str {
        match self {
            Level::Trace => "trace",
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }

    fn from_u8(n: u8) -> Option<Level> {
        Some(match n {
            1 => Level::Trace,
            2 => Level::Debug,
            3 => Level::Info,
            4 => Level::Warn,
            5 => Level::Error,
            _ => return None,
        })
    }
}

/// One event to encode.
#[derive(Clone, Copy, Debug, Default)]
pub struct Payload<'a> {
    pub kind: Option<Kind>,
    pub level: Option<Level>,
    pub source: &'a str,
    /// The function that made the event (C, C++), or its module path (Rust has no function name).
    pub function: &'a str,
    pub file: &'a str,
    pub line: u32,
    pub spans: &'a [&'a str],
    pub message: &'a str,
    /// JSON text, empty for none.
    pub data: &'a str,
}

fn push_field(out: &mut Vec<u8>, bytes: &[u8]) {
    // A field longer than 4 GiB cannot be described; cut it (the tracer keeps 4 KiB anyway).
    let bytes = &bytes[..bytes.len().min(u32::MAX as usize)];
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

impl Payload<'_> {
    /// Appends the encoded payload to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&[
            VERSION,
            self.kind.unwrap_or(Kind::Trace) as u8,
            self.level.unwrap_or(Level::Info) as u8,
            FIELDS,
        ]);
        out.extend_from_slice(&self.line.to_le_bytes());
        push_field(out, self.source.as_bytes());
        push_field(out, self.function.as_bytes());
        push_field(out, self.file.as_bytes());
        let spans_len: usize = self.spans.iter().map(|s| s.len() + 1).sum();
        out.extend_from_slice(&(spans_len.min(u32::MAX as usize) as u32).to_le_bytes());
        for span in self.spans {
            out.extend_from_slice(span.as_bytes());
            out.push(0);
        }
        push_field(out, self.message.as_bytes());
        push_field(out, self.data.as_bytes());
    }
}

/// A payload read back.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Decoded<'a> {
    pub kind: Kind,
    pub level: Level,
    pub source: Option<Cow<'a, str>>,
    pub function: Option<Cow<'a, str>>,
    pub file: Option<Cow<'a, str>>,
    /// `None` when unknown.
    pub line: Option<u32>,
    pub spans: Vec<Cow<'a, str>>,
    pub message: Cow<'a, str>,
    /// JSON text as the program wrote it (not checked here).
    pub data: Option<Cow<'a, str>>,
    /// The bytes ended inside a field: that field is cut and those after it are empty. Expected
    /// when the tracer cut a long payload; otherwise the program wrote a bad one.
    pub cut: bool,
}

/// Why a payload could not be read at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the header.
    TooShort { len: usize },
    /// A version this reader does not know.
    Version(u8),
    /// A kind or level byte this version does not define.
    Invalid { what: &'static str, value: u8 },
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::TooShort { len } => {
                write!(f, "event payload of {len} bytes is shorter than its header ({HEADER_LEN} bytes)")
            }
            DecodeError::Version(v) => write!(f, "event payload has version {v}, this tracer reads version {VERSION}"),
            DecodeError::Invalid { what, value } => write!(f, "event payload has an unknown {what} {value}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// UTF-8 text of a field; bytes that are not UTF-8 (or a character cut in two) become U+FFFD.
fn text(bytes: &[u8]) -> Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

fn non_empty(bytes: &[u8]) -> Option<Cow<'_, str>> {
    (!bytes.is_empty()).then(|| text(bytes))
}

/// Decodes a payload, reading as much of a cut one as there is. Every length is checked against
/// the bytes that remain; nothing here can read out of bounds or allocate more than the input.
pub fn decode(bytes: &[u8]) -> Result<Decoded<'_>, DecodeError> {
    if bytes.len() < HEADER_LEN {
        return Err(DecodeError::TooShort { len: bytes.len() });
    }
    if bytes[0] != VERSION {
        return Err(DecodeError::Version(bytes[0]));
    }
    let kind = match bytes[1] {
        1 => Kind::Log,
        2 => Kind::Trace,
        value => return Err(DecodeError::Invalid { what: "kind", value }),
    };
    let level = Level::from_u8(bytes[2]).ok_or(DecodeError::Invalid { what: "level", value: bytes[2] })?;
    let count = bytes[3];
    let line = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    let mut rest = &bytes[HEADER_LEN..];
    let mut cut = false;
    let mut fields: [&[u8]; FIELDS as usize] = [&[]; FIELDS as usize];
    for (i, field) in fields.iter_mut().enumerate() {
        if i >= count as usize || cut {
            break;
        }
        if rest.len() < 4 {
            // A field the header promised is not there.
            cut = true;
            break;
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        rest = &rest[4..];
        if len > rest.len() {
            cut = true;
        }
        let (value, tail) = rest.split_at(len.min(rest.len()));
        *field = value;
        rest = tail;
    }
    let [source, function, file, spans, message, data] = fields;
    let spans = spans.split(|&b| b == 0).filter(|s| !s.is_empty()).map(text).collect();
    Ok(Decoded {
        kind,
        level,
        source: non_empty(source),
        function: non_empty(function),
        file: non_empty(file),
        line: (line != 0).then_some(line),
        spans,
        message: text(message),
        data: non_empty(data),
        cut,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut out = Vec::new();
        Payload {
            kind: Some(Kind::Log),
            level: Some(Level::Warn),
            source: "app::net",
            function: "app::net",
            file: "src/net.rs",
            line: 42,
            spans: &["request", "parse"],
            message: "bad header",
            data: r#"{"len":3}"#,
        }
        .encode(&mut out);
        out
    }

    #[test]
    fn round_trips() {
        let bytes = sample();
        let d = decode(&bytes).unwrap();
        assert_eq!(d.kind, Kind::Log);
        assert_eq!(d.level, Level::Warn);
        assert_eq!(d.source.as_deref(), Some("app::net"));
        assert_eq!(d.function.as_deref(), Some("app::net"));
        assert_eq!(d.file.as_deref(), Some("src/net.rs"));
        assert_eq!(d.line, Some(42));
        assert_eq!(d.spans, ["request", "parse"]);
        assert_eq!(d.message, "bad header");
        assert_eq!(d.data.as_deref(), Some(r#"{"len":3}"#));
        assert!(!d.cut);
    }

    #[test]
    fn the_layout_is_the_documented_one() {
        let mut out = Vec::new();
        Payload { message: "hi", line: 7, ..Payload::default() }.encode(&mut out);
        let mut expected = vec![1, 2, 3, 6, 7, 0, 0, 0];
        for field in [&b""[..], b"", b"", b"", b"hi", b""] {
            expected.extend_from_slice(&(field.len() as u32).to_le_bytes());
            expected.extend_from_slice(field);
        }
        assert_eq!(out, expected);
        let d = decode(&out).unwrap();
        assert_eq!((d.kind, d.level, d.source, d.line, d.data), (Kind::Trace, Level::Info, None, Some(7), None));
    }

    #[test]
    fn a_cut_payload_keeps_what_is_there() {
        let bytes = sample();
        // Cut inside the message: the message is cut, data is empty.
        let message_at = bytes.windows(10).position(|w| w == b"bad header").unwrap();
        let d = decode(&bytes[..message_at + 3]).unwrap();
        assert!(d.cut);
        assert_eq!(d.message, "bad");
        assert_eq!(d.data, None);
        assert_eq!(d.spans, ["request", "parse"]);
        // Cut inside a length.
        let d = decode(&bytes[..HEADER_LEN + 2]).unwrap();
        assert!(d.cut);
        assert_eq!(d.source, None);
        // Every prefix decodes (or is too short for a header), none panics.
        for end in 0..bytes.len() {
            match decode(&bytes[..end]) {
                Ok(d) => assert!(d.cut, "{end}"),
                Err(e) => assert_eq!(e, DecodeError::TooShort { len: end }),
            }
        }
    }

    #[test]
    fn newer_and_older_writers() {
        // More fields than this version knows: the extra ones are skipped.
        let mut bytes = sample();
        bytes[3] = 7;
        bytes.extend_from_slice(&3u32.to_le_bytes());
        bytes.extend_from_slice(b"new");
        let d = decode(&bytes).unwrap();
        assert_eq!((d.message.as_ref(), d.cut), ("bad header", false));
        // Fewer: the missing ones are empty.
        let mut bytes = vec![1, 2, 5, 1, 0, 0, 0, 0];
        bytes.extend_from_slice(&3u32.to_le_bytes());
        bytes.extend_from_slice(b"lib");
        let d = decode(&bytes).unwrap();
        assert_eq!((d.source.as_deref(), d.message.as_ref(), d.level, d.cut), (Some("lib"), "", Level::Error, false));
    }

    #[test]
    fn rejects_what_it_cannot_read() {
        let mut bytes = sample();
        bytes[0] = 2;
        assert_eq!(decode(&bytes), Err(DecodeError::Version(2)));
        let mut bytes = sample();
        bytes[1] = 3;
        assert_eq!(decode(&bytes), Err(DecodeError::Invalid { what: "kind", value: 3 }));
        let mut bytes = sample();
        bytes[2] = 0;
        assert_eq!(decode(&bytes), Err(DecodeError::Invalid { what: "level", value: 0 }));
        assert_eq!(decode(&[1, 2]), Err(DecodeError::TooShort { len: 2 }));
    }

    #[test]
    fn invalid_utf8_is_replaced_not_trusted() {
        let mut out = Vec::new();
        Payload { message: "ok", ..Payload::default() }.encode(&mut out);
        let at = out.len() - 4 - 2;
        out[at] = 0xff;
        assert_eq!(decode(&out).unwrap().message, "\u{fffd}k");
    }
}
