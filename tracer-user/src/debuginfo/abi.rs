//! Where each parameter is when the entry probe fires (the function's first instruction, before
//! its prologue), and where the return value is when the return probe fires.
//!
//! Two sources, cross-checked:
//!
//! - **The calling convention** ([`classify`]). C and C++ follow the x86-64 System V psABI
//!   (integer class into rdi, rsi, rdx, rcx, r8, r9; a 16-byte aggregate of two integer
//!   eightbytes into two registers; floating point into xmm registers, which a BPF program cannot
//!   read; aggregates over 16 bytes, `long double` and unaligned ones in memory, on the stack; a
//!   C++ class that is not trivially copyable by invisible reference; a return value in memory
//!   takes rdi for its address). Rust's own ABI is not stable; what rustc (1.95, x86-64) does in
//!   practice, from `rustc_target::callconv::adjust_for_rust_abi` and checked on the Rust fixture:
//!   scalars (integers, `bool`, `char`, C-like enums, thin pointers) as C passes them; `i128` in
//!   two registers; a *scalar pair* (`&str`, `&[T]`, `&dyn T`, a struct of exactly two scalars,
//!   in memory order) as two separate arguments; any other aggregate of at most 8 bytes as one
//!   integer; larger aggregates by reference (a pointer to a copy); zero-sized ones not at all;
//!   return values over 16 bytes, and aggregates of 9 to 16 bytes that are not scalar pairs,
//!   through a pointer the caller passes first.
//! - **DWARF** ([`DwarfEntry`]): the location the compiler gives for the entry pc. Unoptimised
//!   code describes parameters by the stack slots its prologue fills, which are not written yet
//!   at entry; optimised code has location lists that start at the entry pc with the register.
//!
//! [`entry_place`] decides. For unoptimised code, the convention (there is nothing else). For
//! optimised code, DWARF, because an optimiser may change the signature of a function that only
//! its own crate or file calls (LLVM removes dead arguments and promotes by-reference ones, which
//! rustc's -O3 does to our fixture); except that a C or C++ function with external linkage keeps
//! the psABI at its symbol: there the two must agree, or the parameter is marked rather than
//! guessed (gcc 12 at -O2 describes an `__int128` parameter with its halves swapped).
//!
//! Return values have no DWARF location: they are where the convention puts them. One hazard is
//! left: LLVM drops the return value of an internal function whose every caller knows it (a
//! constant, propagated into the callers), and rax then holds whatever was there. DWARF does not
//! say so; `tests/debuginfo_live.rs` checks the return values of the optimised Rust fixture.

use super::{Language, layout::Reg, types::*};

/// Where a value is at the probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Reg(Reg),
    /// A 16-byte value, its first (lower-addressed) eightbyte in the first register.
    RegPair(Reg, Reg),
    /// The register holds the value's address (an aggregate passed by reference).
    Reference(Reg),
    /// In the caller's argument area: at entry, `rsp + 8 + offset`. `spilled`: of a class that
    /// goes in registers, but none was left.
    Stack {
        offset: u64,
        spilled: bool,
    },
    /// In vector (xmm) registers.
    Float,
    /// Partly in an integer register, partly in a vector register (`struct { long; double; }`).
    PartlyFloat,
    /// Partly in a register, partly on the stack (a Rust scalar pair that got the last register).
    Split,
    /// A zero-sized value: nothing is passed.
    Nothing,
}

impl Place {
    /// The same place, whatever the reason it is there.
    pub fn same_as(&self, other: &Place) -> bool {
        match (self, other) {
            (Place::Stack { offset: a, .. }, Place::Stack { offset: b, .. }) => a == b,
            _ => self == other,
        }
    }
}

