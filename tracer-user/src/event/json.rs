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

use std::{borrow::Cow, fmt};

use serde::{
    Deserialize, Deserializer, Serialize, Serializer,
    de::{self, DeserializeSeed, IntoDeserializer as _, MapAccess, SeqAccess, Visitor, value::MapAccessDeserializer},
    ser::{self, SerializeStruct as _},
};

use super::{Event, EventData, Interner, TraceEnd, TraceItem, TraceStart};

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

/// Any value of the model in its JSON encoding (its enums tagged by `type`, empty fields marked
/// [`omit_when_empty`] left out), e.g. to embed a channel in another format's arguments.
pub struct Json<'a, T: ?Sized>(pub &'a T);

impl<T: Serialize + ?Sized> Serialize for Json<'_, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(TagInside(serializer))
    }
}

impl Serialize for Line<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // JSON takes the length only as "empty or not".
        let mut s = serializer.serialize_struct("Line", 1)?;
        match *self {
            Line::Start(start) => {
                s.serialize_field(KIND, "trace_start")?;
                start.serialize(Fields { out: &mut s, recv_flow_id: None })?;
            }
            Line::End(end) => {
                s.serialize_field(KIND, "trace_end")?;
                end.serialize(Fields { out: &mut s, recv_flow_id: None })?;
            }
            Line::Event(e) => {
                s.serialize_field(KIND, e.data.kind().name())?;
                s.serialize_field("ts", &e.ts)?;
                s.serialize_field("host", &*e.host)?;
                s.serialize_field("pid", &e.pid)?;
                s.serialize_field("tid", &e.tid)?;
                let recv_flow_id = match &e.data {
                    EventData::Recv(r) => Some(r.flow_ids.first().copied()),
                    _ => None,
                };
                e.data.serialize(Fields { out: &mut s, recv_flow_id })?;
            }
        }
        s.end()
    }
}

/// Parses one line of a trace. `Err` is one sentence (without a position: the caller names the
/// line).
pub fn parse_line(text: &str, interner: &mut Interner) -> Result<TraceItem, String> {
    match parse_in_order(text, interner) {
        Err(LineError::TagNotFirst) => {
            let value: serde_json::Value = serde_json::from_str(text).map_err(|e| message(&e))?;
            let reordered = serde_json::to_string(&TagsFirst(&value)).map_err(|e| message(&e))?;
            match parse_in_order(&reordered, interner) {
                Err(LineError::TagNotFirst) => Err(format!("a line needs a `{KIND}`")),
                Err(LineError::Json(e)) => Err(message(&e)),
                Ok(item) => Ok(item),
            }
        }
        Err(LineError::Json(e)) => Err(message(&e)),
        Ok(item) => Ok(item),
    }
}

enum LineError {
    /// A line's `kind` or an enum's `type` is not its first field.
    TagNotFirst,
    Json(serde_json::Error),
}

/// Said in an error when a tag is not first, to tell it from any other error.
const TAG_NOT_FIRST: &str = "\u{0}tag not first";

fn parse_in_order(text: &str, interner: &mut Interner) -> Result<TraceItem, LineError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed = LineSeed { interner }.deserialize(&mut de).and_then(|item| de.end().map(|()| item));
    parsed
        .map_err(|e| if e.to_string().starts_with(TAG_NOT_FIRST) { LineError::TagNotFirst } else { LineError::Json(e) })
}

/// A JSON error's sentence. Errors of content (a missing field, a wrong type) leave out the
/// position, which within one line says nothing more; syntax errors keep their column.
fn message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    if e.is_data() {
        let position = format!(" at line {} column {}", e.line(), e.column());
        if let Some(bare) = text.strip_suffix(&position) {
            return bare.to_string();
        }
    }
    text
}

/// A map key or name, borrowed from the line unless it has escapes.
#[derive(Debug, PartialEq, Eq)]
pub struct Name<'a>(pub Cow<'a, str>);

