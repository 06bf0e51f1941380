//! `pmstate deploy sim` end to end: with the `mujoco` feature, the closed
//! loop on the committed small robot against ProtoMotions' own MuJoCo loop
//! (testdata/deploy/sim, recorded by record_sim.py), its record, its
//! perturbations and its refusals; without it, the error that says how to
//! build one that runs it.

use std::path::PathBuf;
use std::process::{Command, Output};

fn pmstate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pmstate")).args(args).output().expect("run pmstate")
}

fn root(rel: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel).display().to_string()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The committed case's arguments, then `extra`.
fn sim_args(extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "deploy".into(),
        "sim".into(),
        root("testdata/policy/g1_amp_deploy/last.ckpt"),
        "--motion".into(),
        root("testdata/deploy/sim/clip.motion"),
        "--mjcf".into(),
        root("testdata/deploy/sim/robot.xml"),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn run(args: &[String]) -> Output {
    pmstate(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[cfg(not(feature = "mujoco"))]
#[test]
fn without_mujoco_the_command_says_how_to_build_it() {
    let out = run(&sim_args(&[]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--features mujoco"), "{}", text(&out));
    // options are still checked first
    let out = run(&sim_args(&["--drop", "1.5"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("drop_probability = 1.5"), "{}", text(&out));
}

#[cfg(feature = "mujoco")]
mod with_mujoco {
    use std::collections::HashMap;

    use candle_core::{DType, Device, Tensor};
    use serde_json::Value as J;

    use super::*;

    fn load(path: &str) -> HashMap<String, Tensor> {
        candle_core::safetensors::load(path, &Device::Cpu).expect("safetensors")
    }

    fn f64s(t: &Tensor) -> Vec<f64> {
        t.flatten_all().and_then(|t| t.to_vec1::<f64>()).expect("f64")
    }

    /// ProtoMotions' loop, through the CLI with the envelope off: the record
    /// holds MuJoCo's state and the targets, within the bound the library's
    /// parity test documents over its horizon.
    #[test]
    fn the_record_matches_protomotions_loop() {
        let dir = tempfile::tempdir().expect("tmp");
        let out_path = dir.path().join("sim.safetensors").display().to_string();
        let out = run(&sim_args(&["--envelope", "off", "--every", "0", "--out", &out_path]));
        assert!(out.status.success(), "{}", text(&out));
        let t = text(&out);
        assert!(t.contains("161 steps") && t.contains("joint error") && t.contains("fell: first down at step"), "{t}");
        let got = load(&out_path);
        let want = load(&root("testdata/deploy/sim/loop.safetensors"));
        for (name, dtype, cols) in
            [("qpos", DType::F64, 36), ("qvel", DType::F64, 35), ("joint_pos_targets", DType::F32, 29)]
        {
            assert_eq!(got[name].dtype(), dtype, "{name}");
            assert_eq!(got[name].dims(), &[161, cols], "{name}");
        }
        for name in ["events", "joint_error_max", "anchor_error", "body_error", "anchor_height", "tilt", "fallen"] {
            assert_eq!(got[name].dims(), &[161], "{name}");
        }
        let horizon = |t: &Tensor| f64s(&t.narrow(0, 0, 120).expect("rows").to_dtype(DType::F64).expect("f64"));
        for name in ["qpos", "joint_pos_targets"] {
            let worst =
                horizon(&got[name]).iter().zip(horizon(&want[name])).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(worst <= 1e-6, "{name}: {worst:e}");
        }
    }

    /// Perturbations change the run and are reported; the same seed gives
    /// the same run; --json prints step lines and the summary.
    #[test]
    fn perturbations_are_seeded_and_reported() {
        let noisy =
            ["--noise-joint-pos", "0.01", "--latency", "1", "--drop", "0.2", "--push-force", "40", "--seed", "5"];
        let json = |extra: &[&str]| {
            let mut a = vec!["--json".to_owned()];
            a.extend(sim_args(&[&["--every", "80"], extra].concat()));
            let out = run(&a);
            assert!(out.status.success(), "{}", text(&out));
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(|l| serde_json::from_str::<J>(l).expect("json line"))
                .collect::<Vec<J>>()
        };
        let clean = json(&[]);
        let a = json(&noisy);
        let b = json(&noisy);
        assert_eq!(clean.len(), 4, "steps 0, 80, 160 and the summary");
        assert_eq!(clean[0]["kind"], "step");
        let summary = |v: &[J]| v.last().cloned().expect("summary");
        let (c, sa, sb) = (summary(&clean), summary(&a), summary(&b));
        assert_eq!(c["kind"], "summary");
        assert_eq!(c["dropped_readings"], 0);
        let dropped = sa["dropped_readings"].as_u64().expect("count");
        assert!((10..60).contains(&dropped), "{sa}");
        for k in ["joint_error_mean", "anchor_error_max", "dropped_readings", "first_fall"] {
            assert_eq!(sa[k], sb[k], "{k}: the same seed, the same run");
        }
        assert_ne!(sa["joint_error_mean"], c["joint_error_mean"], "the perturbations changed nothing");
    }

    #[test]
    fn a_robot_that_is_not_the_trackers_is_refused_by_name() {
        let dir = tempfile::tempdir().expect("tmp");
        let small = dir.path().join("one_joint.xml");
        std::fs::write(
            &small,
            r#"<mujoco><worldbody><body name="pelvis" pos="0 0 1"><freejoint/><geom type="box" size=".1 .1 .1"/>
               <body name="leg"><joint name="hip" axis="0 1 0"/><geom type="capsule" size=".02" fromto="0 0 0 0 0 -.4"/></body>
               </body></worldbody><actuator><motor joint="hip"/></actuator></mujoco>"#,
        )
        .expect("write");
        let mut a = vec!["--json".to_owned()];
        a.extend(sim_args(&[]));
        let i = a.iter().position(|s| s == "--mjcf").expect("flag") + 1;
        a[i] = small.display().to_string();
        let out = run(&a);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        let err: J = serde_json::from_slice(&out.stderr).expect("json error");
        assert_eq!(err["kind"], "sim.mismatch", "{err}");
        assert!(err["message"].as_str().is_some_and(|m| m.contains("1 actuators") && m.contains("29")), "{err}");
        // not XML at all
        std::fs::write(&small, "<mujoco><worldbody></mujoco>").expect("write");
        let out = run(&a);
        let err: J = serde_json::from_slice(&out.stderr).expect("json error");
        assert_eq!(err["kind"], "sim.mjcf", "{err}");
        // no MJCF named, none found
        let out = Command::new(env!("CARGO_BIN_EXE_pmstate"))
            .args(["deploy", "sim", &root("testdata/policy/g1_amp_deploy/last.ckpt"), "--motion"])
            .arg(root("testdata/deploy/sim/clip.motion"))
            .env_remove("PMSTATE_PROTOMOTIONS")
            .output()
            .expect("run pmstate");
        assert_eq!(out.status.code(), Some(2));
        assert!(text(&out).contains("mjcf/g1_holo_compat.xml") && text(&out).contains("--mjcf"), "{}", text(&out));
    }
}
