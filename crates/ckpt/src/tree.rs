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
    /// Any other key (a tuple, a float, an opaque object), shown in words.
    Other(String),
    /// The key itself of the dict's entry at this index (visited by [`Node::walk_all`] only).
    EntryKey(usize),
    /// The `BUILD` state of a dict (`{'_metadata': ...}`; visited by [`Node::walk_all`] only).
    State,
}

impl fmt::Display for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Str(s) => f.write_str(s),
            Key::Int(i) => write!(f, "{i}"),
            Key::Other(s) => f.write_str(s),
            Key::EntryKey(i) => write!(f, "<key of entry {i}>"),
            Key::State => f.write_str("<state>"),
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
    /// The entries in insertion order.
    pub fn entries(&self) -> &[(Node, Node)] {
        &self.entries
    }

    /// Whether it is a `collections.OrderedDict` (else a plain `dict`).
    pub fn is_ordered(&self) -> bool {
        self.ordered
    }

    /// The object state torch restores with `BUILD` (`{'_metadata': ...}` on a state dict).
    pub fn state(&self) -> Option<&Node> {
        self.state.as_deref()
    }

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
    /// A reference to a global (a class, a function, an enum type), never
    /// imported. torch's safe loader rejects most of them
    /// ([`crate::Checkpoint::unsafe_globals`]).
    Global {
        /// The module, e.g. `protomotions.agents.ppo.config`.
        module: String,
        /// The attribute, e.g. `PPOAgentConfig`.
        name: String,
    },
    /// An object the pickle builds by calling a global (a dataclass, an
    /// enum member, anything torch does not itself define), never built:
    /// its parts are nodes, so tensors inside it are tensors of the tree.
    Object(Box<Object>),
    /// Anything else (a `BUILD` of something that is not an object, a
    /// persistent id outside a tensor, a bytearray, a frozenset), kept as
    /// the inert pickle value it was read as.
    Opaque(pmstate_pickle::Value),
}

/// How the pickle creates an [`Object`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Construct {
    /// `REDUCE`: `callable(*args)` (enum members, most `__reduce__` results).
    Reduce,
    /// `NEWOBJ` / `NEWOBJ_EX`: `cls.__new__(cls, *args, **kwargs)` (dataclasses and other plain classes).
    NewObj,
}

/// An object as the pickle describes it; nothing is ever called.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    /// Reduce or new-object.
    pub construct: Construct,
    /// The callable or class (usually a [`Node::Global`]).
    pub callable: Node,
    /// The positional arguments (usually a [`Node::Tuple`]).
    pub args: Node,
    /// Keyword arguments (`NEWOBJ_EX` only).
    pub kwargs: Option<Node>,
    /// The state `BUILD` gives it (`__setstate__` / `__dict__.update`): a
    /// dataclass's fields as a dict of name to value.
    pub state: Option<Node>,
    /// `obj[key] = value` applied to it, in order.
    pub setitems: Vec<(Node, Node)>,
    /// `obj.append(x)` / `obj.extend(xs)` applied to it, in order.
    pub appends: Vec<Node>,
}

impl Object {
    /// `module.name` of its callable when that is a global (`protomotions.agents.ppo.config.PPOAgentConfig`).
    pub fn class_name(&self) -> Option<String> {
        match &self.callable {
            Node::Global { module, name } => Some(format!("{module}.{name}")),
            _ => None,
        }
    }

    /// Its attributes: the BUILD state when that is a dict (a dataclass's fields).
    pub fn fields(&self) -> Option<&Dict> {
        self.state.as_ref().and_then(Node::as_dict)
    }
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
            Node::Global { .. } => "global",
            Node::Object(_) => "object",
            Node::Opaque(_) => "opaque",
        }
    }

    /// Visits every node depth-first in order with its path (dict keys
    /// and list/tuple/set indices). Dict keys themselves, `_metadata` and
    /// other BUILD states are not visited (see [`Node::walk_all`]). Stops
    /// early when `f` returns `false` for a node (its children are skipped).
    pub fn walk<'a>(&'a self, f: &mut dyn FnMut(&[Key<'a>], &'a Node) -> bool) {
        let mut path = Vec::new();
        walk_inner(self, &mut path, Reach::Values, f);
    }

    /// Visits every node of the tree, [`Node::walk`]'s and also each
    /// dict's keys (path component [`Key::EntryKey`]) and BUILD state
    /// ([`Key::State`]) with everything under them: the walk for checks
    /// that must not miss anything (unsafe globals, storage references).
    pub fn walk_all<'a>(&'a self, f: &mut dyn FnMut(&[Key<'a>], &'a Node) -> bool) {
        let mut path = Vec::new();
        walk_inner(self, &mut path, Reach::Everything, f);
    }
}

