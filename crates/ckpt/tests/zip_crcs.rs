//! Every `.pt` we write is a valid zip archive: each record's CRC-32 (which
//! our own reader never looks at, and torch checks only on some paths)
//! verifies under the zip crate's reader and equals a CRC computed here
//! from the record's bytes, every record is stored, and tensor data is
//! 64-byte aligned. Written from memory, from a `.pt` and from a
//! `.safetensors` file (the copy that reads the input in chunks), with
//! storages that span several copy chunks.

mod common;

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use common::*;
use pmstate_ckpt::{Bytes, Checkpoint, DType, Dict, DictKind, Node, Storage, TensorClass, TensorRef};

/// Checks every record of the archive at `path`; returns how many records
/// and how many tensor-data bytes it holds.
fn verify_archive(path: &Path) -> (usize, u64) {
    let file = std::fs::File::open(path).unwrap();
    let mut zip = zip::ZipArchive::new(file).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut data_bytes = 0;
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).unwrap();
        let name = entry.name().unwrap().into_owned();
        assert_eq!(entry.compression(), zip::CompressionMethod::Stored, "{name}");
        let mut bytes = Vec::new();
        // the zip reader compares the CRC of what it read with the recorded one at the end
        entry.read_to_end(&mut bytes).unwrap_or_else(|e| panic!("{}: {name}: {e}", path.display()));
        assert_eq!(bytes.len() as u64, entry.size(), "{name}");
        assert_eq!(crc32fast::hash(&bytes), entry.crc32(), "{}: {name}: recorded CRC-32", path.display());
        if name.contains("/data/") {
            assert_eq!(entry.data_start().unwrap() % 64, 0, "{name}: tensor data 64-byte aligned");
            data_bytes += bytes.len() as u64;
        }
    }
    (zip.len(), data_bytes)
}

#[test]
fn every_record_of_a_rewritten_fixture_has_its_crc() {
    let m = manifest();
    let dir = tempfile::tempdir().unwrap();
    for file in walkable(&m) {
        let original = Checkpoint::open(fixture(&file)).unwrap();
        let stem = file.split('.').next().unwrap();
        let pt = dir.path().join(format!("{stem}.pt"));
        original.save(&pt).unwrap_or_else(|e| panic!("{file} -> .pt: {e}"));
        let st = dir.path().join(format!("{stem}.safetensors"));
        original.save(&st).unwrap();
        let back = dir.path().join(format!("{stem}.back.pt"));
        Checkpoint::open(&st).unwrap().save(&back).unwrap();
        let want: u64 = original.storages().values().map(|s| s.data.len() as u64).sum();
        for written in [&pt, &back] {
            let (records, data) = verify_archive(written);
            assert!(records >= 6, "{}: {records} records", written.display());
            assert_eq!(data, want, "{}: every storage's bytes", written.display());
        }
    }
}

/// A storage larger than two copy chunks (4 MiB each) and ending off a
/// chunk boundary, and small ones around it: the CRC of a record written
/// in several chunks is that of all its bytes.
#[test]
fn records_copied_in_several_chunks_have_the_crc_of_all_their_bytes() {
    let big_len = (9 << 20) + 12_345;
    let big: Vec<u8> = (0..big_len as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let mut storages = HashMap::new();
    let mut entries = Vec::new();
    for (name, data) in [("small", vec![7u8; 100]), ("big", big.clone()), ("tail", vec![1u8; 3])] {
        let shape = vec![data.len()];
        let key = storages.len().to_string();
        storages.insert(
            key.clone(),
            Storage { typed: true, dtype: DType::U8, location: "cpu".into(), data: Bytes::owned(data) },
        );
        let t = TensorRef {
            storage: key,
            dtype: DType::U8,
            offset: 0,
            stride: TensorRef::contiguous_stride(&shape),
            shape,
            requires_grad: false,
            class: TensorClass::Tensor,
            object: None,
        };
        entries.push((Node::Str(name.into()), Node::Tensor(Box::new(t))));
    }
    let root = Node::Dict(Dict::from_entries(DictKind::Plain, entries).unwrap());
    let ckpt = Checkpoint::from_parts(root, storages).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let from_memory = dir.path().join("mem.pt");
    ckpt.save(&from_memory).unwrap();
    let st = dir.path().join("big.safetensors");
    ckpt.save(&st).unwrap();
    let from_file = dir.path().join("file.pt");
    let reopened = Checkpoint::open(&st).unwrap();
    assert!(reopened.storages().values().all(|s| s.data.is_file_backed()), "the chunked file copy is exercised");
    reopened.save(&from_file).unwrap();
    for written in [&from_memory, &from_file] {
        let (_, data) = verify_archive(written);
        assert_eq!(data, (big_len + 103) as u64, "{}", written.display());
        let again = Checkpoint::open(written).unwrap();
        let t = again.tensor("big").unwrap();
        assert_eq!(again.tensor_bytes(t).unwrap(), big, "{}: the big tensor's bytes", written.display());
    }
}
