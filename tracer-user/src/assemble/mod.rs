//! From kernel records to [`Event`]s: Unix timestamps, function names, call durations, exit
//! statuses.

pub mod channels;
pub mod clock;
pub mod pairing;
pub mod signals;

use crate::event::data;
use std::sync::Arc;

use tracer_common::{
    RecordKind, cookie,
    decode::{Record, c_bytes, decode},
};

use crate::{
    assemble::clock::BootClock,
    assemble::pairing::{CallStacks, GoroutineStacks},
    assemble::{channels::ChannelResolver, signals::signal_event},
    debuginfo::{
        SourceFunction, format,
        layout::{FunctionLayout, Registers, Source, parse_strings},
    },
    event::{Args, Event, EventData, SpawnHow},
    usdt::{
        decode::{probe_args, program_event},
        select::ProbeTable,
    },
};

/// A probed function as events name it.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbedFunction {
    pub name: Arc<str>,
    /// Path of the ELF file.
    pub module: Arc<str>,
    /// Its DWARF's view (calls at source level), when it has DWARF.
    pub source: Option<Arc<SourceFunction>>,
}

/// A call's `params` from its registers and the strings after its record; a tail that does not
/// parse (no layout reached the kernel) marks every string parameter with why.
fn params(layout: &FunctionLayout, args: &[u64; 6], tail: &[u8]) -> data::Params {
    let regs = Registers::at_entry(*args);
    let count = layout.probe.entry_strings as usize;
    let values = match parse_strings(layout.probe.string_size, count, tail) {
        Ok(strings) => format::format_params(layout, &regs, &strings),
        Err(e) => {
            let why = format!("strings not read: {e}");
            let mut values = format::format_params(layout, &regs, &[]);
            for (v, p) in values.iter_mut().zip(&layout.params) {
                if matches!(p.source, Source::String { .. }) {
                    v.1 = format::unreadable(&why);
                }
            }
            values
        }
    };
    data::Params(values.into_iter().map(|(k, v)| (k, data::SourceValue(v))).collect())
}

/// A return's `ret` from rax, rdx and the string after its record.
fn ret(layout: &FunctionLayout, rax: u64, rdx: u64, tail: &[u8]) -> Option<data::SourceValue> {
    let regs = Registers::at_return(rax, rdx);
    let count = usize::from(layout.probe.ret.kind != 0);
    let value = match parse_strings(layout.probe.string_size, count, tail) {
        Ok(strings) => format::format_return(layout, &regs, strings.first()),
        Err(e) => layout.ret.as_ref().map(|_| format::unreadable(&format!("string not read: {e}"))),
    };
    value.map(data::SourceValue)
}

/// Probed functions, indexed by attach cookie.
pub type FunctionTable = Vec<ProbedFunction>;

pub struct EventAssembler {
    host: Arc<str>,
    clock: BootClock,
    functions: FunctionTable,
    stacks: CallStacks<u32>,
    go_stacks: GoroutineStacks<u32>,
    channels: ChannelResolver,
    /// USDT probe sites by cookie: what their records are decoded with.
    usdt: ProbeTable,
    /// Records that could not be decoded or named (counted as lost, reported in `trace_end`).
    pub undecodable: u64,
    /// Program events whose payload the kernel could not read or that do not decode (counted as
    /// lost, `log_unreadable`).
    pub unreadable_logs: u64,
}

fn comm(bytes: &[u8]) -> String {
    String::from_utf8_lossy(c_bytes(bytes)).into_owned()
}

/// Splits the kernel's `exit_code` into (exit status, killing signal).
pub fn exit_status(raw: u32) -> (Option<i32>, Option<i32>) {
    let signal = (raw & 0x7f) as i32;
    if signal != 0 { (None, Some(signal)) } else { (Some(((raw >> 8) & 0xff) as i32), None) }
}

impl EventAssembler {
    /// `return_probes`: whether return probes are attached (durations are tracked only then).
    pub fn new(host: Arc<str>, clock: BootClock, functions: FunctionTable, return_probes: bool) -> Self {
        EventAssembler {
            host,
            clock,
            functions,
            stacks: CallStacks::new(return_probes),
            go_stacks: GoroutineStacks::new(return_probes),
            channels: ChannelResolver::default(),
            usdt: ProbeTable::new(),
            undecodable: 0,
            unreadable_logs: 0,
        }
    }

    /// The USDT probe sites attached, by cookie.
    pub fn with_usdt(self, usdt: ProbeTable) -> Self {
        EventAssembler { usdt, ..self }
    }