/// A short human form of a value, for keys that are not strings or ints
/// and for messages: scalars as Python writes them, containers and tensors
/// by kind and size. Never Rust's Debug form.
impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Node::None => f.write_str("None"),
            Node::Bool(true) => f.write_str("True"),
            Node::Bool(false) => f.write_str("False"),
            Node::Int(i) => write!(f, "{i}"),
            Node::BigInt(b) => write!(f, "<int of {} bytes>", b.len()),
            Node::Float(x) => write!(f, "{x:?}"),
            Node::Complex(re, im) => write!(f, "({re:?}{im:+?}j)"),
            Node::Str(s) => write!(f, "'{s}'"),
            Node::Bytes(b) => write!(f, "<bytes of length {}>", b.len()),
            Node::List(xs) | Node::Tuple(xs) | Node::Set(xs) => write!(f, "<{} of {} items>", self.kind(), xs.len()),
            Node::Dict(d) => write!(f, "<{} of {} entries>", self.kind(), d.entries.len()),
            Node::Tensor(t) => write!(f, "<{} {} {}>", self.kind(), t.dtype, Shape(&t.shape)),
            Node::Device { kind, index: Some(i) } => write!(f, "device('{kind}:{i}')"),
            Node::Device { kind, index: None } => write!(f, "device('{kind}')"),
            Node::TorchDtype(name) => write!(f, "torch.{name}"),
            Node::Global { module, name } => write!(f, "<global {module}.{name}>"),
            Node::Object(o) => match o.class_name() {
                Some(c) => write!(f, "<{c} object>"),
                None => f.write_str("<object>"),
            },
            Node::Opaque(v) => match v {
                pmstate_pickle::Value::Global { module, name } => write!(f, "<global {module}.{name}>"),
                _ => f.write_str("<opaque pickle value>"),
            },
        }
    }
}

/// A shape as torch prints one: `[2, 3]`.
pub struct Shape<'a>(pub &'a [usize]);

impl fmt::Display for Shape<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Reach {
    Values,
    Everything,
}

fn key_of(k: &Node) -> Key<'_> {
    match k {
        Node::Str(s) => Key::Str(s),
        Node::Int(i) => Key::Int(*i),
        other => Key::Other(other.to_string()),
    }
}

fn walk_inner<'a>(
    node: &'a Node,
    path: &mut Vec<Key<'a>>,
    reach: Reach,
    f: &mut dyn FnMut(&[Key<'a>], &'a Node) -> bool,
) {
    if !f(path, node) {
        return;
    }
    match node {
        Node::List(xs) | Node::Tuple(xs) | Node::Set(xs) => {
            for (i, x) in xs.iter().enumerate() {
                path.push(Key::Int(i as i64));
                walk_inner(x, path, reach, f);
                path.pop();
            }
        }
        Node::Dict(d) => {
            for (i, (k, v)) in d.entries.iter().enumerate() {
                if reach == Reach::Everything {
                    path.push(Key::EntryKey(i));
                    walk_inner(k, path, reach, f);
                    path.pop();
                }
                path.push(key_of(k));
                walk_inner(v, path, reach, f);
                path.pop();
            }
            if let (Reach::Everything, Some(state)) = (reach, &d.state) {
                path.push(Key::State);
                walk_inner(state, path, reach, f);
                path.pop();
            }
        }
        Node::Object(o) => walk_object(o, path, reach, f),
        _ => {}
    }
}

/// An object's parts: its fields as if it were a dict (`agent.model.actor`
/// names a dataclass attribute), then what else carries values (arguments,
/// stored items); `walk_all` also visits the callable.
fn walk_object<'a>(
    o: &'a Object,
    path: &mut Vec<Key<'a>>,
    reach: Reach,
    f: &mut dyn FnMut(&[Key<'a>], &'a Node) -> bool,
) {
    if reach == Reach::Everything {
        path.push(Key::Other("<callable>".into()));
        walk_inner(&o.callable, path, reach, f);
        path.pop();
    }
    let mut visit = |key: Key<'a>, node: &'a Node, path: &mut Vec<Key<'a>>| {
        path.push(key);
        walk_inner(node, path, reach, f);
        path.pop();
    };
    match &o.args {
        Node::Tuple(xs) if xs.is_empty() => {}
        args => visit(Key::Other("<args>".into()), args, path),
    }
    if let Some(k) = &o.kwargs {
        visit(Key::Other("<kwargs>".into()), k, path);
    }
    match &o.state {
        Some(Node::Dict(d)) if d.state.is_none() => {
            for (i, (k, v)) in d.entries.iter().enumerate() {
                if reach == Reach::Everything {
                    visit(Key::EntryKey(i), k, path);
                }
                visit(key_of(k), v, path);
            }
        }
        Some(state) => visit(Key::State, state, path),
        None => {}
    }
    for (i, (k, v)) in o.setitems.iter().enumerate() {
        if reach == Reach::Everything {
            visit(Key::EntryKey(i), k, path);
        }
        visit(key_of(k), v, path);
    }
    for (i, x) in o.appends.iter().enumerate() {
        visit(Key::Int(i as i64), x, path);
    }
}
