//! Broken and hostile checkpoints give errors, never panics: every fixture
//! truncated and bit-flipped, plus hand-made archives that lie about their
//! contents.

mod common;

use std::io::Write;

use common::*;
use pmstate_ckpt::{Checkpoint, CkptError};
use proptest::prelude::*;

fn open_bytes(bytes: &[u8], ext: &str) -> Result<Checkpoint, CkptError> {
    let mut f = tempfile::Builder::new().suffix(ext).tempfile().unwrap();
    f.write_all(bytes).unwrap();
    f.flush().unwrap();
    let c = Checkpoint::open(f.path())?;
    // Touch every tensor, as inspect/convert would.
    for (_, t) in c.tensors() {
        c.tensor_bytes(t)?;
    }
    Ok(c)
}

fn fixture_files() -> Vec<(String, Vec<u8>)> {
    ["ppo_full.ckpt", "dtypes_views.pt", "legacy.pt", "deflated.ckpt", "protocol4.pt", "hostile_os_system.pt"]
        .iter()
        .map(|f| (f.to_string(), std::fs::read(fixture(f)).unwrap()))
        .collect()
}

#[test]
fn every_truncation_at_a_record_boundary_is_an_error() {
    for (name, bytes) in fixture_files() {
        // Record boundaries: every local header signature, plus the end records.
        let cuts: Vec<usize> = (0..bytes.len().saturating_sub(4))
            .filter(|&i| bytes[i..i + 2] == *b"PK")
            .chain([1, 8, 64, bytes.len() - 1])
            .collect();
        for cut in cuts {
            let r = open_bytes(&bytes[..cut], ".pt");
            assert!(r.is_err(), "{name} cut at {cut} opened");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn truncated_or_bit_flipped_fixtures_never_panic(which in 0usize..6, at in any::<prop::sample::Index>(), bit in 0u8..8, cut in any::<bool>()) {
        let files = fixture_files();
        let (_, bytes) = &files[which];
        let i = at.index(bytes.len());
        let mut b = bytes.clone();
        if cut {
            b.truncate(i);
        } else {
            b[i] ^= 1 << bit;
        }
        // Either outcome is fine (a flipped bit in tensor data still reads); a panic is not.
        let _ = open_bytes(&b, ".pt");
    }
}

/// A torch-like zip with the given records (stored), for lying archives.
fn zip_of(records: &[(&str, &[u8])]) -> Vec<u8> {
    let mut buf = std::io::Cursor::new(Vec::new());
    {
        let mut z = zip::ZipWriter::new(&mut buf);
        let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
        for (name, data) in records {
            z.start_file(*name, opts).unwrap();
            z.write_all(data).unwrap();
        }
        z.finish().unwrap();
    }
    buf.into_inner()
}

/// data.pkl of `{'t': tensor}` with the given storage numel, offset, size and stride.
fn tensor_pickle(numel: i64, offset: i64, size: &[i64], stride: &[i64]) -> Vec<u8> {
    use pmstate_pickle::Value as V;
    let ints = |xs: &[i64]| V::Tuple(xs.iter().map(|&x| V::Int(x)).collect());
    let pid = V::PersistentId(Box::new(V::Tuple(vec![
        V::Str("storage".into()),
        V::global("torch", "FloatStorage"),
        V::Str("0".into()),
        V::Str("cpu".into()),
        V::Int(numel),
    ])));
    let od = V::reduce(V::global("collections", "OrderedDict"), V::Tuple(vec![]));
    let t = V::reduce(
        V::global("torch._utils", "_rebuild_tensor_v2"),
        V::Tuple(vec![pid, V::Int(offset), ints(size), ints(stride), V::Bool(false), od]),
    );
    pmstate_pickle::to_vec(&V::Dict(vec![(V::Str("t".into()), t)])).unwrap()
}

#[test]
fn archives_that_lie_get_their_specific_error() {
    use pmstate_ckpt::{EntryProblem, ValueProblem};
    let data = [0u8; 16]; // 4 floats
    let ok = tensor_pickle(4, 0, &[2, 2], &[2, 1]);
    let base = |pkl: &[u8], data: &[u8]| zip_of(&[("a/data.pkl", pkl), ("a/data/0", data), ("a/version", b"3\n")]);
    let open = |bytes: Vec<u8>| open_bytes(&bytes, ".pt").unwrap_err();
    assert!(open_bytes(&base(&ok, &data), ".pt").is_ok());

    let e = open(base(&ok, &data[..12]));
    assert!(matches!(&e, CkptError::RecordSize { record, holds: 12, declares: 16, .. } if record == "data/0"), "{e}");
    let e = open(base(&tensor_pickle(4, 1, &[2, 2], &[2, 1]), &data));
    assert!(
        matches!(&e, CkptError::Value { key, problem: ValueProblem::ViewPastStorage(v), .. } if key == "t" && v.extent == 5),
        "{e}"
    );
    let e = open(base(&tensor_pickle(4, 0, &[-2, 2], &[2, 1]), &data));
    assert!(matches!(e, CkptError::Value { problem: ValueProblem::Negative { what: "size", value: -2 }, .. }), "{e}");
    let e = open(base(&tensor_pickle(4, 0, &[2, 2], &[-2, 1]), &data));
    assert!(matches!(e, CkptError::Value { problem: ValueProblem::Negative { what: "stride", value: -2 }, .. }), "{e}");
    let e = open(base(&tensor_pickle(1 << 62, 0, &[1], &[1]), &data));
    assert!(
        matches!(e, CkptError::Value { problem: ValueProblem::Overflow { .. }, .. } | CkptError::RecordSize { .. }),
        "{e}"
    );
    let e = open(base(&tensor_pickle(4, 0, &[1 << 40, 1 << 40], &[1 << 40, 1]), &data));
    assert!(
        matches!(e, CkptError::Value { problem: ValueProblem::Overflow { .. } | ValueProblem::ViewPastStorage(_), .. }),
        "{e}"
    );

    let e = open(zip_of(&[("a/data.pkl", &ok), ("b/data/0", &data), ("a/version", b"3\n")]));
    assert!(
        matches!(&e, CkptError::Entry { problem: EntryProblem::OutsideFolder { folder }, .. } if folder == "a"),
        "{e}"
    );
    let e = open(zip_of(&[("data.pkl", &ok)]));
    assert!(matches!(e, CkptError::Entry { problem: EntryProblem::NotInFolder, .. }), "{e}");
    let e = open(zip_of(&[("a/data.pkl", &ok), ("a/version", b"3\n")]));
    assert!(matches!(&e, CkptError::MissingRecord { record, .. } if record == "data/0"), "{e}");
    let e = open(zip_of(&[("a/data.pkl", &ok), ("a/data/0", &data)]));
    assert!(matches!(&e, CkptError::MissingRecord { record, .. } if record == "version"), "{e}");
    let travel =
        zip_of(&[("a/data.pkl", &ok), ("a/../../etc/passwd", b"x"), ("a/data/0", &data), ("a/version", b"3\n")]);
    // A traversal name inside the folder is just a record name we never use as a path.
    assert!(open_bytes(&travel, ".pt").is_ok());
    let big = zip_of(&[("a/data.pkl", &ok), ("a/byteorder", b"big"), ("a/data/0", &data), ("a/version", b"3\n")]);
    assert!(matches!(&open(big), CkptError::ByteOrder { found, .. } if found == "big"));
}

/// A torch-like zip whose `data/0` is deflated (the rest stored).
fn deflated_archive(pkl: &[u8], data: &[u8]) -> Vec<u8> {
    let mut buf = std::io::Cursor::new(Vec::new());
    {
        let mut z = zip::ZipWriter::new(&mut buf);
        let stored = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
        let deflated = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        for (name, bytes, opts) in
            [("a/data.pkl", pkl, stored), ("a/data/0", data, deflated), ("a/version", b"3\n", stored)]
        {
            z.start_file(name, opts).unwrap();
            z.write_all(bytes).unwrap();
        }
        z.finish().unwrap();
    }
    buf.into_inner()
}

#[test]
fn a_deflated_record_that_inflates_past_its_declared_size_is_refused() {
    // A zip bomb in miniature: data/0 declares 16 bytes but holds a deflate stream of 1 MiB.
    let bomb = deflated_archive(&tensor_pickle(4, 0, &[4], &[1]), &vec![0u8; 1 << 20]);
    let e = open_bytes(&bomb, ".pt").unwrap_err();
    assert!(matches!(e, CkptError::RecordSize { holds: 1048576, declares: 16, .. }), "{e}");
}

#[test]
fn inflated_data_is_bounded_by_a_multiple_of_the_file_size() {
    // 8 MiB of zeros deflates ~1000:1 into a tiny file: within the default budget
    // (32x the file plus a 64 MiB floor) it reads; with an explicit 1 MiB budget it is refused.
    let n = 2 << 20; // floats
    let bytes = deflated_archive(&tensor_pickle(n, 0, &[n], &[1]), &vec![0u8; (n * 4) as usize]);
    assert!(bytes.len() < 64 << 10);
    let ok = Checkpoint::from_bytes(bytes.clone(), "zeros.pt", &Default::default()).unwrap();
    assert_eq!(ok.tensors()[0].1.numel(), n as usize);
    let tight = pmstate_ckpt::ReadOptions { max_inflated_bytes: Some(1 << 20), ..Default::default() };
    let e = Checkpoint::from_bytes(bytes, "zeros.pt", &tight).unwrap_err();
    assert!(matches!(&e, CkptError::InflateLimit { record, limit: 1048576, .. } if record == "data/0"), "{e}");
    // the message says which limit and that the CLI cannot raise it (no Rust API alone)
    let msg = e.to_string();
    assert!(msg.contains("limit on inflated data, 1048576 bytes") && msg.contains("the CLI has no flag"), "{msg}");
}

/// Opening reports the inflating of compressed records, chunk by chunk, up
/// to what they declare; a file without compressed records reports nothing.
#[test]
fn opening_reports_the_inflating_of_compressed_records() {
    let n = 3 << 20; // floats: 12 MiB, several 4 MiB chunks
    let data: Vec<u8> = (0..n * 4).map(|i| (i % 251) as u8).collect();
    let bytes = deflated_archive(&tensor_pickle(n, 0, &[n], &[1]), &data);
    let mut f = tempfile::Builder::new().suffix(".pt").tempfile().unwrap();
    f.write_all(&bytes).unwrap();
    f.flush().unwrap();
    let seen = std::cell::RefCell::new(Vec::new());
    let c = Checkpoint::open_with_progress(f.path(), &Default::default(), &|done, total| {
        seen.borrow_mut().push((done, total))
    })
    .unwrap();
    assert_eq!(c.tensors()[0].1.numel(), n as usize);
    let seen = seen.into_inner();
    assert!(seen.len() >= 3, "{seen:?}");
    assert!(seen.iter().all(|&(_, total)| total == (n * 4) as u64), "{seen:?}");
    assert!(seen.windows(2).all(|w| w[0].0 < w[1].0), "{seen:?}");
    assert_eq!(seen.last().map(|s| s.0), Some((n * 4) as u64));

    // stored records are mapped, not read: nothing to report
    let stored = format!("{}/../../testdata/policy/smpl_tracker/last.ckpt", env!("CARGO_MANIFEST_DIR"));
    let calls = std::cell::Cell::new(0);
    Checkpoint::open_with_progress(&stored, &Default::default(), &|_, _| calls.set(calls.get() + 1)).unwrap();
    assert_eq!(calls.get(), 0);
}
