//! The README runs `cargo run --release -p pmstate-cli -- replay ...`, then
//! `cargo run --release --example checkpoint_inference`: the second must
//! reuse every dependency the first built. Cargo reuses a build of a crate
//! only for the same features, and resolves them per build (the example's
//! graph is the root package's with its dev-dependencies), so this checks
//! that every dependency both builds share gets the same features in both,
//! as `cargo tree` resolves them.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// `name version` -> the feature sets `cargo tree` resolves for it in the
/// build of `package` (with its dev-dependencies when `dev`).
fn features(package: &str, dev: bool) -> BTreeMap<String, BTreeSet<String>> {
    let edges = if dev { "normal,build,dev" } else { "normal,build" };
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "--locked", "-p", package, "-e", edges, "--prefix", "none"])
        .args(["-f", "{p} [{f}]"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(out.status.success(), "cargo tree: {}", String::from_utf8_lossy(&out.stderr));
    let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in String::from_utf8(out.stdout).expect("UTF-8").lines() {
        let Some(open) = line.find(" [") else { continue };
        let mut words = line[..open].split_whitespace();
        let (Some(name), Some(version)) = (words.next(), words.next()) else { continue };
        let feats = line[open + 2..].split(']').next().unwrap_or_default().to_owned();
        map.entry(format!("{name} {version}")).or_default().insert(feats);
    }
    map
}

#[test]
fn the_example_and_the_cli_share_their_dependency_builds() {
    let cli = features("pmstate-cli", false);
    let example = features("pmstate", true);
    let shared: Vec<&String> = cli.keys().filter(|k| example.contains_key(*k)).collect();
    // candle and its dependencies at least
    assert!(shared.iter().any(|k| k.starts_with("candle-core ")), "{shared:?}");
    assert!(shared.len() > 50, "{} shared", shared.len());
    let differ: Vec<String> = shared
        .into_iter()
        .filter(|k| cli[*k] != example[*k])
        .map(|k| format!("{k}: pmstate-cli {:?}, the example {:?}", cli[k], example[k]))
        .collect();
    assert!(differ.is_empty(), "features differ, so the example rebuilds them:\n{}", differ.join("\n"));
}
