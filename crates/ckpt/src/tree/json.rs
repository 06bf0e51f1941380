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

fn unhex(s: &str) -> Result<Vec<u8>, String> {
    if s.len() % 2 != 0 {
        return Err(format!("odd-length hex {s:?}"));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2).unwrap_or("zz"), 16).map_err(|_| format!("bad hex {s:?}")))
        .collect()
}

fn bits(f: f64) -> String {
    format!("{:016x}", f.to_bits())
}

fn unfloat(j: &J) -> Result<f64, String> {
    let s = j.as_str().ok_or("float bits are not a string")?;
    u64::from_str_radix(s, 16).map(f64::from_bits).map_err(|_| format!("bad float bits {s:?}"))
}

/// Decodes a node.
pub fn node_from_json(j: &J) -> Result<Node, String> {
    let list = |j: &J| -> Result<Vec<Node>, String> {
        j.as_array().ok_or("expected an array")?.iter().map(node_from_json).collect()
    };
    Ok(match j {
        J::Null => Node::None,
        J::Bool(b) => Node::Bool(*b),
        J::Number(n) => Node::Int(n.as_i64().ok_or_else(|| format!("non-integer number {n}"))?),
        J::String(s) => Node::Str(s.clone()),
        J::Array(_) => return Err("unexpected bare array".into()),
        J::Object(m) => {
            if let Some(bits) = m.get("f") {
                return Ok(Node::Float(unfloat(bits)?));
            }
            let field = |k: &str| m.get(k).ok_or_else(|| format!("missing field {k:?}"));
            match m.get("t").and_then(J::as_str).ok_or("object without a type tag")? {
                "bigint" => Node::BigInt(unhex(field("le")?.as_str().ok_or("bigint")?)?),
                "complex" => Node::Complex(unfloat(field("re")?)?, unfloat(field("im")?)?),
                "bytes" => Node::Bytes(unhex(field("hex")?.as_str().ok_or("bytes")?)?),
                "list" => Node::List(list(field("v")?)?),
                "tuple" => Node::Tuple(list(field("v")?)?),
                "set" => Node::Set(list(field("v")?)?),
                tag @ ("dict" | "odict") => {
                    let mut entries = Vec::new();
                    for item in field("items")?.as_array().ok_or("dict items")? {
                        match item.as_array().map(Vec::as_slice) {
                            Some([k, v]) => entries.push((node_from_json(k)?, node_from_json(v)?)),
                            _ => return Err("dict item is not a pair".into()),
                        }
                    }
                    let state = m.get("state").map(node_from_json).transpose()?;
                    let dict = Dict::from_entries(dict_kind(tag), entries)
                        .map_err(|d| format!("dict key {} appears twice", d.0))?;
                    Node::Dict(dict.with_state(state))
                }
                "tensor" => Node::Tensor(Box::new(tensor_from_json(m)?)),
                "device" => Node::Device {
                    kind: field("type")?.as_str().ok_or("device type")?.to_owned(),
                    index: m.get("index").and_then(J::as_i64),
                },
                "dtype" => {
                    let name = field("name")?.as_str().ok_or("dtype name")?;
                    if DType::from_torch_name(name).is_none() {
                        return Err(format!("dtype node names torch.{name}, which is not a torch dtype"));
                    }
                    Node::TorchDtype(name.to_owned())
                }
                "global" => Node::Global {
                    module: field("module")?.as_str().ok_or("global module")?.to_owned(),
                    name: field("name")?.as_str().ok_or("global name")?.to_owned(),
                },
                "object" => {
                    let construct = match field("construct")?.as_str() {
                        Some("reduce") => Construct::Reduce,
                        Some("newobj") => Construct::NewObj,
                        _ => return Err("object construct is not \"reduce\" or \"newobj\"".into()),
                    };
                    let mut setitems = Vec::new();
                    for item in m.get("setitems").and_then(J::as_array).map(Vec::as_slice).unwrap_or_default() {
                        match item.as_array().map(Vec::as_slice) {
                            Some([k, v]) => setitems.push((node_from_json(k)?, node_from_json(v)?)),
                            _ => return Err("object setitem is not a pair".into()),
                        }
                    }
                    let appends = match m.get("appends") {
                        Some(a) => list(a)?,
                        None => Vec::new(),
                    };
                    Node::Object(Box::new(Object {
                        construct,
                        callable: node_from_json(field("callable")?)?,
                        args: node_from_json(field("args")?)?,
                        kwargs: m.get("kwargs").map(node_from_json).transpose()?,
                        state: m.get("state").map(node_from_json).transpose()?,
                        setitems,
                        appends,
                    }))
                }
                "pickle" => Node::Opaque(Box::new(value_from_json(field("v")?)?)),
                other => return Err(format!("unknown node type {other:?}")),
            }
        }
    })
}