/// Why a value's place is not known.
#[derive(Clone, Debug, PartialEq)]
pub enum Unknown {
    /// Optimised code whose DWARF has no location for it at the entry pc.
    OptimizedOut,
    /// DWARF has only some of its pieces at the entry pc.
    PartlyOptimizedOut,
    /// DWARF gives a computation (a constant, an expression of other values), or a register
    /// that is not an argument register.
    Expression,
    /// Optimised code describes it by a stack-frame slot, which is not valid before the prologue.
    FrameSlot,
    /// DWARF and the calling convention place it differently.
    Conflict { abi: Place, dwarf: Place },
    /// Its type, or an earlier parameter's, is not modelled well enough to place it.
    Type(String),
}

/// What DWARF says of a parameter at the entry pc.
#[derive(Clone, Debug, PartialEq)]
pub enum DwarfEntry {
    At(Place),
    /// A stack-frame slot (the prologue stores the register there): unoptimised code.
    FrameSlot,
    /// A location list without an entry for the entry pc.
    NotAtEntry,
    /// No location at all.
    Absent,
    PartlyOptimizedOut,
    Expression,
}

impl DwarfEntry {
    /// Whether this location can only come from optimised code: a register at the entry pc, or
    /// none at all (unoptimised code keeps every parameter in a stack slot).
    pub fn shows_optimisation(&self) -> bool {
        match self {
            DwarfEntry::At(place) => !matches!(place, Place::Stack { .. }),
            DwarfEntry::FrameSlot | DwarfEntry::NotAtEntry => false,
            DwarfEntry::Absent | DwarfEntry::PartlyOptimizedOut | DwarfEntry::Expression => true,
        }
    }
}

/// Decides a parameter's place from the calling convention and DWARF (see the module's comment).
pub fn entry_place(
    optimized: bool,
    abi_binding: bool,
    abi: &Result<Place, Unknown>,
    dwarf: &DwarfEntry,
) -> Result<Place, Unknown> {
    if !optimized {
        return match (abi, dwarf) {
            (Ok(a), DwarfEntry::At(d)) if !a.same_as(d) => Err(Unknown::Conflict { abi: *a, dwarf: *d }),
            _ => abi.clone(),
        };
    }
    match dwarf {
        DwarfEntry::At(d) if abi_binding => match abi {
            Ok(a) if a.same_as(d) => Ok(*a),
            Ok(a) => Err(Unknown::Conflict { abi: *a, dwarf: *d }),
            Err(_) => Ok(*d),
        },
        DwarfEntry::At(d) => Ok(*d),
        _ if abi_binding => abi.clone(),
        DwarfEntry::FrameSlot => Err(Unknown::FrameSlot),
        DwarfEntry::NotAtEntry | DwarfEntry::Absent => Err(Unknown::OptimizedOut),
        DwarfEntry::PartlyOptimizedOut => Err(Unknown::PartlyOptimizedOut),
        DwarfEntry::Expression => Err(Unknown::Expression),
    }
}

/// The places the calling convention gives a function's parameters at entry and its return
/// value at return.
#[derive(Clone, Debug, PartialEq)]
pub struct Classified {
    pub params: Vec<Result<Place, Unknown>>,
    pub ret: Option<Result<Place, Unknown>>,
}

const ARG_REGS: [Reg; 6] = [Reg::Rdi, Reg::Rsi, Reg::Rdx, Reg::Rcx, Reg::R8, Reg::R9];
const XMM_ARGS: usize = 8;

/// How one value travels, before registers are handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    /// One or two integer registers.
    Ints(usize),
    /// One or two vector registers.
    Floats(usize),
    /// One integer and one vector register.
    IntAndFloat,
    /// A Rust scalar pair: two separate arguments, each an integer (true) or a float.
    Pair(bool, bool),
    /// A pointer to it in one integer register.
    Reference,
    Memory,
    Nothing,
}

/// Hands out registers and stack slots in order.
struct Allocator {
    next_int: usize,
    next_xmm: usize,
    stack: u64,
}

impl Allocator {
    fn stack(&mut self, ty: &Type, spilled: bool) -> Place {
        let align = ty.align().max(8);
        let offset = self.stack.div_ceil(align) * align;
        self.stack = offset + ty.size.div_ceil(8) * 8;
        Place::Stack { offset, spilled }
    }

