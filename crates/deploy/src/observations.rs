//! The observation functions of ProtoMotions that deployed trackers use,
//! one registry from each function's qualified Python name to its Rust
//! implementation, with ProtoMotions' formulas and output layout.
//!
//! A component of `env.observation_components` is an `MdpComponent`: a
//! pickled global naming its compute function, `dynamic_vars` binding the
//! function's arguments to context paths, and `static_params`. Which
//! arguments a function reads depends on its parameters; only those
//! become pipeline inputs, as in ProtoMotions' exported graph (where
//! `torch.onnx.export` drops the inputs nothing reads).

use crate::configs::{Params, Steps};
use crate::context::Dims;
use crate::error::{ConfigProblem, Result};
use crate::rotations::{
    calc_heading_quat_inv, projected_gravity, quat_conjugate, quat_mul, quat_rotate, quat_rotate_inverse,
    quat_to_tan_norm, Quat, Vec3,
};

/// `compute_humanoid_reduced_coords_observations`.
pub const REDUCED_COORDS: &str = "protomotions.envs.obs.humanoid.compute_humanoid_reduced_coords_observations";
/// `build_reduced_coords_target_poses`.
pub const REDUCED_COORDS_TARGET_POSES: &str = "protomotions.envs.obs.target_poses.build_reduced_coords_target_poses";
/// `compute_historical_actions_from_state`.
pub const HISTORICAL_ACTIONS: &str = "protomotions.envs.obs.humanoid_historical.compute_historical_actions_from_state";
/// `compute_humanoid_max_coords_observations`.
pub const MAX_COORDS: &str = "protomotions.envs.obs.humanoid.compute_humanoid_max_coords_observations";
/// `build_max_coords_target_poses`.
pub const MAX_COORDS_TARGET_POSES: &str = "protomotions.envs.obs.target_poses.build_max_coords_target_poses";

/// Every observation function this crate implements, by qualified name.
pub const SUPPORTED: [&str; 5] =
    [REDUCED_COORDS, REDUCED_COORDS_TARGET_POSES, HISTORICAL_ACTIONS, MAX_COORDS, MAX_COORDS_TARGET_POSES];

/// v3.1's `compute_historical_reduced_coords_from_state`: the reduced-coords
/// observation of each past step of its `StateHistoryBuffer`, concatenated.
pub const V31_HISTORICAL_REDUCED_COORDS: &str =
    "protomotions.envs.obs.humanoid_obs_functions.compute_historical_reduced_coords_from_state";
/// v3.1's `compute_historical_actions_from_state` (today's lives in `humanoid_historical`).
pub const V31_HISTORICAL_ACTIONS: &str =
    "protomotions.envs.obs.humanoid_obs_functions.compute_historical_actions_from_state";

/// The functions of v3.1's observation components (`ObservationComponentConfig`)
/// this crate implements: those its published G1 tracker's actor reads.
/// Their formulas are today's but for the parameter names (`num_steps`,
/// `num_future_steps`: the first N steps, None for all).
pub const SUPPORTED_V31: [&str; 4] =
    [REDUCED_COORDS, REDUCED_COORDS_TARGET_POSES, V31_HISTORICAL_REDUCED_COORDS, V31_HISTORICAL_ACTIONS];

/// The argument of the max-coords functions that takes the anchor body's
/// index. ProtoMotions binds it to `current.anchor_idx` /
/// `mimic.anchor_idx`, ints in the environment's context (and in the
/// exporter's mock), so it is a constant of the graph, not an input: the
/// robot config's `anchor_body_index` (see [`crate::context::constant`]).
pub const ANCHOR_BODY_INDEX: &str = "anchor_body_index";

/// Whether a function needs an argument bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// It must be bound (the reference raises, or reads it unconditionally).
    Required,
    /// Read when bound (the reference has a fallback when it is None).
    Optional,
}

/// One implemented observation function with its static parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum Function {
    /// Joint positions and velocities, local angular velocity, projected
    /// gravity (in the anchor's frame), optionally root velocity and height.
    ReducedCoords(ReducedCoords),
    /// The reference's future anchor rotations (relative to the current
    /// anchor, as tangent/normal), joint velocities and positions, and the
    /// optional offsets, per selected future step.
    ReducedCoordsTargetPoses(ReducedTargets),
    /// The selected past actions, flattened.
    HistoricalActions(HistoricalActions),
    /// Every body's position (but the anchor's), rotation (tangent/normal),
    /// velocity and angular velocity, in the anchor's heading frame, and
    /// the anchor's height above the ground.
    MaxCoords(MaxCoords),
    /// Per selected future step, every reference body's position relative
    /// to the current anchor and to the same current body, its rotation in
    /// the heading frame and relative to the current body, and optionally
    /// its velocities relative to the current body's.
    MaxCoordsTargetPoses(MaxTargets),
    /// v3.1: [`Function::ReducedCoords`] of each past step of the robot's
    /// state history (most recent first), concatenated.
    HistoricalReducedCoords(HistoricalReducedCoords),
    /// v3.0's observations, computed in code by its Mimic env ([`crate::v30`]).
    V30(crate::v30::V30Function),
}

