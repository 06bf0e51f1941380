//! `GET /metrics`: Prometheus metrics in the OpenMetrics text format,
//! through the Prometheus project's own Rust client (`prometheus-client`).

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::error::RequestError;

type Labels = Vec<(String, String)>;

/// How a reload ended, the `result` label of `pmstate_model_reloads_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// The new checkpoint is served.
    Ok,
    /// It was refused; the previous model keeps serving.
    Failed,
}

impl ReloadOutcome {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            ReloadOutcome::Ok => "ok",
            ReloadOutcome::Failed => "failed",
        }
    }
}

/// Every metric the server keeps.
pub struct Metrics {
    registry: Registry,
    /// Inference requests received (answered or not).
    pub requests: Counter,
    /// Refused or failed inference requests, by kind.
    pub errors: Family<Labels, Counter>,
    /// Requests whose client went away before they ran (skipped).
    pub cancelled: Counter,
    /// Rows answered.
    pub rows: Counter,
    /// Seconds from receiving a request to its response being ready.
    pub latency: Histogram,
    /// Rows per forward.
    pub batch_rows: Histogram,
    /// Requests per forward.
    pub batch_requests: Histogram,
    /// Seconds per forward.
    pub forward_seconds: Histogram,
    /// Requests waiting for the batcher.
    pub queue_depth: Gauge,
    /// Inference requests being handled (body read, queued or running);
    /// one whose client went away leaves at once.
    pub in_flight: Gauge,
    /// Bytes of the in-flight body budget held by requests being received
    /// or handled (charged as the bytes arrive).
    pub body_bytes_reserved: Gauge,
    /// Bytes of the answer budget held (`Limits::max_inflight_answer_bytes`).
    pub answer_bytes_reserved: Gauge,
    /// Connections open.
    pub connections: Gauge,
    /// Idle connections closed to make room for a new one (at the
    /// connection cap, or out of file descriptors).
    pub connections_evicted: Counter,
    /// Checkpoint reloads, by result (`ok`, `failed`).
    pub reloads: Family<Labels, Counter>,
    /// The version being served.
    pub model_version: Gauge,
}

fn label(k: &str, v: &str) -> Labels {
    vec![(k.to_owned(), v.to_owned())]
}

impl Metrics {
    /// A registry with every series (error kinds and reload results at 0).
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("pmstate");
        let requests = Counter::default();
        r.register("infer_requests", "Inference requests received", requests.clone());
        let errors = Family::<Labels, Counter>::default();
        r.register("infer_errors", "Inference requests refused or failed, by kind", errors.clone());
        let cancelled = Counter::default();
        r.register("infer_cancelled", "Requests whose client went away before they ran", cancelled.clone());
        let rows = Counter::default();
        r.register("infer_rows", "Observation rows answered", rows.clone());
        let latency = Histogram::new(exponential_buckets(25e-6, 2.0, 20));
        r.register("request_duration_seconds", "Inference request latency in the server", latency.clone());
        let batch_rows = Histogram::new(exponential_buckets(1.0, 2.0, 14));
        r.register("batch_rows", "Rows per forward (dynamic batching)", batch_rows.clone());
        let batch_requests = Histogram::new(exponential_buckets(1.0, 2.0, 12));
        r.register("batch_requests", "Requests merged per forward", batch_requests.clone());
        let forward_seconds = Histogram::new(exponential_buckets(25e-6, 2.0, 20));
        r.register("forward_duration_seconds", "Seconds per forward", forward_seconds.clone());
        let queue_depth = Gauge::default();
        r.register("queue_depth", "Requests waiting for the batcher", queue_depth.clone());
        let in_flight = Gauge::default();
        r.register("requests_in_flight", "Inference requests being handled", in_flight.clone());
        let body_bytes_reserved = Gauge::default();
        r.register(
            "body_bytes_reserved",
            "Bytes of the in-flight request body budget held",
            body_bytes_reserved.clone(),
        );
        let answer_bytes_reserved = Gauge::default();
        r.register("answer_bytes_reserved", "Bytes of the in-flight answer budget held", answer_bytes_reserved.clone());
        let connections = Gauge::default();
        r.register("connections", "Connections open", connections.clone());
        let connections_evicted = Counter::default();
        r.register(
            "connections_evicted",
            "Idle connections closed to make room for a new one (connection cap or no descriptor left)",
            connections_evicted.clone(),
        );
        let reloads = Family::<Labels, Counter>::default();
        r.register("model_reloads", "Checkpoint reloads, by result", reloads.clone());
        let model_version = Gauge::default();
        r.register("model_version", "The model version being served (1 + successful reloads)", model_version.clone());
        for k in RequestError::KINDS {
            let _ = errors.get_or_create(&label("kind", k));
        }
        for k in [ReloadOutcome::Ok, ReloadOutcome::Failed].map(ReloadOutcome::label) {
            let _ = reloads.get_or_create(&label("result", k));
        }
        Metrics {
            registry: r,
            requests,
            errors,
            cancelled,
            rows,
            latency,
            batch_rows,
            batch_requests,
            forward_seconds,
            queue_depth,
            in_flight,
            body_bytes_reserved,
            answer_bytes_reserved,
            connections,
            connections_evicted,
            reloads,
            model_version,
        }
    }

    /// Counts a refused request.
    pub fn error(&self, e: &RequestError) {
        self.errors.get_or_create(&label("kind", e.kind())).inc();
    }

    /// Counts a reload.
    pub fn reload(&self, outcome: ReloadOutcome) {
        self.reloads.get_or_create(&label("result", outcome.label())).inc();
    }

    /// The OpenMetrics text.
    pub fn render(&self) -> String {
        let mut s = String::new();
        // writing into a String cannot fail
        let _ = encode(&mut s, &self.registry);
        s
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
