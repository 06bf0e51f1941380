//! What stands between the simulated robot and the tracker on a real one:
//! sensor noise, latency, dropped readings, pushes. Each is off by default
//! (ProtoMotions' loop has none of them); each draws from one seeded
//! generator, so a run is reproduced by its options.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};

use crate::error::{Result, SimError};
use crate::reading::Reading;

/// The longest latency accepted, in control periods (a second at 50 Hz).
pub const MAX_LATENCY_PERIODS: usize = 50;

/// Gaussian noise on each sensor (standard deviations; 0: none).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SensorNoise {
    /// Joint encoders, radians.
    pub joint_pos: f64,
    /// Joint velocities, radians per second.
    pub joint_vel: f64,
    /// The gyroscope (root angular velocity), radians per second.
    pub gyro: f64,
    /// The anchor's orientation: a rotation about a random axis, each
    /// component of its rotation vector with this deviation, radians.
    pub orientation: f64,
}

/// External force pulses on the anchor body (a shove to the torso).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Push {
    /// Horizontal force, newtons, in a direction drawn per pulse.
    pub force: f64,
    /// How long each pulse lasts, seconds.
    pub duration: f64,
    /// Time from one pulse's start to the next, seconds.
    pub interval: f64,
    /// When the first pulse starts, seconds into the run.
    pub start: f64,
}

/// Everything between the simulator's state and the tracker's sensors.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Perturbations {
    /// Sensor noise.
    pub noise: SensorNoise,
    /// The tracker sees the reading taken this many control periods ago.
    pub latency_periods: usize,
    /// Probability that a step's reading is lost (the tracker gets the last
    /// one delivered again, with its old time stamp), in [0, 1).
    pub drop_probability: f64,
    /// Pushes.
    pub push: Option<Push>,
    /// The generator's seed.
    pub seed: u64,
}

