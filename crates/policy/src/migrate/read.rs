//! Reading the old release's checkpoint and config tree, inertly (nothing in
//! either pickle runs), and telling which release and family it is from the
//! classes it names.

use std::path::Path;

use pmstate_ckpt::{Checkpoint, Node};

use super::tables::{PPO_AGENT, PPO_MODEL, V23_WHY, V30_WHY};
use super::MigrateError;

/// A release `migrate` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// ProtoMotions v3.0 (`protomotions.envs.mimic.config.MimicEnvConfig`).
    V30,
    /// ProtoMotions v3.1 (`ObservationComponentConfig`, `RewardComponentConfig`).
    V31,
}

impl Release {
    /// `v3.0` / `v3.1`.
    pub fn name(self) -> &'static str {
        match self {
            Release::V30 => "v3.0",
            Release::V31 => "v3.1",
        }
    }
}

/// The old configs, read.
pub(crate) struct Old {
    /// The configs file.
    pub configs: Checkpoint,
    /// Its path as given.
    pub file: String,
    /// The release its classes say.
    pub release: Release,
    /// The robot config's class.
    pub robot_class: String,
}

/// `module.name` of an object node's class.
pub(crate) fn class_of(n: &Node) -> Option<String> {
    match n {
        Node::Object(o) => o.class_name(),
        _ => None,
    }
}

/// A field of a dataclass node.
pub(crate) fn field<'a>(n: &'a Node, name: &str) -> Option<&'a Node> {
    match n {
        Node::Object(o) => o.fields().and_then(|f| f.get(name)),
        Node::Dict(d) => d.get(name),
        _ => None,
    }
}

/// The configs file next to `old_ckpt`: resolved_configs.pt (all a run
/// needs) before resolved_configs_inference.pt. A v2.3 run (Hydra's
/// `config.yaml` where v2.3's eval finds it) is refused, naming its env.
pub(crate) fn find_configs(old_ckpt: &Path) -> Result<std::path::PathBuf, MigrateError> {
    let dir = old_ckpt.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if let Some(found) =
        ["resolved_configs.pt", "resolved_configs_inference.pt"].iter().map(|n| dir.join(n)).find(|p| p.is_file())
    {
        return Ok(found);
    }
    match crate::v23::find_config(old_ckpt) {
        Some(yaml) => Err(MigrateError::NotMigratable {
            release: "v2.3",
            key: "env._target_".into(),
            class: crate::v23::env_target(&yaml).unwrap_or_else(|e| format!("(not read: {e})")),
            file: yaml.display().to_string(),
            why: V23_WHY.into(),
        }),
        None => Err(MigrateError::ConfigNotFound { checkpoint: old_ckpt.display().to_string() }),
    }
}

/// Reads the old configs and checks they are a v3.0/v3.1 PPO motion tracker.
pub(crate) fn read(configs_path: &Path) -> Result<Old, MigrateError> {
    let file = configs_path.display().to_string();
    let configs = Checkpoint::open(configs_path)?;
    let env =
        configs.get("env").ok_or_else(|| MigrateError::UnknownRelease { file: file.clone(), why: "no env".into() })?;
    let env_class = class_of(env).unwrap_or_else(|| env.kind().to_owned());
    let release = if env_class.starts_with("protomotions.envs.mimic.config.") {
        Release::V30
    } else if env_class == "protomotions.envs.base_env.config.EnvConfig" {
        component_release(env, &file)?
    } else {
        return Err(MigrateError::UnknownRelease { file, why: format!("env is {env_class}") });
    };
    let agent_target = configs.get("agent._target_").and_then(Node::as_str).unwrap_or("(none)");
    if agent_target != PPO_AGENT {
        return Err(MigrateError::NotATracker { file, key: "agent._target_".into(), found: agent_target.to_owned() });
    }
    let model_target = configs.get("agent.model._target_").and_then(Node::as_str).unwrap_or("(none)");
    if model_target != PPO_MODEL {
        return Err(MigrateError::NotATracker {
            file,
            key: "agent.model._target_".into(),
            found: model_target.to_owned(),
        });
    }
    if release == Release::V31 && configs.get("env.control_components.mimic").is_none() {
        return Err(MigrateError::NotATracker {
            file,
            key: "env.control_components.mimic".into(),
            found: "nothing (no motion to track)".into(),
        });
    }
    let robot_class = configs.get("robot").and_then(class_of).unwrap_or_else(|| "(none)".into());
    if release == Release::V30 {
        return Err(MigrateError::NotMigratable {
            file,
            release: "v3.0",
            key: "env".into(),
            class: env_class,
            why: V30_WHY.into(),
        });
    }
    Ok(Old { configs, file, release, robot_class })
}

/// v3.1 or today's, from the class of the env's observation components.
fn component_release(env: &Node, file: &str) -> Result<Release, MigrateError> {
    let comps = field(env, "observation_components").and_then(Node::as_dict);
    let first = comps.and_then(|d| d.entries().first());
    match first.map(|(k, v)| (k, class_of(v).unwrap_or_default())) {
        Some((_, c)) if c == "protomotions.envs.obs.observation_component.ObservationComponentConfig" => {
            Ok(Release::V31)
        }
        Some((k, c)) if c == "protomotions.envs.mdp_component.MdpComponent" => Err(MigrateError::AlreadyCurrent {
            file: file.to_owned(),
            key: format!("env.observation_components.{}", k.as_str().unwrap_or("?")),
            class: c,
        }),
        Some((_, c)) => Err(MigrateError::UnknownRelease {
            file: file.to_owned(),
            why: format!("env.observation_components hold {c}"),
        }),
        None => {
            Err(MigrateError::UnknownRelease { file: file.to_owned(), why: "env has no observation_components".into() })
        }
    }
}
