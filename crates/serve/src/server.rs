//! [`Server`]: loads the model, binds, serves until asked to stop, then
//! drains: no new connections, requests in flight answered, the batcher
//! and the reload thread stopped.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

use crate::batcher::Batcher;
use crate::error::{LoadError, OptionsError, StartError};
use crate::events::{Event, EventSink};
use crate::metrics::Metrics;
use crate::model::{Cancel, FileStamp, LoadedModel, ModelKind};
use crate::options::{GrpcAddr, Limits, ModelSource, ServeOptions};
use crate::reload::{ReloadConfig, ReloadStats, Reloader};
use crate::slot::ModelSlot;
use crate::state::AppState;

/// A running server.
pub struct Server {
    addr: SocketAddr,
    grpc_addr: Option<GrpcAddr>,
    handle: ServerHandle,
    serve: JoinHandle<std::io::Result<()>>,
    reloader: Option<Reloader>,
    limits: Limits,
}

/// Asks the reload thread for a reload.
type ReloadFn = Arc<dyn Fn() + Send + Sync>;

/// Controls a running server from anywhere (signal handlers, tests).
#[derive(Clone)]
pub struct ServerHandle {
    state: Arc<AppState>,
    stop: Arc<watch::Sender<bool>>,
    /// Turned true (with the signal) to stop without waiting for the drain.
    force: Arc<watch::Sender<Option<i32>>>,
    reload: Option<ReloadFn>,
    events: EventSink,
}

impl ServerHandle {
    /// Begins a graceful shutdown.
    pub fn shutdown(&self) {
        self.stop.send_replace(true);
    }

    /// Stops now, without waiting for the drain: what a second SIGINT or
    /// SIGTERM (`signal`) does. The connections still open are closed
    /// unanswered, as when the drain timeout passes.
    pub fn stop_now(&self, signal: i32) {
        self.stop.send_replace(true);
        self.force.send_replace(Some(signal));
    }

    /// Reloads the checkpoint now (what SIGHUP does); the outcome is an event.
    pub fn reload(&self) {
        match &self.reload {
            Some(trigger) => trigger(),
            None => {
                let m = self.state.slot.current();
                let e = LoadError::NotReloadable { name: self.state.name.clone() };
                (self.events)(&Event::ReloadFailed {
                    checkpoint: m.provenance.checkpoint.clone(),
                    reason: e.to_string(),
                    serving: m.version,
                });
            }
        }
    }

    /// Holds forwards back until the guard is dropped (requests queue,
    /// then are refused with 503): see [`crate::batcher::Batcher::pause`].
    pub fn pause(&self) -> crate::batcher::Paused {
        self.state.batcher.pause()
    }

    /// The version being served.
    pub fn version(&self) -> u64 {
        self.state.slot.current().version
    }

    /// The metrics text, as `GET /metrics` returns it.
    pub fn metrics_text(&self) -> String {
        self.state.metrics.render()
    }
}

fn check(opts: &ServeOptions) -> Result<(), OptionsError> {
    let b = &opts.batching;
    if b.max_batch == 0 || b.queue == 0 {
        return Err(OptionsError::Zero);
    }
    let ok_name = !opts.name.is_empty()
        && opts.name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && opts.name != "."
        && opts.name != "..";
    if !ok_name {
        return Err(OptionsError::Name { name: opts.name.clone() });
    }
    let (budget, body) = (opts.limits.max_inflight_body_bytes, opts.limits.max_body_bytes);
    if body == 0 || budget < body {
        return Err(OptionsError::Budget { budget, body });
    }
    if u32::try_from(budget).is_err() {
        return Err(OptionsError::BudgetTooLarge { budget });
    }
    let answers = opts.limits.max_inflight_answer_bytes;
    if u32::try_from(answers).is_err() {
        return Err(OptionsError::AnswerBudgetTooLarge { budget: answers });
    }
    let l = &opts.limits;
    let zero = [
        ("max_inflight_answer_bytes", l.max_inflight_answer_bytes == 0),
        ("max_connections", l.max_connections == 0),
        ("header_timeout", l.header_timeout.is_zero()),
        ("body_timeout", l.body_timeout.is_zero()),
        ("body_stall_timeout", l.body_stall_timeout.is_zero()),
    ];
    if let Some((what, _)) = zero.into_iter().find(|(_, z)| *z) {
        return Err(OptionsError::ZeroLimit { what });
    }
    if matches!(opts.source, ModelSource::InProcess { .. }) && !opts.widths.is_empty() {
        return Err(OptionsError::PinnedWhenBuilt);
    }
    if matches!(opts.source, ModelSource::Pipeline { .. }) {
        if !matches!(opts.device, candle_core::Device::Cpu) {
            return Err(OptionsError::PolicyOnly { option: "device" });
        }
        if !opts.widths.is_empty() {
            return Err(OptionsError::PolicyOnly { option: "widths" });
        }
    }
    Ok(())
}

