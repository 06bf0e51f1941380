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

/// Every observation function this crate implements, by qualified name.
pub const SUPPORTED: [&str; 3] = [REDUCED_COORDS, REDUCED_COORDS_TARGET_POSES, HISTORICAL_ACTIONS];

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
            _ => return Ok(None),
        };
        if let Function::ReducedCoordsTargetPoses(ReducedTargets { steps: Some(s), .. })
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

    /// The arguments this function reads with its parameters.
    pub fn arguments(&self) -> Vec<(&'static str, Need)> {
        use Need::*;
        match self {
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
        }
    }

    /// How many past steps the historical context must hold for this function.
    pub fn history_needed(&self) -> usize {
        match self {
            Function::HistoricalActions(h) => h.steps.as_ref().map_or(1, Steps::needed),
            _ => 0,
        }
    }

    /// The selected step positions (0-based) and the output width per row,
    /// or `None` when a selection reaches past what the context holds.
    pub fn width(&self, d: &Dims) -> Option<usize> {
        Some(match self {
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

/// The 0-based positions a selection picks (all of them without one).
/// Widths were checked when the pipeline was built, so the selection fits.
fn positions(steps: Option<&Steps>, available: usize) -> Vec<usize> {
    match steps {
        None => (0..available).collect(),
        Some(s) => s.positions(available).unwrap_or_default(),
    }
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
