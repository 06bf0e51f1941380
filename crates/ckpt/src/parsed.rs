//! What every reader returns ([`Parsed`]), the options they read with, and
//! the container [`Format`]. Readers and writers depend on this module and
//! `checkpoint` depends on the readers, never the other way.

use std::collections::HashMap;
use std::path::Path;

use pmstate_pickle::Limits;

use crate::io::storage::Storage;
use crate::tree::Node;

/// The container a checkpoint was read from, or is to be written as.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Format {
    /// A torch.save zip archive, with the name of its one folder.
    TorchZip {
        /// The archive's folder (`last` for `last.ckpt`, or `archive`).
        prefix: String,
    },
    /// A legacy (pre-1.6) torch.save stream.
    TorchLegacy,
    /// A safetensors file.
    Safetensors {
        /// Whether it carries a pmstate tree in `__metadata__` (otherwise the tree is a flat dict of its tensors).
        with_tree: bool,
    },
    /// Built in memory.
    Memory,
}

impl Format {
    /// The format a file of this name is written in: `.safetensors` is
    /// safetensors (with the whole tree); `.pt`, `.pth`, `.ckpt` and `.bin`
    /// are torch.save's zip layout (its folder named after the file, as
    /// torch names it). Any other extension is `None`.
    pub fn for_path(path: &Path) -> Option<Format> {
        let ext = path.extension().and_then(|e| e.to_str())?.to_ascii_lowercase();
        match ext.as_str() {
            "safetensors" => Some(Format::Safetensors { with_tree: true }),
            "pt" | "pth" | "ckpt" | "bin" => Some(Format::TorchZip { prefix: archive_prefix(path) }),
            _ => None,
        }
    }

    /// A short stable name for machine-readable output: `torch-zip`,
    /// `torch-legacy`, `safetensors`, `safetensors-tree` or `memory`.
    pub fn id(&self) -> &'static str {
        match self {
            Format::TorchZip { .. } => "torch-zip",
            Format::TorchLegacy => "torch-legacy",
            Format::Safetensors { with_tree: true } => "safetensors-tree",
            Format::Safetensors { with_tree: false } => "safetensors",
            Format::Memory => "memory",
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Format::TorchZip { prefix } => write!(f, "torch zip archive (folder {prefix})"),
            Format::TorchLegacy => f.write_str("legacy torch.save stream"),
            Format::Safetensors { with_tree: true } => f.write_str("safetensors with a pmstate tree"),
            Format::Safetensors { with_tree: false } => f.write_str("safetensors"),
            Format::Memory => f.write_str("in memory"),
        }
    }
}

/// Bounds on what reading a file may claim: every one turns a hostile
/// input into an error naming the limit instead of exhausted memory. The
/// defaults admit any real ProtoMotions checkpoint with room to spare; see
/// the README's limits table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadOptions {
    /// Limits for every pickle record.
    pub pickle: Limits,
    /// Most bytes all compressed (deflated) records together, `data.pkl`
    /// included, may expand to: the zip-bomb guard. `None`: 32 times the
    /// file size plus 64 MiB, which real deflated checkpoints (ratios of 1.1
    /// to 3) never approach. Each record is also held to the size its
    /// storage declares.
    pub max_inflated_bytes: Option<u64>,
    /// Most JSON values in a safetensors file's `pmstate.tree` (each tree
    /// node is at least one). Default 4,194,304, as the pickle node budget.
    pub max_tree_values: u64,
    /// Most bytes a non-contiguous view may expand to when its elements are
    /// gathered (a stride-0 view of one element can claim 10^12): `None` is
    /// 4 times its storage plus 64 MiB.
    pub max_view_bytes: Option<u64>,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            pickle: Limits::default(),
            max_inflated_bytes: None,
            max_tree_values: 1 << 22,
            max_view_bytes: None,
        }
    }
}

/// The archive folder torch.save uses for a file: its name without the last extension.
pub(crate) fn archive_prefix(path: &Path) -> String {
    match path.file_stem().and_then(|s| s.to_str()) {
        Some(s) if !s.is_empty() && !s.contains('/') => s.to_owned(),
        _ => "archive".to_owned(),
    }
}

/// What a reader found: the tree, the storages, the container.
pub(crate) struct Parsed {
    pub root: Node,
    pub storages: HashMap<String, Storage>,
    pub format: Format,
}
