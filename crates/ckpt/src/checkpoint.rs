//! [`Checkpoint`]: a file's tree and storages, validated once.
//!
//! Every reader (torch zip, torch legacy, safetensors) returns a [`Parsed`];
//! only this module turns one into a `Checkpoint`, after checking every
//! tensor against its storage. Everything downstream (writers, normalizers,
//! candle) trusts a `Checkpoint` and never re-checks.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{CkptError, ReadLimit, Result, ValueProblem};
use crate::io::source::Source;
use crate::io::storage::Storage;
use crate::parsed::Parsed;
use crate::parsed::{Format, ReadOptions};
use crate::tree::{dotted, Node, TensorRef};

/// A checkpoint: the tree `torch.load` would return, as inert data, and
/// the storages its tensors view. Built only by validating constructors,
/// so every tensor it holds lies inside its storage.
///
/// ```no_run
/// use pmstate_ckpt::Checkpoint;
/// let ckpt = Checkpoint::open("last.ckpt")?;
/// for (key, t) in ckpt.tensors() {
///     println!("{key}: {} {}", t.dtype, pmstate_ckpt::Shape(&t.shape));
/// }
/// let w = ckpt.tensor("model._actor.mu.mlp.0.weight")?;
/// let w = ckpt.to_candle(w, &candle_core::Device::Cpu)?;
/// println!("{:?}", w.dims());
/// # Ok::<(), pmstate_ckpt::CkptError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Checkpoint {
    root: Node,
    storages: HashMap<String, Storage>,
    path: String,
    format: Format,
    source: Option<Arc<Source>>,
    options: ReadOptions,
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Source({} bytes)", self.len())
    }
}