impl Perturbations {
    /// Checks every value's domain.
    pub fn validate(&self) -> Result<()> {
        let bad = |option, value: f64, domain| Err(SimError::Option { option, value: value.to_string(), domain });
        let n = &self.noise;
        for (option, v) in [
            ("noise.joint_pos", n.joint_pos),
            ("noise.joint_vel", n.joint_vel),
            ("noise.gyro", n.gyro),
            ("noise.orientation", n.orientation),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(option, v, "finite and >= 0");
            }
        }
        if self.latency_periods > MAX_LATENCY_PERIODS {
            return Err(SimError::Option {
                option: "latency_periods",
                value: self.latency_periods.to_string(),
                domain: "at most 50 control periods",
            });
        }
        let p = self.drop_probability;
        if !(p.is_finite() && (0.0..1.0).contains(&p)) {
            return bad("drop_probability", p, "in [0, 1)");
        }
        if let Some(push) = &self.push {
            for (option, v) in
                [("push.force", push.force), ("push.duration", push.duration), ("push.interval", push.interval)]
            {
                if !(v.is_finite() && v > 0.0) {
                    return bad(option, v, "finite and > 0");
                }
            }
            if !(push.start.is_finite() && push.start >= 0.0) {
                return bad("push.start", push.start, "finite and >= 0");
            }
            if push.duration > push.interval {
                return bad("push.duration", push.duration, "at most push.interval");
            }
        }
        Ok(())
    }

    /// Whether anything is perturbed.
    pub fn any(&self) -> bool {
        let n = &self.noise;
        n.joint_pos > 0.0
            || n.joint_vel > 0.0
            || n.gyro > 0.0
            || n.orientation > 0.0
            || self.latency_periods > 0
            || self.drop_probability > 0.0
            || self.push.is_some()
    }

    /// The force on the anchor at `time` seconds into the run (world frame,
    /// newtons), if a pulse is on. The direction is drawn from the seed and
    /// the pulse's number, so it does not depend on the steps before.
    pub fn push_force(&self, time: f64) -> Option<[f64; 3]> {
        let push = self.push.as_ref()?;
        let since = time - push.start;
        if since < 0.0 {
            return None;
        }
        let pulse = (since / push.interval).floor();
        if since - pulse * push.interval >= push.duration {
            return None;
        }
        // pulse < 2^53 for any finite run; the cast keeps the number
        let mut rng =
            StdRng::seed_from_u64(self.seed ^ 0x5eed_9005 ^ (pulse as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let angle: f64 = rng.random_range(0.0..std::f64::consts::TAU);
        Some([push.force * angle.cos(), push.force * angle.sin(), 0.0])
    }
}

/// Applies [`Perturbations`] to the true readings, step by step: noise as
/// the reading is taken, then the latency line, then the loss of a reading.
/// Every buffer is allocated when it is made.
#[derive(Debug)]
pub struct Perturber {
    options: Perturbations,
    rng: StdRng,
    /// The last `latency_periods + 1` noisy readings, oldest first in ring order.
    line: Vec<Reading>,
    /// How many readings went into the line.
    taken: usize,
    /// What the tracker got last (held when a reading is lost).
    delivered: Reading,
    /// Whether anything was delivered yet.
    has_delivered: bool,
    /// Readings lost so far.
    pub dropped: u64,
}

impl Perturber {
    /// A perturber for a robot of `num_dofs` joints.
    pub fn new(options: Perturbations, num_dofs: usize) -> Result<Self> {
        options.validate()?;
        let line = (0..=options.latency_periods).map(|_| Reading::zeros(num_dofs)).collect();
        Ok(Perturber {
            rng: StdRng::seed_from_u64(options.seed),
            options,
            line,
            taken: 0,
            delivered: Reading::zeros(num_dofs),
            has_delivered: false,
            dropped: 0,
        })
    }

    /// The options.
    pub fn options(&self) -> &Perturbations {
        &self.options
    }

    /// The reading the tracker gets at this step, from the true one.
    pub fn deliver(&mut self, truth: &Reading) -> &Reading {
        let slots = self.line.len();
        let slot = self.taken % slots;
        self.line[slot].copy_from(truth);
        self.add_noise(slot);
        self.taken += 1;
        // the reading taken `latency` periods ago (the first one until then)
        let latency = self.options.latency_periods;
        let age = latency.min(self.taken - 1);
        let from = (self.taken - 1 - age) % slots;
        let lost = self.has_delivered
            && self.options.drop_probability > 0.0
            && self.rng.random::<f64>() < self.options.drop_probability;
        if lost {
            self.dropped += 1;
        } else {
            self.delivered.copy_from(&self.line[from]);
            self.has_delivered = true;
        }
        &self.delivered
    }

    fn add_noise(&mut self, slot: usize) {
        let n = self.options.noise;
        let r = &mut self.line[slot];
        let rng = &mut self.rng;
        gaussian(rng, n.joint_pos, &mut r.dof_pos);
        gaussian(rng, n.joint_vel, &mut r.dof_vel);
        gaussian(rng, n.gyro, &mut r.root_local_ang_vel);
        if n.orientation > 0.0 {
            let mut v = [0f32; 3];
            gaussian(rng, n.orientation, &mut v);
            r.anchor_rot = rotate_by(v, r.anchor_rot);
        }
    }
}

/// Adds N(0, std) to each value (nothing when std is 0).
fn gaussian(rng: &mut StdRng, std: f64, values: &mut [f32]) {
    if std > 0.0 {
        // std is finite and > 0 (validated), so the distribution exists
        if let Ok(d) = Normal::new(0.0, std) {
            for x in values {
                *x += d.sample(rng) as f32;
            }
        }
    }
}

/// `exp(v) * q` for a rotation vector `v` and an xyzw quaternion `q`, normalized.
fn rotate_by(v: [f32; 3], q: [f32; 4]) -> [f32; 4] {
    let angle = (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt();
    let (s, c) = ((angle / 2.0).sin(), (angle / 2.0).cos());
    let k = if angle > 0.0 { s / angle } else { 0.5 };
    let p = [v[0] * k, v[1] * k, v[2] * k, c];
    let [px, py, pz, pw] = p;
    let [qx, qy, qz, qw] = q;
    let r = [
        pw * qx + px * qw + py * qz - pz * qy,
        pw * qy - px * qz + py * qw + pz * qx,
        pw * qz + px * qy - py * qx + pz * qw,
        pw * qw - px * qx - py * qy - pz * qz,
    ];
    let n = (r[0] * r[0] + r[1] * r[1] + r[2] * r[2] + r[3] * r[3]).sqrt();
    [r[0] / n, r[1] / n, r[2] / n, r[3] / n]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(k: usize) -> Reading {
        let mut r = Reading::zeros(2);
        r.dof_pos = vec![k as f32, -(k as f32)];
        r.taken = k as f64;
        r
    }

    #[test]
    fn latency_delivers_the_reading_k_periods_old() {
        let mut p = Perturber::new(Perturbations { latency_periods: 3, ..Perturbations::default() }, 2).expect("ok");
        for k in 0..10 {
            let got = p.deliver(&reading(k)).clone();
            let want = k.saturating_sub(3);
            assert_eq!(got.dof_pos, vec![want as f32, -(want as f32)], "step {k}");
            assert_eq!(got.taken, want as f64);
        }
    }

    #[test]
    fn no_perturbation_is_the_identity() {
        let mut p = Perturber::new(Perturbations::default(), 2).expect("ok");
        for k in 0..5 {
            assert_eq!(p.deliver(&reading(k)), &reading(k));
        }
        assert!(!Perturbations::default().any());
    }

    #[test]
    fn a_lost_reading_repeats_the_last_delivered_one() {
        let mut p = Perturber::new(Perturbations { drop_probability: 0.5, seed: 7, ..Perturbations::default() }, 2)
            .expect("ok");
        let mut last = -1.0;
        for k in 0..200 {
            let got = p.deliver(&reading(k)).taken;
            assert!(got == k as f64 || got == last, "step {k}: got {got}, last {last}");
            last = got;
        }
        // 200 draws at 1/2: far from 0 and from 200
        assert!((60..140).contains(&p.dropped), "{}", p.dropped);
    }

    #[test]
    fn noise_has_the_deviation_asked_and_is_seeded() {
        let opts = Perturbations {
            noise: SensorNoise { joint_pos: 0.01, orientation: 0.02, ..SensorNoise::default() },
            seed: 3,
            ..Perturbations::default()
        };
        let run = || {
            let mut p = Perturber::new(opts.clone(), 2).expect("ok");
            let mut r = Reading::zeros(2);
            r.anchor_rot = [0.0, 0.0, 0.0, 1.0];
            (0..2000).map(|_| p.deliver(&r).clone()).collect::<Vec<_>>()
        };
        let a = run();
        assert_eq!(a, run(), "same seed, same readings");
        let xs: Vec<f64> = a.iter().flat_map(|r| r.dof_pos.iter().map(|&x| f64::from(x))).collect();
        let std = (xs.iter().map(|x| x * x).sum::<f64>() / xs.len() as f64).sqrt();
        assert!((std - 0.01).abs() < 0.001, "joint noise std {std}");
        assert!(a.iter().all(|r| r.dof_vel == vec![0.0, 0.0]), "no velocity noise asked");
        // unit quaternions, tilted by about the deviation asked
        for r in &a {
            let n: f32 = r.anchor_rot.iter().map(|x| x * x).sum();
            assert!((n - 1.0).abs() < 1e-5);
        }
        let mean_angle = a.iter().map(|r| 2.0 * f64::from(r.anchor_rot[3]).acos()).sum::<f64>() / a.len() as f64;
        // |v| of a 3-D N(0, s^2) vector has mean s * sqrt(8 / pi)
        let want = 0.02 * (8.0 / std::f64::consts::PI).sqrt();
        assert!((mean_angle - want).abs() < 0.1 * want, "mean angle {mean_angle}, want {want}");
    }

    #[test]
    fn pushes_are_on_only_within_their_pulses() {
        let opts = Perturbations {
            push: Some(Push { force: 50.0, duration: 0.2, interval: 1.0, start: 0.5 }),
            ..Perturbations::default()
        };
        assert_eq!(opts.push_force(0.4), None);
        let f = opts.push_force(0.55).expect("in the first pulse");
        assert!((f[0].hypot(f[1]) - 50.0).abs() < 1e-9 && f[2] == 0.0);
        assert_eq!(opts.push_force(0.65), Some(f), "one direction per pulse");
        assert_eq!(opts.push_force(0.71), None);
        assert!(opts.push_force(1.6).is_some() && opts.push_force(1.75).is_none());
    }

    #[test]
    fn options_outside_their_domain_are_refused_by_name() {
        let cases = [
            (Perturbations { drop_probability: 1.0, ..Perturbations::default() }, "drop_probability"),
            (Perturbations { latency_periods: 51, ..Perturbations::default() }, "latency_periods"),
            (
                Perturbations {
                    noise: SensorNoise { gyro: f64::NAN, ..SensorNoise::default() },
                    ..Perturbations::default()
                },
                "noise.gyro",
            ),
            (
                Perturbations {
                    push: Some(Push { force: 10.0, duration: 2.0, interval: 1.0, start: 0.0 }),
                    ..Perturbations::default()
                },
                "push.duration",
            ),
        ];
        for (p, name) in cases {
            let e = p.validate().expect_err(name);
            assert!(e.to_string().starts_with(name), "{e}");
        }
    }
}
