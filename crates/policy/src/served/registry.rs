//! The registry: which model class a checkpoint's configs name, and which
//! family loads it. The only place that decides a family.

use std::path::Path;

use candle_core::Device;

use super::{Model, PinError};
use crate::config::{AMP_MODEL, MASKED_MIMIC_MODEL, PPO_MODEL};
use crate::error::{OlderRelease, PolicyError};
use crate::gpc::config::LATENT_PRIOR_MODEL;
use crate::load::{find_config, model_target, Globals};
use crate::releases::{FEED_FORWARD_V3, MASKED_MIMIC_V3};

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
    // v3.0's and v3.1's MaskedMimic, in either layout (crate::releases)
    Family { model: MASKED_MIMIC_V3, load: crate::releases::masked_mimic::load_model },
];

/// The family of the class `model`.
pub fn family(model: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.model == model)
}

/// A model class of an older release, recognised so that its refusal
/// names the release and layout it met rather than "not supported".
#[derive(Debug, Clone, Copy)]
pub struct OlderClass {
    /// The class that release's configs name.
    pub model: &'static str,
    /// The releases' layouts, by a module class only that layout uses
    /// (the first found among the model's `_target_`s decides), and the
    /// layout's name when none is found.
    pub layouts: &'static [(&'static str, &'static str)],
    /// The layout named when no module class tells.
    pub otherwise: &'static str,
}

/// Older releases' model classes that are not read. v3.0 and v3.1 named
/// MaskedMimic `protomotions.agents.masked_mimic.model.MaskedMimicModel`,
/// which is read in both layouts (a family above, [`crate::releases`]);
/// beside it they had `FeedForwardModel` (MaskedMimic without the VAE: a
/// trunk alone), built from `SequentialModule` in v3.0 and from
/// `ModuleContainer` in v3.1, which no published model uses.
pub const OLDER_CLASSES: &[OlderClass] = &[OlderClass {
    model: FEED_FORWARD_V3,
    layouts: &[
        ("protomotions.agents.common.common.SequentialModule", "v3.0 layout (SequentialModule)"),
        ("protomotions.agents.common.common.ModuleContainer", "v3.1 layout (ObsProcessor, ModuleContainer)"),
    ],
    otherwise: "v3.0/v3.1 layout",
}];

/// Reads `checkpoint` with its resolved configs (`config`, else the file
/// next to it: [`find_config`], which finds a v2.3 `config.yaml` too)
/// and builds its model, whatever its family.
/// Configs naming no known class are read as a policy, whose errors say
/// what is wrong (the field at fault, unsafe globals); a refusal of the
/// model class itself lists every family's class, and names the release
/// and layout of an older release's class ([`OLDER_CLASSES`]).
pub fn load(
    checkpoint: &Path,
    config: Option<&Path>,
    device: &Device,
    opts: &ModelOptions,
) -> Result<Box<dyn Model>, LoadError> {
    if let Some(yaml) = hydra_config(checkpoint, config) {
        return crate::v23::served::load(checkpoint, &yaml, device, opts);
    }
    let config = find_config(checkpoint, config)?;
    let configs = pmstate_ckpt::Checkpoint::open(&config).ok();
    let target = configs.as_ref().and_then(|c| model_target(c).ok());
    if let Some(f) = target.as_deref().and_then(family) {
        return (f.load)(checkpoint, &config, device, opts);
    }
    match crate::served_policy::load(checkpoint, &config, device, opts) {
        Err(LoadError::Policy(PolicyError::UnsupportedClass { path, class, .. }))
            if Some(&class) == target.as_ref() =>
        {
            let supported: Vec<&'static str> = FAMILIES.iter().map(|f| f.model).collect();
            let Some(older) = OLDER_CLASSES.iter().find(|o| o.model == class) else {
                return Err(PolicyError::UnsupportedClass { path, class, supported }.into());
            };
            let targets = configs.as_ref().map(model_targets).unwrap_or_default();
            let layout = older
                .layouts
                .iter()
                .find(|(module, _)| targets.iter().any(|t| t == module))
                .map_or(older.otherwise, |(_, layout)| layout);
            let file = config.display().to_string();
            Err(PolicyError::OlderRelease(Box::new(OlderRelease { file, path, class, layout, supported })).into())
        }
        other => other,
    }
}

/// A v2.3 Hydra `config.yaml` to read `checkpoint` with: `config`, or the
/// file [`find_config`] finds, when it is YAML. v2.3's classes share names
/// with later releases' (`PPOModel`), so the config's format, not its
/// class, decides.
fn hydra_config(checkpoint: &Path, config: Option<&Path>) -> Option<std::path::PathBuf> {
    find_config(checkpoint, config).ok().filter(|c| crate::v23::is_hydra_config(c))
}

/// Every `_target_` string under the configs' model (its modules' classes).
fn model_targets(configs: &pmstate_ckpt::Checkpoint) -> Vec<String> {
    crate::load::model_node(configs).map(|(node, _)| crate::releases::targets(node)).unwrap_or_default()
}