/// Parameters of v3.1's `compute_historical_reduced_coords_from_state`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoricalReducedCoords {
    /// `num_steps`: the first N past steps (`None`: all the history holds).
    pub steps: Option<Steps>,
}

/// Parameters of `compute_humanoid_max_coords_observations`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxCoords {
    /// `local_obs`: positions, rotations and velocities in the anchor's
    /// heading frame (positions relative to the anchor); else as given.
    pub local: bool,
    /// `root_height_obs`: the anchor's height above `ground_height`; else 0.
    pub root_height: bool,
    /// `anchor_body_index` (bound to a constant; 0 when unbound).
    pub anchor: usize,
}

/// Parameters of `build_max_coords_target_poses`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaxTargets {
    /// `with_velocities`.
    pub velocities: bool,
    /// `with_relative`.
    pub relative: bool,
    /// `future_steps`: which of the context's future steps.
    pub steps: Option<Steps>,
    /// `anchor_body_index` (bound to a constant; 0 when unbound).
    pub anchor: usize,
}

/// Parameters of `compute_humanoid_reduced_coords_observations`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReducedCoords {
    /// `root_vel_obs`.
    pub root_vel: bool,
    /// `root_height_obs`.
    pub root_height: bool,
}

/// Parameters of `build_reduced_coords_target_poses`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReducedTargets {
    /// `include_dof_vel`.
    pub dof_vel: bool,
    /// `include_xy_offset`.
    pub xy_offset: bool,
    /// `zero_xy_offset`.
    pub zero_xy_offset: bool,
    /// `include_height`.
    pub height: bool,
    /// `include_anchor_vel`.
    pub anchor_vel: bool,
    /// `include_anchor_ang_vel`.
    pub anchor_ang_vel: bool,
    /// `future_steps`: which of the context's future steps.
    pub steps: Option<Steps>,
}

/// Parameters of `compute_historical_actions_from_state`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoricalActions {
    /// `history_steps`.
    pub steps: Option<Steps>,
}

impl Function {
    /// The function registered under `qualified`, built from its parameters;
    /// `Ok(None)` for a name not in [`SUPPORTED`].
    pub(crate) fn from_params(qualified: &str, p: &Params<'_>) -> Result<Option<Function>> {
        let f = match qualified {
            REDUCED_COORDS => {
                p.require_w_last()?;
                let f = Function::ReducedCoords(ReducedCoords {
                    root_vel: p.bool("root_vel_obs", false)?,
                    root_height: p.bool("root_height_obs", false)?,
                });
                p.finish(&["w_last", "root_vel_obs", "root_height_obs"])?;
                f
            }
            REDUCED_COORDS_TARGET_POSES => {
                p.require_w_last()?;
                let f = Function::ReducedCoordsTargetPoses(ReducedTargets {
                    dof_vel: p.bool("include_dof_vel", true)?,
                    xy_offset: p.bool("include_xy_offset", false)?,
                    zero_xy_offset: p.bool("zero_xy_offset", false)?,
                    height: p.bool("include_height", false)?,
                    anchor_vel: p.bool("include_anchor_vel", false)?,
                    anchor_ang_vel: p.bool("include_anchor_ang_vel", false)?,
                    steps: p.steps("future_steps")?,
                });
                p.finish(&[
                    "w_last",
                    "include_dof_vel",
                    "include_xy_offset",
                    "zero_xy_offset",
                    "include_height",
                    "include_anchor_vel",
                    "include_anchor_ang_vel",
                    "future_steps",
                ])?;
                f
            }
            HISTORICAL_ACTIONS => {
                let f = Function::HistoricalActions(HistoricalActions { steps: p.steps("history_steps")? });
                p.finish(&["history_steps"])?;
                f
            }
            MAX_COORDS => {
                p.require_w_last()?;
                // the reference's signature has no defaults for these
                let f = Function::MaxCoords(MaxCoords {
                    local: p.required_bool("local_obs")?,
                    root_height: p.required_bool("root_height_obs")?,
                    anchor: 0,
                });
                if p.required_bool("observe_contacts")? {
                    return Err(p.bad(
                        "observe_contacts",
                        ConfigProblem::Unsupported {
                            value: "True (contact flags)".into(),
                            supported: "False (what the published configs use)",
                        },
                    ));
                }
                p.finish(&["w_last", "local_obs", "root_height_obs", "observe_contacts"])?;
                f
            }
            MAX_COORDS_TARGET_POSES => {
                p.require_w_last()?;
                let f = Function::MaxCoordsTargetPoses(MaxTargets {
                    velocities: p.required_bool("with_velocities")?,
                    relative: p.bool("with_relative", true)?,
                    steps: p.steps("future_steps")?,
                    anchor: 0,
                });
                p.finish(&["w_last", "with_velocities", "with_relative", "future_steps"])?;
                f
            }
            _ => return Ok(None),
        };
        if let Function::ReducedCoordsTargetPoses(ReducedTargets { steps: Some(s), .. })
        | Function::MaxCoordsTargetPoses(MaxTargets { steps: Some(s), .. })
        | Function::HistoricalActions(HistoricalActions { steps: Some(s) }) = &f
        {
            let name = if matches!(f, Function::HistoricalActions(_)) { "history_steps" } else { "future_steps" };
            if s.needed() == 0 {
                return Err(
                    p.bad(name, ConfigProblem::Unsupported { value: "no step".into(), supported: "one step or more" })
                );
            }
        }
        Ok(Some(f))
    }

