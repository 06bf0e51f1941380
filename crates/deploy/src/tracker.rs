//! [`Tracker`]: the control loop around a [`Pipeline`], as ProtoMotions'
//! deployment code runs it (`deployment/test_tracker_mujoco.py`'s step,
//! `tracker_inputs.py`, `state_utils.py`): at the first step the reference
//! motion is aligned to the robot's start heading and position; each step
//! the pipeline's inputs are assembled from the sensors, the player's
//! future frames and the fed-back history; the PD targets pass the
//! acceleration clamp and the EMA filter of the contract.
//!
//! The alignment helpers follow `state_utils.py`, which computes in NumPy
//! float32 (the textbook quaternion product, not the 8-multiply one of
//! `rotations.py`): the same formulas, in the same order.

use crate::context::Feedback;
use crate::contract::Contract;
use crate::error::{DeployError, Result, SensorProblem};
use crate::motion::MotionPlayer;
use crate::pipeline::{Pipeline, StepScratch};
use crate::rotations::{Quat, Vec3};

/// One control step's sensor readings (the robot's state, xyzw quaternions).
#[derive(Debug, Clone, Copy)]
pub struct Sensors<'a> {
    /// Joint positions, in the contract's joint order.
    pub dof_pos: &'a [f32],
    /// Joint velocities.
    pub dof_vel: &'a [f32],
    /// The anchor body's orientation in the world (the torso IMU on a G1).
    pub anchor_rot: Quat,
    /// The root's angular velocity in its own frame (a gyroscope; MuJoCo's
    /// `qvel[3:6]`).
    pub root_local_ang_vel: Vec3,
    /// The anchor's position in the world, when the robot estimates it
    /// (needed only by pipelines that read positions).
    pub anchor_pos: Option<Vec3>,
    /// Every body's state, for pipelines that read it (max-coords trackers
    /// such as soma-bones: `current.rigid_body_*`); from a simulator, or
    /// forward kinematics of the joint readings and a state estimate.
    pub bodies: Option<BodyState<'a>>,
}

/// The state of every rigid body, in the contract's body order, world frame.
#[derive(Debug, Clone, Copy)]
pub struct BodyState<'a> {
    /// `[B, 3]` positions.
    pub pos: &'a [f32],
    /// `[B, 4]` orientations, xyzw.
    pub rot: &'a [f32],
    /// `[B, 3]` linear velocities.
    pub vel: &'a [f32],
    /// `[B, 3]` angular velocities.
    pub ang_vel: &'a [f32],
    /// The ground's height under the robot (`ground_heights`; 0 on flat ground).
    pub ground_height: f32,
}

/// How the targets are filtered: what the contract's `control` says, unless overridden.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrackerOptions {
    /// `targets = alpha * targets + (1 - alpha) * previous` (1: no filter).
    pub action_ema_alpha: f64,
    /// Limit on the second difference of the targets per step.
    pub pd_target_max_accel: Option<f64>,
}

impl TrackerOptions {
    /// The contract's settings.
    pub fn from_contract(c: &Contract) -> Self {
        TrackerOptions {
            action_ema_alpha: c.control.action_ema_alpha,
            pd_target_max_accel: c.control.pd_target_max_accel,
        }
    }
}

/// What one step commands.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PdTargets {
    /// The actor's mean action.
    pub actions: Vec<f32>,
    /// Joint position targets, after the clamp and filter.
    pub joint_pos_targets: Vec<f32>,
    /// Stiffness per joint.
    pub stiffness: Vec<f32>,
    /// Damping per joint.
    pub damping: Vec<f32>,
}

/// Where an input's values come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    DofPos,
    DofVel,
    AnchorRot,
    RootLocalAngVel,
    AnchorPos,
    History(Feedback),
    FutureDofPos,
    FutureDofVel,
    FutureRot { anchor_only: bool },
    FuturePos { anchor_only: bool },
    FutureVel { anchor_only: bool, angular: bool },
    RefAnchorPos,
    Body(BodyField),
    GroundHeight,
}

/// Which array of [`BodyState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyField {
    Pos,
    Rot,
    Vel,
    AngVel,
}

