// Shared by the checkpoint targets (included with `include!`).

/// Opens `data` as a checkpoint and does what `inspect` and `convert` do
/// with it: every tensor's bytes, the unsafe-global scan, the JSON tree and
/// its decoding, normalizer discovery. Errors are fine; panics are not.
fn exercise(data: &[u8]) {
    // Budgets of 16 MiB: a deflated input of 64 KiB (the smoke run's
    // -max_len) can still reach them, and the oracle below holds the tree
    // about eight times over (hex JSON, its parsed value, the decoded tree
    // and its JSON again), which must stay under -rss_limit_mb=1024 with
    // ASan's shadow memory and quarantine on top. At 64 MiB the seed
    // testdata/hostile/big_bytes_value.pt (a 60 MiB bytes value) alone
    // reached 1.16 GB RSS under ASan, in the oracle, not in the library.
    let opts = pmstate_ckpt::ReadOptions {
        pickle: pmstate_pickle::Limits { max_nodes: 1 << 20, ..Default::default() },
        max_inflated_bytes: Some(16 << 20),
        max_view_bytes: Some(16 << 20),
        ..Default::default()
    };
    let Ok(ckpt) = pmstate_ckpt::Checkpoint::from_bytes(data.to_vec(), "fuzz", &opts) else { return };
    for (_, t) in ckpt.tensors() {
        let _ = ckpt.tensor_bytes(t);
    }
    let _ = ckpt.unsafe_globals();
    if let Ok(groups) = ckpt.normalizers() {
        for g in groups.iter().filter(|g| g.saved.is_some()) {
            let _ = ckpt.normalizer_summary(&g.name);
        }
    }
    let _ = ckpt.config_json("");
    // The tree's exact JSON decodes back to the same tree.
    let json = serde_json::to_string(&pmstate_ckpt::NodeJson(ckpt.root())).expect("a tree serializes");
    // Without serde_json's default depth limit of 128, as the library reads
    // it: the tree's own depth is bounded by the pickle limits.
    let mut de = serde_json::Deserializer::from_str(&json);
    de.disable_recursion_limit();
    let value: serde_json::Value =
        de.into_iter().next().expect("one JSON value").expect("our own JSON parses");
    let back = pmstate_ckpt::node_from_json(&value).expect("our own JSON decodes");
    // Compared as JSON again, not with `==`: the JSON keeps every float's
    // bits, where `==` says a NaN differs from itself.
    let again = serde_json::to_string(&pmstate_ckpt::NodeJson(&back)).expect("a tree serializes");
    assert!(again == json, "tree JSON round trip");
}