    /// The function registered under `qualified` in v3.1's layout
    /// (`ObservationComponentConfig.variables`: a string is a context key,
    /// anything else a parameter), built from its parameters; `Ok(None)`
    /// for a name not in [`SUPPORTED_V31`]. Options whose v3.1 formulas were
    /// not checked against the release (root velocity and height in the
    /// history, xy offset, height and anchor velocities of the targets) are
    /// refused, naming the parameter.
    pub(crate) fn from_v31_params(qualified: &str, p: &Params<'_>) -> Result<Option<Function>> {
        let off = |name: &str| -> Result<()> {
            if p.bool(name, false)? {
                return Err(p.bad(
                    name,
                    ConfigProblem::Unsupported {
                        value: "True".into(),
                        supported: "False (what the published v3.1 trackers use)",
                    },
                ));
            }
            Ok(())
        };
        let first = |name: &str| -> Result<Option<Steps>> {
            match p.steps(name)? {
                Some(Steps::Indices(_)) => Err(p.bad(
                    name,
                    ConfigProblem::WrongType { expected: "an int (the first N steps) or None", found: "list".into() },
                )),
                steps => Ok(steps),
            }
        };
        let f = match qualified {
            REDUCED_COORDS => {
                p.require_w_last()?;
                let f = Function::ReducedCoords(ReducedCoords {
                    root_vel: p.bool("root_vel_obs", false)?,
                    root_height: p.bool("root_height_obs", false)?,
                });
                p.finish(&["w_last", "root_vel_obs", "root_height_obs"])?;
                f
            }
            REDUCED_COORDS_TARGET_POSES => {
                p.require_w_last()?;
                for name in ["include_xy_offset", "include_height", "include_anchor_vel", "include_anchor_ang_vel"] {
                    off(name)?;
                }
                let f = Function::ReducedCoordsTargetPoses(ReducedTargets {
                    dof_vel: p.bool("include_dof_vel", true)?,
                    xy_offset: false,
                    zero_xy_offset: false,
                    height: false,
                    anchor_vel: false,
                    anchor_ang_vel: false,
                    steps: first("num_future_steps")?,
                });
                p.finish(&[
                    "w_last",
                    "include_dof_vel",
                    "include_xy_offset",
                    "include_height",
                    "include_anchor_vel",
                    "include_anchor_ang_vel",
                    "num_future_steps",
                ])?;
                f
            }
            V31_HISTORICAL_REDUCED_COORDS => {
                p.require_w_last()?;
                off("root_height_obs")?;
                off("root_vel_obs")?;
                let f = Function::HistoricalReducedCoords(HistoricalReducedCoords { steps: first("num_steps")? });
                p.finish(&["w_last", "num_steps", "root_height_obs", "root_vel_obs"])?;
                f
            }
            V31_HISTORICAL_ACTIONS => {
                let f = Function::HistoricalActions(HistoricalActions { steps: first("num_steps")? });
                p.finish(&["num_steps"])?;
                f
            }
            _ => return Ok(None),
        };
        if let Function::ReducedCoordsTargetPoses(ReducedTargets { steps: Some(s), .. })
        | Function::HistoricalReducedCoords(HistoricalReducedCoords { steps: Some(s) })
        | Function::HistoricalActions(HistoricalActions { steps: Some(s) }) = &f
        {
            if s.needed() == 0 {
                let name =
                    if matches!(f, Function::ReducedCoordsTargetPoses(_)) { "num_future_steps" } else { "num_steps" };
                return Err(p.bad(
                    name,
                    ConfigProblem::Unsupported { value: "0".into(), supported: "one step or more, or None" },
                ));
            }
        }
        Ok(Some(f))
    }

