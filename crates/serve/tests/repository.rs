//! `--repository`: a temporary model repository in Triton's layout with
//! two recorded checkpoints (the smpl tracker in versions 1 and 2, a
//! MaskedMimic model with a config.json) and a model whose only version is
//! not a checkpoint. Asserted: the index (READY per version, the broken
//! model UNAVAILABLE with its reason while the rest serve), inference on
//! each model, version routing (latest by default, /versions/N/ as asked,
//! an unknown version refused), per-model settings from config.json,
//! per-model metrics labels, explicit load and unload over HTTP and gRPC,
//! the refusals of `--model-control-mode none`, hostile model names, a
//! SIGHUP-style reload of every version that keeps its number, and the
//! repository endpoints of a single-checkpoint server.

#[path = "server/common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use common::*;
use pmstate_serve::client::Reply;
use pmstate_serve::grpc::proto::*;
use pmstate_serve::{Event, GrpcAddr, ModelControl, ModelSource, RepositoryOptions, ServeOptions, StartError};
use serde_json::{json, Value};
use tonic::Code;

/// Copies a recorded variant's checkpoint and configs into `dir`.
fn copy_variant(variant: &str, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for f in ["last.ckpt", "resolved_configs.pt", "resolved_configs_inference.pt"] {
        std::fs::copy(testdata(variant).join(f), dir.join(f)).unwrap();
    }
}

/// The repository: smpl_tracker/{1,2}, masked_mimic/1 (max_batch 4 in its
/// config.json), broken/1 (a last.ckpt that is no checkpoint), and a plain
/// file and a hidden directory that are no models.
fn repository() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    copy_variant("smpl_tracker", &root.join("smpl_tracker/1"));
    copy_variant("smpl_tracker", &root.join("smpl_tracker/2"));
    copy_variant("masked_mimic", &root.join("masked_mimic/1"));
    std::fs::write(root.join("masked_mimic/config.json"), r#"{"max_batch": 4, "queue": 64}"#).unwrap();
    std::fs::create_dir_all(root.join("broken/1")).unwrap();
    std::fs::write(root.join("broken/1/last.ckpt"), b"not a checkpoint").unwrap();
    std::fs::write(root.join("README"), b"not a model").unwrap();
    std::fs::create_dir_all(root.join(".hidden/1")).unwrap();
    dir
}

fn repo_options(dir: &Path, control: ModelControl, load: &[&str]) -> ServeOptions {
    let mut o = options(PathBuf::new());
    o.source = ModelSource::Repository(RepositoryOptions {
        dir: dir.to_owned(),
        control,
        load: load.iter().map(|s| (*s).to_owned()).collect(),
    });
    o.grpc = Some(GrpcAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], 0))));
    o
}

async fn grpc(s: &Running) -> grpc_inference_service_client::GrpcInferenceServiceClient<tonic::transport::Channel> {
    pmstate_serve::grpc::connect(s.server.grpc_addr().unwrap()).await.unwrap()
}

/// Two rows of a variant's recorded observations as a JSON request.
fn request(variant: &str) -> Vec<u8> {
    json_request(&rows(&obs(variant), &[0, 1]), json!({}))
}

async fn post(s: &Running, path: &str, body: Vec<u8>) -> Reply {
    s.client.post(path, body, &[("content-type", "application/json".into())]).await.unwrap()
}

/// `POST /v2/repository/index` as (name, version, state, reason) tuples.
async fn index(s: &Running) -> Vec<(String, String, String, String)> {
    let r = post(s, "/v2/repository/index", Vec::new()).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let field = |e: &Value, k: &str| e[k].as_str().unwrap_or_default().to_owned();
    r.json()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (field(e, "name"), field(e, "version"), field(e, "state"), field(e, "reason")))
        .collect()
}

fn states(ix: &[(String, String, String, String)]) -> Vec<(&str, &str, &str)> {
    ix.iter().map(|(n, v, s, _)| (n.as_str(), v.as_str(), s.as_str())).collect()
}

