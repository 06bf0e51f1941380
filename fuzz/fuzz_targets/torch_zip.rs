//! `Checkpoint::from_bytes` on arbitrary bytes seeded with torch.save zip archives:
//! an error or a checkpoint whose every tensor, tree and normalizer can be
//! read; never a panic, hang or unbounded allocation.
#![no_main]

use libfuzzer_sys::fuzz_target;

include!("ckpt_common.rs");

fuzz_target!(|data: &[u8]| exercise(data));
