//! OTLP attributes and resources, made of the events' values.

use super::proto::{
    common::v1::{AnyValue, ArrayValue, KeyValue, KeyValueList, any_value},
    resource::v1::Resource,
};
use crate::event::data;

/// A JSON value as an OTLP value: numbers that fit an i64 as integers, others as doubles,
/// objects as key-value lists.
pub(super) fn json_value(v: &serde_json::Value) -> AnyValue {
    use serde_json::Value as J;
    let value = match v {
        J::Null => None,
        J::Bool(b) => Some(any_value::Value::BoolValue(*b)),
        J::Number(n) => Some(match n.as_i64() {
            Some(i) => any_value::Value::IntValue(i),
            None => any_value::Value::DoubleValue(n.as_f64().unwrap_or(f64::NAN)),
        }),
        J::String(s) => Some(any_value::Value::StringValue(s.clone())),
        J::Array(a) => Some(any_value::Value::ArrayValue(ArrayValue { values: a.iter().map(json_value).collect() })),
        J::Object(o) => Some(any_value::Value::KvlistValue(KeyValueList {
            values: o.iter().map(|(k, v)| kv(k, json_value(v))).collect(),
        })),
    };
    AnyValue { value }
}

pub(super) fn resource(host: &str, pid: u32, comm: &str, service_name: Option<&str>) -> Resource {
    let comm = if comm.is_empty() { format!("pid {pid}") } else { comm.to_string() };
    Resource {
        attributes: vec![
            string("service.name", service_name.map_or_else(|| comm.clone(), str::to_string)),
            string("host.name", host.to_string()),
            int("process.pid", pid as i64),
            string("process.executable.name", comm),
        ],
        ..Default::default()
    }
}

pub(super) fn channel_kind(c: &data::Channel) -> &'static str {
    match c {
        data::Channel::Tcp { .. } => "tcp",
        data::Channel::Udp { .. } => "udp",
        data::Channel::UnixStream { .. } => "unix_stream",
        data::Channel::UnixDgram { .. } => "unix_dgram",
        data::Channel::Pipe { .. } => "pipe",
        data::Channel::Fifo { .. } => "fifo",
    }
}

pub(super) fn kv(key: &str, value: AnyValue) -> KeyValue {
    KeyValue { key: key.into(), value: Some(value), ..Default::default() }
}

pub(super) fn string(key: &str, value: String) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(any_value::Value::StringValue(value)) }),
        ..Default::default()
    }
}

/// OTLP integers are signed: a u64 above `i64::MAX` keeps its bits.
pub(super) fn int(key: &str, value: i64) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(any_value::Value::IntValue(value)) }),
        ..Default::default()
    }
}

pub(super) fn ints(key: &str, values: &[u64]) -> KeyValue {
    let values =
        values.iter().map(|v| AnyValue { value: Some(any_value::Value::IntValue(*v as i64)) }).collect::<Vec<_>>();
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(any_value::Value::ArrayValue(ArrayValue { values })) }),
        ..Default::default()
    }
}
