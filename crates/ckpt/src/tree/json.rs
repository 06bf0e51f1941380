//! The checkpoint tree as JSON: exact (floats by their bits, big ints and
//! bytes in hex), so the safetensors bridge can carry a whole checkpoint in
//! `__metadata__` and restore it bit for bit.
//!
//! Writing streams ([`NodeJson`] implements `Serialize`: no intermediate
//! JSON value, so a list of two million floats costs its text, not
//! gigabytes); every object writes its tag (`t`, or `f` for a float) first.
//! Reading first scans the text for its size and depth ([`check_size`]),
//! so a hostile tree is refused before anything is allocated, then decodes
//! straight into nodes ([`node_from_str`], any key order).

use pmstate_pickle::Value;
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::Serialize;
use serde_json::{Map, Value as J};

use super::json_problem::JsonProblem;
use crate::dtype::DType;
use crate::tree::{Construct, Dict, DictKind, Node, Object, TensorClass, TensorRef};

/// The JSON tag of a dict of class `kind`.
fn dict_tag(kind: DictKind) -> &'static str {
    match kind {
        DictKind::Plain => "dict",
        DictKind::Ordered => "odict",
    }
}

/// The class of a dict with JSON tag `tag` (`dict` or `odict`).
fn dict_kind(tag: &str) -> DictKind {
    if tag == "odict" {
        DictKind::Ordered
    } else {
        DictKind::Plain
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
    out
}

fn unhex(s: &str) -> Result<Vec<u8>, JsonProblem> {
    if !s.len().is_multiple_of(2) {
        return Err(JsonProblem::OddHex(s.len()));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            // Both digits checked: `from_str_radix` alone would take "+f".
            let digits = s.get(i..i + 2).filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()));
            digits.and_then(|d| u8::from_str_radix(d, 16).ok()).ok_or(JsonProblem::HexDigit(i))
        })
        .collect()
}

fn bits(f: f64) -> String {
    format!("{:016x}", f.to_bits())
}

fn unfloat(j: &J) -> Result<f64, JsonProblem> {
    let s = j.as_str().ok_or_else(|| wrong("float", "f", "a string"))?;
    u64::from_str_radix(s, 16).map(f64::from_bits).map_err(|_| JsonProblem::FloatBits(start_of(s)))
}

/// The first 40 characters of `s` (a hostile field may be long), for errors.
fn start_of(s: &str) -> String {
    s.chars().take(40).collect()
}

/// [`JsonProblem::WrongType`].
fn wrong(tag: &str, field: &'static str, expected: &'static str) -> JsonProblem {
    JsonProblem::WrongType { tag: tag.to_owned(), field, expected }
}

/// The fields of one tagged object, looked up with the errors that name
/// the tag and the field.
struct Fields<'a> {
    tag: &'a str,
    m: &'a Map<String, J>,
}