const SOURCED: [&str; 23] = [
    "current.rigid_body_pos",
    "current.rigid_body_rot",
    "current.rigid_body_vel",
    "current.rigid_body_ang_vel",
    "ground_heights",
    "current.dof_pos",
    "current.dof_vel",
    "current.anchor_rot",
    "current.root_local_ang_vel",
    "current.anchor_pos",
    "historical.processed_actions",
    "historical.actions",
    "mimic.future_dof_pos",
    "mimic.future_dof_vel",
    "mimic.future_rot",
    "mimic.future_anchor_rot",
    "mimic.future_pos",
    "mimic.future_anchor_pos",
    "mimic.future_vel",
    "mimic.future_anchor_vel",
    "mimic.future_ang_vel",
    "mimic.future_anchor_ang_vel",
    "mimic.ref_anchor_pos",
];

fn source(path: &str) -> Option<Source> {
    use Source::*;
    Some(match path {
        "current.dof_pos" => DofPos,
        "current.dof_vel" => DofVel,
        "current.anchor_rot" => AnchorRot,
        "current.root_local_ang_vel" => RootLocalAngVel,
        "current.anchor_pos" => AnchorPos,
        "historical.processed_actions" => History(Feedback::RobotAction),
        "historical.actions" => History(Feedback::Actions),
        "mimic.future_dof_pos" => FutureDofPos,
        "mimic.future_dof_vel" => FutureDofVel,
        "mimic.future_rot" => FutureRot { anchor_only: false },
        "mimic.future_anchor_rot" => FutureRot { anchor_only: true },
        "mimic.future_pos" => FuturePos { anchor_only: false },
        "mimic.future_anchor_pos" => FuturePos { anchor_only: true },
        "mimic.future_vel" => FutureVel { anchor_only: false, angular: false },
        "mimic.future_anchor_vel" => FutureVel { anchor_only: true, angular: false },
        "mimic.future_ang_vel" => FutureVel { anchor_only: false, angular: true },
        "mimic.future_anchor_ang_vel" => FutureVel { anchor_only: true, angular: true },
        "mimic.ref_anchor_pos" => RefAnchorPos,
        "current.rigid_body_pos" => Body(BodyField::Pos),
        "current.rigid_body_rot" => Body(BodyField::Rot),
        "current.rigid_body_vel" => Body(BodyField::Vel),
        "current.rigid_body_ang_vel" => Body(BodyField::AngVel),
        "ground_heights" => GroundHeight,
        _ => return None,
    })
}

/// The start-of-motion alignment (`init_tracker_alignment`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Alignment {
    /// Yaw-only rotation from the clip's heading to the robot's.
    pub heading_offset: Quat,
    /// The robot's anchor position at the start.
    pub robot_anchor_start_pos: Vec3,
    /// The clip's anchor position at its first frame.
    pub motion_anchor_start_pos: Vec3,
}

/// `_quat_mul_np`: the textbook Hamilton product, NumPy's order.
pub fn quat_mul_np(a: Quat, b: Quat) -> Quat {
    let [ax, ay, az, aw] = a;
    let [bx, by, bz, bw] = b;
    [
        aw * bx + ax * bw + ay * bz - az * by,
        aw * by - ax * bz + ay * bw + az * bx,
        aw * bz + ax * by - ay * bx + az * bw,
        aw * bw - ax * bx - ay * by - az * bz,
    ]
}

/// `quat_rotate_np`: NumPy's copy of `rotations.quat_rotate`, the same
/// formula in the same order, so [`crate::rotations::quat_rotate`] itself.
pub fn quat_rotate_np(q: Quat, v: Vec3) -> Vec3 {
    crate::rotations::quat_rotate(q, v)
}

/// `_extract_yaw_quat_np`: the rotation about z by the yaw of `q`.
pub fn yaw_quat_np(q: Quat) -> Quat {
    let [x, y, z, w] = q;
    let yaw = (2.0 * (w * z + x * y)).atan2(1.0 - 2.0 * (y * y + z * z));
    let half = yaw * 0.5;
    [0.0, 0.0, half.sin(), half.cos()]
}

