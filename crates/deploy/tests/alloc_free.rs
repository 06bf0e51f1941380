//! A control step allocates nothing once the tracker has run one, with the
//! safety envelope's every guard and the flight recorder on, nor does an
//! operator's stop or a step in the safe mode: every
//! allocation of this process is counted (a global allocator wrapping the
//! system's), and 200 steps of the g1 tracker after a warm-up must make
//! none. The test binary holds only this test; the recorder's writer
//! thread allocates nothing per record (it writes the ring's slices).
// A GlobalAlloc is unsafe to implement; it forwards to the system allocator.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use candle_core::Device;
use pmstate_deploy::{
    EndOfClip, JointLimits, LogMeta, MotionClip, MotionPlayer, Pipeline, SafePose, SafeReason, Sensors, Stamp, Tracker,
    TrackerOptions,
};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call forwards to `System` with the caller's arguments, so
// the GlobalAlloc contract holds exactly as for the system allocator; the
// counter is an atomic.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded as received.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as received.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded as received.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn a_step_allocates_nothing_after_the_first() {
    let pipeline = Pipeline::load(root().join("testdata/policy/g1_amp_deploy/last.ckpt"), None).expect("load");
    let clip = MotionClip::load(root().join("testdata/deploy/synthetic.motion")).expect("clip");
    let player = MotionPlayer::new(&clip, pipeline.contract().dt).expect("player");
    let nd = pipeline.dims().num_dofs;
    let mut opts = TrackerOptions::new(&pipeline);
    // the filters on too
    opts.action_ema_alpha = 0.8;
    opts.pd_target_max_accel = Some(50.0);
    // every guard on, none tripping: soft start, rate limit, joint limits, tilt, stale sensors
    opts.envelope.soft_start_seconds = 1.0;
    opts.envelope.max_target_rate = Some(vec![20.0; nd]);
    opts.envelope.joint_limits = Some(JointLimits { lower: vec![-0.05; nd], upper: vec![0.05; nd] });
    opts.envelope.max_tilt = Some(3.1);
    opts.envelope.stale_after_periods = Some(5);
    opts.envelope.end_of_clip = EndOfClip::Hold;
    opts.envelope.safe_pose = SafePose::Pose(vec![0.01; nd]);
    let mut t = Tracker::new(pipeline, player, opts).expect("tracker");
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("flight.pmlog");
    t.record_to(&log, &LogMeta::default()).expect("recorder");
    let s =
        candle_core::safetensors::load(root().join("testdata/deploy/g1_amp_deploy/sensors.safetensors"), &Device::Cpu)
            .expect("sensors");
    let col = |k: &str| s[k].flatten_all().and_then(|t| t.to_vec1::<f32>()).expect("f32");
    let (dp, dv, ar, av) = (col("dof_pos"), col("dof_vel"), col("anchor_rot"), col("root_local_ang_vel"));
    let steps = s["dof_pos"].dims()[0];
    let nd = dp.len() / steps;
    let step = |t: &mut Tracker, k: usize| {
        let k = k % steps;
        let sensors = Sensors {
            dof_pos: &dp[k * nd..(k + 1) * nd],
            dof_vel: &dv[k * nd..(k + 1) * nd],
            anchor_rot: [ar[4 * k], ar[4 * k + 1], ar[4 * k + 2], ar[4 * k + 3]],
            root_local_ang_vel: [av[3 * k], av[3 * k + 1], av[3 * k + 2]],
            anchor_pos: None,
            bodies: None,
            stamp: Some(Stamp { taken: k as f64 * 0.02, now: k as f64 * 0.02 + 0.001 }),
        };
        let out = t.step(&sensors).expect("step");
        out.joint_pos_targets[0]
    };
    for k in 0..3 {
        step(&mut t, k);
    }
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let mut sum = 0.0;
    for k in 3..203 {
        sum += step(&mut t, k);
    }
    let made = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert!(sum.is_finite());
    let status = t.status();
    assert_eq!(made, 0, "200 steps made {made} allocations");
    // the guards ran: the soft start blended, the tight limits clamped
    assert!(status.soft_start_steps > 0 && status.joint_limit_clamps > 0, "{status:?}");
    assert_eq!(status.safe_mode, None);
    // the safe mode (an operator's stop, towards the configured pose): the
    // stop and every safe step from the first allocate nothing either
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    t.stop();
    for k in 203..253 {
        sum += step(&mut t, k);
    }
    let made = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert!(sum.is_finite());
    assert_eq!(made, 0, "the stop and 50 safe-mode steps made {made} allocations");
    let status = t.status();
    assert_eq!(status.safe_mode, Some(SafeReason::Operator), "{status:?}");
    assert_eq!(status.safe_mode_steps, 50, "{status:?}");
    let summary = t.finish_recording().expect("finish").expect("recording");
    // 253 steps and the stop
    assert_eq!(summary.records + summary.dropped, 254, "{summary:?}");
}
