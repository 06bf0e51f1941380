//! The 500 path, which no request can reach with a real checkpoint
//! (decoding refuses everything its forward would): a forward made to fail
//! through the batcher's test-only fault hook answers 500 with a JSON
//! error, is counted as `internal`, and the server keeps serving.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

use crate::batcher::Fault;
use crate::client::Client;
use crate::{ignore_events, ModelSource, ServeOptions, Server};

fn smpl_tracker() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy/smpl_tracker")
}

/// One row of the recorded observations as a JSON request.
fn request() -> Vec<u8> {
    let obs = candle_core::safetensors::load(smpl_tracker().join("obs.safetensors"), &candle_core::Device::Cpu)
        .expect("the recorded observations");
    let mut keys: Vec<&String> = obs.keys().collect();
    keys.sort();
    let inputs: Vec<Value> = keys
        .into_iter()
        .map(|k| {
            let row = obs[k].narrow(0, 0, 1).and_then(|t| t.flatten_all()).and_then(|t| t.to_vec1::<f32>());
            let row = row.expect("row 0");
            json!({"name": k, "shape": [1, row.len()], "datatype": "FP32", "data": row})
        })
        .collect();
    serde_json::to_vec(&json!({ "inputs": inputs })).expect("JSON")
}

fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)).and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_or_panicking_forward_is_a_500_and_the_server_goes_on() {
    // one forward thread and three: the same answers, the same recovery
    // from a panic raised on whichever pool thread runs that part
    let mut first: Option<Value> = None;
    for threads in [1, 3] {
        let good = a_failed_or_panicking_forward_on(threads).await;
        match &first {
            None => first = Some(good),
            Some(want) => assert_eq!(&good, want, "{threads} forward threads"),
        }
    }
}

/// The fault round of the test above on `threads` forward threads; the
/// good answer's outputs.
async fn a_failed_or_panicking_forward_on(threads: usize) -> Value {
    let mut opts = ServeOptions::new(ModelSource::Checkpoint { path: smpl_tracker().join("last.ckpt"), config: None });
    opts.addr = SocketAddr::from(([127, 0, 0, 1], 0));
    opts.threads = Some(threads);
    let server = Server::start(opts, ignore_events()).await.expect("the server starts");
    let handle = server.handle();
    let c = Client::new(server.addr()).with_timeout(Duration::from_secs(120));
    let headers = [("content-type", "application/json".to_string())];
    let infer = || c.post("/v2/models/policy/infer", request(), &headers);

    let good = infer().await.expect("an answer");
    assert_eq!(good.status, 200);
    for (fault, want) in [
        (Fault::Error, "internal error: the forward failed: candle: injected fault"),
        (Fault::Panic, "internal error: the forward panicked"),
    ] {
        handle.state.models.all()[0].batcher.inject(fault);
        let r = infer().await.expect("an answer");
        assert_eq!(r.status, 500, "{fault:?}");
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert_eq!(r.json()["error"], want, "{fault:?}");
        // the next request is answered as before
        let again = infer().await.expect("an answer");
        assert_eq!(again.status, 200, "after {fault:?}");
        assert_eq!(again.json()["outputs"], good.json()["outputs"]);
    }
    let text = handle.metrics_text();
    assert_eq!(metric(&text, "pmstate_infer_errors_total{kind=\"internal\"} "), Some(2.0));
    assert_eq!(metric(&text, "pmstate_infer_requests_total "), Some(5.0));
    handle.shutdown();
    server.wait().await.expect("a clean stop");
    good.json()["outputs"].clone()
}

#[test]
fn limits_that_must_be_positive_are_refused_by_name() {
    use crate::error::OptionsError;
    let opts = |f: &dyn Fn(&mut crate::Limits)| {
        let mut o = ServeOptions::new(ModelSource::Checkpoint { path: smpl_tracker().join("last.ckpt"), config: None });
        f(&mut o.limits);
        o
    };
    assert_eq!(super::check(&opts(&|_| {})), Ok(()));
    type Change<'a> = &'a dyn Fn(&mut crate::Limits);
    let cases: [(Change, &str); 4] = [
        (&|l| l.max_connections = 0, "max_connections"),
        (&|l| l.header_timeout = Duration::ZERO, "header_timeout"),
        (&|l| l.body_timeout = Duration::ZERO, "body_timeout"),
        (&|l| l.body_stall_timeout = Duration::ZERO, "body_stall_timeout"),
    ];
    for (f, what) in cases {
        assert_eq!(super::check(&opts(f)), Err(OptionsError::ZeroLimit { what }));
    }
}

