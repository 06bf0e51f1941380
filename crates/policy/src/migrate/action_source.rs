//! Today's action config in a template holds tensors computed from the
//! template robot (`make_pd_action_config`: PD offsets and scales from the
//! joint limits with action scale 1, the robot's fixed gains). They drive
//! the old policy's actions only if the old robot has the same limits,
//! gains and action scale: checked here, the old value against the
//! template's, exactly (v3.1 computes the same offsets and scales from the
//! same limits, record_migrate.py g1-actions), or refused naming the key.

use pmstate_ckpt::{Checkpoint, Node};

use super::read::Old;
use super::MigrateError;

/// The joint-limit tensors the offsets and scales come from.
const LIMITS: [&str; 2] = ["robot.kinematic_info.dof_limits_lower", "robot.kinematic_info.dof_limits_upper"];
/// The gains of each joint (`robot.control.control_info[joint]`).
const GAINS: [&str; 2] = ["stiffness", "damping"];

/// Refuses unless the old robot gives the template's action config.
pub(crate) fn check(old: &Old, template: &Checkpoint, name: &'static str) -> Result<(), MigrateError> {
    let differs =
        |key: &str| MigrateError::RobotDiffers { file: old.file.clone(), key: key.to_owned(), template: name };
    // v3.1's own action scale (today's ControlConfig has none; the
    // template was built with make_pd_action_config's 1.0)
    match old.configs.get("robot.control.action_scale") {
        None | Some(Node::None) => {}
        Some(Node::Float(f)) if *f == 1.0 => {}
        Some(Node::Int(1)) => {}
        Some(_) => return Err(differs("robot.control.action_scale")),
    }
    for key in LIMITS {
        if !same_tensor(&old.configs, template, key)? {
            return Err(differs(key));
        }
    }
    let (Some(old_info), Some(today_info)) = (control_info(&old.configs), control_info(template)) else {
        return Err(differs("robot.control.control_info"));
    };
    if old_info.len() != today_info.len() {
        return Err(differs("robot.control.control_info"));
    }
    for (joint, info) in old_info.entries() {
        let j = joint.as_str().unwrap_or_default();
        for g in GAINS {
            let value = |i: Option<&Node>| i.and_then(|i| super::read::field(i, g)).and_then(number);
            if value(Some(info)).is_none() || value(Some(info)) != value(today_info.get(j)) {
                return Err(differs(&format!("robot.control.control_info.{j}.{g}")));
            }
        }
    }
    Ok(())
}

/// `robot.control.control_info`: each joint's gains, by name.
fn control_info(c: &Checkpoint) -> Option<&pmstate_ckpt::Dict> {
    c.get("robot.control.control_info").and_then(Node::as_dict)
}

/// A gain as a float (pickled as an int where the config wrote one).
fn number(n: &Node) -> Option<f64> {
    match n {
        Node::Float(f) => Some(*f),
        #[allow(clippy::cast_precision_loss)] // gains are small integers when ints
        Node::Int(i) => Some(*i as f64),
        _ => None,
    }
}

/// Whether `key` is a tensor in both files with the same dtype, shape and bytes.
fn same_tensor(old: &Checkpoint, template: &Checkpoint, key: &str) -> Result<bool, MigrateError> {
    let (Some(Node::Tensor(a)), Some(Node::Tensor(b))) = (old.get(key), template.get(key)) else {
        return Ok(false);
    };
    if a.dtype != b.dtype || a.shape != b.shape {
        return Ok(false);
    }
    Ok(old.tensor_bytes(a)? == template.tensor_bytes(b)?)
}
