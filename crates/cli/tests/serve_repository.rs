//! `pmstate serve --repository DIR`: a repository of two recorded
//! checkpoints started in explicit mode with one `--load-model`; asserted:
//! the `repository_listening` and `model_loaded` events, the index, an
//! answer from each model after an HTTP load, an unload (the model then
//! refused, listed "unloaded"), a drain on SIGTERM; and the flags refused
//! without a repository, or with a checkpoint beside it. (The protocol is
//! tested against the library in `crates/serve/tests/repository.rs`.)
#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use candle_core::{Device, Tensor};
use pmstate_serve::client::Client;
use serde_json::{json, Value};

/// How long any one step may take before the test calls it a hang (not a speed check).
const WATCHDOG: Duration = Duration::from_secs(120);

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy").join(rel)
}

/// A variant's checkpoint and configs copied to `dir`.
fn copy_variant(variant: &str, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for f in ["last.ckpt", "resolved_configs.pt", "resolved_configs_inference.pt"] {
        std::fs::copy(data(variant).join(f), dir.join(f)).unwrap();
    }
}

/// The JSON lines a child prints, read on a thread of their own.
fn lines(child: &mut Child) -> Receiver<String> {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn next(rx: &Receiver<String>) -> Value {
    let line = rx.recv_timeout(WATCHDOG).unwrap_or_else(|e| panic!("no line within {WATCHDOG:?}: {e}"));
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"))
}

/// Two rows of a variant's recorded observations as a JSON request.
fn infer_body(variant: &str) -> Vec<u8> {
    let o = candle_core::safetensors::load(data(variant).join("obs.safetensors"), &Device::Cpu).unwrap();
    let mut keys: Vec<&String> = o.keys().collect();
    keys.sort();
    let inputs: Vec<Value> = keys
        .iter()
        .map(|k| {
            let t: &Tensor = &o[*k];
            let w = t.dims()[1];
            let all = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            json!({"name": k, "shape": [2, w], "datatype": "FP32", "data": &all[..2 * w]})
        })
        .collect();
    serde_json::to_vec(&json!({ "inputs": inputs })).unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn serve_repository_indexes_loads_answers_and_unloads() {
    let repo = tempfile::tempdir().unwrap();
    copy_variant("smpl_tracker", &repo.path().join("smpl_tracker/1"));
    copy_variant("masked_mimic", &repo.path().join("masked_mimic/3"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_pmstate"))
        .args(["--json", "serve", "--addr", "127.0.0.1:0", "--repository"])
        .arg(repo.path())
        .args(["--model-control-mode", "explicit", "--load-model", "smpl_tracker"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let rx = lines(&mut child);
    let loaded = next(&rx);
    assert_eq!((loaded["event"].as_str(), loaded["model"].as_str()), (Some("model_loaded"), Some("smpl_tracker")));
    let listening = next(&rx);
    assert_eq!(listening["event"], "repository_listening", "{listening}");
    assert_eq!(listening["models"], json!(["smpl_tracker"]));
    let addr: SocketAddr = listening["addr"].as_str().unwrap().parse().unwrap();
    let c = Client::new(addr).with_timeout(WATCHDOG);

    let ix = c.post("/v2/repository/index", Vec::new(), &[]).await.unwrap().json();
    assert_eq!(
        ix,
        json!([
            {"name": "masked_mimic", "state": "UNAVAILABLE", "reason": "not loaded"},
            {"name": "smpl_tracker", "version": "1", "state": "READY"}
        ])
    );
    let r = c.post("/v2/models/smpl_tracker/infer", infer_body("smpl_tracker"), &[]).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["model_version"], "1");

    let r = c.post("/v2/repository/models/masked_mimic/load", Vec::new(), &[]).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(next(&rx)["event"], "model_loaded");
    let r = c.post("/v2/models/masked_mimic/infer", infer_body("masked_mimic"), &[]).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["model_version"], "3");

    let r = c.post("/v2/repository/models/smpl_tracker/unload", Vec::new(), &[]).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(next(&rx)["event"], "model_unloaded");
    let r = c.post("/v2/models/smpl_tracker/infer", infer_body("smpl_tracker"), &[]).await.unwrap();
    assert_eq!(r.status, 404, "{}", String::from_utf8_lossy(&r.body));
    let ix = c.post("/v2/repository/index", Vec::new(), &[]).await.unwrap().json();
    assert_eq!(ix[1], json!({"name": "smpl_tracker", "state": "UNAVAILABLE", "reason": "unloaded"}), "{ix}");
    let m = c.get("/metrics").await.unwrap();
    let m = String::from_utf8_lossy(&m.body);
    assert!(m.contains("pmstate_infer_requests_total{model=\"masked_mimic\",version=\"3\"} 1"), "{m}");

    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    assert_eq!(next(&rx)["event"], "draining");
    assert_eq!(next(&rx)["event"], "stopped");
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}

/// The repository flags need --repository; a checkpoint beside it, or
/// --load-model in mode none, is refused before anything starts.
#[test]
fn repository_flags_are_checked() {
    let run = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_pmstate")).args(args).output().unwrap();
    let o = run(&["serve", "--model-control-mode", "explicit", "x.ckpt"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--repository"), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&["serve", "--repository", "/nonexistent", "x.ckpt"]);
    assert!(!o.status.success());
    let o = run(&["serve", "--repository", "/nonexistent", "--load-model", "a"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("explicit"), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&["serve", "--addr", "127.0.0.1:0", "--repository", "/nonexistent/repo"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/repo"), "{}", String::from_utf8_lossy(&o.stderr));
}

/// The repository ServingRuntime's args (deploy/kserve/servingruntime-repository.yaml),
/// with a repository of this machine and free ports, serve the repository
/// on both the HTTP and the gRPC port it declares.
#[tokio::test(flavor = "current_thread")]
async fn the_repository_runtime_command_line_serves_http_and_grpc() {
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kserve/servingruntime-repository.yaml"),
    )
    .unwrap();
    let rt = &yaml_rust2::YamlLoader::load_from_str(&text).unwrap()[0];
    let c = &rt["spec"]["containers"][0];
    let ports: Vec<(i64, &str)> = c["ports"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|p| (p["containerPort"].as_i64().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    assert_eq!(ports, [(8080, "http1"), (8001, "grpc")]);
    let repo = tempfile::tempdir().unwrap();
    copy_variant("smpl_tracker", &repo.path().join("tracker/1"));
    let args: Vec<String> = c["args"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|a| match a.as_str().unwrap() {
            "/mnt/models" => repo.path().display().to_string(),
            a if a.starts_with("0.0.0.0:") => "127.0.0.1:0".into(),
            a => a.into(),
        })
        .collect();
    assert!(args.contains(&"--grpc-addr".to_owned()) && args.contains(&"--repository".to_owned()), "{args:?}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_pmstate"))
        .arg("--json")
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let rx = lines(&mut child);
    assert_eq!(next(&rx)["event"], "model_loaded");
    let listening = next(&rx);
    assert_eq!(listening["event"], "repository_listening", "{listening}");
    let grpc = next(&rx);
    assert_eq!(grpc["event"], "grpc_listening", "{grpc}");
    let addr: SocketAddr = listening["addr"].as_str().unwrap().parse().unwrap();
    let c = Client::new(addr).with_timeout(WATCHDOG);
    let r = c.post("/v2/models/tracker/infer", infer_body("smpl_tracker"), &[]).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let url = grpc["url"].as_str().unwrap().strip_prefix("grpc://").unwrap();
    let g = pmstate_serve::GrpcAddr::Tcp(url.parse().unwrap());
    let mut g = pmstate_serve::grpc::connect(&g).await.unwrap();
    let ix = g.repository_index(pmstate_serve::grpc::proto::RepositoryIndexRequest::default()).await.unwrap();
    assert_eq!(ix.into_inner().models.len(), 1);
    // a gRPC connection left open would hold the drain: closed, and the
    // runtime left free to close it while the child drains
    drop(g);
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < WATCHDOG, "pmstate serve did not exit within {WATCHDOG:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status}");
}
