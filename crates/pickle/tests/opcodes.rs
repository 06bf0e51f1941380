//! Hand-made pickles for the opcodes CPython 3 no longer writes (Python 2 strings, `INST`, `OBJ`...)
//! and for the reader's semantics (memo identity, in-place `BUILD`, repeated keys, legacy streams).

mod common;

use common::same;
use pmstate_pickle::{from_slice, from_slice_prefix, Limits, Operand, PickleError, ReadProblem, Value};

fn read(bytes: &[u8]) -> Value {
    from_slice(bytes, &Limits::default()).unwrap_or_else(|e| panic!("{e} in {bytes:?}"))
}

fn err(bytes: &[u8]) -> PickleError {
    from_slice(bytes, &Limits::default()).expect_err("must fail")
}

fn s(x: &str) -> Value {
    Value::Str(x.to_owned())
}

/// The opcode and the problem of a [`PickleError::Invalid`].
fn invalid(e: &PickleError) -> (&'static str, ReadProblem) {
    match e {
        PickleError::Invalid { opcode, problem, .. } => (opcode, problem.clone()),
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn python2_strings_are_text_when_utf8_else_bytes() {
    assert_eq!(read(b"S'a\\x41\\n\\'q\\\\'\n."), s("aA\n'q\\"));
    assert_eq!(read(b"S\"dq\"\n."), s("dq"));
    assert_eq!(read(b"U\x03abc."), s("abc"));
    assert_eq!(read(b"T\x02\x00\x00\x00\xc3\xa9."), s("\u{e9}"));
    assert_eq!(read(b"T\x02\x00\x00\x00\xff\xfe."), Value::Bytes(vec![0xff, 0xfe]));
    assert_eq!(invalid(&err(b"S'unterminated\n.")), ("STRING", ReadProblem::UnquotedString));
    assert_eq!(invalid(&err(b"T\xff\xff\xff\xff.")), ("BINSTRING", ReadProblem::NegativeLength));
}

#[test]
fn text_opcodes() {
    assert_eq!(read(b"I00\n."), Value::Bool(false));
    assert_eq!(read(b"I01\n."), Value::Bool(true));
    assert_eq!(read(b"I-42\n."), Value::Int(-42));
    assert_eq!(read(b"L18446744073709551616L\n."), Value::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0, 1]));
    assert_eq!(read(b"L-5\n."), Value::Int(-5));
    assert!(matches!(read(b"Fnan\n."), Value::Float(f) if f.is_nan()));
    assert_eq!(read(b"F-1.25e3\n."), Value::Float(-1250.0));
    assert_eq!(read(b"Vcaf\xe9 \\u2713\n."), s("caf\u{e9} \u{2713}"));
    assert_eq!(read(b"(I1\nI2\nl."), Value::List(vec![Value::Int(1), Value::Int(2)]));
    assert_eq!(read(b"(I1\nI2\nt."), Value::Tuple(vec![Value::Int(1), Value::Int(2)]));
    assert_eq!(read(b"(Vk\nI2\nd."), Value::Dict(vec![(s("k"), Value::Int(2))]));
    assert_eq!(read(b"(lp7\nI1\nag7\n0g7\n."), Value::List(vec![Value::Int(1)]));
    assert_eq!(read(b"Pstorage 0\n."), Value::PersistentId(Box::new(s("storage 0"))));
    let malformed = ReadProblem::MalformedLiteral { what: Operand::IntegerLiteral, text: "abc".into() };
    assert_eq!(invalid(&err(b"Iabc\n.")), ("INT", malformed));
    assert!(matches!(err(b"I12"), PickleError::Truncated { offset: 3, what: "integer literal" }), "{}", err(b"I12"));
}

#[test]
fn inst_and_obj_become_new_objects() {
    let want = Value::NewObj {
        cls: Box::new(Value::global("mod", "Cls")),
        args: Box::new(Value::Tuple(vec![Value::Int(1)])),
        kwargs: None,
        setitems: vec![],
        appends: vec![],
    };
    assert_eq!(read(b"(I1\nimod\nCls\n."), want);
    assert_eq!(read(b"(cmod\nCls\nI1\no."), want);
    assert_eq!(invalid(&err(b"(o.")), ("OBJ", ReadProblem::NoClass));
}

