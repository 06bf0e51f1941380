//! The value tree a pickle decodes into.

/// One decoded pickle object.
///
/// Nothing is ever called: `GLOBAL` becomes [`Value::Global`], `REDUCE` a
/// [`Value::Reduce`] node holding the callable and its argument tuple,
/// `BUILD` a [`Value::Build`] node, and persistent ids (torch's storages)
/// a [`Value::PersistentId`]. Interpreting known callables (torch's tensor
/// rebuilds, `OrderedDict`) is the job of the layer above.
///
/// Containers keep their order: `Dict` is a list of pairs in insertion
/// order, so a state dict round-trips with its key order.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An integer that fits in an `i64`.
    Int(i64),
    /// A larger integer, as little-endian two's-complement bytes (the LONG1/LONG4 payload, minimal length).
    BigInt(Vec<u8>),
    /// A float (pickled as a big-endian IEEE double).
    Float(f64),
    /// A text string.
    Str(String),
    /// A `bytes` object.
    Bytes(Vec<u8>),
    /// A `bytearray` (protocol 5 BYTEARRAY8).
    ByteArray(Vec<u8>),
    /// A list.
    List(Vec<Value>),
    /// A tuple.
    Tuple(Vec<Value>),
    /// A dict, pairs in insertion order (a repeated key replaces the earlier value in place, as Python does).
    Dict(Vec<(Value, Value)>),
    /// A set (protocol 4 EMPTY_SET/ADDITEMS), in insertion order.
    Set(Vec<Value>),
    /// A frozenset (protocol 4 FROZENSET), in insertion order.
    FrozenSet(Vec<Value>),
    /// A reference to a global (`GLOBAL` / `STACK_GLOBAL`), never imported.
    Global {
        /// The module, e.g. `torch._utils`.
        module: String,
        /// The attribute, e.g. `_rebuild_tensor_v2`.
        name: String,
    },
    /// `callable(*args)` as recorded by `REDUCE`, never called.
    ///
    /// Items that the pickle then stores into the result (`SETITEM(S)`,
    /// `APPEND(S)`: how an `OrderedDict` or a `defaultdict` gets its
    /// contents) are kept, in order, in `setitems` / `appends`.
    Reduce {
        /// The callable (usually a [`Value::Global`]).
        callable: Box<Value>,
        /// The argument tuple (usually a [`Value::Tuple`]).
        args: Box<Value>,
        /// `obj[key] = value` applied to the result, in order.
        setitems: Vec<(Value, Value)>,
        /// `obj.append(x)` / `obj.extend(xs)` applied to the result, in order.
        appends: Vec<Value>,
    },
    /// `cls.__new__(cls, *args)` as recorded by `NEWOBJ` / `NEWOBJ_EX` / `OBJ` / `INST`.
    NewObj {
        /// The class.
        cls: Box<Value>,
        /// The positional arguments (a [`Value::Tuple`]).
        args: Box<Value>,
        /// Keyword arguments (`NEWOBJ_EX` only; otherwise `None`).
        kwargs: Option<Box<Value>>,
        /// `obj[key] = value` applied to the result, in order.
        setitems: Vec<(Value, Value)>,
        /// `obj.append(x)` / `obj.extend(xs)` applied to the result, in order.
        appends: Vec<Value>,
    },
    /// `obj.__setstate__(state)` as recorded by `BUILD`, never called.
    Build {
        /// The object being built.
        object: Box<Value>,
        /// Its state.
        state: Box<Value>,
    },
    /// A persistent id (`PERSID` / `BINPERSID`): torch's storage references.
    PersistentId(Box<Value>),
    /// An object (the result of a `REDUCE`, `NEWOBJ` or `BUILD`) that the
    /// pickle references more than once through its memo: every occurrence
    /// carries the same `id`, so identity survives (torch writes the same
    /// tensor object under two keys this way). The writer emits the first
    /// occurrence and memo references for the rest.
    Shared {
        /// Identifies the object within one pickle.
        id: u64,
        /// The object.
        value: Box<Value>,
    },
}

impl Value {
    /// The `(module, name)` of a [`Value::Global`].
    pub fn as_global(&self) -> Option<(&str, &str)> {
        match self {
            Value::Global { module, name } => Some((module, name)),
            _ => None,
        }
    }

