//! The checkpoint tree as JSON: exact (floats by their bits, big ints and
//! bytes in hex), so the safetensors bridge can carry a whole checkpoint in
//! `__metadata__` and restore it bit for bit.

use pmstate_pickle::Value;
use serde_json::{json, Map, Value as J};

use crate::dtype::DType;
use crate::tree::{Construct, Dict, Node, Object, TensorRef};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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

fn float(f: f64) -> J {
    json!({ "f": format!("{:016x}", f.to_bits()) })
}

fn unfloat(j: &J) -> Result<f64, String> {
    let s = j.as_str().ok_or("float bits are not a string")?;
    u64::from_str_radix(s, 16).map(f64::from_bits).map_err(|_| format!("bad float bits {s:?}"))
}

/// Encodes a node.
pub fn node_to_json(n: &Node) -> J {
    let list = |xs: &[Node]| J::Array(xs.iter().map(node_to_json).collect());
    match n {
        Node::None => J::Null,
        Node::Bool(b) => J::Bool(*b),
        Node::Int(i) => json!(i),
        Node::Str(s) => J::String(s.clone()),
        Node::Float(f) => float(*f),
        Node::BigInt(b) => json!({ "t": "bigint", "le": hex(b) }),
        Node::Complex(re, im) => json!({ "t": "complex", "re": float(*re)["f"], "im": float(*im)["f"] }),
        Node::Bytes(b) => json!({ "t": "bytes", "hex": hex(b) }),
        Node::List(xs) => json!({ "t": "list", "v": list(xs) }),
        Node::Tuple(xs) => json!({ "t": "tuple", "v": list(xs) }),
        Node::Set(xs) => json!({ "t": "set", "v": list(xs) }),
        Node::Dict(d) => {
            let items: Vec<J> = d.entries.iter().map(|(k, v)| json!([node_to_json(k), node_to_json(v)])).collect();
            let mut m = Map::new();
            m.insert("t".into(), json!(if d.ordered { "odict" } else { "dict" }));
            m.insert("items".into(), J::Array(items));
            if let Some(s) = &d.state {
                m.insert("state".into(), node_to_json(s));
            }
            J::Object(m)
        }
        Node::Tensor(t) => json!({
            "t": "tensor",
            "storage": t.storage,
            "dtype": t.dtype.torch_name(),
            "offset": t.offset,
            "shape": t.shape,
            "stride": t.stride,
            "requires_grad": t.requires_grad,
            "parameter": t.parameter,
            "object": t.object,
        }),
        Node::Device { kind, index } => json!({ "t": "device", "type": kind, "index": index }),
        Node::TorchDtype(name) => json!({ "t": "dtype", "name": name }),
        Node::Global { module, name } => json!({ "t": "global", "module": module, "name": name }),
        Node::Object(o) => {
            let mut m = Map::new();
            m.insert("t".into(), json!("object"));
            m.insert(
                "construct".into(),
                json!(match o.construct {
                    Construct::Reduce => "reduce",
                    Construct::NewObj => "newobj",
                }),
            );
            m.insert("callable".into(), node_to_json(&o.callable));
            m.insert("args".into(), node_to_json(&o.args));
            if let Some(k) = &o.kwargs {
                m.insert("kwargs".into(), node_to_json(k));
            }
            if let Some(st) = &o.state {
                m.insert("state".into(), node_to_json(st));
            }
            if !o.setitems.is_empty() {
                let items = o.setitems.iter().map(|(k, v)| json!([node_to_json(k), node_to_json(v)])).collect();
                m.insert("setitems".into(), J::Array(items));
            }
            if !o.appends.is_empty() {
                m.insert("appends".into(), J::Array(o.appends.iter().map(node_to_json).collect()));
            }
            J::Object(m)
        }
        Node::Opaque(v) => json!({ "t": "pickle", "v": value_to_json(v) }),
    }
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
                    let state = m.get("state").map(node_from_json).transpose()?.map(Box::new);
                    Node::Dict(Dict { ordered: tag == "odict", entries, state })
                }
                "tensor" => Node::Tensor(tensor_from_json(m)?),
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
                "pickle" => Node::Opaque(value_from_json(field("v")?)?),
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
        parameter: m.get("parameter").and_then(J::as_bool),
        object: m.get("object").and_then(J::as_u64),
    })
}

/// Encodes a raw pickle value (for opaque nodes).
pub fn value_to_json(v: &Value) -> J {
    let list = |xs: &[Value]| J::Array(xs.iter().map(value_to_json).collect());
    let pairs =
        |kv: &[(Value, Value)]| J::Array(kv.iter().map(|(k, v)| json!([value_to_json(k), value_to_json(v)])).collect());
    match v {
        Value::None => J::Null,
        Value::Bool(b) => J::Bool(*b),
        Value::Int(i) => json!(i),
        Value::Str(s) => J::String(s.clone()),
        Value::Float(f) => float(*f),
        Value::BigInt(b) => json!({ "t": "bigint", "le": hex(b) }),
        Value::Bytes(b) => json!({ "t": "bytes", "hex": hex(b) }),
        Value::ByteArray(b) => json!({ "t": "bytearray", "hex": hex(b) }),
        Value::List(xs) => json!({ "t": "list", "v": list(xs) }),
        Value::Tuple(xs) => json!({ "t": "tuple", "v": list(xs) }),
        Value::Set(xs) => json!({ "t": "set", "v": list(xs) }),
        Value::FrozenSet(xs) => json!({ "t": "frozenset", "v": list(xs) }),
        Value::Dict(kv) => json!({ "t": "dict", "items": pairs(kv) }),
        Value::Global { module, name } => json!({ "t": "global", "module": module, "name": name }),
        Value::Reduce { callable, args, setitems, appends } => json!({
            "t": "reduce", "callable": value_to_json(callable), "args": value_to_json(args),
            "setitems": pairs(setitems), "appends": list(appends),
        }),
        Value::NewObj { cls, args, kwargs, setitems, appends } => json!({
            "t": "newobj", "cls": value_to_json(cls), "args": value_to_json(args),
            "kwargs": kwargs.as_deref().map(value_to_json), "setitems": pairs(setitems), "appends": list(appends),
        }),
        Value::Build { object, state } => {
            json!({ "t": "build", "object": value_to_json(object), "state": value_to_json(state) })
        }
        Value::PersistentId(p) => json!({ "t": "persid", "v": value_to_json(p) }),
        Value::Shared { id, value } => json!({ "t": "shared", "id": id, "v": value_to_json(value) }),
    }
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