impl<'de> Deserialize<'de> for Name<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NameVisitor;
        impl<'de> Visitor<'de> for NameVisitor {
            type Value = Name<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Name<'de>, E> {
                Ok(Name(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Name<'de>, E> {
                Ok(Name(Cow::Owned(v.to_string())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Name<'de>, E> {
                Ok(Name(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(NameVisitor)
    }
}

struct LineSeed<'i> {
    interner: &'i mut Interner,
}

impl<'de> DeserializeSeed<'de> for LineSeed<'_> {
    type Value = TraceItem;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<TraceItem, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for LineSeed<'_> {
    type Value = TraceItem;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a trace line (an object)")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<TraceItem, M::Error> {
        match map.next_key::<Name>()? {
            Some(key) if key.0 == KIND => {}
            Some(_) => return Err(de::Error::custom(TAG_NOT_FIRST)),
            None => return Err(de::Error::missing_field(KIND)),
        }
        let kind: Name = map.next_value()?;
        match &*kind.0 {
            "trace_start" => {
                Ok(TraceItem::Start(Box::new(TraceStart::deserialize(MapAccessDeserializer::new(InsideMap(map)))?)))
            }
            "trace_end" => Ok(TraceItem::End(TraceEnd::deserialize(MapAccessDeserializer::new(InsideMap(map)))?)),
            tag => {
                let mut head = Head::default();
                let intercept = Intercept { map, head: &mut head, recv: tag == "recv" };
                let data: EventData<Name> = EventData::deserialize(EnumDe(Tagged { tag, map: intercept }))?;
                let Ok(mut data) = data.map_names(|n| Ok::<_, std::convert::Infallible>(self.interner.intern(&n.0)));
                match &mut data {
                    // Lines written before threads were told apart.
                    EventData::Spawn(s) if s.child_tid == 0 => s.child_tid = s.child_pid,
                    EventData::Recv(r) if r.flow_ids.is_empty() => r.flow_ids.extend(head.flow_id),
                    _ => {}
                }
                Ok(TraceItem::Event(Event {
                    ts: head.ts.ok_or_else(|| de::Error::missing_field("ts"))?,
                    host: self.interner.intern(&head.host.ok_or_else(|| de::Error::missing_field("host"))?),
                    pid: head.pid.ok_or_else(|| de::Error::missing_field("pid"))?,
                    tid: head.tid.ok_or_else(|| de::Error::missing_field("tid"))?,
                    data,
                }))
            }
        }
    }
}

/// An event line's head, taken out of its map before the kind's struct sees it.
#[derive(Default)]
struct Head<'de> {
    ts: Option<u64>,
    host: Option<Cow<'de, str>>,
    pid: Option<u32>,
    tid: Option<u32>,
    /// A `recv`'s `flow_id` (its `flow_ids` say the same, and more).
    flow_id: Option<u64>,
}

/// The rest of an event line, as the kind's struct reads it: the head's fields taken out.
struct Intercept<'h, 'de, M> {
    map: M,
    head: &'h mut Head<'de>,
    recv: bool,
}

impl<'de, M: MapAccess<'de>> MapAccess<'de> for Intercept<'_, 'de, M> {
    type Error = M::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, M::Error> {
        loop {
            let Some(key) = self.map.next_key::<Name>()? else { return Ok(None) };
            match &*key.0 {
                "ts" => self.head.ts = Some(self.map.next_value()?),
                "host" => self.head.host = Some(self.map.next_value::<Name>()?.0),
                "pid" => self.head.pid = Some(self.map.next_value()?),
                "tid" => self.head.tid = Some(self.map.next_value()?),
                "flow_id" if self.recv => self.head.flow_id = self.map.next_value()?,
                KIND => return Err(de::Error::duplicate_field(KIND)),
                _ => return seed.deserialize(key.0.into_deserializer()).map(Some),
            }
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, M::Error> {
        self.map.next_value_seed(InsideSeed(seed))
    }
}

/// An enum whose variant was named by a tag, its fields the rest of a map.
struct Tagged<'t, M> {
    tag: &'t str,
    map: M,
}

impl<'de, M: MapAccess<'de>> de::EnumAccess<'de> for Tagged<'_, M> {
    type Error = M::Error;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), M::Error> {
        let variant = seed.deserialize(self.tag.into_deserializer())?;
        Ok((variant, self))
    }
}

