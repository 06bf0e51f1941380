//! `pmstate deploy contract|run|replay` on older releases' trackers: v3.1's
//! G1 (testdata/deploy/v31_g1_tracker) and v3.0's G1 and H1-2
//! (testdata/deploy/v30_*_tracker), recorded by
//! testdata/deploy/record_releases_deploy.py with each release's own
//! classes and observation code.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Output};

use candle_core::{Device, Tensor};
use pmstate_deploy::{MotionClip, MotionPlayer, Pipeline, Sensors, Tracker, TrackerOptions};
use serde_json::Value as J;

fn pmstate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pmstate")).args(args).output().expect("run pmstate")
}

fn root(rel: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel).display().to_string()
}

fn case(name: &str) -> String {
    root(&format!("testdata/deploy/v31_g1_tracker/{name}"))
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn load(path: &str) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(path, &Device::Cpu).expect("safetensors")
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().and_then(|t| t.to_vec1::<f32>()).expect("f32")
}

/// The contract of a v3.1 tracker (refused before: `mimic.future_steps:
/// missing`): its inputs, the state history among them, and where each value
/// v3.1's configs lack came from, in the YAML and the JSON.
#[test]
fn contract_of_the_v31_g1_tracker_says_where_its_values_came_from() {
    let ckpt = case("last.ckpt");
    let out = pmstate(&["deploy", "contract", &ckpt]);
    assert!(out.status.success(), "{}", text(&out));
    let yaml = String::from_utf8_lossy(&out.stdout);
    assert_eq!(yaml, Pipeline::load(&ckpt, None).expect("load").contract().to_yaml());
    assert!(yaml.contains("from_release_semantics:"), "{yaml}");
    assert!(yaml.contains("v3.1 mimic control num_future_steps"), "{yaml}");
    let out = pmstate(&["--json", "deploy", "contract", &ckpt]);
    assert!(out.status.success(), "{}", text(&out));
    let j: J = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(j["robot"]["anchor_body_index"], 16);
    assert_eq!(j["motion"]["future_step_indices"], serde_json::json!([1]));
    let fields: Vec<&str> =
        j["from_release_semantics"].as_array().expect("list").iter().filter_map(|f| f["field"].as_str()).collect();
    assert_eq!(fields, ["observations", "future_steps", "history_steps", "action"]);
    let history = j["policy_inputs"]
        .as_array()
        .expect("inputs")
        .iter()
        .find(|e| e["name"] == "historical_dof_pos")
        .expect("the state history is an input");
    assert_eq!(history["shape"], serde_json::json!([1, 3, 29]));
    assert_eq!(history["kind"], "joint_pos_history");
}

