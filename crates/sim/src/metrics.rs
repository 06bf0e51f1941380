//! How well the simulated robot tracks its reference, and whether it fell:
//! measured after each control period against the clip's frame of that
//! step, in the robot's frame (the tracker's start alignment).

use pmstate_deploy::motion::Frame;
use pmstate_deploy::{Alignment, TrackerStatus};
use serde::Serialize;

/// When the robot counts as fallen.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FallCriteria {
    /// The anchor below this fraction of the reference anchor's height.
    pub height_fraction: f64,
    /// The anchor tilted more than this from upright, radians.
    pub max_tilt: f64,
}

impl Default for FallCriteria {
    /// Half the reference's height, or tilted by more than 1 rad (57 degrees).
    fn default() -> Self {
        FallCriteria { height_fraction: 0.5, max_tilt: 1.0 }
    }
}

/// One step's measurements.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StepMetrics {
    /// The largest |joint - reference joint|, radians (ProtoMotions' loop
    /// reports its maximum over the run as `max joint ref error`).
    pub joint_error_max: f32,
    /// The mean |joint - reference joint|, radians.
    pub joint_error_mean: f32,
    /// Distance from the anchor to the reference anchor, metres.
    pub anchor_error: f32,
    /// Mean distance from each body to its reference, metres.
    pub body_error: f32,
    /// The anchor's height, metres.
    pub anchor_height: f32,
    /// The anchor's tilt from upright, radians.
    pub tilt: f32,
    /// Whether the robot is down by [`FallCriteria`].
    pub fallen: bool,
}

/// What a step's measurement reads from the simulator.
#[derive(Debug, Clone, Copy)]
pub struct Measured<'a> {
    /// Joint positions (MuJoCo's `qpos[7:]`).
    pub dof_pos: &'a [f64],
    /// Body positions, `[B][3]`, the contract's order.
    pub body_pos: &'a [[f64; 3]],
    /// The anchor's orientation, xyzw.
    pub anchor_rot: [f64; 4],
}

/// Measures a step against the reference `frame`.
pub fn measure(
    m: &Measured<'_>,
    frame: &Frame<'_>,
    alignment: Option<&Alignment>,
    anchor: usize,
    fall: &FallCriteria,
) -> StepMetrics {
    let nd = m.dof_pos.len().min(frame.dof_pos.len());
    let (mut jmax, mut jsum) = (0f64, 0f64);
    for (&q, &r) in m.dof_pos.iter().zip(frame.dof_pos) {
        let e = (q - f64::from(r)).abs();
        jmax = jmax.max(e);
        jsum += e;
    }
    let reference = |b: usize| -> [f64; 3] {
        let p = [frame.body_pos[3 * b], frame.body_pos[3 * b + 1], frame.body_pos[3 * b + 2]];
        let p = alignment.map_or(p, |a| a.pos(p));
        p.map(f64::from)
    };
    let nb = m.body_pos.len().min(frame.body_pos.len() / 3);
    let dist =
        |a: [f64; 3], b: [f64; 3]| ((a[0] - b[0]).powi(2) + (a[1] - b[1]).powi(2) + (a[2] - b[2]).powi(2)).sqrt();
    let body_sum: f64 = (0..nb).map(|b| dist(m.body_pos[b], reference(b))).sum();
    let (anchor_error, height, ref_height) = if anchor < nb {
        (dist(m.body_pos[anchor], reference(anchor)), m.body_pos[anchor][2], reference(anchor)[2])
    } else {
        (f64::NAN, f64::NAN, f64::NAN)
    };
    let [x, y, z, w] = m.anchor_rot;
    let n = x * x + y * y + z * z + w * w;
    let tilt = (1.0 - 2.0 * (x * x + y * y) / n).clamp(-1.0, 1.0).acos();
    let fallen = height < fall.height_fraction * ref_height || tilt > fall.max_tilt || !height.is_finite();
    StepMetrics {
        joint_error_max: jmax as f32,
        joint_error_mean: if nd > 0 { (jsum / nd as f64) as f32 } else { 0.0 },
        anchor_error: anchor_error as f32,
        body_error: if nb > 0 { (body_sum / nb as f64) as f32 } else { 0.0 },
        anchor_height: height as f32,
        tilt: tilt as f32,
        fallen,
    }
}

/// A run's summary.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Control steps run.
    pub steps: usize,
    /// Simulated seconds.
    pub sim_seconds: f64,
    /// Wall-clock seconds the loop took.
    pub wall_seconds: f64,
    /// Simulated seconds per wall-clock second.
    pub real_time_factor: f64,
    /// The first step at which the robot was down, if it fell.
    pub first_fall: Option<usize>,
    /// Steps spent down.
    pub fallen_steps: usize,
    /// Mean over steps of the mean joint error, radians.
    pub joint_error_mean: f64,
    /// The largest joint error of the run, radians.
    pub joint_error_max: f64,
    /// Mean anchor error, metres.
    pub anchor_error_mean: f64,
    /// Largest anchor error, metres.
    pub anchor_error_max: f64,
    /// Mean body error, metres.
    pub body_error_mean: f64,
    /// Readings lost on the way (dropped readings).
    pub dropped_readings: u64,
    /// Steps whose targets were held because the tracker refused the reading.
    pub held_steps: usize,
    /// The tracker's counts (refusals, guards, safe mode).
    pub tracker: TrackerStatus,
    /// The control step's time (reading the state, the tracker's step; not
    /// the physics, which stands for the robot).
    pub control_step: StepTimes,
    /// Paced runs: deadlines the loop had already missed when it came to
    /// wait for them (a step overran its period).
    pub missed_periods: usize,
    /// Paced runs: the latest wake-up after a deadline, seconds.
    pub max_late_seconds: f64,
}

