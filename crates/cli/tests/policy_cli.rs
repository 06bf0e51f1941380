//! `pmstate config`, `pmstate policy describe|run` end to end on the
//! recorded ProtoMotions policies (testdata/policy).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Output};

use candle_core::{Device, Tensor};
use pmstate_policy::bound::within;
use pmstate_policy::Policy;
use serde_json::Value as J;

const VARIANTS: [&str; 7] = [
    "smpl_tracker",
    "g1_amp_deploy",
    "layernorm_activations",
    "welford_clamps",
    "container_obsprocessor",
    "module_ops_ppo",
    "module_ops_amp",
];

fn pmstate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pmstate")).args(args).output().expect("run pmstate")
}

fn data(rel: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy").join(rel).display().to_string()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn manifest() -> J {
    serde_json::from_str(&std::fs::read_to_string(data("manifest.json")).unwrap()).unwrap()
}

/// Config path of a module from its state-dict path (`_actor.mu.models.0` -> `agent.model.actor.mu_model.models.0`).
fn config_path(module: &str) -> String {
    for (from, to) in [
        ("_actor.mu", "actor.mu_model"),
        ("_critic", "critic"),
        ("_discriminator", "discriminator"),
        ("_disc_critic", "disc_critic"),
    ] {
        if let Some(rest) = module.strip_prefix(from) {
            return format!("agent.model.{to}{rest}");
        }
    }
    panic!("module {module}")
}

