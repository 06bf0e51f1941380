//! Context paths (`current.dof_pos`, `mimic.future_anchor_rot`, ...): what
//! ProtoMotions' observation components read from its `EnvContext`, and
//! what the exported pipeline takes as inputs. Each known path has a shape
//! (per batch row) and a descriptor for the deployment contract.

/// The robot and motion sizes the context shapes depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    /// Joints (`kinematic_info.num_dofs`).
    pub num_dofs: usize,
    /// Rigid bodies (`kinematic_info.body_names`).
    pub num_bodies: usize,
    /// Future reference steps the mimic control provides (`future_steps`).
    pub future_steps: usize,
    /// Past steps the historical context holds.
    pub history_steps: usize,
}

/// Where the tracker's references are expressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReferenceFrame {
    /// Today's and v3.1's deployment runtime: the clip rotated and moved
    /// once, at the first step, onto the robot's anchor
    /// (`init_tracker_alignment`).
    StartAligned,
    /// v3.0: the clip's own frame; its observations shift the reference by
    /// `mimic.realign_offset`, which follows the robot every step.
    ClipRealigned,
}

/// The pipeline input name of a context path, as ProtoMotions' exporter
/// sanitizes it (`.`, `[`, `]` to `_`).
pub fn input_name(path: &str) -> String {
    path.replace(['.', '[', ']'], "_")
}

/// The shape of one batch row of the context value at `path`, or `None`
/// for a path this crate does not know.
pub fn row_shape(path: &str, d: &Dims) -> Option<Vec<usize>> {
    let (nd, nb, f, h) = (d.num_dofs, d.num_bodies, d.future_steps, d.history_steps);
    Some(match path {
        "current.dof_pos" | "current.dof_vel" => vec![nd],
        "current.anchor_rot" | "current.root_rot" => vec![4],
        "current.anchor_pos"
        | "current.root_pos"
        | "current.root_vel"
        | "current.root_ang_vel"
        | "current.root_local_ang_vel"
        | "mimic.ref_anchor_pos" => vec![3],
        "current.rigid_body_pos" | "current.rigid_body_vel" | "current.rigid_body_ang_vel" => vec![nb, 3],
        "current.rigid_body_rot" => vec![nb, 4],
        "historical.processed_actions" | "historical.actions" | "historical.buffered_actions" => vec![h, nd],
        "historical.dof_pos" | "historical.dof_vel" => vec![h, nd],
        "historical.anchor_rot" | "historical.root_rot" => vec![h, 4],
        "historical.root_local_ang_vel" | "historical.root_ang_vel" => vec![h, 3],
        // v3.0: the xy the reference is shifted by, the motion clock
        "mimic.realign_offset" => vec![2],
        "mimic.motion_time" | "mimic.motion_length" => vec![1],
        "mimic.future_anchor_rot" => vec![f, 4],
        "mimic.future_anchor_pos" | "mimic.future_anchor_vel" | "mimic.future_anchor_ang_vel" => vec![f, 3],
        "mimic.future_dof_pos" | "mimic.future_dof_vel" => vec![f, nd],
        "mimic.future_rot" => vec![f, nb, 4],
        "mimic.future_pos" | "mimic.future_vel" | "mimic.future_ang_vel" => vec![f, nb, 3],
        "ground_heights" => vec![],
        _ => return None,
    })
}

/// The context path of a v3.1 context key (`BaseEnv`'s context dict and
/// `MimicControl.get_context`: `current_state_dof_pos`,
/// `mimic_ref_anchor_rot`, `historical_dof_pos`, ...), or `None` for a key
/// with no counterpart here.
///
/// `noisy_` keys are the same readings: observation noise is a training
/// randomization (`apply_observation_noise`), and a robot's sensors are
/// what they are. v3.1's `mimic_ref_*` are the future references at steps
/// 1..=N (today's `mimic.future_*`); its `historical_*` are the past steps
/// of its `StateHistoryBuffer`, most recent first; its `historical_actions`
/// (`historical.buffered_actions`) are the buffer's actions, which lag the
/// state by one step (see `Feedback::BufferedActions`).
pub fn v31_context_path(key: &str) -> Option<&'static str> {
    let key = key.strip_prefix("noisy_").unwrap_or(key);
    Some(match key {
        "current_state_dof_pos" => "current.dof_pos",
        "current_state_dof_vel" => "current.dof_vel",
        "current_state_anchor_rot" => "current.anchor_rot",
        "current_state_anchor_pos" => "current.anchor_pos",
        "current_state_root_local_ang_vel" => "current.root_local_ang_vel",
        "current_state_root_rot" => "current.root_rot",
        "current_state_root_pos" => "current.root_pos",
        "current_state_rigid_body_pos" => "current.rigid_body_pos",
        "current_state_rigid_body_rot" => "current.rigid_body_rot",
        "current_state_rigid_body_vel" => "current.rigid_body_vel",
        "current_state_rigid_body_ang_vel" => "current.rigid_body_ang_vel",
        "ground_heights_beneath_root" => "ground_heights",
        "mimic_ref_anchor_rot" => "mimic.future_anchor_rot",
        "mimic_ref_anchor_pos" => "mimic.future_anchor_pos",
        "mimic_ref_anchor_vel" => "mimic.future_anchor_vel",
        "mimic_ref_anchor_ang_vel" => "mimic.future_anchor_ang_vel",
        "mimic_ref_dof_pos" => "mimic.future_dof_pos",
        "mimic_ref_dof_vel" => "mimic.future_dof_vel",
        "mimic_ref_pos" => "mimic.future_pos",
        "mimic_ref_rot" => "mimic.future_rot",
        "mimic_ref_vel" => "mimic.future_vel",
        "mimic_ref_ang_vel" => "mimic.future_ang_vel",
        "historical_dof_pos" => "historical.dof_pos",
        "historical_dof_vel" => "historical.dof_vel",
        "historical_anchor_rot" => "historical.anchor_rot",
        "historical_root_rot" => "historical.root_rot",
        "historical_root_local_ang_vel" => "historical.root_local_ang_vel",
        "historical_actions" => "historical.buffered_actions",
        _ => return None,
    })
}