    /// The qualified name of this function.
    pub fn qualified_name(&self) -> &'static str {
        match self {
            Function::ReducedCoords(_) => REDUCED_COORDS,
            Function::ReducedCoordsTargetPoses(_) => REDUCED_COORDS_TARGET_POSES,
            Function::HistoricalActions(_) => HISTORICAL_ACTIONS,
            Function::MaxCoords(_) => MAX_COORDS,
            Function::MaxCoordsTargetPoses(_) => MAX_COORDS_TARGET_POSES,
            Function::HistoricalReducedCoords(_) => V31_HISTORICAL_REDUCED_COORDS,
            Function::V30(f) => f.qualified_name(),
        }
    }

    /// Whether the function takes [`ANCHOR_BODY_INDEX`].
    pub fn takes_anchor_index(&self) -> bool {
        matches!(self, Function::MaxCoords(_) | Function::MaxCoordsTargetPoses(_))
    }

    /// Sets the anchor body's index of a function that takes one.
    pub(crate) fn set_anchor_index(&mut self, index: usize) {
        match self {
            Function::MaxCoords(m) => m.anchor = index,
            Function::MaxCoordsTargetPoses(t) => t.anchor = index,
            _ => {}
        }
    }

    /// The arguments this function reads with its parameters.
    pub fn arguments(&self) -> Vec<(&'static str, Need)> {
        use Need::*;
        match self {
            Function::V30(f) => f.arguments(),
            Function::ReducedCoords(r) => {
                let mut v = vec![
                    ("dof_pos", Required),
                    ("dof_vel", Required),
                    ("anchor_rot", Required),
                    ("root_local_ang_vel", Required),
                ];
                if r.root_vel {
                    v.extend([("root_rot", Required), ("root_vel", Required)]);
                }
                if r.root_height {
                    v.extend([("root_pos", Required), ("ground_height", Optional)]);
                }
                v
            }
            Function::ReducedCoordsTargetPoses(t) => {
                let mut v = vec![("current_state_anchor_rot", Required), ("mimic_ref_anchor_rot", Required)];
                if t.dof_vel {
                    v.push(("mimic_ref_dof_vel", Required));
                }
                v.push(("mimic_ref_dof_pos", Required));
                if t.xy_offset && !t.zero_xy_offset {
                    v.extend([("current_state_anchor_pos", Required), ("current_ref_anchor_pos", Optional)]);
                }
                if t.height {
                    v.push(("mimic_ref_anchor_pos", Required));
                }
                if t.anchor_vel {
                    v.push(("mimic_ref_anchor_vel", Required));
                }
                if t.anchor_ang_vel {
                    v.push(("mimic_ref_anchor_ang_vel", Required));
                }
                v
            }
            Function::HistoricalActions(_) => vec![("historical_actions", Required)],
            // historical_root_rot is bound too, read only with root_vel_obs (refused)
            Function::HistoricalReducedCoords(_) => vec![
                ("historical_dof_pos", Required),
                ("historical_dof_vel", Required),
                ("historical_root_local_ang_vel", Required),
                ("historical_anchor_rot", Required),
            ],
            Function::MaxCoords(m) => {
                let mut v = vec![
                    ("body_pos", Required),
                    ("body_rot", Required),
                    ("body_vel", Required),
                    ("body_ang_vel", Required),
                ];
                if m.root_height {
                    v.push(("ground_height", Required));
                }
                v
            }
            Function::MaxCoordsTargetPoses(t) => {
                let mut v = vec![
                    ("current_state_body_pos", Required),
                    ("current_state_body_rot", Required),
                    ("mimic_ref_pos", Required),
                    ("mimic_ref_rot", Required),
                ];
                if t.velocities {
                    v.extend([
                        ("current_state_body_vel", Required),
                        ("current_state_body_ang_vel", Required),
                        ("mimic_ref_vel", Required),
                        ("mimic_ref_ang_vel", Required),
                    ]);
                }
                v
            }
        }
    }

    /// How many past steps the historical context must hold for this function.
    pub fn history_needed(&self) -> usize {
        match self {
            Function::HistoricalActions(h) => h.steps.as_ref().map_or(1, Steps::needed),
            Function::HistoricalReducedCoords(h) => h.steps.as_ref().map_or(1, Steps::needed),
            Function::V30(f) => f.history_needed(),
            _ => 0,
        }
    }

    /// The selected step positions (0-based) and the output width per row,
    /// or `None` when a selection reaches past what the context holds.
    pub fn width(&self, d: &Dims) -> Option<usize> {
        Some(match self {
            Function::V30(f) => f.width(d.num_dofs, d.num_bodies)?,
            Function::ReducedCoords(r) => 2 * d.num_dofs + 6 + 3 * usize::from(r.root_vel) + usize::from(r.root_height),
            Function::ReducedCoordsTargetPoses(t) => {
                let steps =
                    t.steps.as_ref().map_or(Some(d.future_steps), |s| s.positions(d.future_steps).map(|p| p.len()))?;
                steps * t.per_step(d.num_dofs)
            }
            Function::HistoricalActions(h) => {
                let steps = h
                    .steps
                    .as_ref()
                    .map_or(Some(d.history_steps), |s| s.positions(d.history_steps).map(|p| p.len()))?;
                steps * d.num_dofs
            }
            Function::HistoricalReducedCoords(h) => {
                let steps = h
                    .steps
                    .as_ref()
                    .map_or(Some(d.history_steps), |s| s.positions(d.history_steps).map(|p| p.len()))?;
                steps.checked_mul(2 * d.num_dofs + 6)?
            }
            Function::MaxCoords(_) => {
                // height, every body's position but the anchor's, rotation
                // (6), velocity and angular velocity
                1 + 3 * d.num_bodies.checked_sub(1)? + 12 * d.num_bodies
            }
            Function::MaxCoordsTargetPoses(t) => {
                let steps =
                    t.steps.as_ref().map_or(Some(d.future_steps), |s| s.positions(d.future_steps).map(|p| p.len()))?;
                steps.checked_mul(t.per_step(d.num_bodies))?
            }
        })
    }

    /// Computes one batch row. `arg(name)` is the row's slice of the input
    /// bound to `name` (`None` when an optional argument is unbound); `out`
    /// is the row's output, [`Function::width`] long.
    pub(crate) fn compute_row<'a>(&self, d: &Dims, arg: &dyn Fn(&str) -> Option<&'a [f32]>, out: &mut [f32]) {
        let req = |name: &str| arg(name).unwrap_or(&[]);
        match self {
            Function::ReducedCoords(r) => {
                let nd = d.num_dofs;
                let mut w = Writer::new(out);
                w.put(&req("dof_pos")[..nd]);
                w.put(&req("dof_vel")[..nd]);
                w.put(&req("root_local_ang_vel")[..3]);
                w.put(&projected_gravity(quat(req("anchor_rot"), 0)));
                if r.root_vel {
                    w.put(&quat_rotate_inverse(quat(req("root_rot"), 0), vec3(req("root_vel"), 0)));
                }
                if r.root_height {
                    let ground = arg("ground_height").map_or(0.0, |g| g[0]);
                    w.put(&[req("root_pos")[2] - ground]);
                }
            }
            Function::ReducedCoordsTargetPoses(t) => t.compute_row(d, arg, out),
            Function::V30(f) => f.compute_row(d.num_dofs, d.num_bodies, arg, out),
            Function::MaxCoords(m) => m.compute_row(d, arg, out),
            Function::MaxCoordsTargetPoses(t) => t.compute_row(d, arg, out),
            Function::HistoricalReducedCoords(h) => {
                let nd = d.num_dofs;
                let (pos, vel) = (req("historical_dof_pos"), req("historical_dof_vel"));
                let (ang, rot) = (req("historical_root_local_ang_vel"), req("historical_anchor_rot"));
                let mut w = Writer::new(out);
                for p in positions(h.steps.as_ref(), d.history_steps) {
                    w.put(&pos[p * nd..(p + 1) * nd]);
                    w.put(&vel[p * nd..(p + 1) * nd]);
                    w.put(&ang[p * 3..p * 3 + 3]);
                    w.put(&projected_gravity(quat(rot, p)));
                }
            }
            Function::HistoricalActions(h) => {
                let nd = d.num_dofs;
                let hist = req("historical_actions");
                let mut w = Writer::new(out);
                for p in positions(h.steps.as_ref(), d.history_steps) {
                    w.put(&hist[p * nd..(p + 1) * nd]);
                }
            }
        }
    }
}