impl<'a> Fields<'a> {
    fn get(&self, field: &'static str) -> Result<&'a J, JsonProblem> {
        self.m.get(field).ok_or_else(|| JsonProblem::Missing { tag: self.tag.to_owned(), field })
    }
    fn str(&self, field: &'static str) -> Result<&'a str, JsonProblem> {
        self.get(field)?.as_str().ok_or_else(|| wrong(self.tag, field, "a string"))
    }
    fn array(&self, field: &'static str) -> Result<&'a [J], JsonProblem> {
        self.get(field)?.as_array().map(Vec::as_slice).ok_or_else(|| wrong(self.tag, field, "an array"))
    }
    /// An optional array (absent: empty).
    fn array_or_empty(&self, field: &'static str) -> Result<&'a [J], JsonProblem> {
        match self.m.get(field) {
            None => Ok(&[]),
            Some(_) => self.array(field),
        }
    }
    /// The `[key, value]` pairs of an array field.
    fn pairs(items: &'a [J]) -> Result<Vec<(&'a J, &'a J)>, JsonProblem> {
        items
            .iter()
            .map(|item| match item.as_array().map(Vec::as_slice) {
                Some([k, v]) => Ok((k, v)),
                _ => Err(JsonProblem::NotAPair),
            })
            .collect()
    }
}

fn int_of(n: &serde_json::Number) -> Result<i64, JsonProblem> {
    match (n.as_i64(), n.as_u64()) {
        (Some(i), _) => Ok(i),
        (None, Some(u)) => Err(JsonProblem::IntTooLarge(u)),
        (None, None) => Err(JsonProblem::NotAnInteger(n.to_string())),
    }
}

/// Decodes a node.
pub fn node_from_json(j: &J) -> Result<Node, JsonProblem> {
    let list = |items: &[J]| items.iter().map(node_from_json).collect::<Result<Vec<_>, _>>();
    let pairs = |f: &Fields<'_>, field| -> Result<Vec<(Node, Node)>, JsonProblem> {
        let items = f.array_or_empty(field)?;
        Fields::pairs(items)?.into_iter().map(|(k, v)| Ok((node_from_json(k)?, node_from_json(v)?))).collect()
    };
    Ok(match j {
        J::Null => Node::None,
        J::Bool(b) => Node::Bool(*b),
        J::Number(n) => Node::Int(int_of(n)?),
        J::String(s) => Node::Str(s.clone()),
        J::Array(_) => return Err(JsonProblem::BareArray),
        J::Object(m) => {
            if let Some(bits) = m.get("f") {
                return Ok(Node::Float(unfloat(bits)?));
            }
            let tag = m.get("t").and_then(J::as_str).ok_or(JsonProblem::NoTag)?;
            let f = Fields { tag, m };
            match tag {
                "bigint" => Node::BigInt(unhex(f.str("le")?)?),
                "complex" => Node::Complex(unfloat(f.get("re")?)?, unfloat(f.get("im")?)?),
                "bytes" => Node::Bytes(unhex(f.str("hex")?)?),
                "list" => Node::List(list(f.array("v")?)?),
                "tuple" => Node::Tuple(list(f.array("v")?)?),
                "set" => Node::Set(list(f.array("v")?)?),
                "dict" | "odict" => {
                    f.get("items")?;
                    let entries = pairs(&f, "items")?;
                    let state = m.get("state").map(node_from_json).transpose()?;
                    let dict =
                        Dict::from_entries(dict_kind(tag), entries).map_err(|d| JsonProblem::DuplicateKey(d.0))?;
                    Node::Dict(dict.with_state(state))
                }
                "tensor" => Node::Tensor(Box::new(tensor_from_json(&f)?)),
                "device" => Node::Device { kind: f.str("type")?.to_owned(), index: m.get("index").and_then(J::as_i64) },
                "dtype" => {
                    let name = f.str("name")?;
                    if DType::from_torch_name(name).is_none() {
                        return Err(JsonProblem::UnknownDtype(start_of(name)));
                    }
                    Node::TorchDtype(name.to_owned())
                }
                "global" => Node::Global { module: f.str("module")?.to_owned(), name: f.str("name")?.to_owned() },
                "object" => {
                    let construct = match f.get("construct")?.as_str() {
                        Some("reduce") => Construct::Reduce,
                        Some("newobj") => Construct::NewObj,
                        _ => return Err(JsonProblem::Construct),
                    };
                    Node::Object(Box::new(Object {
                        construct,
                        callable: node_from_json(f.get("callable")?)?,
                        args: node_from_json(f.get("args")?)?,
                        kwargs: m.get("kwargs").map(node_from_json).transpose()?,
                        state: m.get("state").map(node_from_json).transpose()?,
                        setitems: pairs(&f, "setitems")?,
                        appends: list(f.array_or_empty("appends")?)?,
                    }))
                }
                "pickle" => Node::Opaque(Box::new(value_from_json(f.get("v")?)?)),
                other => return Err(JsonProblem::UnknownTag { kind: "node", tag: start_of(other) }),
            }
        }
    })
}

fn usizes(f: &Fields<'_>, field: &'static str) -> Result<Vec<usize>, JsonProblem> {
    f.array(field)?
        .iter()
        .map(|x| x.as_u64().and_then(|x| usize::try_from(x).ok()))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| wrong(f.tag, field, "an array of non-negative integers"))
}

fn tensor_from_json(f: &Fields<'_>) -> Result<TensorRef, JsonProblem> {
    let dtype_name = f.str("dtype")?;
    let m = f.m;
    Ok(TensorRef {
        storage: f.str("storage")?.to_owned(),
        dtype: DType::from_torch_name(dtype_name).ok_or_else(|| JsonProblem::UnknownDtype(start_of(dtype_name)))?,
        offset: f
            .get("offset")?
            .as_u64()
            .and_then(|x| usize::try_from(x).ok())
            .ok_or_else(|| wrong(f.tag, "offset", "a non-negative integer"))?,
        shape: usizes(f, "shape")?,
        stride: usizes(f, "stride")?,
        requires_grad: m.get("requires_grad").and_then(J::as_bool).unwrap_or(false),
        class: match m.get("parameter").and_then(J::as_bool) {
            Some(requires_grad) => TensorClass::Parameter { requires_grad },
            None => TensorClass::Tensor,
        },
        object: m.get("object").and_then(J::as_u64),
    })
}

/// Decodes a raw pickle value.
pub fn value_from_json(j: &J) -> Result<Value, JsonProblem> {
    let list = |f: &Fields<'_>, field| -> Result<Vec<Value>, JsonProblem> {
        f.array(field)?.iter().map(value_from_json).collect()
    };
    let pairs = |f: &Fields<'_>, field| -> Result<Vec<(Value, Value)>, JsonProblem> {
        let items = f.array(field)?;
        Fields::pairs(items)?.into_iter().map(|(k, v)| Ok((value_from_json(k)?, value_from_json(v)?))).collect()
    };
    let boxed =
        |f: &Fields<'_>, field| -> Result<Box<Value>, JsonProblem> { Ok(Box::new(value_from_json(f.get(field)?)?)) };
    Ok(match j {
        J::Null => Value::None,
        J::Bool(b) => Value::Bool(*b),
        J::Number(n) => Value::Int(int_of(n)?),
        J::String(s) => Value::Str(s.clone()),
        J::Array(_) => return Err(JsonProblem::BareArray),
        J::Object(m) => {
            if let Some(bits) = m.get("f") {
                return Ok(Value::Float(unfloat(bits)?));
            }
            let tag = m.get("t").and_then(J::as_str).ok_or(JsonProblem::NoTag)?;
            let f = &Fields { tag, m };
            match tag {
                "bigint" => Value::BigInt(unhex(f.str("le")?)?),
                "bytes" => Value::Bytes(unhex(f.str("hex")?)?),
                "bytearray" => Value::ByteArray(unhex(f.str("hex")?)?),
                "list" => Value::List(list(f, "v")?),
                "tuple" => Value::Tuple(list(f, "v")?),
                "set" => Value::Set(list(f, "v")?),
                "frozenset" => Value::FrozenSet(list(f, "v")?),
                "dict" => Value::Dict(pairs(f, "items")?),
                "global" => Value::Global { module: f.str("module")?.to_owned(), name: f.str("name")?.to_owned() },
                "reduce" => Value::Reduce {
                    callable: boxed(f, "callable")?,
                    args: boxed(f, "args")?,
                    setitems: pairs(f, "setitems")?,
                    appends: list(f, "appends")?,
                },
                "newobj" => Value::NewObj {
                    cls: boxed(f, "cls")?,
                    args: boxed(f, "args")?,
                    kwargs: match m.get("kwargs") {
                        None | Some(J::Null) => None,
                        Some(k) => Some(Box::new(value_from_json(k)?)),
                    },
                    setitems: pairs(f, "setitems")?,
                    appends: list(f, "appends")?,
                },
                "build" => Value::Build { object: boxed(f, "object")?, state: boxed(f, "state")? },
                "persid" => Value::PersistentId(boxed(f, "v")?),
                "shared" => Value::Shared {
                    id: f.get("id")?.as_u64().ok_or_else(|| wrong(tag, "id", "a non-negative integer"))?,
                    value: boxed(f, "v")?,
                },
                other => return Err(JsonProblem::UnknownTag { kind: "value", tag: start_of(other) }),
            }
        }
    })
}

