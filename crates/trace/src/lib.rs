#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
// Parses untrusted files: fuzzed without a sanitizer, so no unsafe code here.
#![forbid(unsafe_code)]

mod compare;
mod doc;
mod error;
mod live;
mod model;
mod read;
mod record;
mod replay;
pub mod tolerance;
mod write;

pub use compare::{compare, FieldReport, Verdict};
pub use error::{FieldProblem, ReplayFailure, Result, TraceError, TraceLimit, WireProblem};
pub use model::*;
pub use read::{read_bytes, read_file, MAX_WORLD_SIZE};
pub use record::Recorder;
pub use replay::{replay, replay_rank, Mode, ReplayOptions, Report, MAX_INPROC_WORLD_SIZE};
pub use write::{to_bytes, write_file};
