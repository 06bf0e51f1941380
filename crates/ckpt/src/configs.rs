//! Resolved configs (`resolved_configs.pt`) as a JSON tree, without Python.
//!
//! ProtoMotions pickles its live config dataclasses (`torch.save` of
//! `{robot, simulator, terrain, scene_lib, motion_lib, env, agent}`), so the
//! file needs `weights_only=False` and the ProtoMotions package to load in
//! Python. [`Checkpoint::open`] already reads it inertly into a [`Node`]
//! tree; this module turns any part of that tree into plain JSON that a
//! person or a script can read:
//!
//! | in the pickle | in the JSON |
//! | --- | --- |
//! | a dataclass or other object built with `NEWOBJ` + `BUILD` | `{"__class__": "module.QualName", field: value, ...}` in field order |
//! | a call `Cls(value)` with no state (how enum members pickle) | `{"__class__": "module.Cls", "__value__": value}` |
//! | any other call | `{"__class__": ..., "__args__": [...]}` (plus `__kwargs__`, `__state__`, `__items__`, `__appends__` when present) |
//! | a function or class by reference | `{"__global__": "module.name"}` |
//! | `None`, bools, strings | `null`, `true`/`false`, strings |
//! | ints | JSON integers (`5` stays `5`), larger ones `{"__bigint__": "decimal"}` |
//! | floats | JSON numbers that keep their value and their float-ness (`5.0`); NaN and infinities `{"__float__": "nan"}` |
//! | lists, tuples, sets | arrays |
//! | dicts | objects (non-string keys by their short form); `{"__dict__": [[key, value], ...]}` when two keys would print the same (`1` and `'1'`) |
//! | tensors | `{"__tensor__": {"dtype", "shape", "values"?}}`, values when at most [`SMALL_TENSOR`] elements |
//! | `torch.device`, `torch.float32` | `{"__device__": "cuda:0"}`, `{"__dtype__": "float32"}` |
//!
//! The distinction between `5` and `5.0` matters: ProtoMotions passes
//! `norm_clamp_value=5` (an int) in most experiment files and `5.0` in
//! others, and its YAML dump keeps that only as the strings `'5'`/`'5.0'`.

use serde_json::{json, Map, Number, Value as J};

use crate::checkpoint::Checkpoint;
use crate::dtype::DType;
use crate::tree::{Construct, Node, Object, TensorRef};

/// Tensors with at most this many elements carry their values in the JSON.
pub const SMALL_TENSOR: usize = 64;

impl Checkpoint {
    /// The config tree at dotted key `key` (`""` for the whole file) as JSON
    /// (see the module documentation for the mapping). Dotted keys descend
    /// into dataclass fields and list indices: `agent.model.actor.mu_model.norm_clamp_value`.
    ///
    /// `None` when there is no such key.
    ///
    /// ```no_run
    /// use pmstate_ckpt::Checkpoint;
    /// let cfg = Checkpoint::open("resolved_configs.pt")?;
    /// let clamp = cfg.config_json("agent.model.actor.mu_model.norm_clamp_value");
    /// assert_eq!(clamp.map(|v| v.to_string()).as_deref(), Some("5"));
    /// # Ok::<(), pmstate_ckpt::CkptError>(())
    /// ```
    pub fn config_json(&self, key: &str) -> Option<J> {
        self.get(key).map(|node| config_node_to_json(self, node))
    }
}

