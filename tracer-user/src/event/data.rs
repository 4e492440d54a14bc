//! Each event kind's own fields, defined once: the JSON lines encoding ([`super::json`]) and the
//! wire protocol (postcard) both follow from these structs. A kind's fields are written in the
//! order declared here. `N` is the type of the names that repeat on every call (function,
//! module): shared strings in a trace, numbers into a string table on the wire.

use std::{fmt, sync::Arc};

use serde::{Deserialize, Serialize, Serializer};

use super::json::omit_when_empty;

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

/// The first bytes of a transfer (`--capture-bytes`): base64 (standard, padded) in JSON lines,
/// raw bytes on the wire.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Payload(pub Vec<u8>);

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Payload({:?})", String::from_utf8_lossy(&self.0))
    }
}

impl Serialize for Payload {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            use base64::Engine;
            serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
        } else {
            serializer.serialize_bytes(&self.0)
        }
    }
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Payload, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Payload;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "payload bytes (base64 in JSON)")
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Payload, E> {
                use base64::Engine;
                base64::engine::general_purpose::STANDARD.decode(text).map(Payload).map_err(E::custom)
            }

            fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<Payload, E> {
                Ok(Payload(bytes.to_vec()))
            }

            fn visit_byte_buf<E: serde::de::Error>(self, bytes: Vec<u8>) -> Result<Payload, E> {
                Ok(Payload(bytes))
            }
        }
        if deserializer.is_human_readable() {
            deserializer.deserialize_str(Visitor)
        } else {
            deserializer.deserialize_byte_buf(Visitor)
        }
    }
}

/// A traced function was entered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Call<N = Arc<str>> {
    pub function: N,
    pub module: N,
    pub args: Args,
    /// The goroutine that made the call (Go functions only).
    #[serde(default, serialize_with = "omit_when_empty")]
    pub goid: Option<u64>,
    /// The parameters by name, in declaration order, typed by the function's DWARF (empty
    /// without it).
    #[serde(default, serialize_with = "omit_when_empty")]
    pub params: Params,
    /// Where the function is defined (from its DWARF).
    #[serde(default, serialize_with = "omit_when_empty")]
    pub file: Option<Arc<str>>,
    #[serde(default, serialize_with = "omit_when_empty")]
    pub line: Option<u32>,
}

/// A traced function returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Return<N = Arc<str>> {
    pub function: N,
    pub module: N,
    pub retval: u64,
    /// `None` when the call was not seen (it began before tracing did, or its record was lost).
    pub duration_ns: Option<u64>,
    /// The goroutine that returned (Go functions only).
    #[serde(default, serialize_with = "omit_when_empty")]
    pub goid: Option<u64>,
    /// The return value typed by the function's DWARF (`None` without it, or for `void`).
    #[serde(default, serialize_with = "omit_when_empty")]
    pub ret: Option<SourceValue>,
    /// `Some(true)`: the call's frame was left without a return of its own (an exception, a
    /// panic or `longjmp` unwound past it, or its thread ended or replaced its program), as the
    /// next event at its stack position or above showed; `retval` is 0 and `ts` is when that was
    /// seen. Only for returns probed where they happen (`functions::unwinding`).
    #[serde(default, serialize_with = "omit_when_empty")]
    pub unwound: Option<bool>,
    /// `Some(true)`: the function ended by jumping to another (a tail call), whose return value
    /// it passes on unseen: `retval` is 0.
    #[serde(default, serialize_with = "omit_when_empty")]
    pub tail_call: Option<bool>,
}

impl<N> Return<N> {
    /// When the call this return ends began, for a return at `ts`: the pairing made when the
    /// trace was recorded (`assemble::pairing`), which is what the analyses nest calls by, not
    /// a pairing of their own. `None` when that call was not seen.
    pub fn call_start(&self, ts: u64) -> Option<u64> {
        self.duration_ns.map(|d| ts.saturating_sub(d))
    }
}

/// A value at source level (see `debuginfo::format`): a JSON value, which is what it is in JSON
/// lines and JSON text in a binary encoding (postcard cannot read a self-describing value).
/// `Eq` holds: the values made never hold a float (floating-point parameters are markers).
#[derive(Clone, Debug, PartialEq)]
pub struct SourceValue(pub serde_json::Value);

impl Eq for SourceValue {}

impl Serialize for SourceValue {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            self.0.serialize(serializer)
        } else {
            serializer.serialize_str(&self.0.to_string())
        }
    }
}

