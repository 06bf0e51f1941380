//! Helpers shared by the integration tests.
#![allow(dead_code)]

use pmstate_pickle::Value;

/// Structural equality with floats compared by bit pattern (so NaN == NaN, -0.0 != 0.0).
pub fn same(a: &Value, b: &Value) -> bool {
    use Value as V;
    let all = |x: &[Value], y: &[Value]| x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b));
    let pairs = |x: &[(Value, Value)], y: &[(Value, Value)]| {
        x.len() == y.len() && x.iter().zip(y).all(|((k1, v1), (k2, v2))| same(k1, k2) && same(v1, v2))
    };
    match (a, b) {
        (V::Float(x), V::Float(y)) => x.to_bits() == y.to_bits(),
        (V::List(x), V::List(y))
        | (V::Tuple(x), V::Tuple(y))
        | (V::Set(x), V::Set(y))
        | (V::FrozenSet(x), V::FrozenSet(y)) => all(x, y),
        (V::Dict(x), V::Dict(y)) => pairs(x, y),
        (
            V::Reduce { callable: c1, args: a1, setitems: s1, appends: p1 },
            V::Reduce { callable: c2, args: a2, setitems: s2, appends: p2 },
        ) => same(c1, c2) && same(a1, a2) && pairs(s1, s2) && all(p1, p2),
        (
            V::NewObj { cls: c1, args: a1, kwargs: k1, setitems: s1, appends: p1 },
            V::NewObj { cls: c2, args: a2, kwargs: k2, setitems: s2, appends: p2 },
        ) => {
            same(c1, c2)
                && same(a1, a2)
                && match (k1, k2) {
                    (Some(x), Some(y)) => same(x, y),
                    (None, None) => true,
                    _ => false,
                }
                && pairs(s1, s2)
                && all(p1, p2)
        }
        (V::Build { object: o1, state: s1 }, V::Build { object: o2, state: s2 }) => same(o1, o2) && same(s1, s2),
        (V::PersistentId(x), V::PersistentId(y)) => same(x, y),
        _ => a == b,
    }
}

/// A decimal integer as the reader represents it: `Int` if it fits an i64, else minimal `BigInt`.
pub fn int_value(decimal: &str) -> Value {
    let big: num_bigint::BigInt = decimal.parse().expect("decimal");
    match i64::try_from(&big) {
        Ok(i) => Value::Int(i),
        Err(_) => Value::BigInt(big.to_signed_bytes_le()),
    }
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
}

/// Converts the tagged JSON schema of `tests/data/make_vectors.py` into a `Value`.
pub fn from_tagged(j: &serde_json::Value) -> Value {
    let a = j.as_array().expect("tagged value is an array");
    let tag = a[0].as_str().expect("tag");
    let s = |i: usize| a[i].as_str().expect("string field").to_owned();
    let list = |i: usize| a[i].as_array().expect("list field").iter().map(from_tagged).collect::<Vec<_>>();
    let pairs = |i: usize| {
        a[i].as_array()
            .expect("pairs field")
            .iter()
            .map(|p| (from_tagged(&p[0]), from_tagged(&p[1])))
            .collect::<Vec<_>>()
    };
    let boxed = |i: usize| Box::new(from_tagged(&a[i]));
    match tag {
        "none" => Value::None,
        "bool" => Value::Bool(a[1].as_bool().expect("bool")),
        "int" => int_value(&s(1)),
        "float" => Value::Float(f64::from_bits(u64::from_str_radix(&s(1), 16).expect("float bits"))),
        "str" => Value::Str(s(1)),
        "bytes" => Value::Bytes(hex(&s(1))),
        "bytearray" => Value::ByteArray(hex(&s(1))),
        "list" => Value::List(list(1)),
        "tuple" => Value::Tuple(list(1)),
        "set" => Value::Set(list(1)),
        "frozenset" => Value::FrozenSet(list(1)),
        "dict" => Value::Dict(pairs(1)),
        "global" => Value::global(&s(1), &s(2)),
        "reduce" => Value::Reduce { callable: boxed(1), args: boxed(2), setitems: pairs(3), appends: list(4) },
        "newobj" => Value::NewObj {
            cls: boxed(1),
            args: boxed(2),
            kwargs: if a[3].is_null() { None } else { Some(boxed(3)) },
            setitems: pairs(4),
            appends: list(5),
        },
        "build" => Value::Build { object: boxed(1), state: boxed(2) },
        "persid" => Value::PersistentId(boxed(1)),
        other => panic!("unknown tag {other}"),
    }
}

/// Path of the committed vectors directory.
pub fn vectors_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/vectors")
}
