//! The registry: which model class a checkpoint's configs name, and which
//! family loads it. The only place that decides a family.

use std::path::Path;

use candle_core::Device;

use super::{Model, PinError};
use crate::config::{AMP_MODEL, MASKED_MIMIC_MODEL, PPO_MODEL};
use crate::error::{OlderRelease, PolicyError};
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

/// Older releases' model classes (v3.0 and v3.1 built MaskedMimic in
/// `protomotions.agents.masked_mimic.model`, from `SequentialModule`,
/// `Flatten` and `MultiOutputModule` in v3.0 and from `ObsProcessor` and
/// `ModuleContainer` in v3.1; today's lives in `agents.supervised`).
pub const OLDER_CLASSES: &[OlderClass] = &[OlderClass {
    model: "protomotions.agents.masked_mimic.model.MaskedMimicModel",
    layouts: &[
        ("protomotions.agents.common.common.SequentialModule", "v3.0 layout (SequentialModule)"),
        ("protomotions.agents.common.common.ModuleContainer", "v3.1 layout (ObsProcessor, ModuleContainer)"),
    ],
    otherwise: "v3.0/v3.1 layout",
}];

/// Reads `checkpoint` with its resolved configs (`config`, else the file
/// next to it: [`find_config`]) and builds its model, whatever its family.
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

/// Every `_target_` string under the configs' model (its modules' classes).
fn model_targets(configs: &pmstate_ckpt::Checkpoint) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok((node, _)) = crate::load::model_node(configs) {
        collect_targets(node, 0, &mut out);
    }
    out
}

/// Most levels walked: a model config nests a few dozen deep; a hostile
/// one deeper is cut short (the walk only names a layout).
const MAX_DEPTH: usize = 64;

fn collect_targets(node: &pmstate_ckpt::Node, depth: usize, out: &mut Vec<String>) {
    use pmstate_ckpt::Node;
    if depth > MAX_DEPTH {
        return;
    }
    match node {
        Node::Dict(d) => {
            for (k, v) in d.entries() {
                match (k, v) {
                    (Node::Str(k), Node::Str(t)) if k == "_target_" => out.push(t.clone()),
                    _ => collect_targets(v, depth + 1, out),
                }
            }
        }
        Node::List(v) | Node::Tuple(v) => v.iter().for_each(|n| collect_targets(n, depth + 1, out)),
        Node::Object(o) => {
            if let Some(s) = &o.state {
                collect_targets(s, depth + 1, out);
            }
        }
        _ => {}
    }
}
