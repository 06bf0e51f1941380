//! The safety envelope around a tracker's PD targets, and the one safe mode
//! every guard falls into (docs/deploy.md, "Safety").
//!
//! What the envelope does to a step's targets, in order: the soft start
//! blends from the measured pose at the first step to the policy's targets;
//! the rate limit bounds the change from the last commanded targets; the
//! joint limits clamp. Guards (tilt, stale sensors, a non-finite policy
//! output, the end of the clip with [`EndOfClip::Stop`], an operator's stop)
//! latch the safe mode until [`crate::Tracker::reset`]: the targets are then
//! the safe pose (the measured joints, so the PD loop only damps, or a
//! configured pose reached at the rate limit), with the contract's gains.

use serde::Serialize;

use crate::error::{DeployError, Result};

/// Joint position limits, per joint in the contract's order (radians; an
/// infinite bound means none).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JointLimits {
    /// Lower limits.
    pub lower: Vec<f32>,
    /// Upper limits.
    pub upper: Vec<f32>,
}

/// What the tracker does once the clip's last frame has been played.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EndOfClip {
    /// Keep tracking the last frame (ProtoMotions' player clamps to it).
    Hold,
    /// Enter the safe mode.
    Stop,
}

/// The pose the safe mode commands.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SafePose {
    /// Each step's measured joint positions: the PD loop's position term
    /// vanishes and only the damping acts (a damped, passive robot).
    Measured,
    /// A fixed pose (radians, per joint), reached at the rate limit.
    Pose(Vec<f32>),
}

/// Physical bounds on sensor readings: a reading beyond one is refused for
/// that step, as a NaN is (a glitch, not a state to act on).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SensorBounds {
    /// |joint position|, radians.
    pub joint_position: f32,
    /// |joint velocity|, radians per second.
    pub joint_velocity: f32,
    /// |angular velocity| of the root and bodies, radians per second, per axis.
    pub angular_velocity: f32,
    /// |position| of the anchor and bodies, metres, per axis.
    pub position: f32,
    /// |linear velocity| of bodies, metres per second, per axis.
    pub linear_velocity: f32,
}

impl Default for SensorBounds {
    /// Beyond what any humanoid's joints, IMU or odometry report when working
    /// (a G1's fastest joint is limited to 37 rad/s; 4 pi covers every
    /// revolute joint's range).
    fn default() -> Self {
        SensorBounds {
            joint_position: 4.0 * std::f32::consts::PI,
            joint_velocity: 100.0,
            angular_velocity: 100.0,
            position: 1.0e4,
            linear_velocity: 100.0,
        }
    }
}

/// The safety envelope (docs/deploy.md, "Safety").
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Envelope {
    /// Targets clamped into these (default: the robot config's
    /// `kinematic_info.dof_limits_lower/upper`).
    pub joint_limits: Option<JointLimits>,
    /// The most each joint's target may move per second (default: the robot
    /// config's `control_info.<joint>.velocity_limit`); at the first step,
    /// from the measured pose.
    pub max_target_rate: Option<Vec<f32>>,
    /// Seconds over which the targets blend from the measured pose at the
    /// first step to the policy's (0: off).
    pub soft_start_seconds: f64,
    /// The anchor's tilt from upright beyond which the safe mode is entered,
    /// radians (`None`: off).
    pub max_tilt: Option<f32>,
    /// Readings older than this many control periods enter the safe mode
    /// (`None`: off; with it on, every reading needs its [`crate::Stamp`]).
    pub stale_after_periods: Option<u32>,
    /// What happens after the clip's last frame.
    pub end_of_clip: EndOfClip,
    /// The safe mode's pose.
    pub safe_pose: SafePose,
    /// Readings beyond these are refused.
    pub sensor_bounds: SensorBounds,
}

impl Envelope {
    /// No guard, no clamp: the reference loop (ProtoMotions'
    /// `test_tracker_mujoco.py`) with only the refusal of non-finite and
    /// out-of-bound readings, and the safe mode on a non-finite output.
    pub fn off() -> Self {
        Envelope {
            joint_limits: None,
            max_target_rate: None,
            soft_start_seconds: 0.0,
            max_tilt: None,
            stale_after_periods: None,
            end_of_clip: EndOfClip::Hold,
            safe_pose: SafePose::Measured,
            sensor_bounds: SensorBounds::default(),
        }
    }

