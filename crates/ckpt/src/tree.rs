//! The checkpoint tree: what `torch.load` would return, as inert data.

use std::fmt;

use crate::dtype::DType;

/// A key of a dict in the tree, as one component of a path.
#[derive(Debug, Clone, PartialEq)]
pub enum Key<'a> {
    /// A string key (state dict names, `"model"`).
    Str(&'a str),
    /// An integer key (optimizer `state` entries) or a list index.
    Int(i64),
    /// Any other key, shown by its debug form.
    Other(String),
}

impl fmt::Display for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Str(s) => f.write_str(s),
            Key::Int(i) => write!(f, "{i}"),
            Key::Other(s) => f.write_str(s),
        }
    }
}

/// Joins path components with dots, as state dicts name their entries
/// (`model._actor.mu.weight`, `actor_optimizer.state.0.exp_avg`).
pub fn dotted(path: &[Key<'_>]) -> String {
    let mut s = String::new();
    for (i, k) in path.iter().enumerate() {
        if i > 0 {
            s.push('.');
        }
        s.push_str(&k.to_string());
    }
    s
}

/// A dict: `dict` or `collections.OrderedDict`, entries in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Dict {
    /// `OrderedDict` (true) or a plain `dict`.
    pub ordered: bool,
    /// The entries in insertion order.
    pub entries: Vec<(Node, Node)>,
    /// The object state torch restores with `BUILD` (`{'_metadata': ...}` on a state dict).
    pub state: Option<Box<Node>>,
}

impl Dict {
    /// The value under string key `key`.
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.entries.iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v)
    }

    /// The value under string key `key`, mutably.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut Node> {
        self.entries.iter_mut().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v)
    }

    /// Sets `key` to `value`, in place if present, else at the end.
    pub fn insert(&mut self, key: &str, value: Node) {
        match self.get_mut(key) {
            Some(slot) => *slot = value,
            None => self.entries.push((Node::Str(key.to_owned()), value)),
        }
    }

    /// The `_metadata` of a state dict (its `BUILD` state's `_metadata`).
    pub fn metadata(&self) -> Option<&Node> {
        match self.state.as_deref() {
            Some(Node::Dict(d)) => d.get("_metadata"),
            _ => None,
        }
    }
}

/// A tensor: a view (offset, shape, strides in elements) of a storage.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorRef {
    /// Key of its storage in [`crate::Checkpoint::storages`].
    pub storage: String,
    /// Element type.
    pub dtype: DType,
    /// Offset into the storage, in elements.
    pub offset: usize,
    /// Sizes.
    pub shape: Vec<usize>,
    /// Strides, in elements.
    pub stride: Vec<usize>,
    /// `requires_grad` of the tensor.
    pub requires_grad: bool,
    /// `Some(requires_grad)` when it was an `nn.Parameter` (`_rebuild_parameter`).
    pub parameter: Option<bool>,
    /// Python object identity: tensors with the same `Some(id)` are one
    /// object under several keys (torch pickles it once, then by memo).
    /// Distinct views of one storage (a state dict's tied weights) share
    /// the storage, not the object.
    pub object: Option<u64>,
}

impl TensorRef {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// A plain tensor covering `storage` from its start, C-contiguous
    /// (what a freshly written buffer is).
    pub fn contiguous(storage: String, dtype: DType, shape: Vec<usize>) -> TensorRef {
        let stride = Self::contiguous_stride(&shape);
        TensorRef { storage, dtype, offset: 0, shape, stride, requires_grad: false, parameter: None, object: None }
    }

    /// What torch reports as `requires_grad`: the parameter's flag for an
    /// `nn.Parameter`, the tensor's otherwise.
    pub fn effective_requires_grad(&self) -> bool {
        self.parameter.unwrap_or(self.requires_grad)
    }

    /// Bytes of its elements (contiguous).
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }

    /// C-contiguous strides for `shape`.
    pub fn contiguous_stride(shape: &[usize]) -> Vec<usize> {
        let mut stride = vec![0; shape.len()];
        let mut acc = 1usize;
        for (s, &d) in stride.iter_mut().zip(shape).rev() {
            *s = acc;
            acc = acc.saturating_mul(d.max(1));
        }
        stride
    }

    /// Whether the elements are laid out C-contiguously (size-1 dims ignore their stride, as torch does).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1usize;
        for (&d, &s) in self.shape.iter().zip(&self.stride).rev() {
            if d == 0 {
                return true;
            }
            if d != 1 && s != expected {
                return false;
            }
            expected = expected.saturating_mul(d);
        }
        true
    }

    /// One past the last element the view touches, in elements (`offset` for an empty view).
    pub fn extent(&self) -> Option<usize> {
        if self.shape.contains(&0) {
            return Some(self.offset);
        }
        let mut last = self.offset;
        for (&d, &s) in self.shape.iter().zip(&self.stride) {
            last = last.checked_add((d - 1).checked_mul(s)?)?;
        }
        last.checked_add(1)
    }
}