/// A node as exact JSON, written as it is serialized (no intermediate value).
pub struct NodeJson<'a>(pub &'a Node);

/// A raw pickle value as exact JSON (inside opaque nodes).
pub struct ValueJson<'a>(pub &'a Value);

/// Whatever the serializer is, writes `{"t": tag, ...}` with `t` first.
fn tagged<S: Serializer>(s: S, tag: &str, len: usize) -> Result<S::SerializeMap, S::Error> {
    let mut m = s.serialize_map(Some(len + 1))?;
    m.serialize_entry("t", tag)?;
    Ok(m)
}

struct Float(f64);

impl Serialize for Float {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry("f", &bits(self.0))?;
        m.end()
    }
}

struct Nodes<'a>(&'a [Node]);

impl Serialize for Nodes<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for n in self.0 {
            seq.serialize_element(&NodeJson(n))?;
        }
        seq.end()
    }
}

struct NodePairs<'a>(&'a [(Node, Node)]);

impl Serialize for NodePairs<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for (k, v) in self.0 {
            seq.serialize_element(&(NodeJson(k), NodeJson(v)))?;
        }
        seq.end()
    }
}

impl Serialize for NodeJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Node::None => s.serialize_unit(),
            Node::Bool(b) => s.serialize_bool(*b),
            Node::Int(i) => s.serialize_i64(*i),
            Node::Str(v) => s.serialize_str(v),
            Node::Float(f) => Float(*f).serialize(s),
            Node::BigInt(b) => {
                let mut m = tagged(s, "bigint", 1)?;
                m.serialize_entry("le", &hex(b))?;
                m.end()
            }
            Node::Complex(re, im) => {
                let mut m = tagged(s, "complex", 2)?;
                m.serialize_entry("re", &bits(*re))?;
                m.serialize_entry("im", &bits(*im))?;
                m.end()
            }
            Node::Bytes(b) => {
                let mut m = tagged(s, "bytes", 1)?;
                m.serialize_entry("hex", &hex(b))?;
                m.end()
            }
            Node::List(xs) | Node::Tuple(xs) | Node::Set(xs) => {
                let tag = match self.0 {
                    Node::List(_) => "list",
                    Node::Tuple(_) => "tuple",
                    _ => "set",
                };
                let mut m = tagged(s, tag, 1)?;
                m.serialize_entry("v", &Nodes(xs))?;
                m.end()
            }
            Node::Dict(d) => {
                let mut m = tagged(s, dict_tag(d.kind()), 2)?;
                m.serialize_entry("items", &NodePairs(d.entries()))?;
                if let Some(st) = d.state() {
                    m.serialize_entry("state", &NodeJson(st))?;
                }
                m.end()
            }
            Node::Tensor(t) => {
                let mut m = tagged(s, "tensor", 8)?;
                m.serialize_entry("storage", &t.storage)?;
                m.serialize_entry("dtype", t.dtype.torch_name())?;
                m.serialize_entry("offset", &t.offset)?;
                m.serialize_entry("shape", &t.shape)?;
                m.serialize_entry("stride", &t.stride)?;
                m.serialize_entry("requires_grad", &t.requires_grad)?;
                m.serialize_entry("parameter", &t.class.parameter_requires_grad())?;
                m.serialize_entry("object", &t.object)?;
                m.end()
            }
            Node::Device { kind, index } => {
                let mut m = tagged(s, "device", 2)?;
                m.serialize_entry("type", kind)?;
                m.serialize_entry("index", index)?;
                m.end()
            }
            Node::TorchDtype(name) => {
                let mut m = tagged(s, "dtype", 1)?;
                m.serialize_entry("name", name)?;
                m.end()
            }
            Node::Global { module, name } => {
                let mut m = tagged(s, "global", 2)?;
                m.serialize_entry("module", module)?;
                m.serialize_entry("name", name)?;
                m.end()
            }
            Node::Object(o) => {
                let mut m = tagged(s, "object", 7)?;
                let construct = match o.construct {
                    Construct::Reduce => "reduce",
                    Construct::NewObj => "newobj",
                };
                m.serialize_entry("construct", construct)?;
                m.serialize_entry("callable", &NodeJson(&o.callable))?;
                m.serialize_entry("args", &NodeJson(&o.args))?;
                if let Some(k) = &o.kwargs {
                    m.serialize_entry("kwargs", &NodeJson(k))?;
                }
                if let Some(st) = &o.state {
                    m.serialize_entry("state", &NodeJson(st))?;
                }
                if !o.setitems.is_empty() {
                    m.serialize_entry("setitems", &NodePairs(&o.setitems))?;
                }
                if !o.appends.is_empty() {
                    m.serialize_entry("appends", &Nodes(&o.appends))?;
                }
                m.end()
            }
            Node::Opaque(v) => {
                let mut m = tagged(s, "pickle", 1)?;
                m.serialize_entry("v", &ValueJson(v))?;
                m.end()
            }
        }
    }
}

