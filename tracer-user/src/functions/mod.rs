//! A binary's functions, as the probes need them: the functions that match a pattern ([`symbols`],
//! with Go's own rules in [`golang`] and a stripped Go file's functions in [`gopclntab`]), where
//! each entry probe is cheapest ([`placement`], reading machine code through [`disasm`]), and how
//! returns are probed ([`unwinding`]).

pub mod disasm;
pub mod golang;
pub mod gopclntab;
pub mod placement;
pub mod symbols;
pub mod unwinding;
