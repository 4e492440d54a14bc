//! A trace's first and last lines: what was traced, how, and how it ended.

use std::{collections::BTreeMap, fmt};

use serde::{Deserialize, Serialize};

use super::{EventKind, ProbePaths, host::Machine, json::omit_when_empty};

/// What a trace's first line says about it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceStart {
    pub format_version: u32,
    /// Host that recorded the trace.
    pub host: String,
    pub tracer_version: String,
    /// When tracing began, nanoseconds since the Unix epoch.
    pub ts: u64,
    pub clock: ClockInfo,
    pub targets: Vec<TargetInfo>,
    /// Number of functions probed.
    pub probes: usize,
    /// Event kinds recorded.
    pub events: Vec<EventKind>,
    pub follow_children: bool,
    /// The probed functions by the path their probes take in this kernel (optimized, emulated,
    /// trap; see `placement`), and those whose probes moved off the symbol.
    #[serde(default, serialize_with = "omit_when_empty")]
    pub probe_paths: ProbePaths,
    /// The probed functions that have other names (aliases: symbols at the same address), by the
    /// name their events carry (the one the user's pattern matched): `open64: [open, __open64]`.
    #[serde(default, serialize_with = "omit_when_empty")]
    pub aliases: BTreeMap<String, Vec<String>>,
    /// A trace merged from several hosts: each host, its clock correction and its targets.
    #[serde(default, serialize_with = "omit_when_empty")]
    pub hosts: Vec<HostInfo>,
    /// The machine that recorded (or, merged, collected) the trace, as it says itself; `host` is
    /// the name the user gave it.
    #[serde(default, serialize_with = "omit_when_empty")]
    pub machine: Option<Machine>,
    /// The kernel that recorded the trace and the mechanisms its features chose; `null` in a
    /// merged trace (each host has its own) and in traces of older versions. Always written:
    /// the protocol and the native format encode it with postcard, which has no field names.
    #[serde(default)]
    pub kernel: Option<KernelInfo>,
}

/// The kernel a trace was recorded on, and how the tracer used it there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelInfo {
    /// `uname -r`.
    pub release: String,
    /// How function and USDT probes were attached: `uprobe_multi` (Linux 6.6+) or `perf_event`.
    pub attach: String,
    /// Where a process's end comes from: `group_dead` (the tracepoint's argument, 6.16+) or
    /// `live_threads` (derived from the process's live-thread count).
    pub process_exit: String,
    /// Whether uprobes on 5-byte nops take the kernel's optimized path (6.18+).
    pub optimized_probes: bool,
    /// The ring buffer's size in bytes (`--buffer-size`, or fitted to the trace); 0 in traces
    /// written before it was recorded.
    #[serde(default)]
    pub ring_bytes: u32,
}

/// One host of a merged trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostInfo {
    /// The name the user gave the host (`--agent NAME=ADDR`): every event of the host carries it.
    pub name: String,
    /// The machine's own identity (host name, boot id, machine id), as its agent read it.
    #[serde(default, serialize_with = "omit_when_empty")]
    pub machine: Option<Machine>,
    /// Subtracted from the host's timestamps (its clock minus the collector's), nanoseconds.
    pub offset_ns: i64,
    /// Half the width of the interval the offset is known to lie in, after message links.
    pub uncertainty_ns: u64,
    /// The same, from the round trips alone.
    pub round_trip_uncertainty_ns: u64,
    /// How fast the host's clock ran against the collector's, parts per million.
    pub drift_ppm: f64,
    pub events: u64,
    /// Events the agent dropped while its collector was away.
    pub lost_in_transit: u64,
    pub targets: Vec<TargetInfo>,
}

/// How event timestamps were made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClockInfo {
    /// The kernel clock events were stamped with.
    pub source: String,
    /// Added to that clock to get Unix time (`CLOCK_REALTIME - CLOCK_BOOTTIME`), nanoseconds.
    pub offset_ns: i64,
    /// Half the width of the tightest bracket in which the offset was read, nanoseconds.
    pub uncertainty_ns: u64,
}

