//! [`Policy::load`]: a checkpoint and the resolved configs next to it.

use std::path::{Path, PathBuf};

use candle_core::Device;
use pmstate_ckpt::{Checkpoint, Node};

use crate::config::ModelConfig;
use crate::error::{GlobalRule, PolicyError, Result};
use crate::model::Policy;

/// Config files looked for next to a checkpoint, in order (what
/// `inference_agent.py` and `load_resolved_configs_from_checkpoint` read).
pub const CONFIG_NAMES: [&str; 2] = ["resolved_configs_inference.pt", "resolved_configs.pt"];

/// The configs file for `checkpoint`: `config` when given, else the first
/// of [`CONFIG_NAMES`] in the checkpoint's folder, else a v2.3 Hydra
/// `config.yaml` where v2.3's eval finds it ([`crate::v23::find_config`]).
pub fn find_config(checkpoint: &Path, config: Option<&Path>) -> Result<PathBuf> {
    if let Some(c) = config {
        return Ok(c.to_path_buf());
    }
    let dir = checkpoint.parent().unwrap_or(Path::new("."));
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    CONFIG_NAMES
        .iter()
        .map(|n| dir.join(n))
        .find(|p| p.is_file())
        .or_else(|| crate::v23::find_config(checkpoint))
        .ok_or_else(|| PolicyError::ConfigNotFound { checkpoint: checkpoint.display().to_string() })
}

/// The model config of a configs file: `agent.model` of a resolved-configs
/// file, or the root when the file holds a model config itself.
pub fn read_model_config(configs: &Checkpoint) -> Result<ModelConfig> {
    let (node, path) = model_node(configs)?;
    ModelConfig::from_node(node, &path)
}

/// The model config object of a resolved-configs file and its config path.
pub(crate) fn model_node(configs: &Checkpoint) -> Result<(&Node, String)> {
    for key in ["agent.model", "model"] {
        if let Some(node @ Node::Object(_)) = configs.get(key) {
            return Ok((node, key.to_owned()));
        }
    }
    match configs.root() {
        node @ Node::Object(_) => Ok((node, "agent.model".to_owned())),
        _ => Err(PolicyError::NoModelConfig { file: configs.path_str().to_owned(), path: "agent.model".into() }),
    }
}

/// The `_target_` of the model config of a resolved-configs file (which
/// family to load it as).
pub fn model_target(configs: &Checkpoint) -> Result<String> {
    let (node, path) = model_node(configs)?;
    let o = crate::config_object::Obj::new(node, &path)?;
    o.string("_target_")
}

/// Refuses the file's unsafe (or foreign config) globals unless `opts` allows them.
pub(crate) fn vet(ckpt: &Checkpoint, rule: GlobalRule, opts: &LoadOptions) -> Result<Vec<AllowedGlobal>> {
    let mut allowed = Vec::new();
    vet_globals(ckpt, rule, opts, &mut allowed)?;
    Ok(allowed)
}

/// What to do with globals a checkpoint or its configs should not hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Globals {
    /// Refuse the file ([`PolicyError::UnsafeGlobals`]). The default.
    #[default]
    Refuse,
    /// Load it anyway; [`Policy::allowed_globals`] lists what was let through.
    Allow,
}

/// How [`Policy::load_with`] reads its files.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    /// Globals outside [`pmstate_ckpt::is_safe_global`] in the checkpoint,
    /// or outside [`pmstate_ckpt::is_config_global`] in the configs.
    pub globals: Globals,
}

/// A global let through by [`Globals::Allow`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedGlobal {
    /// The file holding it.
    pub file: String,
    /// Which rule it breaks.
    pub rule: GlobalRule,
    /// Its dotted key.
    pub key: String,
    /// `module.name`.
    pub global: String,
}

