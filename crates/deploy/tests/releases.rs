//! Older releases' trackers through the deploy path (v3.0's G1 and H1-2 below,
//! V30_CASES): v3.1's published
//! motion_tracker/g1-amass configs (testdata/deploy/v31_g1_tracker, a
//! checkpoint built with v3.1's own classes at shrunk widths) against v3.1's
//! own observation code, history buffer and action conversion, recorded by
//! testdata/deploy/record_releases_deploy.py.

use std::collections::HashMap;

use candle_core::Tensor;
use pmstate_deploy::context::{input_name, v31_context_path};
use pmstate_deploy::{MotionClip, MotionPlayer, Pipeline, Sensors, Tracker, TrackerOptions};

#[path = "common/data.rs"]
mod data;
use data::{flat, load, root};
#[path = "common/configs.rs"]
mod configs;
use configs::{at, write_edited};
use pmstate_ckpt::Node;

const CASE: &str = "testdata/deploy/v31_g1_tracker";

fn pipeline() -> Pipeline {
    Pipeline::load(root().join(CASE).join("last.ckpt"), None).expect("load the v3.1 tracker")
}

/// Largest |a - b|.
fn worst(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0f32, |d, (x, y)| d.max((x - y).abs()))
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The recorded inputs, named by v3.1's context keys, renamed to the
/// pipeline's inputs.
fn inputs_b16() -> HashMap<String, Tensor> {
    load(&root().join(CASE).join("inputs_b16.safetensors"))
        .into_iter()
        .map(|(k, t)| {
            let path = v31_context_path(&k).unwrap_or_else(|| panic!("no context path for {k}"));
            (input_name(path), t)
        })
        .collect()
}

/// The contract names where each value v3.1's configs lack came from.
#[test]
fn v31_contract_says_where_its_values_came_from() {
    let p = pipeline();
    let c = p.contract();
    assert_eq!(c.robot.anchor_body_index, 16);
    assert_eq!(c.robot.anchor_body_name.as_deref(), Some("torso_link"));
    assert_eq!(c.motion.future_step_indices, vec![1]);
    assert_eq!(p.dims().history_steps, 3);
    let said: Vec<String> = c.fallbacks.iter().map(ToString::to_string).collect();
    assert!(
        said.iter().any(|s| {
            s.starts_with(
            "future_steps: from v3.1 env.control_components.mimic.num_future_steps (v3.1 mimic control num_future_steps"
        )
        }),
        "{said:?}"
    );
    for field in ["observations", "history_steps", "action"] {
        assert!(c.fallbacks.iter().any(|f| f.field == field && f.release == "v3.1"), "{field}: {said:?}");
    }
    let names: Vec<&str> = p.inputs().iter().map(|i| i.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "current_anchor_rot",
            "current_dof_pos",
            "current_dof_vel",
            "current_root_local_ang_vel",
            "historical_anchor_rot",
            "historical_buffered_actions",
            "historical_dof_pos",
            "historical_dof_vel",
            "historical_root_local_ang_vel",
            "mimic_future_anchor_rot",
            "mimic_future_dof_pos",
            "mimic_future_dof_vel",
        ]
    );
    // historical_root_rot is bound but read only with root_vel_obs
    assert_eq!(c.runtime.passthrough_keys, vec!["historical.root_rot".to_owned()]);
    let yaml = c.to_yaml();
    assert!(yaml.contains("from_release_semantics:"), "{yaml}");
    assert_eq!(c.control.action_function, "build_pd_action_offset_scale");
    assert_eq!(c.control.action_transform, "clamp");
}

