//! Builders of events and trace ends for unit tests, in one place so that every module's tests
//! speak of the same process: host `h`, pid 1 (`app`, running `/bin/app`), unless a test says
//! otherwise.

use super::*;

/// A trace's first line: host `h`, one target (`app`, pid 1, running `/bin/app`), every event kind.
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
        aliases: Default::default(),
        hosts: vec![],
        machine: None,
        kernel: None,
    }
}

/// Ends with three lost calls, so that exports show that they carry the losses.
pub fn end(ts: u64) -> TraceEnd {
    let mut end = TraceEnd::new(ts, EndReason::TargetsExited, 0);
    end.lost_events.insert("call".to_string(), 3);
    end
}

/// An event of `host`.
pub fn event_on(host: &str, ts: u64, pid: u32, tid: u32, data: EventData) -> Event {
    Event { ts, host: host.into(), pid, tid, data }
}

/// An event of host `h`.
pub fn ev(ts: u64, pid: u32, tid: u32, data: EventData) -> Event {
    event_on("h", ts, pid, tid, data)
}

/// A call of `f` in `/bin/app` by thread `tid` of pid 1; its first argument is `ts` and its last
/// has every bit set (so that exports show how they print a full register).
pub fn call(ts: u64, tid: u32, f: &str) -> Event {
    ev(
        ts,
        1,
        tid,
        EventData::Call(data::Call {
            function: f.into(),
            module: "/bin/app".into(),
            args: [ts, 0, 0, 0, 0, u64::MAX].into(),
            goid: None,
            params: Default::default(),
            file: None,
            line: None,
        }),
    )
}

/// The return of `f` (see [`call`]), with 7.
pub fn ret(ts: u64, tid: u32, f: &str, dur: Option<u64>) -> Event {
    ev(
        ts,
        1,
        tid,
        EventData::Return(data::Return {
            function: f.into(),
            module: "/bin/app".into(),
            retval: 7,
            duration_ns: dur,
            goid: None,
            ret: None,
            unwound: None,
            tail_call: None,
        }),
    )
}

/// A call of `f` in module `m` by thread `tid` of `pid`, every argument 0 (a second process
/// beside [`call`]'s).
pub fn call_in(ts: u64, pid: u32, tid: u32, f: &str) -> Event {
    ev(
        ts,
        pid,
        tid,
        EventData::Call(data::Call {
            function: f.into(),
            module: "m".into(),
            args: [0; 6].into(),
            goid: None,
            params: Default::default(),
            file: None,
            line: None,
        }),
    )
}

/// The return of `f` (see [`call_in`]), with 0.
pub fn ret_in(ts: u64, pid: u32, tid: u32, f: &str, dur: Option<u64>) -> Event {
    ev(
        ts,
        pid,
        tid,
        EventData::Return(data::Return {
            function: f.into(),
            module: "m".into(),
            retval: 0,
            duration_ns: dur,
            goid: None,
            ret: None,
            unwound: None,
            tail_call: None,
        }),
    )
}

/// A Go call of goroutine `goid`, on thread `tid`.
pub fn go_call(ts: u64, tid: u32, goid: u64, f: &str) -> Event {
    ev(
        ts,
        1,
        tid,
        EventData::Call(data::Call {
            function: f.into(),
            module: "/bin/gof".into(),
            args: [ts].into(),
            goid: Some(goid),
            params: Default::default(),
            file: None,
            line: None,
        }),
    )
}

/// The return of a Go call (see [`go_call`]), with 7.
pub fn go_ret(ts: u64, tid: u32, goid: u64, f: &str, dur: u64) -> Event {
    ev(
        ts,
        1,
        tid,
        EventData::Return(data::Return {
            function: f.into(),
            module: "/bin/gof".into(),
            retval: 7,
            duration_ns: Some(dur),
            goid: Some(goid),
            ret: None,
            unwound: None,
            tail_call: None,
        }),
    )
}

/// Thread `tid` of pid 1 exits with 0.
pub fn thread_exit(ts: u64, tid: u32) -> Event {
    ev(ts, 1, tid, EventData::Exit(data::Exit { exit_code: Some(0), signal: None, thread: true, comm: String::new() }))
}

/// A `log` event of thread `tid` of pid 1 (a `tracing` event of `src/main.rs:12` in `app`),
/// from `source` if one is given, with `data` (`null` for none).
pub fn log(ts: u64, tid: u32, level: Level, source: Option<&str>, message: &str, data: serde_json::Value) -> Event {
    ev(
        ts,
        1,
        tid,
        EventData::Log(data::Log {
            log_type: LogType::Log,
            level,
            source: source.map(str::to_string),
            message: message.into(),
            function: Some("app".into()),
            file: Some("src/main.rs".into()),
            line: Some(12),
            spans: vec![],
            data,
            truncated: false,
        }),
    )
}

/// A `usdt` event of `provider:name` in `/bin/app`, fired by thread `tid` of pid 1.
pub fn usdt(ts: u64, tid: u32, provider: &str, name: &str, args: Vec<Option<ArgValue>>) -> Event {
    ev(
        ts,
        1,
        tid,
        EventData::Usdt(data::Usdt { provider: provider.into(), name: name.into(), module: "/bin/app".into(), args }),
    )
}