/// `deploy replay` over the recorded sensors, the envelope off (the
/// release's loop has none): the PD targets of `Tracker` to the bit, which
/// crates/deploy/tests/releases.rs holds to the release's loop step by step;
/// here within the largest difference that test observed, with margin.
#[test]
fn replay_of_the_v31_g1_tracker_matches_the_releases_loop() {
    let ckpt = case("last.ckpt");
    let (motion, sensors) = (root("testdata/deploy/synthetic.motion"), case("sensors.safetensors"));
    let dir = tempfile::tempdir().expect("tempdir");
    let o = dir.path().join("replay.safetensors").display().to_string();
    let out = pmstate(&[
        "deploy",
        "replay",
        &ckpt,
        "--motion",
        &motion,
        "--sensors",
        &sensors,
        "--out",
        &o,
        "--envelope",
        "off",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let got = load(&o);
    let got_targets = flat(&got["joint_pos_targets"]);

    let pipeline = Pipeline::load(&ckpt, None).expect("load");
    let clip = MotionClip::load(&motion).expect("clip");
    let player = MotionPlayer::new(&clip, pipeline.contract().dt).expect("player");
    let opts = TrackerOptions::reference(pipeline.contract());
    let mut t = Tracker::new(pipeline, player, opts).expect("tracker");
    let s = load(&sensors);
    let (dp, dv, ar, av) =
        (flat(&s["dof_pos"]), flat(&s["dof_vel"]), flat(&s["anchor_rot"]), flat(&s["root_local_ang_vel"]));
    let steps = s["dof_pos"].dims()[0];
    let nd = dp.len() / steps;
    let mut ours = Vec::new();
    for k in 0..steps {
        let pd = t
            .step(&Sensors {
                dof_pos: &dp[k * nd..(k + 1) * nd],
                dof_vel: &dv[k * nd..(k + 1) * nd],
                anchor_rot: [ar[4 * k], ar[4 * k + 1], ar[4 * k + 2], ar[4 * k + 3]],
                root_local_ang_vel: [av[3 * k], av[3 * k + 1], av[3 * k + 2]],
                anchor_pos: None,
                bodies: None,
                stamp: None,
            })
            .expect("step");
        ours.extend_from_slice(&pd.joint_pos_targets);
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got_targets), bits(&ours), "deploy replay and Tracker differ");
    let want = flat(&load(&case("replay.safetensors"))["joint_pos_targets"]);
    let worst = got_targets.iter().zip(&want).fold(0f32, |d, (a, b)| d.max((a - b).abs()));
    eprintln!("deploy replay, v3.1 g1: PD targets max |diff| {worst:e} from the release's loop");
    assert!(worst <= 1e-4, "{worst:e}");
}

/// `deploy run` on sixteen rows of v3.1's context (the recorded keys,
/// v3.1's names, renamed to the pipeline's inputs): the outputs of
/// `Pipeline::forward` to the bit, whose observations
/// crates/deploy/tests/releases.rs holds to v3.1's bit for bit; the PD
/// targets within the loop test's margin of the release's.
#[test]
fn run_of_the_v31_g1_tracker_writes_the_pipeline_outputs() {
    use pmstate_deploy::context::{input_name, v31_context_path};
    let ckpt = case("last.ckpt");
    let dir = tempfile::tempdir().expect("tempdir");
    let renamed: HashMap<String, Tensor> = load(&case("inputs_b16.safetensors"))
        .into_iter()
        .map(|(k, t)| (input_name(v31_context_path(&k).expect("a v3.1 context key")), t))
        .collect();
    let inputs = dir.path().join("inputs.safetensors");
    candle_core::safetensors::save(&renamed, &inputs).expect("save");
    let o = dir.path().join("out.safetensors").display().to_string();
    let out = pmstate(&["deploy", "run", &ckpt, "--inputs", &inputs.display().to_string(), "--out", &o]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("joint_pos_targets [16, 29]"), "{}", text(&out));
    let got = load(&o);
    let want = Pipeline::load(&ckpt, None).expect("load").forward(&renamed).expect("forward");
    for (name, t) in want.named() {
        assert_eq!(flat(&got[name]), flat(t), "{name}");
    }
    let theirs = flat(&load(&case("torch_b16.safetensors"))["joint_pos_targets"]);
    let worst = flat(&got["joint_pos_targets"]).iter().zip(&theirs).fold(0f32, |d, (a, b)| d.max((a - b).abs()));
    eprintln!("deploy run, v3.1 g1, b16: PD targets max |diff| {worst:e} from the release's");
    assert!(worst <= 1e-4, "{worst:e}");
}

/// v3.0's trackers: the G1 and the H1-2 (testdata/deploy/v30_*_tracker),
/// and the clip each was recorded on.
const V30_CASES: [(&str, &str); 2] = [
    ("testdata/deploy/v30_g1_tracker", "testdata/deploy/synthetic.motion"),
    ("testdata/deploy/v30_h1_tracker", "testdata/deploy/v30_h1_tracker/clip.motion"),
];

/// The contract of v3.0's trackers (refused before: "v3.0's Mimic env
/// observations"): the root's state and the reference clock among the
/// inputs, and where each value v3.0's configs lack came from.
#[test]
fn contract_of_the_v30_trackers_says_where_its_values_came_from() {
    for (dir, _) in V30_CASES {
        let ckpt = root(&format!("{dir}/last.ckpt"));
        let out = pmstate(&["deploy", "contract", &ckpt]);
        assert!(out.status.success(), "{}", text(&out));
        let yaml = String::from_utf8_lossy(&out.stdout);
        assert_eq!(yaml, Pipeline::load(&ckpt, None).expect("load").contract().to_yaml());
        assert!(yaml.contains("realign_motion_with_humanoid_on_each_step"), "{yaml}");
        let out = pmstate(&["--json", "deploy", "contract", &ckpt]);
        assert!(out.status.success(), "{}", text(&out));
        let j: J = serde_json::from_slice(&out.stdout).expect("one JSON object");
        assert_eq!(j["robot"]["anchor_body_index"], 0);
        let fields: Vec<(&str, &str)> = j["from_release_semantics"]
            .as_array()
            .expect("list")
            .iter()
            .filter_map(|f| Some((f["field"].as_str()?, f["release"].as_str()?)))
            .collect();
        assert_eq!(
            fields,
            [
                ("anchor_body_index", "v3.0"),
                ("observations", "v3.0"),
                ("future_steps", "v3.0"),
                ("reference_frame", "v3.0"),
                ("history_steps", "v3.0"),
                ("action", "v3.0"),
            ],
            "{dir}"
        );
        let kinds: Vec<&str> =
            j["policy_inputs"].as_array().expect("inputs").iter().filter_map(|e| e["kind"].as_str()).collect();
        for kind in
            ["body_pos", "body_rot", "root_rot_history", "reference_motion_realign_offset", "reference_motion_time"]
        {
            assert!(kinds.contains(&kind), "{dir}: {kind} in {kinds:?}");
        }
    }
}

/// `deploy replay` of v3.0's trackers over the recorded readings (every
/// body's state), the envelope off: the PD targets of `Tracker` to the bit,
/// which crates/deploy/tests/releases.rs holds to v3.0's loop step by step;
/// here within the largest difference that test observed (3.9e-5), with
/// margin.
#[test]
fn replay_of_the_v30_trackers_matches_the_releases_loop() {
    for (dir, motion) in V30_CASES {
        let ckpt = root(&format!("{dir}/last.ckpt"));
        let (motion, sensors) = (root(motion), root(&format!("{dir}/sensors.safetensors")));
        let tmp = tempfile::tempdir().expect("tempdir");
        let o = tmp.path().join("replay.safetensors").display().to_string();
        let args = ["deploy", "replay", &ckpt, "--motion", &motion, "--sensors", &sensors, "--out", &o];
        let out = pmstate(&[&args[..], &["--envelope", "off"]].concat());
        assert!(out.status.success(), "{}", text(&out));
        let got_targets = flat(&load(&o)["joint_pos_targets"]);

        let pipeline = Pipeline::load(&ckpt, None).expect("load");
        let clip = MotionClip::load(&motion).expect("clip");
        let player = MotionPlayer::new(&clip, pipeline.contract().dt).expect("player");
        let opts = TrackerOptions::reference(pipeline.contract());
        let mut t = Tracker::new(pipeline, player, opts).expect("tracker");
        let s = load(&sensors);
        let f = |k: &str| flat(&s[k]);
        let (dp, dv, ar, av) = (f("dof_pos"), f("dof_vel"), f("anchor_rot"), f("root_local_ang_vel"));
        let (bp, br, bv, ba) = (f("body_pos"), f("body_rot"), f("body_vel"), f("body_ang_vel"));
        let steps = s["dof_pos"].dims()[0];
        let (nd, nb) = (dp.len() / steps, bp.len() / steps / 3);
        let mut ours = Vec::new();
        for k in 0..steps {
            let pd = t
                .step(&Sensors {
                    dof_pos: &dp[k * nd..(k + 1) * nd],
                    dof_vel: &dv[k * nd..(k + 1) * nd],
                    anchor_rot: [ar[4 * k], ar[4 * k + 1], ar[4 * k + 2], ar[4 * k + 3]],
                    root_local_ang_vel: [av[3 * k], av[3 * k + 1], av[3 * k + 2]],
                    anchor_pos: None,
                    bodies: Some(pmstate_deploy::BodyState {
                        pos: &bp[k * nb * 3..(k + 1) * nb * 3],
                        rot: &br[k * nb * 4..(k + 1) * nb * 4],
                        vel: &bv[k * nb * 3..(k + 1) * nb * 3],
                        ang_vel: &ba[k * nb * 3..(k + 1) * nb * 3],
                        ground_height: 0.0,
                    }),
                    stamp: None,
                })
                .expect("step");
            ours.extend_from_slice(&pd.joint_pos_targets);
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got_targets), bits(&ours), "{dir}: deploy replay and Tracker differ");
        let want = flat(&load(&root(&format!("{dir}/replay.safetensors")))["joint_pos_targets"]);
        let worst = got_targets.iter().zip(&want).fold(0f32, |d, (a, b)| d.max((a - b).abs()));
        eprintln!("deploy replay, {dir}: PD targets max |diff| {worst:e} from the release's loop");
        assert!(worst <= 2e-4, "{dir}: {worst:e}");
    }
}