/// Sixteen seeded rows: every observation is v3.1's
/// `ObservationManager.compute_observations` to the bit (reduced coords,
/// its history, the target poses, the buffered actions), the actions
/// within the policy crate's bound of the float64 forward, the PD targets
/// those of v3.1's `build_pd_action_offset_scale` to the bit given torch's
/// actions.
#[test]
fn v31_pipeline_matches_the_releases_observations_and_targets() {
    let p = pipeline();
    let dir = root().join(CASE);
    let inputs = inputs_b16();
    let obs = p.compute_observations(&inputs).expect("observations");
    let want = load(&dir.join("obs_b16.safetensors"));
    assert_eq!(want.len(), p.observations().len());
    for o in p.observations() {
        let got = flat(&obs[&o.key]);
        let w = flat(&want[&o.key]);
        assert_eq!(got.len(), w.len(), "{}", o.key);
        assert_eq!(bits(&got), bits(&w), "{}: not v3.1's bits", o.key);
    }
    check_b16_actions("v3.1 g1", &p, &inputs, &obs, &want, &dir);
}

/// The sixteen rows' actions within the policy crate's bound of the
/// float64 forward of their observations (ours of `obs`, torch's of the
/// release's `want`), and the PD targets of torch's actions those the
/// release computed, to the bit.
fn check_b16_actions(
    case: &str,
    p: &Pipeline,
    inputs: &HashMap<String, Tensor>,
    obs: &HashMap<String, Tensor>,
    want: &HashMap<String, Tensor>,
    dir: &std::path::Path,
) {
    let reference = p.policy().actor_reference(obs).expect("reference");
    let ours = flat(&p.forward(inputs).expect("forward").actions);
    assert!(pmstate_policy::bound::within(&ours, &reference, 1.0).is_none(), "{case}: our actions");
    let torch = load(&dir.join("torch_b16.safetensors"));
    let theirs = flat(&torch["actions"]);
    let theirs_ref = p.policy().actor_reference(want).expect("reference");
    assert!(pmstate_policy::bound::within(&theirs, &theirs_ref, 1.0).is_none(), "{case}: torch's actions");
    eprintln!("{case} b16: actions vs torch: max |diff| {:e}", worst(&ours, &theirs));
    let nd = p.dims().num_dofs;
    let mut targets = vec![0f32; theirs.len()];
    for (a, t) in theirs.chunks(nd).zip(targets.chunks_mut(nd)) {
        p.action().targets(a, t);
    }
    assert_eq!(bits(&targets), bits(&flat(&torch["joint_pos_targets"])), "{case}: targets of torch's actions");
}

/// The deploy loop over the recorded sensors against v3.1's
/// StateHistoryBuffer, ObservationManager and actor fed the same readings
/// and references, step by step at the tolerances of today's parity tests
/// (tests/parity.rs): every observation the tracker assembles is v3.1's to
/// the bit but the buffered actions, which hold this crate's own past
/// actions (each within the bound of its step, so they differ from torch's
/// by float rounding: held to the largest action difference before);
/// each step's actions, ours and torch's, lie within the policy crate's
/// bound of the float64 forward of their own observations; the PD targets
/// are the action function of the actions, to the bit.
/// The future anchor rotations come from the player's slerp and the yaw
/// alignment, within 3e-7 of the Python runtime's per component (torch's and
/// NumPy's acos/sin/cos/atan2 are not libm's; tests/replay.rs), and the
/// target poses are products of two such components and the current anchor's
/// (`quat_to_tan_norm` of the relative rotation): within 4 x 3e-7.
const TARGET_POSE_TOLERANCE: f32 = 1.2e-6;

