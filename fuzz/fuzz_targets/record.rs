//! Ring-buffer records: any bytes decode to a record or an error, never a panic or a bad read.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tracer_common::decode::decode(data);
});
