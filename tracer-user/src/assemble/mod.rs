//! From kernel records to [`Event`]s: Unix timestamps, function names, call durations, exit
//! statuses.

pub mod channels;
pub mod clock;
pub mod pairing;
pub mod signals;

use crate::event::data;
use std::sync::Arc;

use tracer_common::{
    CallRecord, ExecRecord, ExitRecord, ForkRecord, GoCallRecord, GoReturnRecord, RecordHeader, ReturnRecord,
    UsdtRecord, UserEventRecord, cookie,
    decode::{Record, c_bytes, decode},
};

use crate::{
    assemble::clock::BootClock,
    assemble::pairing::{CallStacks, GoroutineStacks, NativeStacks, Unwound},
    assemble::{channels::ChannelResolver, signals::signal_event},
    breakpoints::decode::{BreakTable, WatchTable},
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
    /// How a native function's returns arrive (Go's have records of their own).
    pub returns: NativeReturns,
}

/// How the returns of a native function are probed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NativeReturns {
    /// Not at all: its calls alone are traced.
    #[default]
    None,
    /// By a uretprobe: returns arrive in reverse order of the calls ([`CallStacks`]).
    ReturnAddress,
    /// Where they happen, each `ret` and jump out: paired by stack position ([`NativeStacks`]).
    /// `extent` is the function's code as (start, length) from its start, wrapping: a `jmp reg`
    /// that lands in there stays inside.
    AtExits { extent: Arc<[(u64, u64)]> },
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
    native_stacks: NativeStacks<u32>,
    /// Calls found left without a return by the last record, innermost first: their returns go
    /// before that record's event ([`EventAssembler::drain_unwound`]).
    unwound: Vec<Unwound<u32>>,
    /// The last record's time and process.
    unwound_at: (u64, u32),
    channels: ChannelResolver,
    /// USDT probe sites by cookie: what their records are decoded with.
    usdt: ProbeTable,
    /// Breakpoint sites by cookie, and watchpoints by address.
    breaks: BreakTable,
    watches: WatchTable,
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
            native_stacks: NativeStacks::default(),
            unwound: Vec::new(),
            unwound_at: (0, 0),
            channels: ChannelResolver::default(),
            usdt: ProbeTable::new(),
            breaks: BreakTable::default(),
            watches: WatchTable::default(),
            undecodable: 0,
            unreadable_logs: 0,
        }
    }

    /// The USDT probe sites attached, by cookie.
    pub fn with_usdt(self, usdt: ProbeTable) -> Self {
        EventAssembler { usdt, ..self }
    }

    /// The breakpoint sites attached (by cookie) and the watchpoints opened (by address).
    pub fn with_breakpoints(self, breaks: BreakTable, watches: WatchTable) -> Self {
        EventAssembler { breaks, watches, ..self }
    }

    /// Functions probed after the start (in an image a traced process exec'd): their cookies
    /// number on from the functions already known.
    pub fn add_functions(&mut self, more: FunctionTable) {
        self.functions.extend(more);
    }

    /// How many functions are known: the cookie of the next one added.
    pub fn function_count(&self) -> u32 {
        self.functions.len() as u32
    }

    pub fn calls_without_return_probe(&self) -> u64 {
        self.stacks.calls_without_return_probe
    }

    /// The returns of the calls that the last record showed left without one (innermost first,
    /// at that record's time): they go before its event.
    pub fn drain_unwound(&mut self) -> impl Iterator<Item = Event> + '_ {
        let (ts_boot_ns, pid) = self.unwound_at;
        let ts = self.clock.to_unix_ns(ts_boot_ns);
        let (functions, host) = (&self.functions, &self.host);
        self.unwound.drain(..).filter_map(move |u| {
            let f = functions.get(u.key as usize)?;
            let data = EventData::Return(data::Return {
                function: f.name.clone(),
                module: f.module.clone(),
                retval: 0,
                duration_ns: Some(ts_boot_ns.saturating_sub(u.ts)),
                goid: None,
                ret: None,
                unwound: Some(true),
                tail_call: None,
            });
            Some(Event { ts, host: host.clone(), pid, tid: u.tid, data })
        })
    }

    /// Turns one ring-buffer record into an event; `None` (and counted) when it cannot be read.
    pub fn assemble(&mut self, bytes: &[u8]) -> Option<Event> {
        let Ok(record) = decode(bytes) else {
            self.undecodable += 1;
            return None;
        };
        let h = *record.header();
        self.unwound_at = (h.ts_boot_ns, h.pid);
        let ts = self.clock.to_unix_ns(h.ts_boot_ns);
        let data = match record {
            Record::Call(r, tail) => self.call(&h, &r, tail)?,
            Record::Return(r, tail) => self.ret(&h, &r, tail)?,
            Record::GoCall(r) => self.go_call(&h, &r)?,
            Record::GoReturn(r) => self.go_return(&h, &r)?,
            Record::Fork(r) => fork(&h, &r),
            Record::Exec(r) => self.exec(&h, &r),
            Record::Exit(r) => self.exit(&h, &r),
            Record::Ipc(r, captured) => {
                let data = self.channels.ipc_event(h.pid, &r, captured);
                self.counted(data)?
            }
            Record::Signal(r) => signal_event(h.pid, &r),
            Record::UserEvent(r, payload) => self.user_event(&r, payload)?,
            Record::Usdt(r) => self.usdt(&r)?,
            Record::Break(r, tail) => {
                let data = self.breaks.event(&r, tail).map(EventData::Break);
                self.counted(data)?
            }
            Record::Watch(r) => {
                let data = self.watches.event(&r).map(EventData::Watch);
                self.counted(data)?
            }
        };
        Some(Event { ts, host: self.host.clone(), pid: h.pid, tid: h.tid, data })
    }

    /// `value`, counting it as undecodable when there is none.
    fn counted<T>(&mut self, value: Option<T>) -> Option<T> {
        if value.is_none() {
            self.undecodable += 1;
        }
        value
    }

    fn call(&mut self, h: &RecordHeader, r: &CallRecord, tail: &[u8]) -> Option<EventData> {
        let f = known(&self.functions, cookie::function(r.cookie) as usize, &mut self.undecodable)?;
        let source = f.source.as_deref();
        let data = EventData::Call(data::Call {
            function: f.name.clone(),
            module: f.module.clone(),
            args: Args::new(&r.args),
            goid: None,
            params: source.and_then(|s| s.layout.as_ref()).map(|l| params(l, &r.args, tail)).unwrap_or_default(),
            file: source.and_then(|s| s.file.clone()),
            line: source.and_then(|s| s.line),
        });
        let key = cookie::function(r.cookie);
        match f.returns {
            NativeReturns::None => {}
            NativeReturns::ReturnAddress => self.stacks.call(h.tid, key, r.sp, h.ts_boot_ns),
            NativeReturns::AtExits { .. } => self.native_stacks.call(h.tid, key, r.sp, h.ts_boot_ns, &mut self.unwound),
        }
        Some(data)
    }

    fn ret(&mut self, h: &RecordHeader, r: &ReturnRecord, tail: &[u8]) -> Option<EventData> {
        let f = known(&self.functions, cookie::function(r.cookie) as usize, &mut self.undecodable)?;
        let key = cookie::function(r.cookie);
        let (function, module) = (f.name.clone(), f.module.clone());
        if !cookie::is_ret_site(r.cookie) {
            let ret = f.source.as_deref().and_then(|s| s.layout.as_ref()).and_then(|l| ret(l, r.retval, r.rdx, tail));
            let duration_ns = self.stacks.ret(h.tid, key, r.entry_sp(), h.ts_boot_ns);
            return Some(EventData::Return(data::Return {
                function,
                module,
                retval: r.retval,
                duration_ns,
                goid: None,
                ret,
                unwound: None,
                tail_call: None,
            }));
        }
        if cookie::is_indirect(r.cookie)
            && let NativeReturns::AtExits { extent } = &f.returns
            && extent.iter().any(|&(start, len)| r.retval.wrapping_sub(start) < len)
        {
            // `jmp reg` within the function (a switch): not an exit.
            return None;
        }
        let tail_call = cookie::is_tail_call(r.cookie);
        let duration_ns = self.native_stacks.ret(h.tid, key, r.entry_sp(), h.ts_boot_ns, &mut self.unwound);
        let ret = match f.source.as_deref().and_then(|s| s.layout.as_ref()) {
            Some(l) if !tail_call => ret(l, r.retval, r.rdx, tail),
            _ => None,
        };
        Some(EventData::Return(data::Return {
            function,
            module,
            retval: if tail_call { 0 } else { r.retval },
            duration_ns,
            goid: None,
            ret,
            unwound: None,
            tail_call: tail_call.then_some(true),
        }))
    }

    fn go_call(&mut self, h: &RecordHeader, r: &GoCallRecord) -> Option<EventData> {
        let f = known(&self.functions, cookie::function(r.cookie) as usize, &mut self.undecodable)?;
        let key = cookie::function(r.cookie);
        self.go_stacks.call(h.pid, h.tid, r.goid, key, r.stack_depth, h.ts_boot_ns);
        Some(EventData::Call(data::Call {
            function: f.name.clone(),
            module: f.module.clone(),
            args: Args::new(&r.args),
            goid: Some(r.goid),
            params: data::Params::default(),
            file: None,
            line: None,
        }))
    }

    fn go_return(&mut self, h: &RecordHeader, r: &GoReturnRecord) -> Option<EventData> {
        let f = known(&self.functions, cookie::function(r.cookie) as usize, &mut self.undecodable)?;
        let key = cookie::function(r.cookie);
        let duration_ns = self.go_stacks.ret(h.pid, h.tid, r.goid, key, r.stack_depth, h.ts_boot_ns);
        Some(EventData::Return(data::Return {
            function: f.name.clone(),
            module: f.module.clone(),
            retval: r.retval,
            duration_ns,
            goid: Some(r.goid),
            ret: None,
            unwound: None,
            tail_call: None,
        }))
    }

    fn exec(&mut self, h: &RecordHeader, r: &ExecRecord) -> EventData {
        // The old program's calls end with it: on the thread that exec'd, under the process's id
        // now and its own before, and in every goroutine.
        self.thread_ended(h.tid);
        if r.old_tid != h.tid {
            self.thread_ended(r.old_tid);
        }
        self.go_stacks.process_exited(h.pid);
        EventData::Spawn(data::Spawn {
            parent_pid: h.pid,
            child_pid: h.pid,
            child_tid: h.tid,
            how: SpawnHow::Exec,
            comm: comm(&r.comm),
            filename: Some(String::from_utf8_lossy(c_bytes(&r.filename)).into_owned()),
        })
    }

    fn exit(&mut self, h: &RecordHeader, r: &ExitRecord) -> EventData {
        self.thread_ended(h.tid);
        self.go_stacks.thread_exited(h.pid, h.tid);
        if r.group_dead != 0 {
            self.go_stacks.process_exited(h.pid);
        }
        let (exit_code, signal) = exit_status(r.exit_code);
        EventData::Exit(data::Exit { exit_code, signal, thread: r.group_dead == 0, comm: comm(&r.comm) })
    }

    /// Ends the native calls open on a thread that exited or replaced its program: those probed at
    /// their exits get their returns (unwound), the others are forgotten, as the kernel forgets
    /// their return probes.
    fn thread_ended(&mut self, tid: u32) {
        self.stacks.thread_ended(tid);
        self.native_stacks.thread_ended(tid, &mut self.unwound);
    }

    fn user_event(&mut self, r: &UserEventRecord, payload: &[u8]) -> Option<EventData> {
        known(&self.usdt, r.cookie as usize, &mut self.undecodable)?;
        match program_event(r, payload) {
            Ok(log) => Some(EventData::Log(log)),
            Err(_) => {
                self.unreadable_logs += 1;
                None
            }
        }
    }

    fn usdt(&mut self, r: &UsdtRecord) -> Option<EventData> {
        let probe = known(&self.usdt, r.cookie as usize, &mut self.undecodable)?;
        Some(EventData::Usdt(data::Usdt {
            provider: probe.provider.clone(),
            name: probe.name.clone(),
            module: probe.module.clone(),
            args: probe_args(r, probe),
        }))
    }
}

