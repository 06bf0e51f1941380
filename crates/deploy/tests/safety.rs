//! The deploy path's safety, one test per class of hostile input: a bad
//! reading is refused without poisoning later steps; a step that says OK
//! wrote only finite numbers inside the envelope (a property over arbitrary
//! readings); each guard trips on a stream that should trip it and not on
//! one that should not; configs and clips outside their domain are refused
//! at load, naming the key; sizes from input are bounded before allocation.

use std::path::{Path, PathBuf};

use pmstate_ckpt::{Checkpoint, Node};
use pmstate_deploy::motion::MotionArrays;
use pmstate_deploy::{
    ConfigProblem, DeployError, EndOfClip, JointLimits, MotionClip, MotionPlayer, MotionProblem, Pipeline, SafePose,
    SafeReason, SensorProblem, Sensors, Stamp, Tracker, TrackerOptions,
};
use proptest::prelude::*;

#[path = "common/configs.rs"]
mod configs;
use configs::{at, write_edited};

#[path = "common/data.rs"]
mod data;
use data::{flat, load, root};

fn g1() -> PathBuf {
    root().join("testdata/policy/g1_amp_deploy")
}

/// The recorded g1 sensor stream, row by row.
struct Stream {
    dp: Vec<f32>,
    dv: Vec<f32>,
    ar: Vec<f32>,
    av: Vec<f32>,
    steps: usize,
    nd: usize,
}

impl Stream {
    fn load() -> Self {
        let s = load(&root().join("testdata/deploy/g1_amp_deploy/sensors.safetensors"));
        let steps = s["dof_pos"].dims()[0];
        let dp = flat(&s["dof_pos"]);
        let nd = dp.len() / steps;
        Stream {
            dp,
            dv: flat(&s["dof_vel"]),
            ar: flat(&s["anchor_rot"]),
            av: flat(&s["root_local_ang_vel"]),
            steps,
            nd,
        }
    }

    fn at(&self, k: usize) -> Sensors<'_> {
        let (nd, ar, av) = (self.nd, &self.ar, &self.av);
        Sensors {
            dof_pos: &self.dp[k * nd..(k + 1) * nd],
            dof_vel: &self.dv[k * nd..(k + 1) * nd],
            anchor_rot: [ar[4 * k], ar[4 * k + 1], ar[4 * k + 2], ar[4 * k + 3]],
            root_local_ang_vel: [av[3 * k], av[3 * k + 1], av[3 * k + 2]],
            anchor_pos: None,
            bodies: None,
            stamp: None,
        }
    }
}

