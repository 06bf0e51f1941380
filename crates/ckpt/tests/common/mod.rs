//! Shared test helpers: the torch-written fixtures, their manifest (what
//! torch itself saw in each file), and the optional torch oracle.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use std::collections::HashMap;

use pmstate_ckpt::{Bytes, Checkpoint, DType, Dict, DictKind, Node, Storage, TensorRef};
use serde_json::Value as J;
use sha2::{Digest, Sha256};

pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/checkpoints")
}

pub fn fixture(name: &str) -> PathBuf {
    fixtures_dir().join(name)
}

pub fn manifest() -> J {
    let text = std::fs::read_to_string(fixture("manifest.json")).expect("manifest.json");
    serde_json::from_str(&text).expect("manifest parses")
}

/// The manifest entry of one fixture.
pub fn entry(manifest: &J, file: &str) -> J {
    manifest["fixtures"].as_array().unwrap().iter().find(|f| f["file"] == file).cloned().expect("fixture in manifest")
}

/// Fixtures torch could walk (all but the hostile one).
pub fn walkable(manifest: &J) -> Vec<String> {
    manifest["fixtures"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| !f["walked_with"].is_null())
        .map(|f| f["file"].as_str().unwrap().to_owned())
        .collect()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn child<'a>(node: &'a Node, key: &J) -> Option<&'a Node> {
    match node {
        Node::Dict(d) => d
            .entries()
            .iter()
            .find(|(k, _)| match (k, key) {
                (Node::Str(s), J::String(j)) => s == j,
                (Node::Int(i), J::Number(n)) => n.as_i64() == Some(*i),
                _ => false,
            })
            .map(|(_, v)| v),
        Node::List(xs) | Node::Tuple(xs) => xs.get(usize::try_from(key.as_u64()?).ok()?),
        _ => None,
    }
}

pub fn at<'a>(root: &'a Node, path: &[J]) -> Option<&'a Node> {
    path.iter().try_fold(root, |n, k| child(n, k))
}

fn type_name(n: &Node) -> &'static str {
    match n {
        Node::None => "NoneType",
        Node::Device { .. } => "torch.device",
        Node::TorchDtype(_) => "torch.dtype",
        other => other.kind(),
    }
}

/// Little-endian two's complement to a decimal string (up to 128 bits).
fn big_decimal(le: &[u8]) -> String {
    assert!(le.len() <= 16, "test helper handles ints up to 128 bits");
    let fill = if le.last().is_some_and(|b| b & 0x80 != 0) { 0xff } else { 0 };
    let mut b = [fill; 16];
    b[..le.len()].copy_from_slice(le);
    i128::from_le_bytes(b).to_string()
}

fn float_bits(f: f64) -> String {
    format!("{:016x}", f.to_bits())
}

/// Checks a scalar node against a manifest `value`/`bits`; returns a reason on mismatch.
fn scalar_matches(n: &Node, leaf: &J) -> Result<(), String> {
    let v = &leaf["value"];
    let ok = match n {
        Node::None => v.is_null(),
        Node::Bool(b) => v.as_bool() == Some(*b),
        Node::Int(i) => v.as_str() == Some(&i.to_string()),
        Node::BigInt(le) => v.as_str() == Some(&big_decimal(le)),
        Node::Float(f) => leaf["bits"].as_str() == Some(&float_bits(*f)),
        Node::Complex(re, im) => {
            leaf["bits"]["real"].as_str() == Some(&float_bits(*re))
                && leaf["bits"]["imag"].as_str() == Some(&float_bits(*im))
        }
        Node::Str(s) => v.as_str() == Some(s),
        Node::Bytes(b) => v.as_str() == Some(&b.iter().map(|x| format!("{x:02x}")).collect::<String>()),
        Node::Device { kind, index } => {
            let shown = match index {
                Some(i) => format!("{kind}:{i}"),
                None => kind.clone(),
            };
            v.as_str() == Some(&shown)
        }
        Node::TorchDtype(name) => v.as_str() == Some(&format!("torch.{name}")),
        Node::Set(items) => {
            let want = v.as_array().cloned().unwrap_or_default();
            want.len() == items.len()
                && items.iter().zip(&want).all(|(x, w)| type_name(x) == w["type"] && scalar_matches(x, w).is_ok())
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("value {n} != manifest {leaf}"))
    }
}

