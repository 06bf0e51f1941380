//! The three observations v3.0's motion trackers read, as the pipeline's
//! functions: `reduced_coords_obs`, `historical_reduced_coords_obs` and
//! `mimic_target_poses` (max-coords-simple). Inputs are named by the
//! arguments of v3.0's functions; the components bind them to context
//! paths (`v30::config`).

use super::dof_obs::Hinges;
use crate::observations::Need;
use crate::rotations::{calc_heading_quat_inv, projected_gravity, quat_mul, quat_rotate, quat_to_tan_norm};

/// v3.0's `compute_humanoid_reduced_coords_observations` (with
/// `root_projected_gravity` of the root, as `HumanoidObs` calls it).
pub const V30_REDUCED_COORDS: &str = "protomotions.envs.utils.humanoid.compute_humanoid_reduced_coords_observations";
/// v3.0's `HumanoidObs` history of the reduced coords
/// (`HistoryBuffer.get_all_flattened`).
pub const V30_HISTORICAL_REDUCED_COORDS: &str = "protomotions.envs.obs.humanoid_obs.HistoryBuffer.get_all_flattened";
/// v3.0's `MimicObs.build_target_poses` of type max-coords-simple.
pub const V30_TARGET_POSES: &str = "protomotions.envs.utils.target_poses.build_max_coords_target_poses_simple";

/// One of v3.0's observations.
#[derive(Debug, Clone, PartialEq)]
pub enum V30Function {
    /// `dof_to_obs` of the joints, their velocities, the root's angular
    /// velocity (world frame: `rigid_body_ang_vel[:, 0]`), the gravity in
    /// the root's frame.
    ReducedCoords(Hinges),
    /// `steps` rows of [`V30Function::ReducedCoords`]: the current reading,
    /// then the past ones, most recent first (v3.0's `HistoryBuffer` holds
    /// the current frame in slot 0).
    HistoricalReducedCoords {
        /// The joint encoding.
        hinges: Hinges,
        /// `num_historical_steps`, the current one included.
        steps: usize,
    },
    /// Per future step, every reference body's position relative to the
    /// root, rotation (tangent/normal), velocity and angular velocity, all
    /// in the root's heading frame; then the time to the target.
    TargetPoses(TargetPoses),
}

/// Parameters of the max-coords-simple target poses (`MimicTargetPoseConfig`).
#[derive(Debug, Clone, PartialEq)]
pub struct TargetPoses {
    /// `with_velocities`.
    pub with_velocities: bool,
    /// `with_time`.
    pub with_time: bool,
    /// The future steps (`future_steps`: an int N is 1..=N).
    pub steps: Vec<usize>,
    /// The env's control period, float32 (`env.dt`).
    pub dt: f32,
}

impl V30Function {
    /// The qualified name of the v3.0 code this computes.
    pub fn qualified_name(&self) -> &'static str {
        match self {
            V30Function::ReducedCoords(_) => V30_REDUCED_COORDS,
            V30Function::HistoricalReducedCoords { .. } => V30_HISTORICAL_REDUCED_COORDS,
            V30Function::TargetPoses(_) => V30_TARGET_POSES,
        }
    }

    /// The arguments read (all required).
    pub fn arguments(&self) -> Vec<(&'static str, Need)> {
        let names: &[&'static str] = match self {
            V30Function::ReducedCoords(_) => &["dof_pos", "dof_vel", "body_rot", "body_ang_vel"],
            V30Function::HistoricalReducedCoords { .. } => &[
                "dof_pos",
                "dof_vel",
                "body_rot",
                "body_ang_vel",
                "historical_dof_pos",
                "historical_dof_vel",
                "historical_root_rot",
                "historical_root_ang_vel",
            ],
            V30Function::TargetPoses(t) => {
                if t.with_velocities {
                    &[
                        "cur_gt",
                        "cur_gr",
                        "flat_target_pos",
                        "flat_target_rot",
                        "flat_target_vel",
                        "flat_target_ang_vel",
                        "realign_offset",
                        "motion_time",
                        "motion_length",
                    ]
                } else {
                    &[
                        "cur_gt",
                        "cur_gr",
                        "flat_target_pos",
                        "flat_target_rot",
                        "realign_offset",
                        "motion_time",
                        "motion_length",
                    ]
                }
            }
        };
        names.iter().map(|n| (*n, Need::Required)).collect()
    }

    /// Past steps the tracker must hold (the current one is not history).
    pub fn history_needed(&self) -> usize {
        match self {
            V30Function::HistoricalReducedCoords { steps, .. } => steps.saturating_sub(1),
            _ => 0,
        }
    }

    /// The output width per row.
    pub fn width(&self, num_dofs: usize, num_bodies: usize) -> Option<usize> {
        let reduced = |h: &Hinges| h.width().checked_add(num_dofs)?.checked_add(6);
        Some(match self {
            V30Function::ReducedCoords(h) => reduced(h)?,
            V30Function::HistoricalReducedCoords { hinges, steps } => reduced(hinges)?.checked_mul(*steps)?,
            V30Function::TargetPoses(t) => {
                let per_body = if t.with_velocities { 15 } else { 9 };
                let per_step = num_bodies.checked_mul(per_body)?.checked_add(usize::from(t.with_time))?;
                per_step.checked_mul(t.steps.len())?
            }
        })
    }

    /// One batch row; `arg(name)` is the row's slice of the bound input.
    pub(crate) fn compute_row<'a>(
        &self,
        num_dofs: usize,
        num_bodies: usize,
        arg: &dyn Fn(&str) -> Option<&'a [f32]>,
        out: &mut [f32],
    ) {
        let req = |name: &str| arg(name).unwrap_or(&[]);
        let nd = num_dofs;
        match self {
            V30Function::ReducedCoords(h) => {
                reduced(h, req("dof_pos"), req("dof_vel"), &req("body_rot")[..4], &req("body_ang_vel")[..3], out)
            }
            V30Function::HistoricalReducedCoords { hinges, steps } => {
                let w = hinges.width() + nd + 6;
                reduced(
                    hinges,
                    req("dof_pos"),
                    req("dof_vel"),
                    &req("body_rot")[..4],
                    &req("body_ang_vel")[..3],
                    &mut out[..w],
                );
                let (pos, vel) = (req("historical_dof_pos"), req("historical_dof_vel"));
                let (rot, ang) = (req("historical_root_rot"), req("historical_root_ang_vel"));
                for p in 0..steps.saturating_sub(1) {
                    reduced(
                        hinges,
                        &pos[p * nd..(p + 1) * nd],
                        &vel[p * nd..(p + 1) * nd],
                        &rot[p * 4..p * 4 + 4],
                        &ang[p * 3..p * 3 + 3],
                        &mut out[(p + 1) * w..(p + 2) * w],
                    );
                }
            }
            V30Function::TargetPoses(t) => t.compute_row(num_bodies, arg, out),
        }
    }
}

