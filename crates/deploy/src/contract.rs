//! The deployment contract: what ProtoMotions' `export_bm_tracker_onnx.py`
//! writes next to its graph as `unified_pipeline.yaml` (inputs with their
//! kinds, shapes and element names; outputs; robot; gains; timing), with
//! the same fields and values, and corrections where the exporter's are
//! wrong (listed in [`CORRECTIONS`]).

use serde::Serialize;
use yaml_rust2::yaml::Hash;
use yaml_rust2::{Yaml, YamlEmitter};

/// Where this contract deliberately differs from the exporter's YAML, and why.
pub const CORRECTIONS: [&str; 6] = [
    "policy_inputs[*].output_key: a history of raw actions (historical.actions) is fed back from `actions`; the exporter tags every history `robot_action` (the PD targets)",
    "policy_inputs[*].kind of current.rigid_body_pos/rot/vel/ang_vel (body_pos, body_rot, body_vel, body_ang_vel, element names [body_names, axes]) and ground_heights (ground_height): the exporter has no descriptor for them and refuses to write the YAML of a max-coords tracker; the kinds follow its reference_motion_body_* names",
    "policy_inputs[*].source: the exporter's free-text notes on a few inputs are not reproduced (they are ProtoMotions' prose); kind and element_names carry the meaning",
    "element_names of anchor inputs: where the robot config leaves anchor_body_name null, the anchor body is named by body_names[anchor_body_index] (the exporter writes null)",
    "control.action_scale: for normalized_pd_fixed_gains_action it is the config's pd_action_scale; the exporter writes null because it looks for `action_scale`",
    "control.action_function and control.action_transform: added (the exporter does not record that `tanh` or a clamp precedes the scale)",
];

/// The contract of one pipeline.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Contract {
    /// Always `unified_pipeline`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The control period, seconds.
    pub dt: f64,
    /// Joint names, in action order.
    pub joint_names: Vec<String>,
    /// Body names.
    pub body_names: Vec<String>,
    /// Per-joint stiffness of the robot config.
    pub default_joint_stiffness: Vec<f64>,
    /// Per-joint damping.
    pub default_joint_damping: Vec<f64>,
    /// The inputs, in graph order.
    pub policy_inputs: Vec<InputEntry>,
    /// The outputs.
    pub policy_outputs: Vec<OutputEntry>,
    /// Names as the graph has them.
    #[serde(rename = "_runtime")]
    pub runtime: Runtime,
    /// Provenance.
    pub metadata: Metadata,
    /// The robot.
    pub robot: Robot,
    /// Gains and the action conversion.
    pub control: Control,
    /// Control and physics periods.
    pub timing: Timing,
    /// The reference's future steps.
    pub motion: Motion,
    /// Values an older release's configs do not hold where today's
    /// exporter reads them, taken from that release's own semantics
    /// (empty, and not written, for today's configs).
    #[serde(rename = "from_release_semantics", skip_serializing_if = "Vec::is_empty")]
    pub fallbacks: Vec<Fallback>,
}

/// One value taken from a release's own semantics rather than from the key
/// today's exporter reads: which, from where, and what it means there.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Fallback {
    /// What it is (`future_steps`, `history_steps`, `observations`, `action`).
    pub field: &'static str,
    /// The release whose semantics give it (`v3.1`).
    pub release: &'static str,
    /// The config key it was read from.
    pub key: String,
    /// How that release uses the value.
    pub semantics: &'static str,
}

impl std::fmt::Display for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: from {} {} ({})", self.field, self.release, self.key, self.semantics)
    }
}

/// One input.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct InputEntry {
    /// The input's name (the context path, sanitized).
    pub name: String,
    /// The context path.
    pub key: String,
    /// Its shape at batch 1.
    pub shape: Vec<usize>,
    /// What it holds.
    pub kind: &'static str,
    /// For a history: the output fed back into it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_key: Option<&'static str>,
    /// For a future reference: how many steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub future_steps: Option<usize>,
    /// Element names per axis.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub element_names: Option<Vec<Vec<String>>>,
}

/// One output.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct OutputEntry {
    /// Its name.
    pub name: &'static str,
    /// What it holds.
    pub kind: &'static str,
    /// Its name again (the graph's output key).
    pub key: &'static str,
    /// Its shape at batch 1.
    pub shape: Vec<usize>,
    /// Joint names, for per-joint outputs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub joint_names: Option<Vec<String>>,
}