impl<'de> Deserialize<'de> for SourceValue {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<SourceValue, D::Error> {
        if deserializer.is_human_readable() {
            serde_json::Value::deserialize(deserializer).map(SourceValue)
        } else {
            // Bounded by the frame it came in; serde_json bounds the nesting.
            let text = std::borrow::Cow::<str>::deserialize(deserializer)?;
            serde_json::from_str(&text).map(SourceValue).map_err(serde::de::Error::custom)
        }
    }
}

/// A call's parameters: (name, value) pairs in declaration order, a JSON object (a `Vec`
/// serialized as a map keeps the order without `serde_json`'s `preserve_order` for every map).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Params(pub Vec<(String, SourceValue)>);

impl Params {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for Params {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

impl<'de> Deserialize<'de> for Params {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Params, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Params;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of parameter names to values")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Params, A::Error> {
                let mut params = Vec::new();
                while let Some(entry) = map.next_entry::<String, SourceValue>()? {
                    params.push(entry);
                }
                Ok(Params(params))
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

/// A process forked, a thread was created, or a program was exec'd.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spawn {
    pub parent_pid: u32,
    pub child_pid: u32,
    /// The new thread (for `fork`, the child's main thread; for `exec`, the thread that exec'd).
    /// Absent in JSON: the child's pid.
    #[serde(default)]
    pub child_tid: u32,
    pub how: SpawnHow,
    #[serde(default)]
    pub comm: String,
    /// The program exec'd (`exec` only).
    #[serde(default)]
    pub filename: Option<String>,
}

/// A process or thread ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exit {
    /// The status passed to `exit`, `None` when killed by a signal.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// The signal that killed it (a number), `None` unless killed.
    #[serde(default)]
    pub signal: Option<i32>,
    /// True for the exit of one thread while others live on.
    pub thread: bool,
    #[serde(default)]
    pub comm: String,
}

/// Bytes left this thread through a socket or pipe. `ts` is the syscall's entry (the bytes
/// cannot have arrived anywhere before it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Send {
    pub channel: Channel,
    pub fd: i32,
    /// What the syscall (or this message of `sendmmsg`) actually transferred.
    pub bytes: u64,
    pub syscall: Syscall,
    /// Identifies this send; every receive that consumed its bytes names it.
    pub flow_id: u64,
    /// How long the syscall took.
    #[serde(default)]
    pub syscall_ns: u64,
    /// Streams: the position of the first byte (TCP: its 32-bit sequence number; Unix streams
    /// and pipes: the tracer's byte count). What links a receive to the sends it read.
    #[serde(default)]
    pub seq: Option<u64>,
    /// Datagrams: a hash of the length and first payload bytes, which tells datagrams apart.
    #[serde(default)]
    pub digest: Option<u64>,
    /// `--capture-bytes`: the first bytes transferred (vectored syscalls: of the first buffer);
    /// `None` when capture is off.
    #[serde(default, serialize_with = "omit_when_empty")]
    pub payload: Option<Payload>,
    /// With `payload`: true when fewer bytes were captured than transferred.
    #[serde(default, serialize_with = "omit_when_empty")]
    pub payload_truncated: Option<bool>,
}

/// Bytes arrived at this thread through a socket or pipe. `ts` is the syscall's exit (the bytes
/// are there from then on).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recv {
    pub channel: Channel,
    pub fd: i32,
    pub bytes: u64,
    pub syscall: Syscall,
    /// The `flow_id`s of the traced sends whose bytes this receive consumed, in stream order
    /// (empty when none was traced). JSON also has `flow_id`: the first of them, or null.
    #[serde(default)]
    pub flow_ids: Vec<u64>,
    #[serde(default)]
    pub syscall_ns: u64,
    #[serde(default)]
    pub seq: Option<u64>,
    #[serde(default)]
    pub digest: Option<u64>,
    /// As in [`Send::payload`].
    #[serde(default, serialize_with = "omit_when_empty")]
    pub payload: Option<Payload>,
    #[serde(default, serialize_with = "omit_when_empty")]
    pub payload_truncated: Option<bool>,
    /// A `MSG_PEEK` receive: the bytes were copied but stay queued for a later receive, so a peek
    /// counts in no byte total and is linked to no send.
    #[serde(default, serialize_with = "omit_when_empty")]
    pub peek: bool,
    /// A datagram receive with `MSG_TRUNC` whose message was longer than the buffer: the bytes
    /// of the message beyond the buffer, which the kernel discarded (`bytes` is what the program
    /// got; `bytes + discarded` what the syscall returned).
    #[serde(default, serialize_with = "omit_when_empty")]
    pub discarded: Option<u64>,
}

