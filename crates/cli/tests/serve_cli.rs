//! `pmstate serve` as a process: it prints the address it listens on (port
//! 0), answers the protocol like `pmstate policy run` on the same rows (our
//! client and curl), reloads on SIGHUP, and on SIGINT or SIGTERM answers
//! every request in flight, then exits 0 (or, past `--drain-timeout`, drops
//! them and exits 0).
#![cfg(unix)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use pmstate_serve::client::Client;
use serde_json::{json, Value};

/// How long any one step may take before the test calls it a hang (not a speed check).
const WATCHDOG: Duration = Duration::from_secs(120);

#[path = "../../deploy/tests/common/configs.rs"]
mod configs;

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy").join(rel)
}

fn signal(pid: u32, sig: &str) {
    assert!(Command::new("kill").args([sig, &pid.to_string()]).status().unwrap().success());
}

/// The JSON lines a child prints, read on a thread of their own so that a
/// child that prints nothing fails the test after [`WATCHDOG`] instead of hanging it.
struct Lines(Receiver<String>);

impl Lines {
    fn of(child: &mut Child) -> Lines {
        let out = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines(rx)
    }

    fn next(&self) -> Value {
        let line = self.next_text();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    /// The next line as printed (text mode).
    fn next_text(&self) -> String {
        self.0.recv_timeout(WATCHDOG).unwrap_or_else(|e| panic!("no event line within {WATCHDOG:?}: {e}"))
    }
}

/// `pmstate --json serve CHECKPOINT --addr 127.0.0.1:0 --name tracker ARGS`: the child, its events, its address.
fn serve(ckpt: &Path, args: &[&str]) -> (Child, Lines, SocketAddr) {
    serve_at("127.0.0.1:0", ckpt, args)
}

/// [`serve`] with `--addr ADDR`.
fn serve_at(addr: &str, ckpt: &Path, args: &[&str]) -> (Child, Lines, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pmstate"))
        .args(["--json", "serve", "--addr", addr, "--name", "tracker"])
        .args(args)
        .arg(ckpt)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut child);
    let first = lines.next();
    assert_eq!(first["event"], "listening", "{first}");
    assert_eq!(first["model"], "tracker");
    let addr: SocketAddr = first["addr"].as_str().unwrap().parse().unwrap();
    assert_ne!(addr.port(), 0);
    (child, lines, addr)
}