#[test]
fn v31_tracker_replays_the_releases_loop() {
    let dir = root().join(CASE);
    let pipeline = pipeline();
    let clip = MotionClip::load(root().join("testdata/deploy/synthetic.motion")).expect("clip");
    let player = MotionPlayer::new(&clip, pipeline.contract().dt).expect("player");
    let opts = TrackerOptions::reference(pipeline.contract());
    let mut t = Tracker::new(pipeline, player, opts).expect("tracker");
    let s = load(&dir.join("sensors.safetensors"));
    let (dp, dv, ar, av) =
        (flat(&s["dof_pos"]), flat(&s["dof_vel"]), flat(&s["anchor_rot"]), flat(&s["root_local_ang_vel"]));
    let steps = s["dof_pos"].dims()[0];
    assert_eq!(steps, 60);
    let nd = dp.len() / steps;
    let rec = load(&dir.join("replay.safetensors"));
    let (mut worst_action, mut worst_target, mut worst_targets_obs) = (0f32, 0f32, 0f32);
    for k in 0..steps {
        let sensors = Sensors {
            dof_pos: &dp[k * nd..(k + 1) * nd],
            dof_vel: &dv[k * nd..(k + 1) * nd],
            anchor_rot: [ar[4 * k], ar[4 * k + 1], ar[4 * k + 2], ar[4 * k + 3]],
            root_local_ang_vel: [av[3 * k], av[3 * k + 1], av[3 * k + 2]],
            anchor_pos: None,
            bodies: None,
            stamp: None,
        };
        let pd = t.step(&sensors).expect("step").clone();
        let p = t.pipeline();
        // this step's inputs, as the tracker assembled them, through the observations
        let inputs: HashMap<String, Tensor> = p
            .inputs()
            .iter()
            .zip(t.last_inputs())
            .map(|(i, v)| {
                let mut shape = vec![1];
                shape.extend(&i.row_shape);
                (i.name.clone(), Tensor::from_vec(v.clone(), shape, &candle_core::Device::Cpu).expect("tensor"))
            })
            .collect();
        let ours = p.compute_observations(&inputs).expect("observations");
        let mut theirs = HashMap::new();
        for o in p.observations() {
            let want = rec[&format!("obs.{}", o.key)].get(k).expect("row").unsqueeze(0).expect("row");
            let (g, w) = (flat(&ours[&o.key]), flat(&want));
            if o.key == "historical_previous_actions" {
                let d = worst(&g, &w);
                assert!(d <= worst_action, "step {k} {}: {d:e} over {worst_action:e}", o.key);
            } else if o.key == "noisy_mimic_reduced_coords_target_poses" {
                let d = worst(&g, &w);
                worst_targets_obs = worst_targets_obs.max(d);
                assert!(d <= TARGET_POSE_TOLERANCE, "step {k} {}: {d:e}", o.key);
            } else {
                assert_eq!(bits(&g), bits(&w), "step {k} {}: not v3.1's bits", o.key);
            }
            theirs.insert(o.key.clone(), want);
        }
        for (obs, actions, who) in
            [(&ours, pd.actions.clone(), "ours"), (&theirs, flat(&rec["actions"].get(k).expect("row")), "torch's")]
        {
            let reference = p.policy().actor_reference(obs).expect("reference");
            let hit = pmstate_policy::bound::within(&actions, &reference, 1.0);
            assert!(hit.is_none(), "step {k}: {who} actions outside the bound: {hit:?}");
        }
        let mut targets = vec![0f32; nd];
        p.action().targets(&pd.actions, &mut targets);
        assert_eq!(bits(&targets), bits(&pd.joint_pos_targets), "step {k}: targets");
        worst_action = worst_action.max(worst(&pd.actions, &flat(&rec["actions"].get(k).expect("row"))));
        let want_targets = flat(&rec["joint_pos_targets"].get(k).expect("row"));
        worst_target = worst_target.max(worst(&pd.joint_pos_targets, &want_targets));
    }
    eprintln!(
        "v3.1 g1 loop, {steps} steps: actions max |diff| {worst_action:e}, PD targets {worst_target:e}, \
         target poses {worst_targets_obs:e}"
    );
}

