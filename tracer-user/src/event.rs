//! The one event type every sink, exporter and analysis speaks, and the JSON lines contract.
//!
//! A trace is a [`TraceStart`], then [`Event`]s, then a [`TraceEnd`]; in JSON lines each is one
//! object with a `kind` field first. Events serialize field by field (kind, ts, host, pid, tid, then
//! the kind's own fields) and deserialize through a flat, borrowed [`RawEvent`], which is both
//! faster than serde's internally tagged enums and lets a bad line say which field is missing.

use std::{collections::BTreeMap, fmt, sync::Arc};

use serde::{Deserialize, Serialize, Serializer, ser::SerializeStruct as _};

use crate::host::Machine;

pub use crate::placement::ProbePaths;

/// Version of the JSON lines format written in `trace_start.format_version`.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Nanoseconds since the Unix epoch.
    pub ts: u64,
    pub host: Arc<str>,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    pub data: EventData,
}

/// Most argument registers a call records: Go's nine (rax, rbx, rcx, rdi, rsi, r8-r11).
pub const MAX_ARGS: usize = 9;

/// A call's integer argument registers: six for System V code (rdi, rsi, rdx, rcx, r8, r9), nine
/// for Go. Kept inline (a call event allocates nothing for them); a JSON array of that many.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Args {
    len: u8,
    values: [u64; MAX_ARGS],
}

impl Args {
    /// The first [`MAX_ARGS`] of `values`.
    pub fn new(values: &[u64]) -> Args {
        let len = values.len().min(MAX_ARGS);
        let mut args = Args { len: len as u8, values: [0; MAX_ARGS] };
        args.values[..len].copy_from_slice(&values[..len]);
        args
    }

    pub fn as_slice(&self) -> &[u64] {
        &self.values[..self.len as usize]
    }
}

impl<const N: usize> From<[u64; N]> for Args {
    fn from(values: [u64; N]) -> Args {
        Args::new(&values)
    }
}

impl std::ops::Deref for Args {
    type Target = [u64];

    fn deref(&self) -> &[u64] {
        self.as_slice()
    }
}

