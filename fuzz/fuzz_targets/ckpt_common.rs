// Shared by the checkpoint targets (included with `include!`).

/// Opens `data` as a checkpoint and does what `inspect` and `convert` do
/// with it: every tensor's bytes, the unsafe-global scan, the JSON tree and
/// its decoding, normalizer discovery. Errors are fine; panics are not.
fn exercise(data: &[u8]) {
    let opts = pmstate_ckpt::ReadOptions {
        pickle: pmstate_pickle::Limits { max_nodes: 1 << 20, ..Default::default() },
        max_inflated_bytes: Some(64 << 20),
    };
    let Ok(ckpt) = pmstate_ckpt::Checkpoint::from_bytes(data.to_vec(), "fuzz", &opts) else { return };
    for (_, t) in ckpt.tensors() {
        let _ = ckpt.tensor_bytes(t);
    }
    let _ = ckpt.unsafe_globals();
    let _ = ckpt.validate();
    let _ = ckpt.normalizers();
    let json = pmstate_ckpt::node_to_json(&ckpt.root);
    let back = pmstate_ckpt::node_from_json(&json).expect("our own JSON decodes");
    assert_eq!(pmstate_ckpt::node_to_json(&back), json, "tree JSON round trip");
}
