//! `pmstate bench-policy --family masked-mimic`: MaskedMimic's inference
//! forward (prior with its transformer, latent, trunk) at the published
//! smpl model's sizes (tokens 512, 4 layers, 4 heads, ff 1024, relu;
//! token MLPs 256 x 2, heads 256/128 -> 64, trunk 1024 x 3 -> 69), built
//! in Rust with deterministic weights. The observation widths per step are
//! illustrative (the published env's masked-mimic components are not
//! computed here): they size only the first Linear of each token MLP.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use pmstate_policy::config::{
    ContainerConfig, LayerConfig, MlpConfig, ModuleConfig, NormSettings, Number, ObsProcessorConfig, TransformerConfig,
};
use pmstate_policy::masked_mimic::{MaskedMimic, MaskedMimicConfig, VaeNoiseType, VAE_LATENT_KEY, VAE_NOISE_KEY};
use pmstate_policy::module_ops::{ModuleOp, ReshapeDim};
use pmstate_policy::{Activation, MaskedMimicModel};

use crate::CliError;

/// Future and historical steps (the experiment's `NUM_FUTURE_STEPS`, `NUM_HISTORICAL_CONDITIONED_STEPS`).
pub const STEPS: usize = 5;
/// Token width (`transformer_token_size`, `latent_dim`).
pub const TOKEN: usize = 512;
/// `vae_latent_dim`.
pub const LATENT: usize = 64;
/// Actions (smpl).
pub const ACTIONS: usize = 69;
/// Observations and their widths (per-step widths times [`STEPS`] where sequenced).
pub const KEYS: [(&str, usize); 7] = [
    ("max_coords_obs", 358),
    ("masked_mimic_target_poses", STEPS * 168),
    ("masked_mimic_target_masks", STEPS * 25),
    ("masked_mimic_target_times", STEPS),
    ("masked_mimic_target_poses_masks", STEPS),
    ("historical_pose_obs", STEPS * 217),
    ("previous_actions", ACTIONS),
];

fn width(key: &str) -> usize {
    KEYS.iter().find(|(k, _)| *k == key).map_or(0, |(_, w)| *w)
}

fn norm(on: bool) -> NormSettings {
    NormSettings { normalize_obs: on, clamp: Some(Number::Int(5)), ema_decay: Some(0.999) }
}

fn reshape(steps: i64) -> ModuleOp {
    ModuleOp::Reshape(vec![ReshapeDim::Batch("batch_size".into()), ReshapeDim::Size(steps), ReshapeDim::Size(-1)])
}

fn obs_proc(input: &str, out: &str, normalize: bool, ops: Vec<ModuleOp>) -> ModuleConfig {
    ModuleConfig::ObsProcessor(ObsProcessorConfig {
        in_keys: vec![input.into()],
        out_key: out.into(),
        norm: norm(normalize),
        module_operations: ops,
    })
}

fn mlp(
    inputs: &[&str],
    out: &str,
    units: &[usize],
    num_out: usize,
    normalize: bool,
    ops: Vec<ModuleOp>,
) -> ModuleConfig {
    ModuleConfig::Mlp(MlpConfig {
        in_keys: inputs.iter().map(|k| k.to_string()).collect(),
        out_key: out.into(),
        norm: norm(normalize),
        layers: units
            .iter()
            .map(|&u| LayerConfig { units: u, activation: Activation::Relu, use_layer_norm: false })
            .collect(),
        num_out,
        output_activation: None,
        module_operations: ops,
    })
}