    pub fn calls_without_return_probe(&self) -> u64 {
        self.stacks.calls_without_return_probe
    }

    /// Turns one ring-buffer record into an event; `None` (and counted) when it cannot be read.
    pub fn assemble(&mut self, bytes: &[u8]) -> Option<Event> {
        let Ok(record) = decode(bytes) else {
            self.undecodable += 1;
            return None;
        };
        let h = *record.header();
        let ts = self.clock.to_unix_ns(h.ts_boot_ns);
        let function = |c: u64| self.functions.get(cookie::function(c) as usize);
        let data = match record {
            Record::Call(r, tail) => {
                let Some(f) = function(r.cookie) else {
                    self.undecodable += 1;
                    return None;
                };
                let source = f.source.as_deref();
                let data = EventData::Call(data::Call {
                    function: f.name.clone(),
                    module: f.module.clone(),
                    args: Args::new(&r.args),
                    goid: None,
                    params: source
                        .and_then(|s| s.layout.as_ref())
                        .map(|l| params(l, &r.args, tail))
                        .unwrap_or_default(),
                    file: source.and_then(|s| s.file.clone()),
                    line: source.and_then(|s| s.line),
                });
                self.stacks.call(h.tid, cookie::function(r.cookie), h.ts_boot_ns);
                data
            }
            Record::Return(r, tail) => {
                let Some(f) = function(r.cookie) else {
                    self.undecodable += 1;
                    return None;
                };
                let (function, module) = (f.name.clone(), f.module.clone());
                let ret =
                    f.source.as_deref().and_then(|s| s.layout.as_ref()).and_then(|l| ret(l, r.retval, r.rdx, tail));
                let duration_ns = self.stacks.ret(h.tid, cookie::function(r.cookie), h.ts_boot_ns);
                EventData::Return(data::Return { function, module, retval: r.retval, duration_ns, goid: None, ret })
            }
            Record::GoCall(r) => {
                let Some(f) = function(r.cookie) else {
                    self.undecodable += 1;
                    return None;
                };
                let data = EventData::Call(data::Call {
                    function: f.name.clone(),
                    module: f.module.clone(),
                    args: Args::new(&r.args),
                    goid: Some(r.goid),
                    params: data::Params::default(),
                    file: None,
                    line: None,
                });
                let key = cookie::function(r.cookie);
                self.go_stacks.call(h.pid, h.tid, r.goid, key, r.stack_depth, h.ts_boot_ns);
                data
            }
            Record::GoReturn(r) => {
                let Some(f) = function(r.cookie) else {
                    self.undecodable += 1;
                    return None;
                };
                let (function, module) = (f.name.clone(), f.module.clone());
                let key = cookie::function(r.cookie);
                let duration_ns = self.go_stacks.ret(h.pid, h.tid, r.goid, key, r.stack_depth, h.ts_boot_ns);
                EventData::Return(data::Return {
                    function,
                    module,
                    retval: r.retval,
                    duration_ns,
                    goid: Some(r.goid),
                    ret: None,
                })
            }
            Record::Fork(r) => EventData::Spawn(data::Spawn {
                parent_pid: h.pid,
                child_pid: r.child_pid,
                child_tid: r.child_tid,
                how: if r.is_thread != 0 { SpawnHow::Thread } else { SpawnHow::Fork },
                comm: comm(&r.comm),
                filename: None,
            }),
            Record::Exec(r) => EventData::Spawn(data::Spawn {
                parent_pid: h.pid,
                child_pid: h.pid,
                child_tid: h.tid,
                how: SpawnHow::Exec,
                comm: comm(&r.comm),
                filename: Some(String::from_utf8_lossy(c_bytes(&r.filename)).into_owned()),
            }),
            Record::Exit(r) => {
                self.stacks.thread_exited(h.tid);
                self.go_stacks.thread_exited(h.pid, h.tid);
                if r.group_dead != 0 {
                    self.go_stacks.process_exited(h.pid);
                }
                let (exit_code, signal) = exit_status(r.exit_code);
                EventData::Exit(data::Exit { exit_code, signal, thread: r.group_dead == 0, comm: comm(&r.comm) })
            }
            Record::Ipc(r, captured) => match self.channels.ipc_event(h.pid, &r, captured) {
                Some(data) => data,
                None => {
                    self.undecodable += 1;
                    return None;
                }
            },
            Record::Signal(r) => signal_event(h.pid, &r),
            Record::UserEvent(r, payload) => {
                if self.usdt.get(r.cookie as usize).is_none() {
                    self.undecodable += 1;
                    return None;
                }
                match program_event(&r, payload) {
                    Ok(log) => EventData::Log(log),
                    Err(_) => {
                        self.unreadable_logs += 1;
                        return None;
                    }
                }
            }
            Record::Usdt(r) => {
                let Some(probe) = self.usdt.get(r.cookie as usize) else {
                    self.undecodable += 1;
                    return None;
                };
                EventData::Usdt(data::Usdt {
                    provider: probe.provider.clone(),
                    name: probe.name.clone(),
                    module: probe.module.clone(),
                    args: probe_args(&r, probe),
                })
            }
        };
        Some(Event { ts, host: self.host.clone(), pid: h.pid, tid: h.tid, data })
    }
}