/// The entry of a table (of functions, of probes) a record names by its cookie; a cookie that
/// names none is counted as undecodable.
fn known<'t, T>(table: &'t [T], index: usize, undecodable: &mut u64) -> Option<&'t T> {
    let entry = table.get(index);
    if entry.is_none() {
        *undecodable += 1;
    }
    entry
}

fn fork(h: &RecordHeader, r: &ForkRecord) -> EventData {
    EventData::Spawn(data::Spawn {
        parent_pid: h.pid,
        child_pid: r.child_pid,
        child_tid: r.child_tid,
        how: if r.is_thread != 0 { SpawnHow::Thread } else { SpawnHow::Fork },
        comm: comm(&r.comm),
        filename: None,
    })
}

#[cfg(test)]
mod tests {
    use tracer_common::{
        CallRecord, ExecRecord, ExitRecord, ForkRecord, GoCallRecord, GoReturnRecord, LostSlot, RecordHeader,
        RecordKind, ReturnRecord,
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
        let functions = vec![ProbedFunction {
            name: "fib".into(),
            module: "/bin/fix".into(),
            source: None,
            returns: NativeReturns::ReturnAddress,
        }];
        EventAssembler::new("host".into(), BootClock::with_offset(1_000_000), functions, true)
    }

    /// `f` and `g` (function 0, 64 bytes, and 1), their returns probed at their exits.
    fn exits_assembler() -> EventAssembler {
        let f = |name: &str| ProbedFunction {
            name: name.into(),
            module: "/bin/thrower".into(),
            source: None,
            returns: NativeReturns::AtExits { extent: vec![(0, 64)].into() },
        };
        EventAssembler::new("host".into(), BootClock::with_offset(0), vec![f("f"), f("g")], true)
    }