impl Checkpoint {
    /// Reads a `.pt`/`.ckpt`/`.pth`/`.bin` (zip or legacy, by content) or a
    /// `.safetensors` file, with default limits. Tensor data is read only
    /// when asked for.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, &ReadOptions::default())
    }

    /// [`Checkpoint::open`] with explicit limits.
    pub fn open_with(path: impl AsRef<Path>, opts: &ReadOptions) -> Result<Self> {
        Self::open_with_progress(path, opts, &|_, _| {})
    }

    /// [`Checkpoint::open_with`], calling `progress(done, total)` while it
    /// inflates compressed (deflated) records: the bytes inflated so far
    /// and what all compressed records declare, every 4 MiB or so. The
    /// only part of opening that reads all of a large file (stored records
    /// and safetensors data are mapped, not read), so what a progress bar
    /// shows. Never called for a file without compressed records.
    pub fn open_with_progress(path: impl AsRef<Path>, opts: &ReadOptions, progress: &dyn Fn(u64, u64)) -> Result<Self> {
        let path = path.as_ref();
        let src = Arc::new(Source::open(path)?);
        let by_name = Format::for_path(path).is_some_and(|f| matches!(f, Format::Safetensors { .. }));
        let ckpt = Self::parse(path.display().to_string(), src, by_name, opts, progress)?;
        ckpt.check_unchanged()?;
        Ok(ckpt)
    }

    /// Reads a checkpoint held in memory (any format [`Checkpoint::open`]
    /// reads); `name` is used in messages. Storages are ranges of `bytes`.
    pub fn from_bytes(bytes: Vec<u8>, name: &str, opts: &ReadOptions) -> Result<Self> {
        Self::parse(name.to_owned(), Arc::new(Source::Mem(bytes)), false, opts, &|_, _| {})
    }

    fn parse(
        shown: String,
        src: Arc<Source>,
        safetensors_name: bool,
        opts: &ReadOptions,
        progress: &dyn Fn(u64, u64),
    ) -> Result<Self> {
        let head = src.read_vec(0, src.len().min(16) as usize)?;
        let parsed = if head.starts_with(b"PK") {
            crate::torch::read_zip(&shown, &src, opts, progress)?
        } else if crate::torch::is_legacy(&head) {
            crate::torch::read_legacy(&shown, &src, opts)?
        } else if safetensors_name || crate::safetensors::looks_like_safetensors(&head, src.len()) {
            crate::safetensors::read(&shown, &src, opts)?
        } else {
            return Err(CkptError::NotACheckpoint { path: shown });
        };
        Self::from_parsed(shown, Some(src), parsed, *opts)
    }

    /// A checkpoint built in memory from a tree and its storages, validated
    /// as a read one is (every tensor inside its storage, one object
    /// identity per tensor, dtypes agreeing with typed storages).
    pub fn from_parts(root: Node, storages: HashMap<String, Storage>) -> Result<Self> {
        let parsed = Parsed { root, storages, format: Format::Memory };
        Self::from_parsed("<memory>".into(), None, parsed, ReadOptions::default())
    }

    pub(crate) fn from_parsed(
        path: String,
        source: Option<Arc<Source>>,
        parsed: Parsed,
        options: ReadOptions,
    ) -> Result<Self> {
        let Parsed { root, storages, format } = parsed;
        let ckpt = Checkpoint { root, storages, path, format, source, options };
        ckpt.validate()?;
        Ok(ckpt)
    }

    /// The tree and the storages, taken apart (to edit the tree and build a
    /// new checkpoint with [`Checkpoint::from_parts`]).
    pub fn into_parts(self) -> (Node, HashMap<String, Storage>) {
        (self.root, self.storages)
    }

    /// The root value (a dict for every ProtoMotions checkpoint).
    pub fn root(&self) -> &Node {
        &self.root
    }

    pub(crate) fn root_mut(&mut self) -> &mut Node {
        &mut self.root
    }

    /// The storages, by key.
    pub fn storages(&self) -> &HashMap<String, Storage> {
        &self.storages
    }

    pub(crate) fn add_storage(&mut self, key: String, storage: Storage) {
        self.storages.insert(key, storage);
    }

    /// The container it was read from.
    pub fn format(&self) -> &Format {
        &self.format
    }

    /// The file it came from, as given (`<memory>` for one built in memory), for messages.
    pub fn path_str(&self) -> &str {
        &self.path
    }

    /// The source file name, for messages.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(&self.path)
    }

    /// The limits it was read with.
    pub fn read_options(&self) -> &ReadOptions {
        &self.options
    }

    /// Errors with [`CkptError::InputChanged`] if the input file was
    /// rewritten in place since it was opened. Writers call it before
    /// committing their output.
    pub fn check_unchanged(&self) -> Result<()> {
        match &self.source {
            Some(src) => src.check_unchanged(),
            None => Ok(()),
        }
    }

    /// Every tensor with its dotted key, in tree order: also those inside
    /// dict keys, `_metadata` and objects.
    pub fn tensors(&self) -> Vec<(String, &TensorRef)> {
        let mut out = Vec::new();
        self.root.walk_all(&mut |path, node| {
            if let Node::Tensor(t) = node {
                out.push((dotted(path), &**t));
            }
            true
        });
        out
    }

    /// The node at a dotted key. Dict keys may themselves contain dots
    /// (state dicts do): the longest key that matches wins. Dataclass
    /// fields are reached like dict entries (`agent.model.actor`).
    pub fn get(&self, key: &str) -> Option<&Node> {
        lookup(&self.root, key)
    }

    /// The tensor at a dotted key, or an error naming the key.
    pub fn tensor(&self, key: &str) -> Result<&TensorRef> {
        match self.get(key) {
            Some(Node::Tensor(t)) => Ok(t),
            Some(other) => Err(CkptError::WrongKind {
                path: self.path.clone(),
                key: key.to_owned(),
                expected: "tensor",
                found: other.kind(),
            }),
            None => Err(self.not_found(key)),
        }
    }

    /// A [`CkptError::NotFound`] for `key`, naming the nearest tensor keys.
    pub(crate) fn not_found(&self, key: &str) -> CkptError {
        let keys = self.tensors();
        let closest = crate::suggest::closest(key, keys.iter().map(|(k, _)| k.as_str()));
        CkptError::NotFound { path: self.path.clone(), key: key.to_owned(), closest }
    }

    /// The storage of a tensor of this checkpoint.
    pub fn storage_of(&self, t: &TensorRef) -> Result<&Storage> {
        self.storage(&t.storage)
    }

    /// The storage under `key`.
    pub fn storage(&self, key: &str) -> Result<&Storage> {
        self.storages.get(key).ok_or_else(|| CkptError::Value {
            path: self.path.clone(),
            key: key.to_owned(),
            problem: ValueProblem::MissingStorage(key.to_owned()),
        })
    }

    /// The tensor's elements as C-contiguous little-endian bytes: borrowed
    /// from the storage when the view is contiguous and the storage is in
    /// memory, read or gathered otherwise. A view that would expand past
    /// [`ReadOptions::max_view_bytes`] (a stride-0 view of a few elements
    /// claiming terabytes) is [`CkptError::Limit`] naming its storage
    /// (callers that know the tensor's key name it: diff, export, normalizers).
    pub fn tensor_bytes(&self, t: &TensorRef) -> Result<Cow<'_, [u8]>> {
        self.tensor_bytes_at(None, t)
    }

    /// [`Checkpoint::tensor_bytes`], naming the tensor's dotted `key` (when
    /// known) in a refusal.
    pub(crate) fn tensor_bytes_at(&self, key: Option<&str>, t: &TensorRef) -> Result<Cow<'_, [u8]>> {
        let storage = self.storage_of(t)?;
        let elem = t.dtype.size();
        let nbytes = t.checked_nbytes().ok_or_else(|| {
            self.value_err(key.unwrap_or(&t.storage), ValueProblem::Overflow { what: "element count" })
        })?;
        if nbytes == 0 {
            return Ok(Cow::Borrowed(&[]));
        }
        // Validated at construction: the view lies inside the storage.
        let extent = t.extent().unwrap_or(0);
        if t.is_contiguous() {
            return storage.data.read_range(t.offset * elem, nbytes);
        }
        self.check_view_bytes(key, t, nbytes)?;
        let base = t.offset * elem;
        let span = storage.data.read_range(base, extent * elem - base)?;
        let mut out = Vec::with_capacity(nbytes);
        gather(&span, elem, &t.shape, &t.stride, &mut out);
        Ok(Cow::Owned(out))
    }

    /// Refuses expanding the non-contiguous view `t` of `nbytes` past
    /// [`ReadOptions::max_view_bytes`], naming `key` when known, else its storage.
    pub(crate) fn check_view_bytes(&self, key: Option<&str>, t: &TensorRef, nbytes: usize) -> Result<()> {
        let storage_len = self.storage_of(t)?.data.len() as u64;
        let limit = self.options.max_view_bytes.unwrap_or(storage_len.saturating_mul(4) + (64 << 20));
        if nbytes as u64 <= limit {
            return Ok(());
        }
        Err(CkptError::Limit {
            path: self.path.clone(),
            limit: ReadLimit::ViewBytes {
                key: key.map(str::to_owned),
                storage: t.storage.clone(),
                shape: t.shape.clone(),
            },
            max: limit,
            needed: nbytes as u64,
        })
    }

    fn value_err(&self, key: &str, problem: ValueProblem) -> CkptError {
        CkptError::Value { path: self.path.clone(), key: key.to_owned(), problem }
    }

    /// Globals in the tree that `torch.load(weights_only=True)` would
    /// reject, with their dotted keys: what `inspect` flags and what both
    /// writers refuse unless the caller allows them.
    pub fn unsafe_globals(&self) -> Vec<(String, String)> {
        crate::torch::unsafe_globals(&self.root)
    }

    /// Globals in the tree that have no place in ProtoMotions' resolved
    /// configs ([`crate::is_config_global`]), with their dotted keys: the
    /// configs' own dataclasses and enums are expected there (torch's safe
    /// loader rejects those too), `posix.system` is not.
    pub fn foreign_config_globals(&self) -> Vec<(String, String)> {
        crate::torch::globals_outside(&self.root, crate::torch::is_config_global)
    }

    /// Checks every tensor (wherever it sits in the tree) against its
    /// storage: the storage exists, typed storages match the tensor's dtype,
    /// the element count fits, the view stays inside; and tensors sharing an
    /// object identity are the same tensor.
    fn validate(&self) -> Result<()> {
        let mut identities: HashMap<u64, &TensorRef> = HashMap::new();
        let mut failure = None;
        self.root.walk_all(&mut |path, node| {
            let Node::Tensor(t) = node else { return true };
            if let Err(problem) = self.check_tensor(t, &mut identities) {
                let key = if path.is_empty() { "<root>".to_owned() } else { dotted(path) };
                failure.get_or_insert_with(|| self.value_err(&key, problem));
                return false;
            }
            true
        });
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn check_tensor<'a>(
        &self,
        t: &'a TensorRef,
        identities: &mut HashMap<u64, &'a TensorRef>,
    ) -> Result<(), ValueProblem> {
        let storage = self.storages.get(&t.storage).ok_or_else(|| ValueProblem::MissingStorage(t.storage.clone()))?;
        if t.shape.len() != t.stride.len() {
            return Err(ValueProblem::RankMismatch { shape: t.shape.clone(), stride: t.stride.clone() });
        }
        if storage.typed && storage.dtype != t.dtype {
            return Err(ValueProblem::DtypeMismatch {
                storage: t.storage.clone(),
                tensor: t.dtype,
                declared: storage.dtype,
            });
        }
        t.checked_nbytes().ok_or(ValueProblem::Overflow { what: "element count" })?;
        if let Some(id) = t.object {
            if let Some(first) = identities.insert(id, t) {
                if first != t {
                    return Err(ValueProblem::ObjectIdentity(id));
                }
            }
        }
        if t.numel() == 0 {
            return Ok(());
        }
        let extent = t.extent().ok_or(ValueProblem::Overflow { what: "view extent" })?;
        let end = extent.checked_mul(t.dtype.size()).ok_or(ValueProblem::Overflow { what: "view extent" })?;
        if end > storage.data.len() {
            return Err(ValueProblem::ViewPastStorage(Box::new(crate::error::View {
                offset: t.offset,
                shape: t.shape.clone(),
                stride: t.stride.clone(),
                extent,
                storage_bytes: storage.data.len(),
            })));
        }
        Ok(())
    }
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

