//! `pmstate policy run|describe` and `pmstate serve` on the MaskedMimic
//! checkpoints of ProtoMotions v3.0 and v3.1 (testdata/policy/v30_masked_mimic,
//! v31_masked_mimic, recorded by record_releases.py from each release's own
//! classes): the same commands as on today's MaskedMimic, through the
//! registry's `Model`; the answers are the library's, bit for bit, and the
//! recorded torch action within float32 rounding.
#![cfg(unix)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use candle_core::{Device, Tensor};
use pmstate_serve::client::Client;
use serde_json::{json, Value};

const DIRS: [(&str, &str); 2] = [("v30_masked_mimic", "v3.0"), ("v31_masked_mimic", "v3.1")];
const CLASS: &str = "protomotions.agents.masked_mimic.model.MaskedMimicModel";
/// How long any one step may take before the test calls it a hang.
const WATCHDOG: Duration = Duration::from_secs(120);

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy").join(rel)
}

fn pmstate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pmstate")).args(args).output().expect("run pmstate")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn load(path: &PathBuf) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(path, &Device::Cpu).unwrap()
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

#[test]
fn policy_run_and_describe_read_both_release_layouts() {
    let tmp = tempfile::tempdir().unwrap();
    for (dir, release) in DIRS {
        let ckpt = data(&format!("{dir}/last.ckpt"));
        let obs_path = data(&format!("{dir}/obs.safetensors"));
        let lib = pmstate_policy::releases::masked_mimic::load(&ckpt, None, &Device::Cpu).unwrap();
        let mut obs = load(&obs_path);
        let want = load(&data(&format!("{dir}/expected.safetensors")));

        // with the recorded vae_noise: the library's outputs, bit for bit
        let out_path = tmp.path().join(format!("{dir}.safetensors"));
        let out = pmstate(&[
            "policy",
            "run",
            ckpt.to_str().unwrap(),
            "--obs",
            obs_path.to_str().unwrap(),
            "--out",
            out_path.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{dir}: {}", text(&out));
        let got = load(&out_path);
        let mut names: Vec<&String> = got.keys().collect();
        names.sort();
        assert_eq!(names, ["latent", "latent_logvar", "latent_mu", "mean_action"], "{dir}");
        let f = lib.forward(&obs).unwrap();
        for (k, t) in [
            ("mean_action", &f.mean_action),
            ("latent_mu", &f.latent_mu),
            ("latent_logvar", &f.latent_logvar),
            ("latent", &f.latent),
        ] {
            assert_eq!(flat(&got[k]), flat(t), "{dir} {k}");
        }
        // ... and torch's recorded action, within float32 rounding
        let worst =
            flat(&got["mean_action"]).iter().zip(flat(&want["action"])).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(worst < 1e-5, "{dir}: {worst}");

        // without the noise: the prior mean, as torch's zero-noise forward
        obs.remove("vae_noise");
        let quiet_obs = tmp.path().join(format!("{dir}_quiet_obs.safetensors"));
        candle_core::safetensors::save(&obs, &quiet_obs).unwrap();
        let quiet_out = tmp.path().join(format!("{dir}_quiet.safetensors"));
        let out = pmstate(&[
            "policy",
            "run",
            ckpt.to_str().unwrap(),
            "--obs",
            quiet_obs.to_str().unwrap(),
            "--out",
            quiet_out.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{dir}: {}", text(&out));
        let quiet = load(&quiet_out);
        assert_eq!(flat(&quiet["latent"]), flat(&quiet["latent_mu"]), "{dir}");
        let worst = flat(&quiet["mean_action"])
            .iter()
            .zip(flat(&want["zero_noise.action"]))
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(worst < 1e-5, "{dir} zero noise: {worst}");

        // describe: the class, the release and its layout, the optional noise
        let out = pmstate(&["policy", "describe", ckpt.to_str().unwrap()]);
        assert!(out.status.success(), "{dir}: {}", text(&out));
        let t = text(&out);
        assert!(t.contains(CLASS) && t.contains(&format!("release: ProtoMotions {release}")), "{t}");
        assert!(t.contains("vae_noise") && t.contains("(optional)"), "{t}");
        let out = pmstate(&["policy", "describe", "--json", ckpt.to_str().unwrap()]);
        assert!(out.status.success(), "{dir}: {}", text(&out));
        let j: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!((j["model"].as_str(), j["release"].as_str()), (Some(CLASS), Some(release)), "{j}");
        assert_eq!((j["action_size"].as_u64(), j["latent_dim"].as_u64()), (Some(69), Some(8)), "{j}");
    }
}

/// A JSON infer request with every recorded input (vae_noise included),
/// asking for mean_action; the inputs named in `as_bool` sent as BOOL.
fn infer_body(obs: &HashMap<String, Tensor>, as_bool: &[&str]) -> Vec<u8> {
    let mut keys: Vec<&String> = obs.keys().collect();
    keys.sort();
    let inputs: Vec<Value> = keys
        .iter()
        .map(|k| {
            let (shape, v) = (obs[*k].dims(), flat(&obs[*k]));
            if as_bool.contains(&k.as_str()) {
                let data: Vec<bool> = v.iter().map(|x| *x != 0.0).collect();
                json!({"name": k, "shape": shape, "datatype": "BOOL", "data": data})
            } else {
                json!({"name": k, "shape": shape, "datatype": "FP32", "data": v})
            }
        })
        .collect();
    serde_json::to_vec(&json!({"inputs": inputs, "outputs": [{"name": "mean_action"}]})).unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn serve_answers_both_release_layouts_like_the_library() {
    for (dir, _) in DIRS {
        let ckpt = data(&format!("{dir}/last.ckpt"));
        let obs = load(&data(&format!("{dir}/obs.safetensors")));
        let lib = pmstate_policy::releases::masked_mimic::load(&ckpt, None, &Device::Cpu).unwrap();
        let want: Vec<u32> = flat(&lib.forward(&obs).unwrap().mean_action).iter().map(|v| v.to_bits()).collect();

        let mut child = Command::new(env!("CARGO_BIN_EXE_pmstate"))
            .args(["--json", "serve", "--addr", "127.0.0.1:0", "--name", "mm"])
            .arg(&ckpt)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        std::io::BufRead::read_line(&mut stdout, &mut first).unwrap();
        let first: Value = serde_json::from_str(&first).unwrap_or_else(|e| panic!("{dir}: {first}: {e}"));
        assert_eq!(first["event"], "listening", "{dir}: {first}");
        let addr = first["addr"].as_str().unwrap().parse().unwrap();
        let c = Client::new(addr).with_timeout(WATCHDOG);

        // the metadata: every input, vae_noise optional
        let m = c.get("/v2/models/mm").await.unwrap().json();
        let inputs = m["inputs"].as_array().unwrap();
        assert_eq!(inputs.len(), obs.len(), "{dir}: {m}");
        let noise = inputs.iter().find(|i| i["name"] == "vae_noise").unwrap();
        assert_eq!(noise["shape"], json!([-1, 8]), "{dir}: {m}");

        // FP32 masks, then the masks as BOOL (as the env makes them): the
        // library's answer on bool (candle u8) masks, the same bits
        let masks: Vec<&str> = obs.keys().map(String::as_str).filter(|k| k.ends_with("_masks")).collect();
        assert!(!masks.is_empty(), "{dir}");
        let as_u8: HashMap<String, Tensor> = obs
            .iter()
            .map(|(k, t)| (k.clone(), if masks.contains(&k.as_str()) { t.ne(0f64).unwrap() } else { t.clone() }))
            .collect();
        let on_u8: Vec<u32> = flat(&lib.forward(&as_u8).unwrap().mean_action).iter().map(|v| v.to_bits()).collect();
        assert_eq!(on_u8, want, "{dir}: 0/1 masks as bool or float");
        for as_bool in [&[][..], &masks[..]] {
            let r = c.post("/v2/models/mm/infer", infer_body(&obs, as_bool), &[]).await.unwrap();
            assert_eq!(r.status, 200, "{dir}: {}", String::from_utf8_lossy(&r.body));
            let reply = r.json();
            assert_eq!(reply["outputs"][0]["name"], "mean_action", "{reply}");
            let got: Vec<u32> = reply["outputs"][0]["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| (v.as_f64().unwrap() as f32).to_bits())
                .collect();
            assert_eq!(got, want, "{dir}: BOOL {as_bool:?}");
        }

        assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
        let start = std::time::Instant::now();
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                assert!(s.success(), "{dir}: {s:?}");
                break;
            }
            if start.elapsed() > WATCHDOG {
                let _ = child.kill();
                panic!("{dir}: pmstate serve did not exit within {WATCHDOG:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A safetensors file of float32 tensors, those named in `as_bool` written
/// as BOOL (nonzero: true), as torch saves the releases' boolean masks.
fn write_with_bool_masks(path: &std::path::Path, tensors: &HashMap<String, Tensor>, as_bool: &[&str]) {
    let mut keys: Vec<&String> = tensors.keys().collect();
    keys.sort();
    let (mut header, mut data) = (serde_json::Map::new(), Vec::<u8>::new());
    for k in keys {
        let t = &tensors[k];
        let values = flat(t);
        let start = data.len();
        let dtype = if as_bool.contains(&k.as_str()) {
            data.extend(values.iter().map(|&v| u8::from(v != 0.0)));
            "BOOL"
        } else {
            data.extend(values.iter().flat_map(|v| v.to_le_bytes()));
            "F32"
        };
        header.insert(k.clone(), json!({"dtype": dtype, "shape": t.dims(), "data_offsets": [start, data.len()]}));
    }
    let mut h = serde_json::to_vec(&Value::Object(header)).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend(h);
    bytes.extend(data);
    std::fs::write(path, bytes).unwrap();
}

/// Masks of either dtype: an observations file holding the masks as BOOL
/// (as the releases' environments make them) gives the same bits as the
/// float32 file, and the release's own action with boolean masks.
#[test]
fn policy_run_reads_boolean_masks() {
    let tmp = tempfile::tempdir().unwrap();
    for (dir, _) in DIRS {
        let ckpt = data(&format!("{dir}/last.ckpt"));
        let obs = load(&data(&format!("{dir}/obs.safetensors")));
        let masks: Vec<&str> = obs.keys().filter(|k| k.ends_with("_masks")).map(String::as_str).collect();
        assert!(!masks.is_empty(), "{dir}: no mask in the recording");
        let bool_obs = tmp.path().join(format!("{dir}_bool_obs.safetensors"));
        write_with_bool_masks(&bool_obs, &obs, &masks);
        let mut outs = Vec::new();
        for (name, file) in [("float", data(&format!("{dir}/obs.safetensors"))), ("bool", bool_obs.clone())] {
            let out_path = tmp.path().join(format!("{dir}_{name}.safetensors"));
            let o = pmstate(&[
                "policy",
                "run",
                ckpt.to_str().unwrap(),
                "--obs",
                file.to_str().unwrap(),
                "--out",
                out_path.to_str().unwrap(),
            ]);
            assert!(o.status.success(), "{dir} {name}: {}", text(&o));
            outs.push(load(&out_path));
        }
        assert_eq!(flat(&outs[0]["mean_action"]), flat(&outs[1]["mean_action"]), "{dir}");
        let want = load(&data(&format!("{dir}/expected.safetensors")));
        let got = flat(&outs[1]["mean_action"]);
        let torch = flat(&want["bool_masks.action"]);
        let d = got.iter().zip(&torch).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(d <= 1e-5, "{dir}: {d}");
    }
}
