//! The pm-trace reader on arbitrary bytes: it must return a trace or an
//! error, never panic, hang or exhaust memory; what it accepts must write
//! back and read again.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(trace) = pmstate_trace::read_bytes(data) {
        let bytes = pmstate_trace::to_bytes(&trace).expect("a trace that was read can be written");
        pmstate_trace::read_bytes(&bytes).expect("a written trace reads back");
    }
});
