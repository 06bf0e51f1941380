//! v3.1's G1 tracker and v3.0's G1 and H1-2 trackers (testdata/deploy/v31_g1_tracker,
//! v30_*_tracker, recorded by
//! testdata/deploy/record_releases_deploy.py) through the C ABI: opened,
//! stepped over the recorded sensors with the envelope's clamps off (as the
//! release's own loop), its PD targets and gains against the release's loop
//! within the bound crates/deploy/tests/releases.rs derives step by step,
//! and against `Tracker` in Rust to the bit. The extern functions are
//! called from Rust here, as in tests/open_refusals.rs.
// The functions under test are the C ABI's `unsafe extern "C"` functions.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use pmstate_deploy::{MotionClip, MotionPlayer, Pipeline, Sensors, Tracker, TrackerOptions};
use pmstate_deploy_c::{
    pmstate_tracker_close, pmstate_tracker_default_options, pmstate_tracker_last_error, pmstate_tracker_num_dofs,
    pmstate_tracker_open_with, pmstate_tracker_step, PmstateOptions, PmstateSensors, PmstateStatus, PmstateTracker,
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().and_then(|t| t.to_vec1::<f32>()).expect("f32 tensor")
}

fn c(p: &Path) -> CString {
    CString::new(p.display().to_string()).expect("no NUL in a test path")
}

fn last_error() -> String {
    // SAFETY: the ABI returns a NUL-terminated string valid until the next failing call on this thread.
    unsafe { CStr::from_ptr(pmstate_tracker_last_error()) }.to_string_lossy().into_owned()
}

/// The largest difference between the release's actions and targets the
/// Rust loop test (crates/deploy/tests/releases.rs) observed within the
/// policy's bound (actions 9.5e-6, targets 3.3e-5: the offset-and-scale
/// conversion multiplies by up to 6 rad), with margin.
const TARGET_TOLERANCE: f32 = 1e-4;

