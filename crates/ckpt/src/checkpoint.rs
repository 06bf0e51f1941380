//! [`Checkpoint`]: a loaded file's tree and storages.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use crate::error::{io_err, CkptError, Result};
use crate::read_torch::{is_legacy, read_legacy, read_zip, Parsed, ReadOptions};
use crate::storage::{Backing, Storage};
use crate::tree::{dotted, Node, TensorRef};

/// The container a checkpoint was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
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
        /// Whether it carried a pmstate tree in `__metadata__` (otherwise the tree is a flat dict of its tensors).
        with_tree: bool,
    },
    /// Built in memory.
    Memory,
}

impl Format {
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

/// A checkpoint: the tree `torch.load` would return, as inert data, and
/// the storages its tensors view.
///
/// ```no_run
/// use pmstate_ckpt::Checkpoint;
/// let ckpt = Checkpoint::open("last.ckpt")?;
/// for (key, t) in ckpt.tensors() {
///     println!("{key}: {} {:?}", t.dtype, t.shape);
/// }
/// let w = ckpt.tensor("model._actor.mu.mlp.0.weight")?;
/// let w = ckpt.to_candle(w, &candle_core::Device::Cpu)?;
/// # Ok::<(), pmstate_ckpt::CkptError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// The root value (a dict for every ProtoMotions checkpoint).
    pub root: Node,
    /// Storages by key.
    pub storages: HashMap<String, Storage>,
    /// The file it came from (for messages), or `<memory>`.
    pub path: String,
    /// The container it came from.
    pub format: Format,
}

/// Opens a file for reading and maps it. The map is read-only and private.
#[allow(unsafe_code)]
pub(crate) fn map_file(path: &Path) -> Result<Arc<Backing>> {
    let file = File::open(path).map_err(io_err(path))?;
    // SAFETY: the map is read-only; the one hazard is another process
    // truncating or rewriting the file while we hold it (then reads may see
    // the new bytes or fault), as with every mmap-based reader (safetensors,
    // torch.load(mmap=True)). pmstate's own writers never modify a file in
    // place: they write a temporary file and rename it over the target.
    // Tested by `tests/fixtures.rs`, which reads mapped fixtures.
    let map = unsafe { Mmap::map(&file) }.map_err(io_err(path))?;
    Ok(Arc::new(Backing::Map(map, file)))
}

/// Sets the kernel's read-ahead policy for a mapped file. Parsing touches a
/// few scattered pages (the pickle, every zip entry's local header, the
/// central directory); with the default policy each of those faults also
/// reads ahead up to `read_ahead_kb` (often MiBs) of tensor data on a cold
/// cache, so `open` uses `Random` while parsing and restores `Normal` for
/// the sequential reads of tensor data that may follow.
fn advise(map: &Backing, random: bool) {
    #[cfg(unix)]
    if let Backing::Map(m, _) = map {
        let advice = if random { memmap2::Advice::Random } else { memmap2::Advice::Normal };
        let _ = m.advise(advice); // only a hint
    }
    #[cfg(not(unix))]
    let _ = (map, random);
}

