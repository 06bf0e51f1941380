//! Opening a tracker through the C ABI refuses what `Pipeline::load`,
//! `MotionPlayer::new` and `Envelope::validate` refuse, with an error status
//! and a reason, never an abort or a panic: configs whose observation layout
//! is not the actor's input width (both widths named), a clip whose
//! resampling would pass the player's memory bound, and a safe pose of the
//! wrong length or not finite. The extern functions are called from Rust
//! here; tests/c_program.rs drives them from C.
// The functions under test are the C ABI's `unsafe extern "C"` functions.
#![allow(unsafe_code)]

use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};

use pmstate_ckpt::{Checkpoint, Node};
use pmstate_deploy::{MotionClip, Pipeline};
use pmstate_deploy_c::{
    pmstate_tracker_close, pmstate_tracker_default_options, pmstate_tracker_last_error, pmstate_tracker_open,
    pmstate_tracker_open_with, PmstateOptions, PmstateStatus, PmstateTracker,
};

#[path = "../../deploy/tests/common/configs.rs"]
mod configs;
use configs::g1_with_one_future_step_more;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn g1(file: &str) -> PathBuf {
    root().join("testdata/policy/g1_amp_deploy").join(file)
}

fn c(p: &Path) -> CString {
    CString::new(p.display().to_string()).expect("no NUL in a test path")
}

fn last_error() -> String {
    // SAFETY: the ABI returns a NUL-terminated string valid until the next failing call on this thread.
    unsafe { CStr::from_ptr(pmstate_tracker_last_error()) }.to_string_lossy().into_owned()
}

/// `pmstate_tracker_open_with(checkpoint, motion, config, options)`: the
/// status, the tracker (closed here) and the reason.
fn open(
    checkpoint: &Path,
    motion: &Path,
    config: Option<&Path>,
    options: Option<&PmstateOptions>,
) -> (PmstateStatus, bool, String) {
    let (ckpt, motion) = (c(checkpoint), c(motion));
    let config = config.map(c);
    let config_ptr: *const c_char = config.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    let options_ptr: *const PmstateOptions = options.map_or(std::ptr::null(), |o| o as *const _);
    let mut t: *mut PmstateTracker = std::ptr::null_mut();
    // SAFETY: NUL-terminated strings (or null for the config), options null or
    // valid (its safe_pose null or holding safe_pose_len floats: the callers'
    // arrays, alive for the call), `t` writable.
    let status = unsafe { pmstate_tracker_open_with(ckpt.as_ptr(), motion.as_ptr(), config_ptr, options_ptr, &mut t) };
    let opened = !t.is_null();
    // SAFETY: null or the tracker just opened, not used afterwards.
    unsafe { pmstate_tracker_close(t) };
    (status, opened, last_error())
}

/// Configs with one future step more than the actor was trained on: open
/// (with the configs next to the checkpoint, and named explicitly) is an
/// error naming both widths, and writes no tracker.
#[test]
fn configs_the_actor_does_not_read_are_refused_at_open_naming_both_widths() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ckpt, observations, actor) = g1_with_one_future_step_more(dir.path());
    let motion = root().join("testdata/deploy/synthetic.motion");
    let configs = dir.path().join("resolved_configs_inference.pt");
    for config in [None, Some(configs.as_path())] {
        let (status, opened, reason) = open(&ckpt, &motion, config, None);
        assert_eq!(status, PmstateStatus::PmstateError, "{reason}");
        assert!(!opened, "a refused open wrote a tracker");
        assert!(
            reason.contains(&format!("{actor} values")) && reason.contains(&format!("give {observations}")),
            "{reason}"
        );
    }
    // pmstate_tracker_open (default options) answers the same
    let (ckpt_c, motion_c) = (c(&ckpt), c(&motion));
    let mut t: *mut PmstateTracker = std::ptr::null_mut();
    // SAFETY: NUL-terminated strings, a null config, `t` writable.
    let status = unsafe { pmstate_tracker_open(ckpt_c.as_ptr(), motion_c.as_ptr(), std::ptr::null(), &mut t) };
    assert_eq!(status, PmstateStatus::PmstateError);
    assert!(t.is_null());
    assert!(last_error().contains(&format!("give {observations}")), "{}", last_error());
}