impl Alignment {
    /// `init_tracker_alignment`: `heading_offset = yaw(robot) * yaw(motion)^-1`.
    pub fn new(
        robot_anchor_pos: Vec3,
        robot_anchor_rot: Quat,
        motion_anchor_pos: Vec3,
        motion_anchor_rot: Quat,
    ) -> Self {
        let m = yaw_quat_np(motion_anchor_rot);
        Alignment {
            heading_offset: quat_mul_np(yaw_quat_np(robot_anchor_rot), [-m[0], -m[1], -m[2], m[3]]),
            robot_anchor_start_pos: robot_anchor_pos,
            motion_anchor_start_pos: motion_anchor_pos,
        }
    }

    /// A clip rotation in the robot's frame.
    pub fn rot(&self, q: Quat) -> Quat {
        quat_mul_np(self.heading_offset, q)
    }

    /// A clip position in the robot's frame.
    pub fn pos(&self, p: Vec3) -> Vec3 {
        let m = self.motion_anchor_start_pos;
        let r = quat_rotate_np(self.heading_offset, [p[0] - m[0], p[1] - m[1], p[2] - m[2]]);
        std::array::from_fn(|i| self.robot_anchor_start_pos[i] + r[i])
    }

    /// A clip velocity in the robot's frame (rotated only; ProtoMotions'
    /// loop sources no velocities, so this follows the physics).
    pub fn vel(&self, v: Vec3) -> Vec3 {
        quat_rotate_np(self.heading_offset, v)
    }
}

/// The control loop of one tracker on one reference motion.
#[derive(Debug)]
pub struct Tracker {
    pipeline: Pipeline,
    player: MotionPlayer,
    options: TrackerOptions,
    future_steps: Vec<usize>,
    anchor: usize,
    sources: Vec<Source>,
    buffers: Vec<Vec<f32>>,
    history: usize,
    fed_targets: Vec<f32>,
    fed_actions: Vec<f32>,
    frame: usize,
    alignment: Option<Alignment>,
    ema_prev: Option<Vec<f32>>,
    /// The last two targets before the EMA (the acceleration clamp's history).
    prev: Vec<f32>,
    prev_prev: Vec<f32>,
    /// How many of `prev`, `prev_prev` hold a step (0 to 2).
    clamp_history: usize,
    scratch: StepScratch,
    out: PdTargets,
}

impl Tracker {
    /// A tracker for `pipeline` playing `player` (resampled at the
    /// contract's `dt`); refuses a pipeline input it cannot source.
    pub fn new(pipeline: Pipeline, player: MotionPlayer, options: TrackerOptions) -> Result<Self> {
        let dims = pipeline.dims();
        if player.num_dofs() != dims.num_dofs {
            return Err(DeployError::ClipMismatch { what: "joints", clip: player.num_dofs(), robot: dims.num_dofs });
        }
        if player.num_bodies() != dims.num_bodies {
            return Err(DeployError::ClipMismatch {
                what: "bodies",
                clip: player.num_bodies(),
                robot: dims.num_bodies,
            });
        }
        let mut sources = Vec::new();
        let mut buffers = Vec::new();
        for i in pipeline.inputs() {
            let s = source(&i.path).ok_or_else(|| DeployError::Unsourced {
                path: i.path.clone(),
                sourced: SOURCED.iter().map(|s| (*s).to_owned()).collect(),
            })?;
            sources.push(s);
            buffers.push(vec![0f32; i.row_len()]);
        }
        let c = pipeline.contract();
        let future_steps = c.motion.future_step_indices.clone();
        let anchor = c.robot.anchor_body_index;
        let nd = dims.num_dofs;
        let history = dims.history_steps;
        Ok(Tracker {
            future_steps,
            anchor,
            sources,
            buffers,
            history,
            fed_targets: vec![0.0; history * nd],
            fed_actions: vec![0.0; history * nd],
            frame: 0,
            alignment: None,
            ema_prev: None,
            prev: vec![0.0; nd],
            prev_prev: vec![0.0; nd],
            clamp_history: 0,
            scratch: StepScratch::default(),
            out: PdTargets {
                actions: vec![0.0; nd],
                joint_pos_targets: vec![0.0; nd],
                stiffness: pipeline.action().stiffness.clone(),
                damping: pipeline.action().damping.clone(),
            },
            pipeline,
            player,
            options,
        })
    }

