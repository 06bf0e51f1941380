//! The KServe V2 gRPC endpoint against tonic's own client: health,
//! metadata, inference with raw and typed contents (bit for bit what the
//! HTTP endpoint answers), Triton's stream, refusals with their status
//! codes, the message size limit, streams that stall or vanish, and a Unix
//! socket address; the server keeps serving through every refusal.

#[path = "server/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use pmstate_serve::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use pmstate_serve::grpc::proto::infer_parameter::ParameterChoice;
use pmstate_serve::grpc::proto::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use pmstate_serve::grpc::proto::*;
use pmstate_serve::{Event, GrpcAddr, Limits, ServeOptions};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Code;

type GrpcClient = GrpcInferenceServiceClient<Channel>;

/// Options serving the smpl tracker over HTTP and gRPC, both on free ports.
fn grpc_options() -> ServeOptions {
    let mut o = options(testdata("smpl_tracker").join("last.ckpt"));
    o.grpc = Some(GrpcAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], 0))));
    o
}

async fn grpc_client(s: &Running) -> GrpcClient {
    let addr = s.server.grpc_addr().expect("a gRPC address");
    pmstate_serve::grpc::connect(addr).await.expect("connects")
}

fn param(choice: ParameterChoice) -> InferParameter {
    InferParameter { parameter_choice: Some(choice) }
}

/// A request of `rows` (key, width, values) with raw contents.
fn raw_request(rows: &Rows, id: &str) -> ModelInferRequest {
    let mut req = ModelInferRequest { model_name: "policy".into(), id: id.into(), ..Default::default() };
    for (k, w, v) in rows {
        req.inputs.push(InferInputTensor {
            name: k.clone(),
            datatype: "FP32".into(),
            shape: vec![(v.len() / w) as i64, *w as i64],
            ..Default::default()
        });
        req.raw_input_contents.push(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>().into());
    }
    req
}

/// The same request with typed contents.
fn typed_request(rows: &Rows, id: &str) -> ModelInferRequest {
    let mut req = raw_request(rows, id);
    req.raw_input_contents.clear();
    for (t, (_, _, v)) in req.inputs.iter_mut().zip(rows) {
        t.contents = Some(InferTensorContents { fp32_contents: v.clone(), ..Default::default() });
    }
    req
}

/// Outputs by name: (shape, values), from raw or typed contents.
fn grpc_outputs(r: &ModelInferResponse) -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    let raw = !r.raw_output_contents.is_empty();
    if raw {
        assert_eq!(r.raw_output_contents.len(), r.outputs.len(), "one raw entry per output");
    }
    r.outputs
        .iter()
        .enumerate()
        .map(|(i, o)| {
            assert_eq!(o.datatype, "FP32");
            let shape = o.shape.iter().map(|&d| d as usize).collect();
            let values = if raw {
                assert!(o.contents.is_none(), "{}: raw and typed", o.name);
                r.raw_output_contents[i].chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
            } else {
                o.contents.as_ref().expect("typed contents").fp32_contents.clone()
            };
            (o.name.clone(), (shape, values))
        })
        .collect()
}

/// What the HTTP endpoint answers to `rows` (binary out, so no float goes through text).
async fn http_outputs(s: &Running, rows: &Rows, extra: serde_json::Value) -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    let mut extra = extra;
    extra["parameters"]["binary_data_output"] = json!(true);
    let (body, n) = binary_request(rows, extra);
    outputs(&infer_binary(&s.client, body, n).await)
}

fn same_bits(grpc: &HashMap<String, (Vec<usize>, Vec<f32>)>, http: &HashMap<String, (Vec<usize>, Vec<f32>)>) {
    let mut names: Vec<&String> = grpc.keys().collect();
    names.sort();
    let mut want: Vec<&String> = http.keys().collect();
    want.sort();
    assert_eq!(names, want, "the same outputs");
    for n in names {
        assert_eq!(grpc[n].0, http[n].0, "{n}: shape");
        assert_eq!(bits(&grpc[n].1), bits(&http[n].1), "{n}: values");
    }
}