struct Values<'a>(&'a [Value]);

impl Serialize for Values<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for v in self.0 {
            seq.serialize_element(&ValueJson(v))?;
        }
        seq.end()
    }
}

struct ValuePairs<'a>(&'a [(Value, Value)]);

impl Serialize for ValuePairs<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for (k, v) in self.0 {
            seq.serialize_element(&(ValueJson(k), ValueJson(v)))?;
        }
        seq.end()
    }
}

impl Serialize for ValueJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let hexed = |s: S, tag: &str, b: &[u8], field: &str| -> Result<S::Ok, S::Error> {
            let mut m = tagged(s, tag, 1)?;
            m.serialize_entry(field, &hex(b))?;
            m.end()
        };
        let listed = |s: S, tag: &str, xs: &[Value]| -> Result<S::Ok, S::Error> {
            let mut m = tagged(s, tag, 1)?;
            m.serialize_entry("v", &Values(xs))?;
            m.end()
        };
        match self.0 {
            Value::None => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(i) => s.serialize_i64(*i),
            Value::Str(v) => s.serialize_str(v),
            Value::Float(f) => Float(*f).serialize(s),
            Value::BigInt(b) => hexed(s, "bigint", b, "le"),
            Value::Bytes(b) => hexed(s, "bytes", b, "hex"),
            Value::ByteArray(b) => hexed(s, "bytearray", b, "hex"),
            Value::List(xs) => listed(s, "list", xs),
            Value::Tuple(xs) => listed(s, "tuple", xs),
            Value::Set(xs) => listed(s, "set", xs),
            Value::FrozenSet(xs) => listed(s, "frozenset", xs),
            Value::Dict(kv) => {
                let mut m = tagged(s, "dict", 1)?;
                m.serialize_entry("items", &ValuePairs(kv))?;
                m.end()
            }
            Value::Global { module, name } => {
                let mut m = tagged(s, "global", 2)?;
                m.serialize_entry("module", module)?;
                m.serialize_entry("name", name)?;
                m.end()
            }
            Value::Reduce { callable, args, setitems, appends } => {
                let mut m = tagged(s, "reduce", 4)?;
                m.serialize_entry("callable", &ValueJson(callable))?;
                m.serialize_entry("args", &ValueJson(args))?;
                m.serialize_entry("setitems", &ValuePairs(setitems))?;
                m.serialize_entry("appends", &Values(appends))?;
                m.end()
            }
            Value::NewObj { cls, args, kwargs, setitems, appends } => {
                let mut m = tagged(s, "newobj", 5)?;
                m.serialize_entry("cls", &ValueJson(cls))?;
                m.serialize_entry("args", &ValueJson(args))?;
                m.serialize_entry("kwargs", &kwargs.as_deref().map(ValueJson))?;
                m.serialize_entry("setitems", &ValuePairs(setitems))?;
                m.serialize_entry("appends", &Values(appends))?;
                m.end()
            }
            Value::Build { object, state } => {
                let mut m = tagged(s, "build", 2)?;
                m.serialize_entry("object", &ValueJson(object))?;
                m.serialize_entry("state", &ValueJson(state))?;
                m.end()
            }
            Value::PersistentId(p) => {
                let mut m = tagged(s, "persid", 1)?;
                m.serialize_entry("v", &ValueJson(p))?;
                m.end()
            }
            Value::Shared { id, value } => {
                let mut m = tagged(s, "shared", 2)?;
                m.serialize_entry("id", id)?;
                m.serialize_entry("v", &ValueJson(value))?;
                m.end()
            }
        }
    }
}