    /// `main`, `f` and `g` (functions 0, 1, 2), their returns probed by uretprobes.
    fn return_address_assembler() -> EventAssembler {
        let f = |name: &str| ProbedFunction {
            name: name.into(),
            module: "/bin/nested".into(),
            source: None,
            returns: NativeReturns::ReturnAddress,
        };
        EventAssembler::new("host".into(), BootClock::with_offset(0), vec![f("main"), f("f"), f("g")], true)
    }

    /// The events of one record: the unwound returns it revealed, then its own.
    fn events_of(a: &mut EventAssembler, record: &[u8]) -> Vec<Event> {
        let e = a.assemble(record);
        let mut all: Vec<Event> = a.drain_unwound().collect();
        all.extend(e);
        all
    }

    fn returned(e: &Event) -> (&str, u64, Option<u64>, Option<bool>, Option<bool>) {
        match &e.data {
            EventData::Return(r) => (&*r.function, r.retval, r.duration_ns, r.unwound, r.tail_call),
            other => panic!("not a return: {other:?}"),
        }
    }

    #[test]
    fn returns_at_exits_pair_by_stack_position_and_tell_unwound_frames() {
        let mut a = exits_assembler();
        let call = |ts, cookie, sp| CallRecord { header: header(RecordKind::Call, ts, 7), cookie, args: [0; 6], sp };
        let ret = |ts, cookie, retval, sp| ReturnRecord {
            header: header(RecordKind::Return, ts, 7),
            cookie,
            retval,
            rdx: 0,
            sp,
        };
        // f (sp 0x1000) calls g (0x0f00); g throws, f catches and returns 3.
        assert_eq!(events_of(&mut a, &bytes(&call(10, 0, 0x1000))).len(), 1);
        assert_eq!(events_of(&mut a, &bytes(&call(20, 1, 0xf00))).len(), 1);
        let e = events_of(&mut a, &bytes(&ret(50, cookie::ret_site(0, false), 3, 0x1000)));
        assert_eq!(e.len(), 2);
        assert_eq!(returned(&e[0]), ("g", 0, Some(30), Some(true), None));
        assert_eq!((e[0].ts, e[0].tid), (50, 7));
        assert_eq!(returned(&e[1]), ("f", 3, Some(40), None, None));
        // g ends by a tail call, then by a `jmp rax` inside itself (dropped) and one out of it.
        events_of(&mut a, &bytes(&call(60, 1, 0x1000)));
        let e = events_of(&mut a, &bytes(&ret(70, cookie::ret_site(1, true), 99, 0x1000)));
        assert_eq!(returned(&e[0]), ("g", 0, Some(10), None, Some(true)));
        events_of(&mut a, &bytes(&call(80, 1, 0x1000)));
        let inside = ret(85, cookie::ret_site_to(1, 0, 8), 40, 0x1000);
        assert!(events_of(&mut a, &bytes(&inside)).is_empty(), "a jump within the function is no exit");
        let out = ret(90, cookie::ret_site_to(1, 0, 8), 0x5000, 0x1000);
        assert_eq!(returned(&events_of(&mut a, &bytes(&out))[0]), ("g", 0, Some(10), None, Some(true)));
        // The thread exits inside f: f's return comes before the exit.
        events_of(&mut a, &bytes(&call(100, 0, 0x1000)));
        let exit = ExitRecord { header: header(RecordKind::Exit, 120, 7), exit_code: 0, group_dead: 1, comm: [0; 16] };
        let e = events_of(&mut a, &bytes(&exit));
        assert_eq!(returned(&e[0]), ("f", 0, Some(20), Some(true), None));
        assert!(matches!(e[1].data, EventData::Exit(_)));
    }