    /// The string of a [`Value::Str`].
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The integer of a [`Value::Int`] (or a [`Value::Bool`], as Python treats it).
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(i64::from(*b)),
            _ => None,
        }
    }

    /// A `REDUCE` of `callable` with `args` and nothing stored into it.
    pub fn reduce(callable: Value, args: Value) -> Value {
        Value::Reduce { callable: Box::new(callable), args: Box::new(args), setitems: Vec::new(), appends: Vec::new() }
    }

    /// A [`Value::Global`].
    pub fn global(module: &str, name: &str) -> Value {
        Value::Global { module: module.to_owned(), name: name.to_owned() }
    }

    /// The items of a [`Value::Tuple`].
    pub fn as_tuple(&self) -> Option<&[Value]> {
        match self {
            Value::Tuple(t) => Some(t),
            _ => None,
        }
    }

    /// Pushes this value's direct children onto `stack` (every value it
    /// holds: items, dict keys and values, call arguments, setitems and
    /// appends, BUILD states, a persistent id's payload, a shared value):
    /// the step of every walk over a tree that must not recurse.
    pub fn push_children<'a>(&'a self, stack: &mut Vec<&'a Value>) {
        match self {
            Value::List(xs) | Value::Tuple(xs) | Value::Set(xs) | Value::FrozenSet(xs) => stack.extend(xs),
            Value::Dict(kv) => stack.extend(kv.iter().flat_map(|(k, v)| [k, v])),
            Value::Reduce { callable, args, setitems, appends } => {
                stack.extend([&**callable, &**args]);
                stack.extend(setitems.iter().flat_map(|(k, v)| [k, v]));
                stack.extend(appends);
            }
            Value::NewObj { cls, args, kwargs, setitems, appends } => {
                stack.extend([&**cls, &**args]);
                stack.extend(kwargs.as_deref());
                stack.extend(setitems.iter().flat_map(|(k, v)| [k, v]));
                stack.extend(appends);
            }
            Value::Build { object, state } => stack.extend([&**object, &**state]),
            Value::PersistentId(p) | Value::Shared { value: p, .. } => stack.push(p),
            _ => {}
        }
    }

    /// The size of this tree in the units of [`crate::Limits::max_nodes`]:
    /// one per node (itself included), plus one per 64 bytes of each
    /// string, bytes or big-int payload (so memo references to long strings
    /// cost what copying them costs).
    ///
    /// Dict entries count their key and value, not the pair; computed
    /// without recursion, so any depth is fine.
    pub fn node_count(&self) -> usize {
        let mut count = 0usize;
        let mut stack: Vec<&Value> = vec![self];
        while let Some(v) = stack.pop() {
            count += 1;
            match v {
                Value::Str(s) => count += s.len() / 64,
                Value::Bytes(b) | Value::ByteArray(b) | Value::BigInt(b) => count += b.len() / 64,
                _ => v.push_children(&mut stack),
            }
        }
        count
    }
}

/// A short human form, for messages: scalars as Python writes them,
/// containers by kind and length, globals and calls by name. Never the
/// whole value (a message must stay short whatever the input holds).
impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::None => f.write_str("None"),
            Value::Bool(true) => f.write_str("True"),
            Value::Bool(false) => f.write_str("False"),
            Value::Int(i) => write!(f, "{i}"),
            Value::BigInt(b) => write!(f, "<int of {} bytes>", b.len()),
            Value::Float(x) => write!(f, "{x:?}"),
            Value::Str(s) if s.chars().count() <= 40 => write!(f, "'{s}'"),
            Value::Str(s) => write!(f, "<str of {} chars>", s.chars().count()),
            Value::Bytes(b) => write!(f, "<bytes of length {}>", b.len()),
            Value::ByteArray(b) => write!(f, "<bytearray of length {}>", b.len()),
            Value::List(xs) => write!(f, "<list of {} items>", xs.len()),
            Value::Tuple(xs) => write!(f, "<tuple of {} items>", xs.len()),
            Value::Dict(kv) => write!(f, "<dict of {} entries>", kv.len()),
            Value::Set(xs) => write!(f, "<set of {} items>", xs.len()),
            Value::FrozenSet(xs) => write!(f, "<frozenset of {} items>", xs.len()),
            Value::Global { module, name } => write!(f, "<global {module}.{name}>"),
            Value::Reduce { callable, .. } => write!(f, "<call of {callable}>"),
            Value::NewObj { cls, .. } => write!(f, "<new {cls} object>"),
            Value::Build { object, .. } => write!(f, "<built {object}>"),
            Value::PersistentId(_) => f.write_str("<persistent id>"),
            Value::Shared { value, .. } => write!(f, "{value}"),
        }
    }
}