    fn ints(&mut self, n: usize) -> Option<&'static [Reg]> {
        let regs = ARG_REGS.get(self.next_int..self.next_int + n)?;
        self.next_int += n;
        Some(regs)
    }

    fn place(&mut self, ty: &Type, pass: Pass) -> Place {
        match pass {
            Pass::Nothing => Place::Nothing,
            Pass::Memory => self.stack(ty, false),
            Pass::Ints(n) => match self.ints(n) {
                Some([r]) => Place::Reg(*r),
                Some([a, b]) => Place::RegPair(*a, *b),
                _ => self.stack(ty, true),
            },
            Pass::Reference => match self.ints(1) {
                Some([r]) => Place::Reference(*r),
                _ => self.stack(ty, true),
            },
            Pass::Floats(n) if self.next_xmm + n <= XMM_ARGS => {
                self.next_xmm += n;
                Place::Float
            }
            Pass::Floats(_) => self.stack(ty, false),
            Pass::IntAndFloat if self.next_xmm < XMM_ARGS && self.next_int < ARG_REGS.len() => {
                self.next_xmm += 1;
                self.next_int += 1;
                Place::PartlyFloat
            }
            Pass::IntAndFloat => self.stack(ty, true),
            // Two separate arguments: each takes what is left.
            Pass::Pair(a_int, b_int) => {
                let mut one = |int: bool| {
                    if int {
                        self.ints(1).map(|r| Some(r[0])).ok_or(())
                    } else if self.next_xmm < XMM_ARGS {
                        self.next_xmm += 1;
                        Ok(None)
                    } else {
                        Err(())
                    }
                };
                let (a, b) = (one(a_int), one(b_int));
                match (a, b) {
                    (Ok(Some(a)), Ok(Some(b))) => Place::RegPair(a, b),
                    (Ok(None), Ok(None)) => Place::Float,
                    (Ok(_), Ok(_)) => Place::PartlyFloat,
                    (Err(()), Err(())) => self.stack(ty, true),
                    _ => Place::Split,
                }
            }
        }
    }
}

/// The System V class of an aggregate of at most 16 bytes, from its leaves; `Memory` when a leaf
/// is unaligned, straddles an eightbyte or is x87.
fn sysv_aggregate(ty: &Type, leaves: &[Leaf]) -> Pass {
    let mut integer = [false; 2];
    let mut float = [false; 2];
    for leaf in leaves {
        if leaf.size == 0 {
            continue;
        }
        let eightbyte = (leaf.offset / 8) as usize;
        let unaligned = leaf.offset % leaf.size.min(8) != 0;
        if unaligned || leaf.offset % 8 + leaf.size > 8 || eightbyte > 1 {
            return Pass::Memory;
        }
        match leaf.class.scalar() {
            LeafScalar::Integer => integer[eightbyte] = true,
            LeafScalar::Float => float[eightbyte] = true,
            LeafScalar::X87 => return Pass::Memory,
        }
    }
    let eightbytes = ty.size.div_ceil(8) as usize;
    let classes: Vec<bool> = (0..eightbytes).map(|i| integer[i] || !float[i]).collect();
    match classes.as_slice() {
        [true] => Pass::Ints(1),
        [false] => Pass::Floats(1),
        [true, true] => Pass::Ints(2),
        [false, false] => Pass::Floats(2),
        [_, _] => Pass::IntAndFloat,
        _ => Pass::Nothing,
    }
}

fn sysv_pass(ty: &Type) -> Result<Pass, Unknown> {
    Ok(match &ty.kind {
        Kind::Unknown { why } => return Err(Unknown::Type(format!("{}: {why}", ty.name))),
        _ if ty.size == 0 => Pass::Nothing,
        Kind::Int { .. } if ty.size == 16 => Pass::Ints(2),
        _ if ty.is_integer_scalar() => Pass::Ints(1),
        Kind::Float { x87: true } => Pass::Memory,
        Kind::Float { x87: false } => Pass::Floats(1),
        Kind::RustStr => Pass::Ints(2),
        Kind::Aggregate(a) if a.nontrivial => Pass::Reference,
        Kind::Aggregate(_) if ty.size > 16 => Pass::Memory,
        Kind::Aggregate(a) => match &a.leaves {
            Some(leaves) => sysv_aggregate(ty, leaves),
            None => return Err(Unknown::Type(format!("the layout of {} is not modelled", ty.name))),
        },
        _ => return Err(Unknown::Type(format!("{} is not modelled", ty.name))),
    })
}

