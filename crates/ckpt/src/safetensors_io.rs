//! The safetensors bridge.
//!
//! Whole checkpoints: every storage is stored once, under the dotted name
//! of a tensor that covers it exactly (so the file reads naturally with
//! `safetensors.torch.load_file` or candle), or under `__storage__.<key>`
//! when no tensor does (views, shared storages). `__metadata__` carries the
//! whole tree as exact JSON (`pmstate.tree`) and the storage table
//! (`pmstate.storages`), so safetensors -> `.pt` restores the original.
//!
//! `select`: one sub-dict (the model state dict, typically) as plain
//! contiguous tensors under their own keys, loadable anywhere.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use safetensors::SafeTensors;
use serde_json::{json, Map, Value as J};

use crate::atomic::write_atomically;
use crate::bulk_copy::{copy_mapped, BULK_MIN};
use crate::checkpoint::{Checkpoint, Format};
use crate::dtype::DType;
use crate::error::{CkptError, Result};
use crate::read_torch::ReadOptions;
use crate::storage::{Backing, Bytes, Storage};
use crate::tree::{dotted, Dict, Node, TensorRef};
use crate::tree_json::{node_from_json, node_to_json};

const TREE_KEY: &str = "pmstate.tree";
const STORAGES_KEY: &str = "pmstate.storages";
const VERSION_KEY: &str = "pmstate.version";

/// Whether the bytes start like a safetensors file (a plausible header length, then `{`).
pub(crate) fn looks_like_safetensors(bytes: &[u8]) -> bool {
    if bytes.len() < 10 {
        return false;
    }
    let mut n8 = [0u8; 8];
    n8.copy_from_slice(&bytes[..8]);
    let n = u64::from_le_bytes(n8);
    (2..=100_000_000).contains(&n) && n + 8 <= bytes.len() as u64 && bytes[8] == b'{'
}

fn bad(path: &str, reason: impl Into<String>) -> CkptError {
    CkptError::Container { path: path.to_owned(), reason: reason.into() }
}

/// Reads a safetensors file held in `map`.
pub(crate) fn read(path: &str, map: &Arc<Backing>, _opts: &ReadOptions) -> Result<Checkpoint> {
    let (n, meta) = SafeTensors::read_metadata(&map[..]).map_err(|e| bad(path, format!("safetensors: {e:?}")))?;
    let data_start = 8 + n;
    let mut tensors: Vec<(String, DType, Vec<usize>, Bytes)> = Vec::new();
    for name in meta.offset_keys() {
        let Some(info) = meta.info(&name) else { continue };
        let dtype = DType::from_safetensors(info.dtype)
            .ok_or_else(|| CkptError::UnsupportedDtype { key: name.clone(), dtype: format!("{:?}", info.dtype) })?;
        let (b, e) = info.data_offsets;
        let bytes = Bytes::mapped(map, data_start + b, e - b);
        tensors.push((name, dtype, info.shape.clone(), bytes));
    }
    let tree = meta.metadata().as_ref().and_then(|m| m.get(TREE_KEY).map(|t| (t, m.get(STORAGES_KEY))));
    let Some((tree, storages_json)) = tree else {
        // A foreign file: a flat dict of its tensors, in file order, each its own storage.
        let mut storages = HashMap::new();
        let mut entries = Vec::new();
        for (name, dtype, shape, data) in tensors {
            let t = TensorRef::contiguous(name.clone(), dtype, shape);
            storages.insert(
                name.clone(),
                Storage { typed: dtype.storage_class().is_some(), dtype, location: "cpu".into(), data },
            );
            entries.push((Node::Str(name), Node::Tensor(t)));
        }
        let root = Node::Dict(Dict { ordered: false, entries, state: None });
        return Ok(Checkpoint {
            root,
            storages,
            path: path.to_owned(),
            format: Format::Safetensors { with_tree: false },
        });
    };
    let tree: J = serde_json::from_str(tree).map_err(|e| bad(path, format!("__metadata__ {TREE_KEY}: {e}")))?;
    let root = node_from_json(&tree).map_err(|e| bad(path, format!("__metadata__ {TREE_KEY}: {e}")))?;
    let storages_json: J = serde_json::from_str(storages_json.ok_or_else(|| bad(path, format!("no {STORAGES_KEY}")))?)
        .map_err(|e| bad(path, format!("__metadata__ {STORAGES_KEY}: {e}")))?;
    let table = storages_json.as_object().ok_or_else(|| bad(path, format!("{STORAGES_KEY} is not an object")))?;
    let mut by_name: HashMap<String, Bytes> = tensors.into_iter().map(|(name, _, _, data)| (name, data)).collect();
    let mut storages = HashMap::new();
    for (key, s) in table {
        let field = |f: &str| s.get(f).ok_or_else(|| bad(path, format!("storage {key}: no field {f}")));
        let tensor = field("tensor")?.as_str().ok_or_else(|| bad(path, format!("storage {key}: tensor")))?;
        let dtype_name = field("dtype")?.as_str().unwrap_or_default();
        let dtype = DType::from_torch_name(dtype_name)
            .ok_or_else(|| CkptError::UnsupportedDtype { key: key.clone(), dtype: dtype_name.to_owned() })?;
        let data = by_name
            .remove(tensor)
            .ok_or_else(|| bad(path, format!("storage {key}: tensor {tensor} missing or used twice")))?;
        storages.insert(
            key.clone(),
            Storage {
                typed: field("typed")?.as_bool().unwrap_or(true),
                dtype,
                location: field("location")?.as_str().unwrap_or("cpu").to_owned(),
                data,
            },
        );
    }
    let ckpt = Checkpoint { root, storages, path: path.to_owned(), format: Format::Safetensors { with_tree: true } };
    ckpt.validate()?;
    Ok(ckpt)
}