/// The anchor index as v3.1's YAML dumps write it (`anchor_body_index:
/// '16'`, a string) is read as the integer it holds; a string that holds
/// none is refused naming the file, the key and the string.
#[test]
fn a_string_anchor_index_is_read_or_refused_by_name() {
    let dir = root().join(CASE);
    let edit = |value: &str| {
        let tmp = tempfile::tempdir().expect("tempdir");
        let v = value.to_owned();
        let ckpt = write_edited(&dir.join("last.ckpt"), &dir.join("resolved_configs_inference.pt"), tmp.path(), |r| {
            *at(r, "robot.anchor_body_index") = Node::Str(v)
        });
        (Pipeline::load(&ckpt, None), tmp)
    };
    let (p, _tmp) = edit("16");
    assert_eq!(p.expect("a string holding 16").contract().robot.anchor_body_index, 16);
    let (p, _tmp) = edit("torso_link");
    let e = p.expect_err("a string holding no integer");
    let msg = e.to_string();
    assert!(msg.contains("robot.anchor_body_index"), "{msg}");
    assert!(msg.contains("the string 'torso_link'"), "{msg}");
    assert!(msg.contains("resolved_configs_inference.pt"), "{msg}");
}

/// An option of v3.0's Mimic env this crate does not implement is refused
/// naming its key (here the reference's contacts appended to the target
/// poses), not run with a wrong layout.
#[test]
fn v30_unimplemented_options_are_refused_by_key() {
    let dir = root().join("testdata/deploy/v30_g1_tracker");
    let tmp = tempfile::tempdir().expect("tempdir");
    let ckpt = write_edited(&dir.join("last.ckpt"), &dir.join("resolved_configs_inference.pt"), tmp.path(), |r| {
        *at(r, "env.mimic_obs.mimic_target_pose.with_contacts") = Node::Bool(true)
    });
    let e = Pipeline::load(&ckpt, None).expect_err("contacts in the target poses");
    let msg = e.to_string();
    assert!(msg.contains("env.mimic_obs.mimic_target_pose.with_contacts"), "{msg}");
    assert!(msg.contains("resolved_configs_inference.pt"), "{msg}");
}

/// v3.0's trackers: the G1 and the H1-2 (testdata/deploy/v30_*_tracker),
/// one runtime (`pmstate_deploy::v30`), two robots.
const V30_CASES: [&str; 2] = ["testdata/deploy/v30_g1_tracker", "testdata/deploy/v30_h1_tracker"];

fn v30_pipeline(case: &str) -> Pipeline {
    Pipeline::load(root().join(case).join("last.ckpt"), None).expect("load the v3.0 tracker")
}

/// Largest |a - b| relative to max(1, |b|): the tolerance of values that
/// pass through libm's sin/cos/atan2/sqrt (torch's are vectorized SLEEF,
/// within an ulp of them, not the same bits).
fn worst_rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0f32, |d, (x, y)| d.max((x - y).abs() / y.abs().max(1.0)))
}

/// The contract of v3.0's configs: the inputs its code-computed
/// observations read, and where each value its configs lack came from.
#[test]
fn v30_contract_says_where_its_values_came_from() {
    for case in V30_CASES {
        let p = v30_pipeline(case);
        let c = p.contract();
        assert_eq!(c.robot.anchor_body_index, 0, "{case}");
        assert_eq!(c.motion.future_step_indices, vec![1], "{case}");
        assert_eq!(p.dims().history_steps, 2, "{case}: num_historical_steps 3, the current one included");
        assert_eq!(p.reference_frame(), pmstate_deploy::context::ReferenceFrame::ClipRealigned);
        for field in ["observations", "history_steps", "future_steps", "reference_frame", "action", "anchor_body_index"]
        {
            assert!(
                c.fallbacks.iter().any(|f| f.field == field && f.release == "v3.0"),
                "{case} {field}: {:?}",
                c.fallbacks.iter().map(ToString::to_string).collect::<Vec<_>>()
            );
        }
        let names: Vec<&str> = p.inputs().iter().map(|i| i.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "current_dof_pos",
                "current_dof_vel",
                "current_rigid_body_ang_vel",
                "current_rigid_body_pos",
                "current_rigid_body_rot",
                "historical_dof_pos",
                "historical_dof_vel",
                "historical_root_ang_vel",
                "historical_root_rot",
                "mimic_future_ang_vel",
                "mimic_future_pos",
                "mimic_future_rot",
                "mimic_future_vel",
                "mimic_motion_length",
                "mimic_motion_time",
                "mimic_realign_offset",
            ],
            "{case}"
        );
        let yaml = c.to_yaml();
        assert!(yaml.contains("from_release_semantics:"), "{yaml}");
        assert_eq!(c.control.action_function, "build_pd_action_offset_scale");
        assert_eq!(c.control.action_transform, "clamp");
    }
}

