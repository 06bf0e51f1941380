//! A GPC prior served: INT64 `prior_tokens` in and out, teacher forcing
//! and seeded generation bit for bit the library's (`LatentPrior`),
//! whatever a request is batched with, and the refusals of its inputs.

use std::collections::HashMap;
use std::time::Duration;

use crate::common::*;
use candle_core::{Device, Tensor};
use pmstate_policy::gpc::LatentPrior;
use pmstate_serve::client::Reply;
use pmstate_serve::Batching;
use serde_json::{json, Value};

const CKPT: &str = "inference_last.ckpt";
const OBS: &str = "max_coords_obs";
const TOKENS: &str = "prior_tokens";

fn prior() -> LatentPrior {
    LatentPrior::load_with(
        testdata("gpc_prior").join(CKPT),
        None,
        &Device::Cpu,
        &pmstate_policy::LoadOptions::default(),
    )
    .unwrap()
}

/// The recorded rows `a..b`: the observations (f32 `[n, 343]`) and the tokens (i64 `[n, 20]`).
fn recorded(a: usize, b: usize) -> (Vec<f32>, Vec<i64>) {
    let o = candle_core::safetensors::load(testdata("gpc_prior").join("obs.safetensors"), &Device::Cpu).unwrap();
    let obs = o[OBS].narrow(0, a, b - a).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let tokens = o[TOKENS].narrow(0, a, b - a).unwrap().flatten_all().unwrap().to_vec1::<i64>().unwrap();
    (obs, tokens)
}

/// The library's inputs for `obs` (and `tokens`, when teacher forced).
fn lib_inputs(obs: &[f32], tokens: Option<&[i64]>) -> HashMap<String, Tensor> {
    let n = obs.len() / 343;
    let mut m = HashMap::from([(OBS.to_owned(), Tensor::from_vec(obs.to_vec(), (n, 343), &Device::Cpu).unwrap())]);
    if let Some(t) = tokens {
        m.insert(TOKENS.to_owned(), Tensor::from_vec(t.to_vec(), (n, 20), &Device::Cpu).unwrap());
    }
    m
}

/// A JSON request; `tokens` an INT64 input of `[n, width]` when given.
fn json_body(obs: &[f32], tokens: Option<(&Value, usize)>, extra: Value) -> Vec<u8> {
    let n = obs.len() / 343;
    let mut inputs = vec![json!({"name": OBS, "shape": [n, 343], "datatype": "FP32", "data": obs})];
    if let Some((data, width)) = tokens {
        inputs.push(json!({"name": TOKENS, "shape": [n, width], "datatype": "INT64", "data": data}));
    }
    let mut req = json!({ "inputs": inputs });
    if let Value::Object(m) = extra {
        for (k, v) in m {
            req[k] = v;
        }
    }
    serde_json::to_vec(&req).unwrap()
}

/// Outputs of a reply: name -> (datatype, shape, f32 values, i64 values).
type Served = HashMap<String, (String, Vec<usize>, Vec<f32>, Vec<i64>)>;