async fn stop(s: Running) {
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_metadata_answer_as_the_rest_endpoints_do() {
    let s = start(grpc_options()).await;
    let url = match s.server.grpc_addr() {
        Some(GrpcAddr::Tcp(a)) => {
            assert_ne!(a.port(), 0, "port 0 resolved");
            format!("grpc://{a}")
        }
        other => panic!("a TCP address, got {other:?}"),
    };
    assert!(s.events.all().iter().any(|e| matches!(e, Event::GrpcListening { url: u } if *u == url)));
    let mut c = grpc_client(&s).await;
    assert!(c.server_live(ServerLiveRequest {}).await.unwrap().into_inner().live);
    assert!(c.server_ready(ServerReadyRequest {}).await.unwrap().into_inner().ready);
    let ready = |name: &str, version: &str| ModelReadyRequest { name: name.into(), version: version.into() };
    assert!(c.model_ready(ready("policy", "")).await.unwrap().into_inner().ready);
    assert!(c.model_ready(ready("policy", "1")).await.unwrap().into_inner().ready);
    let e = c.model_ready(ready("other", "")).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e}");
    assert!(e.message().contains("unknown model other"), "{}", e.message());
    let e = c.model_ready(ready("policy", "9")).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e}");

    let m = c.server_metadata(ServerMetadataRequest {}).await.unwrap().into_inner();
    assert_eq!(m.name, "pmstate");
    assert!(m.extensions.contains(&"binary_tensor_data".to_string()));

    let md = c
        .model_metadata(ModelMetadataRequest { name: "policy".into(), version: String::new() })
        .await
        .unwrap()
        .into_inner();
    let rest = s.client.get("/v2/models/policy").await.unwrap().json();
    assert_eq!(md.name, rest["name"]);
    assert_eq!(md.platform, rest["platform"]);
    assert_eq!(json!(md.versions), rest["versions"]);
    for (mine, theirs) in [(&md.inputs, &rest["inputs"]), (&md.outputs, &rest["outputs"])] {
        let mine: Vec<serde_json::Value> =
            mine.iter().map(|t| json!({"name": t.name, "datatype": t.datatype, "shape": t.shape})).collect();
        assert_eq!(json!(mine), *theirs);
    }

    // Triton's ModelConfig: the fields GET .../config gives, in model_config.proto's form
    let cfg = c
        .model_config(ModelConfigRequest { name: "policy".into(), version: String::new() })
        .await
        .unwrap()
        .into_inner()
        .config
        .expect("a configuration");
    let rest = s.client.get("/v2/models/policy/config").await.unwrap().json();
    assert_eq!((cfg.name.as_str(), cfg.backend.as_str()), ("policy", "pmstate"));
    assert_eq!((json!(cfg.platform), json!(cfg.backend)), (rest["platform"].clone(), rest["backend"].clone()));
    assert_eq!(json!(cfg.max_batch_size), rest["max_batch_size"]);
    let tensors = |list: Vec<(String, i32, Vec<i64>, bool)>| -> serde_json::Value {
        list.into_iter()
            .map(|(name, dt, dims, optional)| {
                let dt = DataType::try_from(dt).expect("a DataType").as_str_name();
                let mut t = json!({"name": name, "data_type": dt, "dims": dims});
                if optional {
                    t["optional"] = json!(true);
                }
                t
            })
            .collect()
    };
    let inputs = cfg.input.into_iter().map(|i| (i.name, i.data_type, i.dims, i.optional)).collect();
    assert_eq!(tensors(inputs), rest["input"]);
    let outputs = cfg.output.into_iter().map(|o| (o.name, o.data_type, o.dims, false)).collect();
    assert_eq!(tensors(outputs), rest["output"]);
    let db = cfg.dynamic_batching.expect("dynamic batching");
    assert_eq!(json!(db.max_queue_delay_microseconds), rest["dynamic_batching"]["max_queue_delay_microseconds"]);
    let queue = db.default_queue_policy.expect("a queue policy").max_queue_size;
    assert_eq!(json!(queue), rest["dynamic_batching"]["default_queue_policy"]["max_queue_size"]);
    let e = c.model_config(ModelConfigRequest { name: "other".into(), version: String::new() }).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e}");
    stop(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_and_typed_inference_match_the_http_endpoint_bit_for_bit() {
    let s = start(grpc_options()).await;
    let mut c = grpc_client(&s).await;
    let r = rows(&obs("smpl_tracker"), &(0..8).collect::<Vec<_>>());
    let http = http_outputs(&s, &r, json!({})).await;

    let raw = c.model_infer(raw_request(&r, "raw-1")).await.unwrap().into_inner();
    assert_eq!((raw.model_name.as_str(), raw.model_version.as_str(), raw.id.as_str()), ("policy", "1", "raw-1"));
    assert_eq!(raw.raw_output_contents.len(), 4, "raw in, raw out");
    same_bits(&grpc_outputs(&raw), &http);
    assert_eq!(grpc_outputs(&raw)["mean_action"].0, [8, 69]);

    let typed = c.model_infer(typed_request(&r, "typed-1")).await.unwrap().into_inner();
    assert!(typed.raw_output_contents.is_empty(), "typed in, typed out");
    same_bits(&grpc_outputs(&typed), &http);

    // binary_data_output chooses the other form
    let mut req = typed_request(&r, "");
    req.parameters.insert("binary_data_output".into(), param(ParameterChoice::BoolParam(true)));
    let out = c.model_infer(req).await.unwrap().into_inner();
    assert_eq!(out.raw_output_contents.len(), 4);
    assert_eq!(out.id, "");

    // sampling with a seed, outputs selected: what the HTTP endpoint draws
    let mut req = raw_request(&r, "s");
    req.parameters.insert("sample".into(), param(ParameterChoice::BoolParam(true)));
    req.parameters.insert("seed".into(), param(ParameterChoice::Int64Param(7)));
    for name in ["action", "neglogp"] {
        req.outputs.push(InferRequestedOutputTensor { name: name.into(), ..Default::default() });
    }
    let sampled = grpc_outputs(&c.model_infer(req).await.unwrap().into_inner());
    let http = http_outputs(
        &s,
        &r,
        json!({"parameters": {"sample": true, "seed": 7}, "outputs": [{"name": "action"}, {"name": "neglogp"}]}),
    )
    .await;
    same_bits(&sampled, &http);

    // gRPC requests are counted with the HTTP ones
    let text = s.server.handle().metrics_text();
    assert_eq!(metric(&text, "pmstate_infer_requests_total"), 6.0, "{text}");
    assert_eq!(metric(&text, "pmstate_infer_rows_total"), 48.0, "{text}");
    stop(s).await;
}

/// v3.1's MaskedMimic takes its masks as BOOL (one byte each in
/// `raw_input_contents`, or `bool_contents`), read as the 0.0/1.0 floats
/// they stand for: the answers are bit for bit those of FP32 masks over HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_masked_mimic_takes_bool_masks_raw_and_typed() {
    let v = "v31_masked_mimic";
    let mut o = options(testdata(v).join("last.ckpt"));
    o.grpc = Some(GrpcAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], 0))));
    let s = start(o).await;
    let mut c = grpc_client(&s).await;
    let r = rows(&obs(v), &(0..8).collect::<Vec<_>>());
    let http = http_outputs(&s, &r, json!({"outputs": [{"name": "mean_action"}]})).await;
    let is_mask = |k: &str| k.ends_with("_masks");
    assert!(r.iter().filter(|(k, _, _)| is_mask(k)).all(|(_, _, v)| v.iter().all(|x| *x == 0.0 || *x == 1.0)));

    let mut raw = raw_request(&r, "raw");
    let mut typed = typed_request(&r, "typed");
    for req in [&mut raw, &mut typed] {
        req.outputs.push(InferRequestedOutputTensor { name: "mean_action".into(), ..Default::default() });
    }
    for (i, (k, _, v)) in r.iter().enumerate().filter(|(_, (k, _, _))| is_mask(k)) {
        raw.inputs[i].datatype = "BOOL".into();
        raw.raw_input_contents[i] = v.iter().map(|x| u8::from(*x != 0.0)).collect::<Vec<u8>>().into();
        typed.inputs[i].datatype = "BOOL".into();
        let bools = v.iter().map(|x| *x != 0.0).collect();
        typed.inputs[i].contents = Some(InferTensorContents { bool_contents: bools, ..Default::default() });
        assert!(is_mask(k));
    }
    same_bits(&grpc_outputs(&c.model_infer(raw).await.unwrap().into_inner()), &http);
    same_bits(&grpc_outputs(&c.model_infer(typed).await.unwrap().into_inner()), &http);

    // BOOL values in the FP32 list: named
    let mut wrong = typed_request(&r, "");
    let i = r.iter().position(|(k, _, _)| is_mask(k)).unwrap();
    wrong.inputs[i].datatype = "BOOL".into();
    let e = c.model_infer(wrong).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    assert!(e.message().contains("but BOOL values go in contents.bool_contents"), "{e}");
    stop(s).await;
}