    /// Checks every value's domain for a robot of `num_dofs` joints.
    pub fn validate(&self, num_dofs: usize) -> Result<()> {
        let bad = |option: &'static str, value: String, domain: &'static str| {
            Err(DeployError::Option { option, value, domain })
        };
        let len = |option: &'static str, v: &[f32]| {
            if v.len() == num_dofs {
                Ok(())
            } else {
                bad(option, format!("{} values", v.len()), "one value per joint")
            }
        };
        if let Some(l) = &self.joint_limits {
            len("envelope.joint_limits.lower", &l.lower)?;
            len("envelope.joint_limits.upper", &l.upper)?;
            for (lo, hi) in l.lower.iter().zip(&l.upper) {
                if lo.is_nan() || hi.is_nan() || lo > hi {
                    return bad("envelope.joint_limits", format!("[{lo}, {hi}]"), "lower <= upper, not NaN");
                }
            }
        }
        if let Some(r) = &self.max_target_rate {
            len("envelope.max_target_rate", r)?;
            if let Some(x) = r.iter().find(|x| !(x.is_finite() && **x > 0.0)) {
                return bad("envelope.max_target_rate", x.to_string(), "finite and > 0 rad/s");
            }
        }
        let s = self.soft_start_seconds;
        if !(s.is_finite() && s >= 0.0) {
            return bad("envelope.soft_start_seconds", s.to_string(), "finite and >= 0");
        }
        if let Some(t) = self.max_tilt {
            if !(t.is_finite() && t > 0.0 && t <= std::f32::consts::PI) {
                return bad("envelope.max_tilt", t.to_string(), "in (0, pi] radians");
            }
        }
        if self.stale_after_periods == Some(0) {
            return bad("envelope.stale_after_periods", "0".into(), "at least 1");
        }
        if let SafePose::Pose(p) = &self.safe_pose {
            len("envelope.safe_pose", p)?;
            if let Some(x) = p.iter().find(|x| !x.is_finite()) {
                return bad("envelope.safe_pose", x.to_string(), "finite radians");
            }
        }
        let b = &self.sensor_bounds;
        for (option, v) in [
            ("envelope.sensor_bounds.joint_position", b.joint_position),
            ("envelope.sensor_bounds.joint_velocity", b.joint_velocity),
            ("envelope.sensor_bounds.angular_velocity", b.angular_velocity),
            ("envelope.sensor_bounds.position", b.position),
            ("envelope.sensor_bounds.linear_velocity", b.linear_velocity),
        ] {
            if v.is_nan() || v <= 0.0 {
                return bad(option, v.to_string(), "> 0 (infinity: no bound)");
            }
        }
        Ok(())
    }
}

/// Why the safe mode was entered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[repr(u32)]
pub enum SafeReason {
    /// The anchor tilted beyond [`Envelope::max_tilt`].
    Tilt = 1,
    /// A reading older than [`Envelope::stale_after_periods`].
    Stale = 2,
    /// The policy gave a non-finite action or target.
    NonFiniteOutput = 3,
    /// The clip ended with [`EndOfClip::Stop`].
    EndOfClip = 4,
    /// [`crate::Tracker::stop`] was called.
    Operator = 5,
}

impl SafeReason {
    /// Its name in words.
    pub fn as_str(self) -> &'static str {
        match self {
            SafeReason::Tilt => "tilt",
            SafeReason::Stale => "stale sensors",
            SafeReason::NonFiniteOutput => "non-finite policy output",
            SafeReason::EndOfClip => "end of clip",
            SafeReason::Operator => "operator stop",
        }
    }

    pub(crate) fn event(self) -> u32 {
        match self {
            SafeReason::Tilt => events::TILT,
            SafeReason::Stale => events::STALE,
            SafeReason::NonFiniteOutput => events::NON_FINITE_OUTPUT,
            SafeReason::EndOfClip => events::END_OF_CLIP,
            SafeReason::Operator => events::OPERATOR_STOP,
        }
    }
}

impl std::fmt::Display for SafeReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The events of one step, as bits (the flight recorder logs them).
pub mod events {
    /// The reading was refused.
    pub const REFUSED: u32 = 1;
    /// The step's targets are the safe mode's.
    pub const SAFE_MODE: u32 = 1 << 1;
    /// At least one target was clamped to a joint limit.
    pub const JOINT_LIMIT: u32 = 1 << 2;
    /// At least one target was rate-limited.
    pub const RATE_LIMIT: u32 = 1 << 3;
    /// The soft start blended the targets.
    pub const SOFT_START: u32 = 1 << 4;
    /// The tilt guard tripped on this step.
    pub const TILT: u32 = 1 << 5;
    /// The stale-sensor guard tripped on this step.
    pub const STALE: u32 = 1 << 6;
    /// The policy's output was not finite on this step.
    pub const NON_FINITE_OUTPUT: u32 = 1 << 7;
    /// The clip ended (with [`super::EndOfClip::Stop`]) on this step.
    pub const END_OF_CLIP: u32 = 1 << 8;
    /// An operator's stop.
    pub const OPERATOR_STOP: u32 = 1 << 9;
}