/// rustc's scalar pair: exactly two scalar leaves (after newtypes and zero-sized fields), neither
/// inside an array or union, laid out back to back.
fn rust_scalar_pair(ty: &Type, leaves: &[Leaf]) -> Option<(Leaf, Leaf)> {
    let [a, b] = leaves else { return None };
    if matches!(a.class, LeafClass::InMemoryLayout(_)) || matches!(b.class, LeafClass::InMemoryLayout(_)) {
        return None;
    }
    let b_align = b.size.clamp(1, 16);
    let b_offset = (a.offset + a.size).div_ceil(b_align) * b_align;
    let align = a.size.max(b.size).clamp(1, 16);
    let size = (b.offset + b.size).div_ceil(align) * align;
    (a.offset == 0 && b.offset == b_offset && ty.size == size).then_some((*a, *b))
}

fn rust_pass(ty: &Type, is_return: bool) -> Result<Pass, Unknown> {
    let int = |l: &Leaf| l.class.scalar() == LeafScalar::Integer;
    Ok(match &ty.kind {
        Kind::Unknown { why } => return Err(Unknown::Type(format!("{}: {why}", ty.name))),
        _ if ty.size == 0 => Pass::Nothing,
        _ if is_return && ty.size > 16 => Pass::Reference,
        Kind::Int { .. } if ty.size == 16 => Pass::Ints(2),
        _ if ty.is_integer_scalar() => Pass::Ints(1),
        Kind::Float { .. } if ty.size <= 8 => Pass::Floats(1),
        Kind::RustStr => Pass::Pair(true, true),
        Kind::Aggregate(_) if ty.size > 16 => Pass::Reference,
        Kind::Aggregate(a) => match &a.leaves {
            // A newtype of one scalar is that scalar.
            Some(leaves) if leaves.len() == 1 && leaves[0].size == ty.size && a.what == AggregateKind::Struct => {
                if int(&leaves[0]) { Pass::Ints(1) } else { Pass::Floats(1) }
            }
            Some(leaves) => match rust_scalar_pair(ty, leaves) {
                Some((x, y)) => Pass::Pair(int(&x), int(&y)),
                None if ty.size <= 8 => Pass::Ints(1),
                None => Pass::Reference,
            },
            None => return Err(Unknown::Type(format!("the layout of {} is the compiler's choice", ty.name))),
        },
        _ => return Err(Unknown::Type(format!("{} is not modelled", ty.name))),
    })
}