/// Percentiles of the control step's time, seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StepTimes {
    /// Median.
    pub p50_seconds: f64,
    /// 99th percentile.
    pub p99_seconds: f64,
    /// Slowest.
    pub max_seconds: f64,
}

impl StepTimes {
    /// The percentiles of `ns` (nanoseconds; sorted in place).
    pub fn of(ns: &mut [u32]) -> Self {
        if ns.is_empty() {
            return StepTimes::default();
        }
        ns.sort_unstable();
        let pick = |q: f64| f64::from(ns[((ns.len() - 1) as f64 * q).round() as usize]) * 1e-9;
        StepTimes { p50_seconds: pick(0.5), p99_seconds: pick(0.99), max_seconds: pick(1.0) }
    }
}

impl Summary {
    /// Adds one step's measurements.
    pub fn add(&mut self, step: usize, m: &StepMetrics) {
        self.steps += 1;
        let k = self.steps as f64;
        let mean = |acc: &mut f64, x: f32| *acc += (f64::from(x) - *acc) / k;
        mean(&mut self.joint_error_mean, m.joint_error_mean);
        mean(&mut self.anchor_error_mean, m.anchor_error);
        mean(&mut self.body_error_mean, m.body_error);
        self.joint_error_max = self.joint_error_max.max(f64::from(m.joint_error_max));
        self.anchor_error_max = self.anchor_error_max.max(f64::from(m.anchor_error));
        if m.fallen {
            self.fallen_steps += 1;
            self.first_fall.get_or_insert(step);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame<'a>(dof: &'a [f32], pos: &'a [f32], rot: &'a [f32]) -> Frame<'a> {
        Frame { dof_pos: dof, dof_vel: dof, body_pos: pos, body_rot: rot, body_vel: pos, body_ang_vel: pos }
    }

    #[test]
    fn errors_against_the_aligned_reference() {
        let dof = [0.1f32, -0.2];
        let pos = [0.0f32, 0.0, 1.0, 0.0, 0.0, 0.5];
        let rot = [0.0f32, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0];
        // the robot starts 1 m along x, turned 90 degrees: the clip's (0, 0) is its (1, 0)
        let h = std::f32::consts::FRAC_1_SQRT_2;
        let a = Alignment {
            heading_offset: [0.0, 0.0, h, h],
            robot_anchor_start_pos: [1.0, 0.0, 1.0],
            motion_anchor_start_pos: [0.0, 0.0, 1.0],
        };
        let bodies = [[1.0, 0.0, 1.0], [1.0, 0.0, 0.2]];
        let m = Measured { dof_pos: &[0.1, 0.3], body_pos: &bodies, anchor_rot: [0.0, 0.0, 0.0, 1.0] };
        let got = measure(&m, &frame(&dof, &pos, &rot), Some(&a), 0, &FallCriteria::default());
        assert!((got.joint_error_max - 0.5).abs() < 1e-6 && (got.joint_error_mean - 0.25).abs() < 1e-6, "{got:?}");
        assert!(got.anchor_error.abs() < 1e-6, "{got:?}");
        assert!((got.body_error - 0.15).abs() < 1e-6, "{got:?}");
        assert!(!got.fallen && got.tilt.abs() < 1e-6);
        // the anchor at a third of the reference's height: fallen
        let low = [[1.0, 0.0, 0.3], [1.0, 0.0, 0.2]];
        let m = Measured { body_pos: &low, ..m };
        assert!(measure(&m, &frame(&dof, &pos, &rot), Some(&a), 0, &FallCriteria::default()).fallen);
        // upright height but lying on its side (90 degrees about x): fallen
        let side = Measured { anchor_rot: [h.into(), 0.0, 0.0, h.into()], ..Measured { body_pos: &bodies, ..m } };
        let got = measure(&side, &frame(&dof, &pos, &rot), Some(&a), 0, &FallCriteria::default());
        assert!(got.fallen && (f64::from(got.tilt) - std::f64::consts::FRAC_PI_2).abs() < 1e-6, "{got:?}");
    }

    #[test]
    fn the_summary_keeps_means_maxima_and_the_first_fall() {
        let mut s = Summary::default();
        let step = |e: f32, fallen| StepMetrics {
            joint_error_mean: e,
            joint_error_max: 2.0 * e,
            anchor_error: e,
            fallen,
            ..StepMetrics::default()
        };
        s.add(0, &step(1.0, false));
        s.add(1, &step(3.0, true));
        s.add(2, &step(2.0, true));
        assert_eq!((s.steps, s.first_fall, s.fallen_steps), (3, Some(1), 2));
        assert!((s.joint_error_mean - 2.0).abs() < 1e-12 && s.joint_error_max == 6.0 && s.anchor_error_max == 3.0);
    }

    #[test]
    fn step_time_percentiles() {
        let mut ns: Vec<u32> = (1..=100).rev().map(|x| x * 1000).collect();
        let t = StepTimes::of(&mut ns);
        let us = |x: f64| (x * 1e6).round();
        assert_eq!((us(t.p50_seconds), us(t.p99_seconds), us(t.max_seconds)), (51.0, 99.0, 100.0));
        assert_eq!(StepTimes::of(&mut []), StepTimes::default());
    }
}
