//! [`Server`]: loads the model, binds, serves until asked to stop, then
//! drains: no new connections, requests in flight answered, the batcher
//! and the reload thread stopped.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

use crate::batcher::Placement;
use crate::error::{LoadError, OptionsError, StartError};
use crate::events::{Event, EventSink};
use crate::metrics::Metrics;
use crate::model::{Cancel, FileStamp, LoadedModel, ModelKind};
use crate::options::{GrpcAddr, Limits, ModelSource, ServeOptions};
use crate::reload::ReloadConfig;
use crate::repository::{start_served, LoadBase, ModelControl, Models, Repository};
use crate::state::{AppState, Served};

/// A running server.
pub struct Server {
    addr: SocketAddr,
    grpc_addr: Option<GrpcAddr>,
    handle: ServerHandle,
    serve: JoinHandle<std::io::Result<()>>,
    limits: Limits,
}

/// Controls a running server from anywhere (signal handlers, tests).
#[derive(Clone)]
pub struct ServerHandle {
    state: Arc<AppState>,
    stop: Arc<watch::Sender<bool>>,
    /// Turned true (with the signal) to stop without waiting for the drain.
    force: Arc<watch::Sender<Option<i32>>>,
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

    /// Reloads the checkpoint now (what SIGHUP does): every model version
    /// served, each from its own file; each outcome is an event.
    pub fn reload(&self) {
        for s in self.state.models.all() {
            if !s.trigger_reload() {
                let m = s.slot.current();
                let e = LoadError::NotReloadable { name: s.name.clone() };
                (self.events)(&Event::ReloadFailed {
                    checkpoint: m.provenance.checkpoint.clone(),
                    reason: e.to_string(),
                    serving: m.version,
                });
            }
        }
    }

    /// The model version a request naming `name` (and `version`) reaches.
    fn served(&self, name: Option<&str>) -> Option<Arc<Served>> {
        match name {
            Some(n) => self.state.models.find(n, None).ok().map(|(s, _)| s),
            None => self.state.models.all().into_iter().next(),
        }
    }

    /// Holds forwards back until the guard is dropped (requests queue,
    /// then are refused with 503): see [`crate::batcher::Batcher::pause`].
    /// With a repository, the first model's (see [`ServerHandle::pause_model`]).
    pub fn pause(&self) -> crate::batcher::Paused {
        match self.served(None) {
            Some(s) => s.batcher.pause(),
            None => crate::batcher::Paused::none(),
        }
    }

    /// [`ServerHandle::pause`] for the latest version of model `name`
    /// (None when it is not served).
    pub fn pause_model(&self, name: &str) -> Option<crate::batcher::Paused> {
        self.served(Some(name)).map(|s| s.batcher.pause())
    }

    /// The version being served (with a repository: the first model's
    /// lowest; 0 when none is).
    pub fn version(&self) -> u64 {
        self.served(None).map_or(0, |s| s.slot.current().version)
    }

    /// The metrics text, as `GET /metrics` returns it.
    pub fn metrics_text(&self) -> String {
        self.state.render_metrics()
    }
}

/// The state every handler shares, over `models`.
fn state_of(
    models: Models,
    repository: Option<Arc<Repository>>,
    metrics: Arc<Metrics>,
    limits: Limits,
    non_finite: crate::options::NonFinite,
) -> Arc<AppState> {
    Arc::new(AppState {
        models,
        repository,
        metrics,
        limits,
        non_finite,
        body_budget: Arc::new(Semaphore::new(limits.max_inflight_body_bytes)),
        answer_budget: Arc::new(Semaphore::new(limits.max_inflight_answer_bytes)),
        draining: AtomicBool::new(false),
    })
}