    /// A call record of function `cookie` on thread 7, its entry at `sp`.
    fn call_at(ts: u64, cookie: u64, sp: u64) -> Vec<u8> {
        bytes(&CallRecord { header: header(RecordKind::Call, ts, 7), cookie, args: [0; 6], sp })
    }

    /// A return record of function `cookie` (a uretprobe's, or a `cookie::ret_site`'s) on thread
    /// 7, with rsp `sp` at the probe.
    fn return_at(ts: u64, cookie: u64, sp: u64) -> Vec<u8> {
        bytes(&ReturnRecord { header: header(RecordKind::Return, ts, 7), cookie, retval: 0, rdx: 0, sp })
    }

    #[test]
    fn a_lost_return_record_leaves_the_enclosing_calls_their_durations() {
        let mut a = return_address_assembler();
        // main (entry rsp 0x1000) calls f (0xf00), which calls g (0xe00); g's return record is
        // lost (the ring buffer was full). A uretprobe's return sees rsp 8 above its entry's.
        for (ts, cookie, sp) in [(10, 0, 0x1000), (20, 1, 0xf00), (30, 2, 0xe00)] {
            assert_eq!(events_of(&mut a, &call_at(ts, cookie, sp)).len(), 1);
        }
        let e = events_of(&mut a, &return_at(60, 1, 0xf08));
        assert_eq!(e.len(), 1, "no return is made up for g: {e:?}");
        assert_eq!(returned(&e[0]), ("f", 0, Some(40), None, None));
        // f again, returning normally, then main: every duration exact.
        events_of(&mut a, &call_at(70, 1, 0xf00));
        assert_eq!(returned(&events_of(&mut a, &return_at(75, 1, 0xf08))[0]), ("f", 0, Some(5), None, None));
        assert_eq!(returned(&events_of(&mut a, &return_at(100, 0, 0x1008))[0]), ("main", 0, Some(90), None, None));
        assert_eq!(a.stacks.depth(7), 0);
        assert_eq!(a.calls_without_return_probe(), 0);
    }