impl ReducedTargets {
    fn per_step(&self, nd: usize) -> usize {
        6 + nd * (1 + usize::from(self.dof_vel))
            + 2 * usize::from(self.xy_offset)
            + usize::from(self.height)
            + 3 * usize::from(self.anchor_vel)
            + 3 * usize::from(self.anchor_ang_vel)
    }

    fn compute_row<'a>(&self, d: &Dims, arg: &dyn Fn(&str) -> Option<&'a [f32]>, out: &mut [f32]) {
        let req = |name: &str| arg(name).unwrap_or(&[]);
        let nd = d.num_dofs;
        let anchor = quat(req("current_state_anchor_rot"), 0);
        let needs_heading = (self.xy_offset && !self.zero_xy_offset) || self.anchor_vel || self.anchor_ang_vel;
        let heading_inv = if needs_heading { calc_heading_quat_inv(anchor) } else { [0.0, 0.0, 0.0, 1.0] };
        let conj = quat_conjugate(anchor);
        let mut w = Writer::new(out);
        for p in positions(self.steps.as_ref(), d.future_steps) {
            let rel = quat_mul(conj, quat(req("mimic_ref_anchor_rot"), p));
            w.put(&quat_to_tan_norm(rel));
            if self.dof_vel {
                w.put(&req("mimic_ref_dof_vel")[p * nd..(p + 1) * nd]);
            }
            w.put(&req("mimic_ref_dof_pos")[p * nd..(p + 1) * nd]);
            if self.xy_offset {
                if self.zero_xy_offset {
                    w.put(&[0.0, 0.0]);
                } else {
                    let cur = vec3(req("current_state_anchor_pos"), 0);
                    let origin = arg("current_ref_anchor_pos").map_or(cur, |o| vec3(o, 0));
                    let drift = [cur[0] - origin[0], cur[1] - origin[1], 0.0];
                    let local = quat_rotate(heading_inv, drift);
                    w.put(&local[..2]);
                }
            }
            if self.height {
                w.put(&[req("mimic_ref_anchor_pos")[p * 3 + 2]]);
            }
            if self.anchor_vel {
                w.put(&quat_rotate(heading_inv, vec3(req("mimic_ref_anchor_vel"), p)));
            }
            if self.anchor_ang_vel {
                w.put(&quat_rotate(heading_inv, vec3(req("mimic_ref_anchor_ang_vel"), p)));
            }
        }
    }
}

