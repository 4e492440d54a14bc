//! What a program says about itself, in the trace `tracer` records of it.
//!
//! Each call here becomes an event in the same time-ordered trace as the program's function
//! calls, spawns and messages, with its level, message, source, function, file, line and data.
//! It costs one counter check when no tracer is attached: every entry point is a USDT probe
//! with a semaphore, which the kernel raises while a tracer listens, and nothing is formatted or
//! encoded until it does. The tracer finds the probe by itself (the ELF note
//! `tracer_events:event`) in every executable and library of the processes it traces.
//!
//! ```
//! use serde::Serialize;
//!
//! #[derive(Serialize)]
//! struct Batch {
//!     id: u64,
//!     items: usize,
//! }
//!
//! tracer_events::print("Another message");
//! tracer_events::print_with_data(&Batch { id: 7, items: 3 }, "batch done");
//! let count = 42;
//! // Neither the message nor the data are built unless a tracer listens.
//! tracer_events::printf!("Count is: {}", count);
//! tracer_events::printf_with_data!(Batch { id: 8, items: count }, "Count is: {count}");
//! if tracer_events::listening() {
//!     // Something expensive to compute, only for the trace.
//! }
//! ```
//!
//! With the `tracing` feature, [`TraceLayer`] turns every `tracing` event into a trace event
//! (level, target as source, message, module path, file, line, the other fields as data, and the
//! names of the spans it happened in); with the `log` feature, [`TraceLogger`] does the same for
//! the `log` crate. C and C++ programs include `tracer_events.h`, shipped with this crate in
//! `include/`, which needs nothing but a C compiler.
//!
//! On anything but x86-64 Linux the functions compile to nothing and [`listening`] is false.
//!
//! # What the tracer receives
//!
//! One payload per event, encoded as [`payload`] describes, of which the tracer keeps at most
//! 4096 bytes: a longer event arrives cut, and marked as cut. `print` and `printf!` events have
//! type `trace` and level `info`; a logger's have type `log` and the record's level. For Rust,
//! the `function` of an event is its module path (Rust has no macro for a function's name).

pub mod payload;
mod probe;

#[cfg(feature = "tracing")]
mod layer;
#[cfg(feature = "log")]
mod logger;

use std::{cell::RefCell, fmt, panic::Location};

#[cfg(feature = "tracing")]
pub use layer::TraceLayer;
#[cfg(feature = "log")]
pub use logger::TraceLogger;
use payload::{Kind, Level, Payload};
pub use probe::listening;
use serde::Serialize;

thread_local! {
    /// Reused for every event of a thread, so that a traced event costs no allocation.
    static BUFFER: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(512));
}

/// Encodes `payload` and fires the probe.
pub(crate) fn emit(payload: &Payload<'_>) {
    let fire = |buffer: &mut Vec<u8>| {
        buffer.clear();
        payload.encode(buffer);
        probe::fire(buffer);
    };
    // An event made while encoding another (from a `Serialize` impl) gets a buffer of its own.
    let reused = BUFFER.try_with(|b| b.try_borrow_mut().map(|mut b| fire(&mut b)).is_ok());
    if reused != Ok(true) {
        fire(&mut Vec::new());
    }
}

/// `data` as JSON text (for `printf_with_data!`; not part of the API). Data that cannot be written as JSON (a map with non-string keys, a
/// `Serialize` impl that fails) becomes a JSON string saying why, rather than vanishing.
#[doc(hidden)]
pub fn to_json<T: Serialize + ?Sized>(data: &T) -> String {
    serde_json::to_string(data)
        .unwrap_or_else(|e| serde_json::Value::String(format!("<data not serializable: {e}>")).to_string())
}

fn emit_trace(message: &str, data: &str, function: &str, file: &str, line: u32) {
    emit(&Payload {
        kind: Some(Kind::Trace),
        level: Some(Level::Info),
        function,
        file,
        line,
        message,
        data,
        ..Payload::default()
    });
}

/// The out-of-line half of `print` and `print_with_data`: only called while a tracer listens, so
/// that the callers' inlined half is the semaphore check alone.
#[cold]
#[inline(never)]
fn print_at(message: &str, data: &str, at: &Location<'_>) {
    emit_trace(message, data, "", at.file(), at.line());
}

/// Adds an event with this message to the trace (file and line are the caller's). The message is
/// built by the caller whether or not a tracer listens; [`printf!`] builds it only if one does.
///
/// ```
/// tracer_events::print("cache warmed");
/// ```
#[inline]
#[track_caller]
pub fn print(message: &str) {
    if listening() {
        print_at(message, "", Location::caller());
    }
}