    /// Back to the clip's first frame: alignment, history and filters cleared.
    pub fn reset(&mut self) {
        self.frame = 0;
        self.alignment = None;
        self.ema_prev = None;
        self.clamp_history = 0;
        self.fed_targets.iter_mut().for_each(|x| *x = 0.0);
        self.fed_actions.iter_mut().for_each(|x| *x = 0.0);
    }

    /// The next step's frame of the clip.
    pub fn frame(&self) -> usize {
        self.frame
    }

    /// Whether every frame of the clip has been played (later steps hold its last frame).
    pub fn finished(&self) -> bool {
        self.frame >= self.player.total_frames()
    }

    /// The pipeline.
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// The alignment captured at the first step.
    pub fn alignment(&self) -> Option<&Alignment> {
        self.alignment.as_ref()
    }

    /// The inputs of the last step, in the pipeline's input order.
    pub fn last_inputs(&self) -> &[Vec<f32>] {
        &self.buffers
    }

    fn check(&self, s: &Sensors<'_>) -> Result<()> {
        let nd = self.pipeline.dims().num_dofs;
        for (name, got) in [("dof_pos", s.dof_pos.len()), ("dof_vel", s.dof_vel.len())] {
            if got != nd {
                return Err(DeployError::Sensor { name, problem: SensorProblem::Length { got, expected: nd } });
            }
        }
        let needs_pos = self.sources.contains(&Source::AnchorPos);
        if needs_pos && s.anchor_pos.is_none() {
            return Err(DeployError::Sensor { name: "anchor_pos", problem: SensorProblem::Missing });
        }
        let needs_bodies = self.sources.iter().any(|x| matches!(x, Source::Body(_) | Source::GroundHeight));
        match (&s.bodies, needs_bodies) {
            (None, true) => return Err(DeployError::Sensor { name: "bodies", problem: SensorProblem::Missing }),
            (Some(b), _) => {
                let nb = self.player.num_bodies();
                for (name, got, w) in [
                    ("bodies.pos", b.pos.len(), 3),
                    ("bodies.rot", b.rot.len(), 4),
                    ("bodies.vel", b.vel.len(), 3),
                    ("bodies.ang_vel", b.ang_vel.len(), 3),
                ] {
                    if got != nb * w {
                        return Err(DeployError::Sensor {
                            name,
                            problem: SensorProblem::Length { got, expected: nb * w },
                        });
                    }
                }
            }
            (None, false) => {}
        }
        Ok(())
    }