/// One row of the recorded pipeline inputs as a JSON request.
fn pipeline_request() -> Vec<u8> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/deploy/g1_amp_deploy");
    let all = candle_core::safetensors::load(dir.join("inputs_b1.safetensors"), &candle_core::Device::Cpu)
        .expect("the recorded inputs");
    let mut names: Vec<&String> = all.keys().collect();
    names.sort();
    let inputs: Vec<Value> = names
        .into_iter()
        .map(|k| {
            let t = &all[k];
            let v = t.flatten_all().and_then(|t| t.to_vec1::<f32>()).expect("f32");
            json!({"name": k, "shape": t.dims(), "datatype": "FP32", "data": v})
        })
        .collect();
    serde_json::to_vec(&json!({ "inputs": inputs })).expect("JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_pipeline_forward_is_a_500_and_the_server_goes_on() {
    let ckpt = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy/g1_amp_deploy/last.ckpt");
    let mut opts = ServeOptions::new(ModelSource::Pipeline { path: ckpt, config: None });
    opts.addr = SocketAddr::from(([127, 0, 0, 1], 0));
    opts.threads = Some(1);
    let server = Server::start(opts, ignore_events()).await.expect("the server starts");
    let handle = server.handle();
    let c = Client::new(server.addr()).with_timeout(Duration::from_secs(120));
    let infer = || c.post("/v2/models/policy/infer", pipeline_request(), &[]);
    let good = infer().await.expect("an answer");
    assert_eq!(good.status, 200);
    for (fault, want) in [
        (Fault::Error, "internal error: the forward failed: candle: injected fault"),
        (Fault::Panic, "internal error: the forward panicked"),
    ] {
        handle.state.models.all()[0].batcher.inject(fault);
        let r = infer().await.expect("an answer");
        assert_eq!((r.status, r.json()["error"].clone()), (500, json!(want)), "{fault:?}");
        let again = infer().await.expect("an answer");
        assert_eq!(again.json()["outputs"], good.json()["outputs"], "after {fault:?}");
    }
    assert_eq!(metric(&handle.metrics_text(), "pmstate_infer_errors_total{kind=\"internal\"} "), Some(2.0));
    handle.shutdown();
    server.wait().await.expect("a clean stop");
}

#[test]
fn a_pipeline_takes_no_width_pins() {
    use crate::error::OptionsError;
    let path = PathBuf::from("last.ckpt");
    let mut o = ServeOptions::new(ModelSource::Pipeline { path, config: None });
    assert_eq!(super::check(&o), Ok(()));
    o.widths = vec![("current_dof_pos".into(), 29)];
    assert_eq!(super::check(&o), Err(OptionsError::PolicyOnly { option: "widths" }));
}

