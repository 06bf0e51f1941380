//! The pickle VM on arbitrary bytes: a value or an error, never a panic,
//! hang or unbounded allocation; whatever it reads and the writer accepts
//! must write identically after a read back (the writer is a fixed point).
#![no_main]

use libfuzzer_sys::fuzz_target;
use pmstate_pickle::{from_slice, to_vec, Limits};

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_nodes: 1 << 20, ..Limits::default() };
    let Ok(value) = from_slice(data, &limits) else { return };
    let Ok(bytes) = to_vec(&value) else { return };
    let again = from_slice(&bytes, &Limits::default()).expect("what we write reads back");
    assert_eq!(to_vec(&again).expect("and writes again"), bytes, "writer is not a fixed point");
});
