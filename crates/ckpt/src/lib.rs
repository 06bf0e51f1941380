//! ProtoMotions checkpoints without Python.
//!
//! [`Checkpoint::open`] reads torch.save files (the zip archive of torch
//! 1.6 and later, stored or deflated, and the legacy stream) and safetensors
//! files into an inert tree ([`Node`]) plus storages, mapping tensor data
//! instead of reading it. Nothing in a file is ever executed: globals torch's
//! safe loader would reject stay [`Node::Opaque`] values, are listed by
//! [`Checkpoint::unsafe_globals`], and are refused by the writers unless the
//! caller allows them.
//!
//! Writers: [`save_torch`] (torch.save's layout, loadable by
//! `torch.load(weights_only=True)`) and [`save_safetensors`] (the whole
//! tree, restorable exactly, or one selected state dict). Normalizers:
//! [`Checkpoint::normalizers`], [`Checkpoint::load_normalizer`],
//! [`Checkpoint::store_normalizer`]. candle:
//! [`Checkpoint::to_candle`] and [`var_builder`].
//!
//! ```no_run
//! use pmstate_ckpt::Checkpoint;
//! let ckpt = Checkpoint::open("last.ckpt")?;
//! for g in ckpt.normalizers()? {
//!     println!("{}: {:?}", g.name, g.saved);
//! }
//! ckpt.save("last.safetensors", false)?; // and back: Checkpoint::open(...)?.save("last.pt", false)
//! # Ok::<(), pmstate_ckpt::CkptError>(())
//! ```
#![warn(missing_docs)]
// Parses untrusted files: the one unsafe call (mapping the input) is allowed
// where it is made; the fuzz targets, run without a sanitizer, never reach it.
#![deny(unsafe_code)]

mod atomic;
mod bulk_copy;
mod checkpoint;
mod configs;
mod dtype;
mod error;
mod interpret;
mod normalizers;
mod read_torch;
mod safetensors_io;
mod safety;
mod storage;
mod tree;
mod tree_json;
mod varbuilder;
mod write_torch;

pub use checkpoint::{Checkpoint, Format};
pub use configs::{config_node_to_json, SMALL_TENSOR};
pub use dtype::DType;
pub use error::{CkptError, Result};
pub use normalizers::{LoadWarning, NormalizerGroup, SavedBuffers, Trained};
pub use read_torch::ReadOptions;
pub use safetensors_io::{save_safetensors, ExportReport, SafetensorsOptions};
pub use safety::is_safe_global;
pub use storage::{Bytes, Storage};
pub use tree::{dotted, Construct, Dict, Key, Node, Object, Shape, TensorRef};
pub use tree_json::{node_from_json, node_to_json, value_from_json, value_to_json};
pub use varbuilder::{var_builder, CheckpointBackend};
pub use write_torch::{save_torch, SaveOptions};
