//! ProtoMotions v2.3 models (2025-10): a Hydra `config.yaml` beside
//! `last.ckpt`, as v2.3's `eval_agent.py` finds it (the checkpoint's folder,
//! else its parent).
//!
//! v2.3 predates the resolved-configs files: its model configs are Hydra
//! nodes (`_target_` + `config`) inside an unresolved `config.yaml`, read
//! here with [`pmstate_ckpt::hydra`] (`${...}` resolved as OmegaConf does,
//! only the model's subtree, lazily as OmegaConf resolves it). Two
//! published families:
//! - the motion tracker: `PPOModel` whose actor is `tanh` of a
//!   `Transformer` (one token per input model, a reshape/encode/reshape for
//!   the future target poses) and whose critic is a `MultiHeadedMLP`;
//! - MaskedMimic: `VaeDeterministicOutputModel`, whose prior is a
//!   `Transformer` with masked tokens, and whose trunk reads the latent
//!   `z = mu + exp(logvar / 2) * vae_noise`.
//!
//! Numbers follow v2.3's code: its `RunningMeanStd` normalizes as today's
//! does (float64 statistics, `(x - mean) / sqrt(var + 1e-5)` in float32,
//! then the clamp), its `build_mlp` lays out the Sequential as today's
//! MLPs do, its encoder layers are torch's post-norm
//! `nn.TransformerEncoderLayer` (sequence first, which changes no number),
//! and its masks (`True` = valid, made `logical_not` for torch) pad keys.

pub mod config;
pub mod net;
pub(crate) mod served;

use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use pmstate_ckpt::Checkpoint;

pub use config::{V23Spec, MODEL_KEY};
use net::{MultiHeaded, Obs, PlainMlp, Trunk};
pub use served::V23Model;

use crate::error::{GlobalRule, PolicyError, Result};
use crate::load::{vet, AllowedGlobal, LoadOptions};
use crate::mlp::load_vec;

/// The file name v2.3 writes its config under.
pub const CONFIG_NAME: &str = "config.yaml";

/// Largest `config.yaml` read (the published ones are under 64 KiB).
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// The state dict inside a v2.3 checkpoint.
const DICT: &str = "model";

/// Where v2.3's eval looks for the config of `checkpoint`: `config.yaml` in
/// its folder, else in the folder above (`eval_agent.py`).
pub fn find_config(checkpoint: &Path) -> Option<PathBuf> {
    let dir = checkpoint.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let here = dir.join(CONFIG_NAME);
    if here.is_file() {
        return Some(here);
    }
    let above = dir.parent()?.join(CONFIG_NAME);
    above.is_file().then_some(above)
}

/// Whether `config` is a Hydra YAML file (by its extension).
pub fn is_hydra_config(config: &Path) -> bool {
    config.extension().is_some_and(|e| e == "yaml" || e == "yml")
}

/// Reads and resolves the model subtree of a v2.3 `config.yaml`.
pub fn read_spec(config: &Path) -> Result<V23Spec> {
    let (file, text) = read_text(config)?;
    let tree = pmstate_ckpt::hydra::resolve_yaml_at(&text, &file, MODEL_KEY).map_err(Box::new)?;
    V23Spec::read(&tree)
}

/// `config`'s name and text; a file over [`MAX_CONFIG_BYTES`] is refused unread.
fn read_text(config: &Path) -> Result<(String, String)> {
    let file = config.display().to_string();
    let io = |source: std::io::Error| PolicyError::ConfigRead { file: file.clone(), source };
    let meta = std::fs::metadata(config).map_err(io)?;
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(PolicyError::ConfigRead {
            file: file.clone(),
            source: std::io::Error::other(format!("{} bytes, over the {MAX_CONFIG_BYTES}-byte limit", meta.len())),
        });
    }
    let text = std::fs::read_to_string(config).map_err(io)?;
    Ok((file, text))
}

/// The model class a v2.3 config names (`agent.config.model._target_`), for
/// the registry.
pub fn model_target(config: &Path) -> Result<String> {
    target_at(config, MODEL_KEY)
}

/// The env's `_target_` of a v2.3 `config.yaml` (`protomotions.envs.mimic.env.Mimic`).
pub fn env_target(config: &Path) -> Result<String> {
    target_at(config, "env")
}

/// The `_target_` of the subtree at `key`, resolved.
fn target_at(config: &Path, key: &str) -> Result<String> {
    let (file, text) = read_text(config)?;
    let tree = pmstate_ckpt::hydra::resolve_yaml_at(&text, &file, &format!("{key}._target_")).map_err(Box::new)?;
    tree.as_str().map(str::to_owned).ok_or_else(|| PolicyError::FieldType {
        path: key.into(),
        field: "_target_".into(),
        expected: "a string",
        found: tree.to_string(),
    })
}

/// A VAE module (prior): trunk, heads.
#[derive(Debug, Clone)]
pub struct VaeModule {
    /// `_trunk`.
    pub trunk: Trunk,
    /// `_mu_head`.
    pub mu_head: PlainMlp,
    /// `_logvar_head`.
    pub logvar_head: PlainMlp,
}

