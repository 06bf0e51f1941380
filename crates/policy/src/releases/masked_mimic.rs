//! MaskedMimic of ProtoMotions v3.0 and v3.1
//! (`protomotions.agents.masked_mimic.model.MaskedMimicModel`), read into
//! [`MaskedMimic`]: the same inference as today's (prior, latent
//! `mu + exp(0.5 * logvar) * vae_noise`, trunk; v3.0 has no
//! `forward_inference`, and its `forward`'s `action` is that same prior
//! path), from either release's module layout ([`Release::of_targets`]).
//!
//! What differs from today's, and is kept: v3.0's module tree ([`V30Module`]:
//! its config paths and state-dict keys), Welford normalizers
//! (no `norm_ema_decay`), and the releases' `Transformer`, whose masks must
//! have one entry per token ([`MaskRule::PerToken`]). Bool observations
//! (the env's masks) are read as torch promotes them.

use std::path::Path;

use candle_core::Device;
use pmstate_ckpt::Checkpoint;

use super::v30::V30Module;
use super::{welford, Release, MASKED_MIMIC_V3};
use crate::config::ModuleConfig;
use crate::config_object::Obj;
use crate::error::{OlderRelease, PolicyError, Result};
use crate::load::{open_vetted, LoadOptions};
use crate::masked_mimic::{state_dict_name, MaskedMimic, MaskedMimicConfig};
use crate::network::{MaskRule, Network};
use crate::served::{LoadError, Model, ModelOptions, PinError, PinProblem};
use crate::MaskedMimicModel;

/// A release's MaskedMimic config: the model's, its release, and (v3.0)
/// the prior's and trunk's module trees, whose names its weights use.
#[derive(Debug, Clone)]
pub struct ReleaseConfig {
    /// The model config (modules as today's that compute the same).
    pub config: MaskedMimicConfig,
    /// The release whose layout it has.
    pub release: Release,
    /// v3.0's prior and trunk trees (`None` for v3.1, whose modules are today's).
    pub v30: Option<(V30Module, V30Module)>,
}

impl ReleaseConfig {
    /// Parses `agent.model` (`node` at config path `path`) of the configs
    /// file `file` (named by the refusal of a layout neither release has).
    pub fn from_node(node: &pmstate_ckpt::Node, path: &str, file: &str) -> Result<Self> {
        let targets = super::targets(node);
        let Some(release) = Release::of_targets(&targets) else {
            let supported = crate::served::registry::FAMILIES.iter().map(|f| f.model).collect();
            return Err(PolicyError::OlderRelease(Box::new(OlderRelease {
                file: file.to_owned(),
                path: path.to_owned(),
                class: MASKED_MIMIC_V3.to_owned(),
                layout: "v3.0/v3.1 layout without SequentialModule or ModuleContainer",
                supported,
            })));
        };
        match release {
            Release::V31 => {
                let module = |n: &pmstate_ckpt::Node, p: &str| -> Result<ModuleConfig> {
                    let mut m = ModuleConfig::from_node(n, p)?;
                    welford(&mut m);
                    Ok(m)
                };
                let config = MaskedMimicConfig::parse(node, path, MASKED_MIMIC_V3, &module)?;
                Ok(ReleaseConfig { config, release, v30: None })
            }
            Release::V30 => {
                let module = |n: &pmstate_ckpt::Node, p: &str| V30Module::from_node(n, p).map(|m| m.to_config());
                let config = MaskedMimicConfig::parse(node, path, MASKED_MIMIC_V3, &module)?;
                // parsed above with every check: the trees again, for their names
                let o = Obj::new(node, path)?;
                let prior = V30Module::from_node(o.req("prior")?, &o.sub("prior"))?;
                let trunk = V30Module::from_node(o.req("trunk")?, &o.sub("trunk"))?;
                Ok(ReleaseConfig { config, release, v30: Some((prior, trunk)) })
            }
        }
    }
}

/// Loads a v3.0 or v3.1 MaskedMimic checkpoint with its resolved configs
/// (next to it, or `config`); unsafe globals refused unless `opts` allow them.
pub fn load_with(
    checkpoint: impl AsRef<Path>,
    config: Option<&Path>,
    device: &Device,
    opts: &LoadOptions,
) -> Result<MaskedMimic> {
    let o = open_vetted(checkpoint.as_ref(), config, opts, |configs| {
        let (node, key) = crate::load::model_node(configs)?;
        ReleaseConfig::from_node(node, &key, configs.path_str())
    })?;
    let mut m = from_parts(o.model, &o.ckpt, device)?;
    m.widths.components = crate::obs_widths::observation_widths(&o.configs);
    m.set_allowed_globals(o.allowed);
    Ok(m)
}

/// [`load_with`] with the default options.
pub fn load(checkpoint: impl AsRef<Path>, config: Option<&Path>, device: &Device) -> Result<MaskedMimic> {
    load_with(checkpoint, config, device, &LoadOptions::default())
}

/// Builds the prior and trunk of a release's `config` with the weights of `checkpoint`.
pub fn from_parts(config: ReleaseConfig, checkpoint: &Checkpoint, device: &Device) -> Result<MaskedMimic> {
    let ReleaseConfig { config, release, v30 } = config;
    let dict = state_dict_name(checkpoint);
    let (mut prior, mut trunk) = match &v30 {
        Some((prior, trunk)) => {
            (prior.load(checkpoint, dict, "_prior", device)?, trunk.load(checkpoint, dict, "_trunk", device)?)
        }
        None => (
            Network::load(&config.prior, checkpoint, dict, "_prior", "agent.model.prior", device)?,
            Network::load(&config.trunk, checkpoint, dict, "_trunk", "agent.model.trunk", device)?,
        ),
    };
    for net in [&mut prior, &mut trunk] {
        net.set_mask_rule(MaskRule::PerToken(release.name()));
    }
    MaskedMimic::from_networks(config, prior, trunk, checkpoint, device, Some(release))
}

/// The registry's loader of v3.0/v3.1 MaskedMimic checkpoints; `--width`
/// pins do not apply (its widths are the checkpoint's and its reshapes').
pub(crate) fn load_model(
    checkpoint: &Path,
    config: &Path,
    device: &Device,
    opts: &ModelOptions,
) -> std::result::Result<Box<dyn Model>, LoadError> {
    if let Some((key, _)) = opts.pins.first() {
        let problem = PinProblem::NotPinnable { model: MASKED_MIMIC_V3 };
        return Err(PinError { key: key.clone(), problem }.into());
    }
    let model = load_with(checkpoint, Some(config), device, &LoadOptions { globals: opts.globals })?;
    Ok(Box::new(MaskedMimicModel::new(model, Some(config.display().to_string()))?))
}