/// One thing the user asked to trace, as resolved at start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetInfo {
    /// A process traced with `--pid`, or found running a `--binary` at start.
    Process { pid: u32, comm: String, exe: String },
    /// An executable traced with `--binary`.
    Binary { path: String },
    /// The command the tracer launched.
    Command { pid: u32, argv: Vec<String>, exe: String },
}

/// What a trace's last line says about it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceEnd {
    /// When tracing stopped, nanoseconds since the Unix epoch.
    pub ts: u64,
    pub reason: EndReason,
    /// Event lines written between `trace_start` and `trace_end`.
    pub events_written: u64,
    /// Events the kernel could not write (ring buffer full), per kind, plus `untraced_children`
    /// (children that could not be added to the traced set) and `undecodable` (records user space
    /// could not read).
    pub lost_events: BTreeMap<String, u64>,
    /// Calls made while [`MAX_URETPROBE_DEPTH`](tracer_common::MAX_URETPROBE_DEPTH) probed calls
    /// were already active on the thread: the kernel installs no return probe for them, so they
    /// have no `return` event (a kernel limit, modelled by `assemble::pairing::CallStacks`).
    #[serde(default)]
    pub calls_without_return_probe: u64,
    /// Exit code of the launched command (128 + signal when killed).
    #[serde(default)]
    pub command_exit_code: Option<i32>,
    /// How IPC transfers were linked: receives linked to a traced send, receives with none, and
    /// bytes received without a traced sender.
    #[serde(default)]
    pub ipc: IpcStats,
    /// A trace collected from several hosts: per host, whether its part is complete, and if not
    /// what was lost and why.
    #[serde(default, serialize_with = "omit_when_empty")]
    pub hosts: Vec<HostEnd>,
    /// Functions whose calls the kernel decided on (a predicate `-f 'FUNC if EXPR'`,
    /// `--min-duration`, `--start-at`, `--stop-at`, `--depth`), by event name: what it decided.
    #[serde(default, serialize_with = "omit_when_empty")]
    pub filters: BTreeMap<String, FilterStats>,
    /// The `-f` patterns that matched no function of any image the trace saw (the targets'
    /// executables and every image their processes exec'd).
    #[serde(default, serialize_with = "omit_when_empty")]
    pub unmatched_functions: Option<Box<UnmatchedFunctions>>,
    /// Execs of new images by processes under ptrace (gdb, strace), which are not stopped for
    /// their image's functions to be resolved: those were probed once tracer read the exec, and
    /// the calls made before are missing. Absent when none.
    #[serde(default, serialize_with = "omit_when_empty")]
    pub execs_probed_late: Option<u64>,
}

/// `-f` patterns that matched nothing, said once at the end of a trace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnmatchedFunctions {
    /// The patterns, as given.
    pub patterns: Vec<String>,
    /// The executables the trace saw (a `#!` script's interpreter, not the script), in the order
    /// they were first seen.
    pub images: Vec<String>,
    /// Names close to the patterns ("did you mean"), if any.
    #[serde(default)]
    pub suggestions: Vec<String>,
}

/// What one function's predicate did, counted in the kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilterStats {
    /// The expression, as written after `if` (empty for none).
    pub predicate: String,
    /// The expression after `ret-if`, decided at the return.
    #[serde(default, serialize_with = "omit_when_empty")]
    pub ret_predicate: Option<String>,
    /// `--min-duration`, in nanoseconds, when this function's calls were held for it.
    #[serde(default)]
    pub min_duration_ns: u64,
    /// Calls the predicate was evaluated on.
    pub seen: u64,
    /// Calls it passed, written to the ring buffer (one the ring had no room for is counted in
    /// `lost_events` too).
    pub written: u64,
    /// Calls it refused: neither they nor their returns were written.
    pub filtered_out: u64,
    /// Refused calls whose return could not be remembered (the kernel's map of open refused
    /// calls was full): their returns were written without their calls.
    pub returns_not_dropped: u64,
    /// Calls decided at their return whose entry the kernel no longer held then (its bounded
    /// map was full, or the call began before tracing did): neither was written.
    #[serde(default)]
    pub entries_lost: u64,
    /// Of `filtered_out`, the calls made while their thread was not recording (`--start-at`,
    /// `--stop-at`).
    #[serde(default)]
    pub by_trigger: u64,
    /// Of `filtered_out`, the calls nested deeper than `--depth` traced calls (or than 64).
    #[serde(default)]
    pub by_depth: u64,
    /// Returns dropped because the kernel did not hold their call open (it began before
    /// tracing did, or the thread's state was evicted past 8192 threads): with triggers or
    /// `--depth` only.
    #[serde(default)]
    pub returns_unmatched: u64,
    /// With `--min-duration-keep-children`: of `filtered_out`, short calls made inside an open
    /// call that its thread had no room to hold (16,384 events a thread) until that call
    /// returned, so they were not written even if it was long enough.
    #[serde(default)]
    pub children_dropped: u64,
}