    #[test]
    fn frames_left_by_longjmp_end_as_before_with_either_return_probe() {
        // f (0x1000) calls g (0xf00), which recurses (0xe00) and longjmps back into f; f calls g
        // again, which returns, and f returns.
        let records = |ret_site: fn(u64) -> u64, popped: u64| {
            [
                call_at(10, 0, 0x1000),
                call_at(20, 1, 0xf00),
                call_at(30, 1, 0xe00),
                call_at(50, 1, 0xf00),
                return_at(60, ret_site(1), 0xf00 + popped),
                return_at(70, ret_site(0), 0x1000 + popped),
            ]
        };
        // Returns probed at the exits (as in a program that longjmps): the two g frames the jump
        // left get their returns, innermost first, when g is called again at their position.
        let mut a = exits_assembler();
        let exits = records(|f| cookie::ret_site(f as u32, false), 0);
        let e: Vec<Vec<Event>> = exits.iter().map(|r| events_of(&mut a, r)).collect();
        assert_eq!(e[3].len(), 3);
        assert_eq!(returned(&e[3][0]), ("g", 0, Some(20), Some(true), None));
        assert_eq!(returned(&e[3][1]), ("g", 0, Some(30), Some(true), None));
        assert_eq!((e[3][1].ts, e[3][1].tid), (50, 7));
        assert!(matches!(e[3][2].data, EventData::Call(_)));
        assert_eq!(returned(&e[4][0]), ("g", 0, Some(10), None, None));
        assert_eq!(returned(&e[5][0]), ("f", 0, Some(60), None, None));
        // Uretprobes (`--returns return_address`): the kernel drops the skipped frames' return
        // probes, nothing is made up for them, and the calls around them pair exactly.
        let mut a = EventAssembler::new(
            "host".into(),
            BootClock::with_offset(0),
            ["f", "g"]
                .map(|name| ProbedFunction {
                    name: name.into(),
                    module: "/bin/longjmps".into(),
                    source: None,
                    returns: NativeReturns::ReturnAddress,
                })
                .to_vec(),
            true,
        );
        let e: Vec<Vec<Event>> = records(|f| f, 8).iter().map(|r| events_of(&mut a, r)).collect();
        assert!(e.iter().all(|e| e.len() == 1), "{e:?}");
        assert_eq!(returned(&e[4][0]), ("g", 0, Some(10), None, None));
        assert_eq!(returned(&e[5][0]), ("f", 0, Some(60), None, None));
        assert_eq!(a.stacks.depth(7), 0);
    }

