//! [`AppState`]: what every request handler shares. Its own module so that
//! the routes (which read it) and the server (which builds it) do not
//! depend on each other.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::batcher::Batcher;
use crate::metrics::Metrics;
use crate::options::{Batching, Limits, NonFinite};
use crate::reload::ReloadStats;
use crate::slot::ModelSlot;

/// What every request handler shares.
pub struct AppState {
    /// The model name in URLs.
    pub name: String,
    /// The served model.
    pub slot: Arc<ModelSlot>,
    /// The queue.
    pub batcher: Batcher,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Batching settings (reported in the model configuration; `max_batch`
    /// bounds the rows of one request).
    pub batching: Batching,
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
    /// Reload outcomes.
    pub reloads: Arc<ReloadStats>,
}
