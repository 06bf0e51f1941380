//! The pickle VM on arbitrary bytes: a value or an error, never a panic,
//! hang or unbounded allocation; whatever it reads and the writer accepts
//! must write identically after a read back (the writer is a fixed point).
//! The read back gets the node budget the input had: the rewrite can be
//! denser than the input (memoized globals, binary opcodes), so its own
//! input-scaled budget may be smaller (crates/pickle/tests/hostile.rs,
//! `fuzz_regression_rewrite_denser_than_input`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use pmstate_pickle::{from_slice, to_vec, Limits};

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_nodes: 1 << 20, ..Limits::default() };
    let Ok(value) = from_slice(data, &limits) else { return };
    let Ok(bytes) = to_vec(&value) else { return };
    // `+ 2`: an intermediate object may be two nodes larger than its result (Limits::max_nodes).
    let budget = limits.scaled_to(data.len()).max_nodes + 2;
    let again_limits = Limits { max_nodes: budget, max_nodes_per_input_byte: u64::MAX, ..Limits::default() };
    let again = from_slice(&bytes, &again_limits).expect("what we write reads back");
    assert_eq!(to_vec(&again).expect("and writes again"), bytes, "writer is not a fixed point");
});