impl Server {
    /// Loads the model, binds `opts.addr` and starts serving (on the
    /// current tokio runtime). The server is ready when this returns.
    pub async fn start(opts: ServeOptions, events: EventSink) -> Result<Server, StartError> {
        check(&opts)?;
        let ServeOptions {
            source,
            name,
            addr,
            device,
            batching,
            watch,
            widths,
            non_finite,
            limits,
            threads,
            files,
            grpc,
        } = opts;
        let pins = widths.clone();
        let (model, reload_cfg, stamp) = match source {
            ModelSource::Checkpoint { path, config } => {
                let (p, c, d) = (path.clone(), config.clone(), device.clone());
                let model = tokio::task::spawn_blocking(move || {
                    LoadedModel::load_with(&p, c.as_ref(), &d, &pins, 1, &files, &Cancel::never())
                })
                .await
                .map_err(|e| StartError::Runtime(std::io::Error::other(e.to_string())))??;
                crate::events::report_allowed_globals(&model, &events);
                let stamp = FileStamp::of(&path).ok();
                let kind = ModelKind::Policy;
                (model, Some(ReloadConfig { path, config, device, pins: widths, watch, files, kind }), stamp)
            }
            ModelSource::Pipeline { path, config } => {
                let (p, c) = (path.clone(), config.clone());
                let model = tokio::task::spawn_blocking(move || {
                    LoadedModel::load_pipeline_with(&p, c.as_ref(), 1, &files, &Cancel::never())
                })
                .await
                .map_err(|e| StartError::Runtime(std::io::Error::other(e.to_string())))??;
                crate::events::report_allowed_globals(&model, &events);
                let stamp = FileStamp::of(&path).ok();
                let kind = ModelKind::Pipeline;
                (model, Some(ReloadConfig { path, config, device, pins: widths, watch, files, kind }), stamp)
            }
            ModelSource::InProcess { model, label } => (LoadedModel::of_model(Arc::from(model), &label), None, None),
        };
        let threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("pmstate-forward-{i}"))
            .build()
            .map_err(|e| StartError::Runtime(std::io::Error::other(e.to_string())))?;
        let metrics = Arc::new(Metrics::new());
        metrics.model_version.set(model.version as i64);
        let listening = Event::Listening {
            addr,
            model: name.clone(),
            version: model.version,
            checkpoint: model.provenance.checkpoint.clone(),
            sha256: model.provenance.sha256.clone(),
        };
        let slot = Arc::new(ModelSlot::new(model));
        let batcher = Batcher::start(slot.clone(), batching, pool, metrics.clone()).map_err(StartError::Runtime)?;
        let reloads = Arc::new(ReloadStats::default());
        let state = Arc::new(AppState {
            name,
            slot: slot.clone(),
            batcher,
            metrics: metrics.clone(),
            batching,
            limits,
            non_finite,
            body_budget: Arc::new(Semaphore::new(limits.max_inflight_body_bytes)),
            answer_budget: Arc::new(Semaphore::new(limits.max_inflight_answer_bytes)),
            draining: AtomicBool::new(false),
            reloads: reloads.clone(),
        });
        let reloader = match reload_cfg {
            Some(cfg) => {
                Some(Reloader::start(cfg, stamp, slot, metrics, reloads, events.clone()).map_err(StartError::Runtime)?)
            }
            None => None,
        };
        let reload_fn: Option<ReloadFn> = reloader.as_ref().map(|r| Arc::new(r.trigger_fn()) as ReloadFn);
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| StartError::Bind { addr, source })?;
        let addr = listener.local_addr().map_err(|source| StartError::Bind { addr, source })?;
        let grpc = match grpc {
            Some(g) => Some(
                crate::grpc::bind(&g).await.map_err(|source| StartError::BindGrpc { addr: g.to_string(), source })?,
            ),
            None => None,
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let app = crate::routes::router(state.clone());
        let st = state.clone();
        let ev = events.clone();
        let began = std::sync::OnceLock::new();
        let grpc_stop = stop_rx.clone();
        let http = crate::conns::serve(listener, app, state.clone(), stop_rx, move |w| {
            let timeout = limits.drain_timeout;
            match began.get() {
                None => {
                    let _ = began.set(std::time::Instant::now());
                    st.draining.store(true, std::sync::atomic::Ordering::Relaxed);
                    ev(&Event::Draining {
                        connections: w.connections,
                        requests: w.requests,
                        timeout_seconds: timeout.as_secs_f64(),
                    });
                }
                Some(t) => ev(&Event::DrainWaiting {
                    connections: w.connections,
                    requests: w.requests,
                    seconds_left: timeout.saturating_sub(t.elapsed()).as_secs_f64(),
                }),
            }
        });
        let (grpc_serve, grpc_addr) = match grpc {
            Some((l, a)) => (Some(crate::grpc::serve(state.clone(), l, grpc_stop)), Some(a)),
            None => (None, None),
        };
        // one task serves both endpoints: the drain timeout and a forced
        // stop (Server::wait) end them together
        let serve = tokio::spawn(async move {
            let grpc = async move {
                match grpc_serve {
                    Some(g) => g.await,
                    None => Ok(()),
                }
            };
            let (h, g) = tokio::join!(http, grpc);
            h.and(g)
        });
        let listening = match listening {
            Event::Listening { model, version, checkpoint, sha256, .. } => {
                Event::Listening { addr, model, version, checkpoint, sha256 }
            }
            e => e,
        };
        events(&listening);
        if let Some(a) = &grpc_addr {
            events(&Event::GrpcListening { url: a.to_string() });
        }
        let force = Arc::new(watch::Sender::new(None));
        let handle = ServerHandle { state, stop: Arc::new(stop_tx), force, reload: reload_fn, events };
        Ok(Server { addr, grpc_addr, handle, serve, reloader, limits })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where the gRPC endpoint listens (port 0 resolved), when it was asked for.
    pub fn grpc_addr(&self) -> Option<&GrpcAddr> {
        self.grpc_addr.as_ref()
    }

    /// A handle to shut it down or reload it.
    pub fn handle(&self) -> ServerHandle {
        self.handle.clone()
    }

    /// Waits until a shutdown (from a [`ServerHandle`]) has drained, then
    /// stops the batcher and the reload thread.
    pub async fn wait(self) -> std::io::Result<()> {
        let Server { handle, mut serve, reloader, limits, .. } = self;
        let mut stop = handle.stop.subscribe();
        let mut force = handle.force.subscribe();
        let result = tokio::select! {
            r = &mut serve => r,
            signal = force.wait_for(|f| f.is_some()) => {
                serve.abort();
                let signal = signal.ok().and_then(|s| *s).unwrap_or(2);
                (handle.events)(&Event::DrainForced { signal });
                Ok(Ok(()))
            }
            _ = async {
                let _ = stop.wait_for(|s| *s).await;
                tokio::time::sleep(limits.drain_timeout).await;
            } => {
                serve.abort();
                (handle.events)(&Event::DrainTimedOut { seconds: limits.drain_timeout.as_secs_f64() });
                Ok(Ok(()))
            }
        };
        let state = handle.state.clone();
        let events = handle.events.clone();
        drop(handle);
        tokio::task::spawn_blocking(move || {
            if let Some(r) = reloader {
                r.stop();
            }
            state.batcher.stop();
        })
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?;
        events(&Event::Stopped);
        result.map_err(|e| std::io::Error::other(e.to_string()))?
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
