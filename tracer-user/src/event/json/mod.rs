//! The JSON lines encoding of the model: the one place that knows how a line differs from the
//! model's own serde shape (which is what the wire protocol sends).
//!
//! - A line is an object whose `kind` comes first: `trace_start`, `trace_end`, or an event kind.
//!   An event line then has its head (`ts`, `host`, `pid`, `tid`), then the kind's own fields in
//!   the order the kind's struct declares them.
//! - Enums with fields (a channel, a target) are objects tagged by a `type` field that comes
//!   first, where the model (and postcard, which cannot read internally tagged enums) has serde's
//!   external tagging.
//! - Fields marked [`omit_when_empty`] by their struct are left out when empty (postcard cannot
//!   read skipped fields, so the model never skips one), and read back as empty when absent.
//! - A `recv` line also has `flow_id`, the first of its `flow_ids` (or null), before them.
//!
//! Reading is one pass over a line, names borrowed from it and interned, for speed: a line whose
//! `kind` (or an enum whose `type`) does not come first, as a hand-edited one may, is reordered
//! and read again.

mod de;
mod ser;

use serde::{Serialize, Serializer};

pub use de::{Name, ParseError, parse_line};
pub use ser::Json;

use super::{Event, TraceEnd, TraceItem, TraceStart};

/// The name a field's value is wrapped in by [`omit_when_empty`]: a serde newtype struct, which
/// postcard (the wire, the native format) writes as the bare value and JSON recognizes.
const OMIT_WHEN_EMPTY: &str = "$tracer::omit_when_empty";

/// For `#[serde(serialize_with = "…::omit_when_empty")]` on a field of the model: JSON leaves the
/// field out when it is empty (none, an empty list or map, `false`, or an object whose fields are
/// all empty), and the struct reads it back as empty with `#[serde(default)]`.
///
/// Not `skip_serializing_if`: that would skip the field in postcard too, which writes fields
/// without names and so cannot read a struct with one missing. The mark is a newtype struct of a
/// reserved name, which postcard writes as the bare value (the wire and `.trc` are unchanged).
pub fn omit_when_empty<T: Serialize + ?Sized, S: Serializer>(value: &T, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_newtype_struct(OMIT_WHEN_EMPTY, value)
}

/// The field that tags a line.
const KIND: &str = "kind";
/// The field that tags an enum with fields.
const TYPE: &str = "type";

/// One line of a trace, borrowed, as it is written.
#[derive(Clone, Copy, Debug)]
pub enum Line<'a> {
    Start(&'a TraceStart),
    Event(&'a Event),
    End(&'a TraceEnd),
}

impl TraceItem {
    pub fn as_line(&self) -> Line<'_> {
        match self {
            TraceItem::Start(start) => Line::Start(start),
            TraceItem::Event(event) => Line::Event(event),
            TraceItem::End(end) => Line::End(end),
        }
    }
}