/// The published model's config (the encoder, training only, stands in as the trunk's).
pub fn config() -> MaskedMimicConfig {
    let s = STEPS as i64;
    let prior = ModuleConfig::Container(ContainerConfig {
        in_keys: KEYS.iter().filter(|(k, _)| *k != "previous_actions").map(|(k, _)| k.to_string()).collect(),
        out_keys: vec!["prior_mu".into(), "prior_logvar".into()],
        models: vec![
            obs_proc("masked_mimic_target_poses", "target_poses_seq", true, vec![reshape(s), ModuleOp::Forward]),
            obs_proc("masked_mimic_target_masks", "target_masks_seq", false, vec![reshape(s)]),
            obs_proc("masked_mimic_target_times", "target_times_seq", true, vec![reshape(s), ModuleOp::Forward]),
            obs_proc("historical_pose_obs", "historical_pose_obs_seq", true, vec![reshape(s), ModuleOp::Forward]),
            mlp(
                &["max_coords_obs"],
                "current_state_token",
                &[256, 256],
                TOKEN,
                true,
                vec![reshape(1), ModuleOp::Forward],
            ),
            mlp(
                &["target_poses_seq", "target_masks_seq", "target_times_seq"],
                "masked_mimic_target_poses_token",
                &[256, 256],
                TOKEN,
                false,
                vec![reshape(s), ModuleOp::Forward],
            ),
            mlp(
                &["historical_pose_obs_seq"],
                "historical_pose_obs_token",
                &[256, 256],
                TOKEN,
                false,
                vec![reshape(s), ModuleOp::Forward],
            ),
            ModuleConfig::Transformer(Box::new(TransformerConfig {
                in_keys: vec![
                    "current_state_token".into(),
                    "masked_mimic_target_poses_token".into(),
                    "historical_pose_obs_token".into(),
                    "masked_mimic_target_poses_masks".into(),
                ],
                out_key: "transformer_out".into(),
                masks: vec![("masked_mimic_target_poses_token".into(), "masked_mimic_target_poses_masks".into())],
                latent_dim: TOKEN,
                num_heads: 4,
                ff_size: 1024,
                num_layers: 4,
                activation: Activation::Relu,
                output_activation: Some(Activation::Relu),
            })),
            mlp(&["transformer_out"], "prior_mu", &[256, 128], LATENT, false, vec![ModuleOp::Forward]),
            mlp(&["transformer_out"], "prior_logvar", &[256, 128], LATENT, false, vec![ModuleOp::Forward]),
        ],
    });
    let trunk = ModuleConfig::Container(ContainerConfig {
        in_keys: vec!["max_coords_obs".into(), "previous_actions".into(), VAE_LATENT_KEY.into()],
        out_keys: vec!["actor_trunk_out".into()],
        models: vec![
            obs_proc("max_coords_obs", "max_coords_obs_norm", true, vec![ModuleOp::Forward]),
            obs_proc("previous_actions", "previous_actions_norm", true, vec![ModuleOp::Forward]),
            mlp(
                &["max_coords_obs_norm", "previous_actions_norm", VAE_LATENT_KEY],
                "actor_trunk_out",
                &[1024, 1024, 1024],
                ACTIONS,
                false,
                vec![ModuleOp::Forward],
            ),
        ],
    });
    MaskedMimicConfig {
        prior,
        prior_out: ("prior_mu".into(), "prior_logvar".into()),
        encoder: trunk.clone(),
        trunk,
        latent_dim: LATENT,
        noise_type: VaeNoiseType::Normal,
    }
}

