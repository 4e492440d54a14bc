//! The JSON line of a plain call or return, written straight into a buffer.
//!
//! Calls and returns are nearly every line of a trace, and `tracer record` writes them while the
//! traced program runs: through serde, a line costs a dozen field calls, each probed for an
//! [`super::json::omit_when_empty`] mark and for emptiness, and a dozen small writes (profiled:
//! escaping and copying were a third of the tracer's CPU time). Here a plain call or return
//! ([`EventData::is_plain_call`]: no source-level fields) is written in one pass with constant
//! keys. The bytes are exactly [`super::json::Line`]'s (a test compares them on every
//! shape of call and return); strings are escaped by serde_json itself unless they need no
//! escaping, the common case for function names, paths and host names.

use super::{Event, EventData, data};

/// Appends `event`'s line (without the newline) to `out` and returns true, or returns false
/// without writing when `event` is not a plain call or return ([`EventData::is_plain_call`]; the
/// caller serializes it).
pub fn write(event: &Event, out: &mut Vec<u8>) -> bool {
    if !event.data.is_plain_call() {
        return false;
    }
    match &event.data {
        // Every field is named (no `..`): a field added to the model does not compile here until
        // this writer writes it or `EventData::is_plain_call` leaves such events to serde.
        EventData::Call(data::Call { function, module, args, goid: call_goid, params: _, file: _, line: _ }) => {
            head(out, b"{\"kind\":\"call\"", event);
            name(out, b",\"function\":", function);
            name(out, b",\"module\":", module);
            out.extend_from_slice(b",\"args\":[");
            for (i, arg) in args.as_slice().iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                number(out, *arg);
            }
            out.push(b']');
            goid(out, *call_goid);
        }
        EventData::Return(data::Return {
            function,
            module,
            retval,
            duration_ns,
            goid: ret_goid,
            ret: _,
            unwound: _,
            tail_call: _,
        }) => {
            head(out, b"{\"kind\":\"return\"", event);
            name(out, b",\"function\":", function);
            name(out, b",\"module\":", module);
            out.extend_from_slice(b",\"retval\":");
            number(out, *retval);
            out.extend_from_slice(b",\"duration_ns\":");
            match duration_ns {
                Some(d) => number(out, *d),
                None => out.extend_from_slice(b"null"),
            }
            goid(out, *ret_goid);
        }
        _ => return false,
    }
    out.push(b'}');
    true
}

/// The kind and the head every event line has: `ts`, `host`, `pid`, `tid`.
fn head(out: &mut Vec<u8>, kind: &[u8], event: &Event) {
    out.extend_from_slice(kind);
    out.extend_from_slice(b",\"ts\":");
    number(out, event.ts);
    name(out, b",\"host\":", &event.host);
    out.extend_from_slice(b",\"pid\":");
    number(out, event.pid as u64);
    out.extend_from_slice(b",\"tid\":");
    number(out, event.tid as u64);
}

/// A Go call's or return's goroutine; left out when there is none (its field is `omit_when_empty`).
fn goid(out: &mut Vec<u8>, goid: Option<u64>) {
    if let Some(g) = goid {
        out.extend_from_slice(b",\"goid\":");
        number(out, g);
    }
}

fn number(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// `key` then `value` as a JSON string: copied between quotes when nothing in it needs escaping,
/// else escaped by serde_json (the one escaping of every other line).
fn name(out: &mut Vec<u8>, key: &[u8], value: &str) {
    out.extend_from_slice(key);
    if value.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(value.as_bytes());
        out.push(b'"');
    } else {
        serde_json::to_writer(&mut *out, value).expect("a string serializes into memory");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::event::{
        data::{Call, Params, Return, SourceValue},
        json::Line,
    };

    fn event(host: &str, data: EventData) -> Event {
        Event { ts: 1_700_000_000_000_000_123, host: host.into(), pid: 10, tid: u32::MAX, data }
    }

    fn call(function: &str, module: &str, args: &[u64], goid: Option<u64>) -> EventData {
        EventData::Call(Call {
            function: function.into(),
            module: module.into(),
            args: crate::event::data::Args::new(args),
            goid,
            params: Params::default(),
            file: None,
            line: None,
        })
    }

    fn ret(function: &str, duration_ns: Option<u64>, goid: Option<u64>) -> EventData {
        EventData::Return(Return {
            function: function.into(),
            module: "/bin/x".into(),
            retval: u64::MAX,
            duration_ns,
            goid,
            ret: None,
            unwound: None,
            tail_call: None,
        })
    }

    fn fast(e: &Event) -> Option<String> {
        let mut out = Vec::new();
        write(e, &mut out).then(|| String::from_utf8(out).unwrap())
    }

    #[test]
    fn calls_and_returns_are_the_serde_lines_byte_for_byte() {
        let odd = "f\"o\\o\n\u{1}\u{7f}é<T>";
        for e in [
            event("h1", call("fib", "/bin/x", &[1, 0, u64::MAX, 4, 5, 6], None)),
            event("h1", call("main.work", "/bin/gof", &[9, 8, 7, 6, 5, 4, 3, 2, 1], Some(42))),
            event("h1", call("f", "m", &[], None)),
            event(odd, call(odd, odd, &[0], Some(0))),
            event("h1", ret("fib", Some(12), None)),
            event("h1", ret("fib", None, None)),
            event("", ret(odd, Some(0), Some(u64::MAX))),
        ] {
            let serde = serde_json::to_string(&Line::Event(&e)).unwrap();
            assert_eq!(fast(&e).as_deref(), Some(serde.as_str()), "{e:?}");
        }
    }

    #[test]
    fn source_level_and_other_events_are_left_to_serde() {
        let mut c = call("f", "m", &[1], None);
        if let EventData::Call(c) = &mut c {
            c.file = Some(Arc::from("a.c"));
        }
        let mut r = ret("f", Some(1), None);
        if let EventData::Return(r) = &mut r {
            r.ret = Some(SourceValue(serde_json::json!(1)));
        }
        for e in [event("h", c), event("h", r), crate::event::test_events::thread_exit(5, 2)] {
            let mut out = Vec::new();
            assert!(!write(&e, &mut out), "{e:?}");
            assert!(out.is_empty());
        }
    }
}
