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

use std::time::Instant;

use crate::context::Feedback;
use crate::contract::Contract;
use crate::envelope::{events, tilt, EndOfClip, Envelope, SafePose, SafeReason, SensorBounds, TrackerStatus};
use crate::error::{DeployError, Result, SensorProblem};
use crate::limits::zeroed;
use crate::motion::MotionPlayer;
use crate::pipeline::{Pipeline, StepScratch};
use crate::recorder::{Record, RecordKind, Recorder};
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
    /// When the readings were taken, for the stale-sensor guard
    /// ([`Envelope::stale_after_periods`]; required while it is on).
    pub stamp: Option<Stamp>,
}

/// The age of a reading: when it was taken and the time of the step, in
/// seconds on one clock (a monotonic one; the origin does not matter).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stamp {
    /// When the sensors were read.
    pub taken: f64,
    /// Now, as the control step starts.
    pub now: f64,
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

/// How the targets are filtered (the contract's `control`, unless
/// overridden) and the safety envelope around them.
#[derive(Debug, Clone, PartialEq)]
pub struct TrackerOptions {
    /// `targets = alpha * targets + (1 - alpha) * previous` (1: no filter); in (0, 1].
    pub action_ema_alpha: f64,
    /// Limit on the second difference of the targets per step (> 0, or none).
    pub pd_target_max_accel: Option<f64>,
    /// The safety envelope.
    pub envelope: Envelope,
}

impl TrackerOptions {
    /// The contract's filters with the safety envelope on where the robot
    /// config gives its numbers: the targets clamped to the joint limits and
    /// rate-limited to the joints' velocity limits. The other guards (soft
    /// start, tilt, stale sensors, stop at the end of the clip) are off
    /// until set.
    pub fn new(pipeline: &Pipeline) -> Self {
        let limits = pipeline.limits();
        TrackerOptions {
            envelope: Envelope {
                joint_limits: limits.joints.clone(),
                max_target_rate: limits.velocity.clone(),
                ..Envelope::off()
            },
            ..Self::reference(pipeline.contract())
        }
    }

    /// ProtoMotions' own deployment loop (`test_tracker_mujoco.py`): the
    /// contract's filters and [`Envelope::off`]. Readings that are not
    /// finite or beyond the physical bounds are still refused, and a
    /// non-finite output still enters the safe mode.
    pub fn reference(c: &Contract) -> Self {
        TrackerOptions {
            action_ema_alpha: c.control.action_ema_alpha,
            pd_target_max_accel: c.control.pd_target_max_accel,
            envelope: Envelope::off(),
        }
    }

    /// Checks every option's domain for a robot of `num_dofs` joints.
    pub fn validate(&self, num_dofs: usize) -> Result<()> {
        let a = self.action_ema_alpha;
        if !(a.is_finite() && a > 0.0 && a <= 1.0) {
            return Err(DeployError::Option { option: "action_ema_alpha", value: a.to_string(), domain: "(0, 1]" });
        }
        if let Some(m) = self.pd_target_max_accel {
            if !(m.is_finite() && m > 0.0) {
                return Err(DeployError::Option {
                    option: "pd_target_max_accel",
                    value: m.to_string(),
                    domain: "finite and > 0, or none",
                });
            }
        }
        self.envelope.validate(num_dofs)
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
    // v3.1's state history of one sensor, most recent first
    Past(Sensor),
    FutureDofPos,
    FutureDofVel,
    FutureRot { anchor_only: bool },
    FuturePos { anchor_only: bool },
    FutureVel { anchor_only: bool, angular: bool },
    RefAnchorPos,
    Body(BodyField),
    GroundHeight,
    // v3.0: the xy the reference is shifted by, the motion clock
    RealignOffset,
    MotionTime,
    MotionLength,
}

/// A sensor whose past readings v3.1's observations read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sensor {
    DofPos,
    DofVel,
    AnchorRot,
    RootLocalAngVel,
    // v3.0: the root body's (bodies[0]) rotation and world angular velocity
    RootRot,
    RootAngVel,
}

