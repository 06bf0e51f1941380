//! Bad input never hurts the server: every refusal is a JSON error naming
//! the problem with the protocol's status code, and the next good request
//! is answered as before.

use std::time::Duration;

use crate::common::*;
use pmstate_serve::client::Reply;
use pmstate_serve::{Limits, NonFinite};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn error_of(r: &Reply, status: u16) -> String {
    assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("content-type"), Some("application/json"));
    r.json()["error"].as_str().unwrap_or_else(|| panic!("no error field: {:?}", r.body)).to_owned()
}

fn assert_names(msg: &str, what: &[&str]) {
    for w in what {
        assert!(msg.contains(w), "{msg:?} does not name {w:?}");
    }
}

/// The 8 recorded rows as inputs of a JSON request, each a JSON value to tamper with.
fn inputs(o: &std::collections::HashMap<String, candle_core::Tensor>) -> Vec<Value> {
    rows(o, &[0, 1])
        .into_iter()
        .map(|(k, w, v)| json!({"name": k, "shape": [v.len() / w, w], "datatype": "FP32", "data": v}))
        .collect()
}

async fn post_json(s: &Running, v: &Value) -> Reply {
    infer(&s.client, serde_json::to_vec(v).unwrap()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_refused_by_name_and_the_server_keeps_serving() {
    let s = start_variant("smpl_tracker").await;
    let o = obs("smpl_tracker");
    let good = inputs(&o);
    let c = &s.client;

    // not JSON, truncated JSON, the wrong JSON
    let r = infer(c, b"{\"inputs\": [".to_vec()).await;
    assert_names(&error_of(&r, 400), &["malformed request"]);
    let r = infer(c, b"[1, 2]".to_vec()).await;
    assert_names(&error_of(&r, 400), &["malformed request"]);
    let r = infer(c, b"{\"inputs\": [{\"name\": \"max_coords_obs\"}]}".to_vec()).await;
    assert_names(&error_of(&r, 400), &["shape"]);
    let r = post_json(&s, &json!({"inputs": []})).await;
    assert_names(&error_of(&r, 400), &["no inputs"]);

    // a missing key
    let r = post_json(&s, &json!({"inputs": good[..2]})).await;
    assert_names(&error_of(&r, 400), &["missing input previous_actions"]);
    // an extra key
    let mut extra = good.clone();
    extra.push(json!({"name": "joystick", "shape": [2, 1], "datatype": "FP32", "data": [0.0, 1.0]}));
    let r = post_json(&s, &json!({ "inputs": extra })).await;
    assert_names(&error_of(&r, 400), &["unexpected input joystick", "max_coords_obs"]);
    // a key twice
    let mut twice = good.clone();
    twice.push(good[0].clone());
    assert_names(&error_of(&post_json(&s, &json!({ "inputs": twice })).await, 400), &["max_coords_obs is given twice"]);
    // data that does not fill the shape
    let mut short = good.clone();
    short[2]["data"].as_array_mut().unwrap().pop();
    let r = post_json(&s, &json!({ "inputs": short })).await;
    assert_names(&error_of(&r, 400), &["input previous_actions", "137 values", "[2, 69]", "138"]);
    // a width other than the one the resolved configs give (the checkpoint fixes only the sum 1003)
    let mut narrow = good.clone();
    let v: Vec<f32> = vec![0.0; 2 * 357];
    narrow[0] = json!({"name": "max_coords_obs", "shape": [2, 357], "datatype": "FP32", "data": v});
    let r = post_json(&s, &json!({ "inputs": narrow })).await;
    assert_names(&error_of(&r, 400), &["max_coords_obs", "357", "358"]);
    // rows that differ between inputs
    let mut rows3 = good.clone();
    let v: Vec<f32> = vec![0.0; 3 * 69];
    rows3[2] = json!({"name": "previous_actions", "shape": [3, 69], "datatype": "FP32", "data": v});
    assert_names(&error_of(&post_json(&s, &json!({ "inputs": rows3 })).await, 400), &["3 rows", "has 2"]);
    // a datatype other than FP32, a shape of the wrong rank, a negative dimension
    let mut int = good.clone();
    int[1]["datatype"] = json!("INT32");
    assert_names(
        &error_of(&post_json(&s, &json!({ "inputs": int })).await, 400),
        &["mimic_target_poses", "INT32", "FP32"],
    );
    let mut rank = good.clone();
    rank[1]["shape"] = json!([2, 576, 1]);
    assert_names(&error_of(&post_json(&s, &json!({ "inputs": rank })).await, 400), &["mimic_target_poses", "shape"]);
    let mut neg = good.clone();
    neg[1]["shape"] = json!([-2, 576]);
    assert_names(&error_of(&post_json(&s, &json!({ "inputs": neg })).await, 400), &["malformed request"]);
    // strings where numbers belong
    let mut text = good.clone();
    text[2]["data"][5] = json!("x");
    assert_names(&error_of(&post_json(&s, &json!({ "inputs": text })).await, 400), &["not a number"]);
    // outputs and parameters
    let r = post_json(&s, &json!({"inputs": good, "outputs": [{"name": "q_values"}]})).await;
    assert_names(&error_of(&r, 400), &["unknown output q_values", "mean_action"]);
    let r = post_json(&s, &json!({"inputs": good, "outputs": [{"name": "action"}]})).await;
    assert_names(&error_of(&r, 400), &["output action", "sample"]);
    let r = post_json(&s, &json!({"inputs": good, "parameters": {"sample": true, "seed": -1}})).await;
    assert_names(&error_of(&r, 400), &["seed"]);
    let r = post_json(&s, &json!({"inputs": good, "parameters": {"sample": "yes"}})).await;
    assert_names(&error_of(&r, 400), &["sample", "true or false"]);

    // the binary extension: a header length past the body, sizes that do not match
    let r = c
        .post("/v2/models/policy/infer", b"{}".to_vec(), &[("inference-header-content-length", "99".into())])
        .await
        .unwrap();
    assert_names(&error_of(&r, 400), &["Inference-Header-Content-Length is 99"]);
    let r = c
        .post("/v2/models/policy/infer", b"{}".to_vec(), &[("inference-header-content-length", "x".into())])
        .await
        .unwrap();
    assert_names(&error_of(&r, 400), &["Inference-Header-Content-Length"]);
    let (mut body, n) = binary_request(&rows(&o, &[0]), json!({}));
    body.truncate(body.len() - 4);
    let r = infer_binary(c, body, n).await;
    assert_names(&error_of(&r, 400), &["previous_actions", "binary_data_size 276", "272 bytes"]);
    let (mut body, n) = binary_request(&rows(&o, &[0]), json!({}));
    body.extend_from_slice(&[0; 8]);
    assert_names(&error_of(&infer_binary(c, body, n).await, 400), &["8 bytes of binary data after"]);

    // routes, models, versions, methods
    assert_names(&error_of(&c.get("/v2/models/other/ready").await.unwrap(), 404), &["unknown model other", "policy"]);
    let r = c.post("/v2/models/other/infer", b"{}".to_vec(), &[]).await.unwrap();
    assert_names(&error_of(&r, 404), &["unknown model other"]);
    let r = c.post("/v2/models/policy/versions/7/infer", b"{}".to_vec(), &[]).await.unwrap();
    assert_names(&error_of(&r, 404), &["no version 7"]);
    assert_names(&error_of(&c.get("/v2/models/policy/infer").await.unwrap(), 405), &["GET"]);
    assert_names(&error_of(&c.get("/v1/models").await.unwrap(), 404), &["no route GET /v1/models"]);

    // and after all that, a good request gets its answer; every refusal was counted by kind
    let r = post_json(&s, &json!({ "inputs": good })).await;
    assert_eq!(outputs(&r)["mean_action"].0, [2, 69]);
    let text = s.server.handle().metrics_text();
    assert!(metric(&text, "pmstate_infer_errors_total{kind=\"bad_json\"}") >= 4.0);
    assert!(metric(&text, "pmstate_infer_errors_total{kind=\"bad_input\"}") >= 14.0);
    assert_eq!(metric(&text, "pmstate_infer_errors_total{kind=\"not_found\"}"), 2.0);
    assert_eq!(metric(&text, "pmstate_infer_errors_total{kind=\"method\"}"), 1.0, "the 405 on .../infer");
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_finite_inputs_pass_through_or_are_refused() {
    let s = start_variant("smpl_tracker").await;
    let o = obs("smpl_tracker");
    let mut r = rows(&o, &[0, 1]);
    r[0].2[3] = f32::NAN; // max_coords_obs, row 0, column 3
    r[2].2[69 + 5] = f32::INFINITY; // previous_actions, row 1, column 5
                                    // JSON with the NaN / Infinity literals (what tritonclient sends)
    let mut parts = vec![];
    for (k, w, v) in &r {
        let mut data = vec![];
        pmstate_serve::json_floats::write_array(&mut data, v);
        let data = String::from_utf8(data).unwrap();
        parts.push(format!(r#"{{"name":"{k}","shape":[{},{w}],"datatype":"FP32","data":{data}}}"#, v.len() / w));
    }
    let request = |tail: &str| format!(r#"{{"inputs":[{}],{tail}}}"#, parts.join(","));
    // binary outputs, to read the values back exactly
    let text = request(r#""parameters":{"binary_data_output":true}"#);
    assert!(text.contains("NaN") && text.contains("Infinity"));
    let reply = infer(&s.client, text.clone().into_bytes()).await;
    let got = outputs(&reply);
    // passed through, as torch would: the normalizer's clamp keeps the NaN,
    // the first layer spreads it over every unit and ReLU keeps it (as
    // torch.relu does), so row 0's mean_action is NaN throughout; row 1's
    // infinity is clamped to 5 and its answer is finite. Exactly what
    // Policy::forward gives on the same rows: the server adds nothing of its own
    let policy =
        pmstate_policy::Policy::load(testdata("smpl_tracker").join("last.ckpt"), None, &candle_core::Device::Cpu)
            .unwrap();
    let want = host(&policy.forward(&tensors(&r)).unwrap().mean_action);
    let mean = &got["mean_action"].1;
    assert_eq!(got["mean_action"].0, [2, 69]);
    assert!(mean[..69].iter().all(|v| v.is_nan()), "row 0 (a NaN input): {:?}", &mean[..69]);
    assert!(mean[69..].iter().all(|v| v.is_finite()), "row 1 (an infinite input, clamped): {:?}", &mean[69..]);
    assert!(want[..69].iter().all(|v| v.is_nan()));
    assert_eq!(bits(&mean[69..]), bits(&want[69..]));

    // JSON outputs write NaN as Triton does (a bare NaN literal): 69 of them for row 0's mean_action
    let plain = request(r#""outputs":[{"name":"mean_action"}]"#);
    let reply = infer(&s.client, plain.into_bytes()).await;
    assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
    assert_eq!(String::from_utf8_lossy(&reply.body).matches("NaN").count(), 69);

    // refused on request, naming input, row and column
    let refused = request(r#""parameters":{"reject_non_finite":true}"#);
    let r = infer(&s.client, refused.into_bytes()).await;
    let msg = error_of(&r, 400);
    assert_names(&msg, &["max_coords_obs", "row 0", "column 3", "NaN", "reject_non_finite"]);
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();

    // or refused by the server for everyone
    let mut opts = options(testdata("smpl_tracker").join("last.ckpt"));
    opts.non_finite = NonFinite::Reject;
    let s = start(opts).await;
    let (body, n) = binary_request(&r_of(&o), json!({}));
    let r = infer_binary(&s.client, body, n).await;
    assert_names(&error_of(&r, 400), &["previous_actions", "row 1", "column 5", "inf"]);
    // which a request cannot waive
    let (body, n) = binary_request(&r_of(&o), json!({"parameters": {"reject_non_finite": false}}));
    assert_eq!(infer_binary(&s.client, body, n).await.status, 400);
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}

fn r_of(o: &std::collections::HashMap<String, candle_core::Tensor>) -> Vec<(String, usize, Vec<f32>)> {
    let mut r = rows(o, &[0, 1]);
    r[2].2[69 + 5] = f32::INFINITY;
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_full_queues_stalled_and_vanished_clients() {
    let mut opts = options(testdata("smpl_tracker").join("last.ckpt"));
    // 1 s: short enough to test the stalled client below, long enough that a
    // whole small body always arrives in time on a loaded 2-core machine
    // (at 300 ms the full workspace test run once cut the queued clients off)
    opts.limits = Limits { max_body_bytes: 64 << 10, body_timeout: Duration::from_secs(1), ..Limits::default() };
    opts.batching.queue = 2;
    let s = start(opts).await;
    let o = obs("smpl_tracker");
    let c = &s.client;

    // over the limit: 413, whether the length is declared or not
    let big = json_request(&rows(&o, &[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7]), json!({}));
    assert!(big.len() > 64 << 10);
    assert_names(&error_of(&infer(c, big.clone()).await, 413), &["over the limit of 65536 bytes"]);
    let raw = raw_request(
        s.addr,
        "POST /v2/models/policy/infer HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n",
        &chunked(&big),
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 413"), "{raw}");

    // a full queue: 503 with Retry-After
    let handle = s.server.handle();
    let paused = handle.pause();
    let (body, _) = row_request(&o, &[0], json!({}));
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let (c, b) = (c.clone(), body.clone());
            tokio::spawn(async move { infer(&c, b).await.status })
        })
        .collect();
    until_metric("2 queued", &handle, "pmstate_queue_depth", 2.0).await;
    let r = infer(c, body.clone()).await;
    assert_names(&error_of(&r, 503), &["queue of 2 requests is full"]);
    assert_eq!(r.header("retry-after"), Some("1"));

    // a client that goes away while its request waits: skipped, counted, nothing else changes
    let mut tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    drop(paused);
    for w in waiting {
        assert_eq!(w.await.unwrap(), 200);
    }
    let paused = handle.pause();
    let head = format!(
        "POST /v2/models/policy/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(&body).await.unwrap();
    until_metric("the request queued", &handle, "pmstate_queue_depth", 1.0).await;
    drop(tcp);
    // the server sees the closed connection and drops the handler before the forward may run
    until_metric("the handler dropped", &handle, "pmstate_requests_in_flight", 0.0).await;
    drop(paused);
    until_metric("the queue drained", &handle, "pmstate_queue_depth", 0.0).await;
    assert_eq!(metric(&handle.metrics_text(), "pmstate_infer_cancelled_total"), 1.0);

    // a client that stops mid-body: 408 once the body timeout passes
    let raw = raw_request(
        s.addr,
        "POST /v2/models/policy/infer HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n",
        b"{\"inputs\"",
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 408"), "{raw}");
    assert!(raw.contains("not received within"), "{raw}");
    // and one that disconnects mid-body
    let mut tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    tcp.write_all(b"POST /v2/models/policy/infer HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{\"in")
        .await
        .unwrap();
    drop(tcp);

    // the server still answers, and the memory budget was given back
    let r = infer(c, body).await;
    assert_eq!(outputs(&r)["mean_action"].0, [1, 69]);
    let text = handle.metrics_text();
    assert_eq!(metric(&text, "pmstate_infer_errors_total{kind=\"too_large\"}"), 2.0);
    assert_eq!(metric(&text, "pmstate_infer_errors_total{kind=\"queue_full\"}"), 1.0);
    assert_eq!(metric(&text, "pmstate_infer_errors_total{kind=\"body_timeout\"}"), 1.0);
    handle.shutdown();
    s.server.wait().await.unwrap();
}

fn chunked(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for c in body.chunks(8192) {
        out.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        out.extend_from_slice(c);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

/// One answer read from `tcp` (head and JSON body; the watchdog names
/// `what` if none comes), and whether the server closed the connection
/// with it or within `linger` after it.
async fn answer_then_closed(tcp: &mut tokio::net::TcpStream, what: &str, linger: Duration) -> (String, bool) {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    let read = async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return true,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
            let text = String::from_utf8_lossy(&got);
            let Some((head, body)) = text.split_once("\r\n\r\n") else { continue };
            let len = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()))
                .and_then(|v| v.parse::<usize>().ok());
            if len.is_some_and(|n| body.len() >= n) {
                return false;
            }
        }
    };
    let closed_early = tokio::time::timeout(WATCHDOG, read).await.unwrap_or_else(|_| panic!("no answer to {what}"));
    let closed = closed_early
        || tokio::time::timeout(linger, tcp.read(&mut buf)).await.is_ok_and(|r| matches!(r, Ok(0) | Err(_)));
    (String::from_utf8_lossy(&got).into_owned(), closed)
}

fn says_close(answer: &str) -> bool {
    answer.lines().any(|l| l.eq_ignore_ascii_case("connection: close"))
}

/// An answer given before the request's body was read to its end (413 for
/// a declared length over the limit, 408 for a stalled body) says
/// `Connection: close`, and the server then closes: a keep-alive client
/// told nothing would send its next request on the closing connection and
/// lose it (as the pooled client of the test above once lost a queued
/// request after a 413). An answer to a body read whole keeps the
/// connection open for the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_before_the_body_is_read_say_connection_close() {
    let mut opts = options(testdata("smpl_tracker").join("last.ckpt"));
    opts.limits = Limits { max_body_bytes: 64 << 10, body_timeout: Duration::from_secs(1), ..Limits::default() };
    let s = start(opts).await;
    let (body, _) = row_request(&obs("smpl_tracker"), &[0], json!({}));
    let post = |len: usize| {
        format!(
            "POST /v2/models/policy/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
        )
    };

    let mut tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    tcp.write_all(post(100_000).as_bytes()).await.unwrap();
    let _ = tcp.write_all(&[b' '; 1000]).await;
    let (answer, closed) = answer_then_closed(&mut tcp, "a declared length over the limit", WATCHDOG).await;
    assert!(answer.starts_with("HTTP/1.1 413") && says_close(&answer) && closed, "closed {closed}: {answer}");

    let mut tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    tcp.write_all(post(1000).as_bytes()).await.unwrap();
    tcp.write_all(b"{\"inputs\"").await.unwrap();
    let (answer, closed) = answer_then_closed(&mut tcp, "a stalled body", WATCHDOG).await;
    assert!(answer.starts_with("HTTP/1.1 408") && says_close(&answer) && closed, "closed {closed}: {answer}");

    // a body read whole: two answers on one connection (the second shows it
    // stayed open), neither says close
    let mut tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    for round in 0..2 {
        tcp.write_all(post(body.len()).as_bytes()).await.unwrap();
        tcp.write_all(&body).await.unwrap();
        let (answer, closed) = answer_then_closed(&mut tcp, "a whole body", Duration::ZERO).await;
        assert!(answer.starts_with("HTTP/1.1 200") && !says_close(&answer) && !closed, "round {round}: {answer}");
    }
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}

/// Sends `head` and `body` on a fresh connection and reads the answer's first bytes.
pub(crate) async fn raw_request(addr: std::net::SocketAddr, head: &str, body: &[u8]) -> String {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    // the server may answer (413) and close before it has read everything
    let _ = tcp.write_all(body).await;
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    let read = async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    if got.windows(4).any(|w| w == b"\r\n\r\n") && got.ends_with(b"}") {
                        break;
                    }
                }
            }
        }
    };
    // a server that neither answers nor closes fails the test, naming the request
    tokio::time::timeout(WATCHDOG, read).await.unwrap_or_else(|_| panic!("no answer to {head:?}"));
    String::from_utf8_lossy(&got).into_owned()
}

/// `body` padded with spaces (valid JSON) to exactly `len` bytes.
fn padded(mut body: Vec<u8>, len: usize) -> Vec<u8> {
    assert!(body.len() <= len);
    body.resize(len, b' ');
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_in_flight_over_the_budget_get_503_until_the_budget_is_given_back() {
    // room for two largest bodies at once, all clients together
    let mut opts = options(testdata("smpl_tracker").join("last.ckpt"));
    // (the slow bodies are not cut off as stalled while the test waits on them)
    opts.limits = Limits {
        max_body_bytes: 64 << 10,
        max_inflight_body_bytes: 128 << 10,
        body_stall_timeout: WATCHDOG,
        ..Limits::default()
    };
    let s = start(opts).await;
    let handle = s.server.handle();
    let o = obs("smpl_tracker");
    let reserved = || metric(&handle.metrics_text(), "pmstate_body_bytes_reserved");
    let (small, r0) = row_request(&o, &[0], json!({}));
    let body = padded(small.clone(), 64 << 10);
    let policy =
        pmstate_policy::Policy::load(testdata("smpl_tracker").join("last.ckpt"), None, &candle_core::Device::Cpu)
            .unwrap();
    let want = bits(&host(&policy.forward(&tensors(&r0)).unwrap().mean_action));

    // two slow clients, each holding a 64 KiB body sent but for its last byte: the budget is full
    // (charged as bytes arrive: two bytes are left)
    let slow = [Held::start(s.addr, &body).await, Held::start(s.addr, &body).await];
    until("both bodies reserved", || reserved() == ((128 << 10) - 2) as f64).await;

    // one more body, large or small, does not fit: 503 with Retry-After and a JSON error
    for b in [body.clone(), small.clone()] {
        let r = infer(&s.client, b).await;
        let msg = error_of(&r, 503);
        assert_eq!(msg, "request bodies in flight fill the budget of 131072 bytes; retry later");
        assert_eq!(r.header("retry-after"), Some("1"));
    }
    assert_eq!(metric(&handle.metrics_text(), "pmstate_infer_errors_total{kind=\"busy\"}"), 2.0);

    // the slow bodies arrive and are answered; their reservations are given back
    for h in slow {
        let (status, answer) = h.finish().await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
        let v: Value = serde_json::from_slice(&answer).unwrap();
        let mean: Vec<f32> =
            v["outputs"][0]["data"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        assert_eq!(v["outputs"][0]["name"], "mean_action");
        assert_eq!(bits(&mean), want);
    }
    until("the budget given back", || reserved() == 0.0).await;
    // and a later request of the largest size is answered
    let r = infer(&s.client, body).await;
    assert_eq!(bits(&outputs(&r)["mean_action"].1), want);
    handle.shutdown();
    s.server.wait().await.unwrap();
}