/// Sends `reqs` on one stream (closing it after), returns every message and the stream's end.
async fn stream(
    c: &mut GrpcClient,
    reqs: Vec<ModelInferRequest>,
) -> (Vec<ModelStreamInferResponse>, Result<(), tonic::Status>) {
    let (tx, rx) = mpsc::channel(16);
    for r in reqs {
        tx.send(r).await.unwrap();
    }
    drop(tx);
    let mut answers = c.model_stream_infer(ReceiverStream::new(rx)).await.unwrap().into_inner();
    let mut got = Vec::new();
    loop {
        match tokio::time::timeout(WATCHDOG, answers.message()).await.expect("the stream answers") {
            Ok(Some(m)) => got.push(m),
            Ok(None) => return (got, Ok(())),
            Err(status) => return (got, Err(status)),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_answers_every_request_in_order_and_goes_on_after_a_refusal() {
    let s = start(grpc_options()).await;
    let mut c = grpc_client(&s).await;
    let o = obs("smpl_tracker");
    let mut reqs = Vec::new();
    let mut want = Vec::new();
    for i in 0..6usize {
        let r = rows(&o, &[i, (i + 3) % 8]);
        want.push(http_outputs(&s, &r, json!({})).await);
        let mut req = if i % 2 == 0 { raw_request(&r, &format!("r{i}")) } else { typed_request(&r, &format!("r{i}")) };
        if i == 3 {
            req.inputs[0].name = "no_such_key".into();
        }
        reqs.push(req);
    }
    let (got, end) = stream(&mut c, reqs).await;
    end.expect("the stream ends cleanly once the client closes its side");
    assert_eq!(got.len(), 6);
    for (i, m) in got.iter().enumerate() {
        let r = m.infer_response.as_ref().expect("an infer_response");
        assert_eq!(r.id, format!("r{i}"), "answers in request order");
        if i == 3 {
            assert!(m.error_message.contains("unexpected input no_such_key"), "{}", m.error_message);
            continue;
        }
        assert_eq!(m.error_message, "");
        same_bits(&grpc_outputs(r), &want[i]);
    }
    stop(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tensors_get_invalid_argument_naming_the_problem() {
    let s = start(grpc_options()).await;
    let mut c = grpc_client(&s).await;
    let r = rows(&obs("smpl_tracker"), &[0, 1]);
    type Edit = Box<dyn Fn(&mut ModelInferRequest)>;
    let cases: Vec<(&str, bool, Edit, Code, &str)> = vec![
        (
            "width",
            true,
            Box::new(|q| q.inputs[0].shape = vec![2, 357]),
            Code::InvalidArgument,
            "width 357, expected 358",
        ),
        (
            "rank",
            true,
            Box::new(|q| q.inputs[0].shape = vec![2, 358, 1]),
            Code::InvalidArgument,
            "shape [2, 358, 1], expected [rows, 358]",
        ),
        ("negative", true, Box::new(|q| q.inputs[0].shape = vec![-2, 358]), Code::InvalidArgument, "negative"),
        ("dtype", true, Box::new(|q| q.inputs[1].datatype = "FP64".into()), Code::InvalidArgument, "datatype FP64"),
        (
            "raw bytes",
            true,
            Box::new(|q| q.raw_input_contents[2] = vec![0u8; 7].into()),
            Code::InvalidArgument,
            "raw_input_contents holds 7 bytes, but FP32 shape [2, 69] needs 552",
        ),
        (
            "raw count",
            true,
            Box::new(|q| {
                q.raw_input_contents.pop();
            }),
            Code::InvalidArgument,
            "raw_input_contents has 2 entries for 3 inputs",
        ),
        (
            "raw and typed",
            true,
            Box::new(|q| q.inputs[0].contents = Some(InferTensorContents::default())),
            Code::InvalidArgument,
            "both contents and raw_input_contents",
        ),
        (
            "unknown input",
            true,
            Box::new(|q| q.inputs[0].name = "obs_typo".into()),
            Code::InvalidArgument,
            "unexpected input obs_typo",
        ),
        (
            "typed count",
            false,
            Box::new(|q| {
                if let Some(c) = q.inputs[0].contents.as_mut() {
                    c.fp32_contents.pop();
                }
            }),
            Code::InvalidArgument,
            "715 values, but shape [2, 358] needs 716",
        ),
        (
            "typed list",
            false,
            Box::new(|q| {
                q.inputs[0].contents = Some(InferTensorContents { fp64_contents: vec![0.0; 716], ..Default::default() })
            }),
            Code::InvalidArgument,
            "values in contents.fp64_contents, but FP32 values go in contents.fp32_contents",
        ),
        ("no values", false, Box::new(|q| q.inputs[0].contents = None), Code::InvalidArgument, "no values"),
        (
            "missing input",
            true,
            Box::new(|q| {
                q.inputs.pop();
                q.raw_input_contents.pop();
            }),
            Code::InvalidArgument,
            "missing input previous_actions",
        ),
        (
            "unknown output",
            true,
            Box::new(|q| q.outputs.push(InferRequestedOutputTensor { name: "q".into(), ..Default::default() })),
            Code::InvalidArgument,
            "unknown output q",
        ),
        (
            "bad seed",
            true,
            Box::new(|q| {
                q.parameters.insert("seed".into(), param(ParameterChoice::StringParam("x".into())));
            }),
            Code::InvalidArgument,
            "parameter seed",
        ),
        ("unknown model", true, Box::new(|q| q.model_name = "nope".into()), Code::NotFound, "unknown model"),
        ("unknown version", true, Box::new(|q| q.model_version = "7".into()), Code::NotFound, "no version"),
    ];
    for (what, raw, edit, code, text) in cases {
        let mut req = if raw { raw_request(&r, what) } else { typed_request(&r, what) };
        edit(&mut req);
        let e = c.model_infer(req).await.expect_err(what);
        assert_eq!(e.code(), code, "{what}: {e}");
        assert!(e.message().contains(text), "{what}: {}", e.message());
    }
    // still serving, on the same connection
    let ok = c.model_infer(raw_request(&r, "after")).await.unwrap().into_inner();
    assert_eq!(ok.id, "after");
    let text = s.server.handle().metrics_text();
    assert_eq!(metric(&text, "pmstate_infer_errors_total{kind=\"bad_input\"}"), 14.0, "{text}");
    stop(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_message_is_refused_and_the_server_keeps_serving() {
    let mut o = grpc_options();
    o.limits = Limits { max_body_bytes: 64 << 10, ..Limits::default() };
    let s = start(o).await;
    let mut c = grpc_client(&s).await;
    let obs = obs("smpl_tracker");
    // 24 rows of 1003 float32: 96 KB, over the 64 KiB limit
    let big = rows(&obs, &(0..24).map(|i| i % 8).collect::<Vec<_>>());
    let small = rows(&obs, &[0]);
    let e = c.model_infer(raw_request(&big, "big")).await.unwrap_err();
    assert!(matches!(e.code(), Code::OutOfRange | Code::ResourceExhausted), "{e}");
    assert!(e.message().contains("65536"), "names the limit: {}", e.message());
    assert_eq!(c.model_infer(raw_request(&small, "small")).await.unwrap().into_inner().id, "small");
    // on a stream: the answers before it, then the stream ends with the refusal
    let (got, end) = stream(&mut c, vec![raw_request(&small, "a"), raw_request(&big, "b")]).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].infer_response.as_ref().unwrap().id, "a");
    let e = end.unwrap_err();
    assert!(matches!(e.code(), Code::OutOfRange | Code::ResourceExhausted), "{e}");
    assert_eq!(c.model_infer(raw_request(&small, "again")).await.unwrap().into_inner().id, "again");
    stop(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanishing_stream_leaves_nothing_behind_and_an_idle_one_is_ended() {
    let mut o = grpc_options();
    o.limits = Limits { header_timeout: Duration::from_secs(1), ..Limits::default() };
    let s = start(o).await;
    let handle = s.server.handle();
    let r = rows(&obs("smpl_tracker"), &[0, 1]);
    {
        // forwards held back: the stream's requests wait in the queue when its client goes away
        let paused = handle.pause();
        let mut c = grpc_client(&s).await;
        let (tx, rx) = mpsc::channel(8);
        for i in 0..3 {
            tx.send(raw_request(&r, &format!("v{i}"))).await.unwrap();
        }
        let answers = c.model_stream_infer(ReceiverStream::new(rx)).await.unwrap().into_inner();
        until_metric("the stream's requests to be queued", &handle, "pmstate_queue_depth", 3.0).await;
        drop(answers);
        drop(tx);
        drop(c);
        until_metric("the vanished stream's requests to leave", &handle, "pmstate_requests_in_flight", 0.0).await;
        drop(paused);
        // their jobs are skipped, not run
        until_metric("the skipped jobs to be counted", &handle, "pmstate_infer_cancelled_total", 3.0).await;
    }
    until_metric("the queue to empty", &handle, "pmstate_queue_depth", 0.0).await;
    let mut c = grpc_client(&s).await;
    assert_eq!(c.model_infer(raw_request(&r, "after")).await.unwrap().into_inner().id, "after");

    // a stream that sends nothing is ended after header_timeout
    let (_tx, rx) = mpsc::channel::<ModelInferRequest>(1);
    let started = std::time::Instant::now();
    let mut answers = c.model_stream_infer(ReceiverStream::new(rx)).await.unwrap().into_inner();
    let e = tokio::time::timeout(WATCHDOG, answers.message()).await.unwrap().unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
    assert!(e.message().contains("header_timeout"), "{}", e.message());
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert_eq!(c.model_infer(raw_request(&r, "later")).await.unwrap().into_inner().id, "later");
    stop(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_socket_address_serves_local_clients() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pmstate.sock");
    // a stale socket file (a server that died) is replaced
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let mut o = options(testdata("smpl_tracker").join("last.ckpt"));
    o.grpc = Some(GrpcAddr::Unix(path.clone()));
    let s = start(o).await;
    let url = format!("unix:{}", path.display());
    assert!(s.events.all().iter().any(|e| matches!(e, Event::GrpcListening { url: u } if *u == url)));
    let mut c = grpc_client(&s).await;
    assert!(c.server_live(ServerLiveRequest {}).await.unwrap().into_inner().live);
    let r = rows(&obs("smpl_tracker"), &[2, 5]);
    let got = grpc_outputs(&c.model_infer(raw_request(&r, "uds")).await.unwrap().into_inner());
    same_bits(&got, &http_outputs(&s, &r, json!({})).await);
    // a second server on the same live socket is refused
    let mut o = options(testdata("smpl_tracker").join("last.ckpt"));
    o.grpc = Some(GrpcAddr::Unix(path.clone()));
    let e = pmstate_serve::Server::start(o, pmstate_serve::ignore_events()).await.err().expect("refused");
    assert!(e.to_string().contains("listening for gRPC on unix:"), "{e}");
    stop(s).await;
    assert!(!path.exists(), "the socket file is removed at shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_open_streams_with_unavailable_and_drains() {
    let s = start(grpc_options()).await;
    let mut c = grpc_client(&s).await;
    let r = rows(&obs("smpl_tracker"), &[0]);
    let (tx, rx) = mpsc::channel(4);
    tx.send(raw_request(&r, "before")).await.unwrap();
    let mut answers = c.model_stream_infer(ReceiverStream::new(rx)).await.unwrap().into_inner();
    let first = tokio::time::timeout(WATCHDOG, answers.message()).await.unwrap().unwrap().unwrap();
    assert_eq!(first.infer_response.unwrap().id, "before");
    let started = std::time::Instant::now();
    s.server.handle().shutdown();
    // the open stream (its client still holding its side) is ended, not waited for
    let e = tokio::time::timeout(WATCHDOG, answers.message()).await.unwrap().unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    tokio::time::timeout(WATCHDOG, s.server.wait()).await.unwrap().unwrap();
    assert!(started.elapsed() < Duration::from_secs(10), "drained in {:?}", started.elapsed());
    drop(tx);
}
