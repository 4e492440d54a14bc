//! Chrome's Trace Event Format (JSON object form), as the Perfetto UI, chrome://tracing and
//! speedscope read it.
//!
//! - Each call is a complete (`X`) slice on its thread (a Go call on its goroutine's track, named
//!   `goroutine N`, numbered from [`GOROUTINE_TID_BASE`]: a goroutine moves between threads), written when it ends, as
//!   [`crate::analysis::slices`] reconstructs it (a return's start is its timestamp minus the
//!   recorded duration, so recursion pairs exactly as recorded).
//! - A call that never returned ends when its caller returns, its thread exits or execs, or at the
//!   end of the trace, and is marked `unfinished` in its args, with why.
//! - Spawns and exits are thread-scoped instant events carrying their fields as args.
//! - Process and thread names (`comm`) are metadata events; the trace's start and end lines
//!   (targets, lost events, ...) are the top-level `metadata`.
//! - Timestamps are microseconds since the trace start, with three decimals: nanoseconds kept
//!   (a double holds them exactly for traces of up to about three months).
//!
//! The event array is streamed: one serde_json value per event, so memory is bounded by the open
//! calls, not by the trace.

use crate::event::data;
use std::{
    collections::{BTreeMap, HashMap},
    io::{self, BufWriter, Write},
};

use serde::Serialize;
use serde_json::{Value, json};

use super::{MAX_REMEMBERED_SENDS, lifecycle_name};
use crate::{
    analysis::{
        processes,
        slices::{CallEvent, CallTracker, Calls, Ending, Slice, Track},
    },
    event::{
        Event, EventData, SpawnHow, TraceEnd, TraceStart,
        json::{Json, Line},
    },
    sink::Sink,
};

/// One end of an arrow: a point on a thread's track.
#[derive(Clone, Copy)]
struct FlowEnd {
    pid: u32,
    tid: u32,
    ts: u64,
}

/// Writes a Chrome trace as the trace goes; a [`Sink`].
pub struct ChromeWriter<W: Write> {
    calls: CallTracker,
    output: Output<W>,
}

/// The trace being written: everything but the open calls.
struct Output<W: Write> {
    out: BufWriter<W>,
    wrote_event: bool,
    /// Where each send happened, by flow id, for the arrows to its receives.
    sends: BTreeMap<u64, FlowEnd>,
    /// Where each signal was generated, by flow id.
    signals: HashMap<u64, FlowEnd>,
    next_arrow: u64,
    origin_ns: u64,
    start: Option<TraceStart>,
    process_names: BTreeMap<u32, String>,
    thread_names: BTreeMap<(u32, u32), String>,
}

/// One trace event. Field names are the format's.
#[derive(Serialize)]
struct TraceEvent<'a> {
    name: &'a str,
    cat: &'a str,
    ph: &'a str,
    ts: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    pid: u32,
    tid: u32,
    /// Scope of an instant event: `t`hread.
    #[serde(skip_serializing_if = "Option::is_none")]
    s: Option<&'a str>,
    args: Value,
}

/// Goroutine tracks are numbered from here, above any thread id (Linux's `pid_max` is at most
/// 2^22): goroutine N is `GOROUTINE_TID_BASE + N` (its low 30 bits).
pub const GOROUTINE_TID_BASE: u32 = 1 << 30;

/// The `tid` a call on `track` is drawn on.
pub fn track_tid(track: Track) -> u32 {
    match track {
        Track::Thread(tid) => tid,
        Track::Goroutine(goid) => GOROUTINE_TID_BASE | (goid as u32 & (GOROUTINE_TID_BASE - 1)),
    }
}

/// A register value as a JSON number when a double holds it exactly, else as a hex string.
fn register(v: u64) -> Value {
    if v <= (1 << 53) { json!(v) } else { json!(format!("{v:#x}")) }
}

fn micros(ns: i128) -> f64 {
    ns as f64 / 1_000.0
}

