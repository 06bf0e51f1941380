//! Files behave like files: outputs get the permissions `cp` gives,
//! SIGINT/SIGTERM leave no temporary file, a stale one from a killed run is
//! named and can be cleaned, an input rewritten under a convert is an
//! error, and `diff` compares integers exactly.

#![cfg(unix)]

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use pmstate_ckpt::{Bytes, Checkpoint, DType, Dict, DictKind, Node, Storage, TensorRef};

fn pmstate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pmstate")).args(args).output().expect("run pmstate")
}

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/checkpoints").join(name).display().to_string()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// A checkpoint of one int64 tensor of `values`, and one f32 tensor of `n` elements.
fn checkpoint(values: &[i64], n: usize) -> Checkpoint {
    let ints: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let floats: Vec<u8> = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let storages: HashMap<String, Storage> = [
        ("i".to_owned(), Storage { typed: true, dtype: DType::I64, location: "cpu".into(), data: Bytes::owned(ints) }),
        (
            "f".to_owned(),
            Storage { typed: true, dtype: DType::F32, location: "cpu".into(), data: Bytes::owned(floats) },
        ),
    ]
    .into();
    let t = |s: &str, d, len| Node::Tensor(Box::new(TensorRef::contiguous(s.into(), d, vec![len])));
    let root = Dict::from_entries(
        DictKind::Plain,
        vec![
            (Node::Str("ints".into()), t("i", DType::I64, values.len())),
            (Node::Str("big".into()), t("f", DType::F32, n)),
        ],
    )
    .unwrap();
    Checkpoint::from_parts(Node::Dict(root), storages).unwrap()
}

#[test]
fn outputs_get_the_permissions_cp_would_give() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("new.safetensors");
    assert!(pmstate(&["convert", &fixture("inference.ckpt"), out.to_str().unwrap()]).status.success());
    // What this process's umask gives a new file made with mode 0666.
    let probe = dir.path().join("probe");
    std::fs::write(&probe, b"").unwrap();
    assert_eq!(mode(&out), mode(&probe), "a new output gets 0666 & ~umask");
    let replaced = dir.path().join("shared.pt");
    std::fs::write(&replaced, b"old").unwrap();
    std::fs::set_permissions(&replaced, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(pmstate(&["convert", &fixture("inference.ckpt"), replaced.to_str().unwrap()]).status.success());
    assert_eq!(mode(&replaced), 0o644, "replacing a file keeps its mode");
}

#[test]
fn integers_are_compared_exactly_by_diff() {
    let dir = tempfile::tempdir().unwrap();
    let big = 1i64 << 60;
    let a = dir.path().join("a.pt");
    let b = dir.path().join("b.pt");
    checkpoint(&[big, 5], 3).save(&a).unwrap();
    checkpoint(&[big + 1, 5], 3).save(&b).unwrap();
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    for extra in [&[][..], &["--atol", "0"][..]] {
        let o = pmstate(&[&["diff", "--json"][..], extra, &[a, b][..]].concat());
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(j["differences"][0]["key"], "ints", "{j}");
        assert_eq!(j["differences"][0]["mismatched"], 1, "{j}");
        assert_eq!(j["differences"][0]["first_index"], 0, "{j}");
    }
    assert_eq!(pmstate(&["diff", "--atol", "1", a, b]).status.code(), Some(0));
}

/// Writes through pmstate's atomic writer directly, then rewrites the
/// input in place (as a training job saving over `last.ckpt` does): the
/// write is refused as "input changed while reading" and nothing is left.
#[test]
fn an_input_rewritten_while_it_is_read_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("last.ckpt");
    checkpoint(&[1, 2], 1 << 20).save(&src).unwrap();
    let ckpt = Checkpoint::open(&src).unwrap();
    // Truncated under us.
    std::fs::OpenOptions::new().write(true).open(&src).unwrap().set_len(1000).unwrap();
    let out = dir.path().join("out.safetensors");
    let err = ckpt.save(&out).unwrap_err();
    assert!(matches!(err, pmstate_ckpt::CkptError::InputChanged { .. }), "{err}");
    assert!(err.to_string().contains("input changed while reading"), "{err}");
    // Rewritten in place with the same size (same inode, new content and times).
    checkpoint(&[1, 2], 1 << 20).save(&src).unwrap();
    let ckpt = Checkpoint::open(&src).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let bytes = std::fs::read(&src).unwrap();
    std::fs::write(&src, &bytes).unwrap();
    let err = ckpt.save(&out).unwrap_err();
    assert!(matches!(err, pmstate_ckpt::CkptError::InputChanged { .. }), "{err}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["last.ckpt"], "nothing written, no temporary file");
}

/// SIGINT while a convert writes: the temporary file is removed before
/// the process exits (130), and the target is untouched.
#[test]
fn sigint_during_a_convert_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("big.pt");
    // 256 MiB of tensor data: the convert takes long enough to be interrupted.
    checkpoint(&[7], 64 << 20).save(&src).unwrap();
    let out = dir.path().join("out.safetensors");
    let mut child = Command::new(env!("CARGO_BIN_EXE_pmstate"))
        .args(["convert", "--quiet", src.to_str().unwrap(), out.to_str().unwrap()])
        .spawn()
        .unwrap();
    let tmp_exists =
        || std::fs::read_dir(dir.path()).unwrap().any(|e| e.unwrap().file_name().to_string_lossy().ends_with(".tmp"));
    // Wait (bounded by the convert itself) until the temporary file exists.
    let mut seen = false;
    while child.try_wait().unwrap().is_none() {
        if tmp_exists() {
            seen = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    if seen {
        assert!(Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap().success());
    }
    let status = child.wait().unwrap();
    assert!(!tmp_exists(), "a temporary file was left behind");
    if seen && status.code() == Some(130) {
        assert!(!out.exists(), "an interrupted convert wrote its output");
    } else {
        // The convert finished before the signal landed: then it must be whole.
        assert!(status.success());
        assert_eq!(pmstate(&["diff", src.to_str().unwrap(), out.to_str().unwrap()]).status.code(), Some(0));
    }
}

/// A temporary file left by a killed run is named by the next convert into
/// that folder and removed by `clean-tmp --delete`.
#[test]
fn stale_temporary_files_are_named_and_cleaned() {
    let dir = tempfile::tempdir().unwrap();
    let stale = dir.path().join(format!(".pmstate-{}-deadbeef.tmp", u32::MAX - 7));
    std::fs::write(&stale, b"half a checkpoint").unwrap();
    let out = dir.path().join("x.safetensors");
    let o = pmstate(&["convert", &fixture("inference.ckpt"), out.to_str().unwrap()]);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("was left by a killed pmstate") && err.contains(".pmstate-"), "{err}");
    let d = dir.path().to_str().unwrap();
    let list = pmstate(&["clean-tmp", "--json", d]);
    let j: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(j["stale"].as_array().unwrap().len(), 1, "{j}");
    assert!(stale.exists(), "listing removes nothing");
    assert!(pmstate(&["clean-tmp", "--delete", d]).status.success());
    assert!(!stale.exists());
    assert!(out.exists(), "only pmstate's stale temporary files are removed");
}