/// How to write safetensors.
#[derive(Default)]
pub struct SafetensorsOptions<'a> {
    /// Export only the dict at this dotted key, its tensors under their own keys (no tree).
    pub select: Option<String>,
    /// Carry opaque values with unsafe globals in the tree (whole-checkpoint export only).
    pub allow_unsafe_globals: bool,
    /// Skip the fsync before the output is renamed into place (`--no-fsync`).
    /// Still atomic while the machine runs; durable only once the kernel has
    /// written it back. Off by default: a finished save survives a power loss.
    pub no_fsync: bool,
    /// Called with the bytes written so far.
    pub progress: Option<&'a (dyn Fn(u64) + Sync)>,
}

impl std::fmt::Debug for SafetensorsOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsOptions")
            .field("select", &self.select)
            .field("allow_unsafe_globals", &self.allow_unsafe_globals)
            .field("no_fsync", &self.no_fsync)
            .finish()
    }
}

/// What an export wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportReport {
    /// Tensors written.
    pub tensors: usize,
    /// Tensor bytes written.
    pub bytes: u64,
    /// Non-tensor values under a `select`ed key that safetensors cannot hold (dotted keys).
    pub skipped: Vec<String>,
}

enum Source<'a> {
    /// A slice of a storage's bytes, and that storage's bytes.
    Storage(&'a [u8], &'a Bytes),
    Owned(Vec<u8>),
}

impl Source<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Source::Storage(b, _) => b,
            Source::Owned(v) => v,
        }
    }
}

struct Entry<'a> {
    name: String,
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    data: Source<'a>,
}

fn st_dtype(key: &str, d: DType) -> Result<safetensors::Dtype> {
    d.safetensors().ok_or_else(|| CkptError::UnsupportedDtype {
        key: key.to_owned(),
        dtype: format!("{d} (safetensors has no such dtype)"),
    })
}

/// Writes `ckpt` (or the dict at `opts.select`) as safetensors at `path`, atomically.
pub fn save_safetensors(
    ckpt: &Checkpoint,
    path: impl AsRef<Path>,
    opts: &SafetensorsOptions<'_>,
) -> Result<ExportReport> {
    let path = path.as_ref();
    let (entries, metadata, skipped) = match &opts.select {
        Some(key) => {
            let (entries, skipped) = selected_entries(ckpt, key)?;
            (entries, vec![("format".to_owned(), "pt".to_owned())], skipped)
        }
        None => {
            let (entries, metadata) = whole_entries(ckpt, opts.allow_unsafe_globals)?;
            (entries, metadata, Vec::new())
        }
    };
    let header = header_bytes(&entries, &metadata)?;
    let report = ExportReport {
        tensors: entries.len(),
        bytes: entries.iter().map(|e| e.data.bytes().len() as u64).sum(),
        skipped,
    };
    write_atomically(path, !opts.no_fsync, |w| {
        let ioerr = |e| CkptError::Io { path: path.display().to_string(), source: e };
        w.write_all(&header).map_err(ioerr)?;
        let mut done = header.len() as u64;
        let mut advance = |n: usize| {
            done += n as u64;
            if let Some(p) = opts.progress {
                p(done);
            }
        };
        let mut buf = Vec::new();
        for e in &entries {
            let bytes = e.data.bytes();
            let mut copied = 0;
            if let Source::Storage(part, origin) = e.data {
                if part.len() >= BULK_MIN && origin.is_mapped() {
                    w.flush().map_err(ioerr)?;
                    copied = copy_mapped(None, part, origin, w.get_mut(), &mut buf, &mut advance).map_err(ioerr)?;
                }
            }
            // Small or in-memory bytes through the write buffer (large chunks pass straight through).
            for chunk in bytes[copied..].chunks(8 << 20) {
                w.write_all(chunk).map_err(ioerr)?;
                advance(chunk.len());
            }
        }
        Ok(())
    })?;
    Ok(report)
}

