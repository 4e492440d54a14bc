//! Recording a trace: from a checked [`Plan`](crate::plan::Plan), load and attach everything
//! ([`Recording::start`]), then drain events into a sink until the targets are gone, the
//! duration elapses or the caller stops it ([`Recording::run`]).

mod attached;
pub mod drain;
mod follow;
pub mod pace;
mod run;
mod start_gate;

pub use run::{Outcome, Progress, Recording};
pub use start_gate::StartGate;
