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

/// Families that describe the whole server (connections and the shared
/// budgets), left out of the per-model series of a repository.
const SERVER_ONLY: [&str; 4] = [
    "pmstate_connections",
    "pmstate_connections_evicted",
    "pmstate_body_bytes_reserved",
    "pmstate_answer_bytes_reserved",
];

/// One family of an OpenMetrics text: its `# HELP`/`# TYPE` lines and samples.
struct Block {
    name: String,
    head: Vec<String>,
    samples: Vec<String>,
}

/// Splits OpenMetrics text into families (`# EOF` dropped).
fn families(text: &str) -> Vec<Block> {
    let mut out: Vec<Block> = Vec::new();
    for line in text.lines() {
        if line == "# EOF" || line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let name = rest.split_whitespace().nth(1).unwrap_or_default();
            match out.last_mut() {
                Some(f) if f.name == name => f.head.push(line.to_owned()),
                _ => out.push(Block { name: name.to_owned(), head: vec![line.to_owned()], samples: Vec::new() }),
            }
        } else if let Some(f) = out.last_mut() {
            f.samples.push(line.to_owned());
        }
    }
    out
}

/// `sample` with `labels` (already valid label text: `model="a",version="1"`) added.
fn with_labels(sample: &str, labels: &str) -> String {
    match sample.find(['{', ' ']) {
        Some(i) if sample.as_bytes()[i] == b'{' => {
            let rest = &sample[i + 1..];
            let sep = if rest.starts_with('}') { "" } else { "," };
            format!("{}{{{labels}{sep}{rest}", &sample[..i])
        }
        Some(i) => format!("{}{{{labels}}}{}", &sample[..i], &sample[i..]),
        None => sample.to_owned(),
    }
}

/// The `/metrics` text of a model repository: `server`'s families (the
/// server-wide series, unlabelled), each followed by the same family of
/// every model version in `models` (name, version, its own rendered text),
/// labelled `model="NAME",version="V"`: one `# HELP`/`# TYPE` per family,
/// as OpenMetrics requires. Names and versions are checked to be plain
/// (`[A-Za-z0-9._-]`, digits) before they are served, so they need no escaping.
pub fn merge(server: &str, models: &[(String, String, String)]) -> String {
    let mut fams = families(server);
    for (name, version, text) in models {
        let labels = format!("model=\"{name}\",version=\"{version}\"");
        for f in families(text) {
            if SERVER_ONLY.contains(&f.name.as_str()) {
                continue;
            }
            if let Some(into) = fams.iter_mut().find(|g| g.name == f.name) {
                into.samples.extend(f.samples.iter().map(|s| with_labels(s, &labels)));
            }
        }
    }
    let mut s = String::new();
    for f in fams {
        for l in f.head.iter().chain(&f.samples) {
            s.push_str(l);
            s.push('\n');
        }
    }
    s.push_str("# EOF\n");
    s
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each family keeps one header; the models' samples follow the server's, labelled.
    #[test]
    fn merged_metrics_keep_one_header_per_family_and_label_each_model() {
        let server = Metrics::new();
        server.requests.inc();
        let a = Metrics::new();
        a.requests.inc_by(3);
        a.connections.set(7);
        let text = merge(&server.render(), &[("a".into(), "2".into(), a.render())]);
        assert_eq!(text.matches("# TYPE pmstate_infer_requests counter").count(), 1, "{text}");
        assert!(text.contains("pmstate_infer_requests_total 1\n"), "{text}");
        assert!(text.contains("pmstate_infer_requests_total{model=\"a\",version=\"2\"} 3\n"), "{text}");
        assert!(text.contains("pmstate_infer_errors_total{model=\"a\",version=\"2\",kind=\"busy\"} 0"), "{text}");
        assert!(!text.contains("pmstate_connections{model"), "{text}");
        assert!(text.ends_with("# EOF\n"));
        assert_eq!(with_labels("x{} 1", "m=\"a\""), "x{m=\"a\"} 1");
    }
}
