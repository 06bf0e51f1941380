//! Shared by the server tests: a real server on port 0 serving a
//! recorded ProtoMotions policy, a real HTTP client, request builders, and
//! the in-process `Policy` to compare with.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use candle_core::{Device, Tensor};
use pmstate_serve::client::{Client, Reply};
use pmstate_serve::{Event, EventSink, ModelSource, ServeOptions, Server};
use serde_json::{json, Value};

pub fn testdata(variant: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy").join(variant)
}

/// Events a server reported, for assertions.
#[derive(Clone, Default)]
pub struct Events(pub Arc<Mutex<Vec<Event>>>);

impl Events {
    pub fn sink(&self) -> EventSink {
        let v = self.0.clone();
        Arc::new(move |e: &Event| v.lock().unwrap().push(e.clone()))
    }
    pub fn all(&self) -> Vec<Event> {
        self.0.lock().unwrap().clone()
    }
}

pub struct Running {
    pub server: Server,
    pub client: Client,
    pub events: Events,
    pub addr: SocketAddr,
}

/// How long one request or one wait may take before a test calls it a hang
/// (a watchdog, not a speed check).
pub const WATCHDOG: std::time::Duration = std::time::Duration::from_secs(120);

/// Options for `checkpoint` on 127.0.0.1:0.
pub fn options(checkpoint: PathBuf) -> ServeOptions {
    let mut o = ServeOptions::new(ModelSource::Checkpoint { path: checkpoint, config: None });
    o.addr = SocketAddr::from(([127, 0, 0, 1], 0));
    o.name = "policy".into();
    o.threads = Some(2);
    o
}

pub async fn start(opts: ServeOptions) -> Running {
    let events = Events::default();
    let server = Server::start(opts, events.sink()).await.expect("server starts");
    let addr = server.addr();
    Running { client: Client::new(addr).with_timeout(WATCHDOG), server, events, addr }
}

pub async fn start_variant(variant: &str) -> Running {
    start(options(testdata(variant).join("last.ckpt"))).await
}

/// The recorded observations of a variant (one f32 [8, D] per key).
pub fn obs(variant: &str) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(testdata(variant).join("obs.safetensors"), &Device::Cpu).unwrap()
}

/// Request inputs: (key, width, rows x width values).
pub type Rows = Vec<(String, usize, Vec<f32>)>;

/// Rows `idx` of every observation: (key, width, values), keys sorted.
pub fn rows(obs: &HashMap<String, Tensor>, idx: &[usize]) -> Vec<(String, usize, Vec<f32>)> {
    let mut keys: Vec<&String> = obs.keys().collect();
    keys.sort();
    keys.into_iter()
        .map(|k| {
            let t = &obs[k];
            let w = t.dims()[1];
            let all = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let v = idx.iter().flat_map(|&i| all[i * w..(i + 1) * w].iter().copied()).collect();
            (k.clone(), w, v)
        })
        .collect()
}

/// Tensors of `rows` for `Policy::forward`.
pub fn tensors(rows: &[(String, usize, Vec<f32>)]) -> HashMap<String, Tensor> {
    rows.iter()
        .map(|(k, w, v)| (k.clone(), Tensor::from_vec(v.clone(), (v.len() / w, *w), &Device::Cpu).unwrap()))
        .collect()
}

/// A JSON inference request; `extra` is merged in (outputs, parameters, id).
pub fn json_request(rows: &[(String, usize, Vec<f32>)], extra: Value) -> Vec<u8> {
    let inputs: Vec<Value> = rows
        .iter()
        .map(|(k, w, v)| json!({"name": k, "shape": [v.len() / w, w], "datatype": "FP32", "data": v}))
        .collect();
    let mut req = json!({ "inputs": inputs });
    if let Value::Object(m) = extra {
        for (k, v) in m {
            req[k] = v;
        }
    }
    serde_json::to_vec(&req).unwrap()
}

/// A binary-extension request: (body, header length).
pub fn binary_request(rows: &[(String, usize, Vec<f32>)], extra: Value) -> (Vec<u8>, usize) {
    let inputs: Vec<Value> = rows
        .iter()
        .map(|(k, w, v)| {
            json!({"name": k, "shape": [v.len() / w, w], "datatype": "FP32", "parameters": {"binary_data_size": v.len() * 4}})
        })
        .collect();
    let mut req = json!({ "inputs": inputs });
    if let Value::Object(m) = extra {
        for (k, v) in m {
            req[k] = v;
        }
    }
    let mut body = serde_json::to_vec(&req).unwrap();
    let n = body.len();
    for (_, _, v) in rows {
        for x in v {
            body.extend_from_slice(&x.to_le_bytes());
        }
    }
    (body, n)
}

pub async fn infer(c: &Client, body: Vec<u8>) -> Reply {
    c.post("/v2/models/policy/infer", body, &[("content-type", "application/json".into())]).await.unwrap()
}

pub async fn infer_binary(c: &Client, body: Vec<u8>, header_len: usize) -> Reply {
    c.post("/v2/models/policy/infer", body, &[("inference-header-content-length", header_len.to_string())])
        .await
        .unwrap()
}