#[test]
fn protocol_4_and_5_opcodes() {
    // FRAME, SHORT_BINUNICODE, MEMOIZE, STACK_GLOBAL, NEWOBJ_EX, BINGET of a MEMOIZE'd value.
    let p = b"\x80\x04\x95\x13\x00\x00\x00\x00\x00\x00\x00\x8c\x01m\x94\x8c\x01C\x94\x93)}\x8c\x01kh\x00s\x92.";
    assert_eq!(
        read(p),
        Value::NewObj {
            cls: Box::new(Value::global("m", "C")),
            args: Box::new(Value::Tuple(vec![])),
            kwargs: Some(Box::new(Value::Dict(vec![(s("k"), s("m"))]))),
            setitems: vec![],
            appends: vec![],
        }
    );
    // EMPTY_SET + ADDITEMS drop repeats; FROZENSET too.
    assert_eq!(read(b"\x80\x04\x8f(K\x01K\x02K\x01\x90."), Value::Set(vec![Value::Int(1), Value::Int(2)]));
    assert_eq!(read(b"\x80\x04(K\x01K\x01\x91."), Value::FrozenSet(vec![Value::Int(1)]));
    // BINBYTES8, BINUNICODE8, BYTEARRAY8, SHORT_BINBYTES, BINBYTES.
    assert_eq!(read(b"\x80\x05\x8e\x01\x00\x00\x00\x00\x00\x00\x00z."), Value::Bytes(b"z".to_vec()));
    assert_eq!(read(b"\x80\x05\x8d\x01\x00\x00\x00\x00\x00\x00\x00z."), s("z"));
    assert_eq!(read(b"\x80\x05\x96\x01\x00\x00\x00\x00\x00\x00\x00z."), Value::ByteArray(b"z".to_vec()));
    assert_eq!(read(b"\x80\x03C\x01z."), Value::Bytes(b"z".to_vec()));
    assert_eq!(read(b"\x80\x03B\x01\x00\x00\x00z."), Value::Bytes(b"z".to_vec()));
    // LONG4
    assert_eq!(read(b"\x80\x02\x8b\x02\x00\x00\x00\xff\x7f."), Value::Int(0x7fff));
    assert_eq!(read(b"\x80\x02\x8b\x00\x00\x00\x00."), Value::Int(0));
}

#[test]
fn stack_manipulation() {
    assert_eq!(read(b"K\x01K\x020."), Value::Int(1)); // POP
    assert_eq!(read(b"K\x01(K\x02K\x031."), Value::Int(1)); // POP_MARK
    assert_eq!(read(b"K\x01(0."), Value::Int(1)); // POP on an empty frame pops the mark
    assert_eq!(read(b"K\x012\x86."), Value::Tuple(vec![Value::Int(1), Value::Int(1)])); // DUP
                                                                                        // Items under the result at STOP are ignored, as in Python.
    assert_eq!(read(b"K\x01K\x02."), Value::Int(2));
    // An item below the MARK is out of reach.
    assert_eq!(invalid(&err(b"]K\x01(a.")), ("APPEND", ReadProblem::EmptyFrame));
    assert_eq!(invalid(&err(b"a.")), ("APPEND", ReadProblem::EmptyStack));
    assert_eq!(invalid(&err(b"K\x01e.")), ("APPENDS", ReadProblem::NoMark));
    assert_eq!(invalid(&err(b"K\x01(\x86.")), ("TUPLE2", ReadProblem::TooFewItems(2)));
}

#[test]
fn memo_shares_identity_and_mutations_show_through() {
    // EMPTY_DICT BINPUT 0, then SETITEMS on the memoized dict, then the dict used twice.
    let p = b"\x80\x02]q\x00}q\x01(X\x01\x00\x00\x00aK\x01ua h\x01a.";
    let p: Vec<u8> = p.iter().copied().filter(|&b| b != b' ').collect();
    let d = Value::Dict(vec![(s("a"), Value::Int(1))]);
    assert_eq!(read(&p), Value::List(vec![d.clone(), d]));
    // The memoized list is appended to after it was put in the tuple.
    let p = b"\x80\x02]q\x00\x85h\x00K\x07a0.";
    assert_eq!(read(p), Value::Tuple(vec![Value::List(vec![Value::Int(7)])]));
    assert_eq!(invalid(&err(b"h\x05.")), ("BINGET", ReadProblem::MissingMemo(5)));
    assert_eq!(invalid(&err(b"p1\n.")), ("PUT", ReadProblem::EmptyStack));
}

