//! The registry: which model class a checkpoint's configs name, and which
//! family loads it. The only place that decides a family.

use std::path::Path;

use candle_core::Device;

use super::{Model, PinError};
use crate::config::{AMP_MODEL, MASKED_MIMIC_MODEL, PPO_MODEL};
use crate::error::PolicyError;
use crate::gpc::config::LATENT_PRIOR_MODEL;
use crate::load::{find_config, model_target, Globals};

/// How [`load`] reads a checkpoint.
#[derive(Debug, Clone, Default)]
pub struct ModelOptions {
    /// Unexpected globals refused, or let through (and recorded).
    pub globals: Globals,
    /// Widths fixed where the checkpoint leaves them open (`--width KEY=N`;
    /// a PPO/AMP policy's summed observations). Families whose widths are
    /// all the checkpoint's refuse any.
    pub pins: Vec<(String, usize)>,
}

/// Why [`load`] could not build the model (exhaustive: a consumer mapping
/// it into its own errors is told of a new variant by the compiler).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Reading or building the model failed.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A `--width` pin the checkpoint contradicts, or a family that takes none.
    #[error(transparent)]
    Pin(#[from] PinError),
    /// A GPC prior whose one row makes more logits than a forward may hold.
    #[error(
        "{path}: one row makes {per_row} logits (tokens x vocabulary), over the limit of {limit} a forward holds \
         (MAX_LOGITS_PER_FORWARD)"
    )]
    TooManyLogits {
        /// The checkpoint.
        path: String,
        /// Logits of one row.
        per_row: usize,
        /// The limit.
        limit: usize,
    },
}

/// Builds a family's model from a checkpoint and its resolved configs file.
pub type Loader = fn(&Path, &Path, &Device, &ModelOptions) -> Result<Box<dyn Model>, LoadError>;

/// One family: the model class (the configs' `agent.model._target_`) and its loader.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    /// The class ProtoMotions names.
    pub model: &'static str,
    /// Its loader.
    pub load: Loader,
}

/// Every family, by the class its configs name. A new family is one line
/// here and its own module.
pub const FAMILIES: &[Family] = &[
    Family { model: PPO_MODEL, load: crate::served_policy::load },
    Family { model: AMP_MODEL, load: crate::served_policy::load },
    Family { model: MASKED_MIMIC_MODEL, load: crate::served_masked_mimic::load },
    Family { model: LATENT_PRIOR_MODEL, load: crate::gpc::served::load },
];

/// The family of the class `model`.
pub fn family(model: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.model == model)
}

/// Reads `checkpoint` with its resolved configs (`config`, else the file
/// next to it: [`find_config`]) and builds its model, whatever its family.
/// Configs naming no known class are read as a policy, whose errors say
/// what is wrong (the classes supported, the field at fault).
pub fn load(
    checkpoint: &Path,
    config: Option<&Path>,
    device: &Device,
    opts: &ModelOptions,
) -> Result<Box<dyn Model>, LoadError> {
    let config = find_config(checkpoint, config)?;
    let target = pmstate_ckpt::Checkpoint::open(&config).ok().and_then(|c| model_target(&c).ok());
    let load = target.as_deref().and_then(family).map_or(crate::served_policy::load as Loader, |f| f.load);
    load(checkpoint, &config, device, opts)
}