    #[test]
    fn exec_ends_the_old_programs_calls_in_every_stack() {
        let mut a = return_address_assembler();
        events_of(&mut a, &call_at(10, 0, 0x1000));
        let go = GoCallRecord {
            header: header(RecordKind::GoCall, 11, 7),
            cookie: cookie::go(1, false, 152),
            goid: 1,
            stack_depth: 400,
            args: [0; 9],
        };
        events_of(&mut a, &bytes(&go));
        let exec = ExecRecord {
            header: header(RecordKind::Exec, 20, 7),
            old_tid: 7,
            resolve: 0,
            dev: 0,
            ino: 0,
            comm: [0; 16],
            filename: [0; 256],
        };
        assert_eq!(events_of(&mut a, &bytes(&exec)).len(), 1);
        assert_eq!(a.stacks.depth(7), 0);
        assert_eq!(a.go_stacks.depth(100, 1), 0);
        // The new program's first return at the old position pairs with nothing.
        assert_eq!(returned(&events_of(&mut a, &return_at(30, 0, 0x1008))[0]), ("main", 0, None, None, None));
    }

    #[test]
    fn calls_and_returns_get_names_and_durations() {
        let mut a = assembler();
        let call = CallRecord { header: header(RecordKind::Call, 10, 101), cookie: 0, args: [5, 0, 0, 0, 0, 0], sp: 0 };
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
        let ret = ReturnRecord { header: header(RecordKind::Return, 25, 101), cookie: 0, retval: 8, rdx: 0, sp: 8 };
        let e = a.assemble(&bytes(&ret)).unwrap();
        assert_eq!(
            e.data,
            EventData::Return(data::Return {
                function: "fib".into(),
                module: "/bin/fix".into(),
                retval: 8,
                duration_ns: Some(15),
                goid: None,
                ret: None,
                unwound: None,
                tail_call: None,
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
                ret: None,
                unwound: None,
                tail_call: None,
            })
        );
        // Go's calls and returns are lost under the same names as C's.
        assert_eq!(LostSlot::ring_full(RecordKind::GoCall).trace_name(), Some("call"));
        assert_eq!(LostSlot::ring_full(RecordKind::GoReturn).trace_name(), Some("return"));
    }

    #[test]
    fn unknown_cookies_and_bad_records_are_counted() {
        let mut a = assembler();
        let call = CallRecord { header: header(RecordKind::Call, 10, 1), cookie: 9, args: [0; 6], sp: 0 };
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
            resolve: 0,
            dev: 0,
            ino: 0,
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
    fn every_kind_is_lost_under_a_name_of_its_own_event() {
        for &kind in RecordKind::ALL {
            let name = LostSlot::ring_full(kind).trace_name();
            assert!(name.is_some(), "{kind:?} is lost in a slot trace_end does not report");
        }
        assert_eq!(LostSlot::ring_full(RecordKind::UserEvent).trace_name(), Some("log"));
        assert_eq!(LostSlot::UntrackedChild.trace_name(), Some("untraced_children"));
        assert_eq!(LostSlot::TopTooDeep.trace_name(), None);
    }
}
