//! Real CPython pickles (protocols 0 to 5, written by tests/data/make_vectors.py) decode to the expected values.

mod common;

use common::{from_tagged, same, vectors_dir};
use pmstate_pickle::{from_slice, from_slice_prefix, Limits, PickleError, ReadProblem, Value};

/// (case, protocol, bytes, expected) for every committed vector.
fn vectors() -> Vec<(String, u32, Vec<u8>, Value)> {
    let dir = vectors_dir();
    let expected: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).expect("expected.json"))
            .expect("valid JSON");
    let mut out = Vec::new();
    for (case, by_proto) in &expected {
        for proto in 0..=5u32 {
            let want = by_proto.get("all").or_else(|| by_proto.get(proto.to_string().as_str())).expect("expectation");
            let path = dir.join(format!("{case}.p{proto}.pkl"));
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.push((case.clone(), proto, bytes, from_tagged(want)));
        }
    }
    assert!(out.len() >= 300, "only {} vectors", out.len());
    out
}

#[test]
fn every_vector_decodes_to_its_expected_value() {
    let mut failures = Vec::new();
    for (case, proto, bytes, want) in vectors() {
        match from_slice(&bytes, &Limits::default()) {
            Ok(got) if same(&got, &want) => {}
            Ok(got) => failures.push(format!("{case} p{proto}: got {got:?}\n    want {want:?}")),
            Err(e) => failures.push(format!("{case} p{proto}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn prefix_reads_stop_at_stop_and_whole_reads_refuse_trailing_bytes() {
    for (case, proto, bytes, want) in vectors() {
        let mut padded = bytes.clone();
        padded.extend_from_slice(b"\x80\x02N.trailing");
        let (got, consumed) = from_slice_prefix(&padded, &Limits::default()).expect(&case);
        assert_eq!(consumed, bytes.len(), "{case} p{proto}");
        assert!(same(&got, &want), "{case} p{proto}");
        let err = from_slice(&padded, &Limits::default()).expect_err("trailing bytes");
        let trailing = ReadProblem::TrailingBytes(padded.len() - bytes.len());
        assert!(
            matches!(&err, PickleError::Invalid { offset, problem, .. } if *offset == bytes.len() && *problem == trailing),
            "{case} p{proto}: {err}"
        );
    }
}

#[test]
fn node_count_limit_is_exact() {
    for (case, proto, bytes, want) in vectors() {
        let n = want.node_count() as u64;
        // Intermediate objects count too, and can be larger than their result:
        // two nodes (`set((list,))`, `_codecs.encode((str, str))`), and the latin-1
        // `str` that `_codecs.encode` turns into bytes weighs up to twice its bytes.
        let limits = Limits { max_nodes: 2 * n + 2, ..Limits::default() };
        from_slice(&bytes, &limits).unwrap_or_else(|e| panic!("{case} p{proto} with max_nodes {n}: {e}"));
        let limits = Limits { max_nodes: n - 1, ..Limits::default() };
        let err = from_slice(&bytes, &limits).expect_err("over the limit");
        assert!(matches!(err, pmstate_pickle::PickleError::Limit { limit: "max_nodes", .. }), "{case} p{proto}: {err}");
    }
}

#[test]
fn every_truncation_of_every_vector_is_an_error() {
    for (case, proto, bytes, _) in vectors() {
        if bytes.len() > 4096 {
            continue; // the big ones add time, not coverage
        }
        for cut in 0..bytes.len() {
            let result = from_slice(&bytes[..cut], &Limits::default());
            assert!(result.is_err(), "{case} p{proto} cut at {cut} decoded");
        }
    }
}

#[test]
fn every_single_byte_corruption_is_handled() {
    // Not every corruption is an error (a changed digit is still a pickle), but none may panic.
    for (case, proto, bytes, _) in vectors() {
        if bytes.len() > 512 {
            continue;
        }
        for i in 0..bytes.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[i] ^= flip;
                let _ = from_slice(&b, &Limits::default());
                let _ = (case.as_str(), proto);
            }
        }
    }
}
