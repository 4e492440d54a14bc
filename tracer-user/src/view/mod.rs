//! `tracer view` and `--serve`: the trace as a page in the browser, served by tracer itself.
//!
//! The viewer is a sink ([`model::ViewModel`]: the aggregates `report` and the flame graph compute,
//! never the events) and a reader (a recorded trace is replayed into the model once; a thread's
//! call tree is read again page by page, [`calls_page`]). [`server`] serves the page
//! ([`assets`]) and the model's state as JSON, and while recording as a stream of server-sent
//! events (the state at least twice a second, then once more when the trace ends).

pub mod assets;
pub mod calls_page;
pub mod model;
pub mod server;