fn header_bytes(entries: &[Entry<'_>], metadata: &[(String, String)]) -> Result<Vec<u8>> {
    let mut header = Map::new();
    if !metadata.is_empty() {
        let m: Map<String, J> = metadata.iter().map(|(k, v)| (k.clone(), J::String(v.clone()))).collect();
        header.insert("__metadata__".into(), J::Object(m));
    }
    let mut offset = 0usize;
    for e in entries {
        let len = e.data.bytes().len();
        header.insert(
            e.name.clone(),
            json!({ "dtype": e.dtype, "shape": e.shape, "data_offsets": [offset, offset + len] }),
        );
        offset += len;
    }
    let mut text = serde_json::to_vec(&J::Object(header)).map_err(|e| CkptError::Usage(format!("header: {e}")))?;
    // Pad to a multiple of 8 with spaces, as the safetensors writer does, so the data is 8-aligned.
    while (text.len() + 8) % 8 != 0 {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    Ok(out)
}

/// Storage -> the tensor name it is stored under, for a whole-checkpoint export.
/// `__metadata__` entries, in the order they are written.
type Metadata = Vec<(String, String)>;

fn whole_entries(ckpt: &Checkpoint, allow_unsafe: bool) -> Result<(Vec<Entry<'_>>, Metadata)> {
    let flagged = ckpt.unsafe_globals();
    if let (false, Some((key, first))) = (allow_unsafe, flagged.first()) {
        return Err(CkptError::UnsafeGlobals { count: flagged.len(), first: first.clone(), key: key.clone() });
    }
    let tensors = ckpt.tensors();
    let mut users: HashMap<&str, usize> = HashMap::new();
    for (_, t) in &tensors {
        *users.entry(t.storage.as_str()).or_default() += 1;
    }
    let names: HashSet<&str> = tensors.iter().map(|(k, _)| k.as_str()).collect();
    let mut used_names: HashSet<String> = HashSet::new();
    let mut table = Map::new();
    let mut entries = Vec::new();
    for (key, t) in &tensors {
        if table.contains_key(&t.storage) {
            continue;
        }
        let storage = ckpt.storage_of(t)?;
        let covers = users[t.storage.as_str()] == 1
            && t.offset == 0
            && t.is_contiguous()
            && t.nbytes() == storage.data.len()
            && t.dtype.safetensors().is_some()
            && !key.starts_with("__storage__.")
            && used_names.insert(key.clone());
        let (name, dtype, shape) = if covers {
            (key.clone(), st_dtype(key, t.dtype)?, t.shape.clone())
        } else {
            let mut name = format!("__storage__.{}", t.storage);
            while names.contains(name.as_str()) || !used_names.insert(name.clone()) {
                name.push('_');
            }
            match storage.dtype.safetensors() {
                Some(d) if storage.data.len() % storage.dtype.size() == 0 => {
                    (name, d, vec![storage.data.len() / storage.dtype.size()])
                }
                _ => (name, safetensors::Dtype::U8, vec![storage.data.len()]),
            }
        };
        table.insert(
            t.storage.clone(),
            json!({
                "tensor": name,
                "typed": storage.typed,
                "dtype": storage.dtype.torch_name(),
                "location": storage.location,
            }),
        );
        let data = Source::Storage(&storage.data, &storage.data);
        entries.push(Entry { name, dtype, shape, data });
    }
    let tree = serde_json::to_string(&node_to_json(&ckpt.root)).map_err(|e| CkptError::Usage(format!("tree: {e}")))?;
    let table = serde_json::to_string(&J::Object(table)).map_err(|e| CkptError::Usage(format!("tree: {e}")))?;
    let metadata = vec![
        ("format".to_owned(), "pt".to_owned()),
        (VERSION_KEY.to_owned(), "1".to_owned()),
        (STORAGES_KEY.to_owned(), table),
        (TREE_KEY.to_owned(), tree),
    ];
    Ok((entries, metadata))
}

fn selected_entries<'a>(ckpt: &'a Checkpoint, key: &str) -> Result<(Vec<Entry<'a>>, Vec<String>)> {
    let node = ckpt.get(key).ok_or_else(|| CkptError::NotFound { path: ckpt.path.clone(), key: key.to_owned() })?;
    if node.as_dict().is_none() {
        return Err(CkptError::Value {
            path: ckpt.path.clone(),
            key: key.to_owned(),
            reason: format!("is a {}; --select needs a dict", node.kind()),
        });
    }
    let mut found: Vec<(String, &TensorRef)> = Vec::new();
    let mut skipped = Vec::new();
    // Dicts are walked (their tensors get dotted names); every other non-tensor value is skipped.
    node.walk(&mut |path, n| match n {
        Node::Tensor(t) => {
            found.push((dotted(path), t));
            false
        }
        Node::Dict(_) => true,
        _ => {
            skipped.push(dotted(path));
            false
        }
    });
    let mut entries = Vec::new();
    let mut seen = HashSet::new();
    for (name, t) in found {
        if !seen.insert(name.clone()) {
            return Err(CkptError::Value {
                path: ckpt.path.clone(),
                key: name,
                reason: "two tensors get this name under --select".into(),
            });
        }
        let dtype = st_dtype(&name, t.dtype)?;
        let data = match ckpt.tensor_bytes(t)? {
            std::borrow::Cow::Borrowed(b) => Source::Storage(b, &ckpt.storage_of(t)?.data),
            std::borrow::Cow::Owned(v) => Source::Owned(v),
        };
        entries.push(Entry { name, dtype, shape: t.shape.clone(), data });
    }
    Ok((entries, skipped))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::*;
    use crate::storage::Bytes;

    fn tensor(storage: &str, offset: usize, shape: &[usize]) -> Node {
        Node::Tensor(TensorRef {
            storage: storage.into(),
            dtype: DType::F32,
            offset,
            shape: shape.to_vec(),
            stride: TensorRef::contiguous_stride(shape),
            requires_grad: false,
            parameter: None,
            object: None,
        })
    }

    fn storage(words: usize, seed: u32) -> Storage {
        let data: Vec<u8> =
            (0..words as u32).flat_map(|i| (i.wrapping_mul(2_654_435_761) ^ seed).to_le_bytes()).collect();
        Storage { typed: true, dtype: DType::F32, location: "cpu".into(), data: Bytes::owned(data) }
    }

    /// Storages of BULK_MIN bytes and more take the bulk copy (crate::bulk_copy):
    /// whole exports and `select` (a view at an offset) must hold the same
    /// bytes as the source, and progress must reach the end.
    #[test]
    fn large_mapped_storages_are_copied_exactly() {
        let words = BULK_MIN; // 4 MiB of f32
        let storages: HashMap<String, Storage> = [
            ("a".to_owned(), storage(words, 1)),
            ("b".to_owned(), storage(words / 2, 2)),
            ("c".to_owned(), storage(7, 3)),
        ]
        .into();
        let model = Node::Dict(Dict {
            ordered: true,
            entries: vec![
                (Node::Str("w".into()), tensor("a", 0, &[words / 4, 4])),
                (Node::Str("view".into()), tensor("b", 1001, &[words / 2 - 3000])),
                (Node::Str("small".into()), tensor("c", 0, &[7])),
            ],
            state: None,
        });
        let root = Node::Dict(Dict {
            ordered: false,
            entries: vec![(Node::Str("model".into()), model), (Node::Str("b_again".into()), tensor("b", 0, &[2]))],
            state: None,
        });
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src.pt");
        crate::save_torch(&Checkpoint::from_parts(root, storages), &src, &Default::default()).unwrap();
        let orig = Checkpoint::open(&src).unwrap();
        assert!(orig.storages.values().all(|s| s.data.is_mapped()));
        let same = |a: &Checkpoint, b: &Checkpoint, key: &str, key_b: &str| {
            let (ta, tb) = (a.tensor(key).unwrap(), b.tensor(key_b).unwrap());
            assert_eq!(ta.shape, tb.shape, "{key}");
            assert!(a.tensor_bytes(ta).unwrap() == b.tensor_bytes(tb).unwrap(), "{key}: bytes differ");
        };
        for select in [None, Some("model".to_owned())] {
            let out = dir.path().join("out.safetensors");
            let last = Mutex::new(0u64);
            let progress = |n: u64| {
                let mut l = last.lock().unwrap();
                assert!(n >= *l);
                *l = n;
            };
            let opts = SafetensorsOptions { select: select.clone(), progress: Some(&progress), ..Default::default() };
            save_safetensors(&orig, &out, &opts).unwrap();
            assert_eq!(*last.lock().unwrap(), std::fs::metadata(&out).unwrap().len());
            let back = Checkpoint::open(&out).unwrap();
            if select.is_some() {
                for k in ["w", "view", "small"] {
                    same(&orig, &back, &format!("model.{k}"), k);
                }
            } else {
                for k in ["model.w", "model.view", "model.small", "b_again"] {
                    same(&orig, &back, k, k);
                }
                assert_eq!(back.root, orig.root);
            }
        }
    }
}