impl MaxCoords {
    /// One row, in the reference's layout: `[height, positions of the
    /// bodies but the anchor, tan/norm of every body, velocities, angular
    /// velocities]`.
    fn compute_row<'a>(&self, d: &Dims, arg: &dyn Fn(&str) -> Option<&'a [f32]>, out: &mut [f32]) {
        let req = |name: &str| arg(name).unwrap_or(&[]);
        let nb = d.num_bodies;
        let (pos, rot, vel, ang) = (req("body_pos"), req("body_rot"), req("body_vel"), req("body_ang_vel"));
        let anchor_pos = vec3(pos, self.anchor);
        let anchor_rot = quat(rot, self.anchor);
        let mut w = Writer::new(out);
        // `anchor_h - ground_height`, or `zeros_like(anchor_h)`
        w.put(&[if self.root_height { anchor_pos[2] - req("ground_height")[0] } else { 0.0 }]);
        let heading = self.local.then(|| calc_heading_quat_inv(anchor_rot));
        for b in (0..nb).filter(|&b| b != self.anchor) {
            let p = vec3(pos, b);
            w.put(&match heading {
                Some(h) => quat_rotate(h, sub3(p, anchor_pos)),
                None => p,
            });
        }
        for b in 0..nb {
            let r = quat(rot, b);
            w.put(&quat_to_tan_norm(heading.map_or(r, |h| quat_mul(h, r))));
        }
        for v in [vel, ang] {
            for b in 0..nb {
                let x = vec3(v, b);
                w.put(&heading.map_or(x, |h| quat_rotate(h, x)));
            }
        }
    }
}

impl MaxTargets {
    fn per_step(&self, nb: usize) -> usize {
        nb * (9 + 9 * usize::from(self.relative) + 6 * usize::from(self.velocities))
    }

    /// One row: per selected future step, `[positions from the current
    /// anchor, (positions from the same current body), rotations in the
    /// heading frame, (rotations relative to the current body),
    /// (velocities, angular velocities minus the current body's)]`, all
    /// rotated into the current anchor's heading frame.
    fn compute_row<'a>(&self, d: &Dims, arg: &dyn Fn(&str) -> Option<&'a [f32]>, out: &mut [f32]) {
        let req = |name: &str| arg(name).unwrap_or(&[]);
        let nb = d.num_bodies;
        let (cur_pos, cur_rot) = (req("current_state_body_pos"), req("current_state_body_rot"));
        let (ref_pos, ref_rot) = (req("mimic_ref_pos"), req("mimic_ref_rot"));
        let root_pos = vec3(cur_pos, self.anchor);
        let heading = calc_heading_quat_inv(quat(cur_rot, self.anchor));
        let mut w = Writer::new(out);
        for p in positions(self.steps.as_ref(), d.future_steps) {
            let at = |b: usize| p * nb + b;
            for b in 0..nb {
                w.put(&quat_rotate(heading, sub3(vec3(ref_pos, at(b)), root_pos)));
            }
            if self.relative {
                for b in 0..nb {
                    w.put(&quat_rotate(heading, sub3(vec3(ref_pos, at(b)), vec3(cur_pos, b))));
                }
            }
            for b in 0..nb {
                w.put(&quat_to_tan_norm(quat_mul(heading, quat(ref_rot, at(b)))));
            }
            if self.relative {
                for b in 0..nb {
                    let rel = quat_mul(quat_conjugate(quat(cur_rot, b)), quat(ref_rot, at(b)));
                    w.put(&quat_to_tan_norm(rel));
                }
            }
            if self.velocities {
                for (cur, reference) in [
                    (req("current_state_body_vel"), req("mimic_ref_vel")),
                    (req("current_state_body_ang_vel"), req("mimic_ref_ang_vel")),
                ] {
                    for b in 0..nb {
                        w.put(&quat_rotate(heading, sub3(vec3(reference, at(b)), vec3(cur, b))));
                    }
                }
            }
        }
    }
}

