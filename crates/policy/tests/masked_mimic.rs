//! MaskedMimic (testdata/policy/masked_mimic, recorded by record_policy.py
//! `--only masked_mimic` from ProtoMotions' own `MaskedMimicModel`, built
//! from the shipped masked_mimic/transformer.py experiment at shrunk widths
//! and trained 20 epochs by ProtoMotions' `SupervisedAgent` from a frozen
//! expert tracker, on stand-in states): every stage of `forward_inference`
//! (normalizer outputs, reshaped sequences, tokens, transformer output,
//! prior heads, latent, action) against torch, the zero-noise default, and the config
//! values this crate refuses, by field.
//!
//! The bound is derived (`pmstate_policy::bound`, attention included):
//! `MaskedMimic::reference` is a float64 forward with per-element bounds;
//! at every stage torch's and this crate's float32 values lie within the
//! bound of it and within twice it of each other.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use common::f32s;
use pmstate_ckpt::{Checkpoint, Node};
use pmstate_policy::bound::{within, Bounded};
use pmstate_policy::masked_mimic::{MaskedMimic, MaskedMimicConfig, VAE_LATENT_KEY, VAE_NOISE_KEY};
use pmstate_policy::{FieldProblem, PolicyError};

fn data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy/masked_mimic").join(rel)
}

fn load(name: &str) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(data(name), &Device::Cpu).unwrap()
}

fn model() -> MaskedMimic {
    MaskedMimic::load(data("last.ckpt"), None, &Device::Cpu).unwrap()
}

fn flat(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().flatten_all().unwrap().to_vec1::<f64>().unwrap()
}

/// Checks `ours` and torch's float32 `torch` against the derived bound of
/// the float64 reference `r` (`torch_f64`: torch's float64 forward, which
/// the reference must reproduce); returns the stage's looseness (the
/// largest bound over the largest observed error).
fn check(stage: &str, ours: &Tensor, torch: &Tensor, torch_f64: Option<&Tensor>, r: &Bounded) -> f64 {
    assert_eq!(ours.dims(), torch.dims(), "{stage}: shape");
    assert_eq!(r.shape, torch.dims(), "{stage}: reference shape");
    let (g, t) = (f32s(ours), f32s(torch));
    if let Some(f) = torch_f64 {
        // the reference normalizes with the float32 statistics, as both
        // float32 forwards do; torch's float64 forward uses float64 ones
        for (i, ((a, b), e)) in r.value.iter().zip(flat(f)).zip(&r.bound).enumerate() {
            assert!((a - b).abs() <= *e, "{stage} [{i}]: f64 {a} vs torch f64 {b}, bound {e:e}");
        }
    }
    common::float32_within_bound(stage, &g, &t, r, "observed: 0.40 percent at most, prior_mu")
}

#[test]
fn every_stage_matches_torch_within_the_derived_bound() {
    let m = model();
    let obs = load("obs.safetensors");
    let want = load("expected.safetensors");
    let out = m.forward(&obs).unwrap();
    let reference = m.reference(&obs).unwrap();
    let mut checked = 0;
    let mut loosest = (0.0f64, String::new());
    for (k, torch) in &want {
        if k.starts_with("f64.") || k.starts_with("zero_noise.") {
            continue;
        }
        let f64_ref = &want[&format!("f64.{k}")];
        let (got, r) = if let Some(p) = k.strip_prefix("norm.").and_then(|p| p.strip_suffix(".norm.out")) {
            let (_, t) =
                out.normalized.iter().find(|(path, _)| path == p).unwrap_or_else(|| panic!("no normalizer {p}"));
            let (_, r) = reference
                .normalized
                .iter()
                .find(|(path, _)| path == p)
                .unwrap_or_else(|| panic!("no reference normalizer {p}"));
            (t.clone(), r)
        } else {
            let key = match k.as_str() {
                "action" => m.trunk.out_key(),
                "latent" => VAE_LATENT_KEY,
                "latent_mu" => &m.config.prior_out.0,
                "latent_logvar" => &m.config.prior_out.1,
                other => other,
            };
            let got = match k.as_str() {
                "action" => out.mean_action.clone(),
                "latent" => out.latent.clone(),
                "latent_mu" => out.latent_mu.clone(),
                "latent_logvar" => out.latent_logvar.clone(),
                _ => out.stages.get(k).unwrap_or_else(|| panic!("stage {k} not computed")).clone(),
            };
            (got, reference.values.get(key).unwrap_or_else(|| panic!("no reference for {k}")))
        };
        let loose = check(k, &got, torch, Some(f64_ref), r);
        if loose > loosest.0 {
            loosest = (loose, k.clone());
        }
        checked += 1;
    }
    // every normalizer, sequence, token, the transformer, both heads, the latent, the action
    assert!(checked >= 20, "{checked} stages");
    assert_eq!(out.mean_action.dims(), [8, 69]);
    eprintln!("masked_mimic: loosest stage {} (max bound / max observed error {:.0})", loosest.1, loosest.0);
}

