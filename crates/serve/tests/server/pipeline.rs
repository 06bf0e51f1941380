//! `--pipeline`: a tracker's deployment pipeline served as ProtoMotions'
//! exported ONNX graph is on Triton: its inputs by the graph's names with
//! their full shapes (rank 2 and 3), its four outputs, the contract. The
//! recorded inputs of testdata/deploy/g1_amp_deploy answered bit for bit as
//! `Pipeline::forward` answers them (batched or not), within the policy
//! crate's error bound where onnxruntime's recorded outputs are.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::common::*;
use candle_core::{Device, Tensor};
use pmstate_deploy::Pipeline;
use pmstate_serve::{Event, ModelSource, ServeOptions};
use serde_json::{json, Value};

fn checkpoint() -> PathBuf {
    testdata("g1_amp_deploy").join("last.ckpt")
}

/// A recorded safetensors file of testdata/deploy/g1_amp_deploy.
fn recorded(name: &str) -> HashMap<String, Tensor> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/deploy/g1_amp_deploy");
    candle_core::safetensors::load(dir.join(name), &Device::Cpu).unwrap()
}

fn pipeline_options() -> ServeOptions {
    let mut o = options(checkpoint());
    o.source = ModelSource::Pipeline { path: checkpoint(), config: None };
    o
}

/// One request input: (name, shape with the rows first, values).
type Shaped = (String, Vec<usize>, Vec<f32>);

/// Rows `idx` of every input of `all` (each `[16, ...]`), names sorted.
fn shaped_rows(all: &HashMap<String, Tensor>, idx: &[usize]) -> Vec<Shaped> {
    let mut names: Vec<&String> = all.keys().collect();
    names.sort();
    names
        .into_iter()
        .map(|k| {
            let t = &all[k];
            let per_row: usize = t.dims()[1..].iter().product();
            let v = host(t);
            let values = idx.iter().flat_map(|&i| v[i * per_row..(i + 1) * per_row].iter().copied()).collect();
            let shape = std::iter::once(idx.len()).chain(t.dims()[1..].iter().copied()).collect();
            (k.clone(), shape, values)
        })
        .collect()
}

/// The tensors of `rows`, for `Pipeline::forward`.
fn as_tensors(rows: &[Shaped]) -> HashMap<String, Tensor> {
    rows.iter().map(|(k, s, v)| (k.clone(), Tensor::from_vec(v.clone(), s.as_slice(), &Device::Cpu).unwrap())).collect()
}

fn json_body(rows: &[Shaped]) -> Vec<u8> {
    let inputs: Vec<Value> =
        rows.iter().map(|(k, s, v)| json!({"name": k, "shape": s, "datatype": "FP32", "data": v})).collect();
    serde_json::to_vec(&json!({ "inputs": inputs })).unwrap()
}

/// A binary-extension request asking for binary outputs: (body, header length).
fn binary_body(rows: &[Shaped]) -> (Vec<u8>, usize) {
    let inputs: Vec<Value> = rows
        .iter()
        .map(|(k, s, v)| json!({"name": k, "shape": s, "datatype": "FP32", "parameters": {"binary_data_size": v.len() * 4}}))
        .collect();
    let mut body =
        serde_json::to_vec(&json!({ "inputs": inputs, "parameters": {"binary_data_output": true} })).unwrap();
    let n = body.len();
    for (_, _, v) in rows {
        body.extend(v.iter().flat_map(|x| x.to_le_bytes()));
    }
    (body, n)
}

/// Rows `from..to` of a `[B, W]` tensor, as values.
fn row_values(t: &Tensor, from: usize, to: usize) -> Vec<f32> {
    let w = t.dims()[1];
    host(t)[from * w..to * w].to_vec()
}

