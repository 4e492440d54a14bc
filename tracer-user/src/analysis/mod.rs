//! What a trace means, computed in one streaming pass: call slices ([`call_tree`]), time per call
//! stack ([`stacks`]), per-function and per-process statistics ([`stats`], [`percentile`]), and
//! per-thread call sequences ([`calls`]).

pub mod call_tree;
pub mod calls;
pub mod percentile;
pub mod processes;
pub mod stacks;
pub mod stats;
