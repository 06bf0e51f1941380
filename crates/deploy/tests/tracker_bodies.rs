//! The tracker on a max-coords pipeline (the soma tracker reads every
//! body's state, the reference's future bodies, and its raw past actions):
//! each input is sourced from where the contract says, the history is fed
//! back from `actions` (not the PD targets), and the step refuses to run
//! without the body state it needs. ProtoMotions' own deployment loop cannot
//! run this shape (its input assembler has no body-state inputs), so the
//! wiring is checked against the pipeline and the alignment directly.

use std::path::{Path, PathBuf};

use pmstate_deploy::motion::MotionArrays;
use pmstate_deploy::{
    BodyState, DeployError, MotionClip, MotionPlayer, Pipeline, SensorProblem, Sensors, Tracker, TrackerOptions,
};

fn soma() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy/soma_tracker/last.ckpt")
}

/// A smooth clip of the robot's size (20 frames at 30 fps).
fn clip(nd: usize, nb: usize) -> MotionClip {
    let frames = 20;
    let wave = |n: usize, scale: f32| -> Vec<f32> {
        (0..frames * n).map(|i| scale * ((i % n) as f32 * 0.37 + (i / n) as f32 * 0.11).sin()).collect()
    };
    let mut rot = Vec::with_capacity(frames * nb * 4);
    for f in 0..frames {
        for b in 0..nb {
            let half = 0.05 * f as f32 + 0.1 * b as f32;
            rot.extend([0.0, 0.0, half.sin(), half.cos()]);
        }
    }
    MotionClip {
        fps: 30.0,
        frames,
        num_dofs: nd,
        num_bodies: nb,
        arrays: MotionArrays {
            dof_pos: wave(nd, 0.5),
            dof_vel: wave(nd, 1.0),
            body_pos: wave(nb * 3, 0.8),
            body_rot: rot,
            body_vel: wave(nb * 3, 1.2),
            body_ang_vel: wave(nb * 3, 0.9),
        },
    }
}

#[test]
fn max_coords_inputs_come_from_the_body_state_and_raw_actions() {
    let p = Pipeline::load(soma(), None).expect("load");
    let (nd, nb) = (p.dims().num_dofs, p.dims().num_bodies);
    let names: Vec<String> = p.inputs().iter().map(|i| i.name.clone()).collect();
    let player = MotionPlayer::new(&clip(nd, nb), p.contract().dt).expect("player");
    let opts = TrackerOptions::reference(p.contract());
    let mut t = Tracker::new(p, player.clone(), opts).expect("tracker");
    let (dof_pos, dof_vel) = (vec![0.1f32; nd], vec![-0.2f32; nd]);
    let f0 = player.frame(0);
    let bodies = BodyState {
        pos: f0.body_pos,
        rot: f0.body_rot,
        vel: f0.body_vel,
        ang_vel: f0.body_ang_vel,
        ground_height: 0.25,
    };
    let mut s = Sensors {
        dof_pos: &dof_pos,
        dof_vel: &dof_vel,
        anchor_rot: [0.0, 0.0, 0.3f32.sin(), 0.3f32.cos()],
        root_local_ang_vel: [0.1, 0.2, 0.3],
        anchor_pos: Some([1.0, 2.0, 0.9]),
        bodies: None,
        stamp: None,
    };
    match t.step(&s) {
        Err(DeployError::Sensor { name: "bodies", problem: SensorProblem::Missing }) => {}
        other => panic!("expected the missing body state to be refused, got {other:?}"),
    }
    let short = BodyState { pos: &f0.body_pos[3..], ..bodies };
    s.bodies = Some(short);
    match t.step(&s) {
        Err(DeployError::Sensor { name: "bodies.pos", problem: SensorProblem::Length { got, expected } }) => {
            assert_eq!((got, expected), (nb * 3 - 3, nb * 3))
        }
        other => panic!("expected a short body array to be refused, got {other:?}"),
    }
    s.bodies = Some(bodies);
    let first = t.step(&s).expect("step").clone();
    let input = |t: &Tracker, name: &str| t.last_inputs()[names.iter().position(|n| n == name).expect(name)].clone();
    assert_eq!(input(&t, "current_rigid_body_pos"), f0.body_pos);
    assert_eq!(input(&t, "current_rigid_body_rot"), f0.body_rot);
    assert_eq!(input(&t, "ground_heights"), vec![0.25]);
    assert_eq!(input(&t, "historical_actions"), vec![0.0; nd], "the history starts at zero");
    // the future bodies: the clip's next frame, aligned to the robot
    let a = *t.alignment().expect("aligned at the first step");
    let f1 = player.frame(1);
    let want_rot: Vec<f32> = f1.body_rot.chunks(4).flat_map(|q| a.rot([q[0], q[1], q[2], q[3]])).collect();
    let want_pos: Vec<f32> = f1.body_pos.chunks(3).flat_map(|v| a.pos([v[0], v[1], v[2]])).collect();
    assert_eq!(input(&t, "mimic_future_rot"), want_rot);
    assert_eq!(input(&t, "mimic_future_pos"), want_pos);
    // a heading offset is really applied (the robot faces 0.6 rad away from the clip)
    assert_ne!(want_rot, f1.body_rot.to_vec());
    t.step(&s).expect("second step");
    assert_eq!(input(&t, "historical_actions"), first.actions, "fed back from the raw actions");
    assert_ne!(first.actions, first.joint_pos_targets);
}
