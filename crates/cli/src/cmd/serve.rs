//! `pmstate serve`: a ProtoMotions policy (or, with `--pipeline`, its
//! deployment pipeline; or, with `--repository`, every model of a model
//! repository) behind the Open Inference Protocol (KServe V2 REST and
//! gRPC), with dynamic batching, hot reload and metrics. Everything but the flags lives in pmstate-serve; this module
//! turns flags into [`ServeOptions`] and the server's events into lines.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use pmstate_policy::Globals;
use pmstate_serve::{
    Batching, Event, GrpcAddr, Limits, ModelControl, ModelSource, NonFinite, RepositoryOptions, ServeOptions, Watch,
};

use crate::args::DeviceArg;
use crate::{output, CliError, Global};

/// `pmstate serve [--pipeline] CHECKPOINT [--config P] [--name policy] [--addr 127.0.0.1:8080]`,
/// or `pmstate serve --repository DIR [--model-control-mode none|explicit] [--load-model NAME]...`,
/// both with `[--grpc-addr 127.0.0.1:8001|unix:/path] [--device cpu|cuda]
/// [--max-batch N] [--max-wait-us N] [--queue N] [--spin-us N] [--watch] [--drain-timeout S] [--header-timeout S]
/// [--body-timeout S] [--body-stall-timeout S] [--max-connections N]`
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A ProtoMotions checkpoint (last.ckpt, inference_last.ckpt, or its safetensors conversion).
    #[arg(required_unless_present = "repository")]
    checkpoint: Option<PathBuf>,
    /// Serve a model repository in Triton's layout instead of one
    /// checkpoint: DIR/NAME/N/ holds version N of model NAME (a checkpoint
    /// and its configs), DIR/NAME/config.json optionally names the
    /// checkpoint file, --pipeline mode and batching. Every version is
    /// served (requests naming no version go to the highest), each with
    /// its own batcher and metrics; Triton's repository API
    /// (/v2/repository/index, .../models/NAME/load, .../unload) answers.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["checkpoint", "config", "pipeline", "name", "widths"])]
    repository: Option<PathBuf>,
    /// none: every model of --repository is loaded at start, load and
    /// unload requests are refused; explicit: only --load-model models are
    /// loaded at start, clients load and unload by the repository API.
    /// Default: none.
    #[arg(long, value_enum, requires = "repository")]
    model_control_mode: Option<ControlMode>,
    /// A model of --repository to load at start (repeatable; with
    /// --model-control-mode explicit). The server does not start if it fails.
    #[arg(long = "load-model", value_name = "NAME", requires = "repository")]
    load_models: Vec<String>,
    /// The resolved configs (default: resolved_configs_inference.pt, else resolved_configs.pt, next to CHECKPOINT).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Serve the tracker's deployment pipeline instead of the policy: the
    /// inputs and outputs of the ONNX graph ProtoMotions' exporter writes
    /// (sensors and reference motion in; actions and PD targets out), its
    /// contract at /v2/models/NAME/contract. Runs on the CPU.
    #[arg(long, conflicts_with = "widths")]
    pipeline: bool,
    /// The model name in URLs (/v2/models/NAME/infer).
    #[arg(long, default_value = "policy")]
    name: String,
    /// Where to listen: IP:PORT, HOST:PORT (localhost:8080) or a port alone
    /// (8080: 127.0.0.1:8080); port 0 picks a free port (the address is printed).
    #[arg(long, default_value = "127.0.0.1:8080", value_parser = listen_addr)]
    addr: SocketAddr,
    /// Serve the KServe V2 gRPC API (inference.GRPCInferenceService, with
    /// Triton's ModelStreamInfer) here too, on the same model, batcher,
    /// limits and metrics: IP:PORT, HOST:PORT or PORT as --addr (port 0
    /// picks a free port; the address is printed as grpc://IP:PORT), or
    /// unix:/PATH for a Unix domain socket (local clients; removed at exit).
    #[arg(long, value_parser = grpc_addr)]
    grpc_addr: Option<GrpcAddr>,
    /// Where the policy runs (a pipeline runs on the CPU).
    #[arg(long, value_enum, default_value = "cpu")]
    device: DeviceArg,
    /// Most rows in one forward, and in one request (Triton's
    /// max_batch_size: a request with more rows is refused with 400); 1: no batching.
    #[arg(long, default_value_t = 256, value_parser = crate::args::positive)]
    max_batch: usize,
    /// Microseconds the oldest queued request may wait for more rows (0: take
    /// what is queued when the forward is free, as Triton's default).
    #[arg(long, default_value_t = 0)]
    max_wait_us: u64,
    /// Most requests waiting; more are refused with 503 and Retry-After.
    #[arg(long, default_value_t = 1024, value_parser = crate::args::positive)]
    queue: usize,
    /// Microseconds the batching thread polls for the next request after a
    /// batch before it sleeps: a lone closed-loop client's next request is
    /// then taken without a thread wake-up (at most this much CPU per
    /// batch; 0: sleep at once; at most 1000000).
    #[arg(long, default_value_t = spin_us_default(), value_parser = clap::value_parser!(u64).range(0..=MAX_SPIN_US))]
    spin_us: u64,
    /// Follow CHECKPOINT: a new file written over it is loaded, checked
    /// (same in_keys, widths, action size) and swapped in between batches.
    /// SIGHUP reloads with or without it.
    #[arg(long)]
    watch: bool,
    /// How often --watch looks at the file, in seconds.
    #[arg(long, default_value_t = 1.0, value_parser = crate::args::positive_seconds, requires = "watch")]
    watch_interval: f64,
    /// Pin the width of an observation key the checkpoint leaves open
    /// (KEY=N, repeatable; it takes precedence over the width the resolved
    /// configs give): model metadata then says [-1, N] and requests of
    /// another width are refused.
    #[arg(long = "width", value_parser = width_pin)]
    widths: Vec<(String, usize)>,
    /// Refuse requests holding NaN or infinite inputs (400) instead of running them.
    #[arg(long)]
    reject_non_finite: bool,
    /// Largest request body in bytes (413 beyond it).
    #[arg(long, default_value_t = 64 << 20, value_parser = crate::args::positive)]
    max_body_bytes: usize,
    /// Bytes of answers held at once, all clients together (under 4 GiB):
    /// each request reserves a bound of its answer's size before it is
    /// queued; one that does not fit beside the answers in flight gets 503
    /// and Retry-After, one larger than the whole budget 400. What bounds
    /// the memory of large answers (a GPC prior's logits).
    #[arg(long, default_value_t = 1 << 30, value_parser = crate::args::positive)]
    max_inflight_answer_bytes: usize,
    /// Longest wait for a request's head, in seconds, counted from when the
    /// connection starts waiting for one (so also how long an idle
    /// kept-alive connection is kept): the connection is closed after it.
    #[arg(long, default_value_t = 30.0, value_parser = crate::args::positive_seconds)]
    header_timeout: f64,
    /// Longest time to receive a request body, in seconds (408 after it).
    #[arg(long, default_value_t = 30.0, value_parser = crate::args::positive_seconds)]
    body_timeout: f64,
    /// Longest pause between two pieces of a request body, in seconds: a
    /// client that stalls mid-body gets 408 after it.
    #[arg(long, default_value_t = 5.0, value_parser = crate::args::positive_seconds)]
    body_stall_timeout: f64,
    /// Most connections open at once; at the cap (or out of file
    /// descriptors) the connection idle the longest is closed to make room.
    #[arg(long, default_value_t = 1024, value_parser = crate::args::positive)]
    max_connections: usize,
    /// Threads of the forward (default: all cores).
    #[arg(long, value_parser = crate::args::positive)]
    threads: Option<usize>,
    /// Threads answering HTTP and gRPC: connections, decoding, encoding
    /// (default: TOKIO_WORKER_THREADS where set, else one per three cores,
    /// at least one; fewer threads wake one another less often, see
    /// docs/serve.md).
    #[arg(long, value_parser = crate::args::positive)]
    transport_threads: Option<usize>,
    /// Longest graceful shutdown on SIGINT/SIGTERM, in seconds: requests
    /// still running after it are dropped (their connections closed).
    #[arg(long, default_value_t = 30.0, value_parser = crate::args::positive_seconds)]
    drain_timeout: f64,
    /// Load a checkpoint holding globals torch's safe loader rejects, or
    /// configs holding globals outside ProtoMotions', torch's and Python's
    /// inert builtins, at start-up and on reload (each is named on stderr;
    /// nothing is ever run).
    #[arg(long)]
    allow_unsafe_globals: bool,
}