/// The error text of a 400.
fn refusal(r: &pmstate_serve::client::Reply) -> String {
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    r.json()["error"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_lists_the_graphs_inputs_with_full_shapes_and_the_contract_is_served() {
    let p = Pipeline::load(checkpoint(), None).unwrap();
    let s = start(pipeline_options()).await;
    let meta = s.client.get("/v2/models/policy").await.unwrap().json();
    let inputs: Vec<(String, Value)> = meta["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            assert_eq!(i["datatype"], "FP32");
            (i["name"].as_str().unwrap().to_owned(), i["shape"].clone())
        })
        .collect();
    let want: Vec<(String, Value)> = p
        .inputs()
        .iter()
        .map(|i| {
            let shape: Vec<i64> = std::iter::once(-1).chain(i.row_shape.iter().map(|&d| d as i64)).collect();
            (i.name.clone(), json!(shape))
        })
        .collect();
    assert_eq!(inputs, want);
    // the recorded inputs are the graph's: every name, rank 2 and rank 3
    let recorded_names: Vec<String> = {
        let mut k: Vec<String> = recorded("inputs_b16.safetensors").into_keys().collect();
        k.sort();
        k
    };
    assert_eq!(inputs.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(), recorded_names);
    let shape_of = |name: &str| inputs.iter().find(|(n, _)| n == name).map(|(_, s)| s.clone());
    assert_eq!(shape_of("current_anchor_rot"), Some(json!([-1, 4])));
    assert_eq!(shape_of("mimic_future_dof_pos"), Some(json!([-1, 4, 29])));
    assert_eq!(
        meta["outputs"],
        json!([
            {"name": "actions", "datatype": "FP32", "shape": [-1, 29]},
            {"name": "joint_pos_targets", "datatype": "FP32", "shape": [-1, 29]},
            {"name": "stiffness_targets", "datatype": "FP32", "shape": [-1, 29]},
            {"name": "damping_targets", "datatype": "FP32", "shape": [-1, 29]},
        ])
    );

    // Triton's configuration: dims without the rows; the contract in pmstate's details
    let cfg = s.client.get("/v2/models/policy/config").await.unwrap().json();
    let dims =
        |name: &str| cfg["input"].as_array().unwrap().iter().find(|i| i["name"] == name).unwrap()["dims"].clone();
    assert_eq!(dims("mimic_future_dof_pos"), json!([4, 29]));
    assert_eq!(dims("current_dof_pos"), json!([29]));
    assert_eq!(cfg["pmstate"]["contract"]["type"], "unified_pipeline");
    assert_eq!(cfg["pmstate"]["contract"]["_runtime"]["onnx_in_names"], json!(recorded_names));

    // the contract as the exporter's YAML, for this version and by version
    for path in ["/v2/models/policy/contract", "/v2/models/policy/versions/1/contract"] {
        let r = s.client.get(path).await.unwrap();
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.header("content-type"), Some("application/yaml"));
        assert_eq!(String::from_utf8(r.body.to_vec()).unwrap(), p.contract().to_yaml(), "{path}");
    }
    assert_eq!(s.client.get("/v2/models/policy/versions/2/contract").await.unwrap().status, 404);
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();

    // a policy has no contract: 404 saying so
    let policy = start_variant("smpl_tracker").await;
    let r = policy.client.get("/v2/models/policy/contract").await.unwrap();
    assert_eq!(r.status, 404);
    assert!(r.json()["error"].as_str().unwrap().contains("not a pipeline"), "{:?}", r.json());
    assert!(policy.client.get("/v2/models/policy/config").await.unwrap().json()["pmstate"].get("contract").is_none());
    policy.server.handle().shutdown();
    policy.server.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn answers_equal_the_pipeline_bit_for_bit_batched_or_not_and_onnxruntime_within_the_bound() {
    let p = Arc::new(Pipeline::load(checkpoint(), None).unwrap());
    let all = Arc::new(recorded("inputs_b16.safetensors"));
    let every: Vec<usize> = (0..16).collect();
    let want = p.forward(&as_tensors(&shaped_rows(&all, &every))).unwrap();
    let s = start(pipeline_options()).await;
    let handle = s.server.handle();

    // one request of the 16 rows, binary in and out
    let (body, n) = binary_body(&shaped_rows(&all, &every));
    let got = outputs(&infer_binary(&s.client, body, n).await);
    assert_eq!(got.len(), 4);
    for (name, t) in want.named() {
        assert_eq!(got[name].0, [16, 29], "{name}");
        assert_eq!(bits(&got[name].1), bits(&host(t)), "{name}");
    }

    // 16 one-row JSON requests, all queued before any runs: merged into
    // one forward, each answered exactly as its row alone
    let paused = handle.pause();
    let mut tasks = vec![];
    for i in 0..16usize {
        let (c, all) = (s.client.clone(), all.clone());
        tasks.push(tokio::spawn(async move { (i, infer(&c, json_body(&shaped_rows(&all, &[i]))).await) }));
    }
    until_metric("16 queued requests", &handle, "pmstate_queue_depth", 16.0).await;
    drop(paused);
    for t in tasks {
        let (i, reply) = t.await.unwrap();
        let got = outputs(&reply);
        let alone = p.forward(&as_tensors(&shaped_rows(&all, &[i]))).unwrap();
        for ((name, a), (_, b16)) in alone.named().into_iter().zip(want.named()) {
            assert_eq!(got[name].0, [1, 29], "row {i} {name}");
            assert_eq!(bits(&got[name].1), bits(&host(a)), "row {i} {name}: not the row's own forward");
            assert_eq!(bits(&got[name].1), bits(&row_values(b16, i, i + 1)), "row {i} {name}: not its row of 16");
        }
    }
    let text = handle.metrics_text();
    assert_eq!(metric(&text, "pmstate_batch_requests_sum"), 17.0);
    assert_eq!(metric(&text, "pmstate_infer_rows_total"), 32.0);
    // the 16-row request alone, then the 16 one-row requests in at most 2
    let forwards = metric(&text, "pmstate_batch_requests_count");
    assert!((2.0..=3.0).contains(&forwards), "{forwards} forwards");

    // onnxruntime's recorded outputs: the gains to the bit; its actions and
    // ours within the policy crate's bound of the float64 forward; the PD
    // targets apart by at most what the actions are, times the scale (the
    // transform before the scale is 1-Lipschitz), plus rounding
    let ort = recorded("ort_b16.safetensors");
    for name in ["stiffness_targets", "damping_targets"] {
        assert_eq!(bits(&host(&ort[name])), bits(&host(want.named().iter().find(|(n, _)| *n == name).unwrap().1)));
    }
    let inputs = as_tensors(&shaped_rows(&all, &every));
    let reference = p.policy().actor_reference(&p.compute_observations(&inputs).unwrap()).unwrap();
    let (ours, theirs) = (host(&want.actions), host(&ort["actions"]));
    assert_eq!(pmstate_policy::bound::within(&ours, &reference, 1.0), None, "served actions");
    assert_eq!(pmstate_policy::bound::within(&theirs, &reference, 1.0), None, "onnxruntime's actions");
    let (t_ours, t_theirs) = (host(&want.joint_pos_targets), host(&ort["joint_pos_targets"]));
    let scale = &p.action().scale;
    for (k, (a, b)) in t_ours.iter().zip(&t_theirs).enumerate() {
        let room = f64::from(scale[k % 29].abs()) * (f64::from(ours[k]) - f64::from(theirs[k])).abs()
            + 4.0 * f64::from(f32::EPSILON) * (1.0 + f64::from(b.abs()));
        assert!((f64::from(*a) - f64::from(*b)).abs() <= room, "joint_pos_targets[{k}]: {a} against {b}");
    }

    // a reload (SIGHUP's path) swaps in the same pipeline as version 2
    handle.reload();
    until("version 2", || handle.version() == 2).await;
    assert!(s.events.all().iter().any(|e| matches!(e, Event::Reloaded { version: 2, .. })));
    let got = outputs(&infer(&s.client, json_body(&shaped_rows(&all, &[3]))).await);
    assert_eq!(bits(&got["actions"].1), bits(&row_values(&want.actions, 3, 4)));
    handle.shutdown();
    s.server.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_input_or_a_wrong_shape_is_a_400_naming_the_input_and_its_shape() {
    let all = recorded("inputs_b16.safetensors");
    let s = start(pipeline_options()).await;
    let one = shaped_rows(&all, &[0]);
    let without = |name: &str| one.iter().filter(|(k, _, _)| k != name).cloned().collect::<Vec<_>>();
    let reshaped = |name: &str, shape: &[usize]| {
        one.iter()
            .map(
                |(k, s, v)| {
                    if k == name {
                        (k.clone(), shape.to_vec(), v.clone())
                    } else {
                        (k.clone(), s.clone(), v.clone())
                    }
                },
            )
            .collect::<Vec<_>>()
    };

    let e = refusal(&infer(&s.client, json_body(&without("mimic_future_dof_pos"))).await);
    assert_eq!(e, "missing input mimic_future_dof_pos (shape [rows, 4, 29])");
    let e = refusal(&infer(&s.client, json_body(&without("current_anchor_rot"))).await);
    assert_eq!(e, "missing input current_anchor_rot (shape [rows, 4])");
    // the same values in another shape: transposed, flattened, without rows
    for (shape, text) in [(vec![1, 29, 4], "[1, 29, 4]"), (vec![1, 116], "[1, 116]"), (vec![4, 29], "[4, 29]")] {
        let e = refusal(&infer(&s.client, json_body(&reshaped("mimic_future_dof_pos", &shape))).await);
        assert_eq!(e, format!("input mimic_future_dof_pos: shape {text}, expected [rows, 4, 29] with rows >= 1"));
    }
    let e = refusal(&infer(&s.client, json_body(&reshaped("current_anchor_rot", &[1, 3]))).await);
    assert_eq!(e, "input current_anchor_rot: shape [1, 3], expected [rows, 4] with rows >= 1");
    // binary data of a wrong shape is refused the same way, before its bytes are read
    let (body, n) = binary_body(&reshaped("mimic_future_dof_pos", &[1, 29, 4]));
    let e = refusal(&infer_binary(&s.client, body, n).await);
    assert!(e.starts_with("input mimic_future_dof_pos: shape [1, 29, 4], expected [rows, 4, 29]"), "{e}");
    // data that does not fill the shape, or overflows it: named with the shape as sent
    let mut short = one.clone();
    for (k, _, v) in short.iter_mut() {
        if k == "mimic_future_dof_pos" {
            v.pop();
        }
    }
    let e = refusal(&infer(&s.client, json_body(&short)).await);
    assert_eq!(e, "input mimic_future_dof_pos: 115 values, but shape [1, 4, 29] needs 116");
    let mut long = one.clone();
    for (k, _, v) in long.iter_mut() {
        if k == "mimic_future_dof_pos" {
            v.push(0.0);
        }
    }
    let e = refusal(&infer(&s.client, json_body(&long)).await);
    assert_eq!(e, "input mimic_future_dof_pos: more values than shape [1, 4, 29] holds (116)");
    // an input the graph does not take
    let mut extra = one.clone();
    extra.push(("mimic_future_dof_acc".into(), vec![1, 4, 29], vec![0.0; 116]));
    let e = refusal(&infer(&s.client, json_body(&extra)).await);
    assert!(e.starts_with("unexpected input mimic_future_dof_acc: the model's inputs are current_anchor_rot"), "{e}");

    let text = s.server.handle().metrics_text();
    assert_eq!(metric(&text, "pmstate_infer_errors_total{kind=\"bad_input\"}"), 10.0);
    assert_eq!(metric(&text, "pmstate_batch_rows_count"), 0.0);
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}