/// Names of the kernel's lost-event slots, as `trace_end.lost_events` reports them (fork and exec
/// records are both `spawn` events).
pub fn lost_slot_name(slot: u32) -> Option<&'static str> {
    Some(match RecordKind::try_from(slot) {
        Ok(RecordKind::Call | RecordKind::GoCall) => "call",
        Ok(RecordKind::Return | RecordKind::GoReturn) => "return",
        Ok(RecordKind::Fork | RecordKind::Exec) => "spawn",
        Ok(RecordKind::Exit) => "exit",
        Ok(RecordKind::Ipc) => "ipc",
        Ok(RecordKind::Signal) => "signal",
        Ok(RecordKind::UserEvent) => "log",
        Ok(RecordKind::Usdt) => "usdt",
        Err(tracer_common::lost_slot::UNTRACKED_CHILD) => "untraced_children",
        Err(tracer_common::lost_slot::IPC_INFLIGHT) => "ipc_untracked_syscalls",
        Err(tracer_common::lost_slot::IPC_MMSG_BEYOND_LIMIT) => "ipc_messages_beyond_limit",
        Err(tracer_common::lost_slot::IPC_PAYLOAD_UNREADABLE) => "ipc_payload_unreadable",
        Err(_) => return None,
    })
}

#[cfg(test)]
mod tests {
    use tracer_common::{
        CallRecord, ExecRecord, ExitRecord, ForkRecord, GoCallRecord, GoReturnRecord, RecordHeader, ReturnRecord,
    };

    use super::*;

