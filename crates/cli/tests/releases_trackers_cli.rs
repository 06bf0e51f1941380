//! The PPO motion trackers of ProtoMotions v3.0 and v3.1
//! (testdata/policy/v30_tracker, v31_tracker, recorded by record_releases.py
//! from each release's own classes) through the CLI: `config`, `policy
//! describe`, `policy run` (within float32 rounding of the release's own
//! forward) and `serve` (the same bits as `policy run`, v2.3's tracker too),
//! as today's trackers.
#![cfg(unix)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use candle_core::{Device, Tensor};
use pmstate_serve::client::Client;
use serde_json::{json, Value};

const RELEASES: [(&str, &str); 2] = [("v30_tracker", "v3.0"), ("v31_tracker", "v3.1")];

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

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

#[test]
fn config_describe_and_run_read_the_releases_trackers() {
    let tmp = tempfile::tempdir().unwrap();
    for (dir, release) in RELEASES {
        let cfg = data(&format!("{dir}/resolved_configs.pt"));
        let out = pmstate(&["config", &cfg, "--get", "agent.model._target_"]);
        assert!(out.status.success(), "{release}: {}", text(&out));
        assert!(String::from_utf8_lossy(&out.stdout).contains("protomotions.agents.ppo.model.PPOModel"), "{release}");

        let ckpt = data(&format!("{dir}/last.ckpt"));
        let out = pmstate(&["--json", "policy", "describe", &ckpt]);
        assert!(out.status.success(), "{release}: {}", text(&out));
        let d: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap()).unwrap();
        assert_eq!(d["action_size"], 69, "{release}: {d}");

        let out_file = tmp.path().join(format!("{dir}.safetensors")).display().to_string();
        let o =
            pmstate(&["policy", "run", &ckpt, "--obs", &data(&format!("{dir}/obs.safetensors")), "--out", &out_file]);
        assert!(o.status.success(), "{release}: {}", text(&o));
        let (got, want) = (load(&out_file), load(&data(&format!("{dir}/expected.safetensors"))));
        for k in ["mean_action", "value"] {
            let d = flat(&got[k]).iter().zip(flat(&want[k])).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(d <= 1e-5, "{release} {k}: {d}");
        }
    }
}

/// `serve` on every release's tracker (v2.3's from its Hydra config.yaml):
/// the metadata has the recorded observations' widths, and the answer is
/// `policy run`'s, bit for bit.
#[tokio::test(flavor = "current_thread")]
async fn serve_answers_the_releases_trackers_like_policy_run() {
    let tmp = tempfile::tempdir().unwrap();
    for (dir, release) in [("v23_tracker", "v2.3")].into_iter().chain(RELEASES) {
        let ckpt = data(&format!("{dir}/last.ckpt"));
        let obs_path = data(&format!("{dir}/obs.safetensors"));
        let out_file = tmp.path().join(format!("{dir}.safetensors")).display().to_string();
        let o = pmstate(&["policy", "run", &ckpt, "--obs", &obs_path, "--out", &out_file]);
        assert!(o.status.success(), "{release}: {}", text(&o));
        let want: Vec<u32> = flat(&load(&out_file)["mean_action"]).iter().map(|v| v.to_bits()).collect();

        let mut child = Command::new(env!("CARGO_BIN_EXE_pmstate"))
            .args(["--json", "serve", "--addr", "127.0.0.1:0", "--name", "old", &ckpt])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        assert_eq!(first["event"], "listening", "{release}: {first}");
        let c = Client::new(first["addr"].as_str().unwrap().parse().unwrap()).with_timeout(Duration::from_secs(120));
        let obs = load(&obs_path);
        let meta = c.get("/v2/models/old").await.unwrap().json();
        // a width the checkpoint leaves open (a split of a sum the configs
        // cannot size: v3.0, and the recorder's own widths) is -1
        for input in meta["inputs"].as_array().unwrap() {
            let t = &obs[input["name"].as_str().unwrap()];
            let open = release != "v2.3" && input["shape"] == json!([-1, -1]);
            assert!(open || input["shape"] == json!([-1, t.dims()[1]]), "{release}: {meta}");
        }
        let mut keys: Vec<&String> = obs.keys().collect();
        keys.sort();
        let inputs: Vec<Value> = keys
            .iter()
            .map(|k| json!({"name": k, "shape": obs[*k].dims(), "datatype": "FP32", "data": flat(&obs[*k])}))
            .collect();
        let body = serde_json::to_vec(&json!({"inputs": inputs, "outputs": [{"name": "mean_action"}]})).unwrap();
        let r = c.post("/v2/models/old/infer", body, &[]).await.unwrap();
        assert_eq!(r.status, 200, "{release}: {}", String::from_utf8_lossy(&r.body));
        let got: Vec<u32> = r.json()["outputs"][0]["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| (v.as_f64().unwrap() as f32).to_bits())
            .collect();
        assert_eq!(got, want, "{release}");
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The G1 tracker of v3.1 (testdata/deploy/v31_g1_tracker, recorded by
/// record_releases_deploy.py from v3.1's own classes, observation widths as
/// published): `policy describe` sizes every observation from the configs
/// and `policy run` on the actor's keys alone gives v3.1's own actions.
#[test]
fn the_v31_g1_tracker_runs_on_its_actor_keys() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/deploy/v31_g1_tracker");
    let ckpt = dir.join("last.ckpt").display().to_string();
    let out = pmstate(&["--json", "policy", "describe", &ckpt]);
    assert!(out.status.success(), "{}", text(&out));
    let d: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap()).unwrap();
    let widths: HashMap<String, u64> = d["in_keys"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|k| Some((k["key"].as_str()?.to_owned(), k["width"].as_u64()?)))
        .collect();
    let obs_path = dir.join("obs_b16.safetensors").display().to_string();
    let obs = load(&obs_path);
    for (k, t) in &obs {
        assert_eq!(widths.get(k), Some(&(t.dims()[1] as u64)), "{k}: {d}");
    }
    let tmp = tempfile::tempdir().unwrap();
    let out_file = tmp.path().join("g1.safetensors").display().to_string();
    let o = pmstate(&["policy", "run", &ckpt, "--obs", &obs_path, "--out", &out_file]);
    assert!(o.status.success(), "{}", text(&o));
    let got = flat(&load(&out_file)["mean_action"]);
    let torch = flat(&load(&dir.join("torch_b16.safetensors").display().to_string())["actions"]);
    let d = got.iter().zip(&torch).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(d <= 1e-5, "{d}");
}
