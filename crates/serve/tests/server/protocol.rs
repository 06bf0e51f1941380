//! The Open Inference Protocol against a real server: health, metadata,
//! configuration, and inference in JSON and with the binary extension,
//! compared bit for bit with `Policy::forward` / `Policy::sample` on the
//! same rows (the recorded smpl tracker and the AMP g1 policy).

use crate::common::*;
use candle_core::Device;
use pmstate_policy::Policy;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_metadata() {
    let s = start_variant("smpl_tracker").await;
    let c = &s.client;
    let r = c.get("/v2/health/live").await.unwrap();
    assert_eq!((r.status, r.json()), (200, json!({"live": true})));
    let r = c.get("/v2/health/ready").await.unwrap();
    assert_eq!((r.status, r.json()), (200, json!({"ready": true})));
    let r = c.get("/v2").await.unwrap();
    assert_eq!(r.json()["name"], "pmstate");
    assert!(r.json()["extensions"].as_array().unwrap().contains(&json!("binary_tensor_data")));
    let r = c.get("/v2/models/policy/ready").await.unwrap();
    assert_eq!((r.status, r.json()), (200, json!({"name": "policy", "ready": true})));

    let m = c.get("/v2/models/policy").await.unwrap().json();
    assert_eq!(m["name"], "policy");
    assert_eq!(m["versions"], json!(["1"]));
    // the smpl tracker fixes only 358 + 576 + 69 = 1003: each width is open (-1)
    assert_eq!(
        m["inputs"],
        json!([
            {"name": "max_coords_obs", "datatype": "FP32", "shape": [-1, -1]},
            {"name": "mimic_target_poses", "datatype": "FP32", "shape": [-1, -1]},
            {"name": "previous_actions", "datatype": "FP32", "shape": [-1, -1]},
        ])
    );
    let outs: Vec<(String, serde_json::Value)> = m["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (o["name"].as_str().unwrap().to_owned(), o["shape"].clone()))
        .collect();
    assert_eq!(
        outs,
        [
            ("mean_action".into(), json!([-1, 69])),
            ("value".into(), json!([-1, 1])),
            ("std".into(), json!([69])),
            ("norm_obs".into(), json!([-1, 1003])),
            ("action".into(), json!([-1, 69])),
            ("neglogp".into(), json!([-1])),
        ]
    );
    assert_eq!(c.get("/v2/models/policy/versions/1").await.unwrap().status, 200);
    assert_eq!(c.get("/v2/models/policy/versions/2").await.unwrap().status, 404);
    assert_eq!(c.get("/v2/models/other").await.unwrap().status, 404);

    // the configuration: Triton's fields, and the details beyond the protocol
    let cfg = c.get("/v2/models/policy/config").await.unwrap().json();
    assert_eq!(cfg["max_batch_size"], 256);
    assert_eq!(cfg["input"][0], json!({"name": "max_coords_obs", "data_type": "TYPE_FP32", "dims": [-1]}));
    let p = &cfg["pmstate"];
    assert_eq!(p["version"], "1");
    assert_eq!(p["provenance"]["device"], "cpu");
    let sha = p["provenance"]["sha256"].as_str().unwrap();
    assert_eq!(sha.len(), 64);
    assert!(p["description"]["model"].as_str().unwrap().ends_with(".PPOModel"));
    assert_eq!(p["description"]["networks"][0]["modules"][0]["normalizer"]["clamp"], 5);
    assert!(p["description"]["networks"][0]["modules"][0]["layers"][0].as_str().unwrap().starts_with("1003->"));
    assert_eq!(p["width_sums"][0]["total"], 1003);

    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_and_binary_inference_match_the_policy_bit_for_bit() {
    let v = "smpl_tracker";
    let s = start_variant(v).await;
    let policy = Policy::load(testdata(v).join("last.ckpt"), None, &Device::Cpu).unwrap();
    let o = obs(v);
    let all: Vec<usize> = (0..8).collect();
    let r = rows(&o, &all);
    let want = policy.forward(&tensors(&r)).unwrap();

    // JSON, every default output
    let got = outputs(&infer(&s.client, json_request(&r, json!({"id": "req-1"}))).await);
    assert_eq!(got["mean_action"].0, [8, 69]);
    assert_eq!(bits(&got["mean_action"].1), bits(&host(&want.mean_action)));
    assert_eq!(bits(&got["value"].1), bits(&host(&want.value)));
    assert_eq!(got["std"].0, [69]);
    assert_eq!(bits(&got["std"].1), bits(&host(&want.std)));
    assert_eq!(bits(&got["norm_obs"].1), bits(&host(want.norm_obs.as_ref().unwrap())));
    assert!(!got.contains_key("action"), "actions only when asked to sample");
    // the clamped row (+-1000 alternating) is in there too
    let reply = infer(&s.client, json_request(&r, json!({"id": "req-1"}))).await;
    assert_eq!(reply.json()["id"], "req-1");
    assert_eq!(reply.json()["model_version"], "1");

    // binary in, binary out (what tritonclient does with binary_data=True)
    let (body, n) = binary_request(&r, json!({"parameters": {"binary_data_output": true}}));
    let reply = infer_binary(&s.client, body, n).await;
    assert_eq!(reply.header("content-type"), Some("application/octet-stream"));
    let got = outputs(&reply);
    assert_eq!(bits(&got["mean_action"].1), bits(&host(&want.mean_action)));
    assert_eq!(bits(&got["value"].1), bits(&host(&want.value)));

    // sampling: the request's seed, as Policy::sample on these rows; outputs selected, mixed JSON/binary
    let sampled = policy.sample(&tensors(&r), 7).unwrap();
    let (body, n) = binary_request(
        &r,
        json!({
            "parameters": {"sample": true, "seed": 7},
            "outputs": [{"name": "action", "parameters": {"binary_data": true}}, {"name": "neglogp"}]
        }),
    );
    let reply = infer_binary(&s.client, body, n).await;
    let head: serde_json::Value = serde_json::from_slice(
        &reply.body[..reply.header("inference-header-content-length").unwrap().parse().unwrap()],
    )
    .unwrap();
    let names: Vec<&str> = head["outputs"].as_array().unwrap().iter().map(|o| o["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["action", "neglogp"]);
    let got = outputs(&reply);
    assert_eq!(bits(&got["action"].1), bits(&host(&sampled.action)));
    assert_eq!(bits(&got["neglogp"].1), bits(&host(&sampled.neglogp)));

    // nested data (the protocol allows either layout)
    let nested: Vec<serde_json::Value> = r
        .iter()
        .map(|(k, w, vals)| {
            let rows: Vec<Vec<f32>> = vals.chunks(*w).map(|c| c.to_vec()).collect();
            json!({"name": k, "shape": [8, w], "datatype": "FP32", "data": rows})
        })
        .collect();
    let body = serde_json::to_vec(&json!({"inputs": nested, "outputs": [{"name": "mean_action"}]})).unwrap();
    let got = outputs(&infer(&s.client, body).await);
    assert_eq!(bits(&got["mean_action"].1), bits(&host(&want.mean_action)));

    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amp_models_serve_the_discriminator_when_its_inputs_are_given() {
    let v = "g1_amp_deploy";
    let s = start_variant(v).await;
    let policy = Policy::load(testdata(v).join("last.ckpt"), None, &Device::Cpu).unwrap();
    let o = obs(v);
    let r = rows(&o, &[0, 3, 5]);
    let got = outputs(&infer(&s.client, json_request(&r, json!({}))).await);
    let t = tensors(&r);
    let f = policy.forward(&t).unwrap();
    let d = policy.discriminate(&t).unwrap();
    assert_eq!(bits(&got["mean_action"].1), bits(&host(&f.mean_action)));
    assert_eq!(bits(&got["disc_logits"].1), bits(&host(&d.disc_logits)));
    assert_eq!(bits(&got["disc_reward"].1), bits(&host(&d.disc_reward)));
    assert_eq!(bits(&got["disc_value"].1), bits(&host(&d.disc_value)));
    // only the actor-critic inputs: the discriminator outputs are left out by default
    let disc_only = policy.required_keys(pmstate_policy::Part::Discriminator);
    let ac_only: Vec<_> = r
        .iter()
        .filter(|(k, _, _)| policy.required_keys(pmstate_policy::Part::ActorCritic).contains(k))
        .cloned()
        .collect();
    let got = outputs(&infer(&s.client, json_request(&ac_only, json!({}))).await);
    assert!(got.contains_key("mean_action") && !got.contains_key("disc_logits"));
    // and asking for them without their inputs names the missing one
    let reply = infer(&s.client, json_request(&ac_only, json!({"outputs": [{"name": "disc_reward"}]}))).await;
    assert_eq!(reply.status, 400);
    let msg = reply.json()["error"].as_str().unwrap().to_owned();
    assert!(disc_only.iter().any(|k| msg.contains(&format!("missing input {k}"))), "{msg}");
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}
