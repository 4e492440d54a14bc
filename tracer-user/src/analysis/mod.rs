//! What a trace means, computed in one streaming pass: call slices ([`slices`]: each event's calls
//! that begin and end, returned for the consumer to iterate), time per call stack
//! ([`flame_stacks`]), per-function and per-process statistics ([`stats`], [`percentile`]), and the
//! per-thread call listing of `tracer calls` ([`call_listing`]); the text tables people read
//! ([`text_table`]).

pub mod call_listing;
pub mod flame_stacks;
pub mod percentile;
pub mod processes;
pub mod slices;
pub mod stats;
pub mod text_table;