/// Waits for the child's exit; a child still running after [`WATCHDOG`] is killed and fails the test.
fn exit_of(child: &mut Child) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if start.elapsed() > WATCHDOG {
            let _ = child.kill();
            panic!("pmstate serve did not exit within {WATCHDOG:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `pmstate policy run` on the recorded rows: mean_action, row-major.
fn policy_run_mean(ckpt: &Path, obs: &Path, tmp: &Path) -> Vec<f32> {
    let out = tmp.join("out.safetensors");
    let run = Command::new(env!("CARGO_BIN_EXE_pmstate"))
        .args(["policy", "run", "--obs"])
        .arg(obs)
        .arg("--out")
        .arg(&out)
        .arg(ckpt)
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let want = candle_core::safetensors::load(&out, &Device::Cpu).unwrap();
    want["mean_action"].flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// A JSON infer request for rows `idx` of the recorded observations, asking for mean_action.
fn infer_body(obs: &Path, idx: &[usize]) -> Vec<u8> {
    let o = candle_core::safetensors::load(obs, &Device::Cpu).unwrap();
    let mut keys: Vec<&String> = o.keys().collect();
    keys.sort();
    let inputs: Vec<Value> = keys
        .iter()
        .map(|k| {
            let t: &Tensor = &o[*k];
            let w = t.dims()[1];
            let all = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let v: Vec<f32> = idx.iter().flat_map(|&i| all[i * w..(i + 1) * w].iter().copied()).collect();
            json!({"name": k, "shape": [idx.len(), w], "datatype": "FP32", "data": v})
        })
        .collect();
    serde_json::to_vec(&json!({"inputs": inputs, "outputs": [{"name": "mean_action"}]})).unwrap()
}

/// The bits of the mean_action of an infer response.
fn mean_bits(reply: &Value) -> Vec<u32> {
    assert_eq!(reply["outputs"][0]["name"], "mean_action", "{reply}");
    reply["outputs"][0]["data"].as_array().unwrap().iter().map(|v| (v.as_f64().unwrap() as f32).to_bits()).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[tokio::test(flavor = "current_thread")]
async fn serve_answers_like_policy_run_reloads_on_sighup_and_drains_on_sigterm() {
    let ckpt = data("smpl_tracker/last.ckpt");
    let obs = data("smpl_tracker/obs.safetensors");
    let tmp = tempfile::tempdir().unwrap();
    let want_mean = policy_run_mean(&ckpt, &obs, tmp.path());

    let (mut child, lines, addr) = serve(&ckpt, &["--max-wait-us", "100"]);
    let c = Client::new(addr).with_timeout(WATCHDOG);
    let r = c.get("/v2/health/ready").await.unwrap();
    assert_eq!((r.status, r.json()), (200, json!({"ready": true})));

    // the recorded rows in JSON: mean_action bitwise as policy run wrote it
    let body = infer_body(&obs, &(0..8).collect::<Vec<_>>());
    let r = c.post("/v2/models/tracker/infer", body, &[]).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(mean_bits(&r.json()), bits(&want_mean));

    // SIGHUP: the checkpoint is loaded again as version 2
    signal(child.id(), "-HUP");
    let e = lines.next();
    assert_eq!((e["event"].as_str(), e["version"].as_u64()), (Some("reloaded"), Some(2)), "{e}");
    assert_eq!(c.get("/v2/models/tracker").await.unwrap().json()["versions"], json!(["2"]));
    let m = c.get("/metrics").await.unwrap();
    assert!(String::from_utf8_lossy(&m.body).contains("pmstate_model_reloads_total{result=\"ok\"} 1"));

    // SIGTERM: drain, stop, exit 0
    signal(child.id(), "-TERM");
    assert_eq!(lines.next()["event"], "draining");
    assert_eq!(lines.next()["event"], "stopped");
    let status = exit_of(&mut child);
    assert!(status.success(), "{status:?}");
}

/// `--max-inflight-answer-bytes` reaches the server: an answer larger than
/// the whole budget is refused with 400, naming the budget.
#[tokio::test(flavor = "current_thread")]
async fn the_answer_budget_flag_bounds_every_answer() {
    let ckpt = data("smpl_tracker/last.ckpt");
    let obs = data("smpl_tracker/obs.safetensors");
    let (mut child, _lines, addr) = serve(&ckpt, &["--max-inflight-answer-bytes", "64"]);
    let c = Client::new(addr).with_timeout(WATCHDOG);
    let r = c.post("/v2/models/tracker/infer", infer_body(&obs, &[0]), &[]).await.unwrap();
    let text = String::from_utf8_lossy(&r.body).into_owned();
    assert_eq!(r.status, 400, "{text}");
    assert!(text.contains("over the budget of 64 for all answers in flight"), "{text}");
    signal(child.id(), "-TERM");
    assert!(exit_of(&mut child).success());
}

/// `serve --pipeline`: the tracker's deployment pipeline by the exported
/// graph's input names and shapes; the recorded inputs answered bitwise as
/// `Pipeline::forward` answers them; the contract as YAML.
#[tokio::test(flavor = "current_thread")]
async fn serve_pipeline_answers_like_the_pipeline_and_serves_its_contract() {
    let ckpt = data("g1_amp_deploy/last.ckpt");
    let inputs_file = data("../deploy/g1_amp_deploy/inputs_b16.safetensors");
    let inputs = candle_core::safetensors::load(&inputs_file, &Device::Cpu).unwrap();
    let p = pmstate_deploy::Pipeline::load(&ckpt, None).unwrap();
    let want = p.forward(&inputs).unwrap();

    let (mut child, lines, addr) = serve(&ckpt, &["--pipeline"]);
    let c = Client::new(addr).with_timeout(WATCHDOG);
    let meta = c.get("/v2/models/tracker").await.unwrap().json();
    let dof_pos = meta["inputs"].as_array().unwrap().iter().find(|i| i["name"] == "mimic_future_dof_pos").cloned();
    assert_eq!(dof_pos.map(|i| i["shape"].clone()), Some(json!([-1, 4, 29])), "{meta}");

    let mut names: Vec<&String> = inputs.keys().collect();
    names.sort();
    let body: Vec<Value> = names
        .iter()
        .map(|k| {
            let t = &inputs[*k];
            json!({"name": k, "shape": t.dims(), "datatype": "FP32", "data": t.flatten_all().unwrap().to_vec1::<f32>().unwrap()})
        })
        .collect();
    let r =
        c.post("/v2/models/tracker/infer", serde_json::to_vec(&json!({ "inputs": body })).unwrap(), &[]).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let reply = r.json();
    let outs = reply["outputs"].as_array().unwrap();
    assert_eq!(outs.len(), 4);
    for ((name, t), o) in want.named().into_iter().zip(outs) {
        assert_eq!((o["name"].as_str(), o["shape"].clone()), (Some(name), json!([16, 29])));
        let got: Vec<f32> = o["data"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        assert_eq!(bits(&got), bits(&t.flatten_all().unwrap().to_vec1::<f32>().unwrap()), "{name}");
    }
    let yaml = c.get("/v2/models/tracker/contract").await.unwrap();
    assert_eq!(yaml.status, 200);
    assert_eq!(String::from_utf8(yaml.body.to_vec()).unwrap(), p.contract().to_yaml());

    signal(child.id(), "-TERM");
    assert_eq!(lines.next()["event"], "draining");
    assert!(exit_of(&mut child).success());

    // a width pin applies to policies only
    let out = refused(
        Command::new(env!("CARGO_BIN_EXE_pmstate"))
            .args(["serve", "--pipeline", "--width", "current_dof_pos=29", "--addr", "127.0.0.1:0"])
            .arg(&ckpt),
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--pipeline") && err.contains("--width"), "{err}");
}

/// `serve --pipeline` on configs whose observation layout the actor does
/// not read (one future step more than it was trained on): refused at
/// start-up with exit 2, naming both widths, never listening.
#[test]
fn serve_pipeline_refuses_configs_the_actor_does_not_read_naming_both_widths() {
    let dir = tempfile::tempdir().unwrap();
    let (edited, observations, actor) = configs::g1_with_one_future_step_more(dir.path());
    let out = refused(
        Command::new(env!("CARGO_BIN_EXE_pmstate")).args(["serve", "--pipeline", "--addr", "127.0.0.1:0"]).arg(&edited),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("with {actor} values")) && err.contains(&format!("give {observations}")), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("listening"), "it listened");
}

/// `--addr localhost:0` (the README's curl lines say localhost): a loopback
/// address, a free port, answering; a number that is not a port is refused
/// with the forms `--addr` takes.
#[tokio::test(flavor = "current_thread")]
async fn addr_takes_a_host_name_or_a_port_alone() {
    let ckpt = data("smpl_tracker/last.ckpt");
    let (mut child, lines, addr) = serve_at("localhost:0", &ckpt, &[]);
    assert!(addr.ip().is_loopback(), "{addr}");
    let r = Client::new(addr).with_timeout(WATCHDOG).get("/v2/health/ready").await.unwrap();
    assert_eq!((r.status, r.json()), (200, json!({"ready": true})));
    signal(child.id(), "-TERM");
    assert_eq!(lines.next()["event"], "draining");
    assert!(exit_of(&mut child).success());

    let out = refused(Command::new(env!("CARGO_BIN_EXE_pmstate")).args(["serve", "--addr", "80800"]).arg(&ckpt));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("expected IP:PORT, HOST:PORT or PORT"), "{err}");
}

/// The done-when of the issue, with curl: a server started from a
/// checkpoint written by ProtoMotions' own `BaseAgent.save` answers the
/// recorded rows with bitwise the mean_action of `pmstate policy run`.
#[test]
fn curl_gets_the_mean_action_of_policy_run() {
    if !Command::new("curl").arg("--version").output().is_ok_and(|o| o.status.success()) {
        println!("skipped: curl is not on PATH");
        return;
    }
    let ckpt = data("smpl_tracker/last.ckpt");
    let obs = data("smpl_tracker/obs.safetensors");
    let tmp = tempfile::tempdir().unwrap();
    let want_mean = policy_run_mean(&ckpt, &obs, tmp.path());
    let body = tmp.path().join("infer.json");
    std::fs::write(&body, infer_body(&obs, &(0..8).collect::<Vec<_>>())).unwrap();

    let (mut child, lines, addr) = serve(&ckpt, &[]);
    let out = Command::new("curl")
        .args(["-sS", "--fail-with-body", "--max-time", "120", "-H", "content-type: application/json"])
        .arg("--data-binary")
        .arg(format!("@{}", body.display()))
        .arg(format!("http://{addr}/v2/models/tracker/infer"))
        .output()
        .unwrap();
    signal(child.id(), "-TERM");
    assert!(
        out.status.success(),
        "curl: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["outputs"][0]["shape"], json!([8, 69]));
    assert_eq!(mean_bits(&reply), bits(&want_mean));
    assert_eq!(lines.next()["event"], "draining");
    assert!(exit_of(&mut child).success());
}

/// A request whose headers and first half of body were sent: in flight at the server.
struct Held {
    tcp: TcpStream,
    rest: Vec<u8>,
}

impl Held {
    fn start(addr: SocketAddr, body: &[u8]) -> Held {
        let mut tcp = TcpStream::connect(addr).unwrap();
        // a read that waits longer is a hang (not a speed check)
        tcp.set_read_timeout(Some(WATCHDOG)).unwrap();
        let head = format!(
            "POST /v2/models/tracker/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             connection: close\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        tcp.write_all(head.as_bytes()).unwrap();
        let half = body.len() / 2;
        tcp.write_all(&body[..half]).unwrap();
        Held { tcp, rest: body[half..].to_vec() }
    }

    /// Sends the rest of the body; the status and the JSON answer.
    fn finish(mut self) -> (u16, Value) {
        self.tcp.write_all(&self.rest).unwrap();
        let mut got = Vec::new();
        self.tcp.read_to_end(&mut got).unwrap_or_else(|e| panic!("reading the answer: {e}"));
        let text = String::from_utf8_lossy(&got);
        let status: u16 = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{text}"));
        let body = &got[text.find("\r\n\r\n").unwrap_or_else(|| panic!("{text}")) + 4..];
        (status, serde_json::from_slice(body).unwrap_or(Value::Null))
    }

    /// Reads what comes back without sending the rest: the bytes, or the error of the read.
    fn abandoned(mut self) -> Result<Vec<u8>, std::io::Error> {
        let mut got = Vec::new();
        self.tcp.read_to_end(&mut got).map(|_| got)
    }
}

/// Polls the server's `pmstate_requests_in_flight` until it is `n`.
async fn until_in_flight(c: &Client, n: usize) {
    let start = Instant::now();
    loop {
        let text = String::from_utf8(c.get("/metrics").await.unwrap().body.to_vec()).unwrap();
        let now = text.lines().find_map(|l| l.strip_prefix("pmstate_requests_in_flight ")).map(str::trim);
        if now == Some(&n.to_string()) {
            return;
        }
        assert!(start.elapsed() < WATCHDOG, "requests in flight: {now:?}, waiting for {n}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn sigint_and_sigterm_answer_every_request_in_flight_then_exit_0() {
    let ckpt = data("smpl_tracker/last.ckpt");
    let obs = data("smpl_tracker/obs.safetensors");
    let tmp = tempfile::tempdir().unwrap();
    let want_mean = policy_run_mean(&ckpt, &obs, tmp.path());
    for sig in ["-INT", "-TERM"] {
        // the held bodies are not cut off as stalled while the test waits on them
        let (mut child, lines, addr) = serve(&ckpt, &["--body-stall-timeout", "120"]);
        let c = Client::new(addr).with_timeout(WATCHDOG);
        // three requests in flight (headers and half a body each), one row each
        let held: Vec<(usize, Held)> =
            [1, 4, 6].into_iter().map(|i| (i, Held::start(addr, &infer_body(&obs, &[i])))).collect();
        until_in_flight(&c, 3).await;
        signal(child.id(), sig);
        assert_eq!(lines.next()["event"], "draining", "{sig}");
        // the listener is closed, the requests in flight are answered
        for (i, h) in held {
            let (status, reply) = h.finish();
            assert_eq!(status, 200, "{sig}: row {i}: {reply}");
            assert_eq!(mean_bits(&reply), bits(&want_mean[i * 69..(i + 1) * 69]), "{sig}: row {i}");
        }
        assert_eq!(lines.next()["event"], "stopped", "{sig}");
        let status = exit_of(&mut child);
        assert!(status.success(), "{sig}: {status:?}");
    }
}

/// While a stalled client holds the drain, the server says what it waits
/// for and until when; a second SIGINT/SIGTERM stops it at once, exit 128 +
/// the signal's number, the stalled connection closed unanswered.
#[tokio::test(flavor = "current_thread")]
async fn a_second_signal_during_the_drain_stops_at_once_with_128_plus_its_number() {
    let ckpt = data("smpl_tracker/last.ckpt");
    let obs = data("smpl_tracker/obs.safetensors");
    for (first, second, name, code) in [("-INT", "-INT", "SIGINT", 130), ("-TERM", "-TERM", "SIGTERM", 143)] {
        // a drain that would wait long: only the second signal ends it
        let (mut child, lines, addr) = serve(&ckpt, &["--drain-timeout", "600", "--body-stall-timeout", "600"]);
        let c = Client::new(addr).with_timeout(WATCHDOG);
        let held = Held::start(addr, &infer_body(&obs, &[0]));
        until_in_flight(&c, 1).await;
        signal(child.id(), first);
        let e = lines.next();
        assert_eq!(e["event"], "draining", "{e}");
        assert_eq!((e["requests"].as_u64(), e["timeout_seconds"].as_f64()), (Some(1), Some(600.0)), "{e}");
        assert!(e["connections"].as_u64() >= Some(1), "{e}");
        signal(child.id(), second);
        let e = lines.next();
        let forced = if second == "-INT" { 2 } else { 15 };
        assert_eq!((e["event"].as_str(), e["signal"].as_i64()), (Some("drain_forced"), Some(forced)), "{name}: {e}");
        assert_eq!(lines.next()["event"], "stopped", "{name}");
        assert_eq!(exit_of(&mut child).code(), Some(code), "{name}");
        match held.abandoned() {
            Ok(got) => assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got)),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        }
    }
}

/// The text mode's drain lines name what the drain waits for, its deadline
/// and the way out.
#[tokio::test(flavor = "current_thread")]
async fn the_drain_line_says_what_it_waits_for_and_how_long() {
    let ckpt = data("smpl_tracker/last.ckpt");
    let obs = data("smpl_tracker/obs.safetensors");
    let mut child = Command::new(env!("CARGO_BIN_EXE_pmstate"))
        .args(["serve", "--addr", "127.0.0.1:0", "--name", "tracker", "--drain-timeout", "600"])
        .args(["--body-stall-timeout", "600"])
        .arg(&ckpt)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut child);
    let first = lines.next_text();
    let addr: SocketAddr = first
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http://").and_then(|a| a.parse().ok()))
        .unwrap_or_else(|| panic!("no address in {first}"));
    let c = Client::new(addr).with_timeout(WATCHDOG);
    let held = Held::start(addr, &infer_body(&obs, &[0]));
    until_in_flight(&c, 1).await;
    signal(child.id(), "-INT");
    let line = lines.next_text();
    assert!(line.contains("waiting for 1 request(s) in flight"), "{line}");
    assert!(line.contains("at most 600 s") && line.contains("a second Ctrl-C stops now"), "{line}");
    signal(child.id(), "-INT");
    assert_eq!(exit_of(&mut child).code(), Some(130));
    drop(held);
}

#[tokio::test(flavor = "current_thread")]
async fn a_request_that_outlasts_the_drain_timeout_is_dropped_and_serve_exits_0() {
    let ckpt = data("smpl_tracker/last.ckpt");
    let obs = data("smpl_tracker/obs.safetensors");
    let (mut child, lines, addr) = serve(&ckpt, &["--drain-timeout", "0.5", "--body-stall-timeout", "120"]);
    let c = Client::new(addr).with_timeout(WATCHDOG);
    // a client that stalls mid-body (the body timeout, 30 s, is far off)
    let held = Held::start(addr, &infer_body(&obs, &[0]));
    until_in_flight(&c, 1).await;
    signal(child.id(), "-TERM");
    assert_eq!(lines.next()["event"], "draining");
    let e = lines.next();
    assert_eq!((e["event"].as_str(), e["seconds"].as_f64()), (Some("drain_timed_out"), Some(0.5)), "{e}");
    assert_eq!(lines.next()["event"], "stopped");
    assert!(exit_of(&mut child).success());
    // its connection was closed without an answer (a reset: the server never read the rest)
    match held.abandoned() {
        Ok(got) => assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got)),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
}

/// Runs a `pmstate serve` that must refuse to start; one that serves
/// instead is killed (after the watchdog: a hang, not a speed check) and fails.
fn refused(cmd: &mut Command) -> std::process::Output {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > WATCHDOG {
            let _ = child.kill();
            panic!("{cmd:?} is serving instead of refusing: {:?}", child.wait_with_output().unwrap());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn serve_refuses_what_it_cannot_serve() {
    let bin = env!("CARGO_BIN_EXE_pmstate");
    let ckpt = data("smpl_tracker/last.ckpt");
    // a width pin the checkpoint contradicts, a bad model name, a missing file: exit 2, named
    for (args, want) in [
        (vec!["--width", "max_coords_obs=2000"], "--width max_coords_obs"),
        (vec!["--name", "a/b"], "model name \"a/b\""),
        (vec!["--max-batch", "0"], "--max-batch"),
        (vec!["--drain-timeout", "0"], "--drain-timeout"),
        (vec!["--max-inflight-answer-bytes", "0"], "--max-inflight-answer-bytes"),
        (vec!["--max-inflight-answer-bytes", "5000000000"], "must be under 4 GiB"),
    ] {
        let out = refused(Command::new(bin).arg("serve").args(&args).args(["--addr", "127.0.0.1:0"]).arg(&ckpt));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let out = refused(Command::new(bin).args(["serve", "--addr", "127.0.0.1:0", "/nonexistent/last.ckpt"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/last.ckpt"));
}

/// [`serve`] started by `bash -c "LIMITS; exec pmstate ..."`: under resource limits (`ulimit`).
fn serve_limited(limits: &str, ckpt: &Path, args: &[&str]) -> (Child, Lines, SocketAddr) {
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(format!("{limits}; exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_pmstate"))
        .args(["--json", "serve", "--addr", "127.0.0.1:0", "--name", "tracker"])
        .args(args)
        .arg(ckpt)
        // one malloc arena per thread would reserve 64 MiB of address space each: the
        // limit below would measure the number of threads, not what requests cost
        .env("MALLOC_ARENA_MAX", "2")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut child);
    let first = lines.next();
    assert_eq!(first["event"], "listening", "{first}");
    let addr: SocketAddr = first["addr"].as_str().unwrap().parse().unwrap();
    (child, lines, addr)
}

/// A metric's value from the server's /metrics text.
async fn metric_of(c: &Client, name: &str) -> f64 {
    let text = String::from_utf8(c.get("/metrics").await.unwrap().body.to_vec()).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
}

#[tokio::test(flavor = "current_thread")]
async fn idle_connections_past_the_descriptor_limit_do_not_keep_clients_out() {
    let ckpt = data("smpl_tracker/last.ckpt");
    let obs = data("smpl_tracker/obs.safetensors");
    // 64 descriptors for the server; 150 idle clients, connected (the kernel
    // queues what the server has not accepted) and sending nothing
    let (mut child, lines, addr) = serve_limited("ulimit -n 64", &ckpt, &[]);
    let idle: Vec<TcpStream> = (0..150).map(|_| TcpStream::connect(addr).unwrap()).collect();
    // a new client is answered: idle connections were closed to make room for it
    let c = Client::new(addr).with_timeout(WATCHDOG);
    let r = c.post("/v2/models/tracker/infer", infer_body(&obs, &[0]), &[]).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let evicted = metric_of(&c, "pmstate_connections_evicted_total").await;
    let open = metric_of(&c, "pmstate_connections ").await;
    // 151 connections with at most 64 descriptors: at least 87 were closed to make room
    assert!(evicted >= 87.0 && open <= 64.0, "evicted {evicted}, open {open}");
    drop(idle);
    signal(child.id(), "-TERM");
    assert_eq!(lines.next()["event"], "draining");
    assert!(exit_of(&mut child).success());
}

/// 2 GiB, in the KiB `ulimit -v` takes: the address space `pmstate serve`
/// gets while clients send bodies built to amplify (512 MiB of them at once).
const SERVE_ADDRESS_SPACE_KIB: u64 = 2 << 20;

/// `n` clients post `body` at once; each gets a 400 of under 1 KiB (the
/// error quotes at most a clipped piece of the body).
async fn all_refused(c: &Client, infer: &'static str, body: &[u8], n: usize, what: &str) {
    let sends: Vec<_> = (0..n)
        .map(|_| {
            let (c, body) = (c.clone(), body.to_vec());
            tokio::spawn(async move { c.post(infer, body, &[]).await.unwrap() })
        })
        .collect();
    for s in sends {
        let r = s.await.unwrap();
        let text = String::from_utf8_lossy(&r.body[..r.body.len().min(2000)]).into_owned();
        assert_eq!(r.status, 400, "{what}: {text}");
        assert!(r.body.len() < 1024, "{what}: an answer of {} bytes", r.body.len());
    }
}

#[tokio::test(flavor = "current_thread")]
async fn requests_built_to_amplify_stay_within_an_address_space_limit() {
    let ckpt = data("smpl_tracker/last.ckpt");
    let obs = data("smpl_tracker/obs.safetensors");
    let limits = format!("ulimit -v {SERVE_ADDRESS_SPACE_KIB}");
    let (mut child, lines, addr) = serve_limited(&limits, &ckpt, &["--threads", "1"]);
    let c = Client::new(addr).with_timeout(WATCHDOG);
    let infer = "/v2/models/tracker/infer";
    // `prefix` + "0,0,...,0" + `suffix`, padded with spaces to `len` bytes (valid JSON)
    let bomb = |prefix: &str, suffix: &str, len: usize| -> Vec<u8> {
        let mut b = prefix.as_bytes().to_vec();
        let n = (len - prefix.len() - suffix.len()) / 2;
        b.extend(std::iter::repeat_n(*b"0,", n).flatten());
        b.pop();
        b.extend_from_slice(suffix.as_bytes());
        b.resize(len, b' ');
        b
    };

    // eight data bombs at once, the whole body budget: each 64 MiB of zeros for a [1, 69] input
    let data = bomb(
        r#"{"inputs": [{"name": "previous_actions", "shape": [1, 69], "datatype": "FP32", "data": ["#,
        "]}]}",
        (64 << 20) - 4096,
    );
    all_refused(&c, infer, &data, 8, "data").await;
    drop(data);
    // a 60 MB parameter, two 60 MB outputs lists at once, a 60 MB shape
    let params = bomb(r#"{"inputs": [], "parameters": {"p": ["#, "]}}", 60_000_000);
    all_refused(&c, infer, &params, 1, "parameters").await;
    let mut outputs = br#"{"inputs": [], "outputs": ["#.to_vec();
    outputs.extend(std::iter::repeat_n(*br#"{"name": "value"},"#, 60_000_000 / 18).flatten());
    outputs.pop();
    outputs.extend_from_slice(b"]}");
    all_refused(&c, infer, &outputs, 2, "outputs").await;
    let shape = bomb(r#"{"inputs": [{"name": "previous_actions", "datatype": "FP32", "shape": ["#, "]}]}", 60_000_000);
    all_refused(&c, infer, &shape, 1, "shape").await;

    // the server is still there and answers
    let r = c.post(infer, infer_body(&obs, &[0]), &[]).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    signal(child.id(), "-TERM");
    assert_eq!(lines.next()["event"], "draining");
    assert!(exit_of(&mut child).success());
}

/// A GPC prior served under the same address-space limit: twelve clients
/// ask for the most logits a forward holds (2^24 / (20 x 81) = 10,356
/// rows) in JSON, about 200 MB an answer, and read nothing until the
/// server has handled every request. Without the answer budget the server
/// would hold all twelve answers (past the 2 GiB limit); with it (1 GiB,
/// 16 bytes a logit reserved before the forward) it holds four and
/// answers the others 503, and every 200 is whole.
#[tokio::test(flavor = "current_thread")]
async fn logits_answers_stay_within_an_address_space_limit() {
    let ckpt = data("gpc_prior/inference_last.ckpt");
    let limits = format!("ulimit -v {SERVE_ADDRESS_SPACE_KIB}");
    let (mut child, lines, addr) = serve_limited(&limits, &ckpt, &["--threads", "1", "--max-batch", "20000"]);
    let c = Client::new(addr).with_timeout(WATCHDOG);
    let rows = (1usize << 24) / (20 * 81);
    // teacher forced on token 0 everywhere, observations zero: binary in, JSON out
    let head = json!({"inputs": [
        {"name": "max_coords_obs", "shape": [rows, 343], "datatype": "FP32", "parameters": {"binary_data_size": rows * 343 * 4}},
        {"name": "prior_tokens", "shape": [rows, 20], "datatype": "INT64", "parameters": {"binary_data_size": rows * 20 * 8}},
    ], "outputs": [{"name": "logits"}]});
    let mut body = serde_json::to_vec(&head).unwrap();
    let n = body.len();
    body.resize(n + rows * 343 * 4 + rows * 20 * 8, 0);
    let clients = 12;
    let mut streams: Vec<TcpStream> = (0..clients)
        .map(|_| {
            let mut tcp = TcpStream::connect(addr).unwrap();
            let head = format!(
                "POST /v2/models/tracker/infer HTTP/1.1\r\nhost: x\r\ninference-header-content-length: {n}\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            tcp.write_all(head.as_bytes()).unwrap();
            tcp.write_all(&body).unwrap();
            tcp
        })
        .collect();
    // every request handled (answered or refused), no answer read yet
    let start = Instant::now();
    while metric_of(&c, "pmstate_infer_requests_total").await < clients as f64
        || metric_of(&c, "pmstate_requests_in_flight").await > 0.0
    {
        assert!(start.elapsed() < WATCHDOG, "the requests were not all handled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (mut ok, mut busy) = (0, 0);
    for tcp in &mut streams {
        tcp.set_read_timeout(Some(WATCHDOG)).unwrap();
        let mut got = Vec::new();
        tcp.read_to_end(&mut got).unwrap();
        let split = got.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head") + 4;
        let status = String::from_utf8_lossy(&got[..split]).split(' ').nth(1).map(str::to_owned);
        match status.as_deref() {
            Some("200") => {
                let v: Value = serde_json::from_slice(&got[split..]).unwrap();
                assert_eq!(v["outputs"][0]["shape"], json!([rows, 20, 81]));
                assert_eq!(v["outputs"][0]["data"].as_array().map(Vec::len), Some(rows * 20 * 81));
                ok += 1;
            }
            Some("503") => {
                assert!(String::from_utf8_lossy(&got[split..]).contains("answers in flight"));
                busy += 1;
            }
            s => panic!("status {s:?}: {}", String::from_utf8_lossy(&got[..got.len().min(2000)])),
        }
    }
    // a reservation is 20 x 81 x 16 bytes a row and some headers (268.4 MB): four fit in 1 GiB
    assert_eq!((ok, busy), (4, clients - 4));
    signal(child.id(), "-TERM");
    assert_eq!(lines.next()["event"], "draining");
    assert!(exit_of(&mut child).success());
}