#[test]
fn the_c_abi_runs_the_v31_g1_tracker() {
    let dir = root().join("testdata/deploy/v31_g1_tracker");
    let ckpt = dir.join("last.ckpt");
    let motion = root().join("testdata/deploy/synthetic.motion");
    let mut o = std::mem::MaybeUninit::<PmstateOptions>::uninit();
    // SAFETY: `o` is writable storage for one PmstateOptions, which the call fills.
    assert_eq!(unsafe { pmstate_tracker_default_options(o.as_mut_ptr()) }, PmstateStatus::PmstateOk);
    // SAFETY: filled by pmstate_tracker_default_options.
    let mut opts = unsafe { o.assume_init() };
    // the release's loop has no envelope
    opts.joint_limits = 0;
    opts.rate_limit = 0;
    let (ckpt_c, motion_c) = (c(&ckpt), c(&motion));
    let mut t: *mut PmstateTracker = std::ptr::null_mut();
    // SAFETY: NUL-terminated strings, a null config, valid options, `t` writable.
    let status =
        unsafe { pmstate_tracker_open_with(ckpt_c.as_ptr(), motion_c.as_ptr(), std::ptr::null(), &opts, &mut t) };
    assert_eq!(status, PmstateStatus::PmstateOk, "{}", last_error());
    // SAFETY: the tracker just opened.
    let nd = unsafe { pmstate_tracker_num_dofs(t) };
    assert_eq!(nd, 29);

    // the same loop in Rust, with the reference's options
    let pipeline = Pipeline::load(&ckpt, None).expect("load");
    let (stiffness_want, damping_want) = (pipeline.action().stiffness.clone(), pipeline.action().damping.clone());
    let clip = MotionClip::load(&motion).expect("clip");
    let player = MotionPlayer::new(&clip, pipeline.contract().dt).expect("player");
    let reference = TrackerOptions::reference(pipeline.contract());
    let mut rust = Tracker::new(pipeline, player, reference).expect("tracker");

    let s = candle_core::safetensors::load(dir.join("sensors.safetensors"), &Device::Cpu).expect("sensors");
    let rec = candle_core::safetensors::load(dir.join("replay.safetensors"), &Device::Cpu).expect("replay");
    let (dp, dv, ar, av) =
        (flat(&s["dof_pos"]), flat(&s["dof_vel"]), flat(&s["anchor_rot"]), flat(&s["root_local_ang_vel"]));
    let want = flat(&rec["joint_pos_targets"]);
    let steps = s["dof_pos"].dims()[0];
    let (mut targets, mut stiffness, mut damping) = (vec![0f32; nd], vec![0f32; nd], vec![0f32; nd]);
    let mut worst = 0f32;
    for k in 0..steps {
        let row = |v: &[f32], w: usize| v[k * w..(k + 1) * w].to_vec();
        let (q, qd) = (row(&dp, nd), row(&dv, nd));
        let rot = row(&ar, 4);
        let gyro = row(&av, 3);
        let sensors = PmstateSensors {
            dof_pos: q.as_ptr(),
            dof_vel: qd.as_ptr(),
            num_dofs: nd,
            anchor_rot: [rot[0], rot[1], rot[2], rot[3]],
            root_local_ang_vel: [gyro[0], gyro[1], gyro[2]],
            anchor_pos: std::ptr::null(),
            body_pos: std::ptr::null(),
            body_rot: std::ptr::null(),
            body_vel: std::ptr::null(),
            body_ang_vel: std::ptr::null(),
            num_bodies: 0,
            ground_height: 0.0,
            has_stamp: 0,
            stamp_taken: 0.0,
            stamp_now: 0.0,
        };
        // SAFETY: a live tracker, sensors whose arrays hold num_dofs floats (alive
        // for the call), outputs of nd floats each.
        let status = unsafe {
            pmstate_tracker_step(t, &sensors, targets.as_mut_ptr(), stiffness.as_mut_ptr(), damping.as_mut_ptr(), nd)
        };
        assert_eq!(status, PmstateStatus::PmstateOk, "step {k}: {}", last_error());
        let r = rust
            .step(&Sensors {
                dof_pos: &q,
                dof_vel: &qd,
                anchor_rot: sensors.anchor_rot,
                root_local_ang_vel: sensors.root_local_ang_vel,
                anchor_pos: None,
                bodies: None,
                stamp: None,
            })
            .expect("rust step");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&targets), bits(&r.joint_pos_targets), "step {k}: C and Rust differ");
        assert_eq!(stiffness, stiffness_want, "step {k}: stiffness");
        assert_eq!(damping, damping_want, "step {k}: damping");
        for (a, b) in targets.iter().zip(&want[k * nd..(k + 1) * nd]) {
            worst = worst.max((a - b).abs());
        }
    }
    // SAFETY: the tracker opened above, not used afterwards.
    unsafe { pmstate_tracker_close(t) };
    eprintln!("v3.1 g1 through the C ABI, {steps} steps: PD targets max |diff| {worst:e} from the release's loop");
    assert!(worst <= TARGET_TOLERANCE, "PD targets: {worst:e}");
}

/// The largest difference between v3.0's loop and ours the Rust loop test
/// (crates/deploy/tests/releases.rs) observed (G1: actions 1.2e-5, targets
/// 3.9e-5), with margin.
const V30_TARGET_TOLERANCE: f32 = 2e-4;