/// Every output of a reply.
fn prior_outputs(r: &Reply) -> Served {
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let json_len = r.header("inference-header-content-length").map_or(r.body.len(), |h| h.parse().unwrap());
    let head: Value = serde_json::from_slice(&r.body[..json_len]).unwrap();
    let mut bin = &r.body[json_len..];
    let mut out = HashMap::new();
    for o in head["outputs"].as_array().unwrap() {
        let shape: Vec<usize> = o["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
        let dt = o["datatype"].as_str().unwrap().to_owned();
        let (mut f, mut i) = (vec![], vec![]);
        match o["parameters"]["binary_data_size"].as_u64() {
            Some(n) => {
                let (mine, rest) = bin.split_at(n as usize);
                bin = rest;
                if dt == "INT64" {
                    i = mine.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect();
                } else {
                    f = mine.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
                }
            }
            None if dt == "INT64" => i = o["data"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect(),
            None => f = o["data"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect(),
        }
        out.insert(o["name"].as_str().unwrap().to_owned(), (dt, shape, f, i));
    }
    assert!(bin.is_empty(), "binary data left over");
    out
}

fn tbits(t: &Tensor) -> Vec<u32> {
    bits(&host(t))
}

fn ints(t: &Tensor) -> Vec<i64> {
    t.flatten_all().unwrap().to_vec1::<i64>().unwrap()
}

/// The served outputs against the library's: logits, mean_action and latent_codes bit for bit.
fn assert_same(got: &Served, want: &pmstate_policy::gpc::PriorOutputs, what: &str) {
    for (name, t) in
        [("logits", &want.logits), ("mean_action", &want.mean_action), ("latent_codes", &want.latent_codes)]
    {
        assert_eq!(got[name].0, "FP32", "{what}: {name}");
        assert_eq!(got[name].1, t.dims(), "{what}: {name}");
        assert_eq!(bits(&got[name].2), tbits(t), "{what}: {name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpc_prior_serves_int64_tokens_teacher_forced_in_json_and_binary() {
    let s = start(options(testdata("gpc_prior").join(CKPT))).await;
    // metadata: the observation, then the optional INT64 tokens
    let m = s.client.get("/v2/models/policy").await.unwrap().json();
    assert_eq!(
        m["inputs"],
        json!([
            {"name": OBS, "datatype": "FP32", "shape": [-1, 343]},
            {"name": TOKENS, "datatype": "INT64", "shape": [-1, 20]},
        ]),
        "{m}"
    );
    assert_eq!(
        m["outputs"],
        json!([
            {"name": "logits", "datatype": "FP32", "shape": [-1, 20, 81]},
            {"name": "mean_action", "datatype": "FP32", "shape": [-1, 66]},
            {"name": "latent_codes", "datatype": "FP32", "shape": [-1, 40]},
            {"name": TOKENS, "datatype": "INT64", "shape": [-1, 20]},
        ]),
        "{m}"
    );
    let cfg = s.client.get("/v2/models/policy/config").await.unwrap().json();
    assert_eq!(
        cfg["input"][1],
        json!({"name": TOKENS, "data_type": "TYPE_INT64", "dims": [20], "optional": true}),
        "{cfg}"
    );
    assert_eq!(cfg["input"][0]["data_type"], "TYPE_FP32", "{cfg}");
    assert_eq!(cfg["output"][3]["data_type"], "TYPE_INT64", "{cfg}");
    assert_eq!(cfg["pmstate"]["description"]["vocab"], 81, "{cfg}");

    let p = prior();
    let (obs, tokens) = recorded(0, 8);
    let want = p.teacher_forced(&lib_inputs(&obs, Some(&tokens))).unwrap();
    // JSON, tokens nested by row
    let nested: Vec<Vec<i64>> = tokens.chunks(20).map(<[i64]>::to_vec).collect();
    let got = prior_outputs(&infer(&s.client, json_body(&obs, Some((&json!(nested), 20)), json!({}))).await);
    assert_same(&got, &want, "JSON");
    assert!(!got.contains_key(TOKENS), "teacher forcing returns no tokens");
    // binary in and out: 8-byte little-endian tokens
    let head = json!({
        "inputs": [
            {"name": OBS, "shape": [8, 343], "datatype": "FP32", "parameters": {"binary_data_size": obs.len() * 4}},
            {"name": TOKENS, "shape": [8, 20], "datatype": "INT64", "parameters": {"binary_data_size": tokens.len() * 8}},
        ],
        "parameters": {"binary_data_output": true},
    });
    let mut body = serde_json::to_vec(&head).unwrap();
    let n = body.len();
    obs.iter().for_each(|x| body.extend_from_slice(&x.to_le_bytes()));
    tokens.iter().for_each(|x| body.extend_from_slice(&x.to_le_bytes()));
    let got = prior_outputs(&infer_binary(&s.client, body, n).await);
    assert_same(&got, &want, "binary");
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}

/// Three requests merged into one batch (max_batch 8 = their rows, a long
/// max_wait: the batch runs when full): two generate under their own seeds,
/// one is teacher forced. Each gets bit for bit what the library gives its
/// rows alone: generation draws row `i` of a request from (its seed, `i`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn generation_is_seeded_and_the_same_whatever_a_request_is_batched_with() {
    let mut opts = options(testdata("gpc_prior").join(CKPT));
    opts.batching = Batching { max_batch: 8, max_wait: Duration::from_secs(60), queue: 16, ..Batching::default() };
    let s = start(opts).await;
    let p = prior();
    let plan: [(usize, usize, Option<u64>); 3] = [(0, 3, Some(7)), (3, 5, Some(11)), (5, 8, None)];
    let mut tasks = vec![];
    for (a, b, seed) in plan {
        let c = s.client.clone();
        let (obs, tokens) = recorded(a, b);
        let body = match seed {
            Some(seed) => json_body(&obs, None, json!({"parameters": {"sample": true, "seed": seed}})),
            None => json_body(&obs, Some((&json!(tokens), 20)), json!({})),
        };
        tasks.push(tokio::spawn(async move { infer(&c, body).await }));
    }
    let mut first_three = vec![];
    for ((a, b, seed), t) in plan.into_iter().zip(tasks) {
        let got = prior_outputs(&t.await.unwrap());
        let (obs, tokens) = recorded(a, b);
        match seed {
            Some(seed) => {
                let want = p.generate(&lib_inputs(&obs, None), p.sampling(seed)).unwrap();
                assert_eq!(got[TOKENS].0, "INT64");
                assert_eq!(got[TOKENS].1, [b - a, 20]);
                assert_eq!(got[TOKENS].3, ints(&want.tokens), "rows {a}..{b}");
                assert_same(&got, &want, &format!("generated rows {a}..{b}"));
                if a == 0 {
                    first_three = got[TOKENS].3.clone();
                }
            }
            None => {
                let want = p.teacher_forced(&lib_inputs(&obs, Some(&tokens))).unwrap();
                assert_same(&got, &want, "teacher forced rows 5..8");
            }
        }
    }
    // one batch (two forwards: the generating group and the teacher-forced one)
    let text = s.server.handle().metrics_text();
    assert_eq!(metric(&text, "pmstate_batch_requests_sum"), 3.0);
    assert_eq!(metric(&text, "pmstate_batch_requests_count"), 2.0);
    assert_eq!(metric(&text, "pmstate_batch_rows_sum"), 8.0);

    // seed 7 again, on all 8 rows (a full batch: no wait): its first 3 rows
    // draw as the request of rows 0..3 did; another seed draws other tokens
    let (obs, _) = recorded(0, 8);
    let sample = |seed: u64| json!({"parameters": {"sample": true, "seed": seed}});
    let again = prior_outputs(&infer(&s.client, json_body(&obs, None, sample(7))).await);
    let want = p.generate(&lib_inputs(&obs, None), p.sampling(7)).unwrap();
    assert_eq!(again[TOKENS].3, ints(&want.tokens));
    assert_eq!(again[TOKENS].3[..60], first_three[..]);
    let other = prior_outputs(&infer(&s.client, json_body(&obs, None, sample(8))).await);
    assert_ne!(other[TOKENS].3, again[TOKENS].3);
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}

/// What a GPC prior refuses, each with 400 naming the input and what is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_are_refused_naming_the_input() {
    let mut opts = options(testdata("gpc_prior").join(CKPT));
    opts.batching.max_batch = 20_000;
    let s = start(opts).await;
    let (obs, tokens) = recorded(0, 2);
    let refused = |r: Reply| {
        let text = String::from_utf8_lossy(&r.body).into_owned();
        assert_eq!(r.status, 400, "{text}");
        text
    };
    let mut bad = tokens.clone();
    bad[23] = 81;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        // the wrong datatype
        (
            serde_json::to_vec(&json!({"inputs": [
                {"name": OBS, "shape": [2, 343], "datatype": "FP32", "data": obs},
                {"name": TOKENS, "shape": [2, 20], "datatype": "FP32", "data": tokens},
            ]}))
            .unwrap(),
            "input prior_tokens: datatype FP32, expected INT64",
        ),
        // the wrong number of tokens
        (json_body(&obs, Some((&json!(tokens[..38]), 19)), json!({})), "input prior_tokens: width 19, expected 20"),
        // outside the vocabulary: row 1, position 3
        (
            json_body(&obs, Some((&json!(bad), 20)), json!({})),
            "input prior_tokens: row 1, position 3: 81 is outside [0, 81)",
        ),
        // not integers, or past int64
        (
            json_body(&obs, Some((&json!([[2.5]]), 20)), json!({})),
            "input prior_tokens: element 0 (2.5) is not an integer",
        ),
        (
            json_body(&obs, Some((&json!([1, 2, 9_223_372_036_854_775_808u64]), 20)), json!({})),
            "input prior_tokens: element 2 (9223372036854775808) is outside the int64 range",
        ),
        // neither tokens nor sampling, and both
        (json_body(&obs, None, json!({})), "missing input prior_tokens (INT64 [rows, 20])"),
        (
            json_body(&obs, Some((&json!(tokens), 20)), json!({"parameters": {"sample": true}})),
            "input prior_tokens is given and the request samples",
        ),
    ];
    for (body, want) in cases {
        let text = refused(infer(&s.client, body).await);
        assert!(text.contains(want), "{want}: {text}");
    }
    // binary tokens sized as FP32
    let head = json!({"inputs": [
        {"name": OBS, "shape": [2, 343], "datatype": "FP32", "parameters": {"binary_data_size": obs.len() * 4}},
        {"name": TOKENS, "shape": [2, 20], "datatype": "INT64", "parameters": {"binary_data_size": 160}},
    ]});
    let mut body = serde_json::to_vec(&head).unwrap();
    let n = body.len();
    obs.iter().for_each(|x| body.extend_from_slice(&x.to_le_bytes()));
    body.extend_from_slice(&[0u8; 160]);
    let text = refused(infer_binary(&s.client, body, n).await);
    assert!(text.contains("binary_data_size 160, but INT64 shape [2, 20] needs 320 bytes"), "{text}");

    // too many logits: one row more than 2^24 / (20 x 81) is refused before any forward
    let per_row = 20 * 81;
    let rows = pmstate_serve::model::MAX_LOGITS_PER_FORWARD / per_row + 1;
    let head = json!({"inputs": [
        {"name": OBS, "shape": [rows, 343], "datatype": "FP32", "parameters": {"binary_data_size": rows * 343 * 4}},
    ], "parameters": {"sample": true}});
    let mut body = serde_json::to_vec(&head).unwrap();
    let n = body.len();
    body.resize(n + rows * 343 * 4, 0);
    let text = refused(infer_binary(&s.client, body, n).await);
    assert!(
        text.contains(&format!("{rows} rows make {per_row} logits each"))
            && text.contains(&format!("send at most {} rows", rows - 1)),
        "{text}"
    );
    let m = s.server.handle().metrics_text();
    assert_eq!(metric(&m, "pmstate_batch_requests_count"), 0.0, "no forward ran");
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}

/// Answers in flight are bounded: each request reserves a bound of its
/// answer before it is queued and gives it back once sent; one that does
/// not fit waits its turn (503), one that never could is refused (400).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logits_answers_in_flight_stay_within_the_answer_budget() {
    let mut opts = options(testdata("gpc_prior").join(CKPT));
    // 8 rows in JSON: (20 x 81 + 66 + 40) x 8 x 16 bytes and some headers (about 222 KB)
    opts.limits = pmstate_serve::Limits { max_inflight_answer_bytes: 300_000, ..pmstate_serve::Limits::default() };
    let s = start(opts).await;
    let handle = s.server.handle();
    let (obs, tokens) = recorded(0, 8);
    let json = || json_body(&obs, Some((&json!(tokens), 20)), json!({}));
    let binary = || json_body(&obs, Some((&json!(tokens), 20)), json!({"parameters": {"binary_data_output": true}}));

    let paused = handle.pause();
    let first = tokio::spawn({
        let (c, body) = (s.client.clone(), json());
        async move { infer(&c, body).await }
    });
    until_metric("one queued request", &handle, "pmstate_queue_depth", 1.0).await;
    // a second JSON answer does not fit beside it
    let r = infer(&s.client, json()).await;
    let text = String::from_utf8_lossy(&r.body).into_owned();
    assert_eq!(r.status, 503, "{text}");
    assert!(text.contains("answers in flight fill the budget of 300000 bytes"), "{text}");
    assert_eq!(r.header("retry-after"), Some("1"));
    // a binary one (4 bytes a value) does
    let second = tokio::spawn({
        let (c, body) = (s.client.clone(), binary());
        async move { infer(&c, body).await }
    });
    until_metric("two queued requests", &handle, "pmstate_queue_depth", 2.0).await;
    let held = metric(&handle.metrics_text(), "pmstate_answer_bytes_reserved");
    assert!(held > 200_000.0 && held <= 300_000.0, "{held} bytes reserved");
    drop(paused);
    let want = prior().teacher_forced(&lib_inputs(&obs, Some(&tokens))).unwrap();
    assert_same(&prior_outputs(&first.await.unwrap()), &want, "first");
    assert_same(&prior_outputs(&second.await.unwrap()), &want, "second");
    // once the answers are sent the budget is back: the refused request now passes
    let start = std::time::Instant::now();
    loop {
        let r = infer(&s.client, json()).await;
        if r.status == 200 {
            assert_same(&prior_outputs(&r), &want, "retried");
            break;
        }
        assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
        assert!(start.elapsed() < WATCHDOG, "the budget never came back");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    until_metric("the budget given back", &handle, "pmstate_answer_bytes_reserved", 0.0).await;
    // 16 rows in JSON could never fit: 400, before any work
    let (obs16, tokens16) = (obs.repeat(2), tokens.repeat(2));
    let r = infer(&s.client, json_body(&obs16, Some((&json!(tokens16), 20)), json!({}))).await;
    let text = String::from_utf8_lossy(&r.body).into_owned();
    assert_eq!(r.status, 400, "{text}");
    assert!(text.contains("over the budget of 300000 for all answers in flight"), "{text}");
    handle.shutdown();
    s.server.wait().await.unwrap();
}
