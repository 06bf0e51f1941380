//! ProtoMotions v2.3 models (testdata/policy/v23_*, recorded by
//! testdata/policy/record_v23.py from v2.3's own classes, built from the
//! published `config.yaml` files at shrunk widths): the motion tracker
//! (PPO, Transformer actor) and MaskedMimic (VAE, Transformer prior with
//! masked tokens), found and read through the registry from the Hydra
//! `config.yaml` beside `last.ckpt`, against v2.3's eval-mode outputs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use pmstate_policy::served::{self, Batch, Segment, Source, Wanted};
use pmstate_policy::v23::{V23Model, V23Net};
use pmstate_policy::{Model, PolicyError};

fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy").join(name)
}

fn tensors(name: &str, file: &str) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(dir(name).join(file), &Device::Cpu).unwrap()
}

/// The recorded observations as the interface takes them: float32
/// (v2.3's boolean masks as 1.0 valid, 0.0 masked).
fn observations(name: &str) -> HashMap<String, Tensor> {
    tensors(name, "obs.safetensors").into_iter().map(|(k, t)| (k, t.to_dtype(DType::F32).unwrap())).collect()
}

fn load(name: &str) -> Box<dyn Model> {
    served::load(&dir(name).join("last.ckpt"), None, &Device::Cpu, &Default::default()).unwrap()
}

fn run(model: &dyn Model, inputs: &HashMap<String, Tensor>, sources: &[Source]) -> HashMap<&'static str, Tensor> {
    let rows = inputs.values().next().unwrap().dims()[0];
    let segment = Segment { rows, seed: None, wanted: Wanted::Sources(sources) };
    let mut out = model.run(&Batch { inputs, segments: &[segment], chunk_rows: 1024 }).unwrap();
    out.remove(0).into_iter().collect()
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    a.sub(b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
}

/// float32 forwards: torch's and ours differ by summation order only
/// (observed: 1.5e-7 on the tracker's actions, 1.3e-6 on MaskedMimic's,
/// whose normalizer-free latent input is unbounded).
const TOL: f32 = 5e-6;

#[test]
fn the_v23_tracker_matches_v23() {
    let model = load("v23_tracker");
    assert_eq!(model.signature().model, "protomotions.agents.ppo.model.PPOModel");
    assert!(model.config_path().unwrap().ends_with("v23_tracker/config.yaml"));
    let expected = tensors("v23_tracker", "expected.safetensors");
    let out = run(model.as_ref(), &observations("v23_tracker"), &[Source::Actor, Source::Critic]);
    for key in ["mean_action", "value"] {
        let d = max_abs_diff(&out[key], &expected[key]);
        assert!(d <= TOL, "{key}: max abs diff {d}");
    }
    // the extreme rows hit the clamps: their actions are not all alike
    let m = out["mean_action"].to_vec2::<f32>().unwrap();
    assert_ne!(m[0], m[1]);
}

#[test]
fn v23_masked_mimic_matches_v23_with_zero_and_given_noise() {
    let model = load("v23_masked_mimic");
    let expected = tensors("v23_masked_mimic", "expected.safetensors");
    let obs = observations("v23_masked_mimic");
    let out = run(model.as_ref(), &obs, &[Source::Actor]);
    for (ours, theirs) in
        [("mean_action", "mean_action"), ("latent_mu", "latent_mu"), ("latent_logvar", "latent_logvar")]
    {
        let d = max_abs_diff(&out[ours], &expected[theirs]);
        assert!(d <= TOL, "{ours}: max abs diff {d}");
    }
    let mut noisy = obs.clone();
    noisy.insert("vae_noise".into(), expected["vae_noise"].clone());
    let out = run(model.as_ref(), &noisy, &[Source::Actor]);
    for (ours, theirs) in [("mean_action", "noisy_action"), ("latent", "noisy_latent")] {
        let d = max_abs_diff(&out[ours], &expected[theirs]);
        assert!(d <= TOL, "{ours}: max abs diff {d}");
    }
    // row 3 has every masked token off, row 4 every one on: both computed
    let a = out["mean_action"].to_vec2::<f32>().unwrap();
    assert!(a[3].iter().chain(&a[4]).all(|v| v.is_finite()));
}

