//! Writer and reader agree (proptest), and serde-pickle 1.2 is a differential oracle for both.

mod common;

use common::{int_value, same};
use num_bigint::BigInt;
use pmstate_pickle::{from_slice, to_vec, write, Limits, PickleError, Value, WriteOptions, WriteProblem};
use proptest::prelude::*;
use serde_pickle::{HashableValue as HV, Value as SV};

// ----- our values -----

fn big_int() -> impl Strategy<Value = Value> {
    // Random magnitudes of 9 to 255 bytes, either sign: always a BigInt, at most LONG1's 255 bytes.
    (prop::collection::vec(any::<u8>(), 9..=254), any::<bool>()).prop_map(|(mag, neg)| {
        let n: BigInt = BigInt::from_bytes_le(num_bigint::Sign::Plus, &mag) + (BigInt::from(1u8) << 64);
        let n = if neg { -n } else { n };
        int_value(&n.to_string())
    })
}

fn ident() -> impl Strategy<Value = String> {
    "[a-z_][a-z0-9_]{0,8}(\\.[a-z_][a-z0-9_]{0,8}){0,2}"
}

/// Globals that the reader does not turn into plain data.
fn global() -> impl Strategy<Value = Value> {
    prop_oneof![
        (ident(), ident()).prop_map(|(m, n)| Value::Global { module: format!("m_{m}"), name: n }),
        Just(Value::global("collections", "OrderedDict")),
        Just(Value::global("torch._utils", "_rebuild_tensor_v2")),
        Just(Value::global("torch", "float32")),
        Just(Value::global("a module with spaces é", "ünïcode name")),
    ]
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::None),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::Int),
        (-70_000i64..70_000).prop_map(Value::Int),
        big_int(),
        any::<u64>().prop_map(|bits| Value::Float(f64::from_bits(bits))),
        any::<f64>().prop_map(Value::Float),
        ".*".prop_map(Value::Str),
        prop::collection::vec(any::<u8>(), 0..40).prop_map(Value::Bytes),
    ]
}

/// Hashable values (dict keys and set items): scalars, tuples of them, globals.
fn hashable() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![scalar(), global()];
    leaf.prop_recursive(2, 8, 4, |inner| prop::collection::vec(inner, 0..4).prop_map(Value::Tuple))
}

/// Removes later duplicates (structural, floats by bits), as the reader does for keys.
fn dedup<T>(items: Vec<T>, key: impl Fn(&T) -> &Value) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for item in items {
        if !out.iter().any(|o| same(key(o), key(&item))) {
            out.push(item);
        }
    }
    out
}

fn writable() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        4 => scalar(),
        1 => global(),
        1 => prop::collection::vec(any::<u8>(), 0..40).prop_map(Value::ByteArray),
    ];
    leaf.prop_recursive(5, 64, 6, |inner| {
        let pairs = prop::collection::vec((hashable(), inner.clone()), 0..6);
        let any_pairs = prop::collection::vec((inner.clone(), inner.clone()), 0..3);
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::List),
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Tuple),
            pairs.prop_map(|p| Value::Dict(dedup(p, |(k, _)| k))),
            prop::collection::vec(hashable(), 0..6).prop_map(|xs| Value::Set(dedup(xs, |x| x))),
            prop::collection::vec(hashable(), 0..6).prop_map(|xs| Value::FrozenSet(dedup(xs, |x| x))),
            (global(), inner.clone(), any_pairs.clone(), prop::collection::vec(inner.clone(), 0..3)).prop_map(
                |(c, a, setitems, appends)| Value::Reduce {
                    callable: Box::new(c),
                    args: Box::new(a),
                    setitems,
                    appends
                }
            ),
            (global(), inner.clone(), any_pairs, prop::collection::vec(inner.clone(), 0..3)).prop_map(
                |(c, a, setitems, appends)| Value::NewObj {
                    cls: Box::new(c),
                    args: Box::new(a),
                    kwargs: None,
                    setitems,
                    appends
                }
            ),
            (inner.clone(), inner.clone()).prop_map(|(o, s)| Value::Build { object: Box::new(o), state: Box::new(s) }),
            inner.prop_map(|p| Value::PersistentId(Box::new(p))),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn write_then_read_gives_the_value_back(v in writable()) {
        let bytes = to_vec(&v).expect("writable");
        let back = from_slice(&bytes, &Limits::default()).expect("readable");
        prop_assert!(same(&back, &v), "\n  wrote {v:?}\n  read  {back:?}");
        // Deterministic, and the same with memoized globals off.
        prop_assert_eq!(&to_vec(&v).expect("writable"), &bytes);
        let mut plain = Vec::new();
        write(&v, &mut plain, &WriteOptions { memoize_globals: false, ..WriteOptions::default() }).expect("writable");
        let back = from_slice(&plain, &Limits::default()).expect("readable");
        prop_assert!(same(&back, &v));
    }
}

/// The path and problem of a [`PickleError::Unwritable`].
fn unwritable(v: &Value, opts: &WriteOptions) -> (String, WriteProblem) {
    match write(v, &mut Vec::new(), opts) {
        Err(PickleError::Unwritable { path, problem }) => (path, problem),
        other => panic!("expected Unwritable, got {other:?}"),
    }
}

