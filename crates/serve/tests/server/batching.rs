//! Dynamic batching: 64 concurrent clients are merged into few forwards,
//! and each gets bitwise what its request alone gives (`Policy::forward`,
//! `Policy::sample` with its own seed on its own rows).

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use candle_core::Device;
use pmstate_policy::Policy;
use pmstate_serve::Batching;
use serde_json::json;

/// Request `i`: 1 to 3 of the 8 recorded rows, sampled with seed `i` for every fourth.
fn request_rows(i: usize) -> Vec<usize> {
    (0..1 + i % 3).map(|j| (i + 3 * j) % 8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_clients_are_batched_and_each_gets_its_own_rows() {
    let v = "smpl_tracker";
    let policy = Arc::new(Policy::load(testdata(v).join("last.ckpt"), None, &Device::Cpu).unwrap());
    let o = Arc::new(obs(v));
    let s = start_variant(v).await;
    let handle = s.server.handle();

    // hold forwards back until all 64 wait: the batches are then certain
    let paused = handle.pause();
    let mut tasks = vec![];
    for i in 0..64usize {
        let (c, o) = (s.client.clone(), o.clone());
        tasks.push(tokio::spawn(async move {
            let extra = if i % 4 == 0 { json!({"parameters": {"sample": true, "seed": i}}) } else { json!({}) };
            let (body, r) = row_request(&o, &request_rows(i), extra);
            (i, r, infer(&c, body).await)
        }));
    }
    until_metric("64 queued requests", &handle, "pmstate_queue_depth", 64.0).await;
    drop(paused);

    for t in tasks {
        let (i, r, reply) = t.await.unwrap();
        let got = outputs(&reply);
        let alone = policy.forward(&tensors(&r)).unwrap();
        assert_eq!(got["mean_action"].0, [request_rows(i).len(), 69]);
        assert_eq!(bits(&got["mean_action"].1), bits(&host(&alone.mean_action)), "request {i}");
        assert_eq!(bits(&got["value"].1), bits(&host(&alone.value)), "request {i}");
        assert_eq!(bits(&got["norm_obs"].1), bits(&host(alone.norm_obs.as_ref().unwrap())), "request {i}");
        if i % 4 == 0 {
            let sampled = policy.sample(&tensors(&r), i as u64).unwrap();
            assert_eq!(bits(&got["action"].1), bits(&host(&sampled.action)), "request {i}");
            assert_eq!(bits(&got["neglogp"].1), bits(&host(&sampled.neglogp)), "request {i}");
        } else {
            assert!(!got.contains_key("action"));
        }
    }

    // visible in /metrics: 64 requests in at most 2 forwards (the one the
    // worker had taken when the pause began, and all the rest)
    let m = s.client.get("/metrics").await.unwrap();
    let text = String::from_utf8(m.body.to_vec()).unwrap();
    assert_eq!(metric(&text, "pmstate_batch_requests_sum"), 64.0);
    let forwards = metric(&text, "pmstate_batch_requests_count");
    assert!((1.0..=2.0).contains(&forwards), "{forwards} forwards");
    let rows: usize = (0..64).map(|i| request_rows(i).len()).sum();
    assert_eq!(metric(&text, "pmstate_batch_rows_sum"), rows as f64);
    assert_eq!(metric(&text, "pmstate_infer_rows_total"), rows as f64);
    assert_eq!(metric(&text, "pmstate_queue_depth"), 0.0);
    assert_eq!(metric(&text, "pmstate_request_duration_seconds_count"), 64.0);
    handle.shutdown();
    s.server.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_batch_bounds_the_rows_of_a_forward_and_max_wait_gathers_them() {
    let v = "smpl_tracker";
    let o = Arc::new(obs(v));
    let mut opts = options(testdata(v).join("last.ckpt"));
    // 4 rows at most; the oldest waits up to 50 ms for more (no pause here)
    opts.batching = Batching { max_batch: 4, max_wait: Duration::from_millis(50), queue: 64, ..Batching::default() };
    let s = start(opts).await;
    let mut tasks = vec![];
    for i in 0..32usize {
        let (c, o) = (s.client.clone(), o.clone());
        tasks.push(tokio::spawn(async move {
            let (body, _) = row_request(&o, &[i % 8], json!({}));
            infer(&c, body).await.status
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    let text = s.server.handle().metrics_text();
    let forwards = metric(&text, "pmstate_batch_rows_count");
    assert_eq!(metric(&text, "pmstate_batch_rows_sum"), 32.0);
    // every forward in the le=4 bucket: none over max_batch
    assert_eq!(metric(&text, "pmstate_batch_rows_bucket{le=\"4.0\"}"), forwards);
    assert!(forwards >= 8.0, "{forwards}");
    // and max_wait merged some: fewer forwards than requests
    assert!(forwards < 32.0, "{forwards} forwards for 32 requests");
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_max_batch_is_refused_as_triton_refuses_it() {
    let v = "smpl_tracker";
    let o = obs(v);
    let mut opts = options(testdata(v).join("last.ckpt"));
    opts.batching.max_batch = 4;
    let s = start(opts).await;
    // the configuration tells clients the bound
    assert_eq!(s.client.get("/v2/models/policy/config").await.unwrap().json()["max_batch_size"], 4);
    let (body, _) = row_request(&o, &[0, 1, 2, 3, 4], json!({}));
    let r = infer(&s.client, body).await;
    assert_eq!(r.status, 400);
    let msg = r.json()["error"].as_str().unwrap().to_owned();
    assert!(msg.contains("5 rows") && msg.contains("max_batch_size = 4"), "{msg}");
    // at the bound: answered, in one forward
    let (body, rows4) = row_request(&o, &[0, 1, 2, 3], json!({}));
    let got = outputs(&infer(&s.client, body).await);
    let policy = Policy::load(testdata(v).join("last.ckpt"), None, &Device::Cpu).unwrap();
    assert_eq!(bits(&got["mean_action"].1), bits(&host(&policy.forward(&tensors(&rows4)).unwrap().mean_action)));
    let text = s.server.handle().metrics_text();
    assert_eq!(metric(&text, "pmstate_infer_errors_total{kind=\"bad_input\"}"), 1.0);
    assert_eq!(metric(&text, "pmstate_batch_rows_count"), 1.0);
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}

/// The batching thread polls its queue after a batch (`Batching::spin`)
/// before it sleeps: requests and the stop message that come while it
/// polls are taken as when it sleeps. With an hour's spin (or one longer
/// than an `Instant` can hold) every request
/// after the first and the shutdown arrive mid-poll; with none, each
/// arrives while it sleeps. Closed loop: one forward per request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_the_stop_that_come_while_the_batcher_polls_are_taken() {
    let v = "smpl_tracker";
    let policy = Policy::load(testdata(v).join("last.ckpt"), None, &Device::Cpu).unwrap();
    let o = obs(v);
    // Duration::MAX: past what an Instant holds, it polls until a message comes
    for spin in [Duration::from_secs(3600), Duration::MAX, Duration::ZERO] {
        let mut opts = options(testdata(v).join("last.ckpt"));
        opts.batching = Batching { spin, ..Batching::default() };
        let s = start(opts).await;
        for i in 0..8usize {
            let (body, r) = row_request(&o, &[i], json!({}));
            let got = outputs(&infer(&s.client, body).await);
            let alone = policy.forward(&tensors(&r)).unwrap();
            assert_eq!(bits(&got["mean_action"].1), bits(&host(&alone.mean_action)), "spin {spin:?}, request {i}");
        }
        let text = s.server.handle().metrics_text();
        assert_eq!(metric(&text, "pmstate_batch_rows_count"), 8.0, "spin {spin:?}");
        s.server.handle().shutdown();
        s.server.wait().await.unwrap();
    }
}