impl<W: Write> ChromeWriter<W> {
    pub fn new(out: W) -> Self {
        ChromeWriter { calls: CallTracker::default(), output: Output::new(out) }
    }
}

impl<W: Write> Output<W> {
    fn new(out: W) -> Self {
        Output {
            out: BufWriter::with_capacity(1 << 20, out),
            wrote_event: false,
            sends: BTreeMap::new(),
            signals: HashMap::new(),
            next_arrow: 1,
            origin_ns: 0,
            start: None,
            process_names: BTreeMap::new(),
            thread_names: BTreeMap::new(),
        }
    }

    fn ts(&self, ns: u64) -> f64 {
        micros(ns as i128 - self.origin_ns as i128)
    }

    fn write(&mut self, event: &impl Serialize) -> io::Result<()> {
        if self.wrote_event {
            self.out.write_all(b",\n")?;
        }
        self.wrote_event = true;
        serde_json::to_writer(&mut self.out, event)?;
        Ok(())
    }

    fn slice(&mut self, slice: &Slice) -> io::Result<()> {
        let call = slice.frame;
        let mut args = serde_json::Map::new();
        args.insert("module".into(), json!(&*call.module));
        if let Track::Goroutine(goid) = slice.track {
            args.insert("goid".into(), json!(goid));
            args.insert("return_tid".into(), json!(slice.tid));
            self.thread_names.entry((slice.pid, track_tid(slice.track))).or_insert_with(|| format!("goroutine {goid}"));
        }
        if slice.call_seen {
            for (i, a) in call.args.iter().enumerate() {
                args.insert(format!("arg{i}"), register(*a));
            }
            // Parameters at source level (DWARF), by name, in one object so that no parameter
            // name can hide another argument.
            if !call.params.is_empty() {
                let params = call.params.0.iter().map(|(name, value)| (name.clone(), value.0.clone()));
                args.insert("params".into(), Value::Object(params.collect()));
            }
            if let Some(file) = &call.file {
                args.insert("file".into(), json!(&**file));
            }
            if let Some(line) = call.line {
                args.insert("line".into(), json!(line));
            }
        }
        if let Some(ret) = &call.ret {
            args.insert("ret".into(), ret.0.clone());
        }
        match slice.ending {
            Ending::Returned { retval } => {
                args.insert("retval".into(), register(retval));
            }
            unfinished => {
                args.insert("unfinished".into(), json!(true));
                args.insert("why".into(), json!(unfinished.unfinished_reason()));
            }
        }
        let ev = TraceEvent {
            name: &call.function,
            cat: "call",
            ph: "X",
            ts: self.ts(call.start),
            dur: Some(micros(slice.duration() as i128)),
            pid: slice.pid,
            tid: track_tid(slice.track),
            s: None,
            args: Value::Object(args),
        };
        self.write(&ev)
    }

    fn instant(&mut self, e: &Event, name: &str, args: Value) -> io::Result<()> {
        let ev = TraceEvent {
            name,
            cat: e.data.kind().name(),
            ph: "i",
            ts: self.ts(e.ts),
            dur: None,
            pid: e.pid,
            tid: e.tid,
            s: Some("t"),
            args,
        };
        self.write(&ev)
    }

    /// A short slice for a syscall that moved IPC data (or a signal), `[start, start + dur]`.
    fn ipc_slice(&mut self, e: &Event, name: &str, start: u64, dur: u64, args: Value) -> io::Result<()> {
        let ev = TraceEvent {
            name,
            cat: e.data.kind().name(),
            ph: "X",
            ts: self.ts(start),
            dur: Some(micros(dur as i128)),
            pid: e.pid,
            tid: e.tid,
            s: None,
            args,
        };
        self.write(&ev)
    }