/// Adds an event with this message and `data` (anything `Serialize`, recorded as JSON). The data
/// is serialized only if a tracer listens.
///
/// ```
/// use std::collections::BTreeMap;
///
/// let sizes = BTreeMap::from([("small", 3), ("large", 1)]);
/// tracer_events::print_with_data(&sizes, "sorted the batch");
/// ```
#[inline]
#[track_caller]
pub fn print_with_data<T: Serialize + ?Sized>(data: &T, message: &str) {
    if listening() {
        print_at(message, &to_json(data), Location::caller());
    }
}

/// Adds an event whose message is formatted like `format!`, only if a tracer listens (the
/// arguments are not evaluated otherwise).
///
/// ```
/// let (done, total) = (3, 10);
/// tracer_events::printf!("{done} of {total} done");
/// ```
#[macro_export]
macro_rules! printf {
    ($($arg:tt)+) => {
        if $crate::listening() {
            $crate::__private::printf(::core::format_args!($($arg)+), "", ::core::module_path!(), ::core::file!(), ::core::line!())
        }
    };
}

/// Adds an event with `data` (anything `Serialize`) and a message formatted like `format!`, only if
/// a tracer listens (neither the data nor the arguments are evaluated otherwise).
///
/// ```
/// #[derive(serde::Serialize)]
/// struct Retry {
///     attempt: u32,
/// }
/// let attempt = 2;
/// tracer_events::printf_with_data!(Retry { attempt }, "retrying after {} ms", 100 * attempt);
/// ```
#[macro_export]
macro_rules! printf_with_data {
    ($data:expr, $($arg:tt)+) => {
        if $crate::listening() {
            $crate::__private::printf(
                ::core::format_args!($($arg)+),
                &$crate::__private::to_json(&$data),
                ::core::module_path!(),
                ::core::file!(),
                ::core::line!(),
            )
        }
    };
}

#[doc(hidden)]
pub mod __private {
    pub use crate::to_json;

    /// The formatting half of `printf!`: only called while a tracer listens.
    #[cold]
    #[inline(never)]
    pub fn printf(args: std::fmt::Arguments<'_>, data: &str, module: &str, file: &str, line: u32) {
        let message = crate::message(args);
        crate::emit_trace(&message, data, module, file, line);
    }
}

/// The text of `args`, without an allocation when it is a plain string.
pub(crate) fn message(args: fmt::Arguments<'_>) -> std::borrow::Cow<'static, str> {
    match args.as_str() {
        Some(s) => s.into(),
        None => args.to_string().into(),
    }
}

#[cfg(all(test, target_os = "linux", target_arch = "x86_64"))]
mod tests {
    use std::process::Command;

    fn readelf(args: &[&str]) -> String {
        let exe = std::env::current_exe().unwrap();
        let out = Command::new("readelf").args(args).arg(&exe).output().expect("readelf (binutils)");
        String::from_utf8(out.stdout).unwrap()
    }

    /// The probe as an independent reader (binutils) sees it in this very test binary: one
    /// `tracer_events:event` note with two 8-byte register arguments and a semaphore, which lives
    /// in a `.probes` section that the file backs (`PROGBITS`, not `NOBITS`: the kernel can only
    /// bump a counter it finds in the file).
    #[test]
    fn the_probe_and_its_semaphore_are_in_the_binary() {
        // Untraced: a no-op, and it keeps the probe from being garbage-collected by the linker.
        crate::print("nobody listens");
        assert!(!crate::listening());
        let notes = readelf(&["-n", "--wide"]);
        let at = notes.find("Provider: tracer_events").expect("a tracer_events probe");
        let probe: Vec<&str> = notes[at..].lines().take(4).map(str::trim).collect();
        assert_eq!(probe[1], "Name: event");
        let semaphore = probe[2].split("Semaphore: ").nth(1).expect("a semaphore field");
        assert_ne!(u64::from_str_radix(semaphore.trim_start_matches("0x"), 16).unwrap(), 0, "{probe:?}");
        let args: Vec<&str> = probe[3].trim_start_matches("Arguments: ").split(' ').collect();
        assert!(args.len() == 2 && args.iter().all(|a| a.starts_with("8@%r")), "{probe:?}");
        assert_eq!(notes.matches("Provider: tracer_events").count(), 1, "one probe site");
        let sections = readelf(&["-S", "--wide"]);
        let probes = sections.lines().find(|l| l.contains(" .probes ")).expect("a .probes section");
        assert!(probes.contains("PROGBITS"), "{probes}");
    }
}