/// Compares everything the manifest records about `file` with what we read
/// from `ckpt` (which may be a rewrite of the fixture). Returns every
/// difference.
pub fn check_against_manifest(ckpt: &Checkpoint, fixture: &J) -> Vec<String> {
    let mut errs = Vec::new();
    let file = fixture["file"].as_str().unwrap();
    for c in fixture["containers"].as_array().unwrap() {
        let path = c["path"].as_array().unwrap();
        let Some(n) = at(ckpt.root(), path) else {
            errs.push(format!("{file}: container {path:?} missing"));
            continue;
        };
        if type_name(n) != c["type"] {
            errs.push(format!("{file}: {path:?}: type {} != {}", type_name(n), c["type"]));
        }
        if let (Some(keys), Node::Dict(d)) = (c["keys"].as_array(), n) {
            let ours: Vec<J> = d
                .entries()
                .iter()
                .map(|(k, _)| match k {
                    Node::Str(s) => J::String(s.clone()),
                    Node::Int(i) => J::from(*i),
                    other => J::String(other.to_string()),
                })
                .collect();
            if &ours != keys {
                errs.push(format!("{file}: {path:?}: keys {ours:?} != {keys:?}"));
            }
        }
        if let (Some(len), Node::List(xs) | Node::Tuple(xs)) = (c["len"].as_u64(), n) {
            if xs.len() as u64 != len {
                errs.push(format!("{file}: {path:?}: len {} != {len}", xs.len()));
            }
        }
        if let Some(meta) = c["metadata"].as_array() {
            let ours = n.as_dict().and_then(|d| d.metadata());
            let ours: Option<Vec<J>> = ours.and_then(Node::as_dict).map(|m| {
                m.entries()
                    .iter()
                    .map(|(k, v)| {
                        let version = v.get("version").and_then(|x| match x {
                            Node::Int(i) => Some(*i),
                            _ => None,
                        });
                        serde_json::json!([k.as_str().unwrap_or("?"), {"version": version}])
                    })
                    .collect()
            });
            if ours.as_ref() != Some(meta) {
                errs.push(format!("{file}: {path:?}: _metadata {ours:?} != {meta:?}"));
            }
        }
    }
    let mut groups: std::collections::HashMap<u64, String> = std::collections::HashMap::new();
    for leaf in fixture["leaves"].as_array().unwrap() {
        let path = leaf["path"].as_array().unwrap();
        let Some(n) = at(ckpt.root(), path) else {
            errs.push(format!("{file}: leaf {path:?} missing"));
            continue;
        };
        if type_name(n) != leaf["type"] {
            errs.push(format!("{file}: {path:?}: type {} != {}", type_name(n), leaf["type"]));
            continue;
        }
        let Node::Tensor(t) = n else {
            if let Err(e) = scalar_matches(n, leaf) {
                errs.push(format!("{file}: {path:?}: {e}"));
            }
            continue;
        };
        let storage = ckpt.storages().get(&t.storage).expect("storage present");
        let checks = [
            ("dtype", J::String(format!("torch.{}", t.dtype)), leaf["dtype"].clone()),
            ("shape", serde_json::json!(t.shape), leaf["shape"].clone()),
            ("stride", serde_json::json!(t.stride), leaf["stride"].clone()),
            ("storage_offset", serde_json::json!(t.offset), leaf["storage_offset"].clone()),
            ("requires_grad", serde_json::json!(t.effective_requires_grad()), leaf["requires_grad"].clone()),
            ("storage_nbytes", serde_json::json!(storage.data.len()), leaf["storage_nbytes"].clone()),
        ];
        for (what, ours, theirs) in checks {
            if ours != theirs {
                errs.push(format!("{file}: {path:?}: {what} {ours} != {theirs}"));
            }
        }
        let bytes = ckpt.tensor_bytes(t).expect("tensor bytes");
        if J::String(sha256_hex(&bytes)) != leaf["sha256"] {
            errs.push(format!("{file}: {path:?}: element bytes differ (sha256)"));
        }
        let group = leaf["storage_group"].as_u64().unwrap();
        let prev = groups.entry(group).or_insert_with(|| t.storage.clone());
        if *prev != t.storage {
            errs.push(format!("{file}: {path:?}: storage sharing differs (group {group})"));
        }
    }
    let distinct: std::collections::HashSet<_> = groups.values().collect();
    if distinct.len() != groups.len() {
        errs.push(format!("{file}: storages torch keeps apart are merged"));
    }
    errs
}

/// A Python interpreter with torch, or None (with the reason printed).
pub fn torch_python() -> Option<String> {
    let py = std::env::var("PMSTATE_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    match Command::new(&py).args(["-c", "import torch, safetensors"]).output() {
        Ok(o) if o.status.success() => Some(py),
        Ok(o) => {
            eprintln!(
                "skipped: {py} cannot import torch and safetensors ({}); set PMSTATE_PYTHON to an interpreter that can",
                String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("")
            );
            None
        }
        Err(e) => {
            eprintln!("skipped: cannot run {py} ({e}); set PMSTATE_PYTHON to a Python with torch");
            None
        }
    }
}

/// Runs `torch_compare.py` with `args`; returns (exit code, stdout).
pub fn torch_compare(py: &str, args: &[&Path]) -> (i32, String) {
    let script = fixture("torch_compare.py");
    let out = Command::new(py).arg(script).args(args).output().expect("run torch_compare.py");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A one-tensor checkpoint (`w`: four float32 values), for tests of writing.
pub fn small() -> Checkpoint {
    let t = Node::Tensor(Box::new(TensorRef::contiguous("0".into(), DType::F32, vec![4])));
    let root = Dict::from_entries(DictKind::Plain, vec![(Node::Str("w".into()), t)]).unwrap();
    let storage = Storage { typed: true, dtype: DType::F32, location: "cpu".into(), data: Bytes::owned(vec![1; 16]) };
    Checkpoint::from_parts(Node::Dict(root), HashMap::from([("0".to_owned(), storage)])).unwrap()
}

/// The names of the entries of `dir`.
pub fn names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
}

/// Saves `ckpt` to `path` (no fsync), calling `during` from inside the
/// write at its first progress report (as a signal landing mid-write);
/// the save's outcome and what `during` returned (`None`: the write never
/// reported progress).
pub fn save_calling_mid_write(
    ckpt: &Checkpoint,
    path: &Path,
    during: impl Fn() -> usize + Sync,
) -> (pmstate_ckpt::Result<()>, Option<usize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let returned = AtomicUsize::new(usize::MAX);
    let progress = |_: u64| {
        if returned.load(Ordering::SeqCst) == usize::MAX {
            returned.store(during(), Ordering::SeqCst);
        }
    };
    let opts = pmstate_ckpt::WriteOptions {
        progress: Some(&progress),
        durability: pmstate_ckpt::Durability::NoFsync,
        ..Default::default()
    };
    let outcome = ckpt.save_with(path, &opts);
    let returned = returned.load(Ordering::SeqCst);
    (outcome, (returned != usize::MAX).then_some(returned))
}
