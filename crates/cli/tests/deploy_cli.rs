//! `pmstate deploy contract|run` end to end on the g1 tracker and the
//! pipeline ProtoMotions' exporter made from it (testdata/deploy).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Output};

use candle_core::{Device, Tensor};
use pmstate_deploy::Pipeline;
use serde_json::Value as J;

#[path = "../../deploy/tests/common/configs.rs"]
mod configs;

fn pmstate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pmstate")).args(args).output().expect("run pmstate")
}

fn root(rel: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel).display().to_string()
}

fn ckpt() -> String {
    root("testdata/policy/g1_amp_deploy/last.ckpt")
}

fn recorded(name: &str) -> String {
    root(&format!("testdata/deploy/g1_amp_deploy/{name}"))
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

/// The YAML printed is the library's contract; `--json` has the same
/// inputs, each with the shape the recorded inputs have at batch 1.
#[test]
fn contract_prints_the_pipelines_contract_as_yaml_and_json() {
    let p = Pipeline::load(ckpt(), None).expect("load");
    let out = pmstate(&["deploy", "contract", &ckpt()]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), p.contract().to_yaml());
    let out = pmstate(&["--json", "deploy", "contract", &ckpt()]);
    assert!(out.status.success(), "{}", text(&out));
    let j: J = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let inputs = load(&recorded("inputs_b1.safetensors"));
    let listed = j["policy_inputs"].as_array().expect("policy_inputs");
    assert_eq!(listed.len(), inputs.len());
    for e in listed {
        let name = e["name"].as_str().expect("name");
        let shape: Vec<usize> =
            e["shape"].as_array().expect("shape").iter().map(|d| d.as_u64().expect("dim") as usize).collect();
        assert_eq!(inputs[name].dims(), &shape[..], "{name}");
    }
    assert_eq!(j["type"], "unified_pipeline");
}

/// `deploy run` writes the four outputs of the library's forward, bit for
/// bit, and they are the recorded onnxruntime outputs within 1e-6; run
/// 5 rows at a time (16 rows as 5 + 5 + 5 + 1), the same bits.
/// Configs whose observation layout the actor does not read (one future
/// step more than it was trained on): `deploy contract` refuses them with
/// exit 2, naming the configs file and both widths, in text and in JSON.
#[test]
fn contract_refuses_configs_the_actor_does_not_read_naming_both_widths() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (edited, observations, actor) = configs::g1_with_one_future_step_more(dir.path());
    let edited = edited.display().to_string();
    let configs = dir.path().join("resolved_configs_inference.pt").display().to_string();
    for args in [
        vec!["deploy", "contract", &edited],
        vec!["deploy", "contract", "--config", &configs, &edited],
        vec!["--json", "deploy", "contract", &edited],
    ] {
        let out = pmstate(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("with {actor} values")), "{args:?}: {err}");
        assert!(err.contains(&format!("give {observations}")), "{args:?}: {err}");
        assert!(err.contains("resolved_configs_inference.pt"), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}: a contract was printed");
    }
}

#[test]
fn run_writes_the_pipeline_outputs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = Pipeline::load(ckpt(), None).expect("load");
    let want = p.forward(&load(&recorded("inputs_b16.safetensors"))).expect("forward");
    let ort = load(&recorded("ort_b16.safetensors"));
    for chunk in ["1024", "5"] {
        let out_path = dir.path().join(format!("out_{chunk}.safetensors")).display().to_string();
        let inputs = recorded("inputs_b16.safetensors");
        let out = pmstate(&["deploy", "run", &ckpt(), "--inputs", &inputs, "--out", &out_path, "--chunk-rows", chunk]);
        assert!(out.status.success(), "{}", text(&out));
        assert!(text(&out).contains("joint_pos_targets [16, 29]"), "{}", text(&out));
        check_outputs(&load(&out_path), &want, &ort);
    }
}

/// `got` holds `want`'s outputs bit for bit, within 1e-6 of onnxruntime's.
fn check_outputs(got: &HashMap<String, Tensor>, want: &pmstate_deploy::Outputs, ort: &HashMap<String, Tensor>) {
    for (name, t) in want.named() {
        assert_eq!(flat(&got[name]), flat(t), "{name}");
        for (a, b) in flat(&got[name]).iter().zip(flat(&ort[name])) {
            assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{name}: {a} vs onnxruntime {b}");
        }
    }
}