    /// An arrow from `from` to `to`. Each end binds to the slice enclosing its timestamp (the
    /// middle of the send and receive slices); every arrow gets an id of its own, since a flow id
    /// may fan out to several receives.
    fn arrow(&mut self, name: &str, from: FlowEnd, to: FlowEnd) -> io::Result<()> {
        let id = self.next_arrow;
        self.next_arrow += 1;
        let (from_ts, to_ts) = (self.ts(from.ts), self.ts(to.ts));
        self.write(
            &json!({"name": name, "cat": "ipc", "ph": "s", "id": id, "pid": from.pid, "tid": from.tid, "ts": from_ts}),
        )?;
        self.write(&json!({"name": name, "cat": "ipc", "ph": "f", "bp": "e", "id": id, "pid": to.pid, "tid": to.tid, "ts": to_ts}))
    }

    fn name_metadata(&mut self) -> io::Result<()> {
        let processes = std::mem::take(&mut self.process_names);
        for (pid, name) in processes {
            self.write(&json!({"name": "process_name", "ph": "M", "pid": pid, "tid": pid, "args": {"name": name}}))?;
        }
        let threads = std::mem::take(&mut self.thread_names);
        for ((pid, tid), name) in threads {
            self.write(&json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}))?;
        }
        Ok(())
    }
}

impl<W: Write> Sink for ChromeWriter<W> {
    fn begin(&mut self, start: &TraceStart) -> io::Result<()> {
        self.output.begin(start)
    }

    fn event(&mut self, e: &Event) -> io::Result<()> {
        // Calls and returns make slices; an exit or exec ends the calls still open.
        self.output.slices(self.calls.event(e))?;
        self.output.event(e)
    }

    fn end(&mut self, end: &TraceEnd) -> io::Result<()> {
        self.output.slices(self.calls.finish(end.ts))?;
        self.output.end(end)
    }
}

/// The trace's other lines, around the slices.
impl<W: Write> Output<W> {
    /// Writes each call that ended.
    fn slices(&mut self, mut calls: Calls) -> io::Result<()> {
        while let Some(c) = calls.next() {
            if let CallEvent::End(slice) = c {
                self.slice(&slice)?;
            }
        }
        Ok(())
    }

    fn begin(&mut self, start: &TraceStart) -> io::Result<()> {
        self.origin_ns = start.ts;
        for (pid, name) in start.targets.iter().filter_map(processes::target_name) {
            self.process_names.insert(pid, name.clone());
            self.thread_names.insert((pid, pid), name);
        }
        self.start = Some(start.clone());
        self.out.write_all(b"{\"traceEvents\":[\n")
    }

