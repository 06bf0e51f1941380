//! The Open Inference Protocol against a real server: health, metadata,
//! configuration, and inference in JSON and with the binary extension,
//! compared bit for bit with `Policy::forward` / `Policy::sample` on the
//! same rows (the recorded smpl tracker and the AMP g1 policy).

use crate::common::*;
use candle_core::{Device, Tensor};
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
    // the smpl tracker's checkpoint fixes only 358 + 576 + 69 = 1003; the resolved configs'
    // observation components give each width (those record_policy.py recorded the observations with)
    let want: Vec<serde_json::Value> = recorded_widths("smpl_tracker")
        .into_iter()
        .map(|(k, w)| json!({"name": k, "datatype": "FP32", "shape": [-1, w]}))
        .collect();
    assert_eq!(m["inputs"], json!(want));
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
    let dims: Vec<_> = cfg["input"].as_array().unwrap().iter().map(|i| i["dims"].clone()).collect();
    let want: Vec<_> = recorded_widths("smpl_tracker").into_iter().map(|(_, w)| json!([w])).collect();
    assert_eq!(dims, want);
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

/// The g1 AMP tracker served, the same policy loaded here, and rows 0, 3
/// and 5 of its recorded observations (every key).
async fn g1_served() -> (Running, Policy, Rows) {
    let v = "g1_amp_deploy";
    let s = start_variant(v).await;
    let policy = Policy::load(testdata(v).join("last.ckpt"), None, &Device::Cpu).unwrap();
    let r = rows(&obs(v), &[0, 3, 5]);
    (s, policy, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amp_models_serve_the_discriminator_when_its_inputs_are_given() {
    let (s, policy, r) = g1_served().await;
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

/// The g1 AMP tracker's critic reads privileged observations a robot does
/// not have (`max_coords_obs`, `mimic_max_coords_target_poses`): a request
/// with the actor's inputs alone gets the actor's outputs, bit for bit as
/// with every input, and `value` only with the critic's inputs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_actors_inputs_alone_get_the_actors_outputs() {
    let (s, policy, r) = g1_served().await;
    let want = policy.forward(&tensors(&r)).unwrap();
    let actor_keys = policy.actor_keys();
    let critic_only: Vec<String> = policy
        .required_keys(pmstate_policy::Part::ActorCritic)
        .into_iter()
        .filter(|k| !actor_keys.contains(k))
        .collect();
    assert!(!critic_only.is_empty(), "g1_amp_deploy's critic reads keys of its own");
    let actor_only: Vec<_> = r.iter().filter(|(k, _, _)| actor_keys.contains(k)).cloned().collect();
    // the configuration marks every input the actor does not read optional, as Triton's
    let cfg = s.client.get("/v2/models/policy/config").await.unwrap().json();
    let optional: Vec<(String, bool)> = cfg["input"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["name"].as_str().unwrap().to_owned(), i.get("optional") == Some(&json!(true))))
        .collect();
    assert!(critic_only.iter().all(|k| optional.contains(&(k.clone(), true))), "{optional:?}");
    assert!(actor_keys.iter().all(|k| optional.contains(&(k.clone(), false))), "{optional:?}");

    // no outputs named: the actor's, not the value
    let got = outputs(&infer(&s.client, json_request(&actor_only, json!({}))).await);
    assert!(!got.contains_key("value") && !got.contains_key("disc_logits"), "{:?}", got.keys());
    assert_eq!(bits(&got["mean_action"].1), bits(&host(&want.mean_action)));
    assert_eq!(bits(&got["std"].1), bits(&host(&want.std)));
    assert_eq!(bits(&got["norm_obs"].1), bits(&host(want.norm_obs.as_ref().unwrap())));
    // sampled from the actor alone: Policy::sample's draw
    let sampled = policy.sample(&tensors(&r), 11).unwrap();
    let asked =
        json!({"parameters": {"sample": true, "seed": 11}, "outputs": [{"name": "action"}, {"name": "neglogp"}]});
    let got = outputs(&infer(&s.client, json_request(&actor_only, asked)).await);
    assert_eq!(bits(&got["action"].1), bits(&host(&sampled.action)));
    assert_eq!(bits(&got["neglogp"].1), bits(&host(&sampled.neglogp)));

    // the value without the critic's inputs: refused, naming one
    let reply = infer(&s.client, json_request(&actor_only, json!({"outputs": [{"name": "value"}]}))).await;
    assert_eq!(reply.status, 400);
    let msg = reply.json()["error"].as_str().unwrap().to_owned();
    assert!(critic_only.iter().any(|k| msg.contains(&format!("missing input {k}"))), "{msg}");
    // every input: the value by default, and the actor's outputs the same bits
    let got = outputs(&infer(&s.client, json_request(&r, json!({}))).await);
    assert_eq!(bits(&got["value"].1), bits(&host(&want.value)));
    assert_eq!(bits(&got["mean_action"].1), bits(&host(&want.mean_action)));
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_widths_are_in_the_metadata_and_refuse_another_split() {
    let ckpt = testdata("smpl_tracker").join("last.ckpt");
    let mut opts = options(ckpt.clone());
    // the third width follows from the sum 1003
    opts.widths = vec![("max_coords_obs".into(), 358), ("mimic_target_poses".into(), 576)];
    let s = start(opts).await;
    let m = s.client.get("/v2/models/policy").await.unwrap().json();
    assert_eq!(
        m["inputs"],
        json!([
            {"name": "max_coords_obs", "datatype": "FP32", "shape": [-1, 358]},
            {"name": "mimic_target_poses", "datatype": "FP32", "shape": [-1, 576]},
            {"name": "previous_actions", "datatype": "FP32", "shape": [-1, 69]},
        ])
    );
    let cfg = s.client.get("/v2/models/policy/config").await.unwrap().json();
    let dims: Vec<_> = cfg["input"].as_array().unwrap().iter().map(|i| i["dims"].clone()).collect();
    assert_eq!(dims, [json!([358]), json!([576]), json!([69])]);

    // one column moved from max_coords_obs to mimic_target_poses: still 1003 in all
    let o = obs("smpl_tracker");
    let mut r = rows(&o, &[0, 1]);
    let (a, b) = (&r[0].2, &r[1].2);
    let moved_a: Vec<f32> = a.chunks(358).flat_map(|row| row[..357].to_vec()).collect();
    let moved_b: Vec<f32> =
        b.chunks(576).zip(a.chunks(358)).flat_map(|(row, from)| [&[from[357]], row].concat()).collect();
    r[0] = ("max_coords_obs".into(), 357, moved_a);
    r[1] = ("mimic_target_poses".into(), 577, moved_b);
    let body = json_request(&r, json!({}));
    let reply = infer(&s.client, body.clone()).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.json()["error"], "input max_coords_obs: width 357, expected 358");
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();

    // without pins the resolved configs' widths refuse it the same way
    let s = start(options(ckpt.clone())).await;
    let reply = infer(&s.client, body.clone()).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.json()["error"], "input max_coords_obs: width 357, expected 358");
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();

    // pins take precedence over the configs: pinned to that split, it is accepted
    let mut opts = options(ckpt);
    opts.widths = vec![("max_coords_obs".into(), 357), ("mimic_target_poses".into(), 577)];
    let s = start(opts).await;
    let m = s.client.get("/v2/models/policy").await.unwrap().json();
    assert_eq!(m["inputs"][2], json!({"name": "previous_actions", "datatype": "FP32", "shape": [-1, 69]}));
    let reply = infer(&s.client, body).await;
    assert_eq!(outputs(&reply)["mean_action"].0, [2, 69]);
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_gives_every_bundled_policys_input_widths_where_derivable() {
    // every input of the real-config policies has its width: the checkpoint's, or the configs' where it
    // leaves one open; the synthetic policies' keys (obs_a, ...) are no observation component of their
    // configs, so where the checkpoint fixes only their sum they stay -1
    for v in ["smpl_tracker", "g1_amp_deploy", "container_obsprocessor", "module_ops_amp", "layernorm_activations"] {
        let s = start_variant(v).await;
        let m = s.client.get("/v2/models/policy").await.unwrap().json();
        let recorded = recorded_widths(v);
        for input in m["inputs"].as_array().unwrap() {
            let name = input["name"].as_str().unwrap();
            let want = recorded.iter().find(|(k, _)| k == name).map(|(_, w)| *w as i64).unwrap();
            let got = input["shape"][1].as_i64().unwrap();
            if v == "layernorm_activations" {
                assert_eq!(got, -1, "{v} {name}");
            } else {
                assert_eq!(got, want, "{v} {name}");
            }
        }
        s.server.handle().shutdown();
        s.server.wait().await.unwrap();
    }
}

/// The widths record_policy.py recorded a variant's observations with, in the
/// manifest's order (manifest.json `obs_widths`).
fn recorded_widths(variant: &str) -> Vec<(String, usize)> {
    let text = std::fs::read_to_string(testdata(variant).join("../manifest.json")).unwrap();
    let m: serde_json::Value = serde_json::from_str(&text).unwrap();
    let v = m["variants"].as_array().unwrap().iter().find(|x| x["name"] == variant).unwrap();
    let order =
        v["model_in_keys"].as_array().map(|a| a.iter().map(|k| k.as_str().unwrap().to_owned()).collect::<Vec<_>>());
    let w = v["obs_widths"].as_object().unwrap();
    let keys = order.unwrap_or_else(|| w.keys().cloned().collect());
    keys.into_iter().filter_map(|k| w.get(&k).and_then(|x| x.as_u64()).map(|x| (k, x as usize))).collect()
}

/// The `count` buffer of a normalizer, read from the checkpoint itself (through pmstate-ckpt's safetensors export).
fn saved_count(ckpt: &std::path::Path, key: &str) -> i64 {
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("c.safetensors");
    pmstate_ckpt::Checkpoint::open(ckpt).unwrap().save(&st).unwrap();
    let m = candle_core::safetensors::load(&st, &Device::Cpu).unwrap();
    m[key].to_dtype(candle_core::DType::F64).unwrap().flatten_all().unwrap().to_vec1::<f64>().unwrap()[0] as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configuration_reports_normalizer_counts_checkpoint_and_load() {
    // Welford normalizers: their count is the number of samples seen in training
    let ckpt = testdata("welford_clamps").join("last.ckpt");
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let s = start(options(ckpt.clone())).await;
    let after = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let cfg = s.client.get("/v2/models/policy/config").await.unwrap().json();
    let p = &cfg["pmstate"];
    let nets = p["description"]["networks"].as_array().unwrap();
    let norm = |role: &str| nets.iter().find(|n| n["role"] == role).unwrap()["modules"][0]["normalizer"].clone();
    let (actor, critic) = (norm("actor"), norm("critic"));
    assert_eq!(actor["count"], saved_count(&ckpt, "model._actor.mu.norm.running_obs_norm.count"));
    assert_eq!(critic["count"], saved_count(&ckpt, "model._critic.norm.running_obs_norm.count"));
    assert_eq!(actor["count"], 4801);
    assert_eq!(actor["ema"], false);
    // the checkpoint: its path, configs file, size and sha256 as on disk
    let prov = &p["provenance"];
    assert_eq!(prov["checkpoint"], ckpt.display().to_string());
    assert_eq!(prov["config"], testdata("welford_clamps").join("resolved_configs.pt").display().to_string());
    let bytes = std::fs::read(&ckpt).unwrap();
    assert_eq!(prov["bytes"], bytes.len());
    let sha: String = sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(&bytes))
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(prov["sha256"], sha);
    // when it was loaded (during start) and that the load took some time
    let at = prov["loaded_at_unix"].as_f64().unwrap();
    assert!((before..=after).contains(&at), "{before} <= {at} <= {after}");
    let took = prov["load_seconds"].as_f64().unwrap();
    assert!(took > 0.0 && took.is_finite(), "{took}");
    assert_eq!(p["reloads"], json!({"ok": 0, "failed": 0}));
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}

/// (le, cumulative count) of every bucket of a histogram in the metrics text.
fn buckets(text: &str, name: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{le=\"");
    text.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(|rest| {
            let (le, count) = rest.split_once("\"} ").unwrap();
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap() };
            (le, count.trim().parse().unwrap())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_by_outcome_latency_and_forwards() {
    let s = start_variant("smpl_tracker").await;
    let o = obs("smpl_tracker");
    // three answered (1, 2 and 3 rows, one after the other: one forward each), two refused, one unknown model
    for n in 1..=3usize {
        let (body, _) = row_request(&o, &(0..n).collect::<Vec<_>>(), json!({}));
        assert_eq!(infer(&s.client, body).await.status, 200);
    }
    for _ in 0..2 {
        assert_eq!(infer(&s.client, b"{\"inputs\": []}".to_vec()).await.status, 400);
    }
    let (body, _) = row_request(&o, &[0], json!({}));
    let r = s.client.post("/v2/models/other/infer", body, &[]).await.unwrap();
    assert_eq!(r.status, 404);

    let text = String::from_utf8(s.client.get("/metrics").await.unwrap().body.to_vec()).unwrap();
    // every inference request, by outcome: 3 answered + the refusals by kind
    assert_eq!(metric(&text, "pmstate_infer_requests_total "), 6.0);
    assert_eq!(metric(&text, "pmstate_infer_errors_total{kind=\"bad_input\"}"), 2.0);
    assert_eq!(metric(&text, "pmstate_infer_errors_total{kind=\"not_found\"}"), 1.0);
    let kinds = pmstate_serve::RequestError::KINDS;
    let refused: f64 =
        kinds.iter().map(|k| metric(&text, &format!("pmstate_infer_errors_total{{kind=\"{k}\"}}"))).sum();
    assert_eq!(refused, 3.0);
    assert_eq!(metric(&text, "pmstate_infer_rows_total"), 6.0);
    // the latency histogram: every request observed, buckets cumulative up to +Inf
    let lat = buckets(&text, "pmstate_request_duration_seconds");
    assert_eq!(lat.len(), 21, "20 exponential buckets from 25 µs, and +Inf");
    assert_eq!(lat[0].0, 25e-6);
    assert!(lat.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1), "{lat:?}");
    assert_eq!(lat.last().unwrap(), &(f64::INFINITY, 6.0));
    assert_eq!(metric(&text, "pmstate_request_duration_seconds_count"), 6.0);
    assert!(metric(&text, "pmstate_request_duration_seconds_sum") > 0.0);
    // the forward: one per answered request, of 1, 2 and 3 rows
    let fwd = buckets(&text, "pmstate_forward_duration_seconds");
    assert_eq!(fwd.last().unwrap(), &(f64::INFINITY, 3.0));
    assert!(fwd.windows(2).all(|w| w[0].1 <= w[1].1));
    assert_eq!(metric(&text, "pmstate_forward_duration_seconds_count"), 3.0);
    assert!(metric(&text, "pmstate_forward_duration_seconds_sum") > 0.0);
    assert_eq!(buckets(&text, "pmstate_batch_rows")[..3], [(1.0, 1.0), (2.0, 2.0), (4.0, 3.0)]);
    assert_eq!(metric(&text, "pmstate_batch_rows_sum"), 6.0);
    assert_eq!(metric(&text, "pmstate_requests_in_flight"), 0.0);
    assert_eq!(metric(&text, "pmstate_body_bytes_reserved"), 0.0);
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}

/// An FSQ tracker's server lists `latent_codes` among its outputs and
/// answers with the codes the decoder consumed, bit for bit the library's,
/// row by row across a batch; a tracker without a quantizer has no such output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fsq_tracker_serves_its_latent_codes() {
    let s = start_variant("soma_fsq_tracker").await;
    let m = s.client.get("/v2/models/policy").await.unwrap().json();
    let codes = m["outputs"].as_array().unwrap().iter().find(|o| o["name"] == "latent_codes").cloned();
    assert_eq!(codes, Some(json!({"name": "latent_codes", "datatype": "FP32", "shape": [-1, 40]})), "{m}");
    let o = obs("soma_fsq_tracker");
    let policy = Policy::load(testdata("soma_fsq_tracker").join("last.ckpt"), None, &Device::Cpu).unwrap();
    let want = policy.forward(&o).unwrap().latent_codes.unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let idx: Vec<usize> = (0..8).collect();
    let (body, _) = row_request(&o, &idx, json!({"outputs": [{"name": "latent_codes"}, {"name": "mean_action"}]}));
    let got = outputs(&infer(&s.client, body).await);
    let (shape, values) = &got["latent_codes"];
    assert_eq!(shape, &vec![8, 40]);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(values), bits(&want));
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
    let s = start_variant("smpl_tracker").await;
    let m = s.client.get("/v2/models/policy").await.unwrap().json();
    assert!(m["outputs"].as_array().unwrap().iter().all(|o| o["name"] != "latent_codes"), "{m}");
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}