/// Wrong files are refused naming the input and what the pipeline takes;
/// nothing is written.
#[test]
fn run_refuses_inputs_the_pipeline_does_not_take() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out_path = dir.path().join("out.safetensors");
    let o = out_path.display().to_string();
    // the observations file instead of the inputs
    let out = pmstate(&["deploy", "run", &ckpt(), "--inputs", &recorded("obs_b1.safetensors"), "--out", &o]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("is not one the pipeline takes: current_anchor_rot"), "{}", text(&out));
    // one input of the wrong shape
    let mut inputs = load(&recorded("inputs_b1.safetensors"));
    inputs.insert(
        "mimic_future_dof_pos".into(),
        Tensor::zeros((1, 3, 29), candle_core::DType::F32, &Device::Cpu).expect("zeros"),
    );
    let bad = dir.path().join("bad.safetensors");
    candle_core::safetensors::save(&inputs, &bad).expect("save");
    let out = pmstate(&["deploy", "run", &ckpt(), "--inputs", &bad.display().to_string(), "--out", &o]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("input mimic_future_dof_pos: expected float32 of shape [B, 4, 29], got f32 [1, 3, 29]"),
        "{}",
        text(&out)
    );
    // one input missing
    inputs.remove("mimic_future_dof_pos");
    candle_core::safetensors::save(&inputs, &bad).expect("save");
    let out = pmstate(&["deploy", "run", &ckpt(), "--inputs", &bad.display().to_string(), "--out", &o]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("input mimic_future_dof_pos is missing (shape [B, 4, 29])"), "{}", text(&out));
    assert!(!out_path.exists());
    // a policy whose observations no environment component computes
    let synthetic = root("testdata/policy/layernorm_activations/last.ckpt");
    let out = pmstate(&["deploy", "contract", &synthetic]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("the actor reads obs_a, which no entry of env.observation_components computes"),
        "{}",
        text(&out)
    );
}