#[test]
fn a_model_built_in_process_takes_no_width_pins() {
    use crate::error::OptionsError;
    use pmstate_policy::served::{self, ModelOptions};
    // any family: the masked_mimic fixture, loaded through the registry
    let ckpt = smpl_tracker().join("../masked_mimic/last.ckpt");
    let model = served::load(&ckpt, None, &candle_core::Device::Cpu, &ModelOptions::default()).expect("masked mimic");
    let mut o = ServeOptions::new(ModelSource::InProcess { model, label: "in process".into() });
    assert_eq!(super::check(&o), Ok(()));
    o.widths = vec![("max_coords_obs".into(), 358)];
    assert_eq!(super::check(&o), Err(OptionsError::PinnedWhenBuilt));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_generators_caller_keeps_its_connection_through_any_status() {
    use crate::client::Caller;
    let mut opts = ServeOptions::new(ModelSource::Checkpoint { path: smpl_tracker().join("last.ckpt"), config: None });
    opts.addr = SocketAddr::from(([127, 0, 0, 1], 0));
    opts.threads = Some(1);
    let server = Server::start(opts, ignore_events()).await.expect("the server starts");
    let headers = [("content-type", "application/json".to_string())];
    let mut caller = Caller::connect(server.addr(), "/v2/models/policy/infer", &headers).await.expect("a connection");
    let good = bytes::Bytes::from(request());
    for body in [good.clone(), good.clone(), bytes::Bytes::from_static(b"{\"inputs\": 3}"), good] {
        let want = if body.len() < 20 { 400 } else { 200 };
        let status =
            tokio::time::timeout(Duration::from_secs(120), caller.post(body)).await.expect("an answer in time");
        assert_eq!(status.expect("an answer"), want);
    }
    let text = server.handle().metrics_text();
    assert_eq!(metric(&text, "pmstate_infer_requests_total "), Some(4.0));
    // every request came over the one connection the caller holds open
    assert_eq!(metric(&text, "pmstate_connections "), Some(1.0), "{text}");
    server.handle().shutdown();
    server.wait().await.expect("a clean stop");
}

#[test]
fn the_load_generator_counts_the_answers_of_every_client() {
    let mut opts = ServeOptions::new(ModelSource::Checkpoint { path: smpl_tracker().join("last.ckpt"), config: None });
    opts.addr = SocketAddr::from(([127, 0, 0, 1], 0));
    opts.threads = Some(1);
    let plan = crate::load::LoadPlan {
        clients: vec![1, 3],
        seconds: 0.3,
        warmup: 0.05,
        body: bytes::Bytes::from(request()),
        headers: vec![("content-type", "application/json".to_string())],
        rows_per_request: 1,
        grpc: None,
        grpc_stream: false,
        transport_threads: 2,
        client_threads: 2,
    };
    let results = crate::load::run_load(opts, &plan).expect("the load runs");
    assert_eq!(results.iter().map(|r| r.clients).collect::<Vec<_>>(), [1, 3]);
    for r in &results {
        assert_eq!(r.errors, 0, "{} clients", r.clients);
        assert!(r.requests > 0 && r.rows_per_s > 0.0, "{} clients: {} requests", r.clients, r.requests);
        assert!(r.p50 <= r.p99, "{} clients: p50 {} p99 {}", r.clients, r.p50, r.p99);
        assert!(r.rows_per_forward >= 1.0, "{} clients: {} rows per forward", r.clients, r.rows_per_forward);
    }
}

/// The load generator's gRPC clients: every `ModelInfer` answered, counted as the HTTP ones are.
#[test]
fn the_load_generator_drives_the_grpc_endpoint() {
    use crate::grpc::proto::{model_infer_request::InferInputTensor, ModelInferRequest};
    let mut opts = ServeOptions::new(ModelSource::Checkpoint { path: smpl_tracker().join("last.ckpt"), config: None });
    opts.addr = SocketAddr::from(([127, 0, 0, 1], 0));
    opts.grpc = Some(crate::GrpcAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], 0))));
    opts.threads = Some(1);
    let mut req = ModelInferRequest { model_name: "policy".into(), ..Default::default() };
    for (name, width) in [("max_coords_obs", 358), ("mimic_target_poses", 576), ("previous_actions", 69)] {
        let shape = vec![1, width as i64];
        req.inputs.push(InferInputTensor { name: name.into(), datatype: "FP32".into(), shape, ..Default::default() });
        req.raw_input_contents.push(vec![0u8; width * 4].into());
    }
    let plan = crate::load::LoadPlan {
        clients: vec![2],
        seconds: 0.3,
        warmup: 0.05,
        body: bytes::Bytes::new(),
        headers: vec![],
        rows_per_request: 1,
        grpc: Some(req),
        grpc_stream: false,
        transport_threads: 2,
        client_threads: 2,
    };
    let results = crate::load::run_load(opts, &plan).expect("the load runs");
    assert_eq!((results[0].clients, results[0].errors), (2, 0));
    assert!(results[0].requests > 0 && results[0].rows_per_forward >= 1.0, "{:?}", results[0]);
}
