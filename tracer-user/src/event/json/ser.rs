//! Writing the model as JSON lines.

use std::fmt;

use serde::{
    Serialize, Serializer,
    ser::{self, SerializeStruct as _},
};

use super::{KIND, Line, OMIT_WHEN_EMPTY, TYPE};
use crate::event::EventData;

/// Any value of the model in its JSON encoding (its enums tagged by `type`, empty fields marked
/// [`omit_when_empty`](super::omit_when_empty) left out), e.g. to embed a channel in another format's arguments.
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
/// [`omit_when_empty`](super::omit_when_empty) left out when empty.
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

/// Whether a field's value is marked [`omit_when_empty`](super::omit_when_empty) and is empty.
fn omitted<T: Serialize + ?Sized>(value: &T) -> bool {
    value.serialize(EmptyProbe { marked: true }).unwrap_or(false)
}

/// Whether a value serializes as nothing: none, an empty list or map, or a struct of such.
fn is_empty<T: Serialize + ?Sized>(value: &T) -> bool {
    value.serialize(EmptyProbe { marked: false }).unwrap_or(false)
}

/// Answers "is it empty?" by serializing; any value with content ends the probe as an error.
/// `marked`: only a value marked [`omit_when_empty`](super::omit_when_empty) may be empty (the question a field asks).
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
