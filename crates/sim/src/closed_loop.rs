//! The closed loop: ProtoMotions' `test_tracker_mujoco.py` loop with
//! pmstate's [`Tracker`] (and its safety envelope) in place of the exported
//! graph and its post-processing. Per control step: the state before the
//! step is recorded, the robot's readings taken (and perturbed), the
//! tracker steps, its targets go to the actuators for `decimation` physics
//! steps, and the result is measured against the clip's frame of that step.

use std::time::{Duration, Instant};

use pmstate_deploy::realtime::Pacer;
use pmstate_deploy::Tracker;

use crate::error::{Result, SimError};
use crate::metrics::{measure, FallCriteria, Measured, StepMetrics, Summary};
use crate::mujoco::Robot;
use crate::perturb::{Perturbations, Perturber};
use crate::reading::Reading;

/// The most control steps a run records (two hours at 50 Hz): the record
/// grows by a few hundred bytes a step.
pub const MAX_RECORDED_STEPS: usize = 360_000;

/// How to run the loop.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LoopOptions {
    /// Control steps (default: the clip's frames at the control rate).
    pub steps: Option<usize>,
    /// Between the robot and the tracker.
    pub perturbations: Perturbations,
    /// When the robot counts as fallen.
    pub fall: FallCriteria,
    /// Keep every step's state, targets and measurements ([`Record`]).
    pub record: Recording,
    /// As fast as the machine goes, or one control step per control period.
    pub pace: Pace,
}

/// How fast the loop runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pace {
    /// Back to back (a simulation's usual way).
    #[default]
    AsFast,
    /// Each step starts at its deadline on the wall clock (absolute
    /// deadlines one control period apart), as on a robot; missed deadlines
    /// are counted. `spin`: the last part of each period polled instead
    /// of slept ([`Pacer::with_spin`]).
    RealTime {
        /// Busy-wait before each deadline.
        spin: Duration,
    },
}

/// The most control-step times kept for the percentiles (4 bytes each).
const MAX_TIMED_STEPS: usize = MAX_RECORDED_STEPS;

/// Whether a run keeps its per-step record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Recording {
    /// Only the summary.
    #[default]
    Summary,
    /// Every step (bounded by [`MAX_RECORDED_STEPS`]).
    EveryStep,
}

/// Every step of a run, row-major `[T, ...]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Record {
    /// MuJoCo's `qpos` before each control step, `[T, nq]`.
    pub qpos: Vec<f64>,
    /// `qvel` before each step, `[T, nv]`.
    pub qvel: Vec<f64>,
    /// What each step commanded, `[T, D]`.
    pub joint_pos_targets: Vec<f32>,
    /// The policy's actions, `[T, D]` (the last ones while a reading is refused).
    pub actions: Vec<f32>,
    /// The tracker's event bits per step (`envelope::events`).
    pub events: Vec<u32>,
    /// Measurements after each step.
    pub metrics: Vec<StepMetrics>,
    /// `nq`, `nv`, `D`.
    pub widths: (usize, usize, usize),
}