#[test]
fn build_changes_its_object_in_place() {
    // obj = OrderedDict(); memo[1] = obj; obj.__setstate__({'x': 1}); result (memo[1], obj)
    let p = b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01}X\x01\x00\x00\x00xK\x01sbh\x01\x86.";
    let built = Value::Build {
        object: Box::new(Value::reduce(Value::global("collections", "OrderedDict"), Value::Tuple(vec![]))),
        state: Box::new(Value::Dict(vec![(s("x"), Value::Int(1))])),
    };
    // Referenced twice, the built object is marked shared: both occurrences carry one id.
    match read(p) {
        Value::Tuple(items) => match items.as_slice() {
            [Value::Shared { id: a, value: va }, Value::Shared { id: b, value: vb }] => {
                assert_eq!(a, b);
                assert_eq!(**va, built);
                assert_eq!(**vb, built);
            }
            other => panic!("expected two shared occurrences, got {other:?}"),
        },
        other => panic!("expected a tuple, got {other:?}"),
    }
}

#[test]
fn shared_objects_are_written_once_and_keep_their_identity() {
    // The same reduce result twice: written once, then by memo; reads back shared.
    let obj = Value::reduce(Value::global("collections", "OrderedDict"), Value::Tuple(vec![]));
    let shared = Value::Shared { id: 7, value: Box::new(obj.clone()) };
    let bytes = pmstate_pickle::to_vec(&Value::List(vec![shared.clone(), shared])).unwrap();
    assert_eq!(bytes.windows(b"OrderedDict".len()).filter(|w| w == b"OrderedDict").count(), 1);
    match read(&bytes) {
        Value::List(items) => match items.as_slice() {
            [Value::Shared { id: a, value: va }, Value::Shared { id: b, value: vb }] => {
                assert_eq!(a, b);
                assert_eq!((&**va, &**vb), (&obj, &obj));
            }
            other => panic!("expected two shared occurrences, got {other:?}"),
        },
        other => panic!("expected a list, got {other:?}"),
    }
}

#[test]
fn ordered_dict_setitems_and_appends_are_recorded() {
    let p = b"\x80\x02ccollections\nOrderedDict\n)R(X\x01\x00\x00\x00bK\x01X\x01\x00\x00\x00aK\x02uK\x03a.";
    assert_eq!(
        read(p),
        Value::Reduce {
            callable: Box::new(Value::global("collections", "OrderedDict")),
            args: Box::new(Value::Tuple(vec![])),
            setitems: vec![(s("b"), Value::Int(1)), (s("a"), Value::Int(2))],
            appends: vec![Value::Int(3)],
        }
    );
    assert_eq!(invalid(&err(b"\x80\x02K\x01K\x02K\x03s.")), ("SETITEM", ReadProblem::CannotSetItems("int")));
    assert_eq!(invalid(&err(b"\x80\x02)K\x01a.")), ("APPEND", ReadProblem::CannotAppend("tuple")));
}

#[test]
fn repeated_dict_keys_replace_in_place_like_python() {
    // {1: 'a', 2: 'b'} then d[1] = 'c' and d[(1,)] / d[(1,)] via a different tuple object.
    let p = b"\x80\x02}(K\x01X\x01\x00\x00\x00aK\x02X\x01\x00\x00\x00bK\x01X\x01\x00\x00\x00cK\x01\x85K\x05K\x01\x85K\x06u.";
    assert_eq!(
        read(p),
        Value::Dict(vec![
            (Value::Int(1), s("c")),
            (Value::Int(2), s("b")),
            (Value::Tuple(vec![Value::Int(1)]), Value::Int(6)),
        ])
    );
    // True and 1 are different keys here (structural), floats compare by bits.
    let p =
        b"\x80\x02}(K\x01K\x00\x88K\x01G\x7f\xf8\x00\x00\x00\x00\x00\x00K\x02G\x7f\xf8\x00\x00\x00\x00\x00\x00K\x03u.";
    match read(p) {
        Value::Dict(pairs) => {
            assert_eq!(pairs.len(), 3);
            assert_eq!(pairs[2].1, Value::Int(3));
        }
        other => panic!("{other:?}"),
    }
    // Unhashable keys are refused, as Python refuses them.
    assert_eq!(invalid(&err(b"\x80\x02}]K\x01s.")), ("SETITEM", ReadProblem::Unhashable("list")));
    assert_eq!(invalid(&err(b"\x80\x02}]\x85K\x01s.")), ("SETITEM", ReadProblem::Unhashable("list")));
    assert_eq!(invalid(&err(b"\x80\x04\x8f(]\x90.")), ("ADDITEMS", ReadProblem::Unhashable("list")));
}