    fn event(&mut self, e: &Event) -> io::Result<()> {
        if let Some((pid, name)) = processes::named_by(e) {
            self.process_names.insert(pid, name.to_string());
        }
        match &e.data {
            EventData::Call(data::Call { .. }) | EventData::Return(data::Return { .. }) => {}
            EventData::Spawn(data::Spawn { parent_pid, child_pid, child_tid, how, comm, filename }) => {
                match how {
                    SpawnHow::Fork | SpawnHow::Thread => {
                        self.thread_names.insert((*child_pid, *child_tid), comm.clone());
                    }
                    SpawnHow::Exec => {
                        self.thread_names.insert((e.pid, e.tid), comm.clone());
                    }
                }
                let name = lifecycle_name(&e.data).unwrap_or_default();
                let args = json!({
                    "parent_pid": parent_pid, "child_pid": child_pid, "child_tid": child_tid,
                    "how": how, "comm": comm, "filename": filename,
                });
                self.instant(e, &name, args)?;
            }
            EventData::Exit(data::Exit { exit_code, signal, thread, comm }) => {
                if !comm.is_empty() {
                    self.thread_names.entry((e.pid, e.tid)).or_insert_with(|| comm.clone());
                }
                let name = lifecycle_name(&e.data).unwrap_or_default();
                let args = json!({ "exit_code": exit_code, "signal": signal, "thread": thread });
                self.instant(e, &name, args)?;
            }
            EventData::Send(data::Send { channel, fd, bytes, syscall, flow_id, syscall_ns, .. }) => {
                let args = json!({ "channel": Json(channel), "fd": fd, "bytes": bytes, "syscall": syscall, "flow_id": flow_id });
                self.ipc_slice(e, &format!("send {bytes} B"), e.ts, *syscall_ns, args)?;
                if self.sends.len() >= MAX_REMEMBERED_SENDS {
                    self.sends.pop_first();
                }
                self.sends.insert(*flow_id, FlowEnd { pid: e.pid, tid: e.tid, ts: e.ts + syscall_ns / 2 });
            }
            EventData::Recv(data::Recv { channel, fd, bytes, syscall, flow_ids, syscall_ns, .. }) => {
                let start = e.ts.saturating_sub(*syscall_ns);
                let args = json!({ "channel": Json(channel), "fd": fd, "bytes": bytes, "syscall": syscall, "flow_ids": flow_ids });
                self.ipc_slice(e, &format!("recv {bytes} B"), start, *syscall_ns, args)?;
                let to = FlowEnd { pid: e.pid, tid: e.tid, ts: start + syscall_ns / 2 };
                for id in flow_ids {
                    if let Some(from) = self.sends.get(id).copied() {
                        self.arrow("message", from, to)?;
                    }
                }
            }
            EventData::Signal(data::Signal {
                signal, sender_pid, target_pid, target_tid, delivered, flow_id, ..
            }) => {
                let name = format!("{} {}", if *delivered { "deliver" } else { "kill" }, signal.name);
                let args = json!({
                    "signal": signal, "sender_pid": sender_pid, "target_pid": target_pid,
                    "target_tid": target_tid, "delivered": delivered, "flow_id": flow_id,
                });
                // A zero-length slice (not an instant) so that the arrow has something to bind to.
                self.ipc_slice(e, &name, e.ts, 0, args)?;
                let here = FlowEnd { pid: e.pid, tid: e.tid, ts: e.ts };
                match (flow_id, delivered) {
                    (Some(id), false) => {
                        self.signals.insert(*id, here);
                    }
                    (Some(id), true) => {
                        if let Some(from) = self.signals.remove(id) {
                            self.arrow("signal", from, here)?;
                        }
                    }
                    (None, _) => {}
                }
            }
            EventData::Log(log) => {
                let args = serde_json::to_value(log).map_err(io::Error::other)?;
                self.instant(e, &log.message, args)?;
            }
            EventData::Usdt(usdt) => {
                let args = serde_json::to_value(usdt).map_err(io::Error::other)?;
                self.instant(e, &format!("{}:{}", usdt.provider, usdt.name), args)?;
            }
            EventData::Break(b) => {
                let args = serde_json::to_value(b).map_err(io::Error::other)?;
                self.instant(e, &b.title(), args)?;
            }
            EventData::Watch(w) => {
                let args = serde_json::to_value(w).map_err(io::Error::other)?;
                self.instant(e, &w.title(), args)?;
            }
        }
        Ok(())
    }