/// A context path that holds a constant of the robot rather than a
/// tensor: ProtoMotions' `EnvContext` (and the exporter's `MockContext`)
/// hold ints there, which `ObservationExportModule` turns into constants
/// of the graph, so they are neither inputs nor context keys of the
/// contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Constant {
    /// `current.anchor_idx`, `mimic.anchor_idx`: the robot config's
    /// `anchor_body_index`.
    AnchorIndex,
}

/// The constant a context path holds, or `None` for a tensor path.
pub fn constant(path: &str) -> Option<Constant> {
    match path {
        "current.anchor_idx" | "mimic.anchor_idx" => Some(Constant::AnchorIndex),
        _ => None,
    }
}

/// Where a history input's values come from, fed back step after step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feedback {
    /// The PD targets the pipeline output (`joint_pos_targets`).
    RobotAction,
    /// The raw actions the pipeline output (`actions`).
    Actions,
    /// v3.1's `StateHistoryBuffer` actions: the actions after the env's
    /// clamp (`clamp_actions`), pushed with the state they led to, so that
    /// its `historical_actions` (slots 1.. of the buffer) start two steps
    /// back; zeros after a reset.
    BufferedActions,
}

impl Feedback {
    /// The contract's `output_key`.
    pub fn output_key(self) -> &'static str {
        match self {
            Feedback::RobotAction => "robot_action",
            Feedback::Actions | Feedback::BufferedActions => "actions",
        }
    }
}

/// What the contract says about one input: its kind, the names of its
/// elements per axis (after the batch and future-step axes), whether it
/// is a future reference, where a history is fed back from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// The contract's `kind`.
    pub kind: &'static str,
    /// Element names per axis.
    pub element_names: Option<Vec<Vec<String>>>,
    /// True for the reference's future steps (`future_steps` in the contract).
    pub future: bool,
    /// For a history of actions: which output feeds it.
    pub feedback: Option<Feedback>,
}

/// Names the descriptors use.
pub struct Names<'a> {
    /// Joint names, in action order.
    pub joints: &'a [String],
    /// Body names.
    pub bodies: &'a [String],
    /// The anchor body's name.
    pub anchor: &'a str,
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

