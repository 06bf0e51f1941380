//! The tracker's control step (`pmstate_deploy::Tracker::step`) on arbitrary
//! sensor bytes, step after step, with the safety envelope's every guard on
//! (joint limits, rate limit, soft start, tilt, stale sensors, stop at the
//! end of the clip), on the bundled g1 tracker: it must return targets or a
//! refusal, never panic; and `Ok` must mean every target, action and gain
//! finite, every target inside the joint limits and within the rate limit
//! of the last commanded targets. Each input is a fresh tracker (the loaded
//! pipeline is reused); its bytes
//! are read as float32 readings (joints, velocities, anchor quaternion,
//! gyroscope, then a stamp's age), a step at a time.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use pmstate_deploy::{EndOfClip, JointLimits, MotionClip, MotionPlayer, Pipeline, Sensors, Stamp, Tracker, TrackerOptions};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
const RATE: f32 = 4.0;

/// The checkpoint and clip, read once (each input builds its own tracker from a clone).
fn loaded() -> &'static (std::path::PathBuf, MotionClip) {
    static L: OnceLock<(std::path::PathBuf, MotionClip)> = OnceLock::new();
    L.get_or_init(|| {
        let clip = MotionClip::load(format!("{ROOT}/testdata/deploy/synthetic.motion")).expect("clip");
        (format!("{ROOT}/testdata/policy/g1_amp_deploy/last.ckpt").into(), clip)
    })
}

/// The pipeline, loaded once and handed from tracker to tracker (each input
/// gets a fresh tracker: no state crosses inputs, only the loaded weights).
static PIPELINE: std::sync::Mutex<Option<Pipeline>> = std::sync::Mutex::new(None);

fn pipeline() -> Pipeline {
    let cached = PIPELINE.lock().unwrap_or_else(|p| p.into_inner()).take();
    cached.unwrap_or_else(|| Pipeline::load(&loaded().0, None).expect("pipeline"))
}

fuzz_target!(|data: &[u8]| {
    let floats: Vec<f32> = data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let p = pipeline();
    let nd = p.dims().num_dofs;
    let player = MotionPlayer::new(&loaded().1, p.contract().dt).expect("player");
    let mut o = TrackerOptions::new(&p);
    let limits = JointLimits { lower: vec![-0.5; nd], upper: vec![0.5; nd] };
    o.action_ema_alpha = 0.7;
    o.pd_target_max_accel = Some(40.0);
    o.envelope.joint_limits = Some(limits.clone());
    o.envelope.max_target_rate = Some(vec![RATE; nd]);
    o.envelope.soft_start_seconds = 0.1;
    o.envelope.max_tilt = Some(1.0);
    o.envelope.stale_after_periods = Some(3);
    o.envelope.end_of_clip = EndOfClip::Stop;
    let dt = p.contract().dt;
    let mut t = Tracker::new(p, player, o).expect("tracker");
    let per_step = 2 * nd + 8;
    let mut last: Option<Vec<f32>> = None;
    for (k, r) in floats.chunks_exact(per_step).take(64).enumerate() {
        let now = k as f64 * dt;
        let s = Sensors {
            dof_pos: &r[..nd],
            dof_vel: &r[nd..2 * nd],
            anchor_rot: [r[2 * nd], r[2 * nd + 1], r[2 * nd + 2], r[2 * nd + 3]],
            root_local_ang_vel: [r[2 * nd + 4], r[2 * nd + 5], r[2 * nd + 6]],
            anchor_pos: None,
            bodies: None,
            stamp: Some(Stamp { taken: now - f64::from(r[2 * nd + 7]), now }),
        };
        match t.step(&s) {
            Ok(out) => {
                for v in [&out.joint_pos_targets, &out.actions, &out.stiffness, &out.damping] {
                    assert!(v.iter().all(|x| x.is_finite()), "OK with a non-finite output at step {k}");
                }
                for (j, x) in out.joint_pos_targets.iter().enumerate() {
                    assert!(*x >= limits.lower[j] && *x <= limits.upper[j], "joint {j} outside its limits: {x}");
                    if let Some(l) = &last {
                        let moved = (x - l[j]).abs();
                        assert!(moved <= RATE * dt as f32 * 1.0001 + 1e-6, "joint {j} moved {moved} in one step");
                    }
                }
                last = Some(out.joint_pos_targets.clone());
            }
            Err(e) => assert!(e.is_refused_reading(), "step {k}: {e}"),
        }
    }
    *PIPELINE.lock().unwrap_or_else(|p| p.into_inner()) = Some(t.into_pipeline());
});
