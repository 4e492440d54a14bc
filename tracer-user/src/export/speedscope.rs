//! speedscope's own file format (`.speedscope.json`), as its published schema
//! (`file-format-schema.json`, from `src/lib/file-format-spec.ts`) defines it:
//!
//! - `shared.frames`: one frame per function and module (`name` the function, `file` the binary or
//!   library it is in; the trace knows no source line), shared by every profile, so speedscope's
//!   Left Heavy and Sandwich views add up every call of a function.
//! - An evented profile per thread (and per goroutine, whose calls nest on it rather than on a
//!   thread), named `PROCESS PID/TID` (`PROCESS PID/goroutine N`), where the process name is its
//!   `comm`, after its host's name in a multi-host trace: each call opens its frame at its start
//!   and closes it at its end, in nanoseconds since the trace began (absolute Unix nanoseconds
//!   would lose precision in JavaScript's doubles).
//!
//! The call slices come from [`crate::analysis::slices`], like every other export. Events must
//! be in time order and nest; slices end in nesting order but a slice whose call line was lost
//! begins only when it ends, so each profile's slices are kept (24 bytes each) and ordered at the
//! end, and a slice is closed no later than the one it nests in.

use std::{
    collections::{BTreeMap, HashMap},
    io::{self, BufWriter, Write},
    sync::Arc,
};

use serde::Serialize;

use crate::{
    analysis::{
        processes::ProcessNames,
        slices::{CallEvent, CallTracker, Calls, Slice},
    },
    event::{Event, TraceEnd, TraceStart, Track},
    sink::Sink,
};

/// A call as the profile keeps it until the end.
#[derive(Clone, Copy)]
struct Kept {
    start: u64,
    end: u64,
    frame: u32,
    depth: u32,
}

#[derive(Serialize)]
struct Frame<'a> {
    name: &'a str,
    file: &'a str,
}

#[derive(Serialize)]
struct FrameEvent {
    #[serde(rename = "type")]
    kind: &'static str,
    frame: u32,
    at: u64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Profile<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'a str,
    unit: &'static str,
    start_value: u64,
    end_value: u64,
    events: Vec<FrameEvent>,
}

/// Writes a speedscope file at the end of the trace; a [`Sink`].
pub struct SpeedscopeWriter<W: Write> {
    out: BufWriter<W>,
    calls: CallTracker,
    profiles: Profiles,
}

/// The calls kept for the profiles, and the names they are shown with.
#[derive(Default)]
struct Profiles {
    names: ProcessNames,
    start_ts: u64,
    /// Each frame's index, by (function, module).
    frame_index: HashMap<(Arc<str>, Arc<str>), u32>,
    frames: Vec<(Arc<str>, Arc<str>)>,
    /// Each track's calls and its name as it was when its first call ended.
    tracks: BTreeMap<(u32, Track), (String, Vec<Kept>)>,
}

impl<W: Write> SpeedscopeWriter<W> {
    pub fn new(out: W) -> Self {
        SpeedscopeWriter {
            out: BufWriter::with_capacity(1 << 20, out),
            calls: CallTracker::default(),
            profiles: Profiles::default(),
        }
    }
}

impl Profiles {
    fn frame(&mut self, function: &Arc<str>, module: &Arc<str>) -> u32 {
        let next = self.frames.len() as u32;
        *self.frame_index.entry((function.clone(), module.clone())).or_insert_with(|| {
            self.frames.push((function.clone(), module.clone()));
            next
        })
    }
}

/// A profile's open and close events: its calls in order of start (outer first), each closed
/// before the next one that does not nest in it opens, and no later than its caller.
fn frame_events(mut calls: Vec<Kept>) -> Vec<FrameEvent> {
    calls.sort_by_key(|c| (c.start, c.depth));
    let mut events = Vec::with_capacity(calls.len() * 2);
    let mut open: Vec<Kept> = Vec::new();
    let close =
        |events: &mut Vec<FrameEvent>, c: Kept, at: u64| events.push(FrameEvent { kind: "C", frame: c.frame, at });
    for mut c in calls {
        while let Some(&top) = open.last() {
            if top.depth < c.depth && top.end > c.start {
                break;
            }
            open.pop();
            close(&mut events, top, top.end.min(c.start));
        }
        if let Some(top) = open.last() {
            c.end = c.end.min(top.end);
        }
        events.push(FrameEvent { kind: "O", frame: c.frame, at: c.start });
        open.push(c);
    }
    while let Some(top) = open.pop() {
        close(&mut events, top, top.end);
    }
    events
}

impl Profiles {
    /// Keeps each call that ended.
    fn keep_all(&mut self, mut calls: Calls) {
        while let Some(c) = calls.next() {
            if let CallEvent::End(slice) = c {
                self.keep(&slice);
            }
        }
    }

    fn keep(&mut self, slice: &Slice) {
        let frame = self.frame(&slice.frame.function, &slice.frame.module);
        let kept = Kept {
            start: slice.frame.start.saturating_sub(self.start_ts),
            end: slice.end.saturating_sub(self.start_ts),
            frame,
            depth: slice.callers.len() as u32,
        };
        let key = (slice.pid, slice.track);
        if !self.tracks.contains_key(&key) {
            let process = self.names.get(slice.pid).unwrap_or("?");
            let name = match slice.track {
                Track::Thread(tid) => format!("{process} {}/{tid}", slice.pid),
                Track::Goroutine(goid) => format!("{process} {}/goroutine {goid}", slice.pid),
            };
            self.tracks.insert(key, (name, Vec::new()));
        }
        self.tracks.get_mut(&key).expect("inserted above").1.push(kept);
    }
}

