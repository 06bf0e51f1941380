//! [`AppState`]: what every request handler shares, and [`Served`]: one
//! model version being served. Their own module so that the routes (which
//! read them) and the server (which builds them) do not depend on each
//! other.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use crate::batcher::Batcher;
use crate::metrics::Metrics;
use crate::options::{Batching, Limits, NonFinite};
use crate::reload::{ReloadStats, Reloader};
use crate::repository::{Models, Repository};
use crate::slot::ModelSlot;

/// One model version being served: its slot (swapped by hot reload), its
/// own batcher and metrics. A single-checkpoint server has one; a model
/// repository one per loaded version. Requests of both transports reach
/// it through [`Models::find`].
pub struct Served {
    /// The model name in URLs.
    pub name: String,
    /// The served model.
    pub slot: Arc<ModelSlot>,
    /// The queue.
    pub batcher: Batcher,
    /// Metrics (labelled `model`, `version` in a repository).
    pub metrics: Arc<Metrics>,
    /// Batching settings (reported in the model configuration; `max_batch`
    /// bounds the rows of one request).
    pub batching: Batching,
    /// Reload outcomes.
    pub reloads: Arc<ReloadStats>,
    /// The thread following the checkpoint (None: built in process).
    pub(crate) reloader: Mutex<Option<Reloader>>,
}

impl Served {
    /// Asks for a reload now (SIGHUP); false when it cannot be reloaded.
    pub(crate) fn trigger_reload(&self) -> bool {
        let g = self.reloader.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_ref() {
            Some(r) => {
                r.trigger();
                true
            }
            None => false,
        }
    }

    /// Stops the reload thread, then runs what is queued and stops the
    /// batcher (blocking: call it off the async workers).
    pub(crate) fn stop(&self) {
        let r = self.reloader.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(r) = r {
            r.stop();
        }
        self.batcher.stop();
    }
}

/// What every request handler shares.
pub struct AppState {
    /// The models served, by name: the one routing table of both transports.
    pub models: Models,
    /// The model repository (None: one checkpoint served).
    pub repository: Option<Arc<Repository>>,
    /// Server-wide metrics: connections, the body and answer budgets, and
    /// requests naming no served model. With one checkpoint served these
    /// are the model's own metrics (one unlabelled set, as before).
    pub metrics: Arc<Metrics>,
    /// Request limits.
    pub limits: Limits,
    /// NaN policy.
    pub non_finite: NonFinite,
    /// Bytes of request bodies that may be held at once.
    pub body_budget: Arc<Semaphore>,
    /// Bytes of answers that may be held at once ([`Limits::max_inflight_answer_bytes`]).
    pub answer_budget: Arc<Semaphore>,
    /// Set when shutdown begins (readiness turns false).
    pub draining: AtomicBool,
}

impl AppState {
    /// The `/metrics` text: the one set of a single-checkpoint server, or
    /// the server's series followed by each model version's, labelled.
    pub fn render_metrics(&self) -> String {
        if self.repository.is_none() {
            return self.metrics.render();
        }
        let served = self.models.all();
        let labelled: Vec<(String, String, String)> =
            served.iter().map(|s| (s.name.clone(), s.slot.current().version.to_string(), s.metrics.render())).collect();
        crate::metrics::merge(&self.metrics.render(), &labelled)
    }
}