/// Sixteen seeded rows through v3.0's own code (recorded): every
/// observation within the bounds below, the actions within the policy
/// crate's bound of the float64 forward (ours and torch's), the PD targets
/// of torch's actions to the bit.
#[test]
fn v30_pipeline_matches_the_releases_observations_and_targets() {
    for case in V30_CASES {
        let p = v30_pipeline(case);
        let dir = root().join(case);
        // the recording also holds the bodies' velocities, which v3.0's actor does not read
        let mut inputs = load(&dir.join("inputs_b16.safetensors"));
        inputs.retain(|k, _| p.inputs().iter().any(|i| &i.name == k));
        let obs = p.compute_observations(&inputs).expect("observations");
        let want = load(&dir.join("obs_b16.safetensors"));
        assert_eq!(want.len(), p.observations().len());
        for o in p.observations() {
            let (got, w) = (flat(&obs[&o.key]), flat(&want[&o.key]));
            let e = v30_compare(&p, &o.key, &got, &w, &format!("{case} b16"));
            eprintln!("{case} b16 {}: {e:e}", o.key);
        }
        check_b16_actions(case, &p, &inputs, &obs, &want, &dir);
    }
}

/// v3.0's joint encoding (`dof_to_obs`: sin and cos of each half angle,
/// `quaternion_to_matrix`, `matrix_to_quaternion`'s square roots and
/// division, `quat_to_tan_norm`): torch's vectorized sin/cos/sqrt are within
/// an ulp of libm's, not the same bits, and the chain carries that to a few
/// ulps of its unit-length outputs (measured: 4.8e-7 on b16 and the loops).
const V30_DOF_OBS_TOLERANCE: f32 = 1e-6;
/// The target poses are rotated into the root's heading frame
/// (`calc_heading_quat_inv`: atan2, sin, cos): an ulp of the heading
/// rotation, relative to max(1, |value|) (measured: 7.7e-7).
const V30_TARGET_POSE_TOLERANCE: f32 = 2e-6;

/// Compares one observation with v3.0's: bit for bit where the arithmetic
/// is elementwise (the joints' velocities, the root's angular velocity and
/// gravity of the reduced coords), within [`V30_DOF_OBS_TOLERANCE`] for the
/// joint encoding and [`V30_TARGET_POSE_TOLERANCE`] (relative) for the
/// target poses. Returns the largest difference.
fn v30_compare(p: &Pipeline, key: &str, got: &[f32], want: &[f32], at: &str) -> f32 {
    assert_eq!(got.len(), want.len(), "{at} {key}");
    if key == "mimic_target_poses" {
        let d = worst_rel(got, want);
        assert!(d <= V30_TARGET_POSE_TOLERANCE, "{at} {key}: {d:e}");
        return d;
    }
    // rows of 6 J (the joint encoding), D joint velocities, 3 + 3
    let nd = p.dims().num_dofs;
    let row = 6 * nd + nd + 6; // one hinge per body on both robots (checked by the widths)
    assert_eq!(got.len() % row, 0, "{at} {key}: width");
    let mut d = 0f32;
    for (g, w) in got.chunks(row).zip(want.chunks(row)) {
        d = d.max(worst(&g[..6 * nd], &w[..6 * nd]));
        assert_eq!(bits(&g[6 * nd..]), bits(&w[6 * nd..]), "{at} {key}: the elementwise part");
    }
    assert!(d <= V30_DOF_OBS_TOLERANCE, "{at} {key}: joint encoding {d:e}");
    d
}