/// Runs the loop from the clip's first frame.
pub fn run(tracker: &mut Tracker, robot: &mut Robot, options: &LoopOptions) -> Result<(Summary, Record)> {
    let nd = tracker.pipeline().dims().num_dofs;
    let frames = tracker.player().total_frames();
    let steps = options.steps.unwrap_or(frames);
    let recording = options.record == Recording::EveryStep;
    if recording && steps > MAX_RECORDED_STEPS {
        return Err(SimError::Option {
            option: "steps",
            value: steps.to_string(),
            domain: "at most 360000 when every step is recorded",
        });
    }
    let anchor = tracker.pipeline().contract().robot.anchor_body_index;
    let stamped = tracker.options().envelope.stale_after_periods.is_some();
    let (nq, nv) = (robot.qpos().len(), robot.qvel().len());
    let nb = robot.num_bodies();
    let mut record = Record { widths: (nq, nv, nd), ..Record::default() };
    if recording {
        record.qpos.reserve_exact(steps * nq);
        record.qvel.reserve_exact(steps * nv);
        record.joint_pos_targets.reserve_exact(steps * nd);
        record.actions.reserve_exact(steps * nd);
        record.events.reserve_exact(steps);
        record.metrics.reserve_exact(steps);
    }
    let mut perturber = Perturber::new(options.perturbations.clone(), nd)?;
    let first = tracker.player().frame(0);
    robot.set_initial_pose(&first);
    let mut truth = Reading::zeros(nd);
    let mut targets = vec![0f32; nd];
    let mut actions = vec![0f32; nd];
    let mut have_targets = false;
    let mut body_pos = vec![[0f64; 3]; nb];
    let mut dof_pos = vec![0f64; nd];
    let mut summary = Summary::default();
    let push = options.perturbations.clone();
    let mut step_ns: Vec<u32> = Vec::with_capacity(steps.min(MAX_TIMED_STEPS));
    let period = Duration::from_secs_f64(tracker.player().control_dt());
    let mut pacer = match options.pace {
        Pace::AsFast => None,
        Pace::RealTime { spin } => Some(Pacer::new(period).with_spin(spin)),
    };
    let started = Instant::now();
    for k in 0..steps {
        if let Some(p) = &mut pacer {
            let w = p.wait();
            summary.missed_periods += usize::from(w.missed);
            summary.max_late_seconds = summary.max_late_seconds.max(w.late.as_secs_f64());
        }
        if recording {
            record.qpos.extend_from_slice(robot.qpos());
            record.qvel.extend_from_slice(robot.qvel());
        }
        let step_started = Instant::now();
        robot.read(&mut truth);
        let now = truth.taken;
        let seen = perturber.deliver(&truth);
        let stepped = tracker.step(&seen.sensors(stamped.then_some(now)));
        if step_ns.len() < MAX_TIMED_STEPS {
            step_ns.push(u32::try_from(step_started.elapsed().as_nanos()).unwrap_or(u32::MAX));
        }
        match stepped {
            Ok(out) => {
                targets.copy_from_slice(&out.joint_pos_targets);
                actions.copy_from_slice(&out.actions);
                have_targets = true;
            }
            Err(e) if e.is_refused_reading() => {
                // the robot holds its last targets; before any, where it stands
                summary.held_steps += 1;
                if !have_targets {
                    targets.copy_from_slice(&truth.dof_pos);
                }
            }
            Err(e) => return Err(e.into()),
        }
        robot.step(&targets, |t| push.push_force(t));
        if let Some(what) = robot.non_finite() {
            return Err(SimError::Diverged { step: k, what });
        }
        for (b, p) in body_pos.iter_mut().enumerate() {
            *p = robot.body_pos(b);
        }
        for (d, &q) in dof_pos.iter_mut().zip(robot.joint_positions()) {
            *d = q;
        }
        let frame = tracker.player().frame(k.min(frames.saturating_sub(1)));
        let measured = Measured { dof_pos: &dof_pos, body_pos: &body_pos, anchor_rot: robot.anchor_rot() };
        let m = measure(&measured, &frame, tracker.alignment(), anchor, &options.fall);
        summary.add(k, &m);
        if recording {
            record.joint_pos_targets.extend_from_slice(&targets);
            record.actions.extend_from_slice(&actions);
            record.events.push(tracker.status().last_events);
            record.metrics.push(m);
        }
    }
    summary.wall_seconds = started.elapsed().as_secs_f64();
    summary.sim_seconds = robot.time();
    summary.real_time_factor =
        if summary.wall_seconds > 0.0 { summary.sim_seconds / summary.wall_seconds } else { f64::INFINITY };
    summary.dropped_readings = perturber.dropped;
    summary.tracker = tracker.status();
    summary.control_step = crate::metrics::StepTimes::of(&mut step_ns);
    Ok((summary, record))
}