impl fmt::Debug for Args {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl Serialize for Args {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.as_slice().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Args {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Args, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Args;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "at most {MAX_ARGS} integer arguments")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Args, A::Error> {
                let mut args = Args::default();
                while let Some(value) = seq.next_element::<u64>()? {
                    if args.len as usize == MAX_ARGS {
                        return Err(serde::de::Error::invalid_length(MAX_ARGS + 1, &self));
                    }
                    args.values[args.len as usize] = value;
                    args.len += 1;
                }
                Ok(args)
            }
        }
        deserializer.deserialize_seq(Visitor)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventData {
    Call {
        function: Arc<str>,
        module: Arc<str>,
        args: Args,
        /// The goroutine that made the call (Go functions only).
        goid: Option<u64>,
    },
    Return {
        function: Arc<str>,
        module: Arc<str>,
        retval: u64,
        /// `None` when the call was not seen (it began before tracing did, or its record was lost).
        duration_ns: Option<u64>,
        /// The goroutine that returned (Go functions only).
        goid: Option<u64>,
    },
    Spawn {
        parent_pid: u32,
        child_pid: u32,
        /// The new thread (for `fork`, the child's main thread; for `exec`, the thread that exec'd).
        child_tid: u32,
        how: SpawnHow,
        comm: String,
        /// The program exec'd (`exec` only).
        filename: Option<String>,
    },
    Exit {
        /// The status passed to `exit`, `None` when killed by a signal.
        exit_code: Option<i32>,
        /// The signal that killed it, `None` unless killed.
        signal: Option<i32>,
        /// True for the exit of one thread while others live on.
        thread: bool,
        comm: String,
    },
    /// Bytes left this thread through a socket or pipe. `ts` is the syscall's entry (the bytes
    /// cannot have arrived anywhere before it).
    Send {
        channel: Channel,
        fd: i32,
        /// What the syscall (or this message of `sendmmsg`) actually transferred.
        bytes: u64,
        syscall: Syscall,
        /// Identifies this send; every receive that consumed its bytes names it.
        flow_id: u64,
        /// How long the syscall took.
        syscall_ns: u64,
        /// Streams: the position of the first byte (TCP: its 32-bit sequence number; Unix streams
        /// and pipes: the tracer's byte count). What links a receive to the sends it read.
        seq: Option<u64>,
        /// Datagrams: a hash of the length and first payload bytes, which tells datagrams apart.
        digest: Option<u64>,
    },
    /// Bytes arrived at this thread through a socket or pipe. `ts` is the syscall's exit (the
    /// bytes are there from then on).
    Recv {
        channel: Channel,
        fd: i32,
        bytes: u64,
        syscall: Syscall,
        /// The `flow_id`s of the traced sends whose bytes this receive consumed, in stream order
        /// (empty when none was traced). JSON also has `flow_id`: the first of them, or null.
        flow_ids: Vec<u64>,
        syscall_ns: u64,
        seq: Option<u64>,
        digest: Option<u64>,
    },
    /// A signal generated for a traced process (`delivered: false`), or delivered to a traced
    /// thread (`delivered: true`). A generation and its delivery share a `flow_id`.
    Signal {
        signal: SignalId,
        /// The process that sent it (the kernel's own signals name the process they were raised in).
        sender_pid: u32,
        target_pid: u32,
        target_tid: u32,
        delivered: bool,
        /// Links a generation to its delivery; `None` for a generation the kernel dropped (the
        /// signal was already pending or ignored) or a delivery whose generation was not seen.
        flow_id: Option<u64>,
        /// Generation: aimed at the whole process (any thread may take it), not one thread.
        group: bool,
        /// Generation: the kernel queued it for delivery (false: ignored, or already pending).
        queued: bool,
    },
}

/// What an IPC transfer went through. Both ends of a conversation compute the same channel: for
/// TCP and UDP, `src` is the sending end and `dst` the receiving end, on either side.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Channel {
    Tcp {
        src: std::net::SocketAddr,
        dst: std::net::SocketAddr,
    },
    Udp {
        src: std::net::SocketAddr,
        dst: std::net::SocketAddr,
    },
    /// A Unix stream socket (named or a socketpair). `id` names the connection, the same at both
    /// ends and in both directions; `to` names the receiving socket, which tells the directions
    /// apart. Both are derived from the kernel's socket objects, stable within one trace.
    UnixStream {
        id: u64,
        to: u64,
        path: Option<String>,
    },
    /// A Unix datagram (or seqpacket) socket. A named receiver is known by its `path` at both
    /// ends (a sender that addresses it by path learns nothing else); an unnamed one (a
    /// socketpair) by its inode number, `id`.
    UnixDgram {
        id: Option<u64>,
        path: Option<String>,
    },
    /// An anonymous pipe; `id` is its inode number.
    Pipe {
        id: u64,
    },
    /// A named pipe; `id` is its inode number.
    Fifo {
        id: u64,
        path: Option<String>,
    },
}

/// The syscalls that move IPC data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Syscall {
    Read,
    Write,
    Readv,
    Writev,
    Sendto,
    Recvfrom,
    Sendmsg,
    Recvmsg,
    Sendmmsg,
    Recvmmsg,
}

/// A signal, by number and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SignalId {
    pub number: i32,
    pub name: String,
}

impl SignalId {
    pub fn new(number: i32) -> SignalId {
        let name = nix::sys::signal::Signal::try_from(number).map(|s| s.as_str().to_string()).unwrap_or_else(|_| {
            if number >= libc::SIGRTMIN() {
                format!("SIGRTMIN+{}", number - libc::SIGRTMIN())
            } else {
                format!("SIG{number}")
            }
        });
        SignalId { number, name }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpawnHow {
    Fork,
    Thread,
    Exec,
}

/// The event kinds a user can select with `--events`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Call,
    Return,
    Spawn,
    Exit,
    Send,
    Recv,
    Signal,
}

impl EventKind {
    pub const ALL: [EventKind; 7] = [
        EventKind::Call,
        EventKind::Return,
        EventKind::Spawn,
        EventKind::Exit,
        EventKind::Send,
        EventKind::Recv,
        EventKind::Signal,
    ];
    /// What `--events ipc` stands for.
    pub const IPC: [EventKind; 3] = [EventKind::Send, EventKind::Recv, EventKind::Signal];

    pub fn name(self) -> &'static str {
        match self {
            EventKind::Call => "call",
            EventKind::Return => "return",
            EventKind::Spawn => "spawn",
            EventKind::Exit => "exit",
            EventKind::Send => "send",
            EventKind::Recv => "recv",
            EventKind::Signal => "signal",
        }
    }