/// Counts of what the tracker did since it was opened (not cleared by a reset).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TrackerStatus {
    /// Steps that returned targets (policy or safe mode).
    pub steps: u64,
    /// Readings refused (each left the tracker's state as it was).
    pub refused_readings: u64,
    /// The latched safe mode, until a reset.
    pub safe_mode: Option<SafeReason>,
    /// Steps whose targets were the safe mode's.
    pub safe_mode_steps: u64,
    /// Joint targets clamped to a limit (joints x steps).
    pub joint_limit_clamps: u64,
    /// Joint targets rate-limited (joints x steps).
    pub rate_limited: u64,
    /// Steps blended by the soft start.
    pub soft_start_steps: u64,
    /// Tilt guard trips.
    pub tilt_trips: u64,
    /// Stale-sensor guard trips.
    pub stale_trips: u64,
    /// Non-finite policy outputs.
    pub non_finite_outputs: u64,
    /// Safe modes entered at the end of the clip.
    pub end_of_clip_stops: u64,
    /// Operator stops.
    pub operator_stops: u64,
    /// The events of the last step (bits of [`events`]).
    pub last_events: u32,
    /// Records the flight recorder dropped because its ring was full.
    pub recorder_dropped: u64,
    /// Whether the flight recorder's writer failed (the log is incomplete).
    pub recorder_failed: bool,
}

impl TrackerStatus {
    pub(crate) fn trip(&mut self, reason: SafeReason) {
        let c = match reason {
            SafeReason::Tilt => &mut self.tilt_trips,
            SafeReason::Stale => &mut self.stale_trips,
            SafeReason::NonFiniteOutput => &mut self.non_finite_outputs,
            SafeReason::EndOfClip => &mut self.end_of_clip_stops,
            SafeReason::Operator => &mut self.operator_stops,
        };
        *c += 1;
        self.safe_mode.get_or_insert(reason);
    }
}

/// The anchor's tilt from upright, radians: the angle between its z axis
/// and the world's (`acos(1 - 2 (x^2 + y^2) / |q|^2)` for xyzw).
pub fn tilt(q: [f32; 4]) -> f32 {
    let [x, y, z, w] = q;
    let n = x * x + y * y + z * z + w * w;
    let c = 1.0 - 2.0 * (x * x + y * y) / n;
    c.clamp(-1.0, 1.0).acos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tilt_of_upright_pitched_and_upside_down() {
        assert_eq!(tilt([0.0, 0.0, 0.0, 1.0]), 0.0);
        // yaw alone is no tilt
        let h = std::f32::consts::FRAC_1_SQRT_2;
        assert!(tilt([0.0, 0.0, h, h]).abs() < 1e-6);
        // 90 degrees about y
        assert!((tilt([0.0, h, 0.0, h]) - std::f32::consts::FRAC_PI_2).abs() < 1e-6);
        // upside down about x
        assert!((tilt([1.0, 0.0, 0.0, 0.0]) - std::f32::consts::PI).abs() < 1e-6);
    }

    #[test]
    fn options_outside_their_domain_are_refused() {
        let ok = Envelope::off();
        ok.validate(3).expect("off is valid");
        let cases: Vec<(Envelope, &str)> = vec![
            (Envelope { soft_start_seconds: f64::NAN, ..Envelope::off() }, "envelope.soft_start_seconds"),
            (Envelope { max_tilt: Some(-1.0), ..Envelope::off() }, "envelope.max_tilt"),
            (Envelope { stale_after_periods: Some(0), ..Envelope::off() }, "envelope.stale_after_periods"),
            (Envelope { max_target_rate: Some(vec![1.0, 0.0, 1.0]), ..Envelope::off() }, "envelope.max_target_rate"),
            (Envelope { max_target_rate: Some(vec![1.0]), ..Envelope::off() }, "envelope.max_target_rate"),
            (
                Envelope {
                    joint_limits: Some(JointLimits { lower: vec![0.0, 1.0, 0.0], upper: vec![1.0, 0.0, 1.0] }),
                    ..Envelope::off()
                },
                "envelope.joint_limits",
            ),
            (
                Envelope { safe_pose: SafePose::Pose(vec![0.0, f32::INFINITY, 0.0]), ..Envelope::off() },
                "envelope.safe_pose",
            ),
        ];
        for (e, name) in cases {
            match e.validate(3) {
                Err(DeployError::Option { option, .. }) => assert_eq!(option, name),
                other => panic!("{name}: {other:?}"),
            }
        }
    }
}