    /// One control step: the PD targets for the robot's current state.
    pub fn step(&mut self, s: &Sensors<'_>) -> Result<&PdTargets> {
        self.check(s)?;
        let anchor = self.anchor;
        let align = *self.alignment.get_or_insert_with(|| {
            let f = self.player.frame(0);
            let p = &f.body_pos[anchor * 3..anchor * 3 + 3];
            let q = &f.body_rot[anchor * 4..anchor * 4 + 4];
            Alignment::new(s.anchor_pos.unwrap_or([0.0; 3]), s.anchor_rot, [p[0], p[1], p[2]], [q[0], q[1], q[2], q[3]])
        });
        let nb = self.player.num_bodies();
        for (src, buf) in self.sources.iter().zip(self.buffers.iter_mut()) {
            buf.clear();
            match *src {
                Source::DofPos => buf.extend_from_slice(s.dof_pos),
                Source::DofVel => buf.extend_from_slice(s.dof_vel),
                Source::AnchorRot => buf.extend_from_slice(&s.anchor_rot),
                Source::RootLocalAngVel => buf.extend_from_slice(&s.root_local_ang_vel),
                Source::AnchorPos => buf.extend_from_slice(&s.anchor_pos.unwrap_or([0.0; 3])),
                Source::History(Feedback::RobotAction) => buf.extend_from_slice(&self.fed_targets),
                Source::History(Feedback::Actions) => buf.extend_from_slice(&self.fed_actions),
                Source::Body(field) => {
                    if let Some(b) = &s.bodies {
                        buf.extend_from_slice(match field {
                            BodyField::Pos => b.pos,
                            BodyField::Rot => b.rot,
                            BodyField::Vel => b.vel,
                            BodyField::AngVel => b.ang_vel,
                        });
                    }
                }
                Source::GroundHeight => buf.push(s.bodies.as_ref().map_or(0.0, |b| b.ground_height)),
                Source::RefAnchorPos => {
                    let f = self.player.frame(self.frame);
                    let p = &f.body_pos[anchor * 3..anchor * 3 + 3];
                    buf.extend_from_slice(&align.pos([p[0], p[1], p[2]]));
                }
                _ => {
                    for &k in &self.future_steps {
                        let f = self.player.frame(self.frame.saturating_add(k));
                        let bodies = |anchor_only: bool| if anchor_only { anchor..anchor + 1 } else { 0..nb };
                        match *src {
                            Source::FutureDofPos => buf.extend_from_slice(f.dof_pos),
                            Source::FutureDofVel => buf.extend_from_slice(f.dof_vel),
                            Source::FutureRot { anchor_only } => {
                                for b in bodies(anchor_only) {
                                    let q = &f.body_rot[b * 4..b * 4 + 4];
                                    buf.extend_from_slice(&align.rot([q[0], q[1], q[2], q[3]]));
                                }
                            }
                            Source::FuturePos { anchor_only } => {
                                for b in bodies(anchor_only) {
                                    let p = &f.body_pos[b * 3..b * 3 + 3];
                                    buf.extend_from_slice(&align.pos([p[0], p[1], p[2]]));
                                }
                            }
                            Source::FutureVel { anchor_only, angular } => {
                                let v = if angular { f.body_ang_vel } else { f.body_vel };
                                for b in bodies(anchor_only) {
                                    let x = &v[b * 3..b * 3 + 3];
                                    buf.extend_from_slice(&align.vel([x[0], x[1], x[2]]));
                                }
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
        let PdTargets { actions, joint_pos_targets: pd, .. } = &mut self.out;
        self.pipeline.step_into(&self.buffers, &mut self.scratch, actions, pd)?;
        Self::filter(
            &self.options,
            &mut self.prev,
            &mut self.prev_prev,
            &mut self.clamp_history,
            &mut self.ema_prev,
            pd,
        );
        let nd = pd.len();
        if self.history > 0 {
            // newest first: step 1 (the previous control step) at index 0
            self.fed_targets.copy_within(..(self.history - 1) * nd, nd);
            self.fed_targets[..nd].copy_from_slice(pd);
            self.fed_actions.copy_within(..(self.history - 1) * nd, nd);
            self.fed_actions[..nd].copy_from_slice(actions);
        }
        self.frame = self.frame.saturating_add(1);
        Ok(&self.out)
    }

    /// The acceleration clamp, then the EMA filter, in NumPy float32 as the
    /// deployment loop computes them (Python floats rounded to float32).
    fn filter(
        options: &TrackerOptions,
        prev: &mut Vec<f32>,
        prev_prev: &mut Vec<f32>,
        clamp_history: &mut usize,
        ema_prev: &mut Option<Vec<f32>>,
        pd: &mut [f32],
    ) {
        if let (Some(max), 2) = (options.pd_target_max_accel, *clamp_history) {
            let m = max as f32;
            for ((x, p), pp) in pd.iter_mut().zip(prev.iter()).zip(prev_prev.iter()) {
                let delta = *x - p;
                let prev_delta = p - pp;
                *x = p + prev_delta + clip(delta - prev_delta, -m, m);
            }
        }
        std::mem::swap(prev, prev_prev);
        prev.copy_from_slice(pd);
        *clamp_history = (*clamp_history + 1).min(2);
        let alpha = options.action_ema_alpha;
        if alpha < 1.0 {
            let prev = ema_prev.get_or_insert_with(|| pd.to_vec());
            let (a, b) = (alpha as f32, (1.0 - alpha) as f32);
            for (x, p) in pd.iter_mut().zip(prev.iter_mut()) {
                *x = a * *x + b * *p;
                *p = *x;
            }
        }
    }
}

/// `np.clip`: NaN stays NaN, bounds in either order never panic.
fn clip(x: f32, lo: f32, hi: f32) -> f32 {
    if x < lo {
        lo
    } else if x > hi {
        hi
    } else {
        x
    }
}