/// `deploy run` on sixteen rows of v3.0's inputs (the recorded ones the
/// pipeline reads): the outputs of `Pipeline::forward` to the bit.
#[test]
fn run_of_the_v30_trackers_writes_the_pipeline_outputs() {
    for (dir, _) in V30_CASES {
        let ckpt = root(&format!("{dir}/last.ckpt"));
        let p = Pipeline::load(&ckpt, None).expect("load");
        let mut inputs = load(&root(&format!("{dir}/inputs_b16.safetensors")));
        inputs.retain(|k, _| p.inputs().iter().any(|i| &i.name == k));
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("inputs.safetensors");
        candle_core::safetensors::save(&inputs, &path).expect("save");
        let o = tmp.path().join("out.safetensors").display().to_string();
        let out = pmstate(&["deploy", "run", &ckpt, "--inputs", &path.display().to_string(), "--out", &o]);
        assert!(out.status.success(), "{}", text(&out));
        let got = load(&o);
        let want = p.forward(&inputs).expect("forward");
        for (name, t) in want.named() {
            assert_eq!(flat(&got[name]), flat(t), "{dir} {name}");
        }
        let theirs = flat(&load(&root(&format!("{dir}/torch_b16.safetensors")))["joint_pos_targets"]);
        let worst = flat(&got["joint_pos_targets"]).iter().zip(&theirs).fold(0f32, |d, (a, b)| d.max((a - b).abs()));
        eprintln!("deploy run, {dir}, b16: PD targets max |diff| {worst:e} from the release's");
        assert!(worst <= 2e-4, "{dir}: {worst:e}");
    }
}
