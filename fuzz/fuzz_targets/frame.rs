//! Agent/collector frames: any bytes decode to a message or an error, and a batch of events naming
//! strings it never defined is rejected, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_user::cluster::{
    protocol::{Message, decode},
    wire::Decoder,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(Message::Events(batch)) = decode(data) {
        let _ = Decoder::default().events(&"fuzz".into(), batch);
    }
});
