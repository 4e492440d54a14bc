//! Program-event payloads, which any traced program writes as it likes: any bytes decode to an
//! event or an error, never a panic, a bad read, or more memory than the input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tracer_events::payload::decode(data);
});