/// A signal generated for a traced process (`delivered: false`), or delivered to a traced
/// thread (`delivered: true`). A generation and its delivery share a `flow_id`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signal {
    pub signal: SignalId,
    /// The process that sent it (the kernel's own signals name the process they were raised in).
    pub sender_pid: u32,
    pub target_pid: u32,
    #[serde(default)]
    pub target_tid: u32,
    pub delivered: bool,
    /// Links a generation to its delivery; `None` for a generation the kernel dropped (the
    /// signal was already pending or ignored) or a delivery whose generation was not seen.
    #[serde(default)]
    pub flow_id: Option<u64>,
    /// Generation: aimed at the whole process (any thread may take it), not one thread.
    #[serde(default)]
    pub group: bool,
    /// Generation: the kernel queued it for delivery (false: ignored, or already pending).
    #[serde(default = "queued_by_default")]
    pub queued: bool,
}

fn queued_by_default() -> bool {
    true
}

/// What an IPC transfer went through. Both ends of a conversation compute the same channel: for
/// TCP and UDP, `src` is the sending end and `dst` the receiving end, on either side.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
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

pub use tracer_events::payload::{Kind as LogType, Level};

/// What a traced program said about itself: a `tracing` or `log` record (`type` `log`), or a
/// `print*` call (`type` `trace`), through the `tracer-events` crate or its C header.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Log {
    #[serde(rename = "type")]
    pub log_type: LogType,
    pub level: Level,
    /// The logger's name (`tracing`'s target, `log`'s target).
    #[serde(default, serialize_with = "omit_when_empty")]
    pub source: Option<String>,
    pub message: String,
    /// The C function, or the Rust module path.
    #[serde(default, serialize_with = "omit_when_empty")]
    pub function: Option<String>,
    #[serde(default, serialize_with = "omit_when_empty")]
    pub file: Option<String>,
    #[serde(default, serialize_with = "omit_when_empty")]
    pub line: Option<u32>,
    /// The current spans' names, outermost first (`tracing`).
    #[serde(default)]
    pub spans: Vec<String>,
    /// The program's structured fields, or `null`. Text that is not JSON is kept as a string.
    #[serde(with = "json_value")]
    pub data: serde_json::Value,
    /// The payload was longer than the tracer keeps: the last fields are cut (`data` is `null`
    /// if it was cut).
    #[serde(default)]
    pub truncated: bool,
}

/// A [`Log`]'s `data`: itself in JSON, its text on the wire (postcard cannot read a value whose
/// shape it is not told).
mod json_value {
    use serde::{Deserialize, Deserializer, Serialize, Serializer, de::Error as _};

    pub fn serialize<S: Serializer>(value: &serde_json::Value, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() { value.serialize(s) } else { value.to_string().serialize(s) }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<serde_json::Value, D::Error> {
        if d.is_human_readable() {
            serde_json::Value::deserialize(d)
        } else {
            let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
            serde_json::from_str(&text).map_err(D::Error::custom)
        }
    }
}

/// A USDT probe of the targets fired (`-u PROVIDER:NAME`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usdt<N = Arc<str>> {
    pub provider: N,
    pub name: N,
    pub module: N,
    /// The probe's arguments as its spec types them; `None` for one that could not be read.
    pub args: Vec<Option<ArgValue>>,
}

impl<N> Usdt<N> {
    /// The arguments as people read them: `1, -1, ?` (`?` for one that could not be read).
    pub fn args_text(&self) -> String {
        let args: Vec<String> = self
            .args
            .iter()
            .map(|a| match a {
                Some(ArgValue::Signed(v)) => v.to_string(),
                Some(ArgValue::Unsigned(v)) => v.to_string(),
                None => "?".to_string(),
            })
            .collect();
        args.join(", ")
    }
}

/// A breakpoint was reached (`-B FILE:LINE`, `-B FUNC+OFFSET`): the parameters and locals in
/// scope there, typed by DWARF and formatted as a call's parameters are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Break {
    /// The function the breakpoint is in (the inlined one's caller for an inlined copy).
    pub function: Option<Arc<str>>,
    pub file: Arc<str>,
    pub line: u32,
    pub module: Arc<str>,
    /// By name, outermost scope first; `"optimized_out"` where DWARF gives no location, and
    /// `{"unreadable": why}` where the tracer cannot read one.
    pub locals: Params,
}