fn usizes(j: Option<&J>, what: &str) -> Result<Vec<usize>, String> {
    j.and_then(J::as_array)
        .ok_or_else(|| format!("tensor {what} missing"))?
        .iter()
        .map(|x| x.as_u64().and_then(|x| usize::try_from(x).ok()).ok_or_else(|| format!("tensor {what}: bad entry")))
        .collect()
}

fn tensor_from_json(m: &Map<String, J>) -> Result<TensorRef, String> {
    let dtype_name = m.get("dtype").and_then(J::as_str).ok_or("tensor dtype missing")?;
    Ok(TensorRef {
        storage: m.get("storage").and_then(J::as_str).ok_or("tensor storage missing")?.to_owned(),
        dtype: DType::from_torch_name(dtype_name).ok_or_else(|| format!("unsupported dtype {dtype_name}"))?,
        offset: m
            .get("offset")
            .and_then(J::as_u64)
            .and_then(|x| usize::try_from(x).ok())
            .ok_or("tensor offset missing")?,
        shape: usizes(m.get("shape"), "shape")?,
        stride: usizes(m.get("stride"), "stride")?,
        requires_grad: m.get("requires_grad").and_then(J::as_bool).unwrap_or(false),
        class: match m.get("parameter").and_then(J::as_bool) {
            Some(requires_grad) => TensorClass::Parameter { requires_grad },
            None => TensorClass::Tensor,
        },
        object: m.get("object").and_then(J::as_u64),
    })
}