fn tracker(edit: impl FnOnce(&mut TrackerOptions)) -> Tracker {
    let p = Pipeline::load(g1().join("last.ckpt"), None).expect("load");
    let clip = MotionClip::load(root().join("testdata/deploy/synthetic.motion")).expect("clip");
    let player = MotionPlayer::new(&clip, p.contract().dt).expect("player");
    let mut o = TrackerOptions::new(&p);
    o.action_ema_alpha = 0.8;
    o.pd_target_max_accel = Some(50.0);
    edit(&mut o);
    Tracker::new(p, player, o).expect("tracker")
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every kind of bad reading, in every sensor, at any step: refused with
/// the sensor named, and the run afterwards bit for bit the run without
/// it (history, filters, alignment and clip time untouched).
#[test]
fn a_refused_reading_leaves_the_tracker_exactly_as_it_was() {
    let s = Stream::load();
    let mut clean = tracker(|_| {});
    let want: Vec<Vec<u32>> = (0..40).map(|k| bits(&clean.step(&s.at(k)).expect("step").joint_pos_targets)).collect();
    type Corrupt = fn(&mut Vec<f32>, &mut [f32; 4], &mut [f32; 3]);
    // the sensor, the value or quaternion the refusal names, the corruption
    let bound = pmstate_deploy::SensorBounds::default().joint_velocity;
    assert_eq!(bound, 100.0, "the stated bound (docs/deploy.md) changed: update the glitch below");
    let glitches: [(&str, usize, Corrupt); 8] = [
        ("dof_pos", 5, |p, _, _| p[5] = f32::NAN),
        ("dof_pos", 0, |p, _, _| p[0] = 1e9),
        ("dof_vel", 28, |p, _, _| p[28] = f32::INFINITY),
        // finite, but beyond the physical bound of 100 rad/s
        ("dof_vel", 11, |p, _, _| p[11] = -150.0),
        ("anchor_rot", 0, |_, q, _| *q = [0.0; 4]),
        ("anchor_rot", 3, |_, q, _| q[3] = f32::NAN),
        ("anchor_rot", 0, |_, q, _| *q = [0.0, 0.0, 0.0, 3.0]),
        ("root_local_ang_vel", 1, |_, _, w| w[1] = f32::NEG_INFINITY),
    ];
    // each glitch at step 3 and at one other step (the first, early, mid-run)
    for (i, (sensor, index, corrupt)) in glitches.iter().enumerate() {
        for at in [3, [1usize, 2, 7, 19][i % 4]] {
            let mut t = tracker(|_| {});
            for (k, want_k) in want.iter().enumerate() {
                if k == at {
                    let good = s.at(k);
                    let (mut dp, mut dv) = (good.dof_pos.to_vec(), good.dof_vel.to_vec());
                    let (mut q, mut w) = (good.anchor_rot, good.root_local_ang_vel);
                    let target = if *sensor == "dof_vel" { &mut dv } else { &mut dp };
                    corrupt(target, &mut q, &mut w);
                    let bad = Sensors { dof_pos: &dp, dof_vel: &dv, anchor_rot: q, root_local_ang_vel: w, ..good };
                    let e = t.step(&bad).expect_err("refused");
                    assert!(e.is_refused_reading(), "{e}");
                    match &e {
                        DeployError::Sensor { name, problem } => {
                            assert_eq!(name, sensor, "{e}");
                            let named = match problem {
                                SensorProblem::NonFinite { index, .. }
                                | SensorProblem::NotUnit { index, .. }
                                | SensorProblem::OutOfRange { index, .. } => *index,
                                other => panic!("{sensor}: {other}"),
                            };
                            assert_eq!(named, *index, "{e}");
                        }
                        other => panic!("{other}"),
                    }
                }
                let got = bits(&t.step(&s.at(k)).expect("step").joint_pos_targets);
                assert_eq!(&got, want_k, "{sensor} glitch at step {at} changed step {k}");
            }
            assert_eq!(t.status().refused_readings, 1);
        }
    }
}

/// A joint velocity past the stated physical bound is refused by its
/// value, naming the sensor, the index, the value and the bound; one at
/// the bound is a reading like any other.
#[test]
fn a_joint_velocity_past_its_bound_is_refused_naming_the_index() {
    let s = Stream::load();
    let mut t = tracker(|_| {});
    let good = s.at(0);
    let mut dv = good.dof_vel.to_vec();
    dv[17] = 100.5;
    let e = t.step(&Sensors { dof_vel: &dv, ..good }).expect_err("past the bound");
    assert!(e.is_refused_reading(), "{e}");
    assert!(
        matches!(e, DeployError::Sensor { name: "dof_vel", problem: SensorProblem::OutOfRange { index: 17, .. } }),
        "{e}"
    );
    let message = e.to_string();
    assert!(message.contains("dof_vel") && message.contains("value 17") && message.contains("100.5"), "{message}");
    assert!(message.contains("bound of 100"), "{message}");
    dv[17] = -100.0;
    t.step(&Sensors { dof_vel: &dv, ..good }).expect("at the bound");
    assert_eq!(t.status().refused_readings, 1);
}

/// The envelope `TrackerOptions::new` turns on (the g1 config's joint and
/// velocity limits) on the recorded stream trips where the policy's own
/// targets leave those limits, and nowhere else. The stream does trip it:
/// one joint's target (the left ankle roll, about 0.336 rad) is past its
/// 0.2618 rad limit at every step, and the first step's targets are more
/// than a control period's travel at the velocity limits from the measured
/// pose. So each step's counts are checked against what the envelope-free
/// run of the same policy predicts: after the first step, no target is
/// rate-limited (they move within the limits) and exactly the targets
/// outside the joint limits are clamped; with the limits widened to hold
/// every target, nothing is.
#[test]
fn the_default_limits_trip_where_the_targets_leave_them_and_nowhere_else() {
    use pmstate_deploy::envelope::events;
    let s = Stream::load();
    let open = |edit: &dyn Fn(&mut TrackerOptions)| {
        let p = Pipeline::load(g1().join("last.ckpt"), None).expect("load");
        let clip = MotionClip::load(root().join("testdata/deploy/synthetic.motion")).expect("clip");
        let player = MotionPlayer::new(&clip, p.contract().dt).expect("player");
        let mut o = TrackerOptions::new(&p);
        edit(&mut o);
        Tracker::new(p, player, o).expect("tracker")
    };
    // the policy's targets: the envelope changes what is commanded, never what the policy is fed
    let mut free = open(&|o| o.envelope = pmstate_deploy::Envelope::off());
    let targets: Vec<Vec<f32>> =
        (0..s.steps).map(|k| free.step(&s.at(k)).expect("step").joint_pos_targets.clone()).collect();
    let mut t = open(&|_| {});
    let defaults = t.options().envelope.clone();
    let lim = defaults.joint_limits.clone().expect("the g1 config gives joint limits");
    let rate = defaults.max_target_rate.clone().expect("the g1 config gives velocity limits");
    let dt = t.player().control_dt() as f32;
    let outside = |x: &[f32]| x.iter().enumerate().filter(|(j, v)| **v < lim.lower[*j] || **v > lim.upper[*j]).count();
    let mut clamped_total = 0u64;
    for (k, want) in targets.iter().enumerate() {
        let before = t.status();
        t.step(&s.at(k)).expect("step");
        let after = t.status();
        let (clamped, limited) =
            (after.joint_limit_clamps - before.joint_limit_clamps, after.rate_limited - before.rate_limited);
        if k == 0 {
            // from the measured pose: the joints whose first target is farther than a period's travel
            let measured = s.at(0).dof_pos;
            let far = (0..s.nd).filter(|&j| (want[j] - measured[j]).abs() > rate[j] * dt).count();
            assert!(far > 0, "the first step was expected to jump");
            assert_eq!(limited, far as u64, "step 0");
        } else {
            assert_eq!(limited, 0, "step {k}: a target moving within the velocity limits was rate-limited");
            assert_eq!(clamped, outside(want) as u64, "step {k}: clamps other than the targets past a limit");
            assert_eq!(after.last_events & events::RATE_LIMIT, 0, "step {k}");
            assert_eq!(after.last_events & events::JOINT_LIMIT != 0, clamped > 0, "step {k}");
        }
        clamped_total += clamped;
    }
    assert!(clamped_total >= (s.steps - 1) as u64, "the ankle roll's target past its limit was not clamped");
    assert_eq!(t.status().safe_mode, None);
    // the same limits widened to hold every target the policy gives: not one clamp
    let (mut lower, mut upper) = (lim.lower.clone(), lim.upper.clone());
    for x in &targets {
        for j in 0..s.nd {
            lower[j] = lower[j].min(x[j]);
            upper[j] = upper[j].max(x[j]);
        }
    }
    let widened = JointLimits { lower, upper };
    let mut t = open(&|o| o.envelope.joint_limits = Some(widened.clone()));
    for k in 0..s.steps {
        t.step(&s.at(k)).expect("step");
    }
    let st = t.status();
    assert_eq!(st.joint_limit_clamps, 0, "{st:?}");
    assert_eq!(st.steps, s.steps as u64);
}

/// A flight log asked for in a directory, or in a block device (a node
/// made here where mknod is permitted), is refused naming the path and
/// what it is; nothing is replaced and the tracker runs on.
#[cfg(unix)]
#[test]
fn flight_logs_into_a_directory_or_a_block_device_are_refused() {
    use std::os::unix::fs::FileTypeExt;
    let s = Stream::load();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut t = tracker(|_| {});
    let mut targets = vec![(dir.path().to_path_buf(), "a directory")];
    let block = dir.path().join("block.pmlog");
    // major 120 (local/experimental use): no driver's, never a real disk
    let made = std::process::Command::new("mknod").arg(&block).args(["b", "120", "0"]).output();
    if made.is_ok_and(|o| o.status.success()) {
        targets.push((block.clone(), "a block device"));
    } else {
        eprintln!("SKIPPED the block-device half: mknod is not permitted here (needs CAP_MKNOD)");
    }
    for (path, kind) in &targets {
        let e = t.record_to(path, &pmstate_deploy::LogMeta::default()).expect_err("refused");
        match &e {
            DeployError::Log { file, problem } => {
                assert_eq!(file, &path.display().to_string(), "{e}");
                assert!(problem.contains(&format!("is {kind}: a flight log goes to")), "{e}");
            }
            other => panic!("{kind}: {other}"),
        }
    }
    t.step(&s.at(0)).expect("the tracker runs on");
    assert!(dir.path().is_dir());
    if targets.len() == 2 {
        assert!(std::fs::metadata(&block).expect("block").file_type().is_block_device(), "the device was replaced");
    }
}

fn arb_f32() -> impl Strategy<Value = f32> {
    prop_oneof![
        4 => -3.0f32..3.0,
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(-1e30f32),
        1 => any::<f32>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Arbitrary readings, step after step, with every guard on: a step
    /// that says OK wrote finite targets, actions and gains, inside the
    /// joint limits and within the rate limit of the last commanded targets.
    #[test]
    fn ok_means_finite_and_inside_the_envelope(
        readings in proptest::collection::vec((proptest::collection::vec(arb_f32(), 58), proptest::collection::vec(arb_f32(), 7)), 1..12)
    ) {
        let limits = JointLimits { lower: vec![-0.3; 29], upper: vec![0.4; 29] };
        let rate = 5.0f32;
        let mut t = tracker(|o| {
            o.envelope.joint_limits = Some(limits.clone());
            o.envelope.max_target_rate = Some(vec![rate; 29]);
            o.envelope.soft_start_seconds = 0.1;
            o.envelope.max_tilt = Some(1.2);
            o.envelope.end_of_clip = EndOfClip::Stop;
        });
        let dt = t.player().control_dt() as f32;
        let mut last: Option<Vec<f32>> = None;
        for (joints, rest) in &readings {
            let s = Sensors {
                dof_pos: &joints[..29],
                dof_vel: &joints[29..],
                anchor_rot: [rest[0], rest[1], rest[2], rest[3]],
                root_local_ang_vel: [rest[4], rest[5], rest[6]],
                anchor_pos: None,
                bodies: None,
                stamp: None,
            };
            match t.step(&s) {
                Ok(out) => {
                    for v in [&out.joint_pos_targets, &out.actions, &out.stiffness, &out.damping] {
                        prop_assert!(v.iter().all(|x| x.is_finite()));
                    }
                    for (j, x) in out.joint_pos_targets.iter().enumerate() {
                        prop_assert!(*x >= limits.lower[j] && *x <= limits.upper[j], "joint {} at {}", j, x);
                        if let Some(l) = &last {
                            prop_assert!((x - l[j]).abs() <= rate * dt * 1.0001 + 1e-6, "joint {} moved {} -> {}", j, l[j], x);
                        }
                    }
                    last = Some(out.joint_pos_targets.clone());
                }
                Err(e) => prop_assert!(e.is_refused_reading(), "{}", e),
            }
        }
    }
}

/// Each guard: a stream that trips it enters the latched safe mode (the
/// measured joints as targets, the contract's gains), and the same tracker
/// options on a stream that should not trip it do not.
#[test]
fn each_guard_trips_on_its_stream_and_not_otherwise() {
    let s = Stream::load();
    // tilt: upright runs; pitched 80 degrees trips at 1 rad
    // the clamps off, so the safe targets are the measured joints exactly
    let mut t = tracker(|o| {
        o.envelope.max_tilt = Some(1.0);
        o.envelope.joint_limits = None;
        o.envelope.max_target_rate = None;
    });
    for k in 0..10 {
        t.step(&s.at(k)).expect("step");
    }
    assert_eq!(t.status().safe_mode, None, "an upright stream tripped the tilt guard");
    let pitch = 80f32.to_radians() / 2.0;
    let tilted = Sensors { anchor_rot: [0.0, pitch.sin(), 0.0, pitch.cos()], ..s.at(10) };
    let out = t.step(&tilted).expect("safe step").clone();
    assert_eq!(t.status().safe_mode, Some(SafeReason::Tilt));
    assert_eq!(bits(&out.joint_pos_targets), bits(tilted.dof_pos), "damping towards the measured pose");
    assert!(out.actions.iter().all(|a| *a == 0.0));
    // latched: upright again, still safe until a reset
    t.step(&s.at(11)).expect("step");
    assert_eq!(t.status().safe_mode, Some(SafeReason::Tilt));
    t.reset();
    t.step(&s.at(0)).expect("step");
    assert_eq!(t.status().safe_mode, None);

    // stale sensors: fresh readings run; a reading 6 periods old trips at 5
    let mut t = tracker(|o| o.envelope.stale_after_periods = Some(5));
    let fresh =
        |k: usize| Sensors { stamp: Some(Stamp { taken: k as f64 * 0.02, now: k as f64 * 0.02 + 0.004 }), ..s.at(k) };
    let missing = t.step(&s.at(0)).expect_err("a stamp is required with the guard on");
    assert!(matches!(missing, DeployError::Sensor { name: "stamp", .. }), "{missing}");
    for k in 0..10 {
        t.step(&fresh(k)).expect("step");
    }
    assert_eq!(t.status().safe_mode, None);
    let old = Sensors { stamp: Some(Stamp { taken: 0.0, now: 0.2 + 6.0 * 0.02 }), ..s.at(10) };
    t.step(&old).expect("safe step");
    assert_eq!(t.status().safe_mode, Some(SafeReason::Stale));
    assert_eq!(t.status().stale_trips, 1);

    // end of clip: Hold keeps tracking, Stop enters the safe mode
    for (end, want) in [(EndOfClip::Hold, None), (EndOfClip::Stop, Some(SafeReason::EndOfClip))] {
        let mut t = tracker(|o| o.envelope.end_of_clip = end);
        let frames = t.player().total_frames();
        for k in 0..frames + 3 {
            t.step(&s.at(k % s.steps)).expect("step");
        }
        assert_eq!(t.status().safe_mode, want, "{end:?}");
    }

    // operator stop with a configured pose, reached at the rate limit
    let pose = vec![0.1f32; 29];
    let mut t = tracker(|o| {
        o.envelope.safe_pose = SafePose::Pose(pose.clone());
        o.envelope.max_target_rate = Some(vec![1.0; 29]);
        o.envelope.joint_limits = None;
    });
    let before = t.step(&s.at(0)).expect("step").joint_pos_targets.clone();
    t.stop();
    let after = t.step(&s.at(1)).expect("step").joint_pos_targets.clone();
    assert_eq!(t.status().safe_mode, Some(SafeReason::Operator));
    for j in 0..29 {
        let step = (after[j] - before[j]).abs();
        assert!(step <= 0.02 * 1.0001, "joint {j} jumped {step} towards the safe pose");
        assert!((after[j] - pose[j]).abs() < (before[j] - pose[j]).abs() || before[j] == pose[j]);
    }
}

/// The soft start blends from the measured pose (its first targets are
/// close to it) and ends after its time; rate limit and joint limits hold
/// and are counted; with the envelope off nothing is changed.
#[test]
fn soft_start_rate_limit_and_joint_limits() {
    let s = Stream::load();
    let mut reference = tracker(|o| o.envelope = pmstate_deploy::Envelope::off());
    let free: Vec<Vec<f32>> =
        (0..30).map(|k| reference.step(&s.at(k)).expect("step").joint_pos_targets.clone()).collect();
    let mut t = tracker(|o| {
        o.envelope = pmstate_deploy::Envelope::off();
        o.envelope.soft_start_seconds = 0.2;
    });
    let dt = t.player().control_dt();
    let mut blended = 0;
    for (k, f) in free.iter().enumerate() {
        let out = t.step(&s.at(k)).expect("step").joint_pos_targets.clone();
        let elapsed = (k + 1) as f64 * dt;
        let w = (elapsed / 0.2) as f32;
        blended += usize::from(elapsed < 0.2);
        for j in 0..29 {
            let start = s.at(0).dof_pos[j];
            let want = if elapsed < 0.2 { start + w * (f[j] - start) } else { f[j] };
            assert_eq!(out[j].to_bits(), want.to_bits(), "step {k} joint {j}");
        }
    }
    assert!(blended >= 9);
    assert_eq!(t.status().soft_start_steps, blended as u64);
    // the published limits hold every commanded target (the recorded stream's
    // are clamped to them at one joint: the_default_limits_trip_where_...)
    let mut t = tracker(|o| o.envelope.max_target_rate = None);
    let lim = t.options().envelope.joint_limits.clone().expect("the g1 config gives joint limits");
    for k in 0..30 {
        let out = t.step(&s.at(k)).expect("step");
        for (j, x) in out.joint_pos_targets.iter().enumerate() {
            assert!(*x >= lim.lower[j] && *x <= lim.upper[j]);
        }
    }
    // tight limits clamp and count
    let mut t = tracker(|o| {
        o.envelope.joint_limits = Some(JointLimits { lower: vec![-0.01; 29], upper: vec![0.01; 29] });
        o.envelope.max_target_rate = Some(vec![0.5; 29]);
    });
    for k in 0..10 {
        t.step(&s.at(k)).expect("step");
    }
    let st = t.status();
    assert!(st.joint_limit_clamps > 0 && st.rate_limited > 0, "{st:?}");
}

/// The soma tracker's configs with `edit` applied, written next to its checkpoint.
fn load_edited(dir: &Path, edit: impl FnOnce(&mut Node)) -> Result<Pipeline, Box<DeployError>> {
    let ckpt = write_edited(&g1().join("last.ckpt"), &g1().join("resolved_configs_inference.pt"), dir, edit);
    Pipeline::load(ckpt, None).map_err(Box::new)
}

/// Config values outside their domain are refused at load, naming the key:
/// gains, the acceleration limit, the decimation, the future steps (huge,
/// or not what the actor was trained on).
#[test]
fn configs_outside_their_domain_are_refused_at_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let joint = "robot.control.control_info.left_hip_pitch_joint";
    type Edit = Box<dyn FnOnce(&mut Node)>;
    let cases: Vec<(Edit, &str)> = vec![
        (Box::new(move |r| *at(r, &format!("{joint}.stiffness")) = Node::Float(f64::NAN)), "stiffness"),
        (Box::new(move |r| *at(r, &format!("{joint}.damping")) = Node::Float(-1.0)), "damping"),
        (Box::new(|r| *at(r, "simulator.pd_target_max_accel") = Node::Float(-5.0)), "simulator.pd_target_max_accel"),
        (Box::new(|r| *at(r, "robot.simulation_params.mujoco.decimation") = Node::Int(0)), "decimation"),
        (Box::new(|r| *at(r, "env.control_components.mimic.future_steps") = Node::Int(1 << 40)), "future_steps"),
    ];
    for (edit, key) in cases {
        match load_edited(dir.path(), edit).map_err(|e| *e) {
            Err(DeployError::Config { key: k, .. }) => assert!(k.contains(key), "{key}: refused at {k}"),
            Err(other) => panic!("{key}: {other}"),
            Ok(_) => panic!("{key}: accepted"),
        }
    }
    // future steps the actor was not trained on: both widths named
    let current = {
        let p = Pipeline::load(g1().join("last.ckpt"), None).expect("load");
        p.contract().motion.future_step_indices.len()
    };
    let err = load_edited(dir.path(), |r| {
        *at(r, "env.control_components.mimic.future_steps") = Node::Int(current as i64 + 1)
    })
    .expect_err("a width the actor does not read");
    match &*err {
        DeployError::Width { observations, actor, .. } => assert_ne!(observations, actor),
        other => panic!("{other}"),
    }
    // options outside their domain
    for alpha in [0.0, 1.5, f64::NAN, f64::INFINITY] {
        let p = Pipeline::load(g1().join("last.ckpt"), None).expect("load");
        let clip = MotionClip::load(root().join("testdata/deploy/synthetic.motion")).expect("clip");
        let player = MotionPlayer::new(&clip, p.contract().dt).expect("player");
        let mut o = TrackerOptions::new(&p);
        o.action_ema_alpha = alpha;
        let e = Tracker::new(p, player, o).expect_err("alpha");
        assert!(matches!(e, DeployError::Option { option: "action_ema_alpha", .. }), "{e}");
    }
}

fn tiny_clip(fps: f64, frames: usize) -> MotionClip {
    let (nd, nb) = (2, 1);
    let q = [0.0, 0.0, 0.0, 1.0f32];
    MotionClip {
        fps,
        frames,
        num_dofs: nd,
        num_bodies: nb,
        arrays: MotionArrays {
            dof_pos: vec![0.0; frames * nd],
            dof_vel: vec![0.0; frames * nd],
            body_pos: vec![0.0; frames * nb * 3],
            body_rot: q.repeat(frames * nb),
            body_vel: vec![0.0; frames * nb * 3],
            body_ang_vel: vec![0.0; frames * nb * 3],
        },
    }
}

/// Clips: NaN values and non-unit rotations refused by index; a valid
/// two-frame clip at a tiny fps is refused by the player's memory bound
/// before anything is allocated (it would be ~20 GB at a G1's size).
#[test]
fn clips_outside_their_domain_and_past_the_bound_are_refused() {
    let mut c = tiny_clip(30.0, 3);
    MotionPlayer::new(&c, 0.02).expect("a valid clip plays");
    c.arrays.dof_vel[3] = f32::NAN;
    assert!(matches!(c.validate(), Err(MotionProblem::NonFinite { key: "dof_vel", index: 3, .. })));
    let mut c = tiny_clip(30.0, 3);
    c.arrays.body_rot[7] = 2.0;
    assert!(matches!(c.validate(), Err(MotionProblem::NotUnit { frame: 1, body: 0, .. })));
    let c = tiny_clip(1e-6, 2);
    match MotionPlayer::new(&c, 0.02) {
        Err(DeployError::Motion { problem: MotionProblem::TooLong { frames, .. }, .. }) => {
            assert!(frames > 10_000_000)
        }
        other => panic!("{other:?}"),
    }
    let e = MotionPlayer::new(&tiny_clip(30.0, 3), 0.0).expect_err("dt 0");
    assert!(matches!(e, DeployError::ControlDt(_)));
    let _ = ConfigProblem::Missing;
}

/// A checkpoint whose actor gives NaN (its biases set to NaN in a
/// safetensors conversion): the first step enters the safe mode for a
/// non-finite output, its targets finite (the measured joints), and nothing
/// of the NaN step is committed.
#[test]
fn a_non_finite_policy_output_enters_the_safe_mode() {
    let dir = tempfile::tempdir().expect("tempdir");
    let st = dir.path().join("last.safetensors");
    let ckpt = Checkpoint::open(g1().join("last.ckpt")).expect("ckpt");
    pmstate_ckpt::save_safetensors(&ckpt, &st, &Default::default()).expect("convert");
    let mut bytes = std::fs::read(&st).expect("read");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).expect("header");
    let mut poisoned = 0;
    for (key, v) in header.as_object().expect("object") {
        if key.contains("actor") && key.ends_with("bias") && v["dtype"] == "F32" {
            let (a, b) = (
                v["data_offsets"][0].as_u64().expect("a") as usize,
                v["data_offsets"][1].as_u64().expect("b") as usize,
            );
            for c in bytes[8 + n + a..8 + n + b].chunks_exact_mut(4) {
                c.copy_from_slice(&f32::NAN.to_le_bytes());
            }
            poisoned += 1;
        }
    }
    assert!(poisoned > 0, "no actor bias in the conversion");
    std::fs::write(&st, bytes).expect("write");
    let p = Pipeline::load(&st, Some(&g1().join("resolved_configs_inference.pt"))).expect("load");
    let clip = MotionClip::load(root().join("testdata/deploy/synthetic.motion")).expect("clip");
    let player = MotionPlayer::new(&clip, p.contract().dt).expect("player");
    let o = TrackerOptions::reference(p.contract());
    let mut t = Tracker::new(p, player, o).expect("tracker");
    let s = Stream::load();
    let out = t.step(&s.at(0)).expect("a safe step, not an error").clone();
    assert_eq!(t.status().safe_mode, Some(SafeReason::NonFiniteOutput));
    assert_eq!(t.status().non_finite_outputs, 1);
    assert_eq!(bits(&out.joint_pos_targets), bits(s.at(0).dof_pos));
    assert!(out.actions.iter().chain(&out.stiffness).chain(&out.damping).all(|x| x.is_finite()));
    assert_eq!(t.frame(), 0, "the NaN step advanced the clip");
    assert!(t.alignment().is_none(), "the NaN step committed its alignment");
}

