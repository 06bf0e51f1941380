//! [`Policy::load`]: a checkpoint and the resolved configs next to it.

use std::path::{Path, PathBuf};

use candle_core::Device;
use pmstate_ckpt::{Checkpoint, Node};

use crate::config::ModelConfig;
use crate::error::{PolicyError, Result};
use crate::model::Policy;

/// Config files looked for next to a checkpoint, in order (what
/// `inference_agent.py` and `load_resolved_configs_from_checkpoint` read).
pub const CONFIG_NAMES: [&str; 2] = ["resolved_configs_inference.pt", "resolved_configs.pt"];

/// The configs file for `checkpoint`: `config` when given, else the first
/// of [`CONFIG_NAMES`] in the checkpoint's folder.
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
        .ok_or_else(|| PolicyError::ConfigNotFound { checkpoint: checkpoint.display().to_string() })
}

/// The model config of a configs file: `agent.model` of a resolved-configs
/// file, or the root when the file holds a model config itself.
pub fn read_model_config(configs: &Checkpoint) -> Result<ModelConfig> {
    for key in ["agent.model", "model"] {
        if let Some(node @ Node::Object(_)) = configs.get(key) {
            return ModelConfig::from_node(node, key);
        }
    }
    match configs.root() {
        node @ Node::Object(_) => ModelConfig::from_node(node, "agent.model"),
        _ => Err(PolicyError::NoModelConfig { file: configs.path_str().to_owned(), path: "agent.model".into() }),
    }
}

impl Policy {
    /// Loads the policy of a ProtoMotions checkpoint (`last.ckpt`,
    /// `inference_last.ckpt`, `score_based.ckpt`, or a safetensors copy):
    /// the model config from `config`, or by default from
    /// `resolved_configs_inference.pt` (else `resolved_configs.pt`) next
    /// to it, read inertly; weights and normalizer statistics from the
    /// checkpoint.
    pub fn load(checkpoint: impl AsRef<Path>, config: Option<&Path>, device: &Device) -> Result<Self> {
        let checkpoint = checkpoint.as_ref();
        let config_path = find_config(checkpoint, config)?;
        let configs = Checkpoint::open(&config_path)?;
        let model = read_model_config(&configs)?;
        let ckpt = Checkpoint::open(checkpoint)?;
        let mut p = Policy::from_parts(model, &ckpt, device)?;
        p.config_file = Some(config_path.display().to_string());
        Ok(p)
    }
}
