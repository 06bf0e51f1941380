//! ProtoMotions v2.3 checkpoints (a Hydra `config.yaml` beside `last.ckpt`;
//! testdata/policy/v23_*, recorded by record_v23.py from v2.3's own code)
//! through the CLI: `config`, `policy describe`, `policy run` (`serve`:
//! releases_trackers_cli.rs), the config found where v2.3's eval finds it.
#![cfg(unix)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Output};

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

fn pmstate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pmstate")).args(args).output().expect("run pmstate")
}

fn data(rel: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy").join(rel).display().to_string()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn load(path: &str) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(path, &Device::Cpu).unwrap()
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    let d = a.to_dtype(DType::F32).unwrap().sub(&b.to_dtype(DType::F32).unwrap()).unwrap();
    d.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
}

#[test]
fn config_resolves_the_v23_model_subtree() {
    let cfg = data("v23_tracker/config.yaml");
    // `${robot.number_of_actions}`, resolved
    let out = pmstate(&["config", &cfg, "--get", "agent.config.model.config.actor.num_out"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "69");
    // `${eval:...}` of the published file at the recorded (shrunk) steps: 3 x 433
    let key = "agent.config.model.config.critic.config.input_models.mimic_target_poses.num_in";
    let out = pmstate(&["config", &cfg, "--get", key]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1299");
}

#[test]
fn describe_and_run_read_v23_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    for (variant, keys) in [
        ("v23_tracker", &["mean_action", "value"][..]),
        ("v23_masked_mimic", &["mean_action", "latent_mu", "latent_logvar"][..]),
    ] {
        let ckpt = data(&format!("{variant}/last.ckpt"));
        let out = pmstate(&["--json", "policy", "describe", &ckpt]);
        assert!(out.status.success(), "{variant}: {}", text(&out));
        let d: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap()).unwrap();
        assert!(d.to_string().contains("\"release\":\"v2.3\""), "{variant}: {d}");

        // the recorded observations hold MaskedMimic's encoder inputs too: accepted, not read
        let out_file = tmp.path().join(format!("{variant}.safetensors")).display().to_string();
        let o = pmstate(&[
            "policy",
            "run",
            &ckpt,
            "--obs",
            &data(&format!("{variant}/obs.safetensors")),
            "--out",
            &out_file,
        ]);
        assert!(o.status.success(), "{variant}: {}", text(&o));
        let got = load(&out_file);
        let want = load(&data(&format!("{variant}/expected.safetensors")));
        for k in keys {
            let d = max_abs_diff(&got[*k], &want[*k]);
            assert!(d <= 5e-6, "{variant} {k}: {d}");
        }
    }
}

#[test]
fn a_v23_config_missing_a_key_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let text_in = std::fs::read_to_string(data("v23_tracker/config.yaml")).unwrap();
    // the robot's action count removed: every `${robot.number_of_actions}` dangles
    let cut: String = text_in
        .lines()
        .filter(|l| !l.trim_start().starts_with("number_of_actions:"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(cut, text_in);
    std::fs::write(tmp.path().join("config.yaml"), cut).unwrap();
    std::fs::copy(data("v23_tracker/last.ckpt"), tmp.path().join("last.ckpt")).unwrap();
    let ckpt = tmp.path().join("last.ckpt").display().to_string();
    let out = pmstate(&["--json", "policy", "describe", &ckpt]);
    // a config error, as for every configs file
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let e: Value = serde_json::from_str(String::from_utf8_lossy(&out.stderr).lines().last().unwrap()).unwrap();
    assert_eq!(e["kind"], "hydra.not_found", "{e}");
    assert!(e["message"].as_str().unwrap().contains("robot.number_of_actions"), "{e}");
}

#[test]
fn deploy_refuses_a_v23_checkpoint_naming_why() {
    let out = pmstate(&["--json", "deploy", "contract", &data("v23_tracker/last.ckpt")]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let e: Value = serde_json::from_str(String::from_utf8_lossy(&out.stderr).lines().last().unwrap()).unwrap();
    assert!(e["message"].as_str().unwrap().contains("v2.3 Hydra config"), "{e}");
}