#[test]
fn config_get_returns_the_recorded_normalizer_settings() {
    let mut checked = 0;
    for v in manifest()["variants"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        let cfg = data(&format!("{name}/resolved_configs.pt"));
        for m in v["modules"].as_array().unwrap() {
            if m.get("normalize_obs").is_none() {
                continue;
            }
            let path = config_path(m["path"].as_str().unwrap());
            for field in ["norm_clamp_value", "norm_ema_decay", "normalize_obs"] {
                let out = pmstate(&["config", "--get", &format!("{path}.{field}"), &cfg]);
                assert!(out.status.success(), "{}", text(&out));
                let got = String::from_utf8_lossy(&out.stdout).trim().to_owned();
                // the recorded value as JSON keeps int/float apart: 5 vs 5.0
                let want = match (&m[field], m.get("norm_clamp_value_type").and_then(J::as_str)) {
                    (J::Number(n), Some("float")) if field == "norm_clamp_value" => {
                        format!("{:?}", n.as_f64().unwrap())
                    }
                    (other, _) => other.to_string(),
                };
                assert_eq!(got, want, "{name}: {path}.{field}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 40, "{checked}");
    // the example, and the float clamp of g1's critic
    let out = pmstate(&[
        "config",
        "--get",
        "agent.model.actor.mu_model.norm_clamp_value",
        &data("smpl_tracker/resolved_configs.pt"),
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "5\n");
    let out = pmstate(&[
        "config",
        "--get",
        "agent.model.critic.norm_clamp_value",
        &data("g1_amp_deploy/resolved_configs.pt"),
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "5.0\n");
}

#[test]
fn config_json_tree_names_classes_and_enum_values() {
    let out = pmstate(&["config", "--json", &data("smpl_tracker/resolved_configs_inference.pt")]);
    assert!(out.status.success(), "{}", text(&out));
    let j: J = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["agent"]["__class__"], "protomotions.agents.ppo.config.PPOAgentConfig");
    assert_eq!(j["agent"]["model"]["actor"]["mu_model"]["layers"][0]["units"], 16);
    let mode = &j["motion_lib"]["motion_file_switch_mode"];
    assert_eq!(mode["__class__"], "protomotions.components.motion_lib.MotionFileSwitchMode");
    assert!(mode.get("__value__").is_some(), "{mode}");
    let t = &j["robot"]["default_dof_pos"]["__tensor__"];
    assert_eq!(t["dtype"], "float32");
    assert_eq!(t["shape"], serde_json::json!([69]));
    assert!(t.get("values").is_none(), "69 elements: more than SMALL_TENSOR, no values");
    let missing = pmstate(&["config", "--get", "agent.model.nope", &data("smpl_tracker/resolved_configs.pt")]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(text(&missing).contains("no key agent.model.nope"), "{}", text(&missing));
}

fn load(p: &str) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(p, &Device::Cpu).unwrap()
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

#[test]
fn policy_run_matches_torch_on_every_variant() {
    let tmp = tempfile::tempdir().unwrap();
    for v in VARIANTS {
        let ckpt = data(&format!("{v}/last.ckpt"));
        let obs_path = data(&format!("{v}/obs.safetensors"));
        let out_path = tmp.path().join(format!("{v}.safetensors")).display().to_string();
        let policy = Policy::load(&ckpt, None, &Device::Cpu).unwrap();
        let mut args = vec!["policy", "run", &ckpt, "--obs", &obs_path, "--out", &out_path];
        if policy.amp().is_some() {
            args.push("--discriminator");
        }
        let out = pmstate(&args);
        assert!(out.status.success(), "{v}: {}", text(&out));
        let got = load(&out_path);
        let exp = load(&data(&format!("{v}/expected.safetensors")));
        let obs = load(&obs_path);
        let r = policy.reference(&obs).unwrap();
        let mut keys =
            vec![("mean_action", policy.actor().mu_key.clone()), ("value", policy.critic().out_key().to_owned())];
        if let Some(a) = policy.amp() {
            keys.push(("disc_logits", a.discriminator.out_key().to_owned()));
            keys.push(("disc_value", a.disc_critic.out_key().to_owned()));
        }
        for (name, key) in keys {
            assert_eq!(got[name].dims(), exp[name].dims(), "{v}: {name}");
            // |ours - torch| <= |ours - ref| + |torch - ref| <= 2 bound
            let (g, e) = (flat(&got[name]), flat(&exp[name]));
            for (i, ((a, b), bound)) in g.iter().zip(&e).zip(&r.values[&key].bound).enumerate() {
                assert!(((a - b).abs() as f64) <= 2.0 * bound, "{v}: {name}[{i}] {a} vs torch {b}, bound {bound:e}");
            }
            assert!(within(&flat(&got[name]), &r.values[&key], 1.0).is_none(), "{v}: {name}");
        }
        assert_eq!(got["norm_obs"].dims(), exp["norm_obs"].dims(), "{v}");
        assert_eq!(got["std"].dims(), exp["std"].dims(), "{v}");
        assert!(!got.contains_key("action"), "{v}: deterministic unless --sample");
    }
}

#[test]
fn policy_run_samples_reproducibly() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = data("layernorm_activations/last.ckpt");
    let obs = data("layernorm_activations/obs.safetensors");
    let a = tmp.path().join("a.safetensors").display().to_string();
    let b = tmp.path().join("b.safetensors").display().to_string();
    for p in [&a, &b] {
        let out = pmstate(&["policy", "run", &ckpt, "--obs", &obs, "--out", p, "--sample", "--seed", "7"]);
        assert!(out.status.success(), "{}", text(&out));
    }
    let (a, b) = (load(&a), load(&b));
    assert_eq!(flat(&a["action"]), flat(&b["action"]));
    assert_eq!(a["neglogp"].dims(), [8]);
    assert_ne!(flat(&a["action"]), flat(&a["mean_action"]));
}

#[test]
fn bad_observations_exit_2_naming_the_key_and_width() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = data("container_obsprocessor/last.ckpt");
    let obs = load(&data("container_obsprocessor/obs.safetensors"));
    let run = |m: &HashMap<String, Tensor>| {
        let p = tmp.path().join("obs.safetensors");
        candle_core::safetensors::save(m, &p).unwrap();
        let o = tmp.path().join("out.safetensors").display().to_string();
        pmstate(&["policy", "run", &ckpt, "--obs", &p.display().to_string(), "--out", &o])
    };
    let mut missing = obs.clone();
    missing.remove("obs_b");
    let out = run(&missing);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("missing observation obs_b (width 3)"), "{}", text(&out));

    let mut extra = obs.clone();
    extra.insert("obs_z".into(), Tensor::zeros((8, 2), candle_core::DType::F32, &Device::Cpu).unwrap());
    let out = run(&extra);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("unexpected observation obs_z"), "{}", text(&out));

    let mut wide = obs.clone();
    wide.insert("obs_c".into(), Tensor::zeros((8, 6), candle_core::DType::F32, &Device::Cpu).unwrap());
    let out = run(&wide);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("observation obs_c: width 6, expected 5"), "{}", text(&out));

    // smpl: only the sum of the widths is fixed by the checkpoint
    let ckpt = data("smpl_tracker/last.ckpt");
    let mut obs = load(&data("smpl_tracker/obs.safetensors"));
    obs.insert("previous_actions".into(), Tensor::zeros((8, 70), candle_core::DType::F32, &Device::Cpu).unwrap());
    let p = tmp.path().join("obs2.safetensors");
    candle_core::safetensors::save(&obs, &p).unwrap();
    let o = tmp.path().join("out.safetensors").display().to_string();
    let out = pmstate(&["policy", "run", &ckpt, "--obs", &p.display().to_string(), "--out", &o]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains(
            "max_coords_obs 358 + mimic_target_poses 576 + previous_actions 70 = 1004 columns, expected 1003"
        ),
        "{}",
        text(&out)
    );
}

#[test]
fn describe_reports_keys_layers_and_normalizers() {
    let out = pmstate(&[
        "policy",
        "describe",
        "--json",
        &data("welford_clamps/inference_last.ckpt"),
        "--config",
        &data("welford_clamps/resolved_configs.pt"),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let j: J = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["action_size"], 5);
    assert_eq!(j["in_keys"][0]["key"], "obs_a");
    let actor = &j["networks"][0]["modules"][0];
    assert_eq!(actor["layers"], serde_json::json!(["13->16 relu", "16->16 relu", "16->5"]));
    assert_eq!(actor["normalizer"]["clamp"], 2.5);
    assert_eq!(actor["normalizer"]["ema"], false);
    assert!(actor["normalizer"]["count"].as_i64().unwrap() > 1000);
    let critic = &j["networks"][1]["modules"][0];
    assert_eq!(critic["normalizer"]["clamp"], J::Null);
    let out = pmstate(&["policy", "describe", &data("smpl_tracker/last.ckpt")]);
    let t = text(&out);
    assert!(t.contains("clamp 5, EMA 0.999"), "{t}");
    assert!(t.contains("width sum: max_coords_obs + mimic_target_poses + previous_actions = 1003"), "{t}");
}