impl<'de, M: MapAccess<'de>> de::VariantAccess<'de> for Tagged<'_, M> {
    type Error = M::Error;

    fn unit_variant(mut self) -> Result<(), M::Error> {
        while self.map.next_entry::<de::IgnoredAny, de::IgnoredAny>()?.is_some() {}
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, M::Error> {
        seed.deserialize(MapAccessDeserializer::new(self.map))
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, _visitor: V) -> Result<V::Value, M::Error> {
        Err(de::Error::custom("a tagged object cannot hold a tuple"))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, M::Error> {
        visitor.visit_map(self.map)
    }
}

/// Hands an enum access to a derived enum's visitor.
struct EnumDe<A>(A);

impl<'de, A: de::EnumAccess<'de>> Deserializer<'de> for EnumDe<A> {
    type Error = A::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, A::Error> {
        visitor.visit_enum(self.0)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier ignored_any
    }
}

/// Reads a JSON value of the model: enums with fields from objects tagged by `type`, and every
/// value inside it the same way.
struct Inside<D>(D);

struct InsideSeed<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for InsideSeed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(Inside(deserializer))
    }
}

/// A visitor whose maps, sequences and options are read [`Inside`] too.
struct InsideVisitor<V>(V);

macro_rules! forward_deserialize {
    ($($method:ident)*) => {
        $(fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
            self.0.$method(InsideVisitor(visitor))
        })*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Inside<D> {
    type Error = D::Error;

    forward_deserialize! {
        deserialize_any deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64 deserialize_u128
        deserialize_f32 deserialize_f64 deserialize_char deserialize_str deserialize_string
        deserialize_bytes deserialize_byte_buf deserialize_option deserialize_unit deserialize_seq
        deserialize_map deserialize_identifier deserialize_ignored_any
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_unit_struct(name, InsideVisitor(visitor))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_newtype_struct(name, InsideVisitor(visitor))
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_tuple(len, InsideVisitor(visitor))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_tuple_struct(name, len, InsideVisitor(visitor))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_struct(name, fields, InsideVisitor(visitor))
    }

    /// A unit variant is a string; a variant with fields an object whose first field, `type`,
    /// names it.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(EnumVisitor(visitor))
    }

    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

struct EnumVisitor<V>(V);

impl<'de, V: Visitor<'de>> Visitor<'de> for EnumVisitor<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.0.expecting(f)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<V::Value, E> {
        self.0.visit_enum(v.into_deserializer())
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<V::Value, M::Error> {
        match map.next_key::<Name>()? {
            Some(key) if key.0 == TYPE => {}
            Some(_) => return Err(de::Error::custom(TAG_NOT_FIRST)),
            None => return Err(de::Error::missing_field(TYPE)),
        }
        let tag: Name = map.next_value()?;
        self.0.visit_enum(Tagged { tag: &tag.0, map: InsideMap(map) })
    }
}

struct InsideMap<M>(M);