    fn bytes<T: Copy>(value: &T) -> Vec<u8> {
        // SAFETY: test helper over the records' padding-free integer layouts.
        unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    fn header(kind: RecordKind, ts: u64, tid: u32) -> RecordHeader {
        RecordHeader { kind: kind as u32, _pad: 0, ts_boot_ns: ts, pid: 100, tid }
    }

    fn assembler() -> EventAssembler {
        let functions = vec![ProbedFunction { name: "fib".into(), module: "/bin/fix".into(), source: None }];
        EventAssembler::new("host".into(), BootClock::with_offset(1_000_000), functions, true)
    }

    #[test]
    fn calls_and_returns_get_names_and_durations() {
        let mut a = assembler();
        let call = CallRecord { header: header(RecordKind::Call, 10, 101), cookie: 0, args: [5, 0, 0, 0, 0, 0] };
        let e = a.assemble(&bytes(&call)).unwrap();
        assert_eq!(e.ts, 1_000_010);
        assert_eq!((e.pid, e.tid), (100, 101));
        assert_eq!(
            e.data,
            EventData::Call(data::Call {
                function: "fib".into(),
                module: "/bin/fix".into(),
                args: [5, 0, 0, 0, 0, 0].into(),
                goid: None,
                params: Default::default(),
                file: None,
                line: None
            })
        );
        let ret = ReturnRecord { header: header(RecordKind::Return, 25, 101), cookie: 0, retval: 8, rdx: 0 };
        let e = a.assemble(&bytes(&ret)).unwrap();
        assert_eq!(
            e.data,
            EventData::Return(data::Return {
                function: "fib".into(),
                module: "/bin/fix".into(),
                retval: 8,
                duration_ns: Some(15),
                goid: None,
                ret: None
            })
        );
    }

    #[test]
    fn go_calls_pair_per_goroutine_with_nine_arguments() {
        let mut a = assembler();
        let call = GoCallRecord {
            header: header(RecordKind::GoCall, 10, 101),
            cookie: cookie::go(0, false, 152),
            goid: 7,
            stack_depth: 400,
            args: [1, 2, 3, 4, 5, 6, 7, 8, 9],
        };
        let e = a.assemble(&bytes(&call)).unwrap();
        assert_eq!(
            e.data,
            EventData::Call(data::Call {
                function: "fib".into(),
                module: "/bin/fix".into(),
                args: [1, 2, 3, 4, 5, 6, 7, 8, 9].into(),
                goid: Some(7),
                params: Default::default(),
                file: None,
                line: None
            })
        );
        // The goroutine returns on another thread.
        let ret = GoReturnRecord {
            header: header(RecordKind::GoReturn, 40, 102),
            cookie: cookie::go(0, true, 152),
            goid: 7,
            stack_depth: 400,
            retval: 45,
        };
        let e = a.assemble(&bytes(&ret)).unwrap();
        assert_eq!(
            e.data,
            EventData::Return(data::Return {
                function: "fib".into(),
                module: "/bin/fix".into(),
                retval: 45,
                duration_ns: Some(30),
                goid: Some(7),
                ret: None
            })
        );
        assert_eq!(lost_slot_name(RecordKind::GoCall as u32), Some("call"));
        assert_eq!(lost_slot_name(RecordKind::GoReturn as u32), Some("return"));
    }

    #[test]
    fn unknown_cookies_and_bad_records_are_counted() {
        let mut a = assembler();
        let call = CallRecord { header: header(RecordKind::Call, 10, 1), cookie: 9, args: [0; 6] };
        assert!(a.assemble(&bytes(&call)).is_none());
        assert!(a.assemble(&[1, 2, 3]).is_none());
        assert_eq!(a.undecodable, 2);
    }

    #[test]
    fn usdt_records_are_counted_not_dropped() {
        // `tracer record` attaches no USDT probes yet; should a record arrive, it is counted.
        let mut a = assembler();
        let usdt = tracer_common::UsdtRecord {
            header: header(RecordKind::Usdt, 1, 100),
            cookie: 0,
            arg_count: 0,
            failed_args: 0,
            args: [0; 12],
        };
        assert!(a.assemble(&bytes(&usdt)).is_none());
        assert_eq!(a.undecodable, 1);
    }

    #[test]
    fn process_lifecycle() {
        let mut a = assembler();
        let fork = ForkRecord {
            header: header(RecordKind::Fork, 1, 100),
            child_pid: 200,
            child_tid: 200,
            is_thread: 0,
            followed: 1,
            comm: *b"fixture\0\0\0\0\0\0\0\0\0",
        };
        let e = a.assemble(&bytes(&fork)).unwrap();
        assert_eq!(
            e.data,
            EventData::Spawn(data::Spawn {
                parent_pid: 100,
                child_pid: 200,
                child_tid: 200,
                how: SpawnHow::Fork,
                comm: "fixture".into(),
                filename: None
            })
        );
        let mut exec = ExecRecord {
            header: header(RecordKind::Exec, 2, 100),
            old_tid: 100,
            _pad: 0,
            comm: [0; 16],
            filename: [0; 256],
        };
        exec.comm[..2].copy_from_slice(b"ls");
        exec.filename[..7].copy_from_slice(b"/bin/ls");
        let e = a.assemble(&bytes(&exec)).unwrap();
        assert_eq!(
            e.data,
            EventData::Spawn(data::Spawn {
                parent_pid: 100,
                child_pid: 100,
                child_tid: 100,
                how: SpawnHow::Exec,
                comm: "ls".into(),
                filename: Some("/bin/ls".into())
            })
        );
        let exit =
            ExitRecord { header: header(RecordKind::Exit, 3, 100), exit_code: 3 << 8, group_dead: 1, comm: [0; 16] };
        let e = a.assemble(&bytes(&exit)).unwrap();
        assert_eq!(
            e.data,
            EventData::Exit(data::Exit { exit_code: Some(3), signal: None, thread: false, comm: String::new() })
        );
    }

    #[test]
    fn exit_statuses() {
        assert_eq!(exit_status(0), (Some(0), None));
        assert_eq!(exit_status(42 << 8), (Some(42), None));
        assert_eq!(exit_status(9), (None, Some(9)));
        // SIGSEGV with core dump.
        assert_eq!(exit_status(0x80 | 11), (None, Some(11)));
    }

    #[test]
    fn lost_slots_are_named() {
        assert_eq!(lost_slot_name(1), Some("call"));
        assert_eq!(lost_slot_name(RecordKind::UserEvent as u32), Some("log"));
        assert_eq!(lost_slot_name(RecordKind::Usdt as u32), Some("usdt"));
        assert_eq!(lost_slot_name(tracer_common::lost_slot::UNTRACKED_CHILD), Some("untraced_children"));
        assert_eq!(lost_slot_name(0), None);
    }
}