impl VaeModule {
    fn load(ckpt: &Checkpoint, prefix: &str, spec: &config::VaeModuleSpec, dev: &Device) -> Result<Self> {
        let trunk = Trunk::load(ckpt, DICT, &format!("{prefix}._trunk"), &spec.trunk, dev)?;
        let w = Some(trunk.num_out());
        Ok(VaeModule {
            mu_head: PlainMlp::load_spec(ckpt, DICT, &format!("{prefix}._mu_head"), &spec.mu_head, w, dev)?,
            logvar_head: PlainMlp::load_spec(ckpt, DICT, &format!("{prefix}._logvar_head"), &spec.logvar_head, w, dev)?,
            trunk,
        })
    }
}

/// A loaded v2.3 network.
#[derive(Debug, Clone)]
pub enum V23Net {
    /// The motion tracker.
    Ppo {
        /// `_actor.mu`.
        mu: Trunk,
        /// `_actor.logstd` (`[A]`).
        logstd: Tensor,
        /// `_critic`.
        critic: Trunk,
    },
    /// MaskedMimic (inference: the prior and the trunk).
    Vae {
        /// `_prior`.
        prior: Box<VaeModule>,
        /// `_trunk`.
        trunk: Box<MultiHeaded>,
        /// `vae_latent_dim`.
        latent_dim: usize,
    },
}

/// The outputs of one forward.
#[derive(Debug, Clone)]
pub struct V23Outputs {
    /// `tanh` of the actor's (the trunk's) output, `[B, A]`.
    pub mean_action: Tensor,
    /// The critic's value `[B, 1]` (the tracker, when asked for).
    pub value: Option<Tensor>,
    /// The prior's `mu`, `logvar` and the latent `z` (MaskedMimic).
    pub latent: Option<(Tensor, Tensor, Tensor)>,
}

/// The key MaskedMimic's noise comes in (`vae_noise`, zero when left out).
pub const VAE_NOISE_KEY: &str = "vae_noise";
/// The key the trunk reads the latent from.
pub const VAE_LATENT_KEY: &str = "vae_latent";

impl V23Net {
    /// Loads the network `spec` describes from `ckpt`'s `model` state dict.
    pub fn load(ckpt: &Checkpoint, spec: &V23Spec, dev: &Device) -> Result<Self> {
        Ok(match spec {
            V23Spec::Ppo(p) => {
                let mu = Trunk::load(ckpt, DICT, "_actor.mu", &p.mu, dev)?;
                if mu.num_out() != p.num_actions {
                    return Err(PolicyError::Graph {
                        path: p.mu.path().to_owned(),
                        problem: crate::problem::GraphProblem::ActionSize {
                            mu_width: mu.num_out(),
                            logstd: p.num_actions,
                        },
                    });
                }
                let logstd =
                    load_vec(ckpt, DICT, "_actor.logstd", p.num_actions, "agent.config.model.config.actor", dev)?;
                let critic = Trunk::load(ckpt, DICT, "_critic", &p.critic, dev)?;
                V23Net::Ppo { mu, logstd, critic }
            }
            V23Spec::Vae(v) => {
                let prior = VaeModule::load(ckpt, "_prior", &v.prior, dev)?;
                for head in [&prior.mu_head, &prior.logvar_head] {
                    if head.num_out() != v.latent_dim {
                        return Err(PolicyError::BadField {
                            path: head.path.clone(),
                            field: "num_out".into(),
                            problem: crate::problem::FieldProblem::Mismatch {
                                value: head.num_out(),
                                other: "vae_latent_dim",
                                other_value: v.latent_dim,
                            },
                        });
                    }
                }
                V23Net::Vae {
                    prior: Box::new(prior),
                    trunk: Box::new(MultiHeaded::load(ckpt, DICT, "_trunk", &v.trunk, dev)?),
                    latent_dim: v.latent_dim,
                }
            }
        })
    }

    /// Runs the network: the tracker's actor (and critic when `with_value`);
    /// MaskedMimic's prior, latent and trunk (`vae_noise` zero when absent).
    pub fn forward(&self, obs: &Obs, with_value: bool) -> Result<V23Outputs> {
        match self {
            V23Net::Ppo { mu, critic, .. } => {
                let mean_action = mu.forward(obs)?.tanh()?;
                let value = if with_value { Some(critic.forward(obs)?) } else { None };
                Ok(V23Outputs { mean_action, value, latent: None })
            }
            V23Net::Vae { prior, trunk, .. } => {
                let t = prior.trunk.forward(obs)?;
                let mu = prior.mu_head.mlp.forward(&t)?;
                let logvar = prior.logvar_head.mlp.forward(&t)?;
                // z = mean + std * noise, as v2.3's reparameterization writes it
                let noise = match obs.get(VAE_NOISE_KEY) {
                    Some(n) => n.clone(),
                    None => mu.zeros_like()?,
                };
                let z = (&mu + ((&logvar * 0.5)?.exp()? * noise)?)?;
                let mut with_latent = obs.clone();
                with_latent.insert(VAE_LATENT_KEY.to_owned(), z.clone());
                let mean_action = trunk.forward(&with_latent)?.tanh()?;
                Ok(V23Outputs { mean_action, value: None, latent: Some((mu, logvar, z)) })
            }
        }
    }
}

/// Opens and vets a v2.3 checkpoint (its globals as any checkpoint's).
pub(crate) fn open_checkpoint(checkpoint: &Path, opts: &LoadOptions) -> Result<(Checkpoint, Vec<AllowedGlobal>)> {
    let ckpt = Checkpoint::open(checkpoint)?;
    let allowed = vet(&ckpt, GlobalRule::Checkpoint, opts)?;
    Ok((ckpt, allowed))
}
