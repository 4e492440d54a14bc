//! The native format (`.trc`, laid out in [`crate::export::native`]): reading it back, one batch
//! at a time.

use std::{
    io::{self, Read},
    sync::Arc,
};

use super::{ItemReader, Misplaced, ReadError};
use crate::{
    event::{Args, Event, EventData, Interner, MAX_ARGS, TraceItem, data, json, set_name},
    export::native::{
        Context, DURATION, END, EVENTS, GOID, KIND_CALL, KIND_MASK, KIND_OTHER, KIND_RETURN, MAGIC, MAX_BATCH_BYTES,
        MAX_STRING_BYTES, MAX_TABLE_BYTES, NEW_HOST, SAME_NAMES, SAME_THREAD, START, VERSION, unzigzag,
    },
};

/// Whether a file starts like a native trace.
pub fn is_native(head: &[u8]) -> bool {
    head.starts_with(MAGIC)
}

/// Reads a native trace one batch at a time (memory holds one batch and the string table).
pub struct NativeReader<R: Read> {
    input: R,
    header_read: bool,
    batch: u64,
    strings: Vec<Arc<str>>,
    table_bytes: usize,
    interner: Interner,
    /// The batch of events being decoded (boxed: it holds three events).
    current: Box<Batch>,
    payload: Vec<u8>,
    torn: Option<String>,
    done: bool,
}

/// Why a native trace's header was refused.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    #[error("it does not start with the native magic")]
    NoMagic,
    #[error("native format version {0}, this tracer reads {VERSION}")]
    Version(u32),
}

/// What is wrong inside one batch of a native trace. Each is the whole sentence: a cause (the
/// JSON or postcard error) is said in it, not again as a source.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("an empty batch")]
    Empty,
    #[error("unknown batch kind {0}")]
    UnknownKind(u8),
    #[error("its JSON is not UTF-8")]
    JsonNotUtf8,
    #[error("{0}")]
    Line(json::ParseError),
    #[error("its JSON line is not of the batch's kind")]
    LineOfAnotherKind,
    #[error("{count} events claimed in {bytes} bytes")]
    EventsClaimed { count: u64, bytes: usize },
    #[error("{0} bytes after the last event")]
    BytesAfterLastEvent(usize),
    #[error("{count} strings claimed in {bytes} bytes")]
    StringsClaimed { count: u64, bytes: usize },
    #[error("a string of {0} bytes, more than {MAX_STRING_BYTES}")]
    LongString(u64),
    #[error("a string is not UTF-8")]
    StringNotUtf8,
    #[error("the string table grows past {MAX_TABLE_BYTES} bytes")]
    TableFull,
    #[error("string number {0} was never defined")]
    UndefinedString(u32),
    #[error("the batch ends inside an event")]
    EndsInsideAnEvent,
    #[error("a number is longer than 64 bits")]
    LongNumber,
    #[error("{what} {value} is more than 32 bits")]
    Over32Bits { what: &'static str, value: u64 },
    #[error("a string runs past its batch")]
    StringPastBatch,
    #[error("an event names no host")]
    NoHost,
    #[error("an event on the same thread as none")]
    NoThread,
    #[error("tag {0:#x} has flags its kind does not")]
    FlagsOfAnotherKind(u8),
    #[error("a {0} with the same names as none")]
    SameNamesAsNone(&'static str),
    #[error("argument spec {0:#x} is out of range")]
    ArgumentSpec(u64),
    #[error("a call with a duration")]
    CallWithDuration,
    #[error("an event does not decode: {0}")]
    Postcard(postcard::Error),
    #[error("a call or return encoded as another kind")]
    PlainCallAsAnotherKind,
    #[error("unknown event kind {0}")]
    UnknownEventKind(u8),
    #[error("{0}")]
    Misplaced(Misplaced),
}

/// A bounds-checked cursor over one batch's payload.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn byte(&mut self) -> Result<u8, BatchError> {
        let b = *self.bytes.get(self.pos).ok_or(BatchError::EndsInsideAnEvent)?;
        self.pos += 1;
        Ok(b)
    }

    /// A LEB128 number; one that fits in a byte (a flag, a name's number, a small delta) without
    /// the loop.
    #[inline]
    fn varint(&mut self) -> Result<u64, BatchError> {
        match self.bytes.get(self.pos) {
            Some(&b) if b < 0x80 => {
                self.pos += 1;
                Ok(b as u64)
            }
            _ => self.long_varint(),
        }
    }

    fn long_varint(&mut self) -> Result<u64, BatchError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            if shift == 63 && b > 1 {
                return Err(BatchError::LongNumber);
            }
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(BatchError::LongNumber)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, BatchError> {
        let v = self.varint()?;
        u32::try_from(v).map_err(|_| BatchError::Over32Bits { what, value: v })
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], BatchError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or(BatchError::StringPastBatch)?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn left(&self) -> usize {
        self.bytes.len() - self.pos
    }
}