/// Size and depth of a JSON text, found without allocating: values (an
/// upper bound on the tree nodes it decodes into) and nesting of arrays and
/// objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct JsonSize {
    pub values: u64,
    pub depth: usize,
}

/// Scans `text` (strings skipped, escapes honoured) for its [`JsonSize`].
pub(crate) fn check_size(text: &str) -> JsonSize {
    let (mut values, mut depth, mut max_depth) = (1u64, 0usize, 0usize);
    let (mut in_str, mut escaped) = (false, false);
    for &b in text.as_bytes() {
        if in_str {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'[' | b'{' => {
                depth += 1;
                max_depth = max_depth.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b',' | b':' => values += 1,
            _ => {}
        }
    }
    JsonSize { values, depth: max_depth }
}

/// JSON depth a node of tree depth `depth` needs: each container level is
/// an object holding an array (and a dict item is one more array).
pub(crate) fn json_depth_of_tree_depth(depth: usize) -> usize {
    depth.saturating_mul(3).saturating_add(2)
}

/// Decodes tree JSON text straight into a [`Node`], streaming: containers'
/// children are decoded as they are read, never held as JSON values first
/// (a tree of two million floats costs its nodes, not gigabytes of JSON
/// maps). Fields may come in any order (files written before the writer
/// put the tag first have their keys sorted); only the small scalar fields
/// of an object are buffered until its tag is known.
pub(crate) fn node_from_str(text: &str) -> Result<Node, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    de.disable_recursion_limit();
    let node = serde::de::DeserializeSeed::deserialize(NodeSeed, &mut de)?;
    de.end()?;
    Ok(node)
}