/// A flight log read back: records equal to what the steps returned; a
/// file that is no log, a log of another format version, and a last
/// record cut short are errors saying which, never a panic or a guess.
#[test]
fn flight_logs_read_back_and_bad_logs_are_refused() {
    let s = Stream::load();
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("flight.pmlog");
    let mut t = tracker(|_| {});
    t.record_to(&log, &pmstate_deploy::LogMeta::default()).expect("record");
    let outs: Vec<Vec<u32>> = (0..5).map(|k| bits(&t.step(&s.at(k)).expect("step").joint_pos_targets)).collect();
    t.finish_recording().expect("finish");
    let mut r = pmstate_deploy::read_log(&log).expect("log");
    for want in &outs {
        let rec = r.next_record().expect("record").expect("one per step");
        assert_eq!(&bits(&rec.out.joint_pos_targets), want);
    }
    assert!(r.next_record().expect("end").is_none());
    let bytes = std::fs::read(&log).expect("read");
    let problem = |b: &[u8]| {
        let p = dir.path().join("bad.pmlog");
        std::fs::write(&p, b).expect("write");
        let mut r = match pmstate_deploy::read_log(&p) {
            Err(e) => return e.to_string(),
            Ok(r) => r,
        };
        loop {
            match r.next_record() {
                Err(e) => return e.to_string(),
                Ok(None) => return "read to the end".into(),
                Ok(Some(_)) => {}
            }
        }
    };
    assert!(problem(b"not a log at all, just text").contains("no PMFLIGHT magic"));
    let mut v2 = bytes.clone();
    v2[8] = 2;
    assert!(problem(&v2).contains("format version 2"));
    assert!(problem(&bytes[..bytes.len() - 10]).contains("cut short"));
    assert!(problem(&bytes[..12]).contains("16-byte start"));
}