    /// Parses one `--events` item: a kind, or `ipc` for send, recv and signal.
    pub fn parse_list_item(s: &str) -> Result<Vec<EventKind>, String> {
        if s == "ipc" {
            return Ok(EventKind::IPC.to_vec());
        }
        s.parse().map(|k| vec![k])
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for EventKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        EventKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| {
            let known: Vec<_> = EventKind::ALL.iter().map(|k| k.name()).collect();
            format!("unknown event kind '{s}' (known: {}, ipc)", known.join(", "))
        })
    }
}

/// Where a call runs, as call stacks and exports see it: a thread, or a goroutine (which moves
/// between threads, so its calls nest on it and not on any thread).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Track {
    Thread(u32),
    Goroutine(u64),
}

impl Event {
    /// The track of a call or return: its goroutine for Go code (goid 0, a thread's own system
    /// stack, stays with the thread), else its thread. Other events are on their thread.
    pub fn track(&self) -> Track {
        match &self.data {
            EventData::Call { goid: Some(goid), .. } | EventData::Return { goid: Some(goid), .. } if *goid != 0 => {
                Track::Goroutine(*goid)
            }
            _ => Track::Thread(self.tid),
        }
    }
}

impl EventData {
    pub fn kind(&self) -> EventKind {
        match self {
            EventData::Call { .. } => EventKind::Call,
            EventData::Return { .. } => EventKind::Return,
            EventData::Spawn { .. } => EventKind::Spawn,
            EventData::Exit { .. } => EventKind::Exit,
            EventData::Send { .. } => EventKind::Send,
            EventData::Recv { .. } => EventKind::Recv,
            EventData::Signal { .. } => EventKind::Signal,
        }
    }
}

impl Serialize for Event {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let own_fields = match &self.data {
            EventData::Call { goid, .. } => 3 + goid.is_some() as usize,
            EventData::Return { goid, .. } => 4 + goid.is_some() as usize,
            EventData::Spawn { .. } => 6,
            EventData::Exit { .. } => 4,
            EventData::Send { .. } => 8,
            EventData::Recv { .. } => 9,
            EventData::Signal { .. } => 8,
        };
        let mut s = serializer.serialize_struct("Event", 5 + own_fields)?;
        s.serialize_field("kind", self.data.kind().name())?;
        s.serialize_field("ts", &self.ts)?;
        s.serialize_field("host", &*self.host)?;
        s.serialize_field("pid", &self.pid)?;
        s.serialize_field("tid", &self.tid)?;
        match &self.data {
            EventData::Call { function, module, args, goid } => {
                s.serialize_field("function", &**function)?;
                s.serialize_field("module", &**module)?;
                s.serialize_field("args", args)?;
                if let Some(goid) = goid {
                    s.serialize_field("goid", goid)?;
                }
            }
            EventData::Return { function, module, retval, duration_ns, goid } => {
                s.serialize_field("function", &**function)?;
                s.serialize_field("module", &**module)?;
                s.serialize_field("retval", retval)?;
                s.serialize_field("duration_ns", duration_ns)?;
                if let Some(goid) = goid {
                    s.serialize_field("goid", goid)?;
                }
            }
            EventData::Spawn { parent_pid, child_pid, child_tid, how, comm, filename } => {
                s.serialize_field("parent_pid", parent_pid)?;
                s.serialize_field("child_pid", child_pid)?;
                s.serialize_field("child_tid", child_tid)?;
                s.serialize_field("how", how)?;
                s.serialize_field("comm", comm)?;
                s.serialize_field("filename", filename)?;
            }
            EventData::Exit { exit_code, signal, thread, comm } => {
                s.serialize_field("exit_code", exit_code)?;
                s.serialize_field("signal", signal)?;
                s.serialize_field("thread", thread)?;
                s.serialize_field("comm", comm)?;
            }
            EventData::Send { channel, fd, bytes, syscall, flow_id, syscall_ns, seq, digest } => {
                s.serialize_field("channel", channel)?;
                s.serialize_field("fd", fd)?;
                s.serialize_field("bytes", bytes)?;
                s.serialize_field("syscall", syscall)?;
                s.serialize_field("flow_id", flow_id)?;
                s.serialize_field("syscall_ns", syscall_ns)?;
                s.serialize_field("seq", seq)?;
                s.serialize_field("digest", digest)?;
            }
            EventData::Recv { channel, fd, bytes, syscall, flow_ids, syscall_ns, seq, digest } => {
                s.serialize_field("channel", channel)?;
                s.serialize_field("fd", fd)?;
                s.serialize_field("bytes", bytes)?;
                s.serialize_field("syscall", syscall)?;
                s.serialize_field("flow_id", &flow_ids.first())?;
                s.serialize_field("flow_ids", flow_ids)?;
                s.serialize_field("syscall_ns", syscall_ns)?;
                s.serialize_field("seq", seq)?;
                s.serialize_field("digest", digest)?;
            }
            EventData::Signal { signal, sender_pid, target_pid, target_tid, delivered, flow_id, group, queued } => {
                s.serialize_field("signal", signal)?;
                s.serialize_field("sender_pid", sender_pid)?;
                s.serialize_field("target_pid", target_pid)?;
                s.serialize_field("target_tid", target_tid)?;
                s.serialize_field("delivered", delivered)?;
                s.serialize_field("flow_id", flow_id)?;
                s.serialize_field("group", group)?;
                s.serialize_field("queued", queued)?;
            }
        }
        s.end()
    }
}