/// v3.0's G1 and H1-2 trackers (testdata/deploy/v30_*_tracker) through the
/// C ABI, every body's state passed each step (v3.0 reads the root's pose
/// and the reference realigned with it): the PD targets those of `Tracker`
/// in Rust to the bit, and within [`V30_TARGET_TOLERANCE`] of v3.0's loop.
#[test]
fn the_c_abi_runs_the_v30_trackers() {
    for case in ["v30_g1_tracker", "v30_h1_tracker"] {
        let dir = root().join("testdata/deploy").join(case);
        let ckpt = dir.join("last.ckpt");
        let motion = if dir.join("clip.motion").exists() {
            dir.join("clip.motion")
        } else {
            root().join("testdata/deploy/synthetic.motion")
        };
        let mut o = std::mem::MaybeUninit::<PmstateOptions>::uninit();
        // SAFETY: `o` is writable storage for one PmstateOptions, which the call fills.
        assert_eq!(unsafe { pmstate_tracker_default_options(o.as_mut_ptr()) }, PmstateStatus::PmstateOk);
        // SAFETY: filled by pmstate_tracker_default_options.
        let mut opts = unsafe { o.assume_init() };
        opts.joint_limits = 0;
        opts.rate_limit = 0;
        let (ckpt_c, motion_c) = (c(&ckpt), c(&motion));
        let mut t: *mut PmstateTracker = std::ptr::null_mut();
        // SAFETY: NUL-terminated strings, a null config, valid options, `t` writable.
        let status =
            unsafe { pmstate_tracker_open_with(ckpt_c.as_ptr(), motion_c.as_ptr(), std::ptr::null(), &opts, &mut t) };
        assert_eq!(status, PmstateStatus::PmstateOk, "{case}: {}", last_error());
        // SAFETY: the tracker just opened.
        let nd = unsafe { pmstate_tracker_num_dofs(t) };

        let pipeline = Pipeline::load(&ckpt, None).expect("load");
        let clip = MotionClip::load(&motion).expect("clip");
        let player = MotionPlayer::new(&clip, pipeline.contract().dt).expect("player");
        let reference = TrackerOptions::reference(pipeline.contract());
        let mut rust = Tracker::new(pipeline, player, reference).expect("tracker");

        let s = candle_core::safetensors::load(dir.join("sensors.safetensors"), &Device::Cpu).expect("sensors");
        let rec = candle_core::safetensors::load(dir.join("replay.safetensors"), &Device::Cpu).expect("replay");
        let f = |k: &str| flat(&s[k]);
        let (dp, dv, ar, av) = (f("dof_pos"), f("dof_vel"), f("anchor_rot"), f("root_local_ang_vel"));
        let (bp, br, bv, ba) = (f("body_pos"), f("body_rot"), f("body_vel"), f("body_ang_vel"));
        let want = flat(&rec["joint_pos_targets"]);
        let steps = s["dof_pos"].dims()[0];
        let nb = bp.len() / steps / 3;
        let (mut targets, mut stiffness, mut damping) = (vec![0f32; nd], vec![0f32; nd], vec![0f32; nd]);
        let mut worst = 0f32;
        for k in 0..steps {
            let row = |v: &[f32], w: usize| v[k * w..(k + 1) * w].to_vec();
            let (q, qd, rot, gyro) = (row(&dp, nd), row(&dv, nd), row(&ar, 4), row(&av, 3));
            let (pos, brot, vel, ang) = (row(&bp, nb * 3), row(&br, nb * 4), row(&bv, nb * 3), row(&ba, nb * 3));
            let sensors = PmstateSensors {
                dof_pos: q.as_ptr(),
                dof_vel: qd.as_ptr(),
                num_dofs: nd,
                anchor_rot: [rot[0], rot[1], rot[2], rot[3]],
                root_local_ang_vel: [gyro[0], gyro[1], gyro[2]],
                anchor_pos: std::ptr::null(),
                body_pos: pos.as_ptr(),
                body_rot: brot.as_ptr(),
                body_vel: vel.as_ptr(),
                body_ang_vel: ang.as_ptr(),
                num_bodies: nb,
                ground_height: 0.0,
                has_stamp: 0,
                stamp_taken: 0.0,
                stamp_now: 0.0,
            };
            // SAFETY: a live tracker, sensors whose arrays hold num_dofs floats and
            // num_bodies multiples (alive for the call), outputs of nd floats each.
            let status = unsafe {
                pmstate_tracker_step(
                    t,
                    &sensors,
                    targets.as_mut_ptr(),
                    stiffness.as_mut_ptr(),
                    damping.as_mut_ptr(),
                    nd,
                )
            };
            assert_eq!(status, PmstateStatus::PmstateOk, "{case} step {k}: {}", last_error());
            let r = rust
                .step(&Sensors {
                    dof_pos: &q,
                    dof_vel: &qd,
                    anchor_rot: sensors.anchor_rot,
                    root_local_ang_vel: sensors.root_local_ang_vel,
                    anchor_pos: None,
                    bodies: Some(pmstate_deploy::BodyState {
                        pos: &pos,
                        rot: &brot,
                        vel: &vel,
                        ang_vel: &ang,
                        ground_height: 0.0,
                    }),
                    stamp: None,
                })
                .expect("rust step");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&targets), bits(&r.joint_pos_targets), "{case} step {k}: C and Rust differ");
            for (a, b) in targets.iter().zip(&want[k * nd..(k + 1) * nd]) {
                worst = worst.max((a - b).abs());
            }
        }
        // SAFETY: the tracker opened above, not used afterwards.
        unsafe { pmstate_tracker_close(t) };
        eprintln!("{case} through the C ABI, {steps} steps: PD targets max |diff| {worst:e} from the release's loop");
        assert!(worst <= V30_TARGET_TOLERANCE, "{case} PD targets: {worst:e}");
    }
}