    fn end(&mut self, end: &TraceEnd) -> io::Result<()> {
        self.name_metadata()?;
        self.out.write_all(b"\n],\"displayTimeUnit\":\"ns\",\"metadata\":")?;
        serde_json::to_writer(
            &mut self.out,
            &json!({ "trace_start": self.start.as_ref().map(Line::Start), "trace_end": Line::End(end) }),
        )?;
        self.out.write_all(b"}\n")?;
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::test_events::{call, end, ev, go_call, go_ret, ret, start};

    fn export(events: &[Event], end_ts: u64) -> Value {
        let mut out = Vec::new();
        let mut w = ChromeWriter::new(&mut out);
        w.begin(&start(1_000_000)).unwrap();
        for e in events {
            w.event(e).unwrap();
        }
        w.end(&end(end_ts)).unwrap();
        drop(w);
        serde_json::from_slice(&out).expect("valid JSON")
    }

    fn slices(trace: &Value) -> Vec<(String, f64, f64, u64, bool)> {
        trace["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_string(),
                    e["ts"].as_f64().unwrap(),
                    e["dur"].as_f64().unwrap(),
                    e["tid"].as_u64().unwrap(),
                    e["args"]["unfinished"] == true,
                )
            })
            .collect()
    }

    #[test]
    fn go_calls_are_slices_on_their_goroutine_track() {
        let trace =
            export(&[go_call(1_000_100, 1, 9, "main.blocker"), go_ret(1_000_400, 2, 9, "main.blocker", 300)], 0);
        let tid = u64::from(GOROUTINE_TID_BASE) + 9;
        assert_eq!(slices(&trace), vec![("main.blocker".to_string(), 0.1, 0.3, tid, false)]);
        let events = trace["traceEvents"].as_array().unwrap();
        let slice = events.iter().find(|e| e["ph"] == "X").unwrap();
        assert_eq!((&slice["args"]["goid"], &slice["args"]["return_tid"]), (&json!(9), &json!(2)));
        let name = events.iter().find(|e| e["name"] == "thread_name" && e["tid"] == tid).expect("a named track");
        assert_eq!(name["args"]["name"], "goroutine 9");
    }

    #[test]
    fn nested_calls_become_nested_slices() {
        let t = export(
            &[
                call(1_000_100, 1, "outer"),
                call(1_000_200, 1, "inner"),
                ret(1_000_250, 1, "inner", Some(50)),
                ret(1_001_100, 1, "outer", Some(1_000)),
            ],
            1_002_000,
        );
        assert_eq!(slices(&t), vec![("inner".into(), 0.2, 0.05, 1, false), ("outer".into(), 0.1, 1.0, 1, false)]);
        let inner = &t["traceEvents"][0];
        assert_eq!(inner["args"]["arg0"], 1_000_200);
        assert_eq!(inner["args"]["arg5"], "0xffffffffffffffff");
        assert_eq!(inner["args"]["retval"], 7);
        assert_eq!(inner["args"]["module"], "/bin/app");
    }

    #[test]
    fn recursion_pairs_by_recorded_duration() {
        // f(f(f())) where the innermost call has no return (beyond the uretprobe depth limit):
        // the middle return closes it, and pairs with the middle call by its duration.
        let t = export(
            &[
                call(1_000_100, 1, "f"),
                call(1_000_200, 1, "f"),
                call(1_000_300, 1, "f"),
                ret(1_000_400, 1, "f", Some(200)),
                ret(1_000_500, 1, "f", Some(400)),
            ],
            1_001_000,
        );
        assert_eq!(
            slices(&t),
            vec![("f".into(), 0.3, 0.1, 1, true), ("f".into(), 0.2, 0.2, 1, false), ("f".into(), 0.1, 0.4, 1, false),]
        );
    }

    #[test]
    fn open_calls_end_at_the_trace_end() {
        let t = export(&[call(1_000_100, 1, "main"), call(1_000_200, 2, "worker")], 1_000_900);
        let mut s = slices(&t);
        s.sort_by_key(|a| a.3);
        assert_eq!(s, vec![("main".into(), 0.1, 0.8, 1, true), ("worker".into(), 0.2, 0.7, 2, true)]);
        assert_eq!(t["metadata"]["trace_end"]["lost_events"]["call"], 3);
        assert_eq!(t["metadata"]["trace_start"]["probes"], 2);
        assert_eq!(t["displayTimeUnit"], "ns");
    }

    #[test]
    fn returns_without_calls_draw_nothing_and_keep_the_stack() {
        let t = export(
            &[call(1_000_100, 1, "a"), ret(1_000_150, 1, "b", None), ret(1_000_300, 1, "a", Some(200))],
            1_001_000,
        );
        assert_eq!(slices(&t), vec![("a".into(), 0.1, 0.2, 1, false)]);
    }

    #[test]
    fn lifecycle_events_are_instants_and_names() {
        let t = export(
            &[
                ev(
                    1_000_010,
                    1,
                    1,
                    EventData::Spawn(data::Spawn {
                        parent_pid: 1,
                        child_pid: 2,
                        child_tid: 2,
                        how: SpawnHow::Fork,
                        comm: "app".into(),
                        filename: None,
                    }),
                ),
                Event {
                    ts: 1_000_020,
                    host: "h".into(),
                    pid: 2,
                    tid: 2,
                    data: EventData::Spawn(data::Spawn {
                        parent_pid: 2,
                        child_pid: 2,
                        child_tid: 2,
                        how: SpawnHow::Exec,
                        comm: "child".into(),
                        filename: Some("/bin/child".into()),
                    }),
                },
                Event {
                    ts: 1_000_030,
                    host: "h".into(),
                    pid: 2,
                    tid: 2,
                    data: EventData::Exit(data::Exit {
                        exit_code: Some(3),
                        signal: None,
                        thread: false,
                        comm: "child".into(),
                    }),
                },
            ],
            1_000_100,
        );
        let events = t["traceEvents"].as_array().unwrap();
        let instants: Vec<&str> =
            events.iter().filter(|e| e["ph"] == "i").map(|e| e["name"].as_str().unwrap()).collect();
        assert_eq!(instants, ["fork 2", "exec /bin/child", "exit 3"]);
        assert!(events.iter().filter(|e| e["ph"] == "i").all(|e| e["s"] == "t"));
        let names: Vec<(u64, &str)> = events
            .iter()
            .filter(|e| e["name"] == "process_name")
            .map(|e| (e["pid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap()))
            .collect();
        assert_eq!(names, [(1, "app"), (2, "child")]);
    }

    #[test]
    fn log_and_usdt_events_are_instants_with_their_fields_on_their_thread() {
        use crate::event::{
            ArgValue, Level,
            test_events::{log, usdt},
        };
        let t = export(
            &[
                call(1_000_050, 2, "main"),
                log(1_000_100, 2, Level::Warn, Some("app::db"), "slow", json!({"rows": 3})),
                usdt(
                    1_000_200,
                    3,
                    "fixture",
                    "loop",
                    vec![Some(ArgValue::Signed(-2)), Some(ArgValue::Unsigned(7)), None],
                ),
                ret(1_000_300, 2, "main", Some(250)),
            ],
            1_000_400,
        );
        let events = t["traceEvents"].as_array().unwrap();
        let instants: Vec<&Value> = events.iter().filter(|e| e["ph"] == "i").collect();
        let placed: Vec<(&str, &str, u64, u64, f64, &str)> = instants
            .iter()
            .map(|e| {
                let s = |k: &str| e[k].as_str().unwrap();
                (
                    s("name"),
                    s("cat"),
                    e["pid"].as_u64().unwrap(),
                    e["tid"].as_u64().unwrap(),
                    e["ts"].as_f64().unwrap(),
                    s("s"),
                )
            })
            .collect();
        assert_eq!(placed, [("slow", "log", 1, 2, 0.1, "t"), ("fixture:loop", "usdt", 1, 3, 0.2, "t")]);
        assert_eq!(
            instants[0]["args"],
            json!({
                "type": "log", "level": "warn", "source": "app::db", "message": "slow", "function": "app",
                "file": "src/main.rs", "line": 12, "spans": [], "data": {"rows": 3}, "truncated": false,
            })
        );
        assert_eq!(
            instants[1]["args"],
            json!({ "provider": "fixture", "name": "loop", "module": "/bin/app", "args": [-2, 7, null] })
        );
        // The call they happened in is still a slice of its own.
        assert_eq!(slices(&t).len(), 1, "{t}");
    }

    #[test]
    fn empty_trace_is_valid() {
        let t = export(&[], 1_000_000);
        assert_eq!(t["traceEvents"].as_array().unwrap().len(), 2, "two name records for the target: {t}");
    }
}