/// The `kind` of any line of a JSON lines trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LineKind {
    TraceStart,
    TraceEnd,
    Call,
    Return,
    Spawn,
    Exit,
    Send,
    Recv,
    Signal,
}

/// `signal` is a number in `exit` lines and a `{number, name}` object in `signal` lines.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum SignalField {
    Number(i32),
    Id(SignalId),
}

/// Every field any event line can have, borrowed from the line where possible.
#[derive(Debug, Deserialize)]
pub struct RawEvent<'a> {
    pub kind: LineKind,
    ts: Option<u64>,
    #[serde(borrow)]
    host: Option<std::borrow::Cow<'a, str>>,
    pid: Option<u32>,
    tid: Option<u32>,
    #[serde(borrow)]
    function: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    module: Option<std::borrow::Cow<'a, str>>,
    args: Option<Args>,
    retval: Option<u64>,
    duration_ns: Option<u64>,
    goid: Option<u64>,
    parent_pid: Option<u32>,
    child_pid: Option<u32>,
    child_tid: Option<u32>,
    how: Option<SpawnHow>,
    comm: Option<String>,
    filename: Option<String>,
    exit_code: Option<i32>,
    signal: Option<SignalField>,
    thread: Option<bool>,
    channel: Option<Channel>,
    fd: Option<i32>,
    bytes: Option<u64>,
    syscall: Option<Syscall>,
    flow_id: Option<u64>,
    flow_ids: Option<Vec<u64>>,
    syscall_ns: Option<u64>,
    sender_pid: Option<u32>,
    target_pid: Option<u32>,
    target_tid: Option<u32>,
    delivered: Option<bool>,
    seq: Option<u64>,
    digest: Option<u64>,
    group: Option<bool>,
    queued: Option<bool>,
}

/// Interns the strings that repeat on every line (host, function, module), so that a reader
/// allocates each once.
#[derive(Default)]
pub struct Interner {
    strings: std::collections::HashSet<Arc<str>>,
}

impl Interner {
    pub fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(found) = self.strings.get(s) {
            return found.clone();
        }
        let new: Arc<str> = Arc::from(s);
        self.strings.insert(new.clone());
        new
    }
}