/// Stops every model version served (their queues run first).
async fn stop_models(models: &Models) {
    let all = models.all();
    let _ = tokio::task::spawn_blocking(move || all.iter().for_each(|s| s.stop())).await;
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
    if matches!(opts.source, ModelSource::Repository(_)) && !opts.widths.is_empty() {
        return Err(OptionsError::RepositoryWidths);
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
        let threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        // one forward pool, whatever the number of models: they share the cores
        let pool = Arc::new(
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("pmstate-forward-{i}"))
                .build()
                .map_err(|e| StartError::Runtime(std::io::Error::other(e.to_string())))?,
        );
        let pins = widths.clone();
        let (model, reload_cfg, stamp) = match source {
            ModelSource::Repository(ropts) => {
                let base = LoadBase { device, files, watch, batching, pool, events: events.clone() };
                let repo = Arc::new(Repository::new(&ropts, base));
                let models = Models::default();
                let names = match ropts.control {
                    ModelControl::None => repo.model_names()?,
                    ModelControl::Explicit => ropts.load.clone(),
                };
                for n in &names {
                    match repo.load(&models, n).await {
                        Ok(()) => {}
                        // a model named by --load-model must load
                        Err(e) if ropts.control == ModelControl::Explicit => {
                            stop_models(&models).await;
                            return Err(e.into());
                        }
                        Err(e) => events(&Event::ModelFailed { model: n.clone(), reason: e.to_string() }),
                    }
                }
                let metrics = Arc::new(Metrics::new());
                let state = state_of(models, Some(repo), metrics, limits, non_finite);
                return Self::bind_and_serve(state, addr, grpc, limits, events, None).await;
            }
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
                let keep_version = false;
                (
                    model,
                    Some(ReloadConfig { path, config, device, pins: widths, watch, files, kind, keep_version }),
                    stamp,
                )
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
                let keep_version = false;
                (
                    model,
                    Some(ReloadConfig { path, config, device, pins: widths, watch, files, kind, keep_version }),
                    stamp,
                )
            }
            ModelSource::InProcess { model, label } => (LoadedModel::of_model(Arc::from(model), &label), None, None),
        };
        let listening = Event::Listening {
            addr,
            model: name.clone(),
            version: model.version,
            checkpoint: model.provenance.checkpoint.clone(),
            sha256: model.provenance.sha256.clone(),
        };
        let reload = reload_cfg.map(|c| (c, stamp));
        // the pool is this model's alone: its batching loop runs on it
        let served = start_served(name, model, reload, batching, pool, Placement::ForwardPool, &events)
            .map_err(StartError::Runtime)?;
        // one model: its metrics are the server's (one unlabelled set)
        let metrics = served.metrics.clone();
        let state = state_of(Models::single(served), None, metrics, limits, non_finite);
        Self::bind_and_serve(state, addr, grpc, limits, events, Some(listening)).await
    }

    /// Binds the endpoints and serves `state`; `listening` is the event of
    /// a single-checkpoint server (None: a repository's).
    async fn bind_and_serve(
        state: Arc<AppState>,
        addr: SocketAddr,
        grpc: Option<GrpcAddr>,
        limits: Limits,
        events: EventSink,
        listening: Option<Event>,
    ) -> Result<Server, StartError> {
        let bound = async {
            let listener =
                tokio::net::TcpListener::bind(addr).await.map_err(|source| StartError::Bind { addr, source })?;
            let addr = listener.local_addr().map_err(|source| StartError::Bind { addr, source })?;
            let grpc = match grpc {
                Some(g) => Some(
                    crate::grpc::bind(&g)
                        .await
                        .map_err(|source| StartError::BindGrpc { addr: g.to_string(), source })?,
                ),
                None => None,
            };
            Ok::<_, StartError>((listener, addr, grpc))
        };
        let (listener, addr, grpc) = match bound.await {
            Ok(b) => b,
            Err(e) => {
                // the batchers and reload threads already started
                stop_models(&state.models).await;
                return Err(e);
            }
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
        let listening = match (listening, &state.repository) {
            (Some(Event::Listening { model, version, checkpoint, sha256, .. }), _) => {
                Event::Listening { addr, model, version, checkpoint, sha256 }
            }
            (Some(e), _) => e,
            (None, repo) => {
                let mut models: Vec<String> = state.models.all().iter().map(|s| s.name.clone()).collect();
                models.dedup();
                let repository = repo.as_ref().map(|r| r.dir().display().to_string()).unwrap_or_default();
                Event::RepositoryListening { addr, repository, models }
            }
        };
        events(&listening);
        if let Some(a) = &grpc_addr {
            events(&Event::GrpcListening { url: a.to_string() });
        }
        let force = Arc::new(watch::Sender::new(None));
        let handle = ServerHandle { state, stop: Arc::new(stop_tx), force, events };
        Ok(Server { addr, grpc_addr, handle, serve, limits })
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
        let Server { handle, mut serve, limits, .. } = self;
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
        if let Some(r) = &state.repository {
            r.close();
        }
        stop_models(&state.models).await;
        events(&Event::Stopped);
        result.map_err(|e| std::io::Error::other(e.to_string()))?
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
