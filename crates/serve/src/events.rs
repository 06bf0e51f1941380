//! What the server tells its operator (listening, loads, reloads and their
//! failures, shutdown), through a callback: the CLI prints them as lines
//! or JSON, tests collect them. The library itself prints nothing.

use std::net::SocketAddr;
use std::sync::Arc;

use serde::Serialize;

/// Something worth telling the operator.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The model is loaded and the server answers at `addr`.
    Listening {
        /// The bound address (port 0 resolved).
        addr: SocketAddr,
        /// The model name.
        model: String,
        /// Its version.
        version: u64,
        /// Its checkpoint.
        checkpoint: String,
        /// sha256 of the checkpoint, when loaded from a file.
        sha256: Option<String>,
    },
    /// The gRPC endpoint answers at `url` (after [`Event::Listening`], when
    /// [`crate::ServeOptions::grpc`] is set).
    GrpcListening {
        /// `grpc://127.0.0.1:8001` (port 0 resolved) or `unix:/path`.
        url: String,
    },
    /// A model repository is served and the server answers at `addr`
    /// (instead of [`Event::Listening`]; each model loaded was reported as
    /// [`Event::ModelLoaded`] before).
    RepositoryListening {
        /// The bound address (port 0 resolved).
        addr: SocketAddr,
        /// The repository directory.
        repository: String,
        /// The models being served.
        models: Vec<String>,
    },
    /// A model version of the repository is served.
    ModelLoaded {
        /// The model.
        model: String,
        /// The version (its directory's number).
        version: u64,
        /// Its checkpoint.
        checkpoint: String,
        /// sha256 of the checkpoint.
        sha256: Option<String>,
    },
    /// A model of the repository failed to load: it is listed UNAVAILABLE,
    /// the others serve on.
    ModelFailed {
        /// The model.
        model: String,
        /// Why.
        reason: String,
    },
    /// A model of the repository was unloaded.
    ModelUnloaded {
        /// The model.
        model: String,
    },
    /// A new checkpoint was swapped in.
    Reloaded {
        /// The new version.
        version: u64,
        /// The checkpoint.
        checkpoint: String,
        /// Its sha256.
        sha256: Option<String>,
        /// Seconds it took to load.
        seconds: f64,
    },
    /// A checkpoint was refused; the previous model keeps serving.
    ReloadFailed {
        /// The checkpoint.
        checkpoint: String,
        /// Why.
        reason: String,
        /// The version still served.
        serving: u64,
    },
    /// A global that would have refused the file was let through
    /// (`--allow-unsafe-globals`): one event per global, before the
    /// model it came with is served.
    GlobalAllowed {
        /// The checkpoint or configs file holding it.
        file: String,
        /// Its dotted key.
        key: String,
        /// `module.name`.
        global: String,
    },
    /// Shutdown began: no new connections, requests in flight finish
    /// (within `timeout_seconds`; a second SIGINT/SIGTERM stops at once).
    Draining {
        /// Connections open (idle ones close at once).
        connections: usize,
        /// Requests being handled: what the drain waits for.
        requests: usize,
        /// The drain timeout: how long it waits at most.
        timeout_seconds: f64,
    },
    /// The drain still waits (every few seconds while it does).
    DrainWaiting {
        /// Connections still open.
        connections: usize,
        /// Requests still being handled.
        requests: usize,
        /// Seconds left before the drain timeout stops the server anyway.
        seconds_left: f64,
    },
    /// A second SIGINT/SIGTERM during the drain: stopped without waiting.
    DrainForced {
        /// The signal (2 SIGINT, 15 SIGTERM).
        signal: i32,
    },
    /// Requests still running when the drain timeout passed were dropped.
    DrainTimedOut {
        /// The timeout in seconds.
        seconds: f64,
    },
    /// Everything stopped.
    Stopped,
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Event::Listening { addr, model, version, checkpoint, sha256 } => {
                write!(f, "serving {model} version {version} from {checkpoint}")?;
                if let Some(s) = sha256 {
                    write!(f, " (sha256 {s})")?;
                }
                write!(f, " on http://{addr}")
            }
            Event::RepositoryListening { addr, repository, models } => {
                write!(f, "serving the model repository {repository} ({} model(s) loaded", models.len())?;
                if !models.is_empty() {
                    write!(f, ": {}", models.join(", "))?;
                }
                write!(f, ") on http://{addr}")
            }
            Event::ModelLoaded { model, version, checkpoint, sha256 } => {
                write!(f, "loaded {model} version {version} from {checkpoint}")?;
                if let Some(s) = sha256 {
                    write!(f, " (sha256 {s})")?;
                }
                Ok(())
            }
            Event::ModelFailed { model, reason } => write!(f, "model {model} is unavailable: {reason}"),
            Event::ModelUnloaded { model } => write!(f, "unloaded {model}"),
            Event::GrpcListening { url } => write!(f, "serving gRPC (inference.GRPCInferenceService) on {url}"),
            Event::Reloaded { version, checkpoint, sha256, seconds } => {
                write!(f, "reloaded {checkpoint} as version {version} in {seconds:.3} s")?;
                if let Some(s) = sha256 {
                    write!(f, " (sha256 {s})")?;
                }
                Ok(())
            }
            Event::ReloadFailed { checkpoint, reason, serving } => {
                write!(f, "reload of {checkpoint} refused, still serving version {serving}: {reason}")
            }
            Event::GlobalAllowed { file, key, global } => {
                write!(f, "warning: {file}: loading the global {global} at {key} (--allow-unsafe-globals)")
            }
            Event::Draining { connections, requests, timeout_seconds } => write!(
                f,
                "shutting down: waiting for {requests} request(s) in flight on {connections} connection(s), \
                 at most {timeout_seconds} s (--drain-timeout); a second Ctrl-C stops now"
            ),
            Event::DrainWaiting { connections, requests, seconds_left } => write!(
                f,
                "still waiting for {requests} request(s) on {connections} connection(s); stopping anyway in {seconds_left:.1} s"
            ),
            Event::DrainForced { signal } => {
                write!(f, "second signal ({}): stopping without waiting for the drain", signal_name(*signal))
            }
            Event::DrainTimedOut { seconds } => write!(f, "drain timeout of {seconds} s passed: stopping anyway"),
            Event::Stopped => write!(f, "stopped"),
        }
    }
}

/// `SIGINT` for 2, `SIGTERM` for 15.
fn signal_name(n: i32) -> String {
    match n {
        2 => "SIGINT".into(),
        15 => "SIGTERM".into(),
        n => format!("signal {n}"),
    }
}

/// Receives events (from any thread).
pub type EventSink = Arc<dyn Fn(&Event) + Send + Sync>;

/// One [`Event::GlobalAllowed`] per global `model` was loaded with.
pub(crate) fn report_allowed_globals(model: &crate::model::LoadedModel, events: &EventSink) {
    for g in model.model.allowed_globals() {
        events(&Event::GlobalAllowed { file: g.file.clone(), key: g.key.clone(), global: g.global.clone() });
    }
}

/// A sink that drops everything.
pub fn ignore_events() -> EventSink {
    Arc::new(|_| {})
}