#[test]
fn without_vae_noise_the_latent_is_the_prior_mean() {
    let m = model();
    let mut obs = load("obs.safetensors");
    obs.remove(VAE_NOISE_KEY).unwrap();
    let want = load("expected.safetensors");
    let out = m.forward(&obs).unwrap();
    let reference = m.reference(&obs).unwrap();
    assert_eq!(flat(&out.latent), flat(&out.latent_mu));
    assert_eq!(reference.values[VAE_LATENT_KEY].value, reference.values[&m.config.prior_out.0].value);
    let r = &reference.values[m.trunk.out_key()];
    check("zero_noise.action", &out.mean_action, &want["zero_noise.action"], None, r);
    // and it differs from the noisy action (the noise reaches the trunk)
    let noisy = flat(&want["action"]);
    let quiet = flat(&out.mean_action);
    assert!(noisy.iter().zip(&quiet).any(|(a, b)| (a - b).abs() > 1e-3));
}

#[test]
fn inputs_are_the_prior_and_trunk_observations() {
    let m = model();
    let keys = m.in_keys();
    for k in [
        "max_coords_obs",
        "masked_mimic_target_poses",
        "masked_mimic_target_masks",
        "masked_mimic_target_times",
        "masked_mimic_target_poses_masks",
        "historical_pose_obs",
        "previous_actions",
    ] {
        assert!(keys.iter().any(|x| x == k), "{k} not in {keys:?}");
    }
    // the privileged encoder's and the latent are not inputs
    assert!(!keys.iter().any(|k| k == "mimic_target_poses" || k == "vae_latent"), "{keys:?}");
    assert_eq!(m.action_size(), Some(69));
    assert_eq!(m.config.latent_dim, 8);
}

#[test]
fn bad_noise_and_missing_observations_are_refused_by_name() {
    let m = model();
    let mut obs = load("obs.safetensors");
    obs.insert(VAE_NOISE_KEY.into(), Tensor::zeros((8, 5), DType::F32, &Device::Cpu).unwrap());
    let e = m.forward(&obs).unwrap_err();
    // the bounded reference refuses the same observations, alike
    assert_eq!(m.reference(&obs).unwrap_err().to_string(), e.to_string());
    assert!(matches!(&e, PolicyError::ObsWidth { key, got: 5, expected: 8 } if key == VAE_NOISE_KEY), "{e}");
    let mut obs = load("obs.safetensors");
    obs.remove("historical_pose_obs");
    let e = m.forward(&obs).unwrap_err();
    // the bounded reference refuses the same observations, alike
    assert_eq!(m.reference(&obs).unwrap_err().to_string(), e.to_string());
    assert!(matches!(&e, PolicyError::MissingObs { key, .. } if key == "historical_pose_obs"), "{e}");
    let mut obs = load("obs.safetensors");
    obs.insert("mimic_target_poses".into(), Tensor::zeros((8, 40), DType::F32, &Device::Cpu).unwrap());
    let e = m.forward(&obs).unwrap_err();
    // the bounded reference refuses the same observations, alike
    assert_eq!(m.reference(&obs).unwrap_err().to_string(), e.to_string());
    assert!(matches!(&e, PolicyError::ExtraObs { key, .. } if key == "mimic_target_poses"), "{e}");
}

// ------------------------------------------------------------ config refusals

fn model_node() -> Node {
    let c = Checkpoint::open(data("resolved_configs.pt")).unwrap();
    c.get("agent.model").unwrap().clone()
}

fn fields(node: &mut Node) -> &mut pmstate_ckpt::Dict {
    match node {
        Node::Object(o) => o.state.as_mut().unwrap().as_dict_mut().unwrap(),
        other => panic!("{}", other.kind()),
    }
}