/// One row of the reduced coords.
fn reduced(h: &Hinges, dof_pos: &[f32], dof_vel: &[f32], root_rot: &[f32], root_ang_vel: &[f32], out: &mut [f32]) {
    let w = h.width();
    h.dof_to_obs(dof_pos, &mut out[..w]);
    let nd = dof_vel.len();
    out[w..w + nd].copy_from_slice(dof_vel);
    out[w + nd..w + nd + 3].copy_from_slice(root_ang_vel);
    let g = projected_gravity([root_rot[0], root_rot[1], root_rot[2], root_rot[3]]);
    out[w + nd + 3..w + nd + 6].copy_from_slice(&g);
}

fn v3(s: &[f32], i: usize) -> [f32; 3] {
    [s[3 * i], s[3 * i + 1], s[3 * i + 2]]
}

fn q4(s: &[f32], i: usize) -> [f32; 4] {
    [s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]
}

impl TargetPoses {
    /// `build_max_coords_target_poses_simple` of the references offset by
    /// the realignment (`ref + [dx, dy, 0]`, as
    /// `get_spawn_to_ref_pose_offset_with_terrain_height_correction` on flat
    /// terrain), then `add_time_to_target_poses`:
    /// `min(t + k dt, length) - t`.
    fn compute_row<'a>(&self, nb: usize, arg: &dyn Fn(&str) -> Option<&'a [f32]>, out: &mut [f32]) {
        let req = |name: &str| arg(name).unwrap_or(&[]);
        let (cur_pos, cur_rot) = (req("cur_gt"), req("cur_gr"));
        let root = v3(cur_pos, 0);
        let heading = calc_heading_quat_inv(q4(cur_rot, 0));
        let (pos, rot) = (req("flat_target_pos"), req("flat_target_rot"));
        let (vel, ang) = (arg("flat_target_vel").unwrap_or(&[]), arg("flat_target_ang_vel").unwrap_or(&[]));
        let off = req("realign_offset");
        let offset = [off[0], off[1], 0.0];
        let (time, length) = (req("motion_time")[0], req("motion_length")[0]);
        let mut at = 0;
        let mut put = |v: &[f32]| {
            out[at..at + v.len()].copy_from_slice(v);
            at += v.len();
        };
        for (s, &k) in self.steps.iter().enumerate() {
            let body = |b: usize| s * nb + b;
            for b in 0..nb {
                let p = v3(pos, body(b));
                let shifted: [f32; 3] = std::array::from_fn(|i| p[i] + offset[i]);
                put(&quat_rotate(heading, std::array::from_fn(|i| shifted[i] - root[i])));
            }
            for b in 0..nb {
                put(&quat_to_tan_norm(quat_mul(heading, q4(rot, body(b)))));
            }
            if self.with_velocities {
                for b in 0..nb {
                    put(&quat_rotate(heading, v3(vel, body(b))));
                }
                for b in 0..nb {
                    put(&quat_rotate(heading, v3(ang, body(b))));
                }
            }
            if self.with_time {
                // future_steps * dt in float32, as a LongTensor times a Python float
                let ahead = time + (k as f32) * self.dt;
                put(&[ahead.min(length) - time]);
            }
        }
    }
}