/// `--model-control-mode`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ControlMode {
    /// Everything loaded at start; no load or unload.
    None,
    /// Load and unload by request.
    Explicit,
}

/// The longest `--spin-us` taken: the library's bound.
pub(crate) const MAX_SPIN_US: u64 = Batching::MAX_SPIN.as_micros() as u64;

/// `--spin-us`'s default: the library's.
pub(crate) const fn spin_us_default() -> u64 {
    Batching::DEFAULT_SPIN.as_micros() as u64
}

/// `IP:PORT`, `HOST:PORT` or `PORT` (on 127.0.0.1, as the default address).
/// A host name takes its first IPv4 address (localhost: 127.0.0.1, what
/// curl and most clients try first), else its first address.
fn listen_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    let expected = "expected IP:PORT, HOST:PORT or PORT, e.g. 127.0.0.1:8080, localhost:8080 or 8080";
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err(format!("\"{s}\": no port; {expected}"));
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(format!("\"{s}\": {expected}"));
    }
    let found: Vec<SocketAddr> =
        s.to_socket_addrs().map_err(|e| format!("\"{s}\": cannot resolve {host}: {e}"))?.collect();
    found
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| found.first())
        .copied()
        .ok_or_else(|| format!("\"{s}\": {host} has no address"))
}