struct NodeSeed;

impl<'de> serde::de::DeserializeSeed<'de> for NodeSeed {
    type Value = Node;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodesSeed;

impl<'de> serde::de::DeserializeSeed<'de> for NodesSeed {
    type Value = Vec<Node>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Vec<Node>, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Vec<Node>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array of nodes")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Node>, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(n) = seq.next_element_seed(NodeSeed)? {
                    out.push(n);
                }
                Ok(out)
            }
        }
        d.deserialize_seq(V)
    }
}

struct PairsSeed;

impl<'de> serde::de::DeserializeSeed<'de> for PairsSeed {
    type Value = Vec<(Node, Node)>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        struct Pair;
        impl<'de> serde::de::DeserializeSeed<'de> for Pair {
            type Value = (Node, Node);
            fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                struct V;
                impl<'de> serde::de::Visitor<'de> for V {
                    type Value = (Node, Node);
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str("a [key, value] pair")
                    }
                    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                        let err = || serde::de::Error::custom(JsonProblem::NotAPair);
                        let k = seq.next_element_seed(NodeSeed)?.ok_or_else(err)?;
                        let v = seq.next_element_seed(NodeSeed)?.ok_or_else(err)?;
                        if seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                            return Err(err());
                        }
                        Ok((k, v))
                    }
                }
                d.deserialize_seq(V)
            }
        }
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Vec<(Node, Node)>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array of [key, value] pairs")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(p) = seq.next_element_seed(Pair)? {
                    out.push(p);
                }
                Ok(out)
            }
        }
        d.deserialize_seq(V)
    }
}

/// The parts of a tagged object as they are read.
#[derive(Default)]
struct Parts {
    tag: Option<String>,
    float: Option<String>,
    v_nodes: Option<Vec<Node>>,
    v_value: Option<J>,
    items: Option<Vec<(Node, Node)>>,
    setitems: Option<Vec<(Node, Node)>>,
    appends: Option<Vec<Node>>,
    state: Option<Node>,
    callable: Option<Node>,
    args: Option<Node>,
    kwargs: Option<Node>,
    /// Small scalar fields (tensor metadata, hex strings, names), decoded by tag.
    rest: Map<String, J>,
}

struct NodeVisitor;

