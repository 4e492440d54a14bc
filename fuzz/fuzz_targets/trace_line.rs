//! Trace files: any bytes read as lines give events or errors that name the line, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_user::trace::read::jsonl::TraceReader;

fuzz_target!(|data: &[u8]| {
    for line in TraceReader::new(data) {
        if line.is_err() {
            break;
        }
    }
});