/// A MaskedMimic model: `vae_noise` an optional input of the metadata and
/// the configuration, the four outputs, answers bit for bit the library's
/// with the noise and without it (the prior mean), rows split across a
/// request of several rows; a noise of the wrong width is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_masked_mimic_model_serves_with_an_optional_vae_noise() {
    use pmstate_policy::MaskedMimic;
    let s = start_variant("masked_mimic").await;
    let m = s.client.get("/v2/models/policy").await.unwrap().json();
    let noise = m["inputs"].as_array().unwrap().iter().find(|i| i["name"] == "vae_noise").cloned();
    assert_eq!(noise, Some(json!({"name": "vae_noise", "datatype": "FP32", "shape": [-1, 8]})), "{m}");
    let names: Vec<&str> = m["outputs"].as_array().unwrap().iter().map(|o| o["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["mean_action", "latent_mu", "latent_logvar", "latent"], "{m}");
    let cfg = s.client.get("/v2/models/policy/config").await.unwrap().json();
    let inputs = cfg["input"].as_array().unwrap();
    assert!(inputs.iter().any(|i| i["name"] == "vae_noise" && i["optional"] == true), "{cfg}");
    assert!(inputs.iter().filter(|i| i["name"] != "vae_noise").all(|i| i.get("optional").is_none()), "{cfg}");
    assert_eq!(cfg["pmstate"]["description"]["transformers"][0]["heads"], 4, "{cfg}");

    let model = MaskedMimic::load(testdata("masked_mimic").join("last.ckpt"), None, &Device::Cpu).unwrap();
    let bits =
        |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let vbits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let idx: Vec<usize> = (0..8).collect();
    // with the noise
    let o = obs("masked_mimic");
    let want = model.forward(&o).unwrap();
    let (body, _) = row_request(&o, &idx, json!({}));
    let got = outputs(&infer(&s.client, body).await);
    for (name, t) in [
        ("mean_action", &want.mean_action),
        ("latent_mu", &want.latent_mu),
        ("latent_logvar", &want.latent_logvar),
        ("latent", &want.latent),
    ] {
        assert_eq!(got[name].0, t.dims().to_vec(), "{name}");
        assert_eq!(vbits(&got[name].1), bits(t), "{name}");
    }
    // without it: the library's zero-noise answer
    let mut quiet = o.clone();
    quiet.remove("vae_noise");
    let want = model.forward(&quiet).unwrap();
    let (body, _) = row_request(&quiet, &idx, json!({}));
    let got = outputs(&infer(&s.client, body).await);
    assert_eq!(vbits(&got["mean_action"].1), bits(&want.mean_action));
    assert_eq!(vbits(&got["latent"].1), bits(&want.latent_mu));
    // the wrong width is refused naming the input
    let mut bad = o.clone();
    bad.insert("vae_noise".into(), Tensor::zeros((8, 3), candle_core::DType::F32, &Device::Cpu).unwrap());
    let (body, _) = row_request(&bad, &idx, json!({}));
    let r = infer(&s.client, body).await;
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert!(String::from_utf8_lossy(&r.body).contains("vae_noise"), "{}", String::from_utf8_lossy(&r.body));
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}