#[test]
fn the_config_is_found_where_v23s_eval_finds_it() {
    // the checkpoint one folder down (a Hydra run's `last.ckpt` beside
    // `config.yaml`, or in a subfolder of it)
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(dir("v23_tracker").join("config.yaml"), tmp.path().join("config.yaml")).unwrap();
    std::fs::create_dir(tmp.path().join("epoch_10")).unwrap();
    let ckpt = tmp.path().join("epoch_10/last.ckpt");
    std::fs::copy(dir("v23_tracker").join("last.ckpt"), &ckpt).unwrap();
    let model = served::load(&ckpt, None, &Device::Cpu, &Default::default()).unwrap();
    assert_eq!(model.config_path().unwrap(), tmp.path().join("config.yaml").display().to_string());
}

#[test]
fn the_signature_has_the_configs_widths() {
    let model = load("v23_masked_mimic");
    let sig = model.signature();
    let widths: HashMap<&str, Option<usize>> = sig.inputs.iter().map(|i| (i.name.as_str(), i.width)).collect();
    let obs = observations("v23_masked_mimic");
    for (k, t) in &obs {
        if sig.inputs.iter().any(|i| &i.name == k) {
            assert_eq!(widths[k.as_str()], Some(t.dims()[1]), "{k}");
        }
    }
    // the encoder's inputs are training-only
    assert!(!widths.contains_key("mimic_target_poses"));
    assert!(sig.inputs.iter().any(|i| i.name == "vae_noise" && i.optional));
}

#[test]
fn nan_observations_are_refused_as_v23_refuses_them() {
    let model = load("v23_tracker");
    let mut obs = observations("v23_tracker");
    let t = &obs["self_obs"];
    let (b, w) = t.dims2().unwrap();
    let mut v = t.to_vec2::<f32>().unwrap();
    v[1][w - 1] = f32::NAN;
    obs.insert("self_obs".into(), Tensor::new(v, &Device::Cpu).unwrap().reshape((b, w)).unwrap());
    let segment = Segment { rows: b, seed: None, wanted: Wanted::Sources(&[Source::Actor]) };
    let e = model.run(&Batch { inputs: &obs, segments: &[segment], chunk_rows: 1024 }).unwrap_err();
    assert!(
        matches!(&e, served::RunError::Policy(PolicyError::NanObservation { key, .. }) if key == "self_obs"),
        "{e}"
    );
}

#[test]
fn the_description_names_the_release_and_its_modules() {
    let model = load("v23_tracker");
    let text = model.description().to_string();
    assert!(text.contains("ProtoMotions v2.3"), "{text}");
    assert!(text.contains("Transformer"), "{text}");
    let json: serde_json::Value = serde_json::from_str(model.description().json()).unwrap();
    assert_eq!(json["release"], "v2.3");
    let actor = &json["networks"][0];
    assert_eq!(actor["role"], "actor");
    let poses = actor["inputs"].as_array().unwrap().iter().find(|i| i["obs_key"] == "mimic_target_poses").unwrap();
    assert_eq!(poses["tokens"], 3);
    let v = model.as_any().downcast_ref::<V23Model>().unwrap();
    assert!(matches!(v.net(), V23Net::Ppo { .. }));
}

/// Where resolved configs are needed (the PPO/AMP reader the deploy
/// pipeline builds on), a v2.3 config.yaml is refused naming it and where
/// v2.3's models are read, not parsed as a pickle.
#[test]
fn the_resolved_configs_reader_names_a_v23_config() {
    let e = pmstate_policy::Policy::load(dir("v23_tracker").join("last.ckpt"), None, &Device::Cpu).unwrap_err();
    assert!(matches!(&e, PolicyError::HydraConfig { file } if file.ends_with("config.yaml")), "{e}");
    assert!(e.to_string().contains("policy describe|run"), "{e}");
}
