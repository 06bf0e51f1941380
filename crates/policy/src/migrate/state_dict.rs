//! The checkpoint: v3.1's PPO motion tracker saves the state-dict keys
//! today's `PPOModel` has (`_actor.mu.*`, `_actor.logstd`, `_critic.*`) and
//! the training state today's `load_parameters` reads (epoch, step_count,
//! run_start_time, best_evaluated_score, running_reward_norm, both
//! optimizers, the advantage EMA), so no key is renamed; the checkpoint is
//! read inertly and written again with pmstate's writer (a torch archive
//! `torch.load` reads, nothing but tensors and containers in it).

use std::path::Path;

use pmstate_ckpt::{Checkpoint, Node};

use super::report::{Action, Report};
use super::MigrateError;

/// Model-state prefixes of today's PPOModel (its `_actor` and `_critic`).
const MODEL_PREFIXES: &[&str] = &["_actor.", "_critic."];

/// Top-level keys of today's PPO checkpoint the old release does not write,
/// and what today's load does without them.
const TODAY_ONLY: &[(&str, &str)] = &[(
    "evaluator",
    "today's evaluator state (eval_count); load_parameters skips it when absent: the evaluator starts fresh",
)];

/// Reads the old checkpoint and checks its model state is today's layout.
pub(crate) fn read(old_ckpt: &Path, report: &mut Report) -> Result<Checkpoint, MigrateError> {
    let file = old_ckpt.display().to_string();
    let ckpt = Checkpoint::open(old_ckpt)?;
    let Some(Node::Dict(model)) = ckpt.get("model") else {
        return Err(MigrateError::StateDict { file, key: "model".into(), why: "no model state dict".into() });
    };
    for (k, _) in model.entries() {
        let key = k.as_str().unwrap_or_default();
        if !MODEL_PREFIXES.iter().any(|p| key.starts_with(p)) {
            return Err(MigrateError::StateDict {
                file,
                key: format!("model.{key}"),
                why: "not a key of a PPO tracker's model (_actor.*, _critic.*)".into(),
            });
        }
    }
    report
        .push("model", Action::Mapped)
        .checkpoint()
        .note(format!("{} state-dict keys, none renamed: v3.1's PPOModel keys are today's", model.len()));
    for (key, what) in TODAY_ONLY {
        if ckpt.get(key).is_none() {
            report.push(*key, Action::Defaulted).checkpoint().note(*what);
        }
    }
    Ok(ckpt)
}