impl<'de, M: MapAccess<'de>> MapAccess<'de> for InsideMap<M> {
    type Error = M::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, M::Error> {
        self.0.next_key_seed(seed)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, M::Error> {
        self.0.next_value_seed(InsideSeed(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

struct InsideSeq<A>(A);

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for InsideSeq<A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, A::Error> {
        self.0.next_element_seed(InsideSeed(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

macro_rules! forward_visit {
    ($($method:ident: $ty:ty)*) => {
        $(fn $method<E: de::Error>(self, v: $ty) -> Result<V::Value, E> {
            self.0.$method(v)
        })*
    };
}

impl<'de, V: Visitor<'de>> Visitor<'de> for InsideVisitor<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.0.expecting(f)
    }

    forward_visit! {
        visit_bool: bool visit_i8: i8 visit_i16: i16 visit_i32: i32 visit_i64: i64 visit_i128: i128
        visit_u8: u8 visit_u16: u16 visit_u32: u32 visit_u64: u64 visit_u128: u128 visit_f32: f32
        visit_f64: f64 visit_char: char visit_str: &str visit_borrowed_str: &'de str visit_string: String
        visit_bytes: &[u8] visit_borrowed_bytes: &'de [u8] visit_byte_buf: Vec<u8>
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        self.0.visit_some(Inside(deserializer))
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        self.0.visit_newtype_struct(Inside(deserializer))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.0.visit_seq(InsideSeq(seq))
    }

    fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<V::Value, M::Error> {
        self.0.visit_map(InsideMap(map))
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.0.visit_enum(data)
    }
}

/// A JSON value written with every object's `kind` or `type` first, so that [`parse_in_order`]
/// can read it.
struct TagsFirst<'a>(&'a serde_json::Value);

impl Serialize for TagsFirst<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            serde_json::Value::Object(map) => {
                let tags = [KIND, TYPE].into_iter().filter_map(|k| map.get_key_value(k));
                let rest = map.iter().filter(|(k, _)| *k != KIND && *k != TYPE);
                serializer.collect_map(tags.chain(rest).map(|(k, v)| (k, TagsFirst(v))))
            }
            serde_json::Value::Array(items) => serializer.collect_seq(items.iter().map(TagsFirst)),
            other => other.serialize(serializer),
        }
    }
}

// ---- Writing ----

/// Writes a struct's (or a newtype variant's struct's) fields into a line's object, as JSON
/// values of the model; `recv_flow_id` is written as `flow_id` before `flow_ids`.
struct Fields<'s, S> {
    out: &'s mut S,
    recv_flow_id: Option<Option<u64>>,
}

fn not_a_struct<E: ser::Error>() -> E {
    E::custom("a line's fields come from a struct")
}

macro_rules! not_a_struct {
    ($($method:ident: $ty:ty)*) => {
        $(fn $method(self, _: $ty) -> Result<(), S::Error> {
            Err(not_a_struct())
        })*
    };
}

impl<'s, S: ser::SerializeStruct> Serializer for Fields<'s, S> {
    type Ok = ();
    type Error = S::Error;
    type SerializeSeq = ser::Impossible<(), S::Error>;
    type SerializeTuple = ser::Impossible<(), S::Error>;
    type SerializeTupleStruct = ser::Impossible<(), S::Error>;
    type SerializeTupleVariant = ser::Impossible<(), S::Error>;
    type SerializeMap = ser::Impossible<(), S::Error>;
    type SerializeStruct = Self;
    type SerializeStructVariant = ser::Impossible<(), S::Error>;

    not_a_struct! {
        serialize_bool: bool serialize_i8: i8 serialize_i16: i16 serialize_i32: i32 serialize_i64: i64
        serialize_u8: u8 serialize_u16: u16 serialize_u32: u32 serialize_u64: u64 serialize_f32: f32
        serialize_f64: f64 serialize_char: char serialize_str: &str serialize_bytes: &[u8]
        serialize_unit_struct: &'static str
    }

