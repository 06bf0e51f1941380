//! Clients that attack the server rather than misuse it: slow heads, idle
//! and stalled connections, bodies declared but not sent, requests built
//! to make the decoder amplify them, and requests that readers disagree
//! on (repeated keys, non-standard literals, unknown transfer codings).
//! Each is refused or cut off by a limit, and the server keeps answering
//! everyone else. The timeouts are set short through the options; no
//! assertion is about how long anything took.

use std::net::SocketAddr;
use std::time::Duration;

use crate::bad_input::raw_request;
use crate::common::*;
use pmstate_serve::Limits;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads until the server closes the connection; what it sent before.
async fn until_closed(tcp: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(WATCHDOG, async {
        let mut buf = [0u8; 4096];
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    });
    read.await.expect("the server closes the connection");
    got
}

/// A good one-row request over `tcp`, kept alive: its answer's status.
async fn request_on(tcp: &mut TcpStream, body: &[u8]) -> u16 {
    let head = format!(
        "POST /v2/models/policy/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(body).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    // the answer is JSON: complete once the head is and the body ends with `}`
    while !(got.windows(4).any(|w| w == b"\r\n\r\n") && got.ends_with(b"}")) {
        let n = tokio::time::timeout(WATCHDOG, tcp.read(&mut buf)).await.expect("an answer").unwrap();
        assert_ne!(n, 0, "closed before answering: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{text}"))
}

async fn connect(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_heads_and_idle_connections_are_closed_by_the_header_timeout() {
    let mut opts = options(testdata("smpl_tracker").join("last.ckpt"));
    opts.limits = Limits { header_timeout: Duration::from_secs(1), ..Limits::default() };
    let s = start(opts).await;
    let (body, _) = row_request(&obs("smpl_tracker"), &[0], json!({}));

    // a head sent one line at a time, never finished: closed
    let mut slow = connect(s.addr).await;
    slow.write_all(b"POST /v2/models/policy/infer HTTP/1.1\r\n").await.unwrap();
    slow.write_all(b"host: x\r\n").await.unwrap();
    until_closed(&mut slow).await;
    // a connection that never sends anything: closed
    let mut silent = connect(s.addr).await;
    assert!(until_closed(&mut silent).await.is_empty());
    // a kept-alive connection answered once, then idle: closed
    let mut idle = connect(s.addr).await;
    assert_eq!(request_on(&mut idle, &body).await, 200);
    until_closed(&mut idle).await;

    // and the server answers as before
    assert_eq!(outputs(&infer(&s.client, body).await)["mean_action"].0, [1, 69]);
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_connection_cap_the_connections_idle_the_longest_make_room() {
    let mut opts = options(testdata("smpl_tracker").join("last.ckpt"));
    opts.limits = Limits { max_connections: 4, ..Limits::default() };
    let s = start(opts).await;
    let handle = s.server.handle();
    let count = |name: &str| metric(&handle.metrics_text(), name);
    let (body, _) = row_request(&obs("smpl_tracker"), &[0], json!({}));

    // ten idle clients, one after the other (some mid-head): the server keeps four
    let mut idle = Vec::new();
    for i in 0..10usize {
        let mut tcp = connect(s.addr).await;
        if i % 2 == 1 {
            tcp.write_all(b"POST /v2/models/policy/infer HTTP/1.1\r\nhost: x\r\n").await.unwrap();
        }
        idle.push(tcp);
        let evicted = i.saturating_sub(3) as f64;
        until("the connection accepted", || {
            count("pmstate_connections_evicted_total") == evicted
                && count("pmstate_connections ") == (i + 1).min(4) as f64
        })
        .await;
    }
    // a new client is answered: the connection idle the longest made room for it
    assert_eq!(outputs(&infer(&s.client, body.clone()).await)["mean_action"].0, [1, 69]);
    assert_eq!(count("pmstate_connections_evicted_total"), 7.0);
    // the oldest were closed; the newer ones are still open and can be answered
    for tcp in &mut idle[..7] {
        until_closed(tcp).await;
    }
    assert_eq!(request_on(&mut idle[8], &body).await, 200);
    handle.shutdown();
    s.server.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_are_charged_as_they_arrive_not_as_declared() {
    let mut opts = options(testdata("smpl_tracker").join("last.ckpt"));
    // the default body limit and budget (64 MiB, 512 MiB); no stall cuts the clients off here
    opts.limits = Limits { body_stall_timeout: WATCHDOG, body_timeout: WATCHDOG, ..Limits::default() };
    let s = start(opts).await;
    let handle = s.server.handle();
    let reserved = || metric(&handle.metrics_text(), "pmstate_body_bytes_reserved");
    let (body, _) = row_request(&obs("smpl_tracker"), &[0], json!({}));

    // nine clients declare 64 MiB each (over the budget together) and send one byte
    let mut liars = Vec::new();
    for _ in 0..9 {
        let mut tcp = connect(s.addr).await;
        let head =
            format!("POST /v2/models/policy/infer HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{{", 64 << 20);
        tcp.write_all(head.as_bytes()).await.unwrap();
        liars.push(tcp);
    }
    until("nine bytes charged", || reserved() == 9.0).await;
    // they hold nine bytes, not 576 MiB: everyone else is answered
    for _ in 0..3 {
        assert_eq!(outputs(&infer(&s.client, body.clone()).await)["mean_action"].0, [1, 69]);
    }
    assert_eq!(metric(&handle.metrics_text(), "pmstate_infer_errors_total{kind=\"busy\"}"), 0.0);
    drop(liars);
    until("the budget given back", || reserved() == 0.0).await;
    handle.shutdown();
    s.server.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stalls_gets_408_long_before_the_body_timeout() {
    let mut opts = options(testdata("smpl_tracker").join("last.ckpt"));
    opts.limits =
        Limits { body_stall_timeout: Duration::from_millis(300), body_timeout: WATCHDOG, ..Limits::default() };
    let s = start(opts).await;
    let handle = s.server.handle();
    let mut tcp = connect(s.addr).await;
    tcp.write_all(b"POST /v2/models/policy/infer HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{\"inputs\"")
        .await
        .unwrap();
    let answer = String::from_utf8_lossy(&until_closed(&mut tcp).await).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("no byte of the request body arrived for 0.3 s"), "{answer}");
    until_metric("the budget given back", &handle, "pmstate_body_bytes_reserved", 0.0).await;
    assert_eq!(metric(&handle.metrics_text(), "pmstate_infer_errors_total{kind=\"body_timeout\"}"), 1.0);
    // the server answers as before
    let (body, _) = row_request(&obs("smpl_tracker"), &[0], json!({}));
    assert_eq!(outputs(&infer(&s.client, body).await)["mean_action"].0, [1, 69]);
    handle.shutdown();
    s.server.wait().await.unwrap();
}

/// The `error` of a 400 answer; the whole answer is short (nothing echoed back in bulk).
fn refusal(r: &pmstate_serve::client::Reply) -> String {
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body[..r.body.len().min(2000)]));
    assert!(r.body.len() < 1024, "an answer of {} bytes", r.body.len());
    r.json()["error"].as_str().unwrap().to_owned()
}

/// `{"inputs": [...the tracker's three inputs...], EXTRA}` with `extra` as raw JSON text.
fn with_extra(o: &std::collections::HashMap<String, candle_core::Tensor>, extra: &str) -> Vec<u8> {
    let mut body = json_request(&rows(o, &[0]), json!({}));
    assert_eq!(body.pop(), Some(b'}'));
    body.extend_from_slice(b",");
    body.extend_from_slice(extra.as_bytes());
    body.extend_from_slice(b"}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amplifying_requests_are_refused_while_parsing_and_never_echoed() {
    let s = start_variant("smpl_tracker").await;
    let o = obs("smpl_tracker");
    let c = &s.client;
    let zeros = |n: usize| vec!["0"; n].join(",");
    let big = 4 << 20; // elements: 8 MiB of JSON each

    // a parameter that is an array: refused at its first byte, naming it
    let r = infer(c, with_extra(&o, &format!(r#""parameters": {{"p": [{}]}}"#, zeros(big)))).await;
    let msg = refusal(&r);
    assert!(msg.contains("parameter \"p\"") && msg.contains("a bool, number or string"), "{msg}");
    // too many parameters, outputs, inputs
    let many: Vec<String> = (0..65).map(|i| format!(r#""k{i}": {i}"#)).collect();
    let r = infer(c, with_extra(&o, &format!(r#""parameters": {{{}}}"#, many.join(",")))).await;
    assert!(refusal(&r).contains("more than 64 parameters"));
    let outs = vec![r#"{"name": "value"}"#; big / 16].join(",");
    let r = infer(c, with_extra(&o, &format!(r#""outputs": [{outs}]"#))).await;
    assert!(refusal(&r).contains("more than 64 outputs"));
    let one = r#"{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0]}"#;
    let r = infer(c, format!(r#"{{"inputs": [{}]}}"#, vec![one; 65].join(",")).into_bytes()).await;
    assert!(refusal(&r).contains("more than 64 inputs"));
    // a shape of millions of dimensions: refused after eight, not echoed
    let shape =
        format!(r#"{{"inputs": [{{"name": "previous_actions", "shape": [{}], "datatype": "FP32"}}]}}"#, zeros(big));
    let msg = refusal(&infer(c, shape.into_bytes()).await);
    assert!(msg.contains("more than 8 dimensions"), "{msg}");
    // a huge name: quoted in part only
    let name = "n".repeat(big);
    let r =
        infer(c, format!(r#"{{"inputs": [{{"name": "{name}", "shape": [1, 69], "datatype": "FP32"}}]}}"#).into_bytes())
            .await;
    let msg = refusal(&r);
    assert!(msg.contains(&format!("a name of {big} bytes")), "{msg}");
    // data with more values than its shape: refused as the one too many is read
    let data = format!(
        r#"{{"inputs": [{{"name": "previous_actions", "shape": [1, 69], "datatype": "FP32", "data": [{}]}}]}}"#,
        zeros(big)
    );
    let msg = refusal(&infer(c, data.into_bytes()).await);
    assert!(msg.contains("input previous_actions: more values than shape [1, 69] holds (69)"), "{msg}");
    // a string where a number belongs in data, 8 MiB long: named, not echoed
    let data = format!(
        r#"{{"inputs": [{{"name": "previous_actions", "shape": [1, 69], "datatype": "FP32", "data": ["{name}"]}}]}}"#
    );
    let msg = refusal(&infer(c, data.into_bytes()).await);
    assert!(msg.contains("input previous_actions: data: the string") && msg.contains("bytes in all"), "{msg}");
    // an unknown field whose name is 8 MiB
    let r = infer(c, with_extra(&o, &format!(r#""{name}": 1"#))).await;
    assert!(refusal(&r).contains("unknown field"));

    // after all that, a good request is answered
    let (body, _) = row_request(&o, &[0], json!({}));
    assert_eq!(outputs(&infer(c, body).await)["mean_action"].0, [1, 69]);
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_readers_disagree_on_are_refused() {
    let s = start_variant("smpl_tracker").await;
    let o = obs("smpl_tracker");
    let c = &s.client;

    // a parameter given twice (Triton reads the first, a map the last): 400 naming it
    let r = infer(c, with_extra(&o, r#""parameters": {"reject_non_finite": true, "reject_non_finite": false}"#)).await;
    let msg = refusal(&r);
    assert!(msg.contains("parameter \"reject_non_finite\" is given twice"), "{msg}");
    // in an output's parameters too, and a field given twice in an input or an output
    let r = infer(
        c,
        with_extra(&o, r#""outputs": [{"name": "value", "parameters": {"binary_data": true, "binary_data": false}}]"#),
    )
    .await;
    assert!(refusal(&r).contains("parameter \"binary_data\" is given twice"));
    let r = infer(c, with_extra(&o, r#""outputs": [{"name": "value", "name": "std"}]"#)).await;
    assert!(refusal(&r).contains("duplicate field `name`"));
    let twice =
        r#"{"inputs": [{"name": "previous_actions", "name": "max_coords_obs", "shape": [1, 69], "datatype": "FP32"}]}"#;
    assert!(refusal(&infer(c, twice.as_bytes().to_vec()).await).contains("duplicate field `name`"));
    let r = infer(c, with_extra(&o, r#""id": "a", "id": "b""#)).await;
    assert!(refusal(&r).contains("duplicate field `id`"));

    // NaN and Infinity are values of tensor data only
    for extra in [r#""id": NaN"#, r#""parameters": {"seed": Infinity}"#, r#""parameters": {Infinity: 1}"#] {
        let r = infer(c, with_extra(&o, extra)).await;
        assert!(refusal(&r).starts_with("malformed request"), "{extra}");
    }
    let mut r = rows(&o, &[0]);
    r[0].2[0] = f32::NAN;
    let binary = json!({"parameters": {"binary_data_output": true}});
    let nan = String::from_utf8(json_request(&r, binary)).unwrap().replacen("null", "NaN", 1);
    assert!(nan.contains("NaN"));
    assert_eq!(outputs(&infer(c, nan.into_bytes()).await)["mean_action"].0, [1, 69]);

    // a transfer coding hyper would ignore: 501, not read as if it were not there
    let (body, _) = row_request(&o, &[0], json!({}));
    let mut chunked = format!("{:x}\r\n", body.len()).into_bytes();
    chunked.extend_from_slice(&body);
    chunked.extend_from_slice(b"\r\n0\r\n\r\n");
    let raw = raw_request(
        s.addr,
        "POST /v2/models/policy/infer HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
        &chunked,
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 501"), "{raw}");
    assert!(raw.contains("transfer coding gzip is not implemented"), "{raw}");
    let raw = raw_request(
        s.addr,
        "POST /v2/models/policy/infer HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n",
        &chunked,
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    let text = s.server.handle().metrics_text();
    assert_eq!(metric(&text, "pmstate_infer_errors_total{kind=\"transfer_coding\"}"), 1.0);
    s.server.handle().shutdown();
    s.server.wait().await.unwrap();
}