impl<'de> serde::de::Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a pmstate tree node")
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Node, E> {
        Ok(Node::None)
    }
    fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<Node, E> {
        Ok(Node::Bool(b))
    }
    fn visit_i64<E: serde::de::Error>(self, i: i64) -> Result<Node, E> {
        Ok(Node::Int(i))
    }
    fn visit_u64<E: serde::de::Error>(self, u: u64) -> Result<Node, E> {
        i64::try_from(u).map(Node::Int).map_err(|_| E::custom(JsonProblem::IntTooLarge(u)))
    }
    fn visit_f64<E: serde::de::Error>(self, x: f64) -> Result<Node, E> {
        Err(E::custom(JsonProblem::NotAnInteger(x.to_string())))
    }
    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Node, E> {
        Ok(Node::Str(s.to_owned()))
    }
    fn visit_string<E: serde::de::Error>(self, s: String) -> Result<Node, E> {
        Ok(Node::Str(s))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, _seq: A) -> Result<Node, A::Error> {
        Err(serde::de::Error::custom(JsonProblem::BareArray))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut p = Parts::default();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "t" => p.tag = Some(map.next_value()?),
                "f" => p.float = Some(map.next_value()?),
                "v" if p.tag.as_deref() == Some("pickle") => p.v_value = Some(map.next_value()?),
                "v" => p.v_nodes = Some(map.next_value_seed(NodesSeed)?),
                "items" => p.items = Some(map.next_value_seed(PairsSeed)?),
                "setitems" => p.setitems = Some(map.next_value_seed(PairsSeed)?),
                "appends" => p.appends = Some(map.next_value_seed(NodesSeed)?),
                "state" => p.state = Some(map.next_value_seed(NodeSeed)?),
                "callable" => p.callable = Some(map.next_value_seed(NodeSeed)?),
                "args" => p.args = Some(map.next_value_seed(NodeSeed)?),
                "kwargs" => p.kwargs = Some(map.next_value_seed(NodeSeed)?),
                _ => {
                    let v: J = map.next_value()?;
                    p.rest.insert(key, v);
                }
            }
        }
        assemble(p).map_err(serde::de::Error::custom)
    }
}

