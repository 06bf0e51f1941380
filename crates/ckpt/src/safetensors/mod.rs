//! The safetensors bridge.
//!
//! Whole checkpoints: every storage is stored once, under the dotted name
//! of a tensor that covers it exactly (so the file reads naturally with
//! `safetensors.torch.load_file` or candle), or under `__storage__.<key>`
//! when no tensor does (views, shared storages). `__metadata__` carries the
//! whole tree as exact JSON (`pmstate.tree`) and the storage table
//! (`pmstate.storages`), so safetensors -> `.pt` restores the original.
//!
//! `select`: one sub-dict (the model state dict, typically) as plain
//! contiguous tensors under their own keys, loadable anywhere.

mod header;
mod read;
mod tensors;
mod write;

pub(crate) use read::{looks_like_safetensors, read};
pub use tensors::save_tensors;
pub use write::{save_safetensors, ExportReport, SafetensorsOptions};

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::*;
    use crate::io::bulk_copy::CHUNK;
    use crate::{Bytes, Checkpoint, DType, Dict, DictKind, Node, Storage, TensorClass, TensorRef, WriteOptions};

    fn tensor(storage: &str, offset: usize, shape: &[usize]) -> Node {
        Node::Tensor(Box::new(TensorRef {
            storage: storage.into(),
            dtype: DType::F32,
            offset,
            shape: shape.to_vec(),
            stride: TensorRef::contiguous_stride(shape),
            requires_grad: false,
            class: TensorClass::Tensor,
            object: None,
        }))
    }

    fn storage(words: usize, seed: u32) -> Storage {
        let data: Vec<u8> =
            (0..words as u32).flat_map(|i| (i.wrapping_mul(2_654_435_761) ^ seed).to_le_bytes()).collect();
        Storage { typed: true, dtype: DType::F32, location: "cpu".into(), data: Bytes::owned(data) }
    }

    fn dict(kind: DictKind, entries: Vec<(&str, Node)>) -> Node {
        let entries = entries.into_iter().map(|(k, v)| (Node::Str(k.into()), v)).collect();
        Node::Dict(Dict::from_entries(kind, entries).unwrap())
    }

    /// Storages larger than a copy chunk are copied from the input file a
    /// chunk at a time: whole exports and `select` (a view at an offset)
    /// must hold the same bytes as the source, and progress must reach the end.
    #[test]
    fn large_storages_are_copied_exactly() {
        let words = CHUNK; // 16 MiB of f32
        let storages: HashMap<String, Storage> = [
            ("a".to_owned(), storage(words, 1)),
            ("b".to_owned(), storage(words / 2, 2)),
            ("c".to_owned(), storage(7, 3)),
        ]
        .into();
        let model = dict(
            DictKind::Ordered,
            vec![
                ("w", tensor("a", 0, &[words / 4, 4])),
                ("view", tensor("b", 1001, &[words / 2 - 3000])),
                ("small", tensor("c", 0, &[7])),
            ],
        );
        let root = dict(DictKind::Plain, vec![("model", model), ("b_again", tensor("b", 0, &[2]))]);
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src.pt");
        Checkpoint::from_parts(root, storages).unwrap().save(&src).unwrap();
        let orig = Checkpoint::open(&src).unwrap();
        assert!(orig.storages().values().all(|s| s.data.is_file_backed()));
        let same = |a: &Checkpoint, b: &Checkpoint, key: &str, key_b: &str| {
            let (ta, tb) = (a.tensor(key).unwrap(), b.tensor(key_b).unwrap());
            assert_eq!(ta.shape, tb.shape, "{key}");
            assert!(a.tensor_bytes(ta).unwrap() == b.tensor_bytes(tb).unwrap(), "{key}: bytes differ");
        };
        for select in [None, Some("model".to_owned())] {
            let out = dir.path().join("out.safetensors");
            let last = Mutex::new(0u64);
            let progress = |n: u64| {
                let mut l = last.lock().unwrap();
                assert!(n >= *l);
                *l = n;
            };
            let write = WriteOptions { progress: Some(&progress), ..Default::default() };
            let opts = SafetensorsOptions { select: select.clone(), write };
            save_safetensors(&orig, &out, &opts).unwrap();
            assert_eq!(*last.lock().unwrap(), std::fs::metadata(&out).unwrap().len());
            let back = Checkpoint::open(&out).unwrap();
            if select.is_some() {
                for k in ["w", "view", "small"] {
                    same(&orig, &back, &format!("model.{k}"), k);
                }
            } else {
                for k in ["model.w", "model.view", "model.small", "b_again"] {
                    same(&orig, &back, k, k);
                }
                assert_eq!(back.root(), orig.root());
            }
        }
    }
}