/// One node of a config tree as JSON, reading small tensors' values from `ckpt`.
pub fn config_node_to_json(ckpt: &Checkpoint, node: &Node) -> J {
    match node {
        Node::None => J::Null,
        Node::Bool(b) => J::Bool(*b),
        Node::Int(i) => J::from(*i),
        Node::BigInt(le) => json!({ "__bigint__": bigint_decimal(le) }),
        Node::Float(f) => float(*f),
        Node::Complex(re, im) => json!({ "__complex__": [float(*re), float(*im)] }),
        Node::Str(s) => J::String(s.clone()),
        Node::Bytes(b) => json!({ "__bytes__": b.iter().map(|x| format!("{x:02x}")).collect::<String>() }),
        Node::List(xs) | Node::Tuple(xs) | Node::Set(xs) => {
            J::Array(xs.iter().map(|x| config_node_to_json(ckpt, x)).collect())
        }
        Node::Dict(d) => {
            let mut m = Map::new();
            for (k, v) in d.entries() {
                if m.insert(key_text(k), config_node_to_json(ckpt, v)).is_some() {
                    // Two keys print the same (`1` and `'1'`): an object
                    // would keep only the last, so list the pairs instead.
                    let pairs = d
                        .entries()
                        .iter()
                        .map(|(k, v)| J::Array(vec![config_node_to_json(ckpt, k), config_node_to_json(ckpt, v)]));
                    return json!({ "__dict__": J::Array(pairs.collect()) });
                }
            }
            J::Object(m)
        }
        Node::Tensor(t) => tensor_json(ckpt, t),
        Node::Device { kind, index: Some(i) } => json!({ "__device__": format!("{kind}:{i}") }),
        Node::Device { kind, index: None } => json!({ "__device__": kind }),
        Node::TorchDtype(name) => json!({ "__dtype__": name }),
        Node::Global { module, name } => json!({ "__global__": format!("{module}.{name}") }),
        Node::Object(o) => object_json(ckpt, o),
        Node::Opaque(_) => json!({ "__opaque__": node.to_string() }),
    }
}