/// The transformer config: `prior.models[i]` whose `_target_` names it.
fn transformer_fields(model: &mut Node) -> &mut pmstate_ckpt::Dict {
    let prior = fields(model).get_mut("prior").unwrap();
    let models = match fields(prior).get_mut("models").unwrap() {
        Node::List(xs) => xs,
        other => panic!("{}", other.kind()),
    };
    let t = models
        .iter_mut()
        .find(|m| matches!(m, Node::Object(o) if o.fields().and_then(|f| f.get("_target_")).and_then(|t| t.as_str()).is_some_and(|t| t.ends_with("transformer.Transformer"))))
        .unwrap();
    fields(t)
}

fn refused(edit: impl FnOnce(&mut Node)) -> PolicyError {
    let mut m = model_node();
    edit(&mut m);
    match MaskedMimicConfig::from_node(&m, "agent.model") {
        Err(e) => e,
        Ok(cfg) => {
            let ckpt = Checkpoint::open(data("last.ckpt")).unwrap();
            MaskedMimic::from_parts(cfg, &ckpt, &Device::Cpu).expect_err("refused at load")
        }
    }
}

#[test]
fn config_values_it_cannot_run_are_refused_naming_the_field() {
    // the recorded config parses and loads
    let cfg = MaskedMimicConfig::from_node(&model_node(), "agent.model").unwrap();
    MaskedMimic::from_parts(cfg, &Checkpoint::open(data("last.ckpt")).unwrap(), &Device::Cpu).unwrap();

    let e = refused(|m| *transformer_fields(m).get_mut("num_heads").unwrap() = Node::Int(5));
    assert!(
        matches!(&e, PolicyError::BadField { path, field, problem: FieldProblem::Mismatch { value: 5, .. } } if path == "agent.model.prior.models.7" && field == "num_heads"),
        "{e}"
    );
    let e = refused(|m| *transformer_fields(m).get_mut("dropout").unwrap() = Node::Float(1.5));
    assert!(
        matches!(&e, PolicyError::BadField { field, problem: FieldProblem::OutOfRange { .. }, .. } if field == "dropout"),
        "{e}"
    );
    let e = refused(|m| *transformer_fields(m).get_mut("transformer_token_size").unwrap() = Node::Int(16));
    assert!(matches!(&e, PolicyError::BadField { field, .. } if field == "transformer_token_size"), "{e}");
    let e = refused(|m| *transformer_fields(m).get_mut("activation").unwrap() = Node::Str("swish".into()));
    assert!(
        matches!(&e, PolicyError::UnknownActivation { path, .. } if path == "agent.model.prior.models.7.activation"),
        "{e}"
    );
    // a layer count the checkpoint does not have: the missing weight is named
    let e = refused(|m| *transformer_fields(m).get_mut("num_layers").unwrap() = Node::Int(3));
    assert!(
        matches!(&e, PolicyError::MissingWeight { key, .. } if key == "model._prior.models.7.seqTransEncoder.layers.2.self_attn.in_proj_weight"),
        "{e}"
    );
    let e = refused(|m| {
        fields(m).get_mut("vae").map(|v| *fields(v).get_mut("vae_latent_dim").unwrap() = Node::Int(6)).unwrap()
    });
    assert!(matches!(&e, PolicyError::BadField { field, .. } if field == "vae_latent_dim"), "{e}");
    let e = refused(|m| {
        let trunk = fields(m).get_mut("trunk").unwrap();
        *fields(trunk).get_mut("in_keys").unwrap() =
            Node::List(vec![Node::Str("max_coords_obs".into()), Node::Str("previous_actions".into())]);
    });
    assert!(
        matches!(&e, PolicyError::BadField { path, field, .. } if path == "agent.model.trunk" && field == "in_keys"),
        "{e}"
    );
    let e = refused(|m| {
        *fields(m).get_mut("_target_").unwrap() = Node::Str("protomotions.agents.supervised.model.Other".into())
    });
    assert!(matches!(&e, PolicyError::UnsupportedClass { .. }), "{e}");
    assert!(e.to_string().contains("protomotions.agents.supervised.model.Other"), "{e}");
}

