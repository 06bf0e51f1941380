//! MaskedMimic ([`MaskedMimic`]) as a [`Model`]: its observations and the
//! optional `vae_noise` `[-1, latent]` (zero when left out) in;
//! `mean_action`, `latent_mu`, `latent_logvar`, `latent` out, all from one
//! forward (row-independent, so chunked and batched freely).

use std::any::Any;
use std::path::Path;

use candle_core::Device;

use crate::config::MASKED_MIMIC_MODEL;
use crate::load::{AllowedGlobal, LoadOptions};
use crate::masked_mimic::VAE_NOISE_KEY;
use crate::served::{
    by_chunks, share, Batch, Datatype, InputSpec, LoadError, Model, ModelDescription, ModelOptions, Named, OutputSpec,
    PinError, PinProblem, RunError, Signature, Source,
};
use crate::MaskedMimic;

/// A [`MaskedMimic`] model with its signature and description.
#[derive(Debug)]
pub struct MaskedMimicModel {
    model: MaskedMimic,
    config_path: Option<String>,
    signature: Signature,
    description: ModelDescription,
}

/// The registry's loader of MaskedMimic checkpoints; `--width` pins do not
/// apply (its widths are the checkpoint's and its reshapes').
pub(crate) fn load(
    checkpoint: &Path,
    config: &Path,
    device: &Device,
    opts: &ModelOptions,
) -> Result<Box<dyn Model>, LoadError> {
    if let Some((key, _)) = opts.pins.first() {
        let problem = PinProblem::NotPinnable { model: MASKED_MIMIC_MODEL };
        return Err(PinError { key: key.clone(), problem }.into());
    }
    let model = MaskedMimic::load_with(checkpoint, Some(config), device, &LoadOptions { globals: opts.globals })?;
    Ok(Box::new(MaskedMimicModel::new(model, Some(config.display().to_string()))?))
}

impl MaskedMimicModel {
    /// `model` as a [`Model`]; `config_path` names the configs file it was
    /// built from, if one was read (a model built from parts has none).
    pub fn new(model: MaskedMimic, config_path: Option<String>) -> Result<Self, LoadError> {
        let description = ModelDescription::of(&model.describe())?;
        let signature = signature(&model);
        Ok(MaskedMimicModel { model, config_path, signature, description })
    }

    /// The model.
    pub fn masked_mimic(&self) -> &MaskedMimic {
        &self.model
    }
}

fn signature(m: &MaskedMimic) -> Signature {
    let mut inputs: Vec<InputSpec> = m
        .in_keys()
        .into_iter()
        .map(|k| {
            let width = m.widths.known.get(&k).copied();
            // an older release's model takes bool observations ([`MaskedMimic::forward`])
            InputSpec { also_bool: m.release().is_some(), ..InputSpec::observation(k, width) }
        })
        .collect();
    let latent = m.config.latent_dim;
    inputs.push(InputSpec::optional(VAE_NOISE_KEY.to_owned(), latent, Datatype::Fp32, None));
    let a = m.action_size().map_or(-1, |a| a as i64);
    let l = latent as i64;
    let outputs = [("mean_action", a), ("latent_mu", l), ("latent_logvar", l), ("latent", l)]
        .into_iter()
        .map(|(name, w)| OutputSpec { name, shape: vec![-1, w], source: Source::Actor, datatype: Datatype::Fp32 })
        .collect();
    let groups = m.widths.groups.iter().map(|g| (g.path.clone(), g.keys.clone(), g.total)).collect();
    Signature {
        inputs,
        ignored: Vec::new(),
        groups,
        outputs,
        action_size: m.action_size().unwrap_or(0),
        model: m.model_class(),
        logits_per_row: None,
    }
}

impl Model for MaskedMimicModel {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn description(&self) -> &ModelDescription {
        &self.description
    }

    fn run(&self, batch: &Batch<'_>) -> Result<Vec<Named>, RunError> {
        let idx: Vec<usize> = (0..batch.segments.len()).collect();
        let out = by_chunks(batch.inputs, batch.chunk_rows, &[], |o| -> Result<Named, RunError> {
            let out = self.model.forward(o)?;
            Ok(vec![
                ("mean_action", out.mean_action),
                ("latent_mu", out.latent_mu),
                ("latent_logvar", out.latent_logvar),
                ("latent", out.latent),
            ])
        })?;
        let mut outs = vec![Vec::new(); idx.len()];
        share(batch, &idx, batch.rows(), out, &mut outs, |_| Source::Actor)?;
        Ok(outs)
    }

    fn device(&self) -> &Device {
        self.model.device()
    }

    fn config_path(&self) -> Option<&str> {
        self.config_path.as_deref()
    }

    fn allowed_globals(&self) -> &[AllowedGlobal] {
        self.model.allowed_globals()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
