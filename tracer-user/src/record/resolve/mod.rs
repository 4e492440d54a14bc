//! What the user asked to trace, resolved before anything is attached: the processes, executables or
//! command ([`targets`]), the ELF file a module name means ([`modules`]), the functions that match a
//! pattern ([`symbols`], with Go's own rules in [`golang`] and a stripped Go file's functions in
//! [`gopclntab`]), where each entry probe is cheapest ([`placement`], reading machine code through
//! [`disasm`]), and how returns are probed ([`unwinding`]).

pub mod disasm;
pub mod golang;
pub mod gopclntab;
pub mod modules;
pub mod placement;
pub mod symbols;
pub mod targets;
pub mod unwinding;