#[test]
fn unwritable_values_are_named_by_place_and_problem() {
    let opts = WriteOptions::default();
    let kwargs = Value::NewObj {
        cls: Box::new(Value::global("m", "C")),
        args: Box::new(Value::Tuple(vec![])),
        kwargs: Some(Box::new(Value::Dict(vec![]))),
        setitems: vec![],
        appends: vec![],
    };
    let tree = Value::Dict(vec![(Value::Str("model".into()), Value::List(vec![Value::None, kwargs]))]);
    assert_eq!(unwritable(&tree, &opts), ("root[\"model\"][1]".into(), WriteProblem::KeywordArguments));
    let global = Value::global("os\nsystem", "x");
    assert_eq!(unwritable(&global, &opts), ("root".into(), WriteProblem::NewlineInGlobal));
    // 300 bytes: more than LONG1 holds; LONG4 only when weights_only compatibility is off.
    let wide = Value::BigInt(vec![1; 300]);
    assert_eq!(unwritable(&wide, &opts), ("root".into(), WriteProblem::NeedsLong4(300)));
    let long4 = WriteOptions { protocol2_only: false, ..WriteOptions::default() };
    let mut bytes = Vec::new();
    write(&wide, &mut bytes, &long4).expect("LONG4 allowed");
    assert!(same(&from_slice(&bytes, &Limits::default()).expect("readable"), &wide));
}

// ----- serde-pickle as the oracle -----

fn sv_scalar() -> impl Strategy<Value = SV> {
    prop_oneof![
        Just(SV::None),
        any::<bool>().prop_map(SV::Bool),
        any::<i64>().prop_map(SV::I64),
        (prop::collection::vec(any::<u8>(), 1..40), any::<bool>()).prop_map(|(mag, neg)| {
            let n = BigInt::from_bytes_le(num_bigint::Sign::Plus, &mag);
            SV::Int(if neg { -n } else { n })
        }),
        any::<f64>().prop_map(SV::F64),
        ".*".prop_map(SV::String),
        prop::collection::vec(any::<u8>(), 0..40).prop_map(SV::Bytes),
    ]
}

fn sv_key() -> impl Strategy<Value = HV> {
    prop_oneof![".{0,6}".prop_map(HV::String), any::<i64>().prop_map(HV::I64), (-3i64..3).prop_map(HV::I64)]
}

fn sv_value() -> impl Strategy<Value = SV> {
    sv_scalar().prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(SV::List),
            prop::collection::vec(inner.clone(), 0..6).prop_map(SV::Tuple),
            prop::collection::btree_map(sv_key(), inner, 0..6).prop_map(SV::Dict),
        ]
    })
}

/// What our reader must give for a serde-pickle value (its dicts are sorted `BTreeMap`s, written in that order).
fn expected(v: &SV) -> Value {
    match v {
        SV::None => Value::None,
        SV::Bool(b) => Value::Bool(*b),
        SV::I64(i) => Value::Int(*i),
        SV::Int(n) => int_value(&n.to_string()),
        SV::F64(f) => Value::Float(*f),
        SV::Bytes(b) => Value::Bytes(b.clone()),
        SV::String(s) => Value::Str(s.clone()),
        SV::List(xs) => Value::List(xs.iter().map(expected).collect()),
        SV::Tuple(xs) => Value::Tuple(xs.iter().map(expected).collect()),
        SV::Set(xs) => Value::Set(xs.iter().map(|x| expected(&x.clone().into_value())).collect()),
        SV::FrozenSet(xs) => Value::FrozenSet(xs.iter().map(|x| expected(&x.clone().into_value())).collect()),
        SV::Dict(m) => Value::Dict(m.iter().map(|(k, v)| (expected(&k.clone().into_value()), expected(v))).collect()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn reads_what_serde_pickle_writes(v in sv_value()) {
        let want = expected(&v);
        for (proto, opts) in [(3, serde_pickle::SerOptions::new()), (2, serde_pickle::SerOptions::new().proto_v2())] {
            let bytes = serde_pickle::value_to_vec(&v, opts).expect("serde-pickle writes");
            let got = from_slice(&bytes, &Limits::default()).expect("we read");
            prop_assert!(same(&got, &want), "protocol {proto}\n  got  {got:?}\n  want {want:?}");
        }
    }

    #[test]
    fn serde_pickle_reads_what_we_write(v in sv_value()) {
        let ours = expected(&v);
        let bytes = to_vec(&ours).expect("writable");
        let back = serde_pickle::value_from_slice(&bytes, serde_pickle::DeOptions::new()).expect("serde-pickle reads");
        prop_assert!(same(&expected(&back), &ours), "\n  wrote {ours:?}\n  serde read {back:?}");
    }
}

#[test]
fn serde_pickle_sets_decode_as_sets() {
    let v = SV::Set([HV::I64(1), HV::String("a".into()), HV::Tuple(vec![HV::I64(2)])].into_iter().collect());
    for opts in [serde_pickle::SerOptions::new(), serde_pickle::SerOptions::new().proto_v2()] {
        let bytes = serde_pickle::value_to_vec(&v, opts).expect("serde-pickle writes");
        let got = from_slice(&bytes, &Limits::default()).expect("we read");
        assert!(same(&got, &expected(&v)), "{got:?}");
    }
}