impl<R: Read> NativeReader<R> {
    pub fn new(input: R) -> Self {
        NativeReader {
            input,
            header_read: false,
            batch: 0,
            strings: Vec::new(),
            table_bytes: 0,
            interner: Interner::default(),
            current: Box::default(),
            payload: Vec::new(),
            torn: None,
            done: false,
        }
    }

    /// Batches read so far.
    pub fn batches(&self) -> u64 {
        self.batch
    }

    fn malformed(&self, problem: BatchError) -> ReadError {
        ReadError::Batch { batch: self.batch, problem }
    }

    /// Reads exactly `buf.len()` bytes; `Ok(false)` on a clean end of file before any of them.
    fn read_full(&mut self, buf: &mut [u8]) -> Result<usize, io::Error> {
        let mut got = 0;
        while got < buf.len() {
            match self.input.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(got)
    }

    fn read_header(&mut self) -> Result<(), ReadError> {
        let mut header = [0u8; 12];
        let got = self.read_full(&mut header)?;
        if got == 0 {
            return Err(ReadError::Empty);
        }
        if got < 12 || !is_native(&header) {
            return Err(ReadError::Header(HeaderError::NoMagic));
        }
        let version = u32::from_le_bytes(header[8..].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(ReadError::Header(HeaderError::Version(version)));
        }
        Ok(())
    }

    /// Reads the next batch's payload; `None` at the end of the file or at a torn batch.
    fn next_payload(&mut self) -> Result<Option<()>, ReadError> {
        let mut frame = [0u8; 8];
        let got = self.read_full(&mut frame)?;
        if got == 0 {
            return Ok(None);
        }
        let batch = self.batch + 1;
        if got < 8 {
            self.torn = Some(format!("batch {batch} is cut short in its frame"));
            return Ok(None);
        }
        let len = u32::from_le_bytes(frame[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(frame[4..].try_into().expect("4 bytes"));
        if len > MAX_BATCH_BYTES {
            self.torn = Some(format!("batch {batch} claims {len} bytes, more than {MAX_BATCH_BYTES}"));
            return Ok(None);
        }
        let mut payload = std::mem::take(&mut self.payload);
        payload.resize(len, 0);
        let got = self.read_full(&mut payload)?;
        self.payload = payload;
        if got < len {
            self.torn = Some(format!("batch {batch} is cut short ({got} of {len} bytes)"));
            return Ok(None);
        }
        if crc32fast::hash(&self.payload) != crc {
            self.torn = Some(format!("batch {batch} fails its checksum"));
            return Ok(None);
        }
        self.batch = batch;
        Ok(Some(()))
    }

    /// Starts on the payload just read: a `trace_start` or `trace_end` is returned, a batch of
    /// events has its strings added to the table and becomes the current one.
    fn start_payload(&mut self) -> Result<Option<TraceItem>, ReadError> {
        let payload = std::mem::take(&mut self.payload);
        let result = self.start_payload_in(&payload);
        self.payload = payload;
        result.map_err(|m| self.malformed(m))
    }

    fn start_payload_in(&mut self, payload: &[u8]) -> Result<Option<TraceItem>, BatchError> {
        let (&kind, rest) = payload.split_first().ok_or(BatchError::Empty)?;
        match kind {
            START | END => {
                let text = std::str::from_utf8(rest).map_err(|_| BatchError::JsonNotUtf8)?;
                let item = json::parse_line(text, &mut self.interner).map_err(BatchError::Line)?;
                match (&item, kind) {
                    (TraceItem::Start(_), START) | (TraceItem::End(_), END) => Ok(Some(item)),
                    _ => Err(BatchError::LineOfAnotherKind),
                }
            }
            EVENTS => {
                let mut c = Cursor { bytes: payload, pos: 1 };
                self.read_strings(&mut c)?;
                let count = c.varint()?;
                // Each event takes at least two bytes.
                if count > c.left() as u64 / 2 {
                    return Err(BatchError::EventsClaimed { count, bytes: c.left() });
                }
                if count == 0 && c.left() != 0 {
                    return Err(BatchError::BytesAfterLastEvent(c.left()));
                }
                *self.current = Batch { pos: c.pos, left: count, ..Batch::default() };
                Ok(None)
            }
            other => Err(BatchError::UnknownKind(other)),
        }
    }

    fn read_strings(&mut self, c: &mut Cursor) -> Result<(), BatchError> {
        let count = c.varint()?;
        // Each string takes at least one byte: a count larger than the batch is a lie.
        if count > c.left() as u64 {
            return Err(BatchError::StringsClaimed { count, bytes: c.left() });
        }
        for _ in 0..count {
            let len = c.varint()?;
            if len > MAX_STRING_BYTES as u64 {
                return Err(BatchError::LongString(len));
            }
            let bytes = c.take(len as usize)?;
            let s = std::str::from_utf8(bytes).map_err(|_| BatchError::StringNotUtf8)?;
            if self.table_bytes + s.len() > MAX_TABLE_BYTES {
                return Err(BatchError::TableFull);
            }
            self.table_bytes += s.len();
            self.strings.push(Arc::from(s));
        }
        Ok(())
    }

    /// Reads up to the next item: a batch of events with events left, a start or end, or the end
    /// of the file (or a torn batch).
    fn step(&mut self) -> Result<Step, ReadError> {
        loop {
            if self.current.left > 0 {
                return Ok(Step::Events);
            }
            if self.done {
                return Ok(Step::Done);
            }
            if !self.header_read {
                self.read_header()?;
                self.header_read = true;
            }
            if self.next_payload()?.is_none() {
                self.done = true;
                return Ok(Step::Done);
            }
            if let Some(item) = self.start_payload()? {
                return Ok(Step::Item(Box::new(item)));
            }
        }
    }

    /// Decodes the batch's next event (there is one: `current.left > 0`).
    fn next_event(&mut self) -> Result<&Event, ReadError> {
        match decode_event(&self.payload, &mut self.current, &self.strings) {
            Ok(e) => Ok(e),
            Err(problem) => Err(ReadError::Batch { batch: self.batch, problem }),
        }
    }

    fn fail(&mut self, e: ReadError) -> Option<Result<TraceItem, ReadError>> {
        self.done = true;
        self.current.left = 0;
        Some(Err(e))
    }
}

/// What [`NativeReader::step`] found next.
enum Step {
    Events,
    /// Boxed: a start is large, and rare.
    Item(Box<TraceItem>),
    Done,
}

/// Where the reader is in a batch of events, and what its next event is encoded against.
struct Batch {
    /// Of the next event, in the payload.
    pos: usize,
    /// Events not yet decoded.
    left: u64,
    cx: Context,
    host: Option<Arc<str>>,
    names: Option<(Arc<str>, Arc<str>)>,
    /// The last call decoded, overwritten by the next one.
    call: Event,
    /// The last return decoded, overwritten by the next one.
    ret: Event,
    /// The last event of another kind.
    other: Option<Event>,
}

impl Default for Batch {
    fn default() -> Self {
        let empty: Arc<str> = Arc::from("");
        let event = |data| Event { ts: 0, host: empty.clone(), pid: 0, tid: 0, data };
        Batch {
            pos: 0,
            left: 0,
            cx: Context::default(),
            host: None,
            names: None,
            call: event(EventData::Call(data::Call {
                function: empty.clone(),
                module: empty.clone(),
                args: Args::default(),
                goid: None,
                params: data::Params::default(),
                file: None,
                line: None,
            })),
            ret: event(EventData::Return(data::Return {
                function: empty.clone(),
                module: empty.clone(),
                retval: 0,
                duration_ns: None,
                goid: None,
                ret: None,
                unwound: None,
                tail_call: None,
            })),
            other: None,
        }
    }
}

fn string(strings: &[Arc<str>], n: u32) -> Result<Arc<str>, BatchError> {
    strings.get(n as usize).cloned().ok_or(BatchError::UndefinedString(n))
}

/// Decodes one event of a batch, at `batch.pos` in `payload`; the last one must end the payload.
///
/// Calls and returns are decoded in place into the batch's reusable [`Batch::call`] and
/// [`Batch::ret`]: an event is large, and building and moving one per event was a fifth of
/// `report`'s time on a compact trace.
fn decode_event<'b>(payload: &[u8], batch: &'b mut Batch, strings: &[Arc<str>]) -> Result<&'b Event, BatchError> {
    let c = &mut Cursor { bytes: payload, pos: batch.pos };
    let cx = &mut batch.cx;
    let tag = c.byte()?;
    if tag & NEW_HOST != 0 {
        batch.host = Some(string(strings, c.u32("a host number")?)?);
    }
    let host = batch.host.as_ref().ok_or(BatchError::NoHost)?;
    let ts = cx.ts.wrapping_add(unzigzag(c.varint()?) as u64);
    cx.ts = ts;
    if tag & SAME_THREAD == 0 {
        cx.thread = Some((c.u32("a pid")?, c.u32("a tid")?));
    }
    let (pid, tid) = cx.thread.ok_or(BatchError::NoThread)?;
    let kind = tag & KIND_MASK;
    if kind == KIND_CALL || kind == KIND_RETURN {
        if tag & SAME_NAMES == 0 {
            let function = string(strings, c.u32("a function number")?)?;
            let module = string(strings, c.u32("a module number")?)?;
            batch.names = Some((function, module));
        }
    } else if tag & (SAME_NAMES | DURATION | GOID) != 0 {
        return Err(BatchError::FlagsOfAnotherKind(tag));
    }
    let event = match kind {
        KIND_CALL => {
            let (function, module) = batch.names.as_ref().ok_or(BatchError::SameNamesAsNone("call"))?;
            let spec = c.varint()?;
            let len = (spec & 0xf) as usize;
            let mask = spec >> 4;
            if len > MAX_ARGS || mask >> len != 0 {
                return Err(BatchError::ArgumentSpec(spec));
            }
            let prev = cx.args.of(tid);
            for (i, p) in prev.iter_mut().take(len).enumerate() {
                if mask & (1 << i) != 0 {
                    *p = p.wrapping_add(unzigzag(c.varint()?) as u64);
                }
            }
            let goid = if tag & GOID != 0 { Some(c.varint()?) } else { None };
            if tag & DURATION != 0 {
                return Err(BatchError::CallWithDuration);
            }
            let event = &mut batch.call;
            // Every field is named: the slot's others stay empty (a plain call's).
            let EventData::Call(data::Call {
                function: slot_function,
                module: slot_module,
                args: slot_args,
                goid: slot_goid,
                params: _,
                file: _,
                line: _,
            }) = &mut event.data
            else {
                unreachable!("the call slot holds a call")
            };
            set_name(slot_function, function);
            set_name(slot_module, module);
            *slot_args = Args::new(&prev[..len]);
            *slot_goid = goid;
            event
        }
        KIND_RETURN => {
            let (function, module) = batch.names.as_ref().ok_or(BatchError::SameNamesAsNone("return"))?;
            let retval = unzigzag(c.varint()?) as u64;
            let duration_ns = if tag & DURATION != 0 { Some(c.varint()?) } else { None };
            let goid = if tag & GOID != 0 { Some(c.varint()?) } else { None };
            let event = &mut batch.ret;
            // Every field is named: the slot's others stay empty (a plain return's).
            let EventData::Return(data::Return {
                function: slot_function,
                module: slot_module,
                retval: slot_retval,
                duration_ns: slot_duration,
                goid: slot_goid,
                ret: _,
                unwound: _,
                tail_call: _,
            }) = &mut event.data
            else {
                unreachable!("the return slot holds a return")
            };
            set_name(slot_function, function);
            set_name(slot_module, module);
            *slot_retval = retval;
            *slot_duration = duration_ns;
            *slot_goid = goid;
            event
        }
        KIND_OTHER => {
            let (wire, rest) =
                postcard::take_from_bytes::<EventData<u32>>(&c.bytes[c.pos..]).map_err(BatchError::Postcard)?;
            c.pos = c.bytes.len() - rest.len();
            let data = wire.map_names(|n| string(strings, n))?;
            if data.is_plain_call() {
                return Err(BatchError::PlainCallAsAnotherKind);
            }
            batch.other = Some(Event { ts, host: host.clone(), pid, tid, data });
            batch.other.as_mut().expect("just set")
        }
        other => return Err(BatchError::UnknownEventKind(other)),
    };
    event.ts = ts;
    set_name(&mut event.host, host);
    event.pid = pid;
    event.tid = tid;
    batch.pos = c.pos;
    batch.left -= 1;
    if batch.left == 0 && c.left() != 0 {
        return Err(BatchError::BytesAfterLastEvent(c.left()));
    }
    Ok(event)
}

impl<R: Read> ItemReader for NativeReader<R> {
    fn torn(&self) -> Option<String> {
        self.torn.clone()
    }
    fn error_here(&self, misplaced: Misplaced) -> ReadError {
        self.malformed(BatchError::Misplaced(misplaced))
    }

    /// Decodes each event straight into `each`: no item is built or moved for it.
    fn feed_events(&mut self, each: &mut dyn FnMut(&Event) -> io::Result<()>) -> Option<Result<TraceItem, ReadError>> {
        loop {
            match self.step() {
                Ok(Step::Events) => {
                    while self.current.left > 0 {
                        match self.next_event() {
                            Ok(e) => {
                                if let Err(e) = each(e) {
                                    return self.fail(ReadError::Write(e));
                                }
                            }
                            Err(e) => return self.fail(e),
                        }
                    }
                }
                Ok(Step::Item(item)) => return Some(Ok(*item)),
                Ok(Step::Done) => return None,
                Err(e) => return self.fail(e),
            }
        }
    }
}

impl<R: Read> Iterator for NativeReader<R> {
    type Item = Result<TraceItem, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.step() {
            Ok(Step::Events) => match self.next_event() {
                Ok(e) => Some(Ok(TraceItem::Event(e.clone()))),
                Err(e) => self.fail(e),
            },
            Ok(Step::Item(item)) => Some(Ok(*item)),
            Ok(Step::Done) => None,
            Err(e) => self.fail(e),
        }
    }
}
