//! A load generator: N concurrent clients, each sending one request after
//! the other over its own keep-alive connection (HTTP/1.1, a gRPC channel
//! making unary calls, or one gRPC stream) for a fixed time, against
//! a server started in process; throughput and latency percentiles per
//! concurrency level, and the mean rows per forward the server reports.
//! What `pmstate bench-serve` runs (a measurement, never a test).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;

use crate::client::Caller;
use crate::error::StartError;
use crate::events::ignore_events;
use crate::options::ServeOptions;
use crate::server::Server;

/// Where every request goes.
const INFER_PATH: &str = "/v2/models/policy/infer";

/// What to send and for how long.
#[derive(Debug, Clone)]
pub struct LoadPlan {
    /// Concurrency levels, measured in this order.
    pub clients: Vec<usize>,
    /// Seconds of measurement per level (after `warmup`).
    pub seconds: f64,
    /// Seconds of unmeasured load before each level.
    pub warmup: f64,
    /// The request body every client sends (JSON, or a JSON header and
    /// binary tensor data: see `headers`).
    pub body: Bytes,
    /// The request's headers (`content-type`, and for the binary tensor
    /// extension `Inference-Header-Content-Length`).
    pub headers: Vec<(&'static str, String)>,
    /// Rows in one request.
    pub rows_per_request: usize,
    /// Send this gRPC `ModelInfer` request instead of `body` over HTTP
    /// (the server must serve gRPC: [`ServeOptions::grpc`]), one channel
    /// (one HTTP/2 connection) per client, as `tritonclient.grpc` does.
    pub grpc: Option<crate::grpc::proto::ModelInferRequest>,
    /// Send `grpc` on one `ModelStreamInfer` stream per client instead of
    /// unary calls (Triton's streaming API, as a robot or simulator that
    /// keeps one stream open and asks at its control rate would): the next
    /// request goes out once the last one's answer has come back.
    pub grpc_stream: bool,
    /// Worker threads of the server's transport runtime (HTTP and gRPC),
    /// as `pmstate serve --transport-threads`.
    pub transport_threads: usize,
    /// Worker threads of the clients' runtime.
    pub client_threads: usize,
}

/// One concurrency level's result.
#[derive(Debug, Clone, Serialize)]
pub struct LoadResult {
    /// Concurrent clients.
    pub clients: usize,
    /// Requests answered with 200 in the measured time.
    pub requests: u64,
    /// Requests answered otherwise (or not at all).
    pub errors: u64,
    /// Measured seconds.
    pub seconds: f64,
    /// Rows answered per second.
    pub rows_per_s: f64,
    /// Median latency seen by the clients, seconds.
    pub p50: f64,
    /// 99th percentile latency seen by the clients, seconds.
    pub p99: f64,
    /// Mean rows per forward in the measured time (from `/metrics`).
    pub rows_per_forward: f64,
    /// Mean seconds per forward in the measured time (from `/metrics`):
    /// the forward under the same conditions as the requests around it.
    pub forward_seconds: f64,
    /// CPU seconds of this whole process (server and clients, every
    /// thread) per row answered; time other processes take from the cores
    /// does not count. None off Linux.
    pub cpu_seconds_per_row: Option<f64>,
    /// The part of `cpu_seconds_per_row` the load generator's own threads
    /// took (its clients run on a runtime of their own, threads named
    /// `pmstate-client`): what a deployment's clients spend on other
    /// machines. None off Linux.
    pub client_cpu_seconds_per_row: Option<f64>,
    /// The part of `cpu_seconds_per_row` the server's forward threads
    /// (`pmstate-forward`) took: the forward under load, beside the
    /// in-process one. None off Linux.
    pub forward_cpu_seconds_per_row: Option<f64>,
    /// The part of `cpu_seconds_per_row` the server's batching thread
    /// (`pmstate-batcher`: forming batches, merging rows, splitting and
    /// handing back answers) took, where it has a thread of its own (a
    /// repository's models); a single model's batching loop runs on a
    /// forward thread ([`crate::batcher::Placement::ForwardPool`]) and its
    /// time is the forward's, this zero. The rest, less the clients' and
    /// the forward's, is the server's transport (its tokio threads, named
    /// `pmstate-server` here: HTTP or gRPC, decoding, encoding). None off
    /// Linux.
    pub batcher_cpu_seconds_per_row: Option<f64>,
    /// Worker threads of the server's transport runtime ([`LoadPlan::transport_threads`]).
    pub transport_threads: usize,
    /// Worker threads of the clients' runtime ([`LoadPlan::client_threads`]).
    pub client_threads: usize,
}

/// The prefix of the server's forward threads' names (see server.rs).
const FORWARD_THREAD: &str = "pmstate-forward";

/// The name of the load generator's client threads.
const CLIENT_THREAD: &str = "pmstate-client";

/// The name of the server's batching thread (see batcher.rs).
const BATCHER_THREAD: &str = "pmstate-batcher";

/// The name of the in-process server's runtime threads (its transport).
const SERVER_THREAD: &str = "pmstate-server";

/// CPU seconds used so far by every thread of this process (Linux:
/// /proc/self/task/*/schedstat); None elsewhere. On a shared machine the
/// CPU time a piece of work takes moves far less than its wall time.
pub fn process_cpu_seconds() -> Option<f64> {
    threads_cpu_seconds(|_| true)
}

/// CPU seconds used so far by the threads of this process whose name
/// (`/proc/self/task/*/comm`) `take` accepts (Linux); None elsewhere.
/// Threads that have exited no longer count.
fn threads_cpu_seconds(take: impl Fn(&str) -> bool) -> Option<f64> {
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = task.ok()?.path();
        // a thread that exits between the listing and the read is skipped
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else { continue };
        if !take(comm.trim_end()) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(dir.join("schedstat")) else { continue };
        total = total.saturating_add(stat.split_whitespace().next()?.parse::<u64>().ok()?);
    }
    Some(total as f64 * 1e-9)
}