/// Builds the node an object's parts describe.
fn assemble(p: Parts) -> Result<Node, JsonProblem> {
    if let Some(bits) = &p.float {
        if p.tag.is_some() || !p.rest.is_empty() {
            return Err(JsonProblem::FloatFields);
        }
        return unfloat(&J::String(bits.clone())).map(Node::Float);
    }
    let tag = p.tag.ok_or(JsonProblem::NoTag)?;
    let missing = |field| JsonProblem::Missing { tag: tag.clone(), field };
    Ok(match tag.as_str() {
        "list" => Node::List(p.v_nodes.ok_or_else(|| missing("v"))?),
        "tuple" => Node::Tuple(p.v_nodes.ok_or_else(|| missing("v"))?),
        "set" => Node::Set(p.v_nodes.ok_or_else(|| missing("v"))?),
        "dict" | "odict" => {
            let items = p.items.ok_or_else(|| missing("items"))?;
            let dict = Dict::from_entries(dict_kind(&tag), items).map_err(|d| JsonProblem::DuplicateKey(d.0))?;
            Node::Dict(dict.with_state(p.state))
        }
        "object" => {
            let construct = match p.rest.get("construct").map(J::as_str) {
                Some(Some("reduce")) => Construct::Reduce,
                Some(Some("newobj")) => Construct::NewObj,
                Some(_) => return Err(JsonProblem::Construct),
                None => return Err(missing("construct")),
            };
            Node::Object(Box::new(Object {
                construct,
                callable: p.callable.ok_or_else(|| missing("callable"))?,
                args: p.args.ok_or_else(|| missing("args"))?,
                kwargs: p.kwargs,
                state: p.state,
                setitems: p.setitems.unwrap_or_default(),
                appends: p.appends.unwrap_or_default(),
            }))
        }
        "pickle" => Node::Opaque(Box::new(value_from_json(&p.v_value.ok_or_else(|| missing("v"))?)?)),
        // The rest have only small scalar fields: decode them as before.
        _ => {
            let mut m = p.rest;
            m.insert("t".into(), J::String(tag));
            node_from_json(&J::Object(m))?
        }
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn problem(j: J) -> JsonProblem {
        node_from_json(&j).expect_err("must be refused")
    }

    fn missing(tag: &str, field: &'static str) -> JsonProblem {
        JsonProblem::Missing { tag: tag.into(), field }
    }

    #[test]
    fn malformed_nodes_are_named_by_tag_and_field() {
        assert_eq!(problem(json!([1])), JsonProblem::BareArray);
        assert_eq!(problem(json!(1.5)), JsonProblem::NotAnInteger("1.5".into()));
        assert_eq!(problem(json!(u64::MAX)), JsonProblem::IntTooLarge(u64::MAX));
        assert_eq!(problem(json!({"v": []})), JsonProblem::NoTag);
        assert_eq!(problem(json!({"t": "list"})), missing("list", "v"));
        let wrong = JsonProblem::WrongType { tag: "list".into(), field: "v", expected: "an array" };
        assert_eq!(problem(json!({"t": "list", "v": 3})), wrong);
        assert_eq!(problem(json!({"t": "dict", "items": [[1]]})), JsonProblem::NotAPair);
        assert_eq!(problem(json!({"t": "dict", "items": [[1, 2], [1, 3]]})), JsonProblem::DuplicateKey("1".into()));
        assert_eq!(problem(json!({"t": "bytes", "hex": "abc"})), JsonProblem::OddHex(3));
        assert_eq!(problem(json!({"t": "bytes", "hex": "00zz"})), JsonProblem::HexDigit(2));
        assert_eq!(problem(json!({"t": "bytes", "hex": "+f"})), JsonProblem::HexDigit(0));
        assert_eq!(problem(json!({"f": "nope"})), JsonProblem::FloatBits("nope".into()));
        assert_eq!(problem(json!({"t": "dtype", "name": "float7"})), JsonProblem::UnknownDtype("float7".into()));
        let object = json!({"t": "object", "construct": "call", "callable": null, "args": {"t": "tuple", "v": []}});
        assert_eq!(problem(object), JsonProblem::Construct);
        let long_tag = "x".repeat(100);
        let unknown = JsonProblem::UnknownTag { kind: "node", tag: "x".repeat(40) };
        assert_eq!(problem(json!({ "t": long_tag })), unknown, "a hostile tag is cut to 40 characters");
        let tensor =
            json!({"t": "tensor", "storage": "0", "dtype": "float32", "offset": 0, "shape": [-1], "stride": [1]});
        let shape = JsonProblem::WrongType {
            tag: "tensor".into(),
            field: "shape",
            expected: "an array of non-negative integers",
        };
        assert_eq!(problem(tensor), shape);
    }

    #[test]
    fn malformed_values_are_named_by_tag_and_field() {
        let v = |j: J| value_from_json(&j).expect_err("must be refused");
        assert_eq!(v(json!({"t": "reduce", "args": []})), missing("reduce", "callable"));
        assert_eq!(v(json!({"t": "dict", "items": [[1, 2, 3]]})), JsonProblem::NotAPair);
        assert_eq!(v(json!({"t": "frob"})), JsonProblem::UnknownTag { kind: "value", tag: "frob".into() });
        let id = JsonProblem::WrongType { tag: "shared".into(), field: "id", expected: "a non-negative integer" };
        assert_eq!(v(json!({"t": "shared", "id": "7", "v": null})), id);
    }

    #[test]
    fn the_streaming_reader_refuses_what_the_value_reader_refuses() {
        // node_from_str reports through serde_json (which adds the position);
        // its message is the problem's.
        for (text, want) in [
            (r#"{"t": "list"}"#, missing("list", "v")),
            (
                r#"{"t": "object", "construct": 1, "callable": null, "args": {"t": "tuple", "v": []}}"#,
                JsonProblem::Construct,
            ),
            (r#"{"t": "dict", "items": [[1, 2], [1, 3]]}"#, JsonProblem::DuplicateKey("1".into())),
            (r#"{"t": "dict", "items": [[1]]}"#, JsonProblem::NotAPair),
            (r#"{"f": "0000000000000000", "t": "float"}"#, JsonProblem::FloatFields),
            ("[]", JsonProblem::BareArray),
            ("2.5", JsonProblem::NotAnInteger("2.5".into())),
        ] {
            let e = node_from_str(text).expect_err(text);
            assert!(e.to_string().starts_with(&want.to_string()), "{text}: {e}");
        }
    }
}
