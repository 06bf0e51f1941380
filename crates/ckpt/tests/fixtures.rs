//! Every torch-written fixture reads as torch sees it (manifest.json), and
//! round-trips through our writers: .pt -> .pt and .pt -> safetensors -> .pt.
//! With Python torch importable, torch itself judges the rewritten files.

mod common;

use common::*;
use pmstate_ckpt::{Checkpoint, CkptError, Format};

#[test]
fn every_fixture_reads_as_torch_sees_it() {
    let m = manifest();
    for file in walkable(&m) {
        let ckpt = Checkpoint::open(fixture(&file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let errs = check_against_manifest(&ckpt, &entry(&m, &file));
        assert!(errs.is_empty(), "{file}:\n{}", errs.join("\n"));
    }
}

#[test]
fn stored_entries_stay_in_the_file_and_deflated_ones_are_inflated() {
    let stored = Checkpoint::open(fixture("ppo_full.ckpt")).unwrap();
    assert!(matches!(stored.format(), Format::TorchZip { prefix } if prefix == "ppo_full"));
    assert!(stored.storages().values().all(|s| s.data.is_file_backed()));
    let deflated = Checkpoint::open(fixture("deflated.ckpt")).unwrap();
    assert!(deflated.storages().values().all(|s| !s.data.is_file_backed()));
    assert_eq!(stored.tensors().len(), deflated.tensors().len());
    for ((ka, a), (kb, b)) in stored.tensors().into_iter().zip(deflated.tensors()) {
        assert_eq!(ka, kb);
        assert_eq!(stored.tensor_bytes(a).unwrap(), deflated.tensor_bytes(b).unwrap(), "{ka}");
    }
    let legacy = Checkpoint::open(fixture("legacy.pt")).unwrap();
    assert_eq!(*legacy.format(), Format::TorchLegacy);
}

fn roundtrip_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

/// Writes `file` as `.pt`, as `.safetensors`, and that back as `.pt`, in `dir`.
fn rewrites(file: &str, dir: &std::path::Path) -> [std::path::PathBuf; 3] {
    let original = Checkpoint::open(fixture(file)).unwrap();
    let stem = file.split('.').next().unwrap();
    let pt = dir.join(format!("{stem}.pt"));
    original.save(&pt).unwrap_or_else(|e| panic!("{file} -> .pt: {e}"));
    let st = dir.join(format!("{stem}.safetensors"));
    original.save(&st).unwrap_or_else(|e| panic!("{file} -> .safetensors: {e}"));
    let via_st = Checkpoint::open(&st).unwrap_or_else(|e| panic!("{file} safetensors: {e}"));
    assert_eq!(*via_st.format(), Format::Safetensors { with_tree: true });
    let back = dir.join(format!("{stem}.back.pt"));
    via_st.save(&back).unwrap_or_else(|e| panic!("{file} safetensors -> .pt: {e}"));
    [pt, st, back]
}

#[test]
fn pt_to_pt_and_through_safetensors_keeps_everything() {
    let m = manifest();
    let dir = roundtrip_dir();
    for file in walkable(&m) {
        for written in &rewrites(&file, dir.path()) {
            let again = Checkpoint::open(written).unwrap_or_else(|e| panic!("{}: {e}", written.display()));
            let errs = check_against_manifest(&again, &entry(&m, &file));
            assert!(errs.is_empty(), "{} (from {file}):\n{}", written.display(), errs.join("\n"));
        }
    }
}

#[test]
fn torch_loads_our_rewrites_equal_to_its_own_files() {
    let Some(py) = torch_python() else { return };
    let m = manifest();
    let dir = roundtrip_dir();
    for file in walkable(&m) {
        let [pt, _, back] = rewrites(&file, dir.path());
        for ours in [&pt, &back] {
            // Everything we write loads under torch's safe loader, even where the original did not.
            let (code, out) = torch_compare(&py, &[std::path::Path::new("--weights-only-check"), ours]);
            assert_eq!(code, 0, "{}: {out}", ours.display());
            if entry(&m, &file)["weights_only_true"]["ok"] == true {
                let (code, out) = torch_compare(&py, &[&fixture(&file), ours]);
                assert_eq!(code, 0, "{file} vs {}: {out}", ours.display());
            }
        }
    }
}

#[test]
fn the_hostile_fixture_is_reported_never_run_never_reemitted() {
    let marker = std::path::Path::new("/tmp/pmstate_pwned");
    let existed = marker.exists();
    let ckpt = Checkpoint::open(fixture("hostile_os_system.pt")).unwrap();
    let flagged = ckpt.unsafe_globals();
    assert!(flagged.iter().any(|(_, g)| g == "posix.system"), "{flagged:?}");
    let dir = roundtrip_dir();
    for out in ["x.pt", "x.safetensors"] {
        let err = ckpt.save(dir.path().join(out)).unwrap_err();
        assert!(matches!(err, CkptError::UnsafeGlobals { ref first, .. } if first == "posix.system"), "{err}");
        assert!(!dir.path().join(out).exists(), "refused write left a file");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "no temporary file left behind");
    assert_eq!(marker.exists(), existed, "nothing ran");
}

#[test]
fn reading_from_memory_equals_reading_the_file() {
    let m = manifest();
    for file in walkable(&m) {
        let bytes = std::fs::read(fixture(&file)).unwrap();
        let ckpt = Checkpoint::from_bytes(bytes, &file, &Default::default()).unwrap();
        assert!(ckpt.storages().values().all(|s| !s.data.is_file_backed()));
        let errs = check_against_manifest(&ckpt, &entry(&m, &file));
        assert!(errs.is_empty(), "{file}:\n{}", errs.join("\n"));
    }
}

#[test]
fn select_exports_a_state_dict_candle_and_torch_load_as_is() {
    let ckpt = Checkpoint::open(fixture("ppo_full.ckpt")).unwrap();
    let dir = roundtrip_dir();
    let out = dir.path().join("model.safetensors");
    let opts = pmstate_ckpt::SafetensorsOptions { select: Some("model".into()), ..Default::default() };
    let report = pmstate_ckpt::save_safetensors(&ckpt, &out, &opts).unwrap();
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    let model = ckpt.get("model").unwrap();
    let keys: Vec<String> =
        model.as_dict().unwrap().entries().iter().map(|(k, _)| k.as_str().unwrap().to_owned()).collect();
    assert_eq!(report.tensors, keys.len());
    // candle reads it, each tensor equal to the checkpoint's.
    let loaded = candle_core::safetensors::load(&out, &candle_core::Device::Cpu).unwrap();
    assert_eq!(loaded.len(), keys.len());
    for k in &keys {
        let ours = ckpt.to_candle(ckpt.tensor(&format!("model.{k}")).unwrap(), &candle_core::Device::Cpu).unwrap();
        let theirs = &loaded[k];
        assert_eq!(ours.dims(), theirs.dims(), "{k}");
        let diff = (ours.to_dtype(candle_core::DType::F64).unwrap()
            - theirs.to_dtype(candle_core::DType::F64).unwrap())
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap();
        assert_eq!(diff, 0.0, "{k}");
    }
    // safetensors.torch.load_file gives torch.load(...)["model"] exactly.
    let Some(py) = torch_python() else { return };
    let script = "import sys, torch, safetensors.torch as st\n\
        a = torch.load(sys.argv[1], weights_only=True)['model']\n\
        b = st.load_file(sys.argv[2])\n\
        assert set(a.keys()) == set(b.keys())\n\
        for k in a: assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]), k\n\
        print(len(b))";
    let o =
        std::process::Command::new(&py).args(["-c", script]).arg(fixture("ppo_full.ckpt")).arg(&out).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), keys.len().to_string());
}