/// One value of the tree.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// `None`.
    None,
    /// A bool.
    Bool(bool),
    /// An int that fits in i64.
    Int(i64),
    /// A larger int: little-endian two's complement.
    BigInt(Vec<u8>),
    /// A float.
    Float(f64),
    /// A complex number (`builtins.complex`).
    Complex(f64, f64),
    /// A string.
    Str(String),
    /// `bytes`.
    Bytes(Vec<u8>),
    /// A list.
    List(Vec<Node>),
    /// A tuple.
    Tuple(Vec<Node>),
    /// A set, in pickled order.
    Set(Vec<Node>),
    /// A dict or OrderedDict.
    Dict(Dict),
    /// A tensor or parameter.
    Tensor(TensorRef),
    /// `torch.device(type, index)`.
    Device {
        /// `cpu`, `cuda`, ...
        kind: String,
        /// The device index, if given.
        index: Option<i64>,
    },
    /// A dtype object (`torch.float32`), by torch's name.
    TorchDtype(String),
    /// Anything else, kept as the inert pickle value it was read as: a
    /// global torch's safe loader may reject ([`crate::Checkpoint::unsafe_globals`]).
    Opaque(pmstate_pickle::Value),
}

impl Node {
    /// The string of a `Str`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Node::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The dict of a `Dict`.
    pub fn as_dict(&self) -> Option<&Dict> {
        match self {
            Node::Dict(d) => Some(d),
            _ => None,
        }
    }

    /// The dict of a `Dict`, mutably.
    pub fn as_dict_mut(&mut self) -> Option<&mut Dict> {
        match self {
            Node::Dict(d) => Some(d),
            _ => None,
        }
    }

    /// The tensor of a `Tensor`.
    pub fn as_tensor(&self) -> Option<&TensorRef> {
        match self {
            Node::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// The value under string key `key` of a dict.
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.as_dict()?.get(key)
    }

    /// A short name of the kind of value (`OrderedDict`, `Tensor`, `int`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Node::None => "None",
            Node::Bool(_) => "bool",
            Node::Int(_) | Node::BigInt(_) => "int",
            Node::Float(_) => "float",
            Node::Complex(..) => "complex",
            Node::Str(_) => "str",
            Node::Bytes(_) => "bytes",
            Node::List(_) => "list",
            Node::Tuple(_) => "tuple",
            Node::Set(_) => "set",
            Node::Dict(d) if d.ordered => "OrderedDict",
            Node::Dict(_) => "dict",
            Node::Tensor(t) if t.parameter.is_some() => "Parameter",
            Node::Tensor(_) => "Tensor",
            Node::Device { .. } => "device",
            Node::TorchDtype(_) => "dtype",
            Node::Opaque(_) => "opaque",
        }
    }

    /// Visits every node depth-first in order with its path (dict keys
    /// and list/tuple/set indices). `_metadata` and other BUILD states are
    /// not visited. Stops early when `f` returns `false` for a node (its
    /// children are skipped).
    pub fn walk<'a>(&'a self, f: &mut dyn FnMut(&[Key<'a>], &'a Node) -> bool) {
        let mut path = Vec::new();
        walk_inner(self, &mut path, f);
    }
}

fn key_of(k: &Node) -> Key<'_> {
    match k {
        Node::Str(s) => Key::Str(s),
        Node::Int(i) => Key::Int(*i),
        other => Key::Other(format!("{other:?}")),
    }
}

fn walk_inner<'a>(node: &'a Node, path: &mut Vec<Key<'a>>, f: &mut dyn FnMut(&[Key<'a>], &'a Node) -> bool) {
    if !f(path, node) {
        return;
    }
    match node {
        Node::List(xs) | Node::Tuple(xs) | Node::Set(xs) => {
            for (i, x) in xs.iter().enumerate() {
                path.push(Key::Int(i as i64));
                walk_inner(x, path, f);
                path.pop();
            }
        }
        Node::Dict(d) => {
            for (k, v) in &d.entries {
                path.push(key_of(k));
                walk_inner(v, path, f);
                path.pop();
            }
        }
        _ => {}
    }
}