/// The globals of `ckpt` that `rule` does not accept: an error under
/// [`Globals::Refuse`], else added to `allowed`.
fn vet_globals(
    ckpt: &Checkpoint,
    rule: GlobalRule,
    opts: &LoadOptions,
    allowed: &mut Vec<AllowedGlobal>,
) -> Result<()> {
    let found = match rule {
        GlobalRule::Checkpoint => ckpt.unsafe_globals(),
        GlobalRule::Config => ckpt.foreign_config_globals(),
    };
    let file = ckpt.path_str().to_owned();
    match (opts.globals, found.first()) {
        (_, None) => Ok(()),
        (Globals::Refuse, Some((key, first))) => Err(PolicyError::UnsafeGlobals {
            file,
            which: rule,
            count: found.len(),
            first: first.clone(),
            key: key.clone(),
        }),
        (Globals::Allow, Some(_)) => {
            allowed.extend(found.into_iter().map(|(key, global)| AllowedGlobal {
                file: file.clone(),
                rule,
                key,
                global,
            }));
            Ok(())
        }
    }
}

/// A checkpoint and its resolved configs, opened and vetted as every
/// family's `load_with` does, with the family's model config read from them.
pub(crate) struct Opened<T> {
    /// What `read` made of the configs.
    pub model: T,
    /// Where the configs were found.
    pub config_path: PathBuf,
    /// The configs file.
    pub configs: Checkpoint,
    /// The checkpoint.
    pub ckpt: Checkpoint,
    /// The globals `opts` let through, configs first.
    pub allowed: Vec<AllowedGlobal>,
}

/// Finds and opens the configs (next to `checkpoint`, or `config`), vets
/// their globals, reads the model config with `read`, then opens and vets
/// the checkpoint: in that order, so a bad config is reported before the
/// (larger) checkpoint is read.
pub(crate) fn open_vetted<T>(
    checkpoint: &Path,
    config: Option<&Path>,
    opts: &LoadOptions,
    read: impl FnOnce(&Checkpoint) -> Result<T>,
) -> Result<Opened<T>> {
    let config_path = find_config(checkpoint, config)?;
    if crate::v23::is_hydra_config(&config_path) {
        return Err(PolicyError::HydraConfig { file: config_path.display().to_string() });
    }
    let configs = Checkpoint::open(&config_path)?;
    let mut allowed = vet(&configs, GlobalRule::Config, opts)?;
    let model = read(&configs)?;
    let ckpt = Checkpoint::open(checkpoint)?;
    allowed.extend(vet(&ckpt, GlobalRule::Checkpoint, opts)?);
    Ok(Opened { model, config_path, configs, ckpt, allowed })
}

impl Policy {
    /// Loads the policy of a ProtoMotions checkpoint (`last.ckpt`,
    /// `inference_last.ckpt`, `score_based.ckpt`, or a safetensors copy):
    /// the model config from `config`, or by default from
    /// `resolved_configs_inference.pt` (else `resolved_configs.pt`) next
    /// to it, read inertly; weights and normalizer statistics from the
    /// checkpoint.
    ///
    /// Refuses a checkpoint holding a global torch's safe loader rejects,
    /// and configs holding one outside ProtoMotions', torch's and Python's
    /// inert builtins ([`LoadOptions::default`]); see [`Policy::load_with`].
    pub fn load(checkpoint: impl AsRef<Path>, config: Option<&Path>, device: &Device) -> Result<Self> {
        Self::load_with(checkpoint, config, device, &LoadOptions::default())
    }

    /// [`Policy::load`] with explicit options.
    pub fn load_with(
        checkpoint: impl AsRef<Path>,
        config: Option<&Path>,
        device: &Device,
        opts: &LoadOptions,
    ) -> Result<Self> {
        let o = open_vetted(checkpoint.as_ref(), config, opts, read_model_config)?;
        let mut p = Policy::from_parts(o.model, &o.ckpt, device)?;
        p.config_file = Some(o.config_path.display().to_string());
        p.widths.components = crate::obs_widths::observation_widths(&o.configs);
        p.allowed_globals = o.allowed;
        Ok(p)
    }

    /// The globals [`Globals::Allow`] let through when this policy was
    /// loaded (empty otherwise), for the caller to report.
    pub fn allowed_globals(&self) -> &[AllowedGlobal] {
        &self.allowed_globals
    }
}