/// The contract descriptor of `path`, following the kinds ProtoMotions'
/// `export_bm_tracker_onnx.py` writes, with corrections: a history of
/// raw actions (`historical.actions`) is fed back from `actions`, where
/// the exporter tags every history `robot_action` (the PD targets); the
/// robot's own body arrays (`current.rigid_body_*`) and `ground_heights`,
/// which the exporter cannot describe (it refuses to write the YAML), get
/// the kinds `body_pos`, `body_rot`, `body_vel`, `body_ang_vel` (named
/// after its `reference_motion_body_*`) and `ground_height`.
pub fn descriptor(path: &str, n: &Names<'_>) -> Option<Descriptor> {
    let xyz = || strs(&["x", "y", "z"]);
    let xyzw = || strs(&["x", "y", "z", "w"]);
    let anchor = || vec![n.anchor.to_owned()];
    let joints = || n.joints.to_vec();
    let bodies = || n.bodies.to_vec();
    let d = |kind, names: Option<Vec<Vec<String>>>, future| Descriptor {
        kind,
        element_names: names,
        future,
        feedback: None,
    };
    Some(match path {
        "current.dof_pos" => d("joint_pos", Some(vec![joints()]), false),
        "current.dof_vel" => d("joint_vel", Some(vec![joints()]), false),
        "current.anchor_rot" => d("anchor_rot", Some(vec![xyzw()]), false),
        "current.root_local_ang_vel" => d("local_root_ang_vel", None, false),
        "current.anchor_pos" => d("anchor_pos", Some(vec![xyz()]), false),
        "mimic.ref_anchor_pos" => d("reference_motion_anchor_pos", Some(vec![anchor(), xyz()]), false),
        "mimic.future_anchor_pos" => d("reference_motion_anchor_pos_future", Some(vec![anchor(), xyz()]), true),
        "mimic.future_anchor_rot" => d("reference_motion_anchor_rot", Some(vec![anchor(), xyzw()]), true),
        "mimic.future_anchor_vel" => d("reference_motion_anchor_vel", Some(vec![anchor(), xyz()]), true),
        "mimic.future_anchor_ang_vel" => d("reference_motion_anchor_ang_vel", Some(vec![anchor(), xyz()]), true),
        "mimic.future_dof_pos" => d("reference_motion_joint_pos", Some(vec![joints()]), true),
        "mimic.future_dof_vel" => d("reference_motion_joint_vel", Some(vec![joints()]), true),
        "mimic.future_rot" => d("reference_motion_body_rot", Some(vec![bodies(), xyzw()]), true),
        "mimic.future_pos" => d("reference_motion_body_pos_future", Some(vec![bodies(), xyz()]), true),
        "mimic.future_vel" => d("reference_motion_body_vel", Some(vec![bodies(), xyz()]), true),
        "mimic.future_ang_vel" => d("reference_motion_body_ang_vel", Some(vec![bodies(), xyz()]), true),
        "current.rigid_body_pos" => d("body_pos", Some(vec![bodies(), xyz()]), false),
        "current.rigid_body_rot" => d("body_rot", Some(vec![bodies(), xyzw()]), false),
        "current.rigid_body_vel" => d("body_vel", Some(vec![bodies(), xyz()]), false),
        "current.rigid_body_ang_vel" => d("body_ang_vel", Some(vec![bodies(), xyz()]), false),
        "ground_heights" => d("ground_height", None, false),
        "historical.processed_actions" => Descriptor {
            kind: "last_actions",
            element_names: None,
            future: false,
            feedback: Some(Feedback::RobotAction),
        },
        "historical.actions" => {
            Descriptor { kind: "last_actions", element_names: None, future: false, feedback: Some(Feedback::Actions) }
        }
        "historical.buffered_actions" => Descriptor {
            kind: "last_actions",
            element_names: None,
            future: false,
            feedback: Some(Feedback::BufferedActions),
        },
        // v3.1's state history: past readings of the same sensors, most recent first
        "historical.dof_pos" => d("joint_pos_history", Some(vec![joints()]), false),
        "historical.dof_vel" => d("joint_vel_history", Some(vec![joints()]), false),
        "historical.anchor_rot" => d("anchor_rot_history", Some(vec![xyzw()]), false),
        "historical.root_local_ang_vel" => d("local_root_ang_vel_history", Some(vec![xyz()]), false),
        // v3.0's history of the root body (bodies[0]) and its reference clock
        "historical.root_rot" => d("root_rot_history", Some(vec![xyzw()]), false),
        "historical.root_ang_vel" => d("root_ang_vel_history", Some(vec![xyz()]), false),
        "mimic.realign_offset" => d("reference_motion_realign_offset", Some(vec![strs(&["x", "y"])]), false),
        "mimic.motion_time" => d("reference_motion_time", None, false),
        "mimic.motion_length" => d("reference_motion_length", None, false),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shaped_path_but_raw_state_has_a_descriptor() {
        let d = Dims { num_dofs: 2, num_bodies: 3, future_steps: 4, history_steps: 1 };
        let joints = strs(&["a", "b"]);
        let bodies = strs(&["p", "q", "r"]);
        let n = Names { joints: &joints, bodies: &bodies, anchor: "q" };
        for p in ["current.dof_pos", "mimic.future_anchor_rot", "historical.actions", "mimic.future_rot"] {
            assert!(row_shape(p, &d).is_some(), "{p}");
            assert!(descriptor(p, &n).is_some(), "{p}");
        }
        assert_eq!(row_shape("mimic.future_rot", &d), Some(vec![4, 3, 4]));
        assert_eq!(row_shape("current.nonsense", &d), None);
        assert_eq!(input_name("mimic.future_anchor_rot"), "mimic_future_anchor_rot");
        assert_eq!(descriptor("historical.actions", &n).and_then(|d| d.feedback), Some(Feedback::Actions));
        for p in ["current.rigid_body_pos", "current.rigid_body_rot", "ground_heights"] {
            assert!(row_shape(p, &d).is_some(), "{p}");
            assert!(descriptor(p, &n).is_some(), "{p}");
        }
        assert_eq!(row_shape("current.rigid_body_rot", &d), Some(vec![3, 4]));
        assert_eq!(row_shape("ground_heights", &d), Some(vec![]));
        assert_eq!(constant("current.anchor_idx"), Some(Constant::AnchorIndex));
        assert_eq!(constant("mimic.anchor_idx"), Some(Constant::AnchorIndex));
        assert_eq!(constant("current.dof_pos"), None);
    }
}
