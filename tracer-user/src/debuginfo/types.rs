//! The types of parameters and return values, as much of them as a call event shows: what a value
//! is (integer, bool, char, enum, pointer, C string, Rust `&str`, float, aggregate), its width and
//! sign, its name as the source spells it, and for aggregates the scalar leaves that the calling
//! conventions classify. Typedefs and cv-qualifiers are seen through (the name keeps them).

use std::sync::Arc;

/// One type, shared (`Arc`) by every parameter that has it.
#[derive(Clone, Debug, PartialEq)]
pub struct Type {
    /// As the source spells it: `unsigned int`, `const char *`, `u32_t`, `&str`, `struct pair`.
    pub name: String,
    /// In bytes (0 for zero-sized types and for `void`).
    pub size: u64,
    pub kind: Kind,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    Int {
        signed: bool,
    },
    Bool,
    /// `char` of C (a byte, `signed` as the platform's char) or a Unicode scalar (Rust `char`,
    /// `char16_t`, `char32_t`: `unicode`).
    Char {
        signed: bool,
        unicode: bool,
    },
    /// `float`, `double`; `x87` for `long double` (80-bit, passed in memory).
    Float {
        x87: bool,
    },
    Enum {
        signed: bool,
        enumerators: Arc<[Enumerator]>,
    },
    /// Pointers and references other than strings (`void *`, `int &`, `*const u8`, `&T`).
    Pointer,
    /// A pointer to plain `char` (any cv-qualifiers): a NUL-terminated string.
    CString,
    /// Rust `&str` (and `&mut str`): a struct of `data_ptr` and `length`.
    RustStr,
    Aggregate(Aggregate),
    /// A type this model does not cover (complex numbers, vectors, pointers to members, a type
    /// unit reference, a malformed or recursive definition): the reason.
    Unknown {
        why: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enumerator {
    pub name: String,
    pub value: i128,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AggregateKind {
    Struct,
    Union,
    Array,
    /// An array of plain `char` (`char name[16]`): a string buffer, read as a string at a
    /// breakpoint.
    CharArray,
    /// A Rust enum with data (a DWARF variant part): its layout is the compiler's choice.
    RustEnum,
}

/// What the calling conventions need to know of a struct, union or array.
#[derive(Clone, Debug, PartialEq)]
pub struct Aggregate {
    pub what: AggregateKind,
    /// The scalar leaves in memory order, for aggregates of at most 16 bytes (larger ones are
    /// never passed in registers); `None` when larger, or when some part is not modelled.
    pub leaves: Option<Vec<Leaf>>,
    /// Alignment in bytes (the largest of the leaves', at least 1).
    pub align: u64,
    /// C++: declares its own destructor or copy/move constructor, so it is not trivially
    /// copyable and the Itanium C++ ABI passes it by invisible reference.
    pub nontrivial: bool,
}

/// A scalar inside an aggregate, at `offset` bytes from its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leaf {
    pub offset: u64,
    pub size: u64,
    pub class: LeafClass,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeafClass {
    /// Integers, bools, chars, enums, pointers: the System V INTEGER class.
    Integer,
    /// `float`, `double`: SSE.
    Float,
    /// `long double`: X87, which forces its aggregate into memory.
    X87,
    /// An element of an array or a member of a union: C classifies it like any scalar, but
    /// rustc gives arrays and unions a memory layout (never a scalar pair).
    InMemoryLayout(LeafScalar),
}

/// The class of a leaf that sits in a memory-layout part (array element, union member).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeafScalar {
    Integer,
    Float,
    X87,
}

impl LeafClass {
    /// The System V class, ignoring how rustc lays it out.
    pub fn scalar(self) -> LeafScalar {
        match self {
            LeafClass::Integer => LeafScalar::Integer,
            LeafClass::Float => LeafScalar::Float,
            LeafClass::X87 => LeafScalar::X87,
            LeafClass::InMemoryLayout(s) => s,
        }
    }

    pub fn in_memory_layout(self) -> LeafClass {
        LeafClass::InMemoryLayout(self.scalar())
    }
}

impl Type {
    pub fn unknown(name: impl Into<String>, size: u64, why: impl Into<String>) -> Type {
        Type { name: name.into(), size, kind: Kind::Unknown { why: why.into() } }
    }

    /// Integers, bools, chars, enums and pointers of at most 8 bytes: one integer register.
    pub fn is_integer_scalar(&self) -> bool {
        matches!(
            self.kind,
            Kind::Int { .. } | Kind::Bool | Kind::Char { .. } | Kind::Enum { .. } | Kind::Pointer | Kind::CString
        ) && self.size <= 8
    }

    /// The scalar leaves of this type if it were a member at `offset` (for the aggregate that
    /// holds it), or `None` if some part is not modelled.
    pub fn leaves_at(&self, offset: u64) -> Option<Vec<Leaf>> {
        let leaf = |class| Some(vec![Leaf { offset, size: self.size, class }]);
        match &self.kind {
            Kind::Unknown { .. } => None,
            _ if self.size == 0 => Some(Vec::new()),
            Kind::Int { .. } if self.size == 16 => Some(vec![
                Leaf { offset, size: 8, class: LeafClass::Integer },
                Leaf { offset: offset + 8, size: 8, class: LeafClass::Integer },
            ]),
            _ if self.is_integer_scalar() => leaf(LeafClass::Integer),
            Kind::Float { x87: true } => leaf(LeafClass::X87),
            Kind::Float { x87: false } if self.size <= 8 => leaf(LeafClass::Float),
            Kind::RustStr => Some(vec![
                Leaf { offset, size: 8, class: LeafClass::Integer },
                Leaf { offset: offset + 8, size: 8, class: LeafClass::Integer },
            ]),
            Kind::Aggregate(a) => {
                Some(a.leaves.as_ref()?.iter().map(|l| Leaf { offset: l.offset + offset, ..*l }).collect())
            }
            _ => None,
        }
    }

    /// The alignment the calling conventions assume: a scalar's size (16 for `__int128` and
    /// `long double`), an aggregate's largest leaf.
    pub fn align(&self) -> u64 {
        match &self.kind {
            Kind::Aggregate(a) => a.align.max(1),
            Kind::RustStr => 8,
            _ => self.size.clamp(1, 16).next_power_of_two(),
        }
    }
}