fn sub3(a: Vec3, b: Vec3) -> Vec3 {
    [a[0] - b[0], a[1] - b[1], a[2] - b[2]]
}

/// The 0-based positions a selection picks (all of them without one).
/// Widths were checked when the pipeline was built, so the selection fits.
/// (An iterator, not a Vec: a control step allocates nothing.)
fn positions(steps: Option<&Steps>, available: usize) -> impl Iterator<Item = usize> + '_ {
    let (first, picked) = match steps {
        None => (available, None),
        Some(Steps::First(n)) => ((*n).min(available), None),
        Some(Steps::Indices(v)) => (0, Some(v.iter().map(|s| s.saturating_sub(1)).filter(move |&p| p < available))),
    };
    (0..first).chain(picked.into_iter().flatten())
}

fn quat(s: &[f32], i: usize) -> Quat {
    [s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]
}

fn vec3(s: &[f32], i: usize) -> Vec3 {
    [s[3 * i], s[3 * i + 1], s[3 * i + 2]]
}

/// Appends to a row's output slice.
struct Writer<'o> {
    out: &'o mut [f32],
    at: usize,
}

impl<'o> Writer<'o> {
    fn new(out: &'o mut [f32]) -> Self {
        Writer { out, at: 0 }
    }

    fn put(&mut self, v: &[f32]) {
        self.out[self.at..self.at + v.len()].copy_from_slice(v);
        self.at += v.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::path::Path;

    use candle_core::{Device, Tensor};
    use proptest::prelude::*;

    use crate::test_heading::{heading_error, HEADING_TOL};

    fn load(name: &str) -> HashMap<String, Vec<f32>> {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/deploy/soma_tracker").join(name);
        let t: HashMap<String, Tensor> = candle_core::safetensors::load(&p, &Device::Cpu).expect("safetensors");
        t.into_iter().map(|(k, v)| (k, v.flatten_all().and_then(|v| v.to_vec1::<f32>()).expect("f32"))).collect()
    }

    /// One row of bodies (`nb` of them) turned by `yaw` about z and moved by
    /// `shift` in the ground plane, in f64 then rounded: rotations
    /// pre-multiplied, positions rotated and shifted, velocities rotated.
    fn turned(rows: &HashMap<&str, Vec<f32>>, yaw: f64, shift: [f64; 2]) -> HashMap<&'static str, Vec<f32>> {
        let (s, c) = (yaw / 2.0).sin_cos();
        let (sy, cy) = yaw.sin_cos();
        let rot = |v: &[f32]| -> [f64; 3] {
            let [x, y, z] = [v[0], v[1], v[2]].map(f64::from);
            [cy * x - sy * y, sy * x + cy * y, z]
        };
        let mut out = HashMap::new();
        for (name, v) in rows {
            let name: &'static str = match *name {
                "body_pos" => "body_pos",
                "body_rot" => "body_rot",
                "body_vel" => "body_vel",
                "body_ang_vel" => "body_ang_vel",
                other => panic!("{other}"),
            };
            let t: Vec<f32> = match name {
                "body_rot" => v
                    .chunks(4)
                    .flat_map(|q| {
                        // [0, 0, s, c] * q
                        let [x, y, z, w] = [q[0], q[1], q[2], q[3]].map(f64::from);
                        [c * x - s * y, c * y + s * x, c * z + s * w, c * w - s * z].map(|e| e as f32)
                    })
                    .collect(),
                "body_pos" => v
                    .chunks(3)
                    .flat_map(|p| {
                        let r = rot(p);
                        [r[0] + shift[0], r[1] + shift[1], r[2]].map(|e| e as f32)
                    })
                    .collect(),
                _ => v.chunks(3).flat_map(|p| rot(p).map(|e| e as f32)).collect(),
            };
            out.insert(name, t);
        }
        out
    }

    fn body_rows(nb: usize) -> impl Strategy<Value = HashMap<&'static str, Vec<f32>>> {
        let vecs = move || prop::collection::vec(-2.0f32..2.0, 3 * nb);
        let quats = prop::collection::vec(prop::array::uniform4(-1.0f32..1.0), nb).prop_map(|qs| {
            qs.into_iter()
                .flat_map(|q| {
                    let n = q.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt().max(1e-3);
                    q.map(|x| (f64::from(x) / n) as f32)
                })
                .collect::<Vec<f32>>()
        });
        (vecs(), quats, vecs(), vecs()).prop_map(|(p, r, v, a)| {
            HashMap::from([("body_pos", p), ("body_rot", r), ("body_vel", v), ("body_ang_vel", a)])
        })
    }

    proptest! {
        /// In the heading frame, the max-coords observation does not change
        /// when the whole body turns about the vertical and moves on the
        /// ground: what the heading frame is for (away from an anchor whose
        /// x axis is vertical, where the heading is undefined).
        #[test]
        fn max_coords_are_invariant_to_yaw_and_ground_shift(
            rows in body_rows(4),
            yaw in -3.0f64..3.0,
            shift in prop::array::uniform2(-5.0f64..5.0),
        ) {
            let d = Dims { num_dofs: 1, num_bodies: 4, future_steps: 1, history_steps: 1 };
            let f = Function::MaxCoords(MaxCoords { local: true, root_height: false, anchor: 2 });
            let x_axis = quat_rotate(quat(&rows["body_rot"], 2), [1.0, 0.0, 0.0]);
            prop_assume!(x_axis[0].hypot(x_axis[1]) > 0.1);
            let run_one = |r: &HashMap<&str, Vec<f32>>| {
                let mut out = vec![0f32; f.width(&d).unwrap_or_default()];
                f.compute_row(&d, &|name: &str| r.get(name).map(Vec::as_slice), &mut out);
                out
            };
            let here = run_one(&rows);
            let there = run_one(&turned(&rows, yaw, shift));
            for (i, (a, b)) in here.iter().zip(&there).enumerate() {
                prop_assert!((a - b).abs() < 1e-4 * (1.0 + a.abs()), "{i}: {a} vs {b}");
            }
        }
    }

    /// `f` over the batch, each argument bound to the recorded input named.
    fn run(f: &Function, d: &Dims, inputs: &HashMap<String, Vec<f32>>, batch: usize) -> Vec<f32> {
        let bound = |arg: &str| -> &'static str {
            match arg {
                "body_pos" | "current_state_body_pos" => "current_rigid_body_pos",
                "body_rot" | "current_state_body_rot" => "current_rigid_body_rot",
                "body_vel" | "current_state_body_vel" => "current_rigid_body_vel",
                "body_ang_vel" | "current_state_body_ang_vel" => "current_rigid_body_ang_vel",
                "ground_height" => "ground_heights",
                "mimic_ref_pos" => "mimic_future_pos",
                "mimic_ref_rot" => "mimic_future_rot",
                "mimic_ref_vel" => "mimic_future_vel",
                "mimic_ref_ang_vel" => "mimic_future_ang_vel",
                other => panic!("no input for {other}"),
            }
        };
        let width = f.width(d).expect("width");
        let mut out = vec![0f32; batch * width];
        for r in 0..batch {
            let arg = |name: &str| -> Option<&[f32]> {
                let all = &inputs[bound(name)];
                let len = all.len() / batch;
                Some(&all[r * len..(r + 1) * len])
            };
            f.compute_row(d, &arg, &mut out[r * width..(r + 1) * width]);
        }
        out
    }

    /// The max-coords functions with the parameters and anchor bodies the
    /// recorded pipeline does not use (global frame, no height, no
    /// velocities, no relative poses, anchors 5 and 22), against
    /// ProtoMotions' functions called directly: within the heading bound
    /// (random anchors: torch's sin/cos/atan2 kernels are off by an ulp for
    /// some), bit for bit in the global frame.
    #[test]
    fn max_coords_functions_match_the_reference_for_every_parameter() {
        let inputs = load("inputs_b16.safetensors");
        let want = load("functions_b16.safetensors");
        let d = Dims { num_dofs: 66, num_bodies: 23, future_steps: 1, history_steps: 1 };
        let flag = |s: &str, at: usize| s.as_bytes()[at] == b'1';
        assert_eq!(want.len(), 8);
        let mut failed = Vec::new();
        for (key, expected) in &want {
            let parts: Vec<&str> = key.rsplit('_').take(3).collect();
            let anchor: usize = parts[0][1..].parse().expect("anchor");
            let f = if key.starts_with("max_coords_") {
                Function::MaxCoords(MaxCoords { local: flag(parts[2], 1), root_height: flag(parts[1], 1), anchor })
            } else {
                Function::MaxCoordsTargetPoses(MaxTargets {
                    velocities: flag(parts[2], 1),
                    relative: flag(parts[1], 1),
                    steps: Some(Steps::Indices(vec![1])),
                    anchor,
                })
            };
            let got = run(&f, &d, &inputs, 16);
            assert_eq!(got.len(), expected.len(), "{key}");
            let offset = usize::from(matches!(f, Function::MaxCoords(_)));
            let err = heading_error(&got, expected, got.len() / 16, offset);
            eprintln!("{key}: {err:.3e} (bound {HEADING_TOL:.0e})");
            if err > HEADING_TOL {
                failed.push(format!("{key}: {err:.3e}"));
            }
            // the global frame has no heading: torch's bits
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            if matches!(f, Function::MaxCoords(MaxCoords { local: false, .. })) && bits(&got) != bits(expected) {
                failed.push(format!("{key}: not torch's bits"));
            }
        }
        assert!(failed.is_empty(), "{failed:?}");
    }
}