/// `Transformer.forward`'s mask rules: a mask wider than its tokens pads
/// every token only where all its entries are 0 (`mask.all(-1)`, then
/// expanded); a `[B]` mask covers every token; both as the reference
/// computes them, checked against the `[B, 5]` mask they amount to.
#[test]
fn wide_and_one_dimensional_masks_reduce_as_the_reference_does() {
    let m = model();
    let base = load("obs.safetensors");
    let key = "masked_mimic_target_poses_masks";
    let run = |mask: Tensor| {
        let mut obs = base.clone();
        obs.insert(key.into(), mask);
        let action = m.forward(&obs).unwrap().mean_action;
        // the bounded reference reads the mask the same way
        let r = m.reference(&obs).unwrap();
        let got: Vec<f32> = action.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(within(&got, &r.values[m.trunk.out_key()], 1.0), None, "action outside the bound under this mask");
        flat(&action)
    };
    let dev = Device::Cpu;
    // rows: all valid, all masked, one valid entry of ten, the last entry valid
    let mut wide = vec![0f32; 8 * 10];
    wide[..10].fill(1.0);
    wide[2 * 10 + 3] = 1.0;
    wide[3 * 10 + 9] = 1.0;
    for r in 4..8 {
        for c in 0..10 {
            wide[r * 10 + c] = ((r + c) % 3 == 0) as u8 as f32;
        }
    }
    // what all(-1) of "padded" makes of each row: valid everywhere unless the row is all zeros
    let mut same = vec![0f32; 8 * 5];
    for r in 0..8 {
        let any = wide[r * 10..(r + 1) * 10].iter().any(|&v| v != 0.0);
        for c in 0..5 {
            same[r * 5 + c] = any as u8 as f32;
        }
    }
    assert_eq!(
        run(Tensor::from_vec(wide, (8, 10), &dev).unwrap()),
        run(Tensor::from_vec(same.clone(), (8, 5), &dev).unwrap())
    );
    // and row 1 (all zeros) really is masked: it differs from all valid
    let ones = run(Tensor::ones((8, 5), DType::F32, &dev).unwrap());
    let zeros = run(Tensor::zeros((8, 5), DType::F32, &dev).unwrap());
    assert_ne!(ones[69..138], zeros[69..138]);
    // a [B, 1] mask covers the row's every token
    let col: Vec<f32> = (0..8).map(|r| (r % 2) as f32).collect();
    let spread: Vec<f32> = (0..8).flat_map(|r| [(r % 2) as f32; 5]).collect();
    assert_eq!(run(Tensor::from_vec(col, (8, 1), &dev).unwrap()), run(Tensor::from_vec(spread, (8, 5), &dev).unwrap()));
    // a mask narrower than its tokens (but not 1) is refused naming it
    let mut obs = base.clone();
    obs.insert(key.into(), Tensor::ones((8, 3), DType::F32, &dev).unwrap());
    let e = m.forward(&obs).unwrap_err();
    assert_eq!(m.reference(&obs).unwrap_err().to_string(), e.to_string());
    assert!(
        matches!(&e, PolicyError::Attention { problem: pmstate_policy::AttentionProblem::MaskShape { key: k, tokens: 5, .. }, .. } if k == key),
        "{e}"
    );
}

#[test]
fn a_prior_without_two_out_keys_is_refused_naming_the_field() {
    let e = refused(|m| {
        let prior = fields(m).get_mut("prior").unwrap();
        *fields(prior).get_mut("out_keys").unwrap() = Node::List(vec![Node::Str("prior_mu".into())]);
    });
    assert!(
        matches!(&e, PolicyError::BadField { path, field, problem: FieldProblem::Count { found: 1, .. } } if path == "agent.model.prior" && field == "out_keys"),
        "{e}"
    );
}

/// `node` with every string `rename` maps replaced (dict values, list and
/// tuple items, objects' states), as an older release's configs name them.
fn renamed(node: Node, rename: &dyn Fn(&str) -> Option<String>) -> Node {
    match node {
        Node::Str(s) => Node::Str(rename(&s).unwrap_or(s)),
        Node::List(v) => Node::List(v.into_iter().map(|n| renamed(n, rename)).collect()),
        Node::Tuple(v) => Node::Tuple(v.into_iter().map(|n| renamed(n, rename)).collect()),
        Node::Dict(d) => {
            let (kind, entries, state) = d.into_parts();
            let entries = entries.into_iter().map(|(k, v)| (k, renamed(v, rename))).collect();
            Node::Dict(pmstate_ckpt::Dict::from_entries(kind, entries).unwrap().with_state(state))
        }
        Node::Object(mut o) => {
            o.state = o.state.map(|s| renamed(s, rename));
            Node::Object(o)
        }
        other => other,
    }
}

