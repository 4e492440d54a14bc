//! Several hosts, one timeline: an agent on each host records, a collector starts the same trace on
//! all of them, streams their events, corrects their clocks and links messages across hosts.

pub mod admission;
pub mod agent;
pub mod auth;
pub mod bounded;
pub mod clock_sync;
pub mod collector;
pub mod command_output;
pub mod event_bounds;
pub mod listener;
pub mod merge;
pub mod noise;
pub mod outbox;
pub mod output_lines;
pub mod protocol;
pub mod reconnect;
pub mod request_limits;
pub mod session;
pub mod spill;
pub mod tls;
pub mod wire;
