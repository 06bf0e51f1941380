//! Writing safetensors: a whole checkpoint (every storage once, the tree in
//! `__metadata__`), or one selected dict as plain tensors.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

use super::header::{StorageEntry, MAX_HEADER_SIZE, STORAGES_KEY, TREE_KEY, VERSION_KEY};
use crate::checkpoint::Checkpoint;
use crate::error::{CkptError, Result, ValueProblem};
use crate::io::atomic::write_atomically;
use crate::io::bulk_copy::{copy_bytes, CopyError};
use crate::io::storage::Bytes;
use crate::parsed::ReadOptions;
use crate::tree::json::{check_size, json_depth_of_tree_depth, NodeJson};
use crate::tree::{dotted, Node, TensorRef};
use crate::write_options::WriteOptions;

/// How to write safetensors.
#[derive(Debug, Clone, Default)]
pub struct SafetensorsOptions<'a> {
    /// What every writer shares (unsafe globals, durability, progress).
    pub write: WriteOptions<'a>,
    /// Export only the dict at this dotted key, its tensors under their own
    /// keys (no tree): loadable by any safetensors reader.
    pub select: Option<String>,
}

/// What an export wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ExportReport {
    /// Tensors written.
    pub tensors: usize,
    /// Tensor bytes written.
    pub bytes: u64,
    /// Non-tensor values under a `select`ed key that safetensors cannot hold (dotted keys).
    pub skipped: Vec<String>,
}

/// Where an entry's bytes come from.
enum Data<'a> {
    /// A range of a storage.
    Storage { bytes: &'a Bytes, offset: usize, len: usize },
    /// Gathered from a non-contiguous view.
    Owned(Vec<u8>),
}

impl Data<'_> {
    fn len(&self) -> usize {
        match self {
            Data::Storage { len, .. } => *len,
            Data::Owned(v) => v.len(),
        }
    }
}

struct Entry<'a> {
    name: String,
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    data: Data<'a>,
}

impl Entry<'_> {
    fn header_row(&self) -> HeaderRow<'_> {
        HeaderRow { name: &self.name, dtype: self.dtype, shape: &self.shape, len: self.data.len() }
    }
}

/// What the header says of one tensor: its name, dtype, shape and byte
/// length (the data follow in the rows' order).
pub(super) struct HeaderRow<'a> {
    pub(super) name: &'a str,
    pub(super) dtype: safetensors::Dtype,
    pub(super) shape: &'a [usize],
    pub(super) len: usize,
}

/// `__metadata__` entries, in the order they are written.
type Metadata = Vec<(String, String)>;

fn st_dtype(ckpt: &Checkpoint, key: &str, t: &TensorRef) -> Result<safetensors::Dtype> {
    t.dtype.safetensors().ok_or_else(|| CkptError::UnsupportedDtype {
        path: ckpt.path_str().to_owned(),
        key: Some(key.to_owned()),
        storage: Some(t.storage.clone()),
        dtype: format!("{} (safetensors has no such dtype)", t.dtype),
    })
}

/// Writes `ckpt` (or the dict at `opts.select`) as safetensors at `path`,
/// atomically. Refused before anything is written when the result would
/// not read back equal (a header over safetensors' 100 MB, a tree deeper or
/// larger than the reader's defaults).
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
            let (entries, metadata) = whole_entries(ckpt, path, &opts.write)?;
            (entries, metadata, Vec::new())
        }
    };
    let rows: Vec<HeaderRow<'_>> = entries.iter().map(Entry::header_row).collect();
    let header = header_bytes(&rows, &metadata, path)?;
    let report =
        ExportReport { tensors: entries.len(), bytes: entries.iter().map(|e| e.data.len() as u64).sum(), skipped };
    let progress = opts.write.progress;
    write_atomically(path, opts.write.fsync(), |w| {
        let ioerr = |e| CkptError::Io { path: path.display().to_string(), source: e };
        w.write_all(&header).map_err(ioerr)?;
        let mut done = header.len() as u64;
        let mut advance = |n: usize| {
            done += n as u64;
            if let Some(p) = progress {
                p(done);
            }
        };
        let mut buf = Vec::new();
        for e in &entries {
            match &e.data {
                Data::Storage { bytes, offset, len } => copy_bytes(bytes, *offset, *len, w, &mut buf, &mut advance)
                    .map_err(|e| match e {
                        CopyError::Read(e) => e,
                        CopyError::Write(e) => ioerr(e),
                    })?,
                Data::Owned(v) => {
                    w.write_all(v).map_err(ioerr)?;
                    advance(v.len());
                }
            }
        }
        ckpt.check_unchanged()
    })?;
    Ok(report)
}

/// A JSON object of the given entries, in order.
struct Ordered<'a, V>(&'a [(String, V)]);

impl<V: Serialize> Serialize for Ordered<'_, V> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

#[derive(Serialize)]
struct TensorHeader<'a> {
    dtype: safetensors::Dtype,
    shape: &'a [usize],
    data_offsets: (usize, usize),
}

struct HeaderDoc<'a, 'b> {
    metadata: &'a [(String, String)],
    rows: &'a [HeaderRow<'b>],
}