/// `deploy replay` over the recorded sensor stream gives the PD targets of
/// ProtoMotions' deployment loop (within the closed loop's tolerance of
/// crates/deploy/tests/replay.rs), with the filter of the contract and with
/// `--action-ema-alpha 0.8`.
#[test]
fn replay_matches_the_recorded_deployment_loop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rec = load(&recorded("replay.safetensors"));
    for (alpha, key) in [(None, "torch.joint_pos_targets"), (Some("0.8"), "ema.torch.joint_pos_targets")] {
        let o = dir.path().join("replay.safetensors").display().to_string();
        let motion = root("testdata/deploy/synthetic.motion");
        let sensors = recorded("sensors.safetensors");
        let c = ckpt();
        // ProtoMotions' loop has no envelope: compared with it, the envelope is off
        let mut args =
            vec!["deploy", "replay", &c, "--motion", &motion, "--sensors", &sensors, "--out", &o, "--envelope", "off"];
        if let Some(a) = alpha {
            args.extend(["--action-ema-alpha", a]);
        }
        let out = pmstate(&args);
        assert!(out.status.success(), "{}", text(&out));
        let got = load(&o);
        assert_eq!(got["joint_pos_targets"].dims(), rec[key].dims());
        for (a, b) in flat(&got["joint_pos_targets"]).iter().zip(flat(&rec[key])) {
            assert!((a - b).abs() <= 2e-6, "{key}: {a} vs {b}");
        }
    }
    // a sensor missing, one of the wrong width
    let s = load(&recorded("sensors.safetensors"));
    let mut partial: HashMap<String, Tensor> = s.clone();
    partial.remove("anchor_rot");
    let bad = dir.path().join("bad.safetensors");
    candle_core::safetensors::save(&partial, &bad).expect("save");
    let motion = root("testdata/deploy/synthetic.motion");
    let o = dir.path().join("o.safetensors").display().to_string();
    let out = pmstate(&[
        "deploy",
        "replay",
        &ckpt(),
        "--motion",
        &motion,
        "--sensors",
        &bad.display().to_string(),
        "--out",
        &o,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--sensors: no anchor_rot"), "{}", text(&out));
    partial.insert("anchor_rot".into(), Tensor::zeros((161, 3), candle_core::DType::F32, &Device::Cpu).expect("zeros"));
    candle_core::safetensors::save(&partial, &bad).expect("save");
    let out = pmstate(&[
        "deploy",
        "replay",
        &ckpt(),
        "--motion",
        &motion,
        "--sensors",
        &bad.display().to_string(),
        "--out",
        &o,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--sensors: anchor_rot: expected float32 [T, 4], got f32 [161, 3]"), "{}", text(&out));
    // not a motion clip
    let out = pmstate(&[
        "deploy",
        "replay",
        &ckpt(),
        "--motion",
        &ckpt(),
        "--sensors",
        &recorded("sensors.safetensors"),
        "--out",
        &o,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("no fps (a .motion file holds"), "{}", text(&out));
}

/// `deploy replay --record` logs every step; `--from-log` steps the logged
/// readings again with the logged options and finds every output bit for
/// bit (a changed record is exit 1 naming it); the report counts the
/// envelope's work, and a stream of mismatched lengths is refused naming both.
#[test]
fn replay_records_a_flight_log_that_replays_bit_for_bit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let o = dir.path().join("o.safetensors").display().to_string();
    let log = dir.path().join("flight.pmlog").display().to_string();
    let motion = root("testdata/deploy/synthetic.motion");
    let sensors = recorded("sensors.safetensors");
    let c = ckpt();
    let out = pmstate(&[
        "deploy",
        "replay",
        &c,
        "--motion",
        &motion,
        "--sensors",
        &sensors,
        "--out",
        &o,
        "--soft-start",
        "0.3",
        "--max-tilt",
        "1.2",
        "--record",
        &log,
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let report: J = serde_json::from_slice(&out.stdout).expect("json");
    assert!(report["status"]["soft_start_steps"].as_u64().expect("count") > 0, "{report}");
    assert_eq!(report["status"]["steps"].as_u64(), Some(161));
    let got = load(&o);
    assert_eq!(got["events"].dims(), [161]);
    let replayed = pmstate(&["deploy", "replay", &c, "--motion", &motion, "--from-log", &log, "--json"]);
    assert!(replayed.status.success(), "{}", text(&replayed));
    let r: J = serde_json::from_slice(&replayed.stdout).expect("json");
    assert_eq!((r["identical"].as_bool(), r["steps"].as_u64()), (Some(true), Some(161)), "{r}");
    // one logged target changed: the replay says which record differs
    let mut bytes = std::fs::read(&log).expect("log");
    let n = bytes.len();
    bytes[n - 4 * 29 * 3 - 2] ^= 0x40;
    let tampered = dir.path().join("tampered.pmlog");
    std::fs::write(&tampered, bytes).expect("write");
    let t = tampered.display().to_string();
    let bad = pmstate(&["deploy", "replay", &c, "--motion", &motion, "--from-log", &t]);
    assert_eq!(bad.status.code(), Some(1), "{}", text(&bad));
    assert!(text(&bad).contains("record 160"), "{}", text(&bad));
    // a stream whose sensors disagree on the number of steps
    let mut s = load(&sensors);
    let short = s["anchor_rot"].narrow(0, 0, 160).expect("narrow");
    s.insert("anchor_rot".into(), short);
    let bad_stream = dir.path().join("short.safetensors");
    candle_core::safetensors::save(&s, &bad_stream).expect("save");
    let b = bad_stream.display().to_string();
    for cmd in [
        vec!["deploy", "replay", &c, "--motion", &motion, "--sensors", &b, "--out", &o],
        vec!["bench-deploy", &c, "--motion", &motion, "--sensors", &b, "--steps", "10"],
    ] {
        let out = pmstate(&cmd);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains("anchor_rot has 160 steps, dof_pos has 161"), "{}", text(&out));
    }
    // absurd --steps, a sensor of the wrong dtype: errors naming them
    let out = pmstate(&["bench-deploy", &c, "--motion", &motion, "--sensors", &sensors, "--steps", "99999999999999"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("steps are timed in one run"), "{}", text(&out));
    let mut s = load(&sensors);
    let f64_vel = s["dof_vel"].to_dtype(candle_core::DType::F64).expect("f64");
    s.insert("dof_vel".into(), f64_vel);
    candle_core::safetensors::save(&s, &bad_stream).expect("save");
    let out = pmstate(&["bench-deploy", &c, "--motion", &motion, "--sensors", &b, "--steps", "10"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("dof_vel: expected float32"), "{}", text(&out));
}