/// The masked_mimic checkpoint beside configs `rename` rewrote, loaded
/// through the registry.
fn registry_load(
    rename: &dyn Fn(&str) -> Option<String>,
) -> Result<Box<dyn pmstate_policy::served::Model>, pmstate_policy::served::LoadError> {
    use pmstate_ckpt::{UnsafeGlobals, WriteOptions};
    let (root, storages) = Checkpoint::open(data("resolved_configs_inference.pt")).unwrap().into_parts();
    let edited = Checkpoint::from_parts(renamed(root, rename), storages).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(data("last.ckpt"), dir.path().join("last.ckpt")).unwrap();
    // the configs name their classes as pickled globals: written as they are
    let opts = WriteOptions { unsafe_globals: UnsafeGlobals::Allow, ..Default::default() };
    pmstate_ckpt::save_torch(&edited, dir.path().join("resolved_configs_inference.pt"), &opts).unwrap();
    pmstate_policy::served::load(&dir.path().join("last.ckpt"), None, &Device::Cpu, &Default::default())
}

/// [`registry_load`]'s refusal.
fn registry_refusal(rename: &dyn Fn(&str) -> Option<String>) -> PolicyError {
    match registry_load(rename) {
        Err(pmstate_policy::served::LoadError::Policy(e)) => e,
        Err(e) => panic!("not a policy error: {e}"),
        Ok(_) => panic!("loaded"),
    }
}

/// v3.0 and v3.1 named MaskedMimic `protomotions.agents.masked_mimic.model.MaskedMimicModel`
/// and built it from other modules: that class is read (today's modules
/// under it are v3.1's layout; tests/releases_masked_mimic.rs checks both
/// releases' recordings). Their `FeedForwardModel` is not: its refusal names
/// the release layout it met, and lists today's classes (every family's).
#[test]
fn an_older_release_class_is_read_or_refused_naming_its_layout() {
    use pmstate_policy::config::MASKED_MIMIC_MODEL;
    use pmstate_policy::releases::{FEED_FORWARD_V3, MASKED_MIMIC_V3};
    let families: Vec<&str> = pmstate_policy::served::registry::FAMILIES.iter().map(|f| f.model).collect();
    assert!(families.contains(&MASKED_MIMIC_MODEL) && families.contains(&MASKED_MIMIC_V3), "{families:?}");

    // v3.1's layout: today's ObsProcessor / ModuleContainer modules under the old class
    let m = registry_load(&|s| (s == MASKED_MIMIC_MODEL).then(|| MASKED_MIMIC_V3.to_owned())).unwrap();
    assert_eq!(m.signature().model, MASKED_MIMIC_V3);
    assert!(m.description().to_string().contains("release: ProtoMotions v3.1"), "{}", m.description());

    // FeedForwardModel in v3.1's layout
    let e = registry_refusal(&|s| (s == MASKED_MIMIC_MODEL).then(|| FEED_FORWARD_V3.to_owned()));
    assert!(
        matches!(&e, PolicyError::OlderRelease(o)
            if o.path == "agent.model" && o.class == FEED_FORWARD_V3 && o.layout.starts_with("v3.1 layout") && o.supported == families),
        "{e}"
    );
    let msg = e.to_string();
    assert!(msg.contains("FeedForwardModel, v3.1 layout (ObsProcessor, ModuleContainer)"), "{msg}");
    assert!(msg.contains(MASKED_MIMIC_MODEL) && msg.contains("resolved_configs_inference.pt"), "{msg}");

    // ... in v3.0's: SequentialModule containers
    let e = registry_refusal(&|s| match s {
        MASKED_MIMIC_MODEL => Some(FEED_FORWARD_V3.to_owned()),
        s if s.ends_with(".ModuleContainer") => Some("protomotions.agents.common.common.SequentialModule".into()),
        _ => None,
    });
    assert!(e.to_string().contains("FeedForwardModel, v3.0 layout (SequentialModule)"), "{e}");

    // the old MaskedMimic class over modules of neither layout: refused naming it
    let e = registry_refusal(&|s| match s {
        MASKED_MIMIC_MODEL => Some(MASKED_MIMIC_V3.to_owned()),
        s if s.ends_with(".ModuleContainer") => Some("protomotions.agents.common.common.OtherContainer".into()),
        _ => None,
    });
    assert!(matches!(&e, PolicyError::OlderRelease(o) if o.class == MASKED_MIMIC_V3 && o.supported == families), "{e}");

    // a class no release had: every family's class listed
    let e = registry_refusal(&|s| (s == MASKED_MIMIC_MODEL).then(|| "protomotions.agents.other.Model".to_owned()));
    assert!(
        matches!(&e, PolicyError::UnsupportedClass { class, supported, .. }
            if class == "protomotions.agents.other.Model" && supported == &families),
        "{e}"
    );
}
