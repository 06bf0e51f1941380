//! ProtoMotions' `MaskedMimicModel` (`agents/supervised/masked_mimic_model.py`)
//! at inference (`forward_inference`): the prior (ObsProcessors that reshape
//! observations to `[batch, steps, -1]`, MLPs making tokens, the
//! [`Transformer`](crate::network::TransformerNetwork), the mu and logvar
//! heads), the latent `mu + exp(0.5 * logvar) * noise`, and the trunk (an
//! MLP over the normalized observations and the latent) writing the action.
//!
//! The noise is an input (`vae_noise`, `[B, vae_latent_dim]`): ProtoMotions
//! draws it per episode (`vae_noise_type`) and keeps it in the rollout
//! state; without it the noise is zero and the latent is the prior mean.
//! The privileged encoder is training-only: its config is parsed (and
//! checked) but its weights are not loaded.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use pmstate_ckpt::{Checkpoint, Node};
use serde::Serialize;

use crate::config::{ModuleConfig, MASKED_MIMIC_MODEL};
use crate::config_object::Obj;
use crate::error::{PolicyError, Result};
use crate::load::LoadOptions;
use crate::network::{Network, TensorMap, Trace};
use crate::obs_check::{check_obs, ObsKeys};
use crate::problem::{FieldProblem, GraphProblem};
use crate::releases::Release;
use crate::shapes::Widths;

/// The key the trunk reads the latent from (`VAE_LATENT_KEY`).
pub const VAE_LATENT_KEY: &str = "vae_latent";
/// The optional noise input (`VAE_NOISE_KEY`).
pub const VAE_NOISE_KEY: &str = "vae_noise";

/// `MaskedMimicVAEConfig.vae_noise_type`: how ProtoMotions draws the noise
/// for a rollout (here the noise is an input; reported by `describe`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VaeNoiseType {
    /// Standard normal.
    Normal,
    /// Uniform.
    Uniform,
    /// Zeros (the prior mean).
    Zeros,
}

impl VaeNoiseType {
    /// The config's spelling (`normal`, `uniform`, `zeros`).
    pub fn name(self) -> &'static str {
        match self {
            VaeNoiseType::Normal => "normal",
            VaeNoiseType::Uniform => "uniform",
            VaeNoiseType::Zeros => "zeros",
        }
    }
}

/// `MaskedMimicModelConfig`.
#[derive(Debug, Clone, Serialize)]
pub struct MaskedMimicConfig {
    /// The deployable prior: writes `prior_mu`, `prior_logvar` (its `out_keys`).
    pub prior: ModuleConfig,
    /// The prior's `out_keys[0]` (mu) and `[1]` (logvar).
    pub prior_out: (String, String),
    /// The trunk: reads `vae_latent`, writes the action.
    pub trunk: ModuleConfig,
    /// The privileged encoder (training only: parsed, not loaded).
    pub encoder: ModuleConfig,
    /// `vae.vae_latent_dim`.
    pub latent_dim: usize,
    /// `vae.vae_noise_type`.
    pub noise_type: VaeNoiseType,
}

impl MaskedMimicConfig {
    /// Parses `agent.model` (`node`, at config path `path`).
    pub fn from_node(node: &Node, path: &str) -> Result<Self> {
        Self::parse(node, path, MASKED_MIMIC_MODEL, &ModuleConfig::from_node)
    }