/// Every output of a reply (JSON or binary): name -> (shape, values).
pub fn outputs(r: &Reply) -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let json_len = r.header("inference-header-content-length").map_or(r.body.len(), |h| h.parse().unwrap());
    let head: Value = serde_json::from_slice(&r.body[..json_len]).unwrap();
    let mut bin = &r.body[json_len..];
    let mut out = HashMap::new();
    for o in head["outputs"].as_array().unwrap() {
        let shape: Vec<usize> = o["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
        let data: Vec<f32> = match o["parameters"]["binary_data_size"].as_u64() {
            Some(n) => {
                let (mine, rest) = bin.split_at(n as usize);
                bin = rest;
                mine.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
            }
            None => o["data"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect(),
        };
        out.insert(o["name"].as_str().unwrap().to_owned(), (shape, data));
    }
    assert!(bin.is_empty(), "binary data left over");
    out
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

pub fn host(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// A metric's value from the /metrics text (first series whose line starts with `prefix`).
pub fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no metric {prefix} in\n{text}"))
}

/// The smpl tracker's state as a flat safetensors map (via pmstate-ckpt's
/// conversion), with the actor's last bias shifted by `shift`: a checkpoint
/// with the same interface and different outputs.
pub fn tracker_tensors(shift: f32) -> HashMap<String, Tensor> {
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("t.safetensors");
    pmstate_ckpt::Checkpoint::open(testdata("smpl_tracker").join("last.ckpt")).unwrap().save(&st).unwrap();
    let m = candle_core::safetensors::load(&st, &Device::Cpu).unwrap();
    // the state dict at the root, as a flat safetensors file of the model holds it
    let mut m: HashMap<String, Tensor> =
        m.into_iter().filter_map(|(k, t)| k.strip_prefix("model.").map(|k| (k.to_owned(), t))).collect();
    let key = "_actor.mu.mlp.12.bias";
    let b = (&m[key] + shift as f64).unwrap();
    m.insert(key.into(), b);
    m
}

/// Writes `tensors` to `path` through a temporary file and a rename (as
/// ProtoMotions' `torch.save` to a temporary file does).
pub fn write_by_rename(tensors: &HashMap<String, Tensor>, path: &std::path::Path) {
    let tmp = path.with_extension("tmp.safetensors");
    candle_core::safetensors::save(tensors, &tmp).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A folder with the smpl tracker's resolved configs and `last.safetensors`
/// (bias shifted by `shift`).
pub fn tracker_dir(shift: f32) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(testdata("smpl_tracker").join("resolved_configs.pt"), dir.path().join("resolved_configs.pt"))
        .unwrap();
    let ckpt = dir.path().join("last.safetensors");
    write_by_rename(&tracker_tensors(shift), &ckpt);
    (dir, ckpt)
}

/// One request of `rows` (JSON) and the outputs it must get.
pub fn row_request(o: &HashMap<String, Tensor>, idx: &[usize], extra: Value) -> (Vec<u8>, Rows) {
    let r = rows(o, idx);
    (json_request(&r, extra), r)
}

/// Polls `cond` every 5 ms until it holds; panics after [`WATCHDOG`] (a hang, not a speed check).
pub async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(start.elapsed() < WATCHDOG, "timed out waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Polls the server's metric `name` every 5 ms until it reads `want`;
/// after [`WATCHDOG`] panics with what it read and the whole metrics text,
/// so that a hang says what the server was doing.
pub async fn until_metric(what: &str, handle: &pmstate_serve::ServerHandle, name: &str, want: f64) {
    let start = std::time::Instant::now();
    loop {
        let text = handle.metrics_text();
        let got = metric(&text, name);
        if got == want {
            return;
        }
        assert!(
            start.elapsed() < WATCHDOG,
            "timed out waiting for {what}: {name} is {got}, not {want}; metrics:\n{text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// A request sent over a raw connection, headers and its body but for the
/// last byte: in flight at the server (holding what it sent of the body
/// budget) until [`Held::finish`] sends the rest.
pub struct Held {
    tcp: tokio::net::TcpStream,
    rest: Vec<u8>,
}

impl Held {
    pub async fn start(addr: SocketAddr, body: &[u8]) -> Held {
        use tokio::io::AsyncWriteExt;
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /v2/models/policy/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             connection: close\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        tcp.write_all(head.as_bytes()).await.unwrap();
        let most = body.len() - 1;
        tcp.write_all(&body[..most]).await.unwrap();
        Held { tcp, rest: body[most..].to_vec() }
    }

    /// Sends the rest of the body: the status and the body of the answer.
    pub async fn finish(mut self) -> (u16, Vec<u8>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        self.tcp.write_all(&self.rest).await.unwrap();
        let mut got = Vec::new();
        tokio::time::timeout(WATCHDOG, self.tcp.read_to_end(&mut got)).await.expect("an answer").unwrap();
        let text = String::from_utf8_lossy(&got).into_owned();
        let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{text}"));
        let start = text.find("\r\n\r\n").unwrap_or_else(|| panic!("{text}")) + 4;
        (status, got[start..].to_vec())
    }
}