/// The calling convention's places for these parameter types and return type.
pub fn classify(language: Language, params: &[&Type], ret: Option<&Type>) -> Classified {
    let pass = |ty: &Type, is_return| match language {
        Language::Rust => rust_pass(ty, is_return),
        _ => sysv_pass(ty),
    };
    let mut alloc = Allocator { next_int: 0, next_xmm: 0, stack: 0 };
    let ret = ret.map(|ty| {
        let p = pass(ty, true)?;
        Ok(match p {
            Pass::Nothing => Place::Nothing,
            Pass::Ints(1) => Place::Reg(Reg::Rax),
            Pass::Ints(_) => Place::RegPair(Reg::Rax, Reg::Rdx),
            Pass::Pair(true, true) => Place::RegPair(Reg::Rax, Reg::Rdx),
            Pass::Floats(_) | Pass::Pair(false, false) => Place::Float,
            Pass::IntAndFloat | Pass::Pair(..) => Place::PartlyFloat,
            // In memory: the caller passes the address first, and rax holds it on return.
            Pass::Memory | Pass::Reference => {
                alloc.next_int = 1;
                Place::Reference(Reg::Rax)
            }
        })
    });
    let mut params_out = Vec::with_capacity(params.len());
    let mut earlier_unknown: Option<String> = None;
    for ty in params {
        if let Some(why) = &earlier_unknown {
            params_out.push(Err(Unknown::Type(why.clone())));
            continue;
        }
        match pass(ty, false) {
            Ok(p) => params_out.push(Ok(alloc.place(ty, p))),
            Err(e) => {
                if let Unknown::Type(why) = &e {
                    earlier_unknown = Some(format!("an earlier parameter is not placed ({why})"));
                }
                params_out.push(Err(e));
            }
        }
    }
    Classified { params: params_out, ret }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RDI: Place = Place::Reg(Reg::Rdi);
    const RSI: Place = Place::Reg(Reg::Rsi);

    #[test]
    fn unoptimised_code_follows_the_convention_and_checks_stack_slots() {
        assert_eq!(entry_place(false, false, &Ok(RDI), &DwarfEntry::FrameSlot), Ok(RDI));
        let stack = |offset| Place::Stack { offset, spilled: false };
        assert_eq!(entry_place(false, true, &Ok(stack(8)), &DwarfEntry::At(stack(8))), Ok(stack(8)));
        assert_eq!(
            entry_place(false, true, &Ok(stack(0)), &DwarfEntry::At(stack(8))),
            Err(Unknown::Conflict { abi: stack(0), dwarf: stack(8) })
        );
    }

    #[test]
    fn optimised_code_follows_dwarf_unless_the_psabi_binds_the_symbol() {
        // A Rust (or static C) function: DWARF wins, and what it lacks is not guessed.
        assert_eq!(entry_place(true, false, &Ok(RDI), &DwarfEntry::At(RSI)), Ok(RSI));
        assert_eq!(entry_place(true, false, &Ok(RDI), &DwarfEntry::Absent), Err(Unknown::OptimizedOut));
        assert_eq!(entry_place(true, false, &Ok(RDI), &DwarfEntry::FrameSlot), Err(Unknown::FrameSlot));
        assert_eq!(
            entry_place(true, false, &Ok(RDI), &DwarfEntry::PartlyOptimizedOut),
            Err(Unknown::PartlyOptimizedOut)
        );
        // An external C function: the two must agree; without DWARF the convention stands.
        assert_eq!(entry_place(true, true, &Ok(RDI), &DwarfEntry::At(RDI)), Ok(RDI));
        assert_eq!(
            entry_place(true, true, &Ok(RDI), &DwarfEntry::At(RSI)),
            Err(Unknown::Conflict { abi: RDI, dwarf: RSI })
        );
        assert_eq!(entry_place(true, true, &Ok(RDI), &DwarfEntry::Absent), Ok(RDI));
        let unknown = Err(Unknown::Type("struct s".into()));
        assert_eq!(entry_place(true, true, &unknown, &DwarfEntry::At(RSI)), Ok(RSI));
    }

    fn int(size: u64) -> Type {
        Type { name: format!("i{size}"), size, kind: Kind::Int { signed: true } }
    }

    #[test]
    fn registers_run_out_and_an_unknown_type_stops_the_count() {
        let i = int(4);
        let wide = int(16);
        let params: Vec<&Type> = vec![&i, &i, &i, &i, &i, &wide, &i];
        let c = classify(Language::C, &params, None);
        // The __int128 needs two registers and only r9 is left: it goes on the stack whole, and
        // the last int still gets r9.
        assert_eq!(c.params[5], Ok(Place::Stack { offset: 0, spilled: true }));
        assert_eq!(c.params[6], Ok(Place::Reg(Reg::R9)));
        let odd = Type::unknown("v4sf", 16, "a vector");
        let c = classify(Language::C, &[&i, &odd, &i], None);
        assert_eq!(c.params[0], Ok(RDI));
        assert!(matches!(&c.params[2], Err(Unknown::Type(why)) if why.starts_with("an earlier parameter")));
    }
}