impl RawEvent<'_> {
    /// Converts an event line (not `trace_start`/`trace_end`) into an [`Event`], naming the first
    /// missing field.
    pub fn into_event(self, interner: &mut Interner) -> Result<Event, String> {
        fn need<T>(value: Option<T>, field: &str) -> Result<T, String> {
            value.ok_or_else(|| format!("missing field `{field}`"))
        }
        let data = match self.kind {
            LineKind::Call => EventData::Call {
                function: interner.intern(&need(self.function, "function")?),
                module: interner.intern(&need(self.module, "module")?),
                args: need(self.args, "args")?,
                goid: self.goid,
            },
            LineKind::Return => EventData::Return {
                function: interner.intern(&need(self.function, "function")?),
                module: interner.intern(&need(self.module, "module")?),
                retval: need(self.retval, "retval")?,
                duration_ns: self.duration_ns,
                goid: self.goid,
            },
            LineKind::Spawn => {
                let child_pid = need(self.child_pid, "child_pid")?;
                EventData::Spawn {
                    parent_pid: need(self.parent_pid, "parent_pid")?,
                    child_pid,
                    child_tid: self.child_tid.unwrap_or(child_pid),
                    how: need(self.how, "how")?,
                    comm: self.comm.unwrap_or_default(),
                    filename: self.filename,
                }
            }
            LineKind::Exit => EventData::Exit {
                exit_code: self.exit_code,
                signal: match self.signal {
                    None => None,
                    Some(SignalField::Number(n)) => Some(n),
                    Some(SignalField::Id(_)) => return Err("`signal` of an exit is a number".to_string()),
                },
                thread: need(self.thread, "thread")?,
                comm: self.comm.unwrap_or_default(),
            },
            LineKind::Send => EventData::Send {
                channel: need(self.channel, "channel")?,
                fd: need(self.fd, "fd")?,
                bytes: need(self.bytes, "bytes")?,
                syscall: need(self.syscall, "syscall")?,
                flow_id: need(self.flow_id, "flow_id")?,
                syscall_ns: self.syscall_ns.unwrap_or(0),
                seq: self.seq,
                digest: self.digest,
            },
            LineKind::Recv => EventData::Recv {
                channel: need(self.channel, "channel")?,
                fd: need(self.fd, "fd")?,
                bytes: need(self.bytes, "bytes")?,
                syscall: need(self.syscall, "syscall")?,
                flow_ids: self.flow_ids.unwrap_or_else(|| self.flow_id.into_iter().collect()),
                syscall_ns: self.syscall_ns.unwrap_or(0),
                seq: self.seq,
                digest: self.digest,
            },
            LineKind::Signal => EventData::Signal {
                signal: match need(self.signal, "signal")? {
                    SignalField::Id(id) => id,
                    SignalField::Number(n) => SignalId::new(n),
                },
                sender_pid: need(self.sender_pid, "sender_pid")?,
                target_pid: need(self.target_pid, "target_pid")?,
                target_tid: self.target_tid.unwrap_or(0),
                delivered: need(self.delivered, "delivered")?,
                flow_id: self.flow_id,
                group: self.group.unwrap_or(false),
                queued: self.queued.unwrap_or(true),
            },
            LineKind::TraceStart | LineKind::TraceEnd => {
                return Err("trace_start/trace_end is not an event".to_string());
            }
        };
        Ok(Event {
            ts: need(self.ts, "ts")?,
            host: interner.intern(&need(self.host, "host")?),
            pid: need(self.pid, "pid")?,
            tid: need(self.tid, "tid")?,
            data,
        })
    }
}

/// What a trace's first line says about it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename = "trace_start")]
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
    #[serde(default, skip_serializing_if = "ProbePaths::is_empty")]
    pub probe_paths: ProbePaths,
    /// A trace merged from several hosts: each host, its clock correction and its targets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<HostInfo>,
    /// The machine that recorded (or, merged, collected) the trace, as it says itself; `host` is
    /// the name the user gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<Machine>,
}