/// Decodes a raw pickle value.
pub fn value_from_json(j: &J) -> Result<Value, String> {
    let list = |j: Option<&J>| -> Result<Vec<Value>, String> {
        j.and_then(J::as_array).ok_or("expected an array")?.iter().map(value_from_json).collect()
    };
    let pairs = |j: Option<&J>| -> Result<Vec<(Value, Value)>, String> {
        j.and_then(J::as_array)
            .ok_or("expected an array of pairs")?
            .iter()
            .map(|p| match p.as_array().map(Vec::as_slice) {
                Some([k, v]) => Ok((value_from_json(k)?, value_from_json(v)?)),
                _ => Err("not a pair".to_owned()),
            })
            .collect()
    };
    let boxed =
        |j: Option<&J>| -> Result<Box<Value>, String> { Ok(Box::new(value_from_json(j.ok_or("missing field")?)?)) };
    Ok(match j {
        J::Null => Value::None,
        J::Bool(b) => Value::Bool(*b),
        J::Number(n) => Value::Int(n.as_i64().ok_or_else(|| format!("non-integer number {n}"))?),
        J::String(s) => Value::Str(s.clone()),
        J::Array(_) => return Err("unexpected bare array".into()),
        J::Object(m) => {
            if let Some(bits) = m.get("f") {
                return Ok(Value::Float(unfloat(bits)?));
            }
            let s = |k: &str| m.get(k).and_then(J::as_str).ok_or_else(|| format!("missing string {k:?}"));
            match s("t")? {
                "bigint" => Value::BigInt(unhex(s("le")?)?),
                "bytes" => Value::Bytes(unhex(s("hex")?)?),
                "bytearray" => Value::ByteArray(unhex(s("hex")?)?),
                "list" => Value::List(list(m.get("v"))?),
                "tuple" => Value::Tuple(list(m.get("v"))?),
                "set" => Value::Set(list(m.get("v"))?),
                "frozenset" => Value::FrozenSet(list(m.get("v"))?),
                "dict" => Value::Dict(pairs(m.get("items"))?),
                "global" => Value::Global { module: s("module")?.to_owned(), name: s("name")?.to_owned() },
                "reduce" => Value::Reduce {
                    callable: boxed(m.get("callable"))?,
                    args: boxed(m.get("args"))?,
                    setitems: pairs(m.get("setitems"))?,
                    appends: list(m.get("appends"))?,
                },
                "newobj" => Value::NewObj {
                    cls: boxed(m.get("cls"))?,
                    args: boxed(m.get("args"))?,
                    kwargs: match m.get("kwargs") {
                        None | Some(J::Null) => None,
                        Some(k) => Some(Box::new(value_from_json(k)?)),
                    },
                    setitems: pairs(m.get("setitems"))?,
                    appends: list(m.get("appends"))?,
                },
                "build" => Value::Build { object: boxed(m.get("object"))?, state: boxed(m.get("state"))? },
                "persid" => Value::PersistentId(boxed(m.get("v"))?),
                "shared" => Value::Shared {
                    id: m.get("id").and_then(J::as_u64).ok_or("shared value without an id")?,
                    value: boxed(m.get("v"))?,
                },
                other => return Err(format!("unknown value type {other:?}")),
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
                        let err = || serde::de::Error::custom("dict item is not a pair");
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
        i64::try_from(u)
            .map(Node::Int)
            .map_err(|_| E::custom(format!("integer {u} does not fit i64 (big ints are tagged)")))
    }
    fn visit_f64<E: serde::de::Error>(self, x: f64) -> Result<Node, E> {
        Err(E::custom(format!("non-integer number {x} (floats are written by their bits)")))
    }
    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Node, E> {
        Ok(Node::Str(s.to_owned()))
    }
    fn visit_string<E: serde::de::Error>(self, s: String) -> Result<Node, E> {
        Ok(Node::Str(s))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, _seq: A) -> Result<Node, A::Error> {
        Err(serde::de::Error::custom("unexpected bare array"))
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
fn assemble(p: Parts) -> Result<Node, String> {
    if let Some(bits) = &p.float {
        if p.tag.is_some() || !p.rest.is_empty() {
            return Err("a float object has one field, \"f\"".into());
        }
        return unfloat(&J::String(bits.clone())).map(Node::Float);
    }
    let tag = p.tag.ok_or("object without a type tag")?;
    let missing = |what: &str| format!("{tag} without {what}");
    Ok(match tag.as_str() {
        "list" => Node::List(p.v_nodes.ok_or_else(|| missing("v"))?),
        "tuple" => Node::Tuple(p.v_nodes.ok_or_else(|| missing("v"))?),
        "set" => Node::Set(p.v_nodes.ok_or_else(|| missing("v"))?),
        "dict" | "odict" => {
            let items = p.items.ok_or_else(|| missing("items"))?;
            let dict =
                Dict::from_entries(dict_kind(&tag), items).map_err(|d| format!("dict key {} appears twice", d.0))?;
            Node::Dict(dict.with_state(p.state))
        }
        "object" => {
            let construct = match p.rest.get("construct").and_then(J::as_str) {
                Some("reduce") => Construct::Reduce,
                Some("newobj") => Construct::NewObj,
                _ => return Err("object construct is not \"reduce\" or \"newobj\"".into()),
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