    /// Parses a MaskedMimic model config whose class is `class`, its
    /// prior, trunk and encoder by `module` (today's module classes, or an
    /// older release's: [`crate::releases`]); the other fields are the same
    /// in every release that has this model.
    pub(crate) fn parse(
        node: &Node,
        path: &str,
        class: &'static str,
        module: &dyn Fn(&Node, &str) -> Result<ModuleConfig>,
    ) -> Result<Self> {
        let o = Obj::new(node, path)?;
        let target = o.string("_target_")?;
        if target != class {
            return Err(PolicyError::UnsupportedClass { path: path.to_owned(), class: target, supported: vec![class] });
        }
        o.get("in_keys");
        o.get("out_keys");
        o.get("optimizer");
        let prior = module(o.req("prior")?, &o.sub("prior"))?;
        let trunk = module(o.req("trunk")?, &o.sub("trunk"))?;
        let encoder = module(o.req("encoder")?, &o.sub("encoder"))?;
        let needs = "the prior names two out_keys: mu, then logvar";
        let prior_out = match prior.out_keys() {
            [mu, logvar] => (mu.clone(), logvar.clone()),
            other => {
                return Err(PolicyError::BadField {
                    path: o.sub("prior"),
                    field: "out_keys".into(),
                    problem: FieldProblem::Count { found: other.len(), needs },
                })
            }
        };
        if !trunk.in_keys().iter().any(|k| k == VAE_LATENT_KEY) {
            return Err(PolicyError::BadField {
                path: o.sub("trunk"),
                field: "in_keys".into(),
                problem: FieldProblem::NotAnInKey {
                    key: VAE_LATENT_KEY.into(),
                    needs: "the trunk decodes the latent it reads there",
                },
            });
        }
        let vae_path = o.sub("vae");
        let vae = Obj::new(o.req("vae")?, &vae_path)?;
        vae.get("kld_schedule"); // training only
        let latent_dim = match vae.get("vae_latent_dim") {
            None => 64,
            Some(_) => vae.count("vae_latent_dim")?,
        };
        let noise_type = match vae.get("vae_noise_type") {
            None => VaeNoiseType::Normal,
            Some(n) => {
                // an enum member pickles as the class applied to its value
                let name = match n {
                    Node::Str(s) => Some(s.clone()),
                    Node::Object(obj) => match &obj.args {
                        Node::Tuple(a) => match a.as_slice() {
                            [Node::Str(s)] => Some(s.clone()),
                            _ => None,
                        },
                        _ => None,
                    },
                    _ => None,
                };
                match name.as_deref().map(str::to_lowercase).as_deref() {
                    Some("normal") => VaeNoiseType::Normal,
                    Some("uniform") => VaeNoiseType::Uniform,
                    Some("zeros") => VaeNoiseType::Zeros,
                    _ => return Err(vae.wrong_type("vae_noise_type", "normal, uniform or zeros", n)),
                }
            }
        };
        vae.finish()?;
        o.finish()?;
        Ok(MaskedMimicConfig { prior, prior_out, trunk, encoder, latent_dim, noise_type })
    }
}

/// A MaskedMimic model ready to run.
#[derive(Debug, Clone)]
pub struct MaskedMimic {
    /// Its config.
    pub config: MaskedMimicConfig,
    /// `_prior`.
    pub prior: Network,
    /// `_trunk`.
    pub trunk: Network,
    /// Widths the weights fix.
    pub widths: Widths,
    device: Device,
    checkpoint: String,
    /// Globals let through by [`LoadOptions`] (empty unless allowed).
    allowed_globals: Vec<crate::AllowedGlobal>,
    /// The older release whose layout it was read from (`None`: today's).
    release: Option<Release>,
}

/// What one forward computes.
#[derive(Debug, Clone)]
pub struct MaskedMimicOutputs {
    /// The action (`action`: the trunk's output), `[B, A]`.
    pub mean_action: Tensor,
    /// The prior's mean, `[B, latent]`.
    pub latent_mu: Tensor,
    /// The prior's log variance, `[B, latent]`.
    pub latent_logvar: Tensor,
    /// `mu + exp(0.5 * logvar) * noise`, `[B, latent]`.
    pub latent: Tensor,
    /// Every named tensor of the forward (tokens, `transformer_out`, ...), for checks.
    pub stages: TensorMap,
    /// Each normalizer's output, by module path, in forward order.
    pub normalized: Vec<(String, Tensor)>,
}