    fn serialize_none(self) -> Result<(), S::Error> {
        Err(not_a_struct())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<(), S::Error> {
        Err(not_a_struct())
    }
    fn serialize_unit(self) -> Result<(), S::Error> {
        Err(not_a_struct())
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> Result<(), S::Error> {
        Err(not_a_struct())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Result<(), S::Error> {
        value.serialize(self)
    }
    /// An event's data: the kind was written already, as the line's tag.
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        value: &T,
    ) -> Result<(), S::Error> {
        value.serialize(self)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, S::Error> {
        Err(not_a_struct())
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, S::Error> {
        Err(not_a_struct())
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeTupleStruct, S::Error> {
        Err(not_a_struct())
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, S::Error> {
        Err(not_a_struct())
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, S::Error> {
        Err(not_a_struct())
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, S::Error> {
        Ok(self)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, S::Error> {
        Err(not_a_struct())
    }
}

impl<S: ser::SerializeStruct> ser::SerializeStruct for Fields<'_, S> {
    type Ok = ();
    type Error = S::Error;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), S::Error> {
        if key == "flow_ids"
            && let Some(first) = self.recv_flow_id
        {
            self.out.serialize_field("flow_id", &first)?;
        }
        if omitted(value) {
            return self.out.skip_field(key);
        }
        self.out.serialize_field(key, &Json(value))
    }

    fn end(self) -> Result<(), S::Error> {
        Ok(())
    }
}

/// Serializes the model as JSON: enums with fields tagged by `type` first, fields marked
/// [`omit_when_empty`] left out when empty.
struct TagInside<S>(S);

/// A compound value of [`TagInside`], whose elements are written the same way.
struct Compound<C>(C);

macro_rules! forward_serialize {
    ($($method:ident: $ty:ty)*) => {
        $(fn $method(self, v: $ty) -> Result<S::Ok, S::Error> {
            self.0.$method(v)
        })*
    };
}

impl<S: Serializer> Serializer for TagInside<S> {
    type Ok = S::Ok;
    type Error = S::Error;
    type SerializeSeq = Compound<S::SerializeSeq>;
    type SerializeTuple = Compound<S::SerializeTuple>;
    type SerializeTupleStruct = Compound<S::SerializeTupleStruct>;
    type SerializeTupleVariant = Compound<S::SerializeTupleVariant>;
    type SerializeMap = Compound<S::SerializeMap>;
    type SerializeStruct = Compound<S::SerializeStruct>;
    type SerializeStructVariant = Compound<S::SerializeStruct>;

    forward_serialize! {
        serialize_bool: bool serialize_i8: i8 serialize_i16: i16 serialize_i32: i32 serialize_i64: i64
        serialize_i128: i128 serialize_u8: u8 serialize_u16: u16 serialize_u32: u32 serialize_u64: u64
        serialize_u128: u128 serialize_f32: f32 serialize_f64: f64 serialize_char: char serialize_str: &str
        serialize_bytes: &[u8] serialize_unit_struct: &'static str
    }

    fn serialize_none(self) -> Result<S::Ok, S::Error> {
        self.0.serialize_none()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<S::Ok, S::Error> {
        self.0.serialize_some(&Json(value))
    }
    fn serialize_unit(self) -> Result<S::Ok, S::Error> {
        self.0.serialize_unit()
    }
    fn serialize_unit_variant(self, name: &'static str, index: u32, variant: &'static str) -> Result<S::Ok, S::Error> {
        self.0.serialize_unit_variant(name, index, variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, name: &'static str, value: &T) -> Result<S::Ok, S::Error> {
        self.0.serialize_newtype_struct(name, &Json(value))
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<S::Ok, S::Error> {
        self.0.serialize_newtype_variant(name, index, variant, &Json(value))
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Self::SerializeSeq, S::Error> {
        self.0.serialize_seq(len).map(Compound)
    }
    fn serialize_tuple(self, len: usize) -> Result<Self::SerializeTuple, S::Error> {
        self.0.serialize_tuple(len).map(Compound)
    }
    fn serialize_tuple_struct(self, name: &'static str, len: usize) -> Result<Self::SerializeTupleStruct, S::Error> {
        self.0.serialize_tuple_struct(name, len).map(Compound)
    }
    fn serialize_tuple_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleVariant, S::Error> {
        self.0.serialize_tuple_variant(name, index, variant, len).map(Compound)
    }
    fn serialize_map(self, len: Option<usize>) -> Result<Self::SerializeMap, S::Error> {
        self.0.serialize_map(len).map(Compound)
    }
    fn serialize_struct(self, name: &'static str, len: usize) -> Result<Self::SerializeStruct, S::Error> {
        self.0.serialize_struct(name, len).map(Compound)
    }
    /// The variant's name as a `type` field, first.
    fn serialize_struct_variant(
        self,
        name: &'static str,
        _index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStructVariant, S::Error> {
        let mut s = self.0.serialize_struct(name, len + 1)?;
        s.serialize_field(TYPE, variant)?;
        Ok(Compound(s))
    }
    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

impl<C: ser::SerializeSeq> ser::SerializeSeq for Compound<C> {
    type Ok = C::Ok;
    type Error = C::Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), C::Error> {
        self.0.serialize_element(&Json(value))
    }
    fn end(self) -> Result<C::Ok, C::Error> {
        self.0.end()
    }
}

impl<C: ser::SerializeTuple> ser::SerializeTuple for Compound<C> {
    type Ok = C::Ok;
    type Error = C::Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), C::Error> {
        self.0.serialize_element(&Json(value))
    }
    fn end(self) -> Result<C::Ok, C::Error> {
        self.0.end()
    }
}

impl<C: ser::SerializeTupleStruct> ser::SerializeTupleStruct for Compound<C> {
    type Ok = C::Ok;
    type Error = C::Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), C::Error> {
        self.0.serialize_field(&Json(value))
    }
    fn end(self) -> Result<C::Ok, C::Error> {
        self.0.end()
    }
}

impl<C: ser::SerializeTupleVariant> ser::SerializeTupleVariant for Compound<C> {
    type Ok = C::Ok;
    type Error = C::Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), C::Error> {
        self.0.serialize_field(&Json(value))
    }
    fn end(self) -> Result<C::Ok, C::Error> {
        self.0.end()
    }
}

impl<C: ser::SerializeMap> ser::SerializeMap for Compound<C> {
    type Ok = C::Ok;
    type Error = C::Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), C::Error> {
        self.0.serialize_key(&Json(key))
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), C::Error> {
        self.0.serialize_value(&Json(value))
    }
    fn end(self) -> Result<C::Ok, C::Error> {
        self.0.end()
    }
}

impl<C: ser::SerializeStruct> ser::SerializeStruct for Compound<C> {
    type Ok = C::Ok;
    type Error = C::Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), C::Error> {
        if omitted(value) {
            return self.0.skip_field(key);
        }
        self.0.serialize_field(key, &Json(value))
    }
    fn end(self) -> Result<C::Ok, C::Error> {
        self.0.end()
    }
}

impl<C: ser::SerializeStruct> ser::SerializeStructVariant for Compound<C> {
    type Ok = C::Ok;
    type Error = C::Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), C::Error> {
        ser::SerializeStruct::serialize_field(self, key, value)
    }
    fn end(self) -> Result<C::Ok, C::Error> {
        self.0.end()
    }
}

// ---- Whether a value is empty ----

/// Whether a field's value is marked [`omit_when_empty`] and is empty.
fn omitted<T: Serialize + ?Sized>(value: &T) -> bool {
    value.serialize(EmptyProbe { marked: true }).unwrap_or(false)
}

/// Whether a value serializes as nothing: none, an empty list or map, or a struct of such.
fn is_empty<T: Serialize + ?Sized>(value: &T) -> bool {
    value.serialize(EmptyProbe { marked: false }).unwrap_or(false)
}

/// Answers "is it empty?" by serializing; any value with content ends the probe as an error.
/// `marked`: only a value marked [`omit_when_empty`] may be empty (the question a field asks).
#[derive(Clone, Copy)]
struct EmptyProbe {
    marked: bool,
}

#[derive(Debug)]
struct NotEmpty;

impl fmt::Display for NotEmpty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not empty")
    }
}

impl std::error::Error for NotEmpty {}

impl ser::Error for NotEmpty {
    fn custom<T: fmt::Display>(_: T) -> NotEmpty {
        NotEmpty
    }
}

macro_rules! has_content {
    ($($method:ident: $ty:ty)*) => {
        $(fn $method(self, _: $ty) -> Result<bool, NotEmpty> {
            Err(NotEmpty)
        })*
    };
}

impl Serializer for EmptyProbe {
    type Ok = bool;
    type Error = NotEmpty;
    type SerializeSeq = NoElement;
    type SerializeTuple = ser::Impossible<bool, NotEmpty>;
    type SerializeTupleStruct = ser::Impossible<bool, NotEmpty>;
    type SerializeTupleVariant = ser::Impossible<bool, NotEmpty>;
    type SerializeMap = NoElement;
    type SerializeStruct = Self;
    type SerializeStructVariant = ser::Impossible<bool, NotEmpty>;

    /// `false` is empty: a flag is written only when set.
    fn serialize_bool(self, v: bool) -> Result<bool, NotEmpty> {
        if v || self.marked { Err(NotEmpty) } else { Ok(true) }
    }

    has_content! {
        serialize_i8: i8 serialize_i16: i16 serialize_i32: i32 serialize_i64: i64
        serialize_u8: u8 serialize_u16: u16 serialize_u32: u32 serialize_u64: u64 serialize_f32: f32
        serialize_f64: f64 serialize_char: char serialize_str: &str serialize_bytes: &[u8]
        serialize_unit_struct: &'static str
    }

    fn serialize_none(self) -> Result<bool, NotEmpty> {
        self.unmarked(true)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<bool, NotEmpty> {
        Err(NotEmpty)
    }
    fn serialize_unit(self) -> Result<bool, NotEmpty> {
        self.unmarked(true)
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> Result<bool, NotEmpty> {
        Err(NotEmpty)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, name: &'static str, value: &T) -> Result<bool, NotEmpty> {
        if !self.marked {
            value.serialize(self)
        } else if name == OMIT_WHEN_EMPTY {
            Ok(is_empty(value))
        } else {
            Err(NotEmpty)
        }
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<bool, NotEmpty> {
        Err(NotEmpty)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, NotEmpty> {
        self.unmarked(NoElement)
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, NotEmpty> {
        Err(NotEmpty)
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeTupleStruct, NotEmpty> {
        Err(NotEmpty)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, NotEmpty> {
        Err(NotEmpty)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, NotEmpty> {
        self.unmarked(NoElement)
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, NotEmpty> {
        self.unmarked(self)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, NotEmpty> {
        Err(NotEmpty)
    }
}

impl EmptyProbe {
    /// `empty` for a value that may be empty unmarked; a marked-only probe refuses it.
    fn unmarked<T>(self, empty: T) -> Result<T, NotEmpty> {
        if self.marked { Err(NotEmpty) } else { Ok(empty) }
    }
}

impl ser::SerializeStruct for EmptyProbe {
    type Ok = bool;
    type Error = NotEmpty;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, _: &'static str, value: &T) -> Result<(), NotEmpty> {
        if is_empty(value) { Ok(()) } else { Err(NotEmpty) }
    }
    fn end(self) -> Result<bool, NotEmpty> {
        Ok(true)
    }
}

/// A list or map that is empty as long as no element comes.
struct NoElement;

impl ser::SerializeSeq for NoElement {
    type Ok = bool;
    type Error = NotEmpty;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, _: &T) -> Result<(), NotEmpty> {
        Err(NotEmpty)
    }
    fn end(self) -> Result<bool, NotEmpty> {
        Ok(true)
    }
}

impl ser::SerializeMap for NoElement {
    type Ok = bool;
    type Error = NotEmpty;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, _: &T) -> Result<(), NotEmpty> {
        Err(NotEmpty)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, _: &T) -> Result<(), NotEmpty> {
        Err(NotEmpty)
    }
    fn end(self) -> Result<bool, NotEmpty> {
        Ok(true)
    }
}