/// The deploy loop over the recorded readings (every body's state, the
/// joints) against v3.0's HistoryBuffer, MimicObs target poses (the
/// reference realigned with the robot each step, the motion clock in
/// float32) and actor fed the same readings and references, step by step:
/// observations as in [`v30_compare`], each step's actions (ours and
/// torch's) within the policy crate's bound of the float64 forward of
/// their own observations, the PD targets the action function of ours to
/// the bit.
#[test]
fn v30_tracker_replays_the_releases_loop() {
    for case in V30_CASES {
        let dir = root().join(case);
        let pipeline = v30_pipeline(case);
        let clip_path = if dir.join("clip.motion").exists() {
            dir.join("clip.motion")
        } else {
            root().join("testdata/deploy/synthetic.motion")
        };
        let clip = MotionClip::load(clip_path).expect("clip");
        let player = MotionPlayer::new(&clip, pipeline.contract().dt).expect("player");
        let opts = TrackerOptions::reference(pipeline.contract());
        let mut t = Tracker::new(pipeline, player, opts).expect("tracker");
        let s = load(&dir.join("sensors.safetensors"));
        let f = |k: &str| flat(&s[k]);
        let (dp, dv, ar, av) = (f("dof_pos"), f("dof_vel"), f("anchor_rot"), f("root_local_ang_vel"));
        let (bp, br, bv, ba) = (f("body_pos"), f("body_rot"), f("body_vel"), f("body_ang_vel"));
        let steps = s["dof_pos"].dims()[0];
        assert_eq!(steps, 30);
        let nd = dp.len() / steps;
        let nb = bp.len() / steps / 3;
        let rec = load(&dir.join("replay.safetensors"));
        let (mut worst_action, mut worst_target, mut worst_obs) = (0f32, 0f32, 0f32);
        for k in 0..steps {
            let sensors = Sensors {
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
            };
            let pd = t.step(&sensors).expect("step").clone();
            let p = t.pipeline();
            let inputs: HashMap<String, Tensor> = p
                .inputs()
                .iter()
                .zip(t.last_inputs())
                .map(|(i, v)| {
                    let mut shape = vec![1];
                    shape.extend(&i.row_shape);
                    (i.name.clone(), Tensor::from_vec(v.clone(), shape, &candle_core::Device::Cpu).expect("tensor"))
                })
                .collect();
            let ours = p.compute_observations(&inputs).expect("observations");
            let mut theirs = HashMap::new();
            for o in p.observations() {
                let want = rec[&format!("obs.{}", o.key)].get(k).expect("row").unsqueeze(0).expect("row");
                let e = v30_compare(p, &o.key, &flat(&ours[&o.key]), &flat(&want), &format!("{case} step {k}"));
                worst_obs = worst_obs.max(e);
                theirs.insert(o.key.clone(), want);
            }
            for (obs, actions, who) in
                [(&ours, pd.actions.clone(), "ours"), (&theirs, flat(&rec["actions"].get(k).expect("row")), "torch's")]
            {
                let reference = p.policy().actor_reference(obs).expect("reference");
                let hit = pmstate_policy::bound::within(&actions, &reference, 1.0);
                assert!(hit.is_none(), "{case} step {k}: {who} actions outside the bound: {hit:?}");
            }
            let mut targets = vec![0f32; nd];
            p.action().targets(&pd.actions, &mut targets);
            assert_eq!(bits(&targets), bits(&pd.joint_pos_targets), "{case} step {k}: targets");
            worst_action = worst_action.max(worst(&pd.actions, &flat(&rec["actions"].get(k).expect("row"))));
            let want_targets = flat(&rec["joint_pos_targets"].get(k).expect("row"));
            worst_target = worst_target.max(worst(&pd.joint_pos_targets, &want_targets));
        }
        eprintln!(
            "{case} loop, {steps} steps: actions max |diff| {worst_action:e}, PD targets {worst_target:e}, \
             observations {worst_obs:e}"
        );
    }
}

