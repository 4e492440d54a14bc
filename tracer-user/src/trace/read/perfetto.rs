//! Reads a Perfetto trace ([`crate::export::perfetto`]) back into plain packets, resolving what a Perfetto reader resolves:
//! interned names and strings (per sequence, reset by `SEQ_INCREMENTAL_STATE_CLEARED`), the
//! sequence's defaults (`TracePacketDefaults`: its default clock and its events' default track,
//! replaced whole by new defaults and dropped when the state is cleared, as `trace_processor`
//! does), and incremental clocks (`ClockSnapshot`), so that each track event has its absolute
//! time on the trace clock, its track and its names as strings.
//!
//! It follows Perfetto's published semantics (`trace_packet.proto`, `interned_data.proto`,
//! `clock_snapshot.proto`), not the writer's code, and fails on what a reader could not resolve
//! (an unknown iid, a packet needing state its sequence never set up, a clock without a snapshot)
//! rather than guessing. Only track events and track descriptors are returned.

use std::collections::HashMap;

use prost::Message as _;

use crate::export::perfetto::{
    TRACE_CLOCK,
    protos::{Trace, TracePacket, debug_annotation, trace_packet, track_event},
};

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("not a Perfetto trace")]
    Decode(#[from] prost::DecodeError),
    #[error("packet {packet} refers to {table} iid {iid}, which its sequence did not intern")]
    UnknownIid { packet: usize, table: &'static str, iid: u64 },
    #[error("packet {packet} needs incremental state, but its sequence never cleared it")]
    NoState { packet: usize },
    #[error("packet {packet} is on clock {clock}, which no clock snapshot of its sequence relates to the trace clock")]
    UnknownClock { packet: usize, clock: u32 },
}

/// One packet sequence's incremental state.
#[derive(Default)]
struct Sequence {
    valid: bool,
    names: HashMap<u64, String>,
    categories: HashMap<u64, String>,
    annotation_names: HashMap<u64, String>,
    strings: HashMap<u64, String>,
    default_clock: Option<u32>,
    /// `TrackEventDefaults.track_uuid`: the track of the events that name none.
    default_track: Option<u64>,
    /// Per clock of a snapshot: trace clock time minus the clock's time, and whether it is
    /// incremental.
    clocks: HashMap<u32, (i128, bool)>,
    /// Per incremental clock, its last value.
    last: HashMap<u32, u64>,
}

fn lookup(table: &HashMap<u64, String>, name: &'static str, iid: u64, packet: usize) -> Result<String, ResolveError> {
    table.get(&iid).cloned().ok_or(ResolveError::UnknownIid { packet, table: name, iid })
}

/// The track events and track descriptors of a trace, resolved.
pub fn resolve(bytes: &[u8]) -> Result<Vec<TracePacket>, ResolveError> {
    let mut sequences: HashMap<u32, Sequence> = HashMap::new();
    let mut out = Vec::new();
    for (i, mut p) in Trace::decode(bytes)?.packet.into_iter().enumerate() {
        let id = match p.optional_trusted_packet_sequence_id {
            Some(trace_packet::OptionalTrustedPacketSequenceId::TrustedPacketSequenceId(id)) => id,
            None => 0,
        };
        let seq = sequences.entry(id).or_default();
        let flags = p.sequence_flags();
        if flags & trace_packet::SequenceFlags::SeqIncrementalStateCleared as u32 != 0 {
            *seq = Sequence { valid: true, ..Sequence::default() };
        } else if flags & trace_packet::SequenceFlags::SeqNeedsIncrementalState as u32 != 0 && !seq.valid {
            return Err(ResolveError::NoState { packet: i });
        }
        if let Some(defaults) = p.trace_packet_defaults.take() {
            seq.default_clock = defaults.timestamp_clock_id;
            seq.default_track = defaults.track_event_defaults.and_then(|d| d.track_uuid);
        }
        if let Some(interned) = p.interned_data.take() {
            for e in interned.event_names {
                seq.names.insert(e.iid(), e.name().to_string());
            }
            for e in interned.event_categories {
                seq.categories.insert(e.iid(), e.name().to_string());
            }
            for e in interned.debug_annotation_names {
                seq.annotation_names.insert(e.iid(), e.name().to_string());
            }
            for e in interned.debug_annotation_string_values {
                seq.strings.insert(e.iid(), String::from_utf8_lossy(e.str()).into_owned());
            }
        }
        if let Some(trace_packet::Data::ClockSnapshot(snapshot)) = &p.data {
            let trace_ts = snapshot.clocks.iter().find(|c| c.clock_id() == TRACE_CLOCK).map(|c| c.timestamp());
            if let Some(trace_ts) = trace_ts {
                for c in &snapshot.clocks {
                    let offset = i128::from(trace_ts) - i128::from(c.timestamp());
                    seq.clocks.insert(c.clock_id(), (offset, c.is_incremental()));
                    if c.is_incremental() {
                        seq.last.insert(c.clock_id(), c.timestamp());
                    }
                }
            }
            continue;
        }
        if let Some(ts) = p.timestamp {
            let clock = p.timestamp_clock_id.or(seq.default_clock).unwrap_or(TRACE_CLOCK);
            let absolute = if clock == TRACE_CLOCK {
                ts
            } else {
                let &(offset, incremental) =
                    seq.clocks.get(&clock).ok_or(ResolveError::UnknownClock { packet: i, clock })?;
                let value = if incremental {
                    let last = seq.last.entry(clock).or_default();
                    *last += ts;
                    *last
                } else {
                    ts
                };
                (i128::from(value) + offset) as u64
            };
            p.timestamp = Some(absolute);
            p.timestamp_clock_id = None;
        }
        match &mut p.data {
            Some(trace_packet::Data::TrackEvent(e)) => {
                e.track_uuid = e.track_uuid.or(seq.default_track);
                if let Some(track_event::NameField::NameIid(iid)) = e.name_field {
                    e.name_field = Some(track_event::NameField::Name(lookup(&seq.names, "event name", iid, i)?));
                }
                for iid in std::mem::take(&mut e.category_iids) {
                    e.categories.push(lookup(&seq.categories, "category", iid, i)?);
                }
                for a in &mut e.debug_annotations {
                    if let Some(debug_annotation::NameField::NameIid(iid)) = a.name_field {
                        let name = lookup(&seq.annotation_names, "debug annotation name", iid, i)?;
                        a.name_field = Some(debug_annotation::NameField::Name(name));
                    }
                    if let Some(debug_annotation::Value::StringValueIid(iid)) = a.value {
                        let s = lookup(&seq.strings, "debug annotation string", iid, i)?;
                        a.value = Some(debug_annotation::Value::StringValue(s));
                    }
                }
            }
            Some(trace_packet::Data::TrackDescriptor(_)) => {}
            _ => continue,
        }
        out.push(p);
    }
    Ok(out)
}