impl Serialize for HeaderDoc<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        if !self.metadata.is_empty() {
            m.serialize_entry("__metadata__", &Ordered(self.metadata))?;
        }
        let mut offset = 0usize;
        for r in self.rows {
            let t = TensorHeader { dtype: r.dtype, shape: r.shape, data_offsets: (offset, offset + r.len) };
            m.serialize_entry(r.name, &t)?;
            offset += r.len;
        }
        m.end()
    }
}

/// The header (its length, then the JSON padded to 8 bytes) of a file
/// whose tensors are `rows`, in order.
pub(super) fn header_bytes(rows: &[HeaderRow<'_>], metadata: &[(String, String)], output: &Path) -> Result<Vec<u8>> {
    let mut text = serde_json::to_vec(&HeaderDoc { metadata, rows })
        .map_err(|e| CkptError::Io { path: output.display().to_string(), source: e.into() })?;
    // Pad to a multiple of 8 with spaces, as the safetensors writer does, so the data is 8-aligned.
    while (text.len() + 8) % 8 != 0 {
        text.push(b' ');
    }
    if text.len() > MAX_HEADER_SIZE {
        return Err(CkptError::Unwritable {
            output: output.display().to_string(),
            key: "<header>".into(),
            problem: ValueProblem::HeaderTooLarge { needed: text.len(), max: MAX_HEADER_SIZE },
        });
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    Ok(out)
}

fn whole_entries<'a>(
    ckpt: &'a Checkpoint,
    output: &Path,
    opts: &WriteOptions<'_>,
) -> Result<(Vec<Entry<'a>>, Metadata)> {
    opts.check_globals(ckpt)?;
    let tensors = ckpt.tensors();
    let mut users: HashMap<&str, usize> = HashMap::new();
    for (_, t) in &tensors {
        *users.entry(t.storage.as_str()).or_default() += 1;
    }
    let names: HashSet<&str> = tensors.iter().map(|(k, _)| k.as_str()).collect();
    let mut used_names: HashSet<String> = HashSet::new();
    let mut table: Vec<(String, StorageEntry)> = Vec::new();
    let mut stored: HashSet<&str> = HashSet::new();
    let mut entries = Vec::new();
    for (key, t) in &tensors {
        if !stored.insert(t.storage.as_str()) {
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
            (key.clone(), st_dtype(ckpt, key, t)?, t.shape.clone())
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
        let entry = StorageEntry {
            tensor: name.clone(),
            typed: storage.typed,
            dtype: storage.dtype.torch_name().to_owned(),
            location: storage.location.clone(),
        };
        table.push((t.storage.clone(), entry));
        entries.push(Entry {
            name,
            dtype,
            shape,
            data: Data::Storage { bytes: &storage.data, offset: 0, len: storage.data.len() },
        });
    }
    let unwritable =
        |problem| CkptError::Unwritable { output: output.display().to_string(), key: TREE_KEY.into(), problem };
    let io = |e: serde_json::Error| CkptError::Io { path: output.display().to_string(), source: e.into() };
    let tree = serde_json::to_string(&NodeJson(ckpt.root())).map_err(io)?;
    // Exit 0 must mean the output reads back: within what the reader accepts by default.
    let limits = ReadOptions::default();
    let size = check_size(&tree);
    let max_depth = json_depth_of_tree_depth(limits.pickle.max_depth);
    if size.depth > max_depth {
        return Err(unwritable(ValueProblem::TooDeep { depth: size.depth, max: max_depth }));
    }
    if size.values > limits.max_tree_values {
        return Err(unwritable(ValueProblem::HeaderTooLarge {
            needed: size.values as usize,
            max: limits.max_tree_values as usize,
        }));
    }
    let table = serde_json::to_string(&Ordered(&table)).map_err(io)?;
    let metadata = vec![
        ("format".to_owned(), "pt".to_owned()),
        (VERSION_KEY.to_owned(), "1".to_owned()),
        (STORAGES_KEY.to_owned(), table),
        (TREE_KEY.to_owned(), tree),
    ];
    Ok((entries, metadata))
}

fn selected_entries<'a>(ckpt: &'a Checkpoint, key: &str) -> Result<(Vec<Entry<'a>>, Vec<String>)> {
    let node = ckpt.get(key).ok_or_else(|| ckpt.not_found(key))?;
    if node.as_dict().is_none() {
        return Err(CkptError::WrongKind {
            path: ckpt.path_str().to_owned(),
            key: key.to_owned(),
            expected: "dict (what --select exports)",
            found: node.kind(),
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
                path: ckpt.path_str().to_owned(),
                key: name.clone(),
                problem: ValueProblem::DuplicateKey(name),
            });
        }
        let dtype = st_dtype(ckpt, &name, t)?;
        let data = if t.is_contiguous() {
            let storage = ckpt.storage_of(t)?;
            Data::Storage { bytes: &storage.data, offset: t.offset * t.dtype.size(), len: t.nbytes() }
        } else {
            Data::Owned(ckpt.tensor_bytes_at(Some(&format!("{key}.{name}")), t)?.into_owned())
        };
        entries.push(Entry { name, dtype, shape: t.shape.clone(), data });
    }
    Ok((entries, skipped))
}