impl Checkpoint {
    /// Reads a `.pt`/`.ckpt`/`.pth`/`.bin` (zip or legacy, by content) or a
    /// `.safetensors` file, with default limits. Tensor data is mapped, not
    /// read, where the file stores it uncompressed.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, &ReadOptions::default())
    }

    /// [`Checkpoint::open`] with explicit limits.
    pub fn open_with(path: impl AsRef<Path>, opts: &ReadOptions) -> Result<Self> {
        let path = path.as_ref();
        let map = map_file(path)?;
        advise(&map, true);
        let parsed = Self::parse(path.display().to_string(), &map, is_safetensors_path(path), opts);
        advise(&map, false);
        parsed
    }

    /// Reads a checkpoint held in memory (any format [`Checkpoint::open`]
    /// reads); `name` is used in messages. Storages are ranges of `bytes`.
    pub fn from_bytes(bytes: Vec<u8>, name: &str, opts: &ReadOptions) -> Result<Self> {
        Self::parse(name.to_owned(), &Arc::new(Backing::Mem(bytes)), false, opts)
    }

    fn parse(shown: String, map: &Arc<Backing>, safetensors_name: bool, opts: &ReadOptions) -> Result<Self> {
        if map.starts_with(b"PK") {
            let Parsed { root, storages, prefix, .. } = read_zip(&shown, map, opts)?;
            let prefix = prefix.unwrap_or_default();
            return Ok(Checkpoint { root, storages, path: shown, format: Format::TorchZip { prefix } });
        }
        if is_legacy(map) {
            let Parsed { root, storages, .. } = read_legacy(&shown, map, opts)?;
            return Ok(Checkpoint { root, storages, path: shown, format: Format::TorchLegacy });
        }
        if safetensors_name || crate::safetensors_io::looks_like_safetensors(map) {
            return crate::safetensors_io::read(&shown, map, opts);
        }
        Err(CkptError::Container {
            path: shown,
            reason: "neither a torch zip archive, a legacy torch.save stream, nor a safetensors file".into(),
        })
    }

    /// A checkpoint built in memory from a tree and its storages.
    pub fn from_parts(root: Node, storages: HashMap<String, Storage>) -> Self {
        Checkpoint { root, storages, path: "<memory>".into(), format: Format::Memory }
    }

    /// The root value (a dict for every ProtoMotions checkpoint).
    pub fn root(&self) -> &Node {
        &self.root
    }

    /// The container it was read from.
    pub fn format(&self) -> &Format {
        &self.format
    }

    /// The file it came from, as given (`<memory>` for one built in memory), for messages.
    pub fn path_str(&self) -> &str {
        &self.path
    }

    /// Every tensor with its dotted key, in tree order.
    pub fn tensors(&self) -> Vec<(String, &TensorRef)> {
        let mut out = Vec::new();
        self.root.walk(&mut |path, node| {
            if let Node::Tensor(t) = node {
                out.push((dotted(path), t));
            }
            true
        });
        out
    }

    /// The node at a dotted key. Dict keys may themselves contain dots
    /// (state dicts do): the longest key that matches wins.
    pub fn get(&self, key: &str) -> Option<&Node> {
        lookup(&self.root, key)
    }

    /// The tensor at a dotted key, or an error naming the key.
    pub fn tensor(&self, key: &str) -> Result<&TensorRef> {
        match self.get(key) {
            Some(Node::Tensor(t)) => Ok(t),
            Some(other) => Err(CkptError::Value {
                path: self.path.clone(),
                key: key.to_owned(),
                reason: format!("is a {}, not a tensor", other.kind()),
            }),
            None => Err(CkptError::NotFound { path: self.path.clone(), key: key.to_owned() }),
        }
    }

    /// The storage of a tensor.
    pub fn storage_of(&self, t: &TensorRef) -> Result<&Storage> {
        self.storages.get(&t.storage).ok_or_else(|| CkptError::Value {
            path: self.path.clone(),
            key: t.storage.clone(),
            reason: "tensor refers to a storage that is not in the checkpoint".into(),
        })
    }

    /// The tensor's elements as C-contiguous little-endian bytes: borrowed
    /// from the storage when the view is contiguous, gathered otherwise.
    pub fn tensor_bytes(&self, t: &TensorRef) -> Result<Cow<'_, [u8]>> {
        let storage = self.storage_of(t)?;
        let bad = |reason: String| CkptError::Value { path: self.path.clone(), key: t.storage.clone(), reason };
        let elem = t.dtype.size();
        if t.numel() == 0 {
            return Ok(Cow::Borrowed(&[]));
        }
        let extent = t.extent().and_then(|e| e.checked_mul(elem)).ok_or_else(|| bad("view overflows".into()))?;
        if extent > storage.data.len() {
            return Err(bad(format!("view reaches byte {extent} of a {}-byte storage", storage.data.len())));
        }
        if t.is_contiguous() {
            let start = t.offset * elem;
            return Ok(Cow::Borrowed(&storage.data[start..start + t.nbytes()]));
        }
        let mut out = Vec::with_capacity(t.nbytes());
        gather(&storage.data, elem, t.offset, &t.shape, &t.stride, &mut out);
        Ok(Cow::Owned(out))
    }

    /// The tensor as a candle tensor on `device` (copied; candle owns its memory).
    pub fn to_candle(&self, t: &TensorRef, device: &candle_core::Device) -> Result<candle_core::Tensor> {
        let dtype = t.dtype.candle().ok_or_else(|| CkptError::UnsupportedDtype {
            key: t.storage.clone(),
            dtype: format!("{} (candle has no such dtype)", t.dtype),
        })?;
        let bytes = self.tensor_bytes(t)?;
        candle_core::Tensor::from_raw_buffer(&bytes, dtype, &t.shape, device)
            .map_err(|source| CkptError::Candle { key: t.storage.clone(), source: Box::new(source) })
    }

    /// Globals in the tree that `torch.load(weights_only=True)` would
    /// reject, with their dotted keys: what `inspect` flags and what
    /// writing a `.pt` refuses without `allow_unsafe_globals`.
    pub fn unsafe_globals(&self) -> Vec<(String, String)> {
        crate::safety::unsafe_globals(&self.root)
    }

    /// The source file name, for messages.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(&self.path)
    }
}

