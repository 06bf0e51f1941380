//! `pmstate serve --grpc-addr`: the gRPC address is printed after the HTTP
//! one, as text (`... on grpc://IP:PORT`, port 0 resolved) and as the JSON
//! event `grpc_listening`; the port answers; a Unix socket address is
//! created while the server runs and removed when it exits; a bad address
//! is refused by the flag's parser. (The protocol itself is tested against
//! the library in `crates/serve/tests/grpc.rs`.)
#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

/// How long any one step may take before the test calls it a hang (not a speed check).
const WATCHDOG: Duration = Duration::from_secs(120);

fn ckpt() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy/smpl_tracker/last.ckpt")
}

/// The lines a child prints, read on a thread of their own (a child that
/// prints nothing fails the test after [`WATCHDOG`] instead of hanging it).
fn lines(child: &mut Child) -> Receiver<String> {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn serve(args: &[&str]) -> (Child, Receiver<String>) {
    serve_with_env(args, &[])
}

fn serve_with_env(args: &[&str], env: &[(&str, &str)]) -> (Child, Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pmstate"))
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let rx = lines(&mut child);
    (child, rx)
}

fn next(rx: &Receiver<String>) -> String {
    rx.recv_timeout(WATCHDOG).unwrap_or_else(|e| panic!("no line within {WATCHDOG:?}: {e}"))
}

/// SIGTERM, then the exit status (a drain: 0).
fn stop(mut child: Child) {
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}

#[test]
fn the_grpc_address_is_printed_after_the_http_one_with_its_port_resolved() {
    let c = ckpt();
    let ckpt = c.to_str().unwrap();
    let (child, rx) = serve(&["serve", ckpt, "--addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"]);
    let http = next(&rx);
    assert!(http.starts_with("serving policy version 1 from ") && http.contains(" on http://127.0.0.1:"), "{http}");
    let grpc = next(&rx);
    let addr = grpc
        .strip_prefix("serving gRPC (inference.GRPCInferenceService) on grpc://")
        .unwrap_or_else(|| panic!("{grpc}"));
    let addr: SocketAddr = addr.parse().unwrap_or_else(|e| panic!("{grpc}: {e}"));
    assert_ne!(addr.port(), 0, "port 0 resolved: {grpc}");
    assert!(!http.contains(&format!(":{}", addr.port())), "two ports: {http} / {grpc}");
    TcpStream::connect_timeout(&addr, WATCHDOG).expect("the gRPC port answers");
    stop(child);

    // --json: the same as an event
    let (child, rx) = serve(&["--json", "serve", ckpt, "--addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"]);
    let first: serde_json::Value = serde_json::from_str(&next(&rx)).unwrap();
    assert_eq!(first["event"], "listening");
    let second: serde_json::Value = serde_json::from_str(&next(&rx)).unwrap();
    assert_eq!(second["event"], "grpc_listening", "{second}");
    assert!(second["url"].as_str().unwrap().starts_with("grpc://127.0.0.1:"), "{second}");
    stop(child);
}

#[test]
fn a_unix_socket_address_exists_while_serving_and_is_removed_at_exit() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("pmstate.sock");
    let arg = format!("unix:{}", sock.display());
    let c = ckpt();
    let (child, rx) = serve(&["serve", c.to_str().unwrap(), "--addr", "127.0.0.1:0", "--grpc-addr", &arg]);
    next(&rx);
    let grpc = next(&rx);
    assert_eq!(grpc, format!("serving gRPC (inference.GRPCInferenceService) on {arg}"));
    std::os::unix::net::UnixStream::connect(&sock).expect("the socket answers");
    stop(child);
    assert!(!sock.exists(), "the socket file is removed at exit");
}

/// Threads of process `pid` named `name` (Linux: /proc).
fn threads_named(pid: u32, name: &str) -> usize {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

#[test]
fn the_transport_runs_on_as_many_threads_as_asked() {
    if !std::path::Path::new("/proc/self/task").exists() {
        eprintln!("skipped: no /proc to count threads in");
        return;
    }
    let c = ckpt();
    // tokio names its blocking threads (the checkpoint's load ran on one) as
    // its workers: the same load in both runs, so the counts differ by the workers
    let count = |extra: &[&str], env: &[(&str, &str)]| {
        let mut args = vec!["serve", c.to_str().unwrap(), "--addr", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        let (child, rx) = serve_with_env(&args, env);
        next(&rx);
        let n = threads_named(child.id(), "pmstate-http");
        stop(child);
        n
    };
    let named = [count(&["--transport-threads", "1"], &[]), count(&["--transport-threads", "3"], &[])];
    assert!(named[0] >= 1 && named[1] == named[0] + 2, "threads named pmstate-http with 1 and 3 workers: {named:?}");
    // tokio's own variable still sizes the runtime where the flag is not given; the flag wins over it
    assert_eq!(count(&[], &[("TOKIO_WORKER_THREADS", "3")]), named[1], "TOKIO_WORKER_THREADS=3");
    assert_eq!(
        count(&["--transport-threads", "1"], &[("TOKIO_WORKER_THREADS", "3")]),
        named[0],
        "the flag over the variable"
    );
}

#[test]
fn a_bad_grpc_address_is_refused_naming_what_is_expected() {
    let c = ckpt();
    for bad in ["unix:", "nowhere"] {
        let out = Command::new(env!("CARGO_BIN_EXE_pmstate"))
            .args(["serve", c.to_str().unwrap(), "--grpc-addr", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--grpc-addr") && err.contains("unix:"), "{bad}: {err}");
    }
}
