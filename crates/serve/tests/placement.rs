//! Where a single model's batching loop runs: on a thread of its forward
//! pool ([`pmstate_serve::batcher::Placement::ForwardPool`]), so that a
//! forward starts where its requests were found. Alone in this file (its own
//! process): it counts the process's threads by name.

use std::net::SocketAddr;
use std::path::PathBuf;

use pmstate_serve::grpc::proto::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use pmstate_serve::grpc::proto::ModelInferRequest;
use pmstate_serve::{ignore_events, GrpcAddr, ModelSource, ServeOptions, Server};

/// Threads of this process named `name` (Linux: /proc).
fn threads_named(name: &str) -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_models_batching_loop_holds_a_forward_thread_and_still_runs_every_forward() {
    if !std::path::Path::new("/proc/self/task").exists() {
        eprintln!("skipped: no /proc to count threads in");
        return;
    }
    let ckpt = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy/smpl_tracker/last.ckpt");
    let mut o = ServeOptions::new(ModelSource::Checkpoint { path: ckpt, config: None });
    o.addr = SocketAddr::from(([127, 0, 0, 1], 0));
    o.grpc = Some(GrpcAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], 0))));
    o.name = "policy".into();
    // one forward thread: the loop holds it, and runs each forward on it
    o.threads = Some(1);
    let server = Server::start(o, ignore_events()).await.expect("the server starts");
    // (a thread's name as /proc has it: 15 bytes, "pmstate-forward-0" cut)
    assert_eq!(threads_named("pmstate-forward"), 1);
    assert_eq!(threads_named("pmstate-batcher"), 0, "the loop has no thread of its own");
    let addr = server.grpc_addr().expect("gRPC is served").clone();
    let mut client = pmstate_serve::grpc::connect(&addr).await.expect("a client connects");
    for rows in [1, 3, 2] {
        let mut req = ModelInferRequest { model_name: "policy".into(), ..Default::default() };
        for (name, width) in [("max_coords_obs", 358), ("mimic_target_poses", 576), ("previous_actions", 69)] {
            let shape = vec![rows as i64, width as i64];
            req.inputs.push(InferInputTensor {
                name: name.into(),
                datatype: "FP32".into(),
                shape,
                ..Default::default()
            });
            req.raw_input_contents.push(vec![0u8; rows * width * 4].into());
        }
        req.outputs = vec![InferRequestedOutputTensor { name: "mean_action".into(), ..Default::default() }];
        let answer = client.model_infer(req).await.expect("answered").into_inner();
        assert_eq!(answer.outputs[0].shape, [rows as i64, 69], "{rows} rows");
        assert_eq!(answer.raw_output_contents[0].len(), rows * 69 * 4, "{rows} rows");
    }
    // the loop ends at shutdown, handing its thread back
    server.handle().shutdown();
    server.wait().await.expect("the server stops");
}