/// Graph names.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Runtime {
    /// Input names, in order.
    pub onnx_in_names: Vec<String>,
    /// Output names, in order.
    pub onnx_out_names: Vec<String>,
    /// Input name to context path.
    pub onnx_name_to_in_key: serde_json::Map<String, serde_json::Value>,
    /// Context paths the observations bind but never read.
    pub passthrough_keys: Vec<String>,
    /// Every context path the observations bind, sorted.
    pub obs_context_keys: Vec<String>,
}

/// Provenance.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Metadata {
    /// The checkpoint, as given.
    pub checkpoint: String,
    /// How the targets are applied.
    pub control_type: &'static str,
}

/// The robot.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Robot {
    /// The MJCF asset, relative to ProtoMotions' asset root.
    pub mjcf_path: String,
    /// Bodies.
    pub num_bodies: usize,
    /// Joints.
    pub num_dofs: usize,
    /// The anchor body (`None` where the robot config leaves it unset:
    /// the anchor is then body `anchor_body_index`, 0).
    pub anchor_body_name: Option<String>,
    /// Its index.
    pub anchor_body_index: usize,
    /// The root body.
    pub root_body_name: String,
    /// Its index (0).
    pub root_body_index: usize,
    /// Body names.
    pub body_names: Vec<String>,
    /// Joint names.
    pub joint_names: Vec<String>,
}

/// Gains and the action conversion.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Control {
    /// Per-joint stiffness.
    pub stiffness: Vec<f64>,
    /// Per-joint damping.
    pub damping: Vec<f64>,
    /// Per-joint effort limits, when the robot config has them all.
    pub effort_limits: Option<Vec<f64>>,
    /// `joint_pos_targets = pd_action_offset + action_scale * transform(actions)`.
    pub action_scale: Option<Vec<f64>>,
    /// The offset.
    pub pd_action_offset: Option<Vec<f64>>,
    /// The simulator's limit on PD target acceleration.
    pub pd_target_max_accel: Option<f64>,
    /// The output filter (1: none).
    pub action_ema_alpha: f64,
    /// The action function (added).
    pub action_function: String,
    /// `none`, `tanh` or `clamp` (added).
    pub action_transform: &'static str,
}

/// Periods.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Timing {
    /// Seconds per control step.
    pub control_dt: f64,
    /// Seconds per physics step.
    pub physics_dt: f64,
    /// Physics steps per control step.
    pub decimation: usize,
}

/// The reference's future steps.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Motion {
    /// Steps ahead, in control steps.
    pub future_step_indices: Vec<usize>,
    /// The same in seconds, rounded to 6 decimals.
    pub future_dt_seconds: Vec<f64>,
}

impl Contract {
    /// The contract as YAML.
    pub fn to_yaml(&self) -> String {
        // serde_json keeps field order (preserve_order), so the YAML lists
        // fields in the exporter's order.
        let value = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        let mut out = String::new();
        let mut e = YamlEmitter::new(&mut out);
        // writing into a String cannot fail
        let _ = e.dump(&to_yaml(&value));
        out.push('\n');
        out
    }
}

/// A float as Python's `repr` writes it for the values a contract holds
/// (integral values keep their `.0`, so YAML reads them back as floats).
fn float_text(f: f64) -> String {
    if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e16 {
        format!("{f:.1}")
    } else {
        format!("{f}")
    }
}

fn to_yaml(v: &serde_json::Value) -> Yaml {
    use serde_json::Value as J;
    match v {
        J::Null => Yaml::Null,
        J::Bool(b) => Yaml::Boolean(*b),
        J::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) if !n.is_f64() => Yaml::Integer(i),
            (_, Some(f)) => Yaml::Real(float_text(f)),
            _ => Yaml::Real(n.to_string()),
        },
        J::String(s) => Yaml::String(s.clone()),
        J::Array(a) => Yaml::Array(a.iter().map(to_yaml).collect()),
        J::Object(o) => {
            let mut h = Hash::new();
            for (k, v) in o {
                h.insert(Yaml::String(k.clone()), to_yaml(v));
            }
            Yaml::Hash(h)
        }
    }
}

/// `round(x, 6)` as Python computes it for the small positive values here.
pub(crate) fn round6(x: f64) -> f64 {
    format!("{x:.6}").parse().unwrap_or(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_keep_their_point_and_round_trip() {
        assert_eq!(float_text(88.0), "88.0");
        assert_eq!(float_text(0.02), "0.02");
        assert_eq!(float_text(2.190186023712158), "2.190186023712158");
        assert_eq!(round6(8.0 * 0.02), 0.16);
    }
}