pub(crate) fn is_safetensors_path(path: &Path) -> bool {
    path.extension().and_then(|e| e.to_str()).is_some_and(|e| e.eq_ignore_ascii_case("safetensors"))
}

fn lookup<'a>(node: &'a Node, key: &str) -> Option<&'a Node> {
    if key.is_empty() {
        return Some(node);
    }
    match node {
        Node::Dict(d) => lookup_in_dict(d, key),
        // An object's fields read like a dict's entries (`agent.model.actor`).
        Node::Object(o) => lookup_in_dict(o.fields()?, key),
        Node::List(xs) | Node::Tuple(xs) => {
            let (head, rest) = key.split_once('.').unwrap_or((key, ""));
            let i: usize = head.parse().ok()?;
            lookup(xs.get(i)?, rest)
        }
        _ => None,
    }
}

fn lookup_in_dict<'a>(d: &'a crate::tree::Dict, key: &str) -> Option<&'a Node> {
    // Longest matching key first: state-dict keys contain dots.
    let mut best: Option<(&Node, &str)> = None;
    for (k, v) in &d.entries {
        let label = match k {
            Node::Str(s) => Cow::Borrowed(s.as_str()),
            Node::Int(i) => Cow::Owned(i.to_string()),
            _ => continue,
        };
        let rest =
            if key == label { Some("") } else { key.strip_prefix(label.as_ref()).and_then(|r| r.strip_prefix('.')) };
        if let Some(rest) = rest {
            if best.is_none_or(|(_, r)| rest.len() < r.len()) {
                best = Some((v, rest));
            }
        }
    }
    let (v, rest) = best?;
    lookup(v, rest)
}

/// Appends the elements of a strided view to `out` in C order.
fn gather(data: &[u8], elem: usize, offset: usize, shape: &[usize], stride: &[usize], out: &mut Vec<u8>) {
    if shape.is_empty() {
        out.extend_from_slice(&data[offset * elem..(offset + 1) * elem]);
        return;
    }
    if shape.len() == 1 {
        for i in 0..shape[0] {
            let at = (offset + i * stride[0]) * elem;
            out.extend_from_slice(&data[at..at + elem]);
        }
        return;
    }
    for i in 0..shape[0] {
        gather(data, elem, offset + i * stride[0], &shape[1..], &stride[1..], out);
    }
}

impl Checkpoint {
    /// Checks every tensor against its storage: the storage exists, typed
    /// storages match the tensor's dtype, and the view stays inside it.
    pub fn validate(&self) -> Result<()> {
        for (key, t) in self.tensors() {
            let bad = |reason: String| CkptError::Value { path: self.path.clone(), key: key.clone(), reason };
            let storage = self.storages.get(&t.storage).ok_or_else(|| bad(format!("no storage {}", t.storage)))?;
            if t.shape.len() != t.stride.len() {
                return Err(bad(format!("size {:?} and stride {:?} differ in length", t.shape, t.stride)));
            }
            if storage.typed && storage.dtype != t.dtype {
                return Err(bad(format!("a {} tensor over a {} storage", t.dtype, storage.dtype)));
            }
            if t.numel() == 0 {
                continue;
            }
            let end = t.extent().and_then(|e| e.checked_mul(t.dtype.size()));
            if end.is_none_or(|e| e > storage.data.len()) {
                return Err(bad(format!(
                    "view (offset {}, size {:?}, stride {:?}) leaves its {}-byte storage",
                    t.offset,
                    t.shape,
                    t.stride,
                    storage.data.len()
                )));
            }
        }
        Ok(())
    }

    /// Writes the checkpoint, choosing the format by extension: `.safetensors`
    /// is safetensors (the whole tree), anything else (`.pt`, `.pth`,
    /// `.ckpt`, `.bin`) torch.save's zip layout. Atomic.
    pub fn save(&self, path: impl AsRef<Path>, allow_unsafe_globals: bool) -> Result<()> {
        let path = path.as_ref();
        if is_safetensors_path(path) {
            let opts = crate::SafetensorsOptions { allow_unsafe_globals, ..Default::default() };
            crate::save_safetensors(self, path, &opts).map(|_| ())
        } else {
            let opts = crate::SaveOptions { allow_unsafe_globals, ..Default::default() };
            crate::save_torch(self, path, &opts)
        }
    }
}