/// A watched variable was accessed (`-w VARIABLE`): its value just after, and the instruction
/// that made the access.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watch {
    pub variable: Arc<str>,
    /// Its address in the process.
    pub address: u64,
    /// Typed by DWARF, read just after the access.
    pub value: SourceValue,
    /// The function, file and line of the instruction that made the access (`None` outside the
    /// executable's code, or in a system call).
    #[serde(default)]
    pub function: Option<Arc<str>>,
    #[serde(default, serialize_with = "omit_when_empty")]
    pub file: Option<Arc<str>>,
    #[serde(default, serialize_with = "omit_when_empty")]
    pub line: Option<u32>,
}

impl Break {
    /// How exports name it: `break fixture.c:12` (the file's last component).
    pub fn title(&self) -> String {
        let file = self.file.rsplit('/').next().unwrap_or(&self.file);
        format!("break {file}:{}", self.line)
    }

    /// The locals as people read them: `i = 1, s = "x"`.
    pub fn locals_text(&self) -> String {
        let locals: Vec<String> = self.locals.0.iter().map(|(name, value)| format!("{name} = {}", value.0)).collect();
        locals.join(", ")
    }
}

impl Syscall {
    /// Its name, as in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Syscall::Read => "read",
            Syscall::Write => "write",
            Syscall::Readv => "readv",
            Syscall::Writev => "writev",
            Syscall::Sendto => "sendto",
            Syscall::Recvfrom => "recvfrom",
            Syscall::Sendmsg => "sendmsg",
            Syscall::Recvmsg => "recvmsg",
            Syscall::Sendmmsg => "sendmmsg",
            Syscall::Recvmmsg => "recvmmsg",
        }
    }
}

impl Channel {
    /// As people read it: `tcp 127.0.0.1:5000 → 127.0.0.1:8080`, `unix stream /run/x.sock`,
    /// `pipe 1234` (the inode), `unix dgram socketpair 99`.
    pub fn text(&self) -> String {
        let place = |path: &Option<String>, id: Option<u64>| match (path, id) {
            (Some(path), _) => path.clone(),
            (None, Some(id)) => format!("socketpair {id}"),
            (None, None) => "unnamed".to_string(),
        };
        match self {
            Channel::Tcp { src, dst } => format!("tcp {src} → {dst}"),
            Channel::Udp { src, dst } => format!("udp {src} → {dst}"),
            Channel::UnixStream { id, path, .. } => format!("unix stream {}", place(path, Some(*id))),
            Channel::UnixDgram { id, path } => format!("unix dgram {}", place(path, *id)),
            Channel::Pipe { id } => format!("pipe {id}"),
            Channel::Fifo { id, path } => format!("fifo {}", path.clone().unwrap_or_else(|| id.to_string())),
        }
    }
}

impl Watch {
    /// How exports name it: `watch counter = 4`.
    pub fn title(&self) -> String {
        format!("watch {} = {}", self.variable, self.value.0)
    }

    /// Where the access was made, as people read it: `bump (fixture.c:12)`.
    pub fn place_text(&self) -> String {
        let function = self.function.as_deref().unwrap_or("?");
        match (&self.file, self.line) {
            (Some(file), Some(line)) => format!("{function} ({}:{line})", file.rsplit('/').next().unwrap_or(file)),
            _ => function.to_string(),
        }
    }
}

/// A USDT argument, signed or not as its spec says: a bare number in JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArgValue {
    Signed(i64),
    Unsigned(u64),
}

/// [`ArgValue`]'s wire form: which of the two it is.
#[derive(Serialize, Deserialize)]
enum ArgWire {
    Signed(i64),
    Unsigned(u64),
}

impl Serialize for ArgValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match (s.is_human_readable(), *self) {
            (true, ArgValue::Signed(v)) => s.serialize_i64(v),
            (true, ArgValue::Unsigned(v)) => s.serialize_u64(v),
            (false, ArgValue::Signed(v)) => ArgWire::Signed(v).serialize(s),
            (false, ArgValue::Unsigned(v)) => ArgWire::Unsigned(v).serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for ArgValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ArgValue, D::Error> {
        if !d.is_human_readable() {
            return Ok(match ArgWire::deserialize(d)? {
                ArgWire::Signed(v) => ArgValue::Signed(v),
                ArgWire::Unsigned(v) => ArgValue::Unsigned(v),
            });
        }
        // JSON does not say which: a negative number is signed, any other is read as unsigned.
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = ArgValue;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a 64-bit integer")
            }

            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ArgValue, E> {
                Ok(if v < 0 { ArgValue::Signed(v) } else { ArgValue::Unsigned(v as u64) })
            }

            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ArgValue, E> {
                Ok(ArgValue::Unsigned(v))
            }
        }
        d.deserialize_any(Visitor)
    }
}