/// The sum and count of a histogram in the metrics text.
fn histogram(text: &str, name: &str) -> (f64, f64) {
    let value = |suffix: &str| {
        let key = format!("{name}_{suffix} ");
        text.lines().find_map(|l| l.strip_prefix(&key)).and_then(|v| v.trim().parse::<f64>().ok()).unwrap_or(0.0)
    };
    (value("sum"), value("count"))
}

/// The `q` quantile of sorted `v` (nearest rank).
fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// A boxed future a client's task can hold across awaits (the tasks run on
/// a multi-threaded runtime: `Send`).
type Pending<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// What one request of a closed-loop client came to.
enum Outcome {
    /// Answered.
    Answered,
    /// Refused, the connection still usable.
    Refused,
    /// The connection (or stream) broke: a new one for the next request.
    Broken,
}

/// One client of a level in a closed loop until `stop`: a connection made
/// with `connect` (again after it breaks; a refused connection is retried
/// without spinning), one request at a time with `call`, each request's
/// latency (or its failure) kept while `measuring`. The three transports'
/// clients differ only in `connect` and `call`.
async fn closed_loop<C>(
    measuring: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    mut connect: impl FnMut() -> Pending<'static, Option<C>>,
    mut call: impl for<'c> FnMut(&'c mut C) -> Pending<'c, Outcome>,
) -> (Vec<f64>, u64) {
    let (mut lat, mut errors) = (Vec::new(), 0u64);
    let mut conn = None;
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        if conn.is_none() {
            conn = connect().await;
            if conn.is_none() {
                // refused (the connection limit, say): counted below, tried again without spinning
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let ok = match conn.as_mut() {
            Some(c) => match call(c).await {
                Outcome::Answered => true,
                Outcome::Refused => false,
                Outcome::Broken => {
                    conn = None;
                    false
                }
            },
            None => false,
        };
        if measuring.load(Ordering::Relaxed) {
            if ok {
                lat.push(t.elapsed().as_secs_f64());
            } else {
                errors += 1;
            }
        }
    }
    (lat, errors)
}

/// One gRPC client of a level: `ModelInfer` with `req` in a loop on a
/// channel of its own (a new one after a transport failure).
async fn grpc_caller(
    addr: crate::options::GrpcAddr,
    req: crate::grpc::proto::ModelInferRequest,
    measuring: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> (Vec<f64>, u64) {
    let connect = || -> Pending<'static, Option<GrpcClient>> {
        let addr = addr.clone();
        Box::pin(async move { crate::grpc::connect(&addr).await.ok() })
    };
    closed_loop(measuring, stop, connect, |c: &mut GrpcClient| {
        let req = req.clone();
        Box::pin(async move {
            match c.model_infer(req).await {
                Ok(_) => Outcome::Answered,
                Err(status) if matches!(status.code(), tonic::Code::Unavailable | tonic::Code::Unknown) => {
                    Outcome::Broken
                }
                Err(_) => Outcome::Refused,
            }
        })
    })
    .await
}

/// One streaming gRPC client of a level: one `ModelStreamInfer` stream
/// (on a channel of its own) carrying `req` in a closed loop, the next
/// request sent once the last one's answer arrived (a new channel and
/// stream after the stream fails). Dropping the sending half at the end
/// ends the stream cleanly.
async fn grpc_stream_caller(
    addr: crate::options::GrpcAddr,
    req: crate::grpc::proto::ModelInferRequest,
    measuring: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> (Vec<f64>, u64) {
    let connect = || -> Pending<'static, Option<OpenStream>> {
        let addr = addr.clone();
        Box::pin(async move { open_stream(&addr).await })
    };
    closed_loop(measuring, stop, connect, |(tx, answers): &mut OpenStream| {
        let req = req.clone();
        Box::pin(async move {
            let answered = match tx.send(req).await {
                Ok(()) => answers.message().await,
                Err(_) => Err(tonic::Status::unavailable("the stream's sending half closed")),
            };
            match answered {
                // an error on the stream is one request refused; the stream goes on
                Ok(Some(m)) if m.error_message.is_empty() && m.infer_response.is_some() => Outcome::Answered,
                Ok(Some(_)) => Outcome::Refused,
                // the stream ended or failed: a new one for the next request
                Ok(None) | Err(_) => Outcome::Broken,
            }
        })
    })
    .await
}

/// A client of the gRPC API on a channel of its own.
type GrpcClient =
    crate::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient<tonic::transport::Channel>;

/// A stream's sending half and its answers.
type OpenStream = (
    tokio::sync::mpsc::Sender<crate::grpc::proto::ModelInferRequest>,
    tonic::Streaming<crate::grpc::proto::ModelStreamInferResponse>,
);

/// A channel to `addr` and one stream on it: the requests' sender (one
/// in flight at a time, so room for one) and the answers.
async fn open_stream(addr: &crate::options::GrpcAddr) -> Option<OpenStream> {
    use tokio_stream::wrappers::ReceiverStream;
    let mut client = crate::grpc::connect(addr).await.ok()?;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let answers = client.model_stream_infer(ReceiverStream::new(rx)).await.ok()?.into_inner();
    Some((tx, answers))
}

/// Runs `plan` against a server started with `opts` (on a runtime of its
/// own; the clients on another, so that their CPU time can be told apart),
/// then shuts the server down.
pub fn run_load(opts: ServeOptions, plan: &LoadPlan) -> Result<Vec<LoadResult>, StartError> {
    let rt = crate::blocking::transport_runtime(SERVER_THREAD, plan.transport_threads).map_err(StartError::Runtime)?;
    let clients =
        crate::blocking::transport_runtime(CLIENT_THREAD, plan.client_threads).map_err(StartError::Runtime)?;
    rt.block_on(async {
        let server = Server::start(opts, ignore_events()).await?;
        let handle = server.handle();
        let mut results = Vec::new();
        for &n in &plan.clients {
            results.push(level(&server, clients.handle(), plan, n).await);
        }
        handle.shutdown();
        server.wait().await.map_err(StartError::Runtime)?;
        Ok(results)
    })
}

async fn level(server: &Server, clients: &tokio::runtime::Handle, plan: &LoadPlan, n: usize) -> LoadResult {
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        if let (Some(req), Some(addr)) = (&plan.grpc, server.grpc_addr()) {
            let (req, addr, measuring, stop) = (req.clone(), addr.clone(), measuring.clone(), stop.clone());
            if plan.grpc_stream {
                tasks.push(clients.spawn(grpc_stream_caller(addr, req, measuring, stop)));
            } else {
                tasks.push(clients.spawn(grpc_caller(addr, req, measuring, stop)));
            }
            continue;
        }
        // one connection per simulated caller
        let addr = server.addr();
        let (body, measuring, stop) = (plan.body.clone(), measuring.clone(), stop.clone());
        let headers = plan.headers.clone();
        tasks.push(clients.spawn(async move {
            let connect = || -> Pending<'static, Option<Caller>> {
                let headers = headers.clone();
                Box::pin(async move { Caller::connect(addr, INFER_PATH, &headers).await.ok() })
            };
            closed_loop(measuring, stop, connect, |c: &mut Caller| {
                let body = body.clone();
                Box::pin(async move {
                    match c.post(body).await {
                        Ok(200) => Outcome::Answered,
                        Ok(_) => Outcome::Refused,
                        // a new connection for the next request
                        Err(_) => Outcome::Broken,
                    }
                })
            })
            .await
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(plan.warmup)).await;
    let text = server.handle().metrics_text();
    let (before, fwd_before) =
        (histogram(&text, "pmstate_batch_rows"), histogram(&text, "pmstate_forward_duration_seconds"));
    let cpu_before = process_cpu_seconds();
    let client_cpu_before = threads_cpu_seconds(|name| name == CLIENT_THREAD);
    let forward_cpu_before = threads_cpu_seconds(|name| name.starts_with(FORWARD_THREAD));
    let batcher_cpu_before = threads_cpu_seconds(|name| name == BATCHER_THREAD);
    measuring.store(true, Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(plan.seconds)).await;
    measuring.store(false, Ordering::Relaxed);
    let seconds = start.elapsed().as_secs_f64();
    let cpu = cpu_before.zip(process_cpu_seconds()).map(|(a, b)| b - a);
    let client_cpu = client_cpu_before.zip(threads_cpu_seconds(|name| name == CLIENT_THREAD)).map(|(a, b)| b - a);
    let forward_cpu =
        forward_cpu_before.zip(threads_cpu_seconds(|name| name.starts_with(FORWARD_THREAD))).map(|(a, b)| b - a);
    let batcher_cpu = batcher_cpu_before.zip(threads_cpu_seconds(|name| name == BATCHER_THREAD)).map(|(a, b)| b - a);
    let text = server.handle().metrics_text();
    let (after, fwd_after) =
        (histogram(&text, "pmstate_batch_rows"), histogram(&text, "pmstate_forward_duration_seconds"));
    stop.store(true, Ordering::Relaxed);
    let (mut lat, mut errors) = (Vec::new(), 0);
    for t in tasks {
        if let Ok((l, e)) = t.await {
            lat.extend(l);
            errors += e;
        }
    }
    lat.sort_by(f64::total_cmp);
    let forwards = after.1 - before.1;
    LoadResult {
        clients: n,
        requests: lat.len() as u64,
        errors,
        seconds,
        rows_per_s: (lat.len() * plan.rows_per_request) as f64 / seconds,
        p50: quantile(&lat, 0.5),
        p99: quantile(&lat, 0.99),
        rows_per_forward: if forwards > 0.0 { (after.0 - before.0) / forwards } else { f64::NAN },
        forward_seconds: if forwards > 0.0 { (fwd_after.0 - fwd_before.0) / forwards } else { f64::NAN },
        cpu_seconds_per_row: cpu.map(|c| c / (lat.len() * plan.rows_per_request).max(1) as f64),
        client_cpu_seconds_per_row: client_cpu.map(|c| c / (lat.len() * plan.rows_per_request).max(1) as f64),
        forward_cpu_seconds_per_row: forward_cpu.map(|c| c / (lat.len() * plan.rows_per_request).max(1) as f64),
        batcher_cpu_seconds_per_row: batcher_cpu.map(|c| c / (lat.len() * plan.rows_per_request).max(1) as f64),
        transport_threads: plan.transport_threads.max(1),
        client_threads: plan.client_threads.max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank_and_histograms_are_read_by_name() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!((quantile(&v, 0.5), quantile(&v, 0.99), quantile(&v, 1.0)), (50.0, 99.0, 100.0));
        assert_eq!(quantile(&[3.0], 0.99), 3.0);
        let text = "pmstate_batch_rows_sum 96.0\npmstate_batch_rows_count 3\npmstate_batch_rows_bucket{le=\"1.0\"} 0\n";
        assert_eq!(histogram(text, "pmstate_batch_rows"), (96.0, 3.0));
    }
}
