//! Reading a JSON line back into the model.

use std::{borrow::Cow, fmt};

use serde::{
    Deserialize, Deserializer, Serialize, Serializer,
    de::{self, DeserializeSeed, IntoDeserializer as _, MapAccess, SeqAccess, Visitor, value::MapAccessDeserializer},
};

use super::{KIND, TYPE};
use crate::event::{Event, EventData, Interner, TraceEnd, TraceItem, TraceStart};

/// Why a line is not one of a trace: one sentence, without a position (the caller names the
/// line). The JSON error is said in the sentence, not as a source: it is the whole cause.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error("{}", message(.0))]
    Json(serde_json::Error),
    #[error("a line needs a `{KIND}`")]
    NoKind,
}

/// Parses one line of a trace.
pub fn parse_line(text: &str, interner: &mut Interner) -> Result<TraceItem, ParseError> {
    match parse_in_order(text, interner) {
        Err(LineError::TagNotFirst) => {
            let value: serde_json::Value = serde_json::from_str(text).map_err(ParseError::Json)?;
            let reordered = serde_json::to_string(&TagsFirst(&value)).map_err(ParseError::Json)?;
            match parse_in_order(&reordered, interner) {
                Err(LineError::TagNotFirst) => Err(ParseError::NoKind),
                Err(LineError::Json(e)) => Err(ParseError::Json(e)),
                Ok(item) => Ok(item),
            }
        }
        Err(LineError::Json(e)) => Err(ParseError::Json(e)),
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