impl MaskedMimic {
    /// Loads the checkpoint and its resolved configs (next to it, or `config`).
    pub fn load(checkpoint: impl AsRef<Path>, config: Option<&Path>, device: &Device) -> Result<Self> {
        Self::load_with(checkpoint, config, device, &LoadOptions::default())
    }

    /// [`MaskedMimic::load`] with options (unsafe globals are refused unless allowed).
    pub fn load_with(
        checkpoint: impl AsRef<Path>,
        config: Option<&Path>,
        device: &Device,
        opts: &LoadOptions,
    ) -> Result<Self> {
        let o = crate::load::open_vetted(checkpoint.as_ref(), config, opts, |configs| {
            let (node, key) = crate::load::model_node(configs)?;
            MaskedMimicConfig::from_node(node, &key)
        })?;
        let mut m = Self::from_parts(o.model, &o.ckpt, device)?;
        m.widths.components = crate::obs_widths::observation_widths(&o.configs);
        m.allowed_globals = o.allowed;
        Ok(m)
    }

    /// The globals [`LoadOptions`] let through (empty by default: they are refused).
    pub fn allowed_globals(&self) -> &[crate::AllowedGlobal] {
        &self.allowed_globals
    }

    /// Builds the prior and trunk of `config` with the weights of `checkpoint`.
    pub fn from_parts(config: MaskedMimicConfig, checkpoint: &Checkpoint, device: &Device) -> Result<Self> {
        let dict = state_dict_name(checkpoint);
        let base = "agent.model";
        let prior = Network::load(&config.prior, checkpoint, dict, "_prior", &format!("{base}.prior"), device)?;
        let trunk = Network::load(&config.trunk, checkpoint, dict, "_trunk", &format!("{base}.trunk"), device)?;
        Self::from_networks(config, prior, trunk, checkpoint, device, None)
    }

    /// The model of `config` with its prior and trunk built (from the
    /// weights of `checkpoint`), read from `release`'s layout (`None`: today's).
    pub(crate) fn from_networks(
        config: MaskedMimicConfig,
        prior: Network,
        trunk: Network,
        checkpoint: &Checkpoint,
        device: &Device,
        release: Option<Release>,
    ) -> Result<Self> {
        let base = "agent.model";
        let widths = Widths::analyse(&[&prior, &trunk]);
        for key in [&config.prior_out.0, &config.prior_out.1] {
            if let Some(&w) = widths.known.get(key) {
                if w != config.latent_dim {
                    return Err(PolicyError::BadField {
                        path: format!("{base}.vae"),
                        field: "vae_latent_dim".into(),
                        problem: FieldProblem::Mismatch {
                            value: config.latent_dim,
                            other: "the prior's head width",
                            other_value: w,
                        },
                    });
                }
            }
        }
        Ok(MaskedMimic {
            config,
            prior,
            trunk,
            widths,
            device: device.clone(),
            checkpoint: checkpoint.path_str().into(),
            allowed_globals: Vec::new(),
            release,
        })
    }

    /// The older release whose layout it was read from (`None`: today's).
    pub fn release(&self) -> Option<Release> {
        self.release
    }

