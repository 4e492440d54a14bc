//! The kernel's USDT records, read back: a program event (a `log` event) from its payload, and a
//! probe's arguments (a `usdt` event's) as their specs type them.

use tracer_common::{UsdtRecord, UserEventRecord, user_event_flags};
use tracer_events::payload;

use super::select::ProbeInfo;
use crate::event::{ArgValue, data::Log};

/// Why a program event could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("the kernel could not read the event's payload from the program's memory")]
    Unreadable,
    #[error(transparent)]
    Payload(#[from] payload::DecodeError),
}

/// Decodes a program event from its record and the payload bytes that followed it.
pub fn program_event(record: &UserEventRecord, bytes: &[u8]) -> Result<Log, EventError> {
    if record.flags & user_event_flags::READ_FAILED != 0 {
        return Err(EventError::Unreadable);
    }
    let p = payload::decode(bytes)?;
    let truncated = record.flags & user_event_flags::TRUNCATED != 0 || p.cut;
    let data = match &p.data {
        None => serde_json::Value::Null,
        Some(text) => match serde_json::from_str(text) {
            Ok(value) => value,
            // A cut document is not the program's data; what the program wrote that is not JSON is.
            Err(_) if p.cut => serde_json::Value::Null,
            Err(_) => serde_json::Value::String(text.to_string()),
        },
    };
    let owned = |s: Option<std::borrow::Cow<'_, str>>| s.map(|s| s.into_owned());
    Ok(Log {
        log_type: p.kind,
        level: p.level,
        source: owned(p.source),
        message: p.message.into_owned(),
        function: owned(p.function),
        file: owned(p.file),
        line: p.line,
        spans: p.spans.into_iter().map(|s| s.into_owned()).collect(),
        data,
        truncated,
    })
}

/// Types a USDT record's arguments with the probe's specs.
pub fn probe_args(record: &UsdtRecord, probe: &ProbeInfo) -> Vec<Option<ArgValue>> {
    let count = (record.arg_count as usize).min(record.args.len());
    (0..count)
        .map(|i| {
            let failed = record.failed_args & (1 << i) != 0;
            match probe.signed.get(i).copied().flatten() {
                _ if failed => None,
                Some(true) => Some(ArgValue::Signed(record.args[i] as i64)),
                Some(false) => Some(ArgValue::Unsigned(record.args[i])),
                None => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tracer_common::{RecordHeader, RecordKind};
    use tracer_events::payload::{Kind, Level, Payload};

    use super::*;

    fn header(kind: RecordKind) -> RecordHeader {
        RecordHeader { kind: kind as u32, _pad: 0, ts_boot_ns: 1, pid: 2, tid: 3 }
    }

    fn record(len: usize, copied: usize, flags: u32) -> UserEventRecord {
        UserEventRecord {
            header: header(RecordKind::UserEvent),
            cookie: 0,
            payload_len: len as u64,
            copied_len: copied as u32,
            flags,
        }
    }

    fn encode(message: &str, data: &str) -> Vec<u8> {
        let mut out = Vec::new();
        Payload { kind: Some(Kind::Log), level: Some(Level::Error), source: "db", message, data, ..Payload::default() }
            .encode(&mut out);
        out
    }

    #[test]
    fn events_with_data() {
        let bytes = encode("query failed", r#"{"rows":3}"#);
        let e = program_event(&record(bytes.len(), bytes.len(), 0), &bytes).unwrap();
        assert_eq!((e.log_type, e.level, e.source.as_deref()), (Kind::Log, Level::Error, Some("db")));
        assert_eq!(e.message, "query failed");
        assert_eq!(e.data, serde_json::json!({"rows": 3}));
        assert!(!e.truncated);
        // Data that is not JSON is kept as text.
        let bytes = encode("x", "rows=3");
        assert_eq!(program_event(&record(bytes.len(), bytes.len(), 0), &bytes).unwrap().data, "rows=3");
    }

    #[test]
    fn cut_events_are_marked() {
        let bytes = encode("m", r#"{"long":"......"}"#);
        let cut = &bytes[..bytes.len() - 4];
        let e = program_event(&record(bytes.len(), cut.len(), user_event_flags::TRUNCATED), cut).unwrap();
        assert!(e.truncated);
        assert_eq!(e.message, "m");
        assert_eq!(e.data, serde_json::Value::Null);
    }

    #[test]
    fn unreadable_and_malformed_payloads_are_errors() {
        assert_eq!(program_event(&record(10, 0, user_event_flags::READ_FAILED), &[]), Err(EventError::Unreadable));
        let err = program_event(&record(3, 3, 0), &[9, 9, 9]).unwrap_err();
        assert_eq!(err.to_string(), "event payload of 3 bytes is shorter than its header (8 bytes)");
    }

    #[test]
    fn arguments_are_signed_as_their_specs_say() {
        let probe = ProbeInfo {
            provider: Arc::from("p"),
            name: Arc::from("n"),
            module: Arc::from("/m"),
            signed: vec![Some(true), Some(false), None, Some(true)],
        };
        let mut args = [0; 12];
        args[..4].copy_from_slice(&[(-5i64) as u64, u64::MAX, 7, 9]);
        let record =
            UsdtRecord { header: header(RecordKind::Usdt), cookie: 0, arg_count: 4, failed_args: 0b1000, args };
        let args = probe_args(&record, &probe);
        assert_eq!(args, [Some(ArgValue::Signed(-5)), Some(ArgValue::Unsigned(u64::MAX)), None, None]);
        assert_eq!(serde_json::to_string(&args).unwrap(), "[-5,18446744073709551615,null,null]");
    }
}