/// v3.0's smpl tracker (testdata/policy/v30_tracker) reads max-coords
/// observations, not implemented for v3.0: refused naming the observation
/// and what is implemented.
#[test]
fn v30_max_coords_observations_are_refused_by_name() {
    let e = Pipeline::load(root().join("testdata/policy/v30_tracker/last.ckpt"), None).expect_err("max coords");
    let msg = e.to_string();
    assert!(msg.contains("env.humanoid_obs (max_coords_obs)"), "{msg}");
    assert!(msg.contains("supported: reduced_coords_obs, historical_reduced_coords_obs, mimic_target_poses"), "{msg}");
}

/// v3.0's tracker reads the root body's pose: a reading without the
/// bodies' state is an error naming them that changes nothing, and a reset
/// clears the realignment, the motion clock and the history, so the loop
/// after it is the loop from the start, to the bit.
#[test]
fn v30_tracker_needs_the_bodies_and_resets_to_the_start() {
    let dir = root().join(V30_CASES[0]);
    let pipeline = v30_pipeline(V30_CASES[0]);
    let clip = MotionClip::load(root().join("testdata/deploy/synthetic.motion")).expect("clip");
    let player = MotionPlayer::new(&clip, pipeline.contract().dt).expect("player");
    let opts = TrackerOptions::reference(pipeline.contract());
    let mut t = Tracker::new(pipeline, player, opts).expect("tracker");
    let s = load(&dir.join("sensors.safetensors"));
    let f = |k: &str| flat(&s[k]);
    let (dp, dv, ar, av) = (f("dof_pos"), f("dof_vel"), f("anchor_rot"), f("root_local_ang_vel"));
    let (bp, br, bv, ba) = (f("body_pos"), f("body_rot"), f("body_vel"), f("body_ang_vel"));
    let steps = s["dof_pos"].dims()[0];
    let (nd, nb) = (dp.len() / steps, bp.len() / steps / 3);
    let sensors = |k: usize, bodies: bool| Sensors {
        dof_pos: &dp[k * nd..(k + 1) * nd],
        dof_vel: &dv[k * nd..(k + 1) * nd],
        anchor_rot: [ar[4 * k], ar[4 * k + 1], ar[4 * k + 2], ar[4 * k + 3]],
        root_local_ang_vel: [av[3 * k], av[3 * k + 1], av[3 * k + 2]],
        anchor_pos: None,
        bodies: bodies.then(|| pmstate_deploy::BodyState {
            pos: &bp[k * nb * 3..(k + 1) * nb * 3],
            rot: &br[k * nb * 4..(k + 1) * nb * 4],
            vel: &bv[k * nb * 3..(k + 1) * nb * 3],
            ang_vel: &ba[k * nb * 3..(k + 1) * nb * 3],
            ground_height: 0.0,
        }),
        stamp: None,
    };
    let e = t.step(&sensors(0, false)).expect_err("no bodies");
    assert!(e.to_string().contains("bodies"), "{e}");
    let mut first = Vec::new();
    for k in 0..5 {
        first.push(t.step(&sensors(k, true)).expect("step").joint_pos_targets.clone());
    }
    t.reset();
    for (k, want) in first.iter().enumerate() {
        let got = t.step(&sensors(k, true)).expect("step").joint_pos_targets.clone();
        assert_eq!(bits(&got), bits(want), "step {k} after the reset");
    }
}