    /// The model class its configs name (today's, or the release's).
    pub fn model_class(&self) -> &'static str {
        self.release.map_or(MASKED_MIMIC_MODEL, Release::masked_mimic_class)
    }

    /// Sets the globals let through (the release loader reads the files itself).
    pub(crate) fn set_allowed_globals(&mut self, allowed: Vec<crate::AllowedGlobal>) {
        self.allowed_globals = allowed;
    }

    /// The checkpoint it was loaded from.
    pub fn checkpoint_path(&self) -> &str {
        &self.checkpoint
    }

    /// The device it runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The observations it reads (prior's, then the trunk's other than the latent).
    pub fn in_keys(&self) -> Vec<String> {
        let mut out = self.prior.external_keys();
        for k in self.trunk.external_keys() {
            if k != VAE_LATENT_KEY && !out.contains(&k) {
                out.push(k);
            }
        }
        out
    }

    /// The action width, when the weights fix it.
    pub fn action_size(&self) -> Option<usize> {
        self.widths.known.get(self.trunk.out_key()).copied()
    }

    /// `obs` as the forward reads it: an older release's model takes bool
    /// observations (candle's u8; the env's masks are bool) as torch
    /// promotes them, 1.0 where nonzero; today's takes float32 only.
    pub(crate) fn inputs<'a>(&self, obs: &'a HashMap<String, Tensor>) -> Result<Cow<'a, HashMap<String, Tensor>>> {
        if self.release.is_none() || obs.values().all(|t| t.dtype() != DType::U8) {
            return Ok(Cow::Borrowed(obs));
        }
        let mut out = HashMap::with_capacity(obs.len());
        for (k, t) in obs {
            let t = match t.dtype() {
                DType::U8 => t.ne(0u8)?.to_dtype(DType::F32)?,
                _ => t.clone(),
            };
            out.insert(k.clone(), t);
        }
        Ok(Cow::Owned(out))
    }

    pub(crate) fn check(&self, obs: &HashMap<String, Tensor>) -> Result<usize> {
        let required = self.in_keys();
        let mut accepted = required.clone();
        accepted.push(VAE_NOISE_KEY.into());
        let optional = [(VAE_NOISE_KEY, self.config.latent_dim)];
        let keys = ObsKeys { accepted: &accepted, required: &required, optional: &optional, known: &self.widths.known };
        check_obs(obs, &keys)
    }

    /// `forward_inference`: prior, latent, trunk. `obs` holds
    /// [`MaskedMimic::in_keys`] (float32 `[B, W]`) and optionally
    /// `vae_noise` (`[B, vae_latent_dim]`; zero when absent).
    pub fn forward(&self, obs: &HashMap<String, Tensor>) -> Result<MaskedMimicOutputs> {
        let obs = self.inputs(obs)?;
        let obs = obs.as_ref();
        let batch = self.check(obs)?;
        let mut td: TensorMap =
            obs.iter().map(|(k, v)| Ok((k.clone(), v.to_device(&self.device)?))).collect::<Result<_>>()?;
        let mut trace = Trace::default();
        self.prior.forward(&mut td, &mut trace)?;
        let written = |td: &TensorMap, key: &str, path: &str| -> Result<Tensor> {
            td.get(key).cloned().ok_or_else(|| PolicyError::Graph {
                path: path.into(),
                problem: GraphProblem::Unwritten { key: key.into() },
            })
        };
        let mu = written(&td, &self.config.prior_out.0, "agent.model.prior")?;
        let logvar = written(&td, &self.config.prior_out.1, "agent.model.prior")?;
        let latent = match td.get(VAE_NOISE_KEY) {
            // mean + exp(0.5 * logvar) * noise, in torch's order
            Some(noise) => (&mu + (logvar.affine(0.5, 0.0)?.exp()? * noise)?)?,
            // zero noise: the product is +-0 and mu + 0 is mu (also for -0)
            None => {
                (&mu + (logvar.affine(0.5, 0.0)?.exp()?
                    * Tensor::zeros((batch, mu.dims()[1]), DType::F32, &self.device)?)?)?
            }
        };
        td.insert(VAE_LATENT_KEY.into(), latent.clone());
        self.trunk.forward(&mut td, &mut trace)?;
        let mean_action = written(&td, self.trunk.out_key(), "agent.model.trunk")?;
        Ok(MaskedMimicOutputs {
            mean_action,
            latent_mu: mu,
            latent_logvar: logvar,
            latent,
            stages: td,
            normalized: trace.norm_outputs,
        })
    }
}

/// The dict of `checkpoint` holding the state dict (`model`), or `""` for a
/// bare state dict.
pub(crate) fn state_dict_name(checkpoint: &Checkpoint) -> &'static str {
    match checkpoint.get("model") {
        Some(Node::Dict(_)) => "model",
        _ => "",
    }
}