/// The shipped clip at a tiny frame rate (valid, but ten million control
/// frames, about 20 GB of player at the g1's size): open returns an error
/// naming the player's bound before anything is allocated, and this
/// process is still here.
#[test]
fn a_clip_past_the_players_bound_is_an_error_not_an_abort() {
    let clip_path = root().join("testdata/deploy/synthetic.motion");
    let (mut tree, storages) = Checkpoint::open(&clip_path).expect("clip").into_parts();
    let frames = MotionClip::load(&clip_path).expect("clip").frames;
    // 9.9 million control frames at the g1's 50 Hz
    let fps = (frames - 1) as f64 / (9.9e6 * 0.02);
    *tree.as_dict_mut().and_then(|d| d.get_mut("fps")).expect("fps") = Node::Float(fps);
    let dir = tempfile::tempdir().expect("tempdir");
    let slow = dir.path().join("slow.motion");
    let edited = Checkpoint::from_parts(tree, storages).expect("parts");
    pmstate_ckpt::save_torch(&edited, &slow, &Default::default()).expect("save");
    let (status, opened, reason) = open(&g1("last.ckpt"), &slow, None, None);
    assert_eq!(status, PmstateStatus::PmstateError, "{reason}");
    assert!(!opened);
    assert!(reason.contains("past the player's bound"), "{reason}");
    // the same tracker opens with the clip as shipped
    let (status, opened, reason) = open(&g1("last.ckpt"), &clip_path, None, None);
    assert_eq!((status, opened), (PmstateStatus::PmstateOk, true), "{reason}");
}

/// The options' safe pose: one value per joint, every one finite, or the
/// open is an error naming the field; a null pose with a length is one too.
#[test]
fn a_safe_pose_of_the_wrong_length_or_not_finite_is_refused() {
    let motion = root().join("testdata/deploy/synthetic.motion");
    let mut o = std::mem::MaybeUninit::<PmstateOptions>::uninit();
    // SAFETY: `o` is writable storage for one PmstateOptions, which the call fills.
    assert_eq!(unsafe { pmstate_tracker_default_options(o.as_mut_ptr()) }, PmstateStatus::PmstateOk);
    // SAFETY: filled by pmstate_tracker_default_options.
    let defaults = unsafe { o.assume_init() };
    assert!(defaults.safe_pose.is_null() && defaults.safe_pose_len == 0);
    let nd = Pipeline::load(g1("last.ckpt"), None).expect("load").dims().num_dofs;
    let short = vec![0.0f32; nd - 1];
    let mut nan = vec![0.0f32; nd];
    nan[4] = f32::NAN;
    let good = vec![0.0f32; nd];
    let with = |pose: *const f32, len: usize| PmstateOptions { safe_pose: pose, safe_pose_len: len, ..defaults };
    for (o, want) in [
        (with(short.as_ptr(), short.len()), "safe_pose_len"),
        (with(nan.as_ptr(), nan.len()), "envelope.safe_pose"),
        (with(std::ptr::null(), nd), "safe_pose is null"),
    ] {
        let (status, opened, reason) = open(&g1("last.ckpt"), &motion, None, Some(&o));
        assert_eq!(status, PmstateStatus::PmstateError, "{want}: {reason}");
        assert!(!opened);
        assert!(reason.contains(want), "{want}: {reason}");
    }
    let (status, opened, reason) = open(&g1("last.ckpt"), &motion, None, Some(&with(good.as_ptr(), nd)));
    assert_eq!((status, opened), (PmstateStatus::PmstateOk, true), "{reason}");
}