/// How one host's part of a collected trace ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostEnd {
    pub name: String,
    /// Every event the host's agent recorded was received.
    pub complete: bool,
    /// Why the host's trace ended, as its agent said (none if no end arrived).
    pub reason: Option<EndReason>,
    /// Events received from it.
    pub events: u64,
    /// Exit code of the command it launched (128 + signal when killed).
    pub command_exit_code: Option<i32>,
    /// What makes it incomplete; empty when complete.
    #[serde(default, serialize_with = "omit_when_empty")]
    pub lost: Vec<HostLoss>,
}

/// Something a collector could not get from a host, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostLoss {
    pub cause: LossCause,
    /// One sentence: what is missing.
    pub detail: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossCause {
    /// The connection dropped and the agent could not be reached again in time: everything after
    /// the last event received is missing.
    ReconnectWindowUsedUp,
    /// The agent no longer had the trace when the collector came back.
    AgentDroppedTrace,
    /// The agent reported that the trace failed.
    AgentFailed,
    /// The trace did not end within the stop timeout.
    StopTimedOut,
    /// The agent dropped events while the collector was away (its buffer was full).
    Gap,
    /// The collector could not write the host's events to its spill file (the disk is full).
    SpillFailed,
    /// The agent sent what no host sends or more than a collector holds (a pid of 2^22 or more,
    /// a timestamp outside the trace, a string table past its bound): nothing after it is taken.
    BoundBroken,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpcStats {
    pub sends: u64,
    pub recvs: u64,
    /// Receives that consumed bytes of at least one traced send.
    pub linked_recvs: u64,
    /// Receives whose bytes came from no traced send (the sender is not traced, or wrote before
    /// tracing started).
    pub unlinked_recvs: u64,
    /// Signal generations linked to their delivery.
    pub linked_signals: u64,
}

impl TraceEnd {
    /// An end with nothing lost and no statistics, for a trace whose recorder wrote none (it was
    /// cut off, or failed).
    pub fn new(ts: u64, reason: EndReason, events_written: u64) -> TraceEnd {
        TraceEnd {
            ts,
            reason,
            events_written,
            lost_events: BTreeMap::new(),
            calls_without_return_probe: 0,
            command_exit_code: None,
            ipc: IpcStats::default(),
            hosts: Vec::new(),
            filters: BTreeMap::new(),
            unmatched_functions: None,
            execs_probed_late: None,
        }
    }

    pub fn total_lost(&self) -> u64 {
        self.lost_events.values().sum()
    }
}

/// Where the events of one `lost_events` kind were lost and what to do about it, in one sentence
/// for the stderr summary: each kind is lost in its own place, and a larger ring buffer helps only
/// some.
pub fn why_lost(kind: &str) -> &'static str {
    match kind {
        "call" | "return" | "spawn" | "exit" | "ipc" | "signal" | "log" | "usdt" | "break" | "watch" => {
            "lost in the kernel: the ring buffer was full; try a larger --buffer-size"
        }
        "untraced_children" => {
            "children not traced: the kernel's traced-process map (32768 processes) was full; trace fewer processes at once"
        }
        "ipc_untracked_syscalls" => {
            "IPC syscalls not recorded: more than 16384 were in flight at once in the kernel; trace fewer processes, or leave out -e ipc"
        }
        "ipc_messages_beyond_limit" => {
            "messages not recorded: the kernel records the first 16 messages of one sendmmsg/recvmmsg, a fixed limit"
        }
        "undecodable" => {
            "lost in user space: kernel records the tracer could not decode (a tracer bug: please report it)"
        }
        "ipc_payload_unreadable" => {
            "payload bytes not captured (--capture-bytes): the kernel could not read the message's buffer in the process, e.g. its page was not resident; the message itself is recorded"
        }
        "log_unreadable" => {
            "program events lost in the probe: the kernel could not read the payload at the address the program passed, or it is not a tracer-events payload this tracer reads; check the program's tracer-events version and what it passes to the probe"
        }
        "in_transit" => {
            "lost in transit: the agent's outbox (--buffer-events, --buffer-bytes) overflowed before the collector received them (it fell behind, or was away); give the agent a larger --buffer-events or --buffer-bytes (its log says which bound dropped), trace fewer functions, or put the collector closer to the agent"
        }
        "live_subscribers" => {
            "not given to a live subscriber (ClusterTrace::subscribe, on_event) that fell behind its bounded channel; the merged trace has them all"
        }
        _ => "lost (see the trace's trace_end)",
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// The launched command and all its traced descendants exited.
    CommandExited,
    /// Every traced process exited.
    TargetsExited,
    /// `--duration` elapsed.
    Duration,
    /// SIGINT.
    Interrupted,
    /// SIGTERM (for an agent: shut down, or its collector went away).
    Terminated,
    /// SIGHUP.
    HungUp,
    /// The collector stopped it.
    Stopped,
    /// The input ended (a trace converted from a file without a `trace_end`).
    InputEnded,
}

impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EndReason::CommandExited => "the command exited",
            EndReason::TargetsExited => "every traced process exited",
            EndReason::Duration => "the duration elapsed",
            EndReason::Interrupted => "interrupted",
            EndReason::Terminated => "terminated",
            EndReason::HungUp => "hung up",
            EndReason::Stopped => "stopped by the collector",
            EndReason::InputEnded => "the input ended",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{EndReason, FilterStats, TraceEnd, why_lost};

    /// The wire and the native format write a trace's end with postcard, which has no field names:
    /// a field JSON leaves out must still be written there (filters without `ret-if` broke it).
    #[test]
    fn an_end_with_filters_survives_postcard_and_json() {
        let mut end = TraceEnd::new(7, EndReason::CommandExited, 3);
        let plain =
            FilterStats { predicate: "x == 1".into(), seen: 3, written: 1, filtered_out: 2, ..Default::default() };
        let held = FilterStats { ret_predicate: Some("ret < 0".into()), min_duration_ns: 5, ..plain.clone() };
        end.filters.insert("f".into(), plain);
        end.filters.insert("g".into(), held);
        let bytes = postcard::to_stdvec(&end).unwrap();
        assert_eq!(postcard::from_bytes::<TraceEnd>(&bytes).unwrap(), end);
        let line = serde_json::to_value(crate::event::json::Json(&end)).unwrap();
        assert!(line["filters"]["f"].get("ret_predicate").is_none(), "{line}");
        assert_eq!(line["filters"]["g"]["ret_predicate"], "ret < 0");
    }

    #[test]
    fn every_lost_kind_says_where_it_was_lost() {
        let fallback = why_lost("no such kind");
        let kernel = tracer_common::LostSlot::ALL.iter().filter_map(|slot| slot.trace_name());
        for kind in kernel.chain(["undecodable", "log_unreadable"]) {
            let why = why_lost(kind);
            assert_ne!(why, fallback, "{kind} has no sentence of its own");
            // Only what the ring buffer dropped is helped by a larger one.
            let ring =
                ["call", "return", "spawn", "exit", "ipc", "signal", "log", "usdt", "break", "watch"].contains(&kind);
            assert_eq!(why.contains("--buffer-size"), ring, "{kind}: {why}");
        }
    }
}