/// Deterministic weights for [`config`] as ProtoMotions names them (kaiming-uniform scale).
pub fn weights() -> Result<HashMap<String, Tensor>, CliError> {
    let dev = Device::Cpu;
    let mut rnd = super::bench_policy::xorshift(0x3a5c);
    let mut m = HashMap::new();
    let mut linear = |m: &mut HashMap<String, Tensor>, w_key: String, b_key: String, fan_in: usize, fan_out: usize| {
        let bound = 1.0 / (fan_in as f32).sqrt();
        let w: Vec<f32> = (0..fan_in * fan_out).map(|_| rnd() * bound).collect();
        let b: Vec<f32> = (0..fan_out).map(|_| rnd() * bound).collect();
        m.insert(w_key, Tensor::from_vec(w, (fan_out, fan_in), &dev)?);
        m.insert(b_key, Tensor::from_vec(b, fan_out, &dev)?);
        Ok::<(), CliError>(())
    };
    let mut mlp_w = |m: &mut HashMap<String, Tensor>, prefix: &str, fan_in: usize, units: &[usize], out: usize| {
        let mut f = fan_in;
        for (i, &u) in units.iter().chain(std::iter::once(&out)).enumerate() {
            linear(m, format!("{prefix}.mlp.{}.weight", 2 * i), format!("{prefix}.mlp.{}.bias", 2 * i), f, u)?;
            f = u;
        }
        Ok::<(), CliError>(())
    };
    let pose = width("masked_mimic_target_poses") / STEPS;
    let masks = width("masked_mimic_target_masks") / STEPS;
    let hist = width("historical_pose_obs") / STEPS;
    mlp_w(&mut m, "_prior.models.4", width("max_coords_obs"), &[256, 256], TOKEN)?;
    mlp_w(&mut m, "_prior.models.5", pose + masks + 1, &[256, 256], TOKEN)?;
    mlp_w(&mut m, "_prior.models.6", hist, &[256, 256], TOKEN)?;
    mlp_w(&mut m, "_prior.models.8", TOKEN, &[256, 128], LATENT)?;
    mlp_w(&mut m, "_prior.models.9", TOKEN, &[256, 128], LATENT)?;
    mlp_w(&mut m, "_trunk.models.2", width("max_coords_obs") + ACTIONS + LATENT, &[1024, 1024, 1024], ACTIONS)?;
    for i in 0..4 {
        let l = format!("_prior.models.7.seqTransEncoder.layers.{i}");
        linear(
            &mut m,
            format!("{l}.self_attn.in_proj_weight"),
            format!("{l}.self_attn.in_proj_bias"),
            TOKEN,
            3 * TOKEN,
        )?;
        linear(&mut m, format!("{l}.self_attn.out_proj.weight"), format!("{l}.self_attn.out_proj.bias"), TOKEN, TOKEN)?;
        linear(&mut m, format!("{l}.linear1.weight"), format!("{l}.linear1.bias"), TOKEN, 1024)?;
        linear(&mut m, format!("{l}.linear2.weight"), format!("{l}.linear2.bias"), 1024, TOKEN)?;
        for n in ["norm1", "norm2"] {
            m.insert(format!("{l}.{n}.weight"), Tensor::ones(TOKEN, candle_core::DType::F32, &dev)?);
            m.insert(format!("{l}.{n}.bias"), Tensor::zeros(TOKEN, candle_core::DType::F32, &dev)?);
        }
    }
    let mut stats = |m: &mut HashMap<String, Tensor>, prefix: &str, w: usize| -> Result<(), CliError> {
        let mean: Vec<f64> = (0..w).map(|_| rnd() as f64 * 2.0).collect();
        let var: Vec<f64> = (0..w).map(|_| (rnd() as f64 + 1.5) * 2.0).collect();
        m.insert(format!("{prefix}.norm.running_obs_norm.mean"), Tensor::from_vec(mean, w, &dev)?);
        m.insert(format!("{prefix}.norm.running_obs_norm.var"), Tensor::from_vec(var, w, &dev)?);
        m.insert(format!("{prefix}.norm.running_obs_norm.count"), Tensor::new(1i64, &dev)?);
        Ok(())
    };
    stats(&mut m, "_prior.models.0", pose)?;
    stats(&mut m, "_prior.models.2", 1)?;
    stats(&mut m, "_prior.models.3", hist)?;
    stats(&mut m, "_prior.models.4", width("max_coords_obs"))?;
    stats(&mut m, "_trunk.models.0", width("max_coords_obs"))?;
    stats(&mut m, "_trunk.models.1", ACTIONS)?;
    Ok(m)
}

/// Deterministic observations of `batch` rows (masks: 0/1, the first target always valid) and a noise.
pub fn obs(batch: usize) -> Result<HashMap<String, Tensor>, CliError> {
    let mut rnd = super::bench_policy::xorshift(0x0b5 + batch as u64);
    let mut m = HashMap::new();
    for (k, w) in KEYS {
        let mask = k.ends_with("_masks");
        let v: Vec<f32> = (0..batch * w)
            .map(|i| {
                let r = rnd();
                if mask {
                    (i % w == 0 || r > 0.0) as u8 as f32
                } else {
                    r * 3.0
                }
            })
            .collect();
        m.insert(k.to_string(), Tensor::from_vec(v, (batch, w), &Device::Cpu)?);
    }
    let noise: Vec<f32> = (0..batch * LATENT).map(|_| rnd()).collect();
    m.insert(VAE_NOISE_KEY.into(), Tensor::from_vec(noise, (batch, LATENT), &Device::Cpu)?);
    Ok(m)
}

/// The model (as a [`Model`](pmstate_policy::Model), timed as serve and
/// `policy run` run it), loaded through a safetensors file as a checkpoint would be
/// (written to `keep` when given, else to a temporary file removed after).
pub fn load(keep: Option<&Path>) -> Result<(MaskedMimicModel, usize), CliError> {
    let w = weights()?;
    let bytes = w.iter().filter(|(k, _)| !k.contains(".norm.")).map(|(_, t)| t.elem_count() * 4).sum();
    let path = match keep {
        Some(p) => p.to_path_buf(),
        None => std::env::temp_dir().join(format!("pmstate-bench-masked-mimic-{}.safetensors", std::process::id())),
    };
    candle_core::safetensors::save(&w, &path)?;
    let ckpt = pmstate_ckpt::Checkpoint::open(&path);
    if keep.is_none() {
        let _ = std::fs::remove_file(&path);
    }
    let model = MaskedMimic::from_parts(config(), &ckpt?, &Device::Cpu)?;
    Ok((MaskedMimicModel::new(model, None)?, bytes))
}
