//! Reading safetensors files: foreign ones as a flat dict of tensors,
//! pmstate's whole-checkpoint exports back into their exact tree.

use std::collections::HashMap;
use std::sync::Arc;

use safetensors::SafeTensorError;

use super::header::{self, StorageEntry, UniqueMap, MAX_HEADER_SIZE, STORAGES_KEY, TREE_KEY};
use crate::dtype::DType;
use crate::error::{CkptError, ReadLimit, Result};
use crate::io::source::Source;
use crate::io::storage::{Bytes, Storage};
use crate::parsed::{Format, Parsed, ReadOptions};
use crate::tree::json::{check_size, json_depth_of_tree_depth, node_from_str};
use crate::tree::{Dict, DictKind, Node, TensorRef};

/// Whether a file's first bytes start like safetensors (a plausible header
/// length, then `{`).
pub(crate) fn looks_like_safetensors(head: &[u8], file_len: u64) -> bool {
    let Some(n8) = head.get(..8) else { return false };
    let n = u64::from_le_bytes(n8.try_into().unwrap_or([0; 8]));
    (2..=MAX_HEADER_SIZE as u64).contains(&n) && n + 8 <= file_len && head.get(8) == Some(&b'{')
}

/// Reads a safetensors file: only its header is read now; tensor data stays
/// in the file until asked for.
pub(crate) fn read(path: &str, src: &Arc<Source>, opts: &ReadOptions) -> Result<Parsed> {
    let st_err = |source| CkptError::Safetensors { path: path.to_owned(), source };
    if src.len() < 8 {
        return Err(st_err(SafeTensorError::HeaderTooSmall));
    }
    let n = u64::from_le_bytes(src.read_vec(0, 8)?.try_into().unwrap_or([0; 8]));
    if n > MAX_HEADER_SIZE as u64 {
        return Err(st_err(SafeTensorError::HeaderTooLarge));
    }
    if 8 + n > src.len() {
        return Err(st_err(SafeTensorError::InvalidHeaderLength));
    }
    let text = src.read_vec(8, n as usize)?;
    let text = std::str::from_utf8(&text).map_err(|e| st_err(SafeTensorError::InvalidHeader(e)))?;
    let header = header::parse(text).map_err(|problem| CkptError::Header { path: path.to_owned(), problem })?;
    let data_start = 8 + n;
    if data_start + header.tensors.data_len() as u64 != src.len() {
        return Err(st_err(SafeTensorError::MetadataIncompleteBuffer));
    }
    let mut tensors: Vec<(String, DType, Vec<usize>, Bytes)> = Vec::new();
    for name in header.tensors.offset_keys() {
        let Some(info) = header.tensors.info(&name) else { continue };
        let dtype = DType::from_safetensors(info.dtype).ok_or_else(|| CkptError::UnsupportedDtype {
            path: path.to_owned(),
            key: Some(name.clone()),
            storage: None,
            dtype: info.dtype.to_string(),
        })?;
        let (b, e) = info.data_offsets;
        let bytes = Bytes::range(src, data_start + b as u64, e - b);
        tensors.push((name, dtype, info.shape.clone(), bytes));
    }
    let meta = |key: &str| header.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    let Some(tree) = meta(TREE_KEY) else {
        return Ok(foreign(tensors));
    };
    let root = read_tree(path, tree, opts)?;
    let table = meta(STORAGES_KEY).unwrap_or("{}");
    let table: UniqueMap<StorageEntry> = serde_json::from_str(table).map_err(|source| CkptError::Metadata {
        path: path.to_owned(),
        field: STORAGES_KEY,
        source,
    })?;
    let mut by_name: HashMap<String, Bytes> = tensors.into_iter().map(|(name, _, _, data)| (name, data)).collect();
    let mut storages = HashMap::with_capacity(table.0.len());
    for (key, entry) in table.0 {
        let bad = |msg: String| CkptError::Metadata {
            path: path.to_owned(),
            field: STORAGES_KEY,
            source: serde::de::Error::custom(format!("storage {key}: {msg}")),
        };
        let dtype =
            DType::from_torch_name(&entry.dtype).ok_or_else(|| bad(format!("unknown dtype '{}'", entry.dtype)))?;
        let data = by_name
            .remove(&entry.tensor)
            .ok_or_else(|| bad(format!("tensor '{}' is missing or holds another storage too", entry.tensor)))?;
        storages.insert(key, Storage { typed: entry.typed, dtype, location: entry.location, data });
    }
    Ok(Parsed { root, storages, format: Format::Safetensors { with_tree: true } })
}

/// A file written by another tool: a flat dict of its tensors, in file
/// order, each its own storage.
fn foreign(tensors: Vec<(String, DType, Vec<usize>, Bytes)>) -> Parsed {
    let mut storages = HashMap::with_capacity(tensors.len());
    let mut entries = Vec::with_capacity(tensors.len());
    for (name, dtype, shape, data) in tensors {
        let t = TensorRef::contiguous(name.clone(), dtype, shape);
        storages.insert(
            name.clone(),
            Storage { typed: dtype.storage_class().is_some(), dtype, location: "cpu".into(), data },
        );
        entries.push((Node::Str(name), Node::Tensor(Box::new(t))));
    }
    // Header names are unique (checked when the header was parsed).
    let root = Dict::from_entries(DictKind::Plain, entries).map(Node::Dict).unwrap_or(Node::None);
    Parsed { root, storages, format: Format::Safetensors { with_tree: false } }
}

/// The `pmstate.tree` of a whole-checkpoint export, bounded before it is
/// parsed: its JSON values by [`ReadOptions::max_tree_values`], its depth
/// by what the pickle reader allows (the tree came from a pickle).
fn read_tree(path: &str, text: &str, opts: &ReadOptions) -> Result<Node> {
    let size = check_size(text);
    if size.values > opts.max_tree_values {
        return Err(CkptError::Limit {
            path: path.to_owned(),
            limit: ReadLimit::TreeValues,
            max: opts.max_tree_values,
            needed: size.values,
        });
    }
    let max_depth = json_depth_of_tree_depth(opts.pickle.max_depth);
    if size.depth > max_depth {
        return Err(CkptError::Limit {
            path: path.to_owned(),
            limit: ReadLimit::TreeDepth,
            max: max_depth as u64,
            needed: size.depth as u64,
        });
    }
    node_from_str(text).map_err(|source| CkptError::Metadata { path: path.to_owned(), field: TREE_KEY, source })
}
