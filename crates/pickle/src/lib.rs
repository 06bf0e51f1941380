#![doc = include_str!("../README.md")]
// The README's examples are pasted into new crates: a warning there (an
// unused import) is a failure here.
#![doc(test(attr(deny(warnings))))]
#![warn(missing_docs)]
// Parses untrusted files: fuzzed without a sanitizer, so no unsafe code here.
#![forbid(unsafe_code)]

mod error;
mod int;
mod limits;
mod opcodes;
mod read;
mod value;
mod write;

pub use error::{Operand, PickleError, ReadProblem, Result, WriteProblem};
pub use limits::Limits;
pub use read::{from_slice, from_slice_prefix};
pub use value::Value;
pub use write::{to_vec, write, WriteOptions};
