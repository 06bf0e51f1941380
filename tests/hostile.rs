//! Every file in `testdata/hostile/` (written by `make_hostile.py`) gets its
//! specific error, or, for code-execution attempts, is read as inert data,
//! flagged, and refused by the writers. Nothing is ever executed.

use std::path::{Path, PathBuf};

use pmstate::ckpt::{Checkpoint, CkptError};
use pmstate::pickle::{from_slice, Limits, Value};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/hostile")
}

fn globals(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Global { module, name } => out.push(format!("{module}.{name}")),
        Value::List(xs) | Value::Tuple(xs) | Value::Set(xs) | Value::FrozenSet(xs) => {
            xs.iter().for_each(|x| globals(x, out))
        }
        Value::Dict(kv) => kv.iter().for_each(|(k, v)| {
            globals(k, out);
            globals(v, out)
        }),
        Value::Reduce { callable, args, .. } => {
            globals(callable, out);
            globals(args, out)
        }
        Value::Build { object, state } => {
            globals(object, out);
            globals(state, out)
        }
        Value::PersistentId(p) | Value::Shared { value: p, .. } => globals(p, out),
        _ => {}
    }
}

/// The outcome of opening `file`: `Ok(flagged globals)` or the error text.
fn outcome(file: &str) -> Result<Vec<String>, String> {
    let path = dir().join(file);
    if file.ends_with(".pmtrace.safetensors") {
        return pmstate::trace::read_file(&path).map(|_| Vec::new()).map_err(|e| e.to_string());
    }
    if file.ends_with(".pkl") {
        let bytes = std::fs::read(&path).unwrap();
        let v = from_slice(&bytes, &Limits::default()).map_err(|e| e.to_string())?;
        let mut found = Vec::new();
        globals(&v, &mut found);
        found.retain(|g| {
            let (m, n) = g.rsplit_once('.').unwrap();
            !pmstate::ckpt::is_safe_global(m, n)
        });
        return Ok(found);
    }
    let ckpt = Checkpoint::open(&path).map_err(|e| e.to_string())?;
    for (_, t) in ckpt.tensors() {
        ckpt.tensor_bytes(t).map_err(|e| e.to_string())?;
    }
    let flagged: Vec<String> = ckpt.unsafe_globals().into_iter().map(|(_, g)| g).collect();
    if !flagged.is_empty() {
        // Refused by both writers, leaving nothing behind.
        let out = tempfile::tempdir().unwrap();
        for name in ["x.pt", "x.safetensors"] {
            let err = ckpt.save(out.path().join(name)).unwrap_err();
            assert!(matches!(err, CkptError::UnsafeGlobals { .. }), "{file} -> {name}: {err}");
        }
        assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
    }
    Ok(flagged)
}

#[test]
fn every_hostile_file_gets_its_specific_error() {
    let marker = Path::new("/tmp/pmstate_pwned");
    let existed = marker.exists();
    let expected: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(dir().join("expected.json")).unwrap()).unwrap();
    let on_disk = std::fs::read_dir(dir()).unwrap().count() - 2; // minus make_hostile.py and expected.json
    assert_eq!(on_disk, expected.len(), "every file has an expectation");
    let mut failures = Vec::new();
    for (file, want) in &expected {
        let want = want.as_str().unwrap();
        let got = outcome(file);
        let ok = match (&got, want.strip_prefix("unsafe: ")) {
            (Ok(flagged), _) if want == "ok" => flagged.is_empty(),
            (Ok(flagged), Some(global)) => flagged.iter().any(|g| g == global),
            (Err(e), None) => e.to_lowercase().contains(&want.to_lowercase()),
            _ => false,
        };
        if !ok {
            failures.push(format!("{file}: expected {want:?}, got {got:?}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    assert_eq!(marker.exists(), existed, "something ran");
}
