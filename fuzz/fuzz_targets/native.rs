//! Native trace files: any bytes give events, a torn end or an error naming the batch, never a
//! panic or an allocation the input's size does not justify.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_user::trace::read::native::NativeReader;

fuzz_target!(|data: &[u8]| {
    for item in NativeReader::new(data) {
        if item.is_err() {
            break;
        }
    }
});