#[test]
fn objects_as_keys_compare_by_identity() {
    // Two equal-looking reduce results are two keys; the same one (memo) is one key.
    let p = b"\x80\x02}(cm\nf\n)RK\x01cm\nf\n)RK\x02u.";
    assert!(matches!(read(p), Value::Dict(p) if p.len() == 2));
    let p = b"\x80\x02}(cm\nf\n)Rq\x00K\x01h\x00K\x02u.";
    assert!(matches!(read(p), Value::Dict(p) if p.len() == 1 && p[0].1 == Value::Int(2)));
}

#[test]
fn recursive_structures_are_errors() {
    // l = []; l.append(l)
    assert_eq!(invalid(&err(b"\x80\x02]q\x00h\x00a.")), ("STOP", ReadProblem::Recursive("list")));
    // d = {}; d['self'] = d, through a BUILD state
    let e = err(b"\x80\x02cm\nC\n)Rq\x00}X\x04\x00\x00\x00selfh\x00sb.");
    assert!(matches!(invalid(&e), ("STOP", ReadProblem::Recursive(_))), "{e}");
    // BUILD with itself as state
    let e = err(b"\x80\x02cm\nC\n)Rq\x00h\x00b.");
    assert!(matches!(invalid(&e), ("STOP", ReadProblem::Recursive(_))), "{e}");
}

#[test]
fn builtins_written_as_calls_become_data_only_with_the_right_arguments() {
    assert_eq!(
        read(b"\x80\x02c_codecs\nencode\nX\x02\x00\x00\x00\xc3\xbfX\x07\x00\x00\x00latin-1\x86R."),
        Value::Bytes(vec![0xff])
    );
    // Another encoding, or a char above U+00FF: left as an inert reduce.
    let p = b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00aX\x05\x00\x00\x00utf-8\x86R.";
    assert!(matches!(read(p), Value::Reduce { .. }));
    let p = b"\x80\x02c_codecs\nencode\nX\x02\x00\x00\x00\xc4\x80X\x06\x00\x00\x00latin1\x86R.";
    assert!(matches!(read(p), Value::Reduce { .. }));
    assert_eq!(read(b"\x80\x03cbuiltins\nset\n)R."), Value::Set(vec![]));
    assert_eq!(read(b"\x80\x03cbuiltins\nfrozenset\n(K\x01K\x01t\x85R."), Value::FrozenSet(vec![Value::Int(1)]));
    assert!(matches!(read(b"\x80\x03cbuiltins\nset\nK\x01\x85R."), Value::Reduce { .. }));
    assert!(matches!(read(b"\x80\x03cmy\nset\n)R."), Value::Reduce { .. }));
}

#[test]
fn legacy_torch_stream_is_pickles_back_to_back() {
    // magic number (LONG1), protocol version 1001, sys_info dict, then raw bytes.
    let mut stream = Vec::new();
    stream.extend_from_slice(b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19.");
    stream.extend_from_slice(b"\x80\x02M\xe9\x03.");
    stream.extend_from_slice(b"\x80\x02}X\x0d\x00\x00\x00little_endianq\x00\x88s.");
    stream.extend_from_slice(b"\x00\x01\x02\x03raw storage bytes");
    let mut at = 0;
    let mut got = Vec::new();
    for _ in 0..3 {
        let (v, n) = from_slice_prefix(&stream[at..], &Limits::default()).expect("pickle");
        got.push(v);
        at += n;
    }
    assert_eq!(&stream[at..at + 4], b"\x00\x01\x02\x03");
    assert_eq!(got[0], Value::BigInt(vec![0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19]));
    assert_eq!(got[1], Value::Int(1001));
    assert!(same(&got[2], &Value::Dict(vec![(s("little_endian"), Value::Bool(true))])));
    // The input limit bounds the bytes consumed, not the whole buffer.
    let limits = Limits { max_input_bytes: 20, ..Limits::default() };
    assert!(from_slice_prefix(&stream, &limits).is_ok());
}
