//! Normalizer groups found in, loaded from and written back into real
//! torch-written checkpoints; the candle VarBuilder over a state dict.

mod common;

use std::sync::Arc;

use candle_core::{DType as CDType, Device, Tensor};
use common::*;
use pmstate_ckpt::{var_builder, Checkpoint, CkptError, LoadWarning, Trained};
use pmstate_norm::NormConfig;

const ACTOR: &str = "model._actor.mu.input_models.obs.running_obs_norm";
const CRITIC: &str = "model._critic.input_models.obs.running_obs_norm";
const LAZY: &str = "model._actor.mu.input_models.future.running_obs_norm";

fn leaf_sha(file: &str, key: &str) -> String {
    let m = manifest();
    let f = entry(&m, file);
    let leaf = f["leaves"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| {
            l["path"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_str().map_or(p.to_string(), str::to_owned))
                .collect::<Vec<_>>()
                .join(".")
                == key
        })
        .unwrap_or_else(|| panic!("{key} not in manifest"));
    leaf["sha256"].as_str().unwrap().to_owned()
}

fn f64_bytes(t: &Tensor) -> Vec<u8> {
    t.flatten_all().unwrap().to_vec1::<f64>().unwrap().iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn finds_every_group_with_torchs_counts_and_shapes() {
    let ckpt = Checkpoint::open(fixture("ppo_full.ckpt")).unwrap();
    let groups = ckpt.normalizers().unwrap();
    let names: Vec<&str> = groups.iter().map(|g| g.name.as_str()).collect();
    // Saved groups in tree order, then the lazy one _metadata names (it never ran).
    assert_eq!(names, [ACTOR, CRITIC, "running_reward_norm", LAZY]);
    for g in &groups[..3] {
        let saved = g.saved.as_ref().unwrap();
        // The count we read is the one torch saved: same bytes as its count buffer.
        assert_eq!(sha256_hex(&saved.count.to_le_bytes()), leaf_sha("ppo_full.ckpt", &format!("{}.count", g.name)));
        assert!(saved.count > 1, "{}: the fixture's normalizers ran", g.name);
    }
    assert_eq!(groups[0].saved.as_ref().unwrap().shape, [12]);
    assert_eq!(groups[2].saved.as_ref().unwrap().shape, [1]);
    assert_eq!(groups[3].saved, None);
    // The inference checkpoint's model is a plain dict (no _metadata): its saved groups only.
    let inference = Checkpoint::open(fixture("inference.ckpt")).unwrap();
    assert_eq!(inference.normalizers().unwrap().len(), 2);
}

#[test]
fn loads_a_group_into_a_running_mean_std_exactly() {
    let ckpt = Checkpoint::open(fixture("ppo_full.ckpt")).unwrap();
    let rms = ckpt.load_normalizer(ACTOR, NormConfig::default(), &Device::Cpu).unwrap();
    let state = rms.state().expect("loaded");
    assert_eq!(sha256_hex(&f64_bytes(&state.mean)), leaf_sha("ppo_full.ckpt", &format!("{ACTOR}.mean")));
    assert_eq!(sha256_hex(&f64_bytes(&state.var)), leaf_sha("ppo_full.ckpt", &format!("{ACTOR}.var")));
    // A lazy normalizer that never ran saved nothing: it loads lazy, and takes a shape on first use.
    let lazy = ckpt.load_normalizer(LAZY, NormConfig::default(), &Device::Cpu).unwrap();
    assert!(!lazy.is_initialized());
    let md = ckpt.get("model").and_then(|m| m.as_dict()).and_then(|d| d.metadata()).unwrap();
    assert!(md.get("_actor.mu.input_models.future.running_obs_norm").is_some(), "the module is in _metadata");
}

/// A misspelled or absent name is an error naming the closest groups, never
/// an empty normalizer (a server would normalize with mean 0 and var 1).
#[test]
fn a_misspelled_normalizer_is_an_error_naming_the_closest() {
    let ckpt = Checkpoint::open(fixture("ppo_full.ckpt")).unwrap();
    let typo = "model._actor.mu.input_models.obs.runing_obs_norm";
    let err = ckpt.load_normalizer(typo, NormConfig::default(), &Device::Cpu).unwrap_err();
    match &err {
        CkptError::NormalizerNotFound { name, closest, .. } => {
            assert_eq!(name, typo);
            assert_eq!(closest.first().map(String::as_str), Some(ACTOR));
        }
        other => panic!("expected NormalizerNotFound, got {other}"),
    }
    assert!(err.to_string().contains(&format!("did you mean {ACTOR}")), "{err}");
    let err = ckpt.load_normalizer("model._actor.mu.norm.running_obs_norm", NormConfig::default(), &Device::Cpu);
    assert!(matches!(err, Err(CkptError::NormalizerNotFound { .. })));
}

#[test]
fn resuming_ema_as_welford_warns_about_the_stale_count() {
    let ckpt = Checkpoint::open(fixture("ppo_full.ckpt")).unwrap();
    let count = ckpt.normalizer(ACTOR).unwrap().saved.unwrap().count;
    let (_, warnings) = ckpt.load_normalizer_with(ACTOR, NormConfig::default(), Trained::Ema, &Device::Cpu).unwrap();
    assert_eq!(warnings, [LoadWarning::StaleCount { group: ACTOR.into(), count }]);
    let ema = NormConfig { ema_decay: Some(0.99), ..NormConfig::default() };
    let (rms, warnings) = ckpt.load_normalizer_with(ACTOR, ema, Trained::Welford, &Device::Cpu).unwrap();
    assert!(warnings.is_empty(), "Welford -> EMA keeps mean/var and ignores count");
    assert_eq!(rms.count(), Some(count));
}

#[test]
fn updated_state_is_written_back_and_nothing_else_changes() {
    let dev = Device::Cpu;
    let mut ckpt = Checkpoint::open(fixture("ppo_full.ckpt")).unwrap();
    let original = Checkpoint::open(fixture("ppo_full.ckpt")).unwrap();
    let mut rms = ckpt.load_normalizer(ACTOR, NormConfig::default(), &dev).unwrap();
    let batch = Tensor::arange(0f32, 48., &dev).unwrap().reshape((4, 12)).unwrap();
    rms.record_moments(&batch).unwrap();
    let updated = rms.state().unwrap();
    ckpt.store_normalizer(ACTOR, &updated).unwrap();
    // A lazy normalizer that has since run gets its keys added.
    let mut lazy = ckpt.load_normalizer(LAZY, NormConfig::default(), &dev).unwrap();
    lazy.record_moments(&Tensor::ones((3, 5), CDType::F32, &dev).unwrap()).unwrap();
    ckpt.store_normalizer(LAZY, &lazy.state().unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("resumed.ckpt");
    ckpt.save(&out).unwrap();
    let again = Checkpoint::open(&out).unwrap();
    let groups = again.normalizers().unwrap();
    let names: Vec<&str> = groups.iter().map(|g| g.name.as_str()).collect();
    // Updated keys stay in place; the new group's keys go to the end of the state dict.
    assert_eq!(names, [ACTOR, CRITIC, LAZY, "running_reward_norm"]);
    let back = again.normalizer_state(ACTOR, &dev).unwrap();
    assert_eq!(back.count, updated.count);
    assert_eq!(f64_bytes(&back.mean), f64_bytes(&updated.mean));
    assert_eq!(f64_bytes(&back.var), f64_bytes(&updated.var));
    assert_eq!(groups.iter().find(|g| g.name == LAZY).unwrap().saved.as_ref().unwrap().shape, [5]);
    // Every other tensor is byte-identical, in the same order.
    let changed = |k: &str| k.starts_with(&format!("{ACTOR}.")) || k.starts_with(&format!("{LAZY}."));
    let before: Vec<_> = original.tensors().into_iter().filter(|(k, _)| !changed(k)).collect();
    let after: Vec<_> = again.tensors().into_iter().filter(|(k, _)| !changed(k)).collect();
    assert_eq!(before.len(), after.len());
    for ((ka, a), (kb, b)) in before.iter().zip(&after) {
        assert_eq!(ka, kb);
        assert_eq!(original.tensor_bytes(a).unwrap(), again.tensor_bytes(b).unwrap(), "{ka}");
    }
    if let Some(py) = torch_python() {
        let (code, out) = torch_compare(&py, &[std::path::Path::new("--weights-only-check"), &out]);
        assert_eq!(code, 0, "{out}");
    }
}

#[test]
fn var_builder_serves_the_state_dict_to_candle() {
    let ckpt = Arc::new(Checkpoint::open(fixture("ppo_full.ckpt")).unwrap());
    let dev = Device::Cpu;
    let vb = var_builder(ckpt.clone(), "model", CDType::F32, &dev).unwrap();
    let w = ckpt.tensor("model._actor.mu.mlp.0.weight").unwrap();
    let (out_dim, in_dim) = (w.shape[0], w.shape[1]);
    let layer = candle_nn::linear(in_dim, out_dim, vb.pp("_actor.mu.mlp.0")).unwrap();
    let x = Tensor::ones((2, in_dim), CDType::F32, &dev).unwrap();
    let y = candle_nn::Module::forward(&layer, &x).unwrap();
    // Row sums of W plus b: what torch's Linear gives on ones.
    let wt = ckpt.to_candle(w, &dev).unwrap();
    let b = ckpt.to_candle(ckpt.tensor("model._actor.mu.mlp.0.bias").unwrap(), &dev).unwrap();
    let want = wt.sum(1).unwrap().add(&b).unwrap();
    let diff = (y.get(0).unwrap() - want).unwrap().abs().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
    assert!(diff < 1e-5, "{diff}");
    assert!(vb.contains_tensor("_actor.logstd"));
    assert!(!vb.contains_tensor("_actor.nope"));
    let wrong = vb.get((in_dim, out_dim), "_actor.mu.mlp.0.weight").unwrap_err().to_string();
    assert!(wrong.contains("shape mismatch for model._actor.mu.mlp.0.weight"), "{wrong}");
    let missing = vb.get(3, "_actor.nope").unwrap_err().to_string();
    assert!(missing.contains("model._actor.nope"), "{missing}");
    // The normalizer buffers come through as f64 when asked.
    let vb64 = var_builder(ckpt, "model", CDType::F64, &dev).unwrap();
    let mean = vb64.get(12, "_actor.mu.input_models.obs.running_obs_norm.mean").unwrap();
    assert_eq!(sha256_hex(&f64_bytes(&mean)), leaf_sha("ppo_full.ckpt", &format!("{ACTOR}.mean")));
}
