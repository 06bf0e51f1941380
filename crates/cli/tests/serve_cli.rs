//! `pmstate serve` as a process: it prints the address it listens on (port
//! 0), answers the protocol like `pmstate policy run` on the same rows,
//! reloads on SIGHUP, and drains and exits 0 on SIGTERM.
#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use candle_core::{Device, Tensor};
use pmstate_serve::client::Client;
use serde_json::{json, Value};

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy").join(rel)
}

fn signal(pid: u32, sig: &str) {
    assert!(Command::new("kill").args([sig, &pid.to_string()]).status().unwrap().success());
}

#[tokio::test(flavor = "current_thread")]
async fn serve_answers_like_policy_run_reloads_on_sighup_and_drains_on_sigterm() {
    let ckpt = data("smpl_tracker/last.ckpt");
    let tmp = tempfile::tempdir().unwrap();

    // the reference: pmstate policy run on the recorded rows
    let out = tmp.path().join("out.safetensors");
    let bin = env!("CARGO_BIN_EXE_pmstate");
    let obs = data("smpl_tracker/obs.safetensors");
    let run = Command::new(bin)
        .args(["policy", "run", "--obs"])
        .arg(&obs)
        .arg("--out")
        .arg(&out)
        .arg(&ckpt)
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let want = candle_core::safetensors::load(&out, &Device::Cpu).unwrap();
    let want_mean = want["mean_action"].flatten_all().unwrap().to_vec1::<f32>().unwrap();

    let mut child = Command::new(bin)
        .args(["--json", "serve", "--addr", "127.0.0.1:0", "--name", "tracker", "--max-wait-us", "100"])
        .arg(&ckpt)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = move || -> Value { serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap() };
    let first = next();
    assert_eq!(first["event"], "listening", "{first}");
    assert_eq!(first["model"], "tracker");
    let addr: std::net::SocketAddr = first["addr"].as_str().unwrap().parse().unwrap();
    assert_ne!(addr.port(), 0);
    let c = Client::new(addr);

    let r = c.get("/v2/health/ready").await.unwrap();
    assert_eq!((r.status, r.json()), (200, json!({"ready": true})));

    // the recorded rows in JSON: mean_action bitwise as policy run wrote it
    let o = candle_core::safetensors::load(&obs, &Device::Cpu).unwrap();
    let mut keys: Vec<&String> = o.keys().collect();
    keys.sort();
    let inputs: Vec<Value> = keys
        .iter()
        .map(|k| {
            let t: &Tensor = &o[*k];
            json!({"name": k, "shape": t.dims(), "datatype": "FP32",
                   "data": t.flatten_all().unwrap().to_vec1::<f32>().unwrap()})
        })
        .collect();
    let body = serde_json::to_vec(&json!({"inputs": inputs, "outputs": [{"name": "mean_action"}]})).unwrap();
    let r = c.post("/v2/models/tracker/infer", body.clone(), &[]).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let got: Vec<f32> =
        r.json()["outputs"][0]["data"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
    assert_eq!(
        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        want_mean.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );

    // SIGHUP: the checkpoint is loaded again as version 2
    signal(child.id(), "-HUP");
    let e = next();
    assert_eq!((e["event"].as_str(), e["version"].as_u64()), (Some("reloaded"), Some(2)), "{e}");
    assert_eq!(c.get("/v2/models/tracker").await.unwrap().json()["versions"], json!(["2"]));
    let m = c.get("/metrics").await.unwrap();
    assert!(String::from_utf8_lossy(&m.body).contains("pmstate_model_reloads_total{result=\"ok\"} 1"));

    // SIGTERM: drain, stop, exit 0
    signal(child.id(), "-TERM");
    assert_eq!(next()["event"], "draining");
    assert_eq!(next()["event"], "stopped");
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

/// Runs a `pmstate serve` that must refuse to start; one that serves
/// instead is killed (after 60 s: a hang, not a speed check) and fails.
fn refused(cmd: &mut Command) -> std::process::Output {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            panic!("{cmd:?} is serving instead of refusing: {:?}", child.wait_with_output().unwrap());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn serve_refuses_what_it_cannot_serve() {
    let bin = env!("CARGO_BIN_EXE_pmstate");
    let ckpt = data("smpl_tracker/last.ckpt");
    // a width pin the checkpoint contradicts, a bad model name, a missing file: exit 2, named
    for (args, want) in [
        (vec!["--width", "max_coords_obs=2000"], "--widths max_coords_obs"),
        (vec!["--name", "a/b"], "model name \"a/b\""),
        (vec!["--max-batch", "0"], "--max-batch"),
    ] {
        let out = refused(Command::new(bin).arg("serve").args(&args).args(["--addr", "127.0.0.1:0"]).arg(&ckpt));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let out = refused(Command::new(bin).args(["serve", "--addr", "127.0.0.1:0", "/nonexistent/last.ckpt"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/last.ckpt"));
}