/// `unix:/PATH` (also `unix:///PATH`, gRPC's own spelling), or a TCP address as [`listen_addr`] reads it.
fn grpc_addr(s: &str) -> Result<GrpcAddr, String> {
    match s.strip_prefix("unix:") {
        Some(path) => {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(format!("\"{s}\": no socket path; expected unix:/PATH, e.g. unix:/tmp/pmstate.sock"));
            }
            Ok(GrpcAddr::Unix(PathBuf::from(path)))
        }
        None => listen_addr(s).map(GrpcAddr::Tcp).map_err(|e| format!("{e}, or unix:/PATH")),
    }
}

/// `KEY=N`.
fn width_pin(s: &str) -> Result<(String, usize), String> {
    let (k, n) = s.split_once('=').ok_or_else(|| format!("\"{s}\": expected KEY=N, e.g. max_coords_obs=358"))?;
    if k.is_empty() {
        return Err(format!("\"{s}\": the key is empty"));
    }
    Ok((k.to_owned(), crate::args::positive(n)?))
}

/// Serves until SIGINT or SIGTERM; each event is a line (or, with
/// `--json`, an object with an `event` field: listening (with
/// `--repository`: model_loaded / model_failed per model, then
/// repository_listening; model_unloaded later), grpc_listening, reloaded,
/// reload_failed, draining, drain_waiting, drain_forced, drain_timed_out,
/// stopped). Exit 0 after a drain; a second SIGINT/SIGTERM while the drain
/// waits stops at once, exit 130 (SIGINT) or 143 (SIGTERM).
pub fn run(a: Args, g: Global) -> Result<ExitCode, CliError> {
    // clap drops `requires = "repository"` when a CHECKPOINT (which
    // conflicts with --repository) is given: checked here too
    if a.repository.is_none() && (a.model_control_mode.is_some() || !a.load_models.is_empty()) {
        return Err(CliError::Usage("--model-control-mode and --load-model apply to --repository DIR".into()));
    }
    let (device, _) = a.device.open()?;
    let source = match (a.repository, a.checkpoint) {
        (Some(dir), _) => {
            let control = match a.model_control_mode {
                None | Some(ControlMode::None) => ModelControl::None,
                Some(ControlMode::Explicit) => ModelControl::Explicit,
            };
            if control == ModelControl::None && !a.load_models.is_empty() {
                return Err(CliError::Usage(
                    "--load-model applies to --model-control-mode explicit (mode none loads every model)".into(),
                ));
            }
            ModelSource::Repository(RepositoryOptions { dir, control, load: a.load_models })
        }
        (None, Some(path)) if a.pipeline => ModelSource::Pipeline { path, config: a.config },
        (None, Some(path)) => ModelSource::Checkpoint { path, config: a.config },
        (None, None) => return Err(CliError::Usage("a CHECKPOINT or --repository DIR is needed".into())),
    };
    let mut opts = ServeOptions::new(source);
    opts.name = a.name;
    opts.addr = a.addr;
    opts.grpc = a.grpc_addr;
    opts.device = device;
    opts.batching = Batching {
        max_batch: a.max_batch,
        max_wait: Duration::from_micros(a.max_wait_us),
        queue: a.queue,
        spin: Duration::from_micros(a.spin_us),
    };
    opts.watch = if a.watch { Watch::Poll { interval: Duration::from_secs_f64(a.watch_interval) } } else { Watch::Off };
    opts.widths = a.widths;
    opts.non_finite = if a.reject_non_finite { NonFinite::Reject } else { NonFinite::Pass };
    let defaults = Limits::default();
    opts.limits = Limits {
        max_body_bytes: a.max_body_bytes,
        max_inflight_body_bytes: defaults.max_inflight_body_bytes.max(a.max_body_bytes),
        max_inflight_answer_bytes: a.max_inflight_answer_bytes,
        drain_timeout: Duration::from_secs_f64(a.drain_timeout),
        header_timeout: Duration::from_secs_f64(a.header_timeout),
        body_timeout: Duration::from_secs_f64(a.body_timeout),
        body_stall_timeout: Duration::from_secs_f64(a.body_stall_timeout),
        max_connections: a.max_connections,
    };
    opts.threads = a.threads;
    opts.files.globals = if a.allow_unsafe_globals { Globals::Allow } else { Globals::Refuse };
    let json = g.json;
    let events = Arc::new(move |e: &Event| {
        let quiet_ok =
            matches!(e, Event::Listening { .. } | Event::GrpcListening { .. } | Event::RepositoryListening { .. });
        if json {
            // an event is plain data: encoding it cannot fail
            let _ = output::json_line(e);
        } else if matches!(
            e,
            Event::ReloadFailed { .. }
                | Event::DrainTimedOut { .. }
                | Event::GlobalAllowed { .. }
                | Event::ModelFailed { .. }
        ) {
            output::err_line(format!("pmstate serve: {e}"));
        } else if quiet_ok || !g.quiet {
            output::line(e);
        }
    });
    // a drain on SIGINT/SIGTERM is the normal way to stop a server: exit 0;
    // a second signal during the drain drops what was in flight: 128 + its number, as a shell reports a kill
    let stopped = pmstate_serve::serve_until_signalled(opts, events, a.transport_threads)?;
    match stopped.forced_by {
        Some(sig) => Ok(ExitCode::from(u8::try_from(128 + sig).unwrap_or(1))),
        None => Ok(ExitCode::SUCCESS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// IP:PORT as before; a port alone and localhost mean 127.0.0.1; the rest is refused with what was expected.
    #[test]
    fn addr_accepts_ip_port_host_port_and_a_port_alone() {
        assert_eq!(listen_addr("0.0.0.0:9000"), Ok(SocketAddr::from(([0, 0, 0, 0], 9000))));
        assert_eq!(listen_addr("[::1]:9000"), Ok("[::1]:9000".parse().unwrap()));
        assert_eq!(listen_addr("8080"), Ok(SocketAddr::from(([127, 0, 0, 1], 8080))));
        let local = listen_addr("localhost:0").unwrap();
        assert!(local.ip().is_loopback() && local.port() == 0, "{local}");
        for bad in ["localhost", "localhost:99999", ":8080", "localhost:http", "70000", ""] {
            let e = listen_addr(bad).unwrap_err();
            assert!(e.contains("IP:PORT") || e.contains("no port"), "{bad}: {e}");
        }
    }

    /// A TCP address as --addr takes it, or a Unix socket path in either of gRPC's spellings.
    #[test]
    fn grpc_addr_takes_tcp_addresses_and_unix_socket_paths() {
        assert_eq!(grpc_addr("127.0.0.1:0"), Ok(GrpcAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], 0)))));
        assert_eq!(grpc_addr("8001"), Ok(GrpcAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], 8001)))));
        assert_eq!(grpc_addr("unix:/tmp/p.sock"), Ok(GrpcAddr::Unix("/tmp/p.sock".into())));
        assert_eq!(grpc_addr("unix:///tmp/p.sock"), Ok(GrpcAddr::Unix("/tmp/p.sock".into())));
        assert_eq!(grpc_addr("unix:rel.sock"), Ok(GrpcAddr::Unix("rel.sock".into())));
        assert!(grpc_addr("unix:").unwrap_err().contains("no socket path"));
        assert!(grpc_addr("nowhere").unwrap_err().contains("unix:/PATH"));
    }
}
