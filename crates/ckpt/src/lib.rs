#![doc = include_str!("../README.md")]
// The README's examples are pasted into new crates: a warning there (an
// unused import) is a failure here.
#![doc(test(attr(deny(warnings))))]
#![warn(missing_docs)]
// Parses untrusted files; reads its input with positioned reads, never a
// mapping (see `io::source`), so it needs no unsafe code at all.
#![forbid(unsafe_code)]

mod candle;
mod checkpoint;
mod configs;
mod diff;
mod dtype;
mod error;
pub mod hydra;
mod io;
mod normalizers;
mod parsed;
mod safetensors;
mod save;
mod suggest;
mod torch;
mod tree;
mod write_options;

pub use candle::{var_builder, CheckpointBackend};
pub use checkpoint::Checkpoint;
pub use configs::{config_node_to_json, SMALL_TENSOR};
pub use diff::{diff, diff_with_progress, tensor_bytes, Difference, DifferenceKind, Tolerance};
pub use dtype::DType;
pub use error::{
    CkptError, EntryProblem, Found, HeaderProblem, LegacyProblem, ReadLimit, Result, Truncation, ValueProblem, View,
};
pub use io::atomic::{abandon_temporary_files, open_stream_output, remove_temporary_files, stale_temporary_files};
pub use io::source::open_regular;
pub use io::storage::{Bytes, Storage};
pub use normalizers::{LoadWarning, NormalizerGroup, NormalizerSummary, SavedBuffers, Summary, Trained};
pub use parsed::{Format, ReadOptions};
pub use safetensors::{save_safetensors, save_tensors, ExportReport, SafetensorsOptions};
pub use torch::{is_config_global, is_safe_global, save_torch};
pub use tree::json::{node_from_json, value_from_json, NodeJson, ValueJson};
pub use tree::json_problem::JsonProblem;
pub use tree::{dotted, Construct, Dict, DictKind, DuplicateKey, Key, Node, Object, Shape, TensorClass, TensorRef};
pub use write_options::{Durability, UnsafeGlobals, WriteOptions};
