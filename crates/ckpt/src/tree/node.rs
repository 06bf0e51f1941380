//! The recursive types of the checkpoint tree: [`Node`] (one value),
//! [`Dict`] and [`Object`], which hold nodes. They are defined together
//! because each holds the others; `dict` implements the dict's behaviour
//! (lookups, duplicate keys), so every other module depends on this one and
//! this one on none of them.

use std::collections::HashMap;
use std::fmt;
use std::sync::OnceLock;

use pmstate_norm::Dims as Shape;

use super::tensor::TensorRef;

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
    /// A tensor or parameter (boxed: a tree holds far more scalars than tensors).
    Tensor(Box<TensorRef>),
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
    Opaque(Box<pmstate_pickle::Value>),
}

/// Which Python class a [`Dict`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DictKind {
    /// A plain `dict`.
    #[default]
    Plain,
    /// A `collections.OrderedDict` (what state dicts are).
    Ordered,
}

impl DictKind {
    /// The Python class name: `dict` or `OrderedDict`.
    pub fn class_name(self) -> &'static str {
        match self {
            DictKind::Plain => "dict",
            DictKind::Ordered => "OrderedDict",
        }
    }
}

/// A dict: `dict` or `collections.OrderedDict`, entries in order, keys unique.
///
/// Lookups by a string or int key are O(1) (an index built on first use
/// for dicts of 16 entries or more): a state dict of 50,000 keys costs no
/// more per lookup than one of 5. Its methods are in `dict`.
#[derive(Clone)]
pub struct Dict {
    pub(super) kind: DictKind,
    pub(super) entries: Vec<(Node, Node)>,
    pub(super) state: Option<Box<Node>>,
    pub(super) index: OnceLock<Box<Index>>,
}

/// A dict's index: the position of every string and int key.
#[derive(Default)]
pub(super) struct Index {
    pub(super) strs: HashMap<String, usize>,
    pub(super) ints: HashMap<i64, usize>,
}

impl Clone for Index {
    fn clone(&self) -> Self {
        Index { strs: self.strs.clone(), ints: self.ints.clone() }
    }
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
            Node::Dict(d) => d.kind.class_name(),
            Node::Tensor(t) if t.is_parameter() => "Parameter",
            Node::Tensor(_) => "Tensor",
            Node::Device { .. } => "device",
            Node::TorchDtype(_) => "dtype",
            Node::Global { .. } => "global",
            Node::Object(_) => "object",
            Node::Opaque(_) => "opaque",
        }
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
            Node::Opaque(v) => match &**v {
                pmstate_pickle::Value::Global { module, name } => write!(f, "<global {module}.{name}>"),
                _ => f.write_str("<opaque pickle value>"),
            },
        }
    }
}