fn key_text(k: &Node) -> String {
    match k {
        Node::Str(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A float that JSON can hold keeps its value (serde_json writes `5.0`,
/// never `5`); NaN and the infinities, which JSON cannot hold, are tagged.
fn float(f: f64) -> J {
    match Number::from_f64(f) {
        Some(n) => J::Number(n),
        None if f.is_nan() => json!({ "__float__": "nan" }),
        None if f > 0.0 => json!({ "__float__": "inf" }),
        None => json!({ "__float__": "-inf" }),
    }
}

fn object_json(ckpt: &Checkpoint, o: &Object) -> J {
    let mut m = Map::new();
    let class = match &o.callable {
        Node::Global { module, name } => format!("{module}.{name}"),
        other => other.to_string(),
    };
    m.insert("__class__".into(), J::String(class));
    let args: &[Node] = match &o.args {
        Node::Tuple(xs) => xs,
        _ => &[],
    };
    let simple_call = o.construct == Construct::Reduce
        && o.state.is_none()
        && o.kwargs.is_none()
        && o.setitems.is_empty()
        && o.appends.is_empty()
        && args.len() == 1;
    if simple_call {
        m.insert("__value__".into(), config_node_to_json(ckpt, &args[0]));
        return J::Object(m);
    }
    match &o.args {
        Node::Tuple(xs) if xs.is_empty() => {}
        other => {
            m.insert("__args__".into(), config_node_to_json(ckpt, other));
        }
    }
    if let Some(k) = &o.kwargs {
        m.insert("__kwargs__".into(), config_node_to_json(ckpt, k));
    }
    match &o.state {
        // A dataclass: its fields, in order, beside the class (unless a
        // field is named like one of our tags: then all under __state__).
        Some(Node::Dict(d))
            if d.state().is_none()
                && d.entries()
                    .iter()
                    .all(|(k, _)| k.as_str().is_some_and(|s| !(s.starts_with("__") && s.ends_with("__")))) =>
        {
            for (k, v) in d.entries() {
                m.insert(key_text(k), config_node_to_json(ckpt, v));
            }
        }
        Some(other) => {
            m.insert("__state__".into(), config_node_to_json(ckpt, other));
        }
        None => {}
    }
    if !o.setitems.is_empty() {
        let items = o.setitems.iter().map(|(k, v)| json!([config_node_to_json(ckpt, k), config_node_to_json(ckpt, v)]));
        m.insert("__items__".into(), J::Array(items.collect()));
    }
    if !o.appends.is_empty() {
        m.insert("__appends__".into(), J::Array(o.appends.iter().map(|x| config_node_to_json(ckpt, x)).collect()));
    }
    J::Object(m)
}

fn tensor_json(ckpt: &Checkpoint, t: &TensorRef) -> J {
    let mut inner = Map::new();
    inner.insert("dtype".into(), J::String(t.dtype.torch_name().to_owned()));
    inner.insert("shape".into(), json!(t.shape));
    if t.numel() <= SMALL_TENSOR {
        if let Some(values) = tensor_values(ckpt, t) {
            inner.insert("values".into(), values);
        }
    }
    json!({ "__tensor__": J::Object(inner) })
}

/// The elements, flat in C order, for the dtypes a config holds (floats,
/// ints, bools); `None` for others or when the data cannot be read.
fn tensor_values(ckpt: &Checkpoint, t: &TensorRef) -> Option<J> {
    let bytes = ckpt.tensor_bytes(t).ok()?;
    let size = t.dtype.size();
    let chunks = bytes.chunks_exact(size);
    let vals: Vec<J> = match t.dtype {
        DType::F64 => chunks.map(|c| float(f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))).collect(),
        DType::F32 => chunks.map(|c| float(f32::from_le_bytes(c.try_into().unwrap_or([0; 4])) as f64)).collect(),
        DType::I64 => chunks.map(|c| J::from(i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))).collect(),
        DType::I32 => chunks.map(|c| J::from(i32::from_le_bytes(c.try_into().unwrap_or([0; 4])))).collect(),
        DType::I16 => chunks.map(|c| J::from(i16::from_le_bytes(c.try_into().unwrap_or([0; 2])))).collect(),
        DType::I8 => chunks.map(|c| J::from(c[0] as i8)).collect(),
        DType::U8 => chunks.map(|c| J::from(c[0])).collect(),
        DType::Bool => chunks.map(|c| J::Bool(c[0] != 0)).collect(),
        _ => return None,
    };
    Some(J::Array(vals))
}

/// A little-endian two's complement integer in decimal.
fn bigint_decimal(le: &[u8]) -> String {
    let negative = le.last().is_some_and(|b| b & 0x80 != 0);
    // Magnitude, little-endian bytes.
    let mut mag: Vec<u8> = le.to_vec();
    if negative {
        // two's complement negate
        let mut carry = 1u16;
        for b in mag.iter_mut() {
            let v = (!*b) as u16 + carry;
            *b = v as u8;
            carry = v >> 8;
        }
    }
    // Repeated division by 10 on a big-endian copy.
    let mut be: Vec<u8> = mag.into_iter().rev().collect();
    let mut digits = Vec::new();
    while be.iter().any(|&b| b != 0) {
        let mut rem = 0u16;
        for b in be.iter_mut() {
            let cur = (rem << 8) | *b as u16;
            *b = (cur / 10) as u8;
            rem = cur % 10;
        }
        digits.push(b'0' + rem as u8);
    }
    if digits.is_empty() {
        digits.push(b'0');
    }
    if negative {
        digits.push(b'-');
    }
    digits.reverse();
    String::from_utf8(digits).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bigint_decimal_matches_python() {
        // 2**64 = 0x1_0000_0000_0000_0000, little-endian with a sign byte
        assert_eq!(bigint_decimal(&[0, 0, 0, 0, 0, 0, 0, 0, 1]), "18446744073709551616");
        // -2**64
        assert_eq!(bigint_decimal(&[0, 0, 0, 0, 0, 0, 0, 0, 0xff]), "-18446744073709551616");
        assert_eq!(bigint_decimal(&[]), "0");
    }

    #[test]
    fn floats_keep_their_kind() {
        assert_eq!(float(5.0).to_string(), "5.0");
        assert_eq!(J::from(5i64).to_string(), "5");
        assert_eq!(float(f64::NAN), json!({"__float__": "nan"}));
        assert_eq!(float(f64::NEG_INFINITY), json!({"__float__": "-inf"}));
    }

    #[test]
    fn keys_that_print_the_same_keep_both_entries() {
        use crate::tree::{Dict, DictKind};
        let dict = |entries| Node::Dict(Dict::from_entries(DictKind::Plain, entries).unwrap());
        let ckpt = Checkpoint::from_parts(Node::None, Default::default()).unwrap();
        let distinct = dict(vec![(Node::Int(1), Node::Str("int".into())), (Node::Str("b".into()), Node::Bool(true))]);
        assert_eq!(config_node_to_json(&ckpt, &distinct), json!({"1": "int", "b": true}));
        let clash =
            dict(vec![(Node::Int(1), Node::Str("int".into())), (Node::Str("1".into()), Node::Str("str".into()))]);
        assert_eq!(config_node_to_json(&ckpt, &clash), json!({"__dict__": [[1, "int"], ["1", "str"]]}));
    }
}