impl<W: Write> Sink for SpeedscopeWriter<W> {
    fn begin(&mut self, start: &TraceStart) -> io::Result<()> {
        self.profiles.start_ts = start.ts;
        self.profiles.names.begin(start);
        Ok(())
    }

    fn event(&mut self, e: &Event) -> io::Result<()> {
        self.profiles.names.event(e);
        self.profiles.keep_all(self.calls.event(e));
        Ok(())
    }

    fn end(&mut self, end: &TraceEnd) -> io::Result<()> {
        self.profiles.keep_all(self.calls.finish(end.ts));
        let frames: Vec<Frame> = self.profiles.frames.iter().map(|(name, file)| Frame { name, file }).collect();
        let out = &mut self.out;
        write!(out, "{{\"$schema\":\"https://www.speedscope.app/file-format-schema.json\",\"shared\":{{\"frames\":")?;
        serde_json::to_writer(&mut *out, &frames)?;
        write!(out, "}},\"profiles\":[")?;
        for (i, (name, calls)) in std::mem::take(&mut self.profiles.tracks).into_values().enumerate() {
            let events = frame_events(calls);
            let profile = Profile {
                kind: "evented",
                name: &name,
                unit: "nanoseconds",
                start_value: events.first().map_or(0, |e| e.at),
                end_value: events.last().map_or(0, |e| e.at),
                events,
            };
            if i > 0 {
                out.write_all(b",")?;
            }
            serde_json::to_writer(&mut *out, &profile)?;
        }
        let exporter = format!("tracer {}", env!("CARGO_PKG_VERSION"));
        write!(out, "],\"name\":\"tracer trace\",\"activeProfileIndex\":0,\"exporter\":")?;
        serde_json::to_writer(&mut *out, &exporter)?;
        writeln!(out, "}}")?;
        out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::test_events::{call, end, go_call, go_ret, ret, start};
    use serde_json::{Value, json};

    fn export(events: &[Event], end_ts: u64) -> Value {
        let mut out = Vec::new();
        let mut w = SpeedscopeWriter::new(&mut out);
        w.begin(&start(0)).unwrap();
        for e in events {
            w.event(e).unwrap();
        }
        w.end(&end(end_ts)).unwrap();
        drop(w);
        serde_json::from_slice(&out).expect("JSON")
    }

    #[test]
    fn calls_are_open_and_close_events_on_shared_frames() {
        let file = export(
            &[
                call(100, 1, "main"),
                call(200, 1, "work"),
                ret(300, 1, "work", Some(100)),
                call(400, 1, "work"),
                ret(450, 1, "work", Some(50)),
                // Its call line was lost: it begins (at 200) after calls that came later.
                ret(250, 2, "lost_call", Some(50)),
                go_call(500, 1, 9, "main.blocker"),
                go_ret(600, 2, 9, "main.blocker", 100),
            ],
            1000,
        );
        assert_eq!(file["$schema"], "https://www.speedscope.app/file-format-schema.json");
        assert_eq!(
            file["shared"]["frames"],
            json!([
                {"name": "work", "file": "/bin/app"},
                {"name": "lost_call", "file": "/bin/app"},
                {"name": "main.blocker", "file": "/bin/gof"},
                {"name": "main", "file": "/bin/app"},
            ])
        );
        let o = |frame, at| json!({"type": "O", "frame": frame, "at": at});
        let c = |frame, at| json!({"type": "C", "frame": frame, "at": at});
        assert_eq!(
            file["profiles"],
            json!([
                {
                    "type": "evented", "name": "app 1/1", "unit": "nanoseconds", "startValue": 100, "endValue": 1000,
                    "events": [o(3, 100), o(0, 200), c(0, 300), o(0, 400), c(0, 450), c(3, 1000)],
                },
                {
                    "type": "evented", "name": "app 1/2", "unit": "nanoseconds", "startValue": 200, "endValue": 250,
                    "events": [o(1, 200), c(1, 250)],
                },
                {
                    "type": "evented", "name": "app 1/goroutine 9", "unit": "nanoseconds", "startValue": 500,
                    "endValue": 600, "events": [o(2, 500), c(2, 600)],
                },
            ])
        );
        assert_eq!(file["activeProfileIndex"], 0);
    }

    #[test]
    fn events_nest_and_stay_in_time_order_whatever_the_slices_say() {
        let kept = |start, end, frame, depth| Kept { start, end, frame, depth };
        // A callee that outlives its caller is closed with it; siblings that overlap are cut.
        let events = frame_events(vec![kept(10, 50, 0, 0), kept(20, 60, 1, 1), kept(40, 45, 2, 1), kept(30, 35, 3, 2)]);
        let got: Vec<_> = events.iter().map(|e| (e.kind, e.frame, e.at)).collect();
        assert_eq!(
            got,
            [
                ("O", 0, 10),
                ("O", 1, 20),
                ("O", 3, 30),
                ("C", 3, 35),
                ("C", 1, 40),
                ("O", 2, 40),
                ("C", 2, 45),
                ("C", 0, 50)
            ]
        );
    }
}