impl Sensor {
    const ALL: [Sensor; 6] = [
        Sensor::DofPos,
        Sensor::DofVel,
        Sensor::AnchorRot,
        Sensor::RootLocalAngVel,
        Sensor::RootRot,
        Sensor::RootAngVel,
    ];

    /// The reading; the root body's are empty without `bodies` (a tracker
    /// that reads them refuses such a reading first, `Tracker::check`).
    fn reading<'s>(self, s: &'s Sensors<'_>) -> &'s [f32] {
        match self {
            Sensor::DofPos => s.dof_pos,
            Sensor::DofVel => s.dof_vel,
            Sensor::AnchorRot => &s.anchor_rot,
            Sensor::RootLocalAngVel => &s.root_local_ang_vel,
            Sensor::RootRot => s.bodies.as_ref().map_or(&[][..], |b| b.rot.get(..4).unwrap_or(&[])),
            Sensor::RootAngVel => s.bodies.as_ref().map_or(&[][..], |b| b.ang_vel.get(..3).unwrap_or(&[])),
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Which array of [`BodyState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyField {
    Pos,
    Rot,
    Vel,
    AngVel,
}

const SOURCED: [&str; 33] = [
    "historical.root_rot",
    "historical.root_ang_vel",
    "mimic.realign_offset",
    "mimic.motion_time",
    "mimic.motion_length",
    "historical.buffered_actions",
    "historical.dof_pos",
    "historical.dof_vel",
    "historical.anchor_rot",
    "historical.root_local_ang_vel",
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
        "historical.buffered_actions" => History(Feedback::BufferedActions),
        "historical.dof_pos" => Past(Sensor::DofPos),
        "historical.dof_vel" => Past(Sensor::DofVel),
        "historical.anchor_rot" => Past(Sensor::AnchorRot),
        "historical.root_local_ang_vel" => Past(Sensor::RootLocalAngVel),
        "historical.root_rot" => Past(Sensor::RootRot),
        "historical.root_ang_vel" => Past(Sensor::RootAngVel),
        "mimic.realign_offset" => RealignOffset,
        "mimic.motion_time" => MotionTime,
        "mimic.motion_length" => MotionLength,
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

    /// No alignment: the clip's frame is the robot's (v3.0, which shifts
    /// the reference each step instead). Every method returns its
    /// argument to the bit.
    pub fn identity() -> Self {
        Alignment {
            heading_offset: [0.0, 0.0, 0.0, 1.0],
            robot_anchor_start_pos: [0.0; 3],
            motion_anchor_start_pos: [0.0; 3],
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

/// The control loop of one tracker on one reference motion, inside its
/// safety envelope.
///
/// A step that returns `Ok` wrote only finite numbers. A reading that is
/// not finite, not a unit quaternion or beyond its physical bound is
/// refused ([`DeployError::is_refused_reading`]) and leaves the tracker's
/// state (history, filters, alignment, clip time) exactly as it was, so a
/// transient glitch never poisons later steps. State changes only when a
/// step's outputs are known good: each step computes candidates, checks
/// them, then commits.
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
    /// v3.1's buffered actions: `history + 1` rows of clamped actions,
    /// newest first; the input is rows 1..=history.
    buffered_actions: Vec<f32>,
    /// v3.1's state history per [`Sensor`]: `history` past readings,
    /// newest first, valid once `has_past`.
    past: [Vec<f32>; 6],
    has_past: bool,
    /// v3.0: the reference in the clip's own frame (no start alignment),
    /// shifted each step by `realign` (see [`crate::v30`]).
    clip_frame: bool,
    /// v3.0's realignment offset set by the last committed step.
    realign: Option<[f32; 2]>,
    /// v3.0's motion clock: float32, advanced by the control period per step.
    motion_time: f32,
    frame: usize,
    alignment: Option<Alignment>,
    /// The EMA's previous output, valid once `has_ema`.
    ema_prev: Vec<f32>,
    has_ema: bool,
    /// The last two targets before the EMA (the acceleration clamp's history).
    prev: Vec<f32>,
    prev_prev: Vec<f32>,
    /// How many of `prev`, `prev_prev` hold a step (0 to 2).
    clamp_history: usize,
    /// This step's candidates, committed only when finite.
    cand_actions: Vec<f32>,
    cand_targets: Vec<f32>,
    pre_ema: Vec<f32>,
    /// Policy steps since the clip (re)started: the soft start's clock.
    run_steps: u64,
    /// The measured pose at the first step (the soft start's origin).
    start_pose: Vec<f32>,
    /// The targets last commanded (the rate limit's origin), once `has_last_cmd`.
    last_cmd: Vec<f32>,
    has_last_cmd: bool,
    status: TrackerStatus,
    recorder: Option<Recorder>,
    scratch: StepScratch,
    out: PdTargets,
}

impl Tracker {
    /// A tracker for `pipeline` playing `player` (resampled at the
    /// contract's `dt`); refuses a pipeline input it cannot source and
    /// options outside their domain ([`TrackerOptions::validate`]).
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
        options.validate(dims.num_dofs)?;
        let mut sources = Vec::new();
        let mut buffers = Vec::new();
        for i in pipeline.inputs() {
            let s = source(&i.path).ok_or_else(|| DeployError::Unsourced {
                path: i.path.clone(),
                sourced: SOURCED.iter().map(|s| (*s).to_owned()).collect(),
            })?;
            sources.push(s);
            buffers.push(zeroed(i.row_len(), "an input buffer")?);
        }
        let c = pipeline.contract();
        let future_steps = c.motion.future_step_indices.clone();
        let anchor = c.robot.anchor_body_index;
        let nd = dims.num_dofs;
        let history = dims.history_steps;
        // sizes from the configs, bounded at load (crate::limits); allocated fallibly
        let fed = history.checked_mul(nd).ok_or(DeployError::Allocation { what: "the history", bytes: usize::MAX })?;
        let uses = |x: Source| sources.contains(&x);
        let buffered_actions = if uses(Source::History(Feedback::BufferedActions)) {
            zeroed(fed.saturating_add(nd), "the history")?
        } else {
            Vec::new()
        };
        let mut past: [Vec<f32>; 6] = Default::default();
        for x in Sensor::ALL {
            if uses(Source::Past(x)) {
                let width = match x {
                    Sensor::DofPos | Sensor::DofVel => nd,
                    Sensor::AnchorRot | Sensor::RootRot => 4,
                    Sensor::RootLocalAngVel | Sensor::RootAngVel => 3,
                };
                let len = history
                    .checked_mul(width)
                    .ok_or(DeployError::Allocation { what: "the state history", bytes: usize::MAX })?;
                past[x.index()] = zeroed(len, "the state history")?;
            }
        }
        Ok(Tracker {
            future_steps,
            anchor,
            sources,
            buffers,
            history,
            fed_targets: zeroed(fed, "the history")?,
            fed_actions: zeroed(fed, "the history")?,
            buffered_actions,
            past,
            has_past: false,
            clip_frame: pipeline.reference_frame() == crate::context::ReferenceFrame::ClipRealigned,
            realign: None,
            motion_time: 0.0,
            frame: 0,
            alignment: None,
            ema_prev: vec![0.0; nd],
            has_ema: false,
            prev: vec![0.0; nd],
            prev_prev: vec![0.0; nd],
            clamp_history: 0,
            cand_actions: vec![0.0; nd],
            cand_targets: vec![0.0; nd],
            pre_ema: vec![0.0; nd],
            run_steps: 0,
            start_pose: vec![0.0; nd],
            last_cmd: vec![0.0; nd],
            has_last_cmd: false,
            status: TrackerStatus::default(),
            recorder: None,
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

    /// Back to the clip's first frame: alignment, history, filters and soft
    /// start cleared, the safe mode left. The rate limit still starts from
    /// the targets last commanded (the motors are where they were told).
    pub fn reset(&mut self) {
        self.frame = 0;
        self.alignment = None;
        self.has_ema = false;
        self.clamp_history = 0;
        self.run_steps = 0;
        self.fed_targets.iter_mut().for_each(|x| *x = 0.0);
        self.fed_actions.iter_mut().for_each(|x| *x = 0.0);
        self.buffered_actions.iter_mut().for_each(|x| *x = 0.0);
        self.has_past = false;
        self.realign = None;
        self.motion_time = 0.0;
        self.status.safe_mode = None;
        self.record(RecordKind::Reset, 0, None, None);
    }

    /// An operator's stop: the safe mode, latched until [`Tracker::reset`].
    pub fn stop(&mut self) {
        if self.status.safe_mode.is_none() {
            self.status.trip(SafeReason::Operator);
        }
        self.record(RecordKind::Stop, events::OPERATOR_STOP, None, None);
    }

    /// What the tracker did since it was opened, and its safe mode.
    pub fn status(&self) -> TrackerStatus {
        let mut s = self.status;
        if let Some(r) = &self.recorder {
            s.recorder_dropped = r.dropped();
            s.recorder_failed = r.failed();
        }
        s
    }

    /// The options it runs with.
    pub fn options(&self) -> &TrackerOptions {
        &self.options
    }

    /// The next step's frame of the clip.
    pub fn frame(&self) -> usize {
        self.frame
    }

    /// Whether every frame of the clip has been played (later steps hold
    /// its last frame, or enter the safe mode with [`EndOfClip::Stop`]).
    pub fn finished(&self) -> bool {
        self.frame >= self.player.total_frames()
    }

    /// The pipeline.
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// The pipeline back, for another tracker (loading one is the slow part).
    pub fn into_pipeline(self) -> Pipeline {
        self.pipeline
    }

    /// The motion player.
    pub fn player(&self) -> &MotionPlayer {
        &self.player
    }

    /// The alignment captured at the first step.
    pub fn alignment(&self) -> Option<&Alignment> {
        self.alignment.as_ref()
    }

    /// The inputs of the last step, in the pipeline's input order.
    pub fn last_inputs(&self) -> &[Vec<f32>] {
        &self.buffers
    }

    /// Logs every later step (sensors in, targets out, events, step time)
    /// to `path` through a bounded in-memory ring that a thread of its own
    /// writes out: a step never blocks on the file and allocates nothing;
    /// when the ring is full a record is dropped and counted
    /// ([`TrackerStatus::recorder_dropped`]). `pmstate deploy replay
    /// --from-log` reproduces the logged targets bit for bit. Replaces (and
    /// finishes) a recording under way.
    ///
    /// `path` may be a regular file (created or truncated), a FIFO or a
    /// character device (written as a stream, never replaced; a FIFO no
    /// process has open for reading is an error at once, not a wait); a
    /// directory, block device or socket is [`DeployError::Log`] naming it.
    pub fn record_to(&mut self, path: &std::path::Path, meta: &crate::recorder::LogMeta) -> Result<()> {
        self.finish_recording()?;
        let dims = self.pipeline.dims();
        let layout = crate::recorder::Layout::new(dims.num_dofs, dims.num_bodies);
        self.recorder = Some(Recorder::start(path, layout, &self.options, meta)?);
        Ok(())
    }

    /// Stops the recording: every record still in the ring is written and
    /// the file closed. Returns what was written (none when not recording).
    pub fn finish_recording(&mut self) -> Result<Option<crate::recorder::RecorderSummary>> {
        match self.recorder.take() {
            Some(r) => r.finish().map(Some),
            None => Ok(None),
        }
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
        if self.options.envelope.stale_after_periods.is_some() && s.stamp.is_none() {
            return Err(DeployError::Sensor { name: "stamp", problem: SensorProblem::Missing });
        }
        let needs_bodies = self.sources.iter().any(|x| {
            matches!(
                x,
                Source::Body(_)
                    | Source::GroundHeight
                    | Source::RealignOffset
                    | Source::Past(Sensor::RootRot | Sensor::RootAngVel)
            )
        });
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
    ///
    /// `Ok` means every value of the returned targets, actions and gains is
    /// finite and inside the envelope; in the safe mode they are the safe
    /// pose's. A refused reading is an `Err` for which
    /// [`DeployError::is_refused_reading`] holds, and changes nothing but
    /// the count of refusals.
    pub fn step(&mut self, s: &Sensors<'_>) -> Result<&PdTargets> {
        let started = self.recorder.as_ref().map(|_| Instant::now());
        self.check(s)?;
        match self.step_checked(s) {
            Ok(ev) => {
                self.status.steps += 1;
                self.status.last_events = ev;
                if ev & events::SAFE_MODE != 0 {
                    self.status.safe_mode_steps += 1;
                }
                self.record(RecordKind::Step, ev, Some(s), started);
                Ok(&self.out)
            }
            Err(e) => {
                if e.is_refused_reading() {
                    self.status.refused_readings += 1;
                    self.status.last_events = events::REFUSED;
                    self.record(RecordKind::Refused, events::REFUSED, Some(s), started);
                }
                Err(e)
            }
        }
    }

    fn record(&mut self, kind: RecordKind, events: u32, s: Option<&Sensors<'_>>, started: Option<Instant>) {
        if let Some(r) = &mut self.recorder {
            let step_ns = started.map_or(0, |t| u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
            r.push(&Record { kind, events, step_ns, sensors: s, out: &self.out });
        }
    }

    fn step_checked(&mut self, s: &Sensors<'_>) -> Result<u32> {
        check_reading(s, &self.options.envelope.sensor_bounds)?;
        let mut ev = 0;
        if self.status.safe_mode.is_none() {
            if let Some(reason) = self.guard(s) {
                self.status.trip(reason);
                ev |= reason.event();
            }
        }
        if self.status.safe_mode.is_none() {
            match self.policy_step(s)? {
                Some(e) => ev |= e,
                None => {
                    self.status.trip(SafeReason::NonFiniteOutput);
                    ev |= events::NON_FINITE_OUTPUT;
                }
            }
        }
        if self.status.safe_mode.is_some() {
            ev |= events::SAFE_MODE | self.safe_step(s);
        }
        Ok(ev)
    }

    /// The guard that trips on this reading, if one does.
    fn guard(&self, s: &Sensors<'_>) -> Option<SafeReason> {
        let env = &self.options.envelope;
        if let (Some(n), Some(st)) = (env.stale_after_periods, s.stamp) {
            if st.now - st.taken > f64::from(n) * self.player.control_dt() {
                return Some(SafeReason::Stale);
            }
        }
        if let Some(max) = env.max_tilt {
            if tilt(s.anchor_rot) > max {
                return Some(SafeReason::Tilt);
            }
        }
        if env.end_of_clip == EndOfClip::Stop && self.finished() {
            return Some(SafeReason::EndOfClip);
        }
        None
    }

    /// The policy's step: candidates computed from the state, checked, put
    /// through the envelope and committed. `None`: a non-finite output,
    /// nothing committed.
    fn policy_step(&mut self, s: &Sensors<'_>) -> Result<Option<u32>> {
        let align = match self.alignment {
            Some(a) => a,
            None if self.clip_frame => Alignment::identity(),
            None => {
                let f = self.player.frame(0);
                let a = self.anchor;
                let p = &f.body_pos[a * 3..a * 3 + 3];
                let q = &f.body_rot[a * 4..a * 4 + 4];
                Alignment::new(
                    s.anchor_pos.unwrap_or([0.0; 3]),
                    s.anchor_rot,
                    [p[0], p[1], p[2]],
                    [q[0], q[1], q[2], q[3]],
                )
            }
        };
        self.assemble(s, &align);
        self.pipeline.step_into(&self.buffers, &mut self.scratch, &mut self.cand_actions, &mut self.cand_targets)?;
        self.filter_candidate();
        if !all_finite(&self.cand_actions) || !all_finite(&self.cand_targets) {
            return Ok(None);
        }
        let ev = self.apply_envelope(s.dof_pos);
        if !all_finite(&self.out.joint_pos_targets) {
            return Ok(None);
        }
        // commit
        self.out.actions.copy_from_slice(&self.cand_actions);
        self.last_cmd.copy_from_slice(&self.out.joint_pos_targets);
        self.has_last_cmd = true;
        self.alignment = Some(align);
        self.commit_filter();
        let nd = self.cand_targets.len();
        if self.history > 0 {
            // newest first: step 1 (the previous control step) at index 0
            self.fed_targets.copy_within(..(self.history - 1) * nd, nd);
            self.fed_targets[..nd].copy_from_slice(&self.cand_targets);
            self.fed_actions.copy_within(..(self.history - 1) * nd, nd);
            self.fed_actions[..nd].copy_from_slice(&self.cand_actions);
        }
        if !self.buffered_actions.is_empty() {
            // BaseEnv.post_physics_step: the clamped action into slot 0
            self.buffered_actions.copy_within(..self.history * nd, nd);
            let clamp = self.pipeline.action().transform;
            for (b, a) in self.buffered_actions[..nd].iter_mut().zip(&self.cand_actions) {
                *b = match clamp {
                    crate::actions::Transform::Clamp(c) if !a.is_nan() => a.max(-c).min(c),
                    _ => *a,
                };
            }
        }
        for x in Sensor::ALL {
            let past = &mut self.past[x.index()];
            if past.is_empty() {
                continue;
            }
            let r = x.reading(s);
            let w = r.len();
            if self.has_past {
                past.copy_within(..(self.history - 1) * w, w);
                past[..w].copy_from_slice(r);
            } else {
                // reset_from_single_state: every slot the first reading
                past.chunks_mut(w).for_each(|c| c.copy_from_slice(r));
            }
        }
        self.has_past = true;
        if self.clip_frame {
            // BaseEnv.post_physics_step: align_motion_with_humanoid, then the clock
            self.realign = Some(self.realign_of(s));
            self.motion_time += self.player.control_dt() as f32;
        }
        self.frame = self.frame.saturating_add(1);
        self.run_steps += 1;
        Ok(Some(ev))
    }

    /// v3.0's realignment at this step's frame: the robot root's xy minus
    /// the reference root's (`align_motion_with_humanoid`).
    fn realign_of(&self, s: &Sensors<'_>) -> [f32; 2] {
        let f = self.player.frame(self.frame);
        let root = s.bodies.as_ref().map_or(&[][..], |b| b.pos);
        match root.get(..2) {
            Some(r) => [r[0] - f.body_pos[0], r[1] - f.body_pos[1]],
            None => [0.0; 2],
        }
    }

    /// The pipeline's inputs of this step into `buffers`.
    fn assemble(&mut self, s: &Sensors<'_>, align: &Alignment) {
        let anchor = self.anchor;
        let nb = self.player.num_bodies();
        let realign = if self.clip_frame { self.realign.unwrap_or_else(|| self.realign_of(s)) } else { [0.0; 2] };
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
                Source::History(Feedback::BufferedActions) => {
                    let nd = s.dof_pos.len();
                    buf.extend_from_slice(&self.buffered_actions[nd..]);
                }
                Source::Past(x) => {
                    if self.has_past {
                        buf.extend_from_slice(&self.past[x.index()]);
                    } else {
                        // the first step after a reset: the history is this reading
                        for _ in 0..self.history {
                            buf.extend_from_slice(x.reading(s));
                        }
                    }
                }
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
                // the last step's realignment; after a reset, this step's
                Source::RealignOffset => buf.extend_from_slice(&realign),
                Source::MotionTime => buf.push(self.motion_time),
                Source::MotionLength => buf.push(self.player.length()),
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
    }

    /// The acceleration clamp, then the EMA filter, on the candidate
    /// targets, in NumPy float32 as the deployment loop computes them
    /// (Python floats rounded to float32); the state is read, not changed.
    fn filter_candidate(&mut self) {
        let pd = &mut self.cand_targets;
        if let (Some(max), 2) = (self.options.pd_target_max_accel, self.clamp_history) {
            let m = max as f32;
            for ((x, p), pp) in pd.iter_mut().zip(self.prev.iter()).zip(self.prev_prev.iter()) {
                let delta = *x - p;
                let prev_delta = p - pp;
                *x = p + prev_delta + clip(delta - prev_delta, -m, m);
            }
        }
        self.pre_ema.copy_from_slice(pd);
        let alpha = self.options.action_ema_alpha;
        if alpha < 1.0 {
            // the first filtered step starts from its own targets
            let prev = if self.has_ema { &self.ema_prev } else { &self.pre_ema };
            let (a, b) = (alpha as f32, (1.0 - alpha) as f32);
            for (x, p) in pd.iter_mut().zip(prev.iter()) {
                *x = a * *x + b * *p;
            }
        }
    }

    /// The filters' state after a committed step.
    fn commit_filter(&mut self) {
        std::mem::swap(&mut self.prev, &mut self.prev_prev);
        self.prev.copy_from_slice(&self.pre_ema);
        self.clamp_history = (self.clamp_history + 1).min(2);
        if self.options.action_ema_alpha < 1.0 {
            self.ema_prev.copy_from_slice(&self.cand_targets);
            self.has_ema = true;
        }
    }

    /// The envelope on the candidate targets into `out`: the soft start,
    /// the rate limit, the joint limits. Counts what it did; commits nothing.
    fn apply_envelope(&mut self, measured: &[f32]) -> u32 {
        if self.run_steps == 0 {
            self.start_pose.copy_from_slice(measured);
            if !self.has_last_cmd {
                self.last_cmd.copy_from_slice(measured);
                self.has_last_cmd = true;
            }
        }
        let env = &self.options.envelope;
        let out = &mut self.out.joint_pos_targets;
        out.copy_from_slice(&self.cand_targets);
        let mut ev = 0;
        if env.soft_start_seconds > 0.0 {
            let elapsed = (self.run_steps + 1) as f64 * self.player.control_dt();
            if elapsed < env.soft_start_seconds {
                let w = (elapsed / env.soft_start_seconds) as f32;
                for (x, s0) in out.iter_mut().zip(&self.start_pose) {
                    *x = s0 + w * (*x - s0);
                }
                ev |= events::SOFT_START;
                self.status.soft_start_steps += 1;
            }
        }
        ev | limit(env, self.player.control_dt() as f32, &self.last_cmd, out, &mut self.status)
    }

    /// The safe mode's targets: the safe pose, rate-limited and clamped,
    /// with the contract's gains and zero actions.
    fn safe_step(&mut self, s: &Sensors<'_>) -> u32 {
        if !self.has_last_cmd {
            self.last_cmd.copy_from_slice(s.dof_pos);
            self.has_last_cmd = true;
        }
        let env = &self.options.envelope;
        let out = &mut self.out.joint_pos_targets;
        match &env.safe_pose {
            SafePose::Measured => out.copy_from_slice(s.dof_pos),
            SafePose::Pose(p) => out.copy_from_slice(p),
        }
        let ev = limit(env, self.player.control_dt() as f32, &self.last_cmd, out, &mut self.status);
        self.out.actions.iter_mut().for_each(|a| *a = 0.0);
        self.last_cmd.copy_from_slice(out);
        ev
    }
}

/// The rate limit (from `last`) and the joint limits on `out`, counted.
fn limit(env: &Envelope, dt: f32, last: &[f32], out: &mut [f32], status: &mut TrackerStatus) -> u32 {
    let mut ev = 0;
    if let Some(rate) = &env.max_target_rate {
        let mut n = 0u64;
        for ((x, l), r) in out.iter_mut().zip(last).zip(rate) {
            let step = r * dt;
            let (lo, hi) = (l - step, l + step);
            if *x < lo {
                *x = lo;
                n += 1;
            } else if *x > hi {
                *x = hi;
                n += 1;
            }
        }
        if n > 0 {
            ev |= events::RATE_LIMIT;
            status.rate_limited += n;
        }
    }
    if let Some(l) = &env.joint_limits {
        let mut n = 0u64;
        for ((x, lo), hi) in out.iter_mut().zip(&l.lower).zip(&l.upper) {
            if *x < *lo {
                *x = *lo;
                n += 1;
            } else if *x > *hi {
                *x = *hi;
                n += 1;
            }
        }
        if n > 0 {
            ev |= events::JOINT_LIMIT;
            status.joint_limit_clamps += n;
        }
    }
    ev
}

/// Every value finite: one branch-free pass the compiler vectorizes (a
/// short-circuiting `all` is a branch per value, measurable in a 2 us step).
fn all_finite(v: &[f32]) -> bool {
    v.iter().fold(true, |ok, x| ok & x.is_finite())
}

/// Every value finite and within `bound` (an infinite bound: finite only);
/// the branch-free pass first, the search for the culprit only on failure.
fn bounded(name: &'static str, v: &[f32], bound: f32) -> Result<()> {
    // NaN fails `<=`, an infinity fails `is_finite`
    if v.iter().fold(true, |ok, x| ok & x.is_finite() & (x.abs() <= bound)) {
        return Ok(());
    }
    for (index, &value) in v.iter().enumerate() {
        if !value.is_finite() {
            return Err(DeployError::Sensor { name, problem: SensorProblem::NonFinite { index, value } });
        }
        if value.abs() > bound {
            return Err(DeployError::Sensor { name, problem: SensorProblem::OutOfRange { index, value, bound } });
        }
    }
    Ok(())
}

/// Every quaternion of `v` (xyzw, packed) finite and of unit norm.
fn unit_quats(name: &'static str, v: &[f32]) -> Result<()> {
    bounded(name, v, f32::INFINITY)?;
    for (index, q) in v.chunks_exact(4).enumerate() {
        let norm = q.iter().map(|x| x * x).sum::<f32>().sqrt();
        if norm.is_nan() || (norm - 1.0).abs() > crate::limits::QUAT_NORM_TOLERANCE {
            return Err(DeployError::Sensor { name, problem: SensorProblem::NotUnit { index, norm } });
        }
    }
    Ok(())
}

/// Refuses a reading that is not finite, not of unit quaternions, or
/// beyond `b`, naming the sensor and index.
fn check_reading(s: &Sensors<'_>, b: &SensorBounds) -> Result<()> {
    bounded("dof_pos", s.dof_pos, b.joint_position)?;
    bounded("dof_vel", s.dof_vel, b.joint_velocity)?;
    unit_quats("anchor_rot", &s.anchor_rot)?;
    bounded("root_local_ang_vel", &s.root_local_ang_vel, b.angular_velocity)?;
    if let Some(p) = &s.anchor_pos {
        bounded("anchor_pos", p, b.position)?;
    }
    if let Some(body) = &s.bodies {
        bounded("bodies.pos", body.pos, b.position)?;
        unit_quats("bodies.rot", body.rot)?;
        bounded("bodies.vel", body.vel, b.linear_velocity)?;
        bounded("bodies.ang_vel", body.ang_vel, b.angular_velocity)?;
        bounded("bodies.ground_height", &[body.ground_height], b.position)?;
    }
    if let Some(st) = &s.stamp {
        for (index, t) in [st.taken, st.now].into_iter().enumerate() {
            if !t.is_finite() {
                let problem = SensorProblem::NonFinite { index, value: t as f32 };
                return Err(DeployError::Sensor { name: "stamp", problem });
            }
        }
    }
    Ok(())
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