/// The longest dotted prefix of `key` that is a key of `d` (state-dict keys
/// contain dots), then the rest below it: one hash lookup per dot.
fn lookup_in_dict<'a>(d: &'a crate::tree::Dict, key: &str) -> Option<&'a Node> {
    let (position, rest) = split_key(d, key)?;
    lookup(d.value_at(position), rest)
}

/// The entry of `d` the longest dotted prefix of `key` names, and the rest of `key`.
pub(crate) fn split_key<'k>(d: &crate::tree::Dict, key: &'k str) -> Option<(usize, &'k str)> {
    if let Some(i) = d.position_of_label(key) {
        return Some((i, ""));
    }
    let mut end = key.len();
    while let Some(dot) = key[..end].rfind('.') {
        if let Some(i) = d.position_of_label(&key[..dot]) {
            return Some((i, &key[dot + 1..]));
        }
        end = dot;
    }
    None
}

/// Appends the elements of a strided view of `span` (which starts at the
/// view's first element) to `out` in C order. Iterative: a tensor of ten
/// thousand dimensions costs no stack.
fn gather(span: &[u8], elem: usize, shape: &[usize], stride: &[usize], out: &mut Vec<u8>) {
    let rank = shape.len();
    let mut index = vec![0usize; rank];
    let mut at = 0usize;
    loop {
        out.extend_from_slice(&span[at * elem..(at + 1) * elem]);
        // Advance the multi-index, last dimension fastest.
        let mut d = rank;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            if index[d] + 1 < shape[d] {
                index[d] += 1;
                at += stride[d];
                break;
            }
            at -= index[d] * stride[d];
            index[d] = 0;
        }
    }
}
