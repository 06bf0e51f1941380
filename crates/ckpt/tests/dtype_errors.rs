//! A dtype that a target cannot carry is an error naming the tensor: its
//! dotted key where the caller knows it, and the storage holding its data.

use std::collections::HashMap;

use pmstate_ckpt::{Bytes, Checkpoint, CkptError, DType, Dict, DictKind, Node, Storage, TensorRef};

/// `{"flags": <bool tensor of 4 in storage "s0">}`.
fn bool_checkpoint() -> Checkpoint {
    let storages: HashMap<String, Storage> = [(
        "s0".to_owned(),
        Storage { typed: true, dtype: DType::Bool, location: "cpu".into(), data: Bytes::owned(vec![1, 0, 1, 1]) },
    )]
    .into();
    let t = Node::Tensor(Box::new(TensorRef::contiguous("s0".into(), DType::Bool, vec![4])));
    let root = Dict::from_entries(DictKind::Plain, vec![(Node::Str("flags".into()), t)]).unwrap();
    Checkpoint::from_parts(Node::Dict(root), storages).unwrap()
}

#[test]
fn candle_tensor_names_key_and_storage() {
    let ckpt = bool_checkpoint();
    let err = ckpt.candle_tensor("flags", &candle_core::Device::Cpu).unwrap_err();
    match &err {
        CkptError::UnsupportedDtype { key, storage, dtype, .. } => {
            assert_eq!(key.as_deref(), Some("flags"));
            assert_eq!(storage.as_deref(), Some("s0"));
            assert!(dtype.starts_with("bool"), "{dtype}");
        }
        other => panic!("expected UnsupportedDtype, got {other}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("flags (storage s0)"), "{msg}");
}

#[test]
fn to_candle_without_a_key_names_the_storage() {
    let ckpt = bool_checkpoint();
    let t = ckpt.tensor("flags").unwrap();
    let err = ckpt.to_candle(t, &candle_core::Device::Cpu).unwrap_err();
    assert!(matches!(&err, CkptError::UnsupportedDtype { key: None, storage: Some(s), .. } if s == "s0"));
    assert!(err.to_string().contains("storage s0"), "{err}");
}

#[test]
fn candle_tensor_of_a_missing_or_non_tensor_key_is_typed() {
    let ckpt = bool_checkpoint();
    let err = ckpt.candle_tensor("flag", &candle_core::Device::Cpu).unwrap_err();
    assert!(matches!(err, CkptError::NotFound { .. }), "{err}");
    let err = ckpt.candle_tensor("", &candle_core::Device::Cpu).unwrap_err();
    assert!(!matches!(err, CkptError::UnsupportedDtype { .. }), "{err}");
}