fn reason<'a>(ix: &'a [(String, String, String, String)], name: &str) -> &'a str {
    &ix.iter().find(|e| e.0 == name).unwrap().3
}

/// Infers on `path`; returns the reply's model name, version and outputs.
async fn infer_on(s: &Running, path: &str, variant: &str) -> (String, String, Vec<u32>) {
    let r = post(s, path, request(variant)).await;
    assert_eq!(r.status, 200, "{path}: {}", String::from_utf8_lossy(&r.body));
    let j = r.json();
    let out = outputs(&r);
    let mut names: Vec<&String> = out.keys().collect();
    names.sort();
    let all = names.into_iter().flat_map(|n| bits(&out[n].1)).collect();
    (j["model_name"].as_str().unwrap().to_owned(), j["model_version"].as_str().unwrap().to_owned(), all)
}

fn text(r: &Reply) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_model_and_version_serves_and_a_broken_model_is_reported_unavailable() {
    let dir = repository();
    let s = start(repo_options(dir.path(), ModelControl::None, &[])).await;
    let ev = s.events.all();
    assert!(ev.iter().any(|e| matches!(e, Event::ModelFailed { model, .. } if model == "broken")), "{ev:?}");
    assert_eq!(ev.iter().filter(|e| matches!(e, Event::ModelLoaded { .. })).count(), 3, "{ev:?}");
    assert!(ev.iter().any(
        |e| matches!(e, Event::RepositoryListening { models, .. } if models == &["masked_mimic", "smpl_tracker"])
    ));

    // the index: one line per version served, the broken model with its reason
    let ix = index(&s).await;
    assert_eq!(
        states(&ix),
        [
            ("broken", "", "UNAVAILABLE"),
            ("masked_mimic", "1", "READY"),
            ("smpl_tracker", "1", "READY"),
            ("smpl_tracker", "2", "READY")
        ],
        "{ix:?}"
    );
    assert!(reason(&ix, "broken").contains("version 1"), "{ix:?}");
    let ready = post(&s, "/v2/repository/index", br#"{"ready": true}"#.to_vec()).await.json();
    assert_eq!(ready.as_array().unwrap().len(), 3, "{ready}");

    // inference on each model; the latest version by default, the one asked for otherwise
    let (name, v, latest) = infer_on(&s, "/v2/models/smpl_tracker/infer", "smpl_tracker").await;
    assert_eq!((name.as_str(), v.as_str()), ("smpl_tracker", "2"));
    let (_, v, first) = infer_on(&s, "/v2/models/smpl_tracker/versions/1/infer", "smpl_tracker").await;
    assert_eq!(v, "1");
    assert_eq!(first, latest, "the same checkpoint in both versions");
    let (name, v, _) = infer_on(&s, "/v2/models/masked_mimic/infer", "masked_mimic").await;
    assert_eq!((name.as_str(), v.as_str()), ("masked_mimic", "1"));
    let r = post(&s, "/v2/models/smpl_tracker/versions/3/infer", request("smpl_tracker")).await;
    assert_eq!(r.status, 404, "{}", text(&r));
    let r = s.client.get("/v2/models/smpl_tracker/versions/1/ready").await.unwrap();
    assert_eq!(r.status, 200);
    // the broken model is refused with its reason, the others keep serving
    let r = post(&s, "/v2/models/broken/infer", request("smpl_tracker")).await;
    assert_eq!(r.status, 404, "{}", text(&r));
    assert!(text(&r).contains("unavailable"), "{}", text(&r));
    // config.json's batching applies to its model only
    let cfg = s.client.get("/v2/models/masked_mimic/config").await.unwrap().json();
    assert_eq!(cfg["max_batch_size"], 4, "{cfg}");
    let cfg = s.client.get("/v2/models/smpl_tracker/config").await.unwrap().json();
    assert_eq!(cfg["max_batch_size"], 256, "{cfg}");
    let r = post(
        &s,
        "/v2/models/masked_mimic/infer",
        json_request(&rows(&obs("masked_mimic"), &[0, 1, 2, 3, 4]), json!({})),
    )
    .await;
    assert_eq!(r.status, 400, "5 rows over max_batch 4: {}", text(&r));

    // gRPC: the same table
    let mut g = grpc(&s).await;
    let gi = g.repository_index(RepositoryIndexRequest::default()).await.unwrap().into_inner();
    let names: Vec<(&str, &str, &str)> =
        gi.models.iter().map(|m| (m.name.as_str(), m.version.as_str(), m.state.as_str())).collect();
    assert_eq!(names, states(&ix));
    let md = g
        .model_metadata(ModelMetadataRequest { name: "smpl_tracker".into(), version: "1".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((md.name.as_str(), md.versions.as_slice()), ("smpl_tracker", &["1".to_owned()][..]));

    // mode none: load and unload refused, over both transports
    let r = post(&s, "/v2/repository/models/smpl_tracker/unload", Vec::new()).await;
    assert_eq!(r.status, 400, "{}", text(&r));
    assert!(text(&r).contains("model-control-mode"), "{}", text(&r));
    let e = g
        .repository_model_load(RepositoryModelLoadRequest { model_name: "broken".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");

    // per-model metrics: labelled series, one header per family; the
    // request to the broken model counted on the server's own series
    let m = s.client.get("/metrics").await.unwrap();
    let m = text(&m);
    assert_eq!(metric(&m, "pmstate_infer_requests_total{model=\"smpl_tracker\",version=\"2\"}"), 1.0, "{m}");
    assert_eq!(metric(&m, "pmstate_infer_requests_total{model=\"smpl_tracker\",version=\"1\"}"), 1.0, "{m}");
    assert_eq!(metric(&m, "pmstate_infer_requests_total{model=\"masked_mimic\",version=\"1\"}"), 2.0, "{m}");
    assert_eq!(metric(&m, "pmstate_infer_requests_total "), 2.0, "version 3 and broken: {m}");
    assert_eq!(metric(&m, "pmstate_model_version{model=\"smpl_tracker\",version=\"2\"}"), 2.0, "{m}");
    assert_eq!(m.matches("# TYPE pmstate_infer_requests counter").count(), 1, "{m}");

    // a reload (SIGHUP) reloads every version, each keeping its number
    s.server.handle().reload();
    let deadline = std::time::Instant::now() + WATCHDOG;
    while s.events.all().iter().filter(|e| matches!(e, Event::Reloaded { .. })).count() < 3 {
        assert!(std::time::Instant::now() < deadline, "{:?}", s.events.all());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (_, v, _) = infer_on(&s, "/v2/models/smpl_tracker/versions/1/infer", "smpl_tracker").await;
    assert_eq!(v, "1");
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_mode_loads_and_unloads_over_http_and_grpc() {
    let dir = repository();
    let s = start(repo_options(dir.path(), ModelControl::Explicit, &["masked_mimic"])).await;
    let ix = index(&s).await;
    assert_eq!(
        states(&ix),
        [("broken", "", "UNAVAILABLE"), ("masked_mimic", "1", "READY"), ("smpl_tracker", "", "UNAVAILABLE")],
        "{ix:?}"
    );
    assert_eq!(reason(&ix, "smpl_tracker"), "not loaded");
    let r = post(&s, "/v2/models/smpl_tracker/infer", request("smpl_tracker")).await;
    assert_eq!(r.status, 404, "{}", text(&r));

    // HTTP load, then inference
    let r = post(&s, "/v2/repository/models/smpl_tracker/load", Vec::new()).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let (_, v, _) = infer_on(&s, "/v2/models/smpl_tracker/infer", "smpl_tracker").await;
    assert_eq!(v, "2");

    // gRPC unload: refused afterwards with the reason, the other model serves on
    let mut g = grpc(&s).await;
    g.repository_model_unload(RepositoryModelUnloadRequest { model_name: "smpl_tracker".into(), ..Default::default() })
        .await
        .unwrap();
    let r = post(&s, "/v2/models/smpl_tracker/infer", request("smpl_tracker")).await;
    assert_eq!(r.status, 404, "{}", text(&r));
    assert!(text(&r).contains("unloaded"), "{}", text(&r));
    assert_eq!(reason(&index(&s).await, "smpl_tracker"), "unloaded");
    infer_on(&s, "/v2/models/masked_mimic/infer", "masked_mimic").await;
    let e =
        g.model_infer(ModelInferRequest { model_name: "smpl_tracker".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e}");

    // gRPC load brings it back; HTTP unload of the other
    g.repository_model_load(RepositoryModelLoadRequest { model_name: "smpl_tracker".into(), ..Default::default() })
        .await
        .unwrap();
    infer_on(&s, "/v2/models/smpl_tracker/versions/1/infer", "smpl_tracker").await;
    let r = post(&s, "/v2/repository/models/masked_mimic/unload", Vec::new()).await;
    assert_eq!(r.status, 200, "{}", text(&r));

    // a model that fails to load: refused with its reason, listed UNAVAILABLE, the rest serve
    let r = post(&s, "/v2/repository/models/broken/load", Vec::new()).await;
    assert_eq!(r.status, 400, "{}", text(&r));
    assert!(text(&r).contains("broken version 1"), "{}", text(&r));
    let ix = index(&s).await;
    assert!(reason(&ix, "broken").contains("version 1"), "{ix:?}");
    infer_on(&s, "/v2/models/smpl_tracker/infer", "smpl_tracker").await;

    // hostile names and requests
    for bad in ["..", "..%2F..%2Fetc", "a%2Fb", "%2E%2E"] {
        let r = post(&s, &format!("/v2/repository/models/{bad}/load"), Vec::new()).await;
        assert_eq!(r.status, 400, "{bad}: {}", text(&r));
        assert!(text(&r).contains("invalid model name"), "{bad}: {}", text(&r));
    }
    let r = post(&s, "/v2/repository/models/nope/load", Vec::new()).await;
    assert_eq!(r.status, 404, "{}", text(&r));
    let r = post(&s, "/v2/repository/models/smpl_tracker/load", br#"{"parameters": {"config": "{}"}}"#.to_vec()).await;
    assert_eq!(r.status, 400, "{}", text(&r));
    let r = post(&s, "/v2/repository/index", vec![b' '; 10_000]).await;
    assert_eq!(r.status, 400, "an oversized body: {}", text(&r));
    let e = g
        .repository_model_load(RepositoryModelLoadRequest { model_name: "../x".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    let e = g
        .repository_index(RepositoryIndexRequest { repository_name: "elsewhere".into(), ready: false })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    assert!(std::fs::metadata(dir.path().join("smpl_tracker/1/last.ckpt")).is_ok());
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}

/// `--load-model` of a model that does not load stops the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_model_that_does_not_load_stops_the_start() {
    let dir = repository();
    for name in ["broken", "nope", "../smpl_tracker"] {
        let r = pmstate_serve::Server::start(
            repo_options(dir.path(), ModelControl::Explicit, &[name]),
            pmstate_serve::ignore_events(),
        )
        .await;
        assert!(matches!(r, Err(StartError::Repository(_))), "{name}");
    }
}

/// A single-checkpoint server has no repository: its endpoints say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_checkpoint_server_refuses_repository_requests() {
    let s = start_variant("smpl_tracker").await;
    let r = post(&s, "/v2/repository/index", Vec::new()).await;
    assert_eq!(r.status, 400, "{}", text(&r));
    assert!(text(&r).contains("--repository"), "{}", text(&r));
    let m = text(&s.client.get("/metrics").await.unwrap());
    assert!(!m.contains("model=\""), "{m}");
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}
