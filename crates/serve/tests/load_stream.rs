//! The load generator's streaming gRPC mode (`pmstate bench-serve
//! --encoding grpc-stream`): each client keeps one `ModelStreamInfer`
//! stream and sends its next request once the last one is answered. These
//! check that it drives the server without errors and counts what it is
//! answered (rows, not requests); refusals on the stream are counted as
//! errors. No timings are asserted: speed is `bench-serve`'s.

use std::net::SocketAddr;
use std::path::PathBuf;

use pmstate_serve::grpc::proto::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use pmstate_serve::grpc::proto::ModelInferRequest;
use pmstate_serve::load::{run_load, LoadPlan};
use pmstate_serve::{GrpcAddr, ModelSource, ServeOptions};

/// The test tracker's checkpoint (the small smpl tracker of testdata).
fn checkpoint() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy/smpl_tracker/last.ckpt")
}

/// Options serving the tracker over HTTP and gRPC, both on free ports.
fn options() -> ServeOptions {
    let mut o = ServeOptions::new(ModelSource::Checkpoint { path: checkpoint(), config: None });
    o.addr = SocketAddr::from(([127, 0, 0, 1], 0));
    o.grpc = Some(GrpcAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], 0))));
    o.name = "policy".into();
    o.threads = Some(1);
    o
}

/// A request of `rows` rows of zeros (raw contents) asking for `mean_action`;
/// `max_coords_obs` is `obs_width` wide (358 is right).
fn request(rows: usize, obs_width: usize) -> ModelInferRequest {
    let mut req = ModelInferRequest { model_name: "policy".into(), ..Default::default() };
    for (name, width) in [("max_coords_obs", obs_width), ("mimic_target_poses", 576), ("previous_actions", 69)] {
        let shape = vec![rows as i64, width as i64];
        req.inputs.push(InferInputTensor { name: name.into(), datatype: "FP32".into(), shape, ..Default::default() });
        req.raw_input_contents.push(vec![0u8; rows * width * 4].into());
    }
    req.outputs = vec![InferRequestedOutputTensor { name: "mean_action".into(), ..Default::default() }];
    req
}

fn plan(clients: Vec<usize>, req: ModelInferRequest, rows_per_request: usize) -> LoadPlan {
    LoadPlan {
        clients,
        seconds: 0.3,
        warmup: 0.05,
        body: bytes::Bytes::new(),
        headers: vec![],
        rows_per_request,
        grpc: Some(req),
        grpc_stream: true,
        transport_threads: 1,
        client_threads: 1,
    }
}

#[test]
fn streaming_clients_are_all_answered_and_their_rows_counted() {
    let results = run_load(options(), &plan(vec![1, 4], request(2, 358), 2)).expect("the load runs");
    assert_eq!(results.iter().map(|r| r.clients).collect::<Vec<_>>(), [1, 4]);
    for r in &results {
        assert_eq!(r.errors, 0, "{} clients", r.clients);
        assert!(r.requests > 0, "{} clients: no request answered", r.clients);
        // two rows per answered request, over the measured seconds
        let rows = r.rows_per_s * r.seconds;
        assert!(
            (rows - 2.0 * r.requests as f64).abs() < 1e-6,
            "{} clients: {rows} rows, {} requests",
            r.clients,
            r.requests
        );
        assert!(r.p50 <= r.p99, "{} clients: p50 {} p99 {}", r.clients, r.p50, r.p99);
        // every forward holds at least one request's two rows
        assert!(r.rows_per_forward >= 2.0, "{} clients: {} rows per forward", r.clients, r.rows_per_forward);
    }
}

#[test]
fn refusals_on_a_stream_are_counted_as_errors_and_nothing_as_answered() {
    // every request is refused (a width the model does not take); the
    // server answers each with an error message on the stream
    let results = run_load(options(), &plan(vec![2], request(1, 3), 1)).expect("the load runs");
    let r = &results[0];
    assert_eq!((r.clients, r.requests, r.rows_per_s), (2, 0, 0.0));
    assert!(r.errors > 0, "no refusal counted");
}