/// One host of a merged trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostInfo {
    /// The name the user gave the host (`--agent NAME=ADDR`): every event of the host carries it.
    pub name: String,
    /// The machine's own identity (host name, boot id, machine id), as its agent read it.
    #[serde(default)]
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
#[serde(tag = "type", rename_all = "snake_case")]
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
#[serde(tag = "kind", rename = "trace_end")]
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
    /// Calls made while 64 probed calls were already active on the thread: the kernel installs no
    /// return probe for them, so they have no `return` event (a kernel limit, `MAX_URETPROBE_DEPTH`).
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
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<HostEnd>,
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
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
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
        }
    }

    pub fn total_lost(&self) -> u64 {
        self.lost_events.values().sum()
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

/// A trace's first and last lines for unit tests: host `h`, one target (`app`, pid 1, running
/// `/bin/app`), every event kind.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    pub fn start(ts: u64) -> TraceStart {
        TraceStart {
            format_version: FORMAT_VERSION,
            host: "h".into(),
            tracer_version: "0".into(),
            ts,
            clock: ClockInfo { source: "test".into(), offset_ns: 0, uncertainty_ns: 0 },
            targets: vec![TargetInfo::Process { pid: 1, comm: "app".into(), exe: "/bin/app".into() }],
            probes: 2,
            events: EventKind::ALL.to_vec(),
            follow_children: true,
            probe_paths: ProbePaths::default(),
            hosts: vec![],
            machine: None,
        }
    }

    /// Ends with three lost calls, so that exports show that they carry the losses.
    pub fn end(ts: u64) -> TraceEnd {
        let mut end = TraceEnd::new(ts, EndReason::TargetsExited, 0);
        end.lost_events.insert("call".to_string(), 3);
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(data: EventData) -> Event {
        Event { ts: 1_700_000_000_000_000_123, host: "h1".into(), pid: 10, tid: 11, data }
    }

    fn round_trip(e: &Event) -> Event {
        let line = serde_json::to_string(e).unwrap();
        let raw: RawEvent = serde_json::from_str(&line).unwrap();
        raw.into_event(&mut Interner::default()).unwrap()
    }

    #[test]
    fn call_line_has_contract_fields_in_order() {
        let e = event(EventData::Call {
            function: "fib".into(),
            module: "/bin/x".into(),
            args: [1, 2, 3, 4, 5, u64::MAX].into(),
            goid: None,
        });
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"kind":"call","ts":1700000000000000123,"host":"h1","pid":10,"tid":11,"function":"fib","module":"/bin/x","args":[1,2,3,4,5,18446744073709551615]}"#
        );
        assert_eq!(round_trip(&e), e);
        assert_eq!(e.track(), Track::Thread(11));
    }

    #[test]
    fn go_calls_carry_nine_arguments_and_their_goroutine() {
        let e = event(EventData::Call {
            function: "main.work".into(),
            module: "/bin/gof".into(),
            args: [1, 2, 3, 4, 5, 6, 7, 8, 9].into(),
            goid: Some(18),
        });
        let line = serde_json::to_string(&e).unwrap();
        assert!(line.ends_with(r#""args":[1,2,3,4,5,6,7,8,9],"goid":18}"#), "{line}");
        assert_eq!(round_trip(&e), e);
        assert_eq!(e.track(), Track::Goroutine(18));
        let r = event(EventData::Return {
            function: "main.work".into(),
            module: "/bin/gof".into(),
            retval: 3,
            duration_ns: Some(9),
            goid: Some(0),
        });
        assert!(serde_json::to_string(&r).unwrap().ends_with(r#""duration_ns":9,"goid":0}"#));
        assert_eq!(round_trip(&r), r);
        assert_eq!(r.track(), Track::Thread(11), "goid 0 is the thread's own system stack");
        let ten = r#"{"kind":"call","ts":1,"host":"h","pid":1,"tid":1,"function":"f","module":"m","args":[0,0,0,0,0,0,0,0,0,0]}"#;
        assert!(serde_json::from_str::<RawEvent>(ten).is_err(), "at most nine arguments");
    }

    #[test]
    fn return_keeps_null_duration() {
        let e = event(EventData::Return {
            function: "f".into(),
            module: "m".into(),
            retval: 7,
            duration_ns: None,
            goid: None,
        });
        let line = serde_json::to_string(&e).unwrap();
        assert!(line.ends_with(r#""retval":7,"duration_ns":null}"#), "{line}");
        assert_eq!(round_trip(&e), e);
        let e = event(EventData::Return {
            function: "f".into(),
            module: "m".into(),
            retval: 7,
            duration_ns: Some(5),
            goid: None,
        });
        assert_eq!(round_trip(&e), e);
    }

    #[test]
    fn spawn_and_exit_round_trip() {
        for e in [
            event(EventData::Spawn {
                parent_pid: 1,
                child_pid: 2,
                child_tid: 2,
                how: SpawnHow::Exec,
                comm: "ls".into(),
                filename: Some("/bin/ls".into()),
            }),
            event(EventData::Spawn {
                parent_pid: 1,
                child_pid: 1,
                child_tid: 3,
                how: SpawnHow::Thread,
                comm: "a".into(),
                filename: None,
            }),
            event(EventData::Exit { exit_code: None, signal: Some(9), thread: false, comm: "a".into() }),
            event(EventData::Exit { exit_code: Some(3), signal: None, thread: true, comm: "a".into() }),
        ] {
            assert_eq!(round_trip(&e), e);
        }
        let line = serde_json::to_string(&event(EventData::Exit {
            exit_code: None,
            signal: Some(9),
            thread: false,
            comm: "a".into(),
        }))
        .unwrap();
        assert!(line.contains(r#""exit_code":null,"signal":9,"thread":false"#), "{line}");
    }

    #[test]
    fn ipc_events_round_trip() {
        let tcp = Channel::Tcp { src: "127.0.0.1:5000".parse().unwrap(), dst: "[::1]:80".parse().unwrap() };
        let send = event(EventData::Send {
            channel: tcp.clone(),
            fd: 3,
            bytes: 10,
            syscall: Syscall::Sendto,
            flow_id: 7,
            syscall_ns: 1500,
            seq: Some(1000),
            digest: None,
        });
        let line = serde_json::to_string(&send).unwrap();
        assert!(
            line.contains(r#""channel":{"type":"tcp","src":"127.0.0.1:5000","dst":"[::1]:80"},"fd":3,"bytes":10,"syscall":"sendto","flow_id":7"#),
            "{line}"
        );
        assert_eq!(round_trip(&send), send);
        let recv = event(EventData::Recv {
            channel: Channel::UnixStream { id: 99, to: 100, path: Some("/tmp/s".into()) },
            fd: 4,
            bytes: 10,
            syscall: Syscall::Read,
            flow_ids: vec![7, 8],
            syscall_ns: 20,
            seq: Some(5),
            digest: None,
        });
        let line = serde_json::to_string(&recv).unwrap();
        assert!(line.contains(r#""flow_id":7,"flow_ids":[7,8]"#), "{line}");
        assert_eq!(round_trip(&recv), recv);
        let unlinked = event(EventData::Recv {
            channel: Channel::Pipe { id: 5 },
            fd: 0,
            bytes: 1,
            syscall: Syscall::Readv,
            flow_ids: vec![],
            syscall_ns: 0,
            seq: None,
            digest: Some(77),
        });
        assert!(serde_json::to_string(&unlinked).unwrap().contains(r#""flow_id":null,"flow_ids":[]"#));
        assert_eq!(round_trip(&unlinked), unlinked);
        let sig = event(EventData::Signal {
            signal: SignalId::new(10),
            sender_pid: 1,
            target_pid: 2,
            target_tid: 2,
            delivered: true,
            flow_id: Some(3),
            group: false,
            queued: true,
        });
        let line = serde_json::to_string(&sig).unwrap();
        assert!(line.contains(r#""signal":{"number":10,"name":"SIGUSR1"}"#), "{line}");
        assert_eq!(round_trip(&sig), sig);
    }

    #[test]
    fn signal_names() {
        assert_eq!(SignalId::new(9).name, "SIGKILL");
        assert_eq!(SignalId::new(libc::SIGRTMIN() + 2).name, "SIGRTMIN+2");
    }

    #[test]
    fn missing_fields_are_named() {
        let raw: RawEvent = serde_json::from_str(
            r#"{"kind":"call","ts":1,"host":"h","pid":1,"tid":1,"module":"m","args":[0,0,0,0,0,0]}"#,
        )
        .unwrap();
        assert_eq!(raw.into_event(&mut Interner::default()).unwrap_err(), "missing field `function`");
        assert!(serde_json::from_str::<RawEvent>(r#"{"kind":"bogus"}"#).is_err());
    }

    #[test]
    fn trace_start_and_end_carry_their_kind() {
        let end = TraceEnd {
            ts: 5,
            reason: EndReason::CommandExited,
            events_written: 3,
            lost_events: BTreeMap::from([("call".to_string(), 0)]),
            calls_without_return_probe: 0,
            command_exit_code: Some(0),
            ipc: IpcStats::default(),
            hosts: Vec::new(),
        };
        let line = serde_json::to_string(&end).unwrap();
        assert!(line.starts_with(r#"{"kind":"trace_end","ts":5,"reason":"command_exited""#), "{line}");
        assert_eq!(serde_json::from_str::<TraceEnd>(&line).unwrap(), end);
    }

    #[test]
    fn interner_shares_strings() {
        let mut i = Interner::default();
        let a = i.intern("x");
        let b = i.intern("x");
        assert!(Arc::ptr_eq(&a, &b));
    }
}
