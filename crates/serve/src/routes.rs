//! The HTTP routes (axum): the Open Inference Protocol's REST endpoints,
//! Triton's model configuration endpoint, and `/metrics`. Every error is
//! `{"error": "..."}` with the status of [`RequestError::status`].

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http_body_util::BodyExt;
use tokio::sync::oneshot;

use crate::batcher::Job;
use crate::decode::{decode, Expect};
use crate::encode::{answer_bound, encode};
use crate::error::{RepositoryError, RequestError};
use crate::model::LoadedModel;
use crate::protocol::{ModelConfigResponse, ModelMetadata, ModelReady, ServerMetadata};
use crate::repository::{IndexEntry, Repository};
use crate::state::{AppState, Served};

/// The binary extension's header.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

/// Bodies larger than this are decoded off the async workers.
const DECODE_INLINE_BYTES: usize = 256 << 10;

/// The router over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v2/health/live", get(live))
        .route("/v2/health/ready", get(ready))
        .route("/v2", get(server_metadata))
        .route("/v2/", get(server_metadata))
        .route("/v2/models/{name}", get(model_metadata))
        .route("/v2/models/{name}/versions/{version}", get(model_metadata_v))
        .route("/v2/models/{name}/ready", get(model_ready))
        .route("/v2/models/{name}/versions/{version}/ready", get(model_ready_v))
        .route("/v2/models/{name}/config", get(model_config))
        .route("/v2/models/{name}/versions/{version}/config", get(model_config_v))
        .route("/v2/models/{name}/contract", get(model_contract))
        .route("/v2/models/{name}/versions/{version}/contract", get(model_contract_v))
        .route("/v2/models/{name}/infer", post(infer))
        .route("/v2/models/{name}/versions/{version}/infer", post(infer_v))
        .route("/v2/repository/index", post(repo_index))
        .route("/v2/repository/models/{name}/load", post(repo_load))
        .route("/v2/repository/models/{name}/unload", post(repo_unload))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

pub(crate) fn error_response(e: &RequestError) -> Response {
    let mut r = (e.status(), Json(serde_json::json!({ "error": e.to_string() }))).into_response();
    if let Some(s) = e.retry_after() {
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

impl IntoResponse for RequestError {
    fn into_response(self) -> Response {
        error_response(&self)
    }
}

async fn not_found(method: Method, uri: Uri) -> RequestError {
    RequestError::NoRoute { method: method.to_string(), path: uri.path().to_owned() }
}

/// A 405. On an inference URL it is a refused inference request, counted
/// (received, and refused as `method`) like every other refusal there.
async fn method_not_allowed(State(st): State<Arc<AppState>>, method: Method, uri: Uri) -> RequestError {
    let e = RequestError::Method { method: method.to_string(), path: uri.path().to_owned() };
    if is_infer_path(uri.path()) {
        st.metrics.requests.inc();
        st.metrics.error(&e);
    }
    e
}

/// `/v2/models/NAME/infer` or `/v2/models/NAME/versions/V/infer`.
fn is_infer_path(path: &str) -> bool {
    let parts: Vec<&str> = path.split('/').collect();
    matches!(parts.as_slice(), ["", "v2", "models", _, "infer"] | ["", "v2", "models", _, "versions", _, "infer"])
}

async fn live() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "live": true }))
}

/// 200 while serving; 400 (Triton's not-ready status) once draining.
async fn ready(State(st): State<Arc<AppState>>) -> Response {
    let ready = !st.draining.load(Ordering::Relaxed);
    let status = if ready { StatusCode::OK } else { StatusCode::BAD_REQUEST };
    (status, Json(serde_json::json!({ "ready": ready }))).into_response()
}

async fn server_metadata() -> Json<ServerMetadata> {
    Json(ServerMetadata::new())
}

/// The model version `name` (and `version`, when given) names, and the
/// model it serves now: [`crate::repository::Models::find`], the one
/// routing of both transports.
pub(crate) fn find(
    st: &AppState,
    name: &str,
    version: Option<&str>,
) -> Result<(Arc<Served>, Arc<LoadedModel>), RequestError> {
    st.models.find(name, version)
}

async fn model_metadata(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> Response {
    metadata_of(&st, &name, None)
}

async fn model_metadata_v(State(st): State<Arc<AppState>>, Path((name, v)): Path<(String, String)>) -> Response {
    metadata_of(&st, &name, Some(&v))
}

fn metadata_of(st: &AppState, name: &str, v: Option<&str>) -> Response {
    match find(st, name, v) {
        Ok((s, m)) => Json(ModelMetadata::of(&s.name, &m)).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn model_ready(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> Response {
    ready_of(&st, &name, None)
}

async fn model_ready_v(State(st): State<Arc<AppState>>, Path((name, v)): Path<(String, String)>) -> Response {
    ready_of(&st, &name, Some(&v))
}

fn ready_of(st: &AppState, name: &str, v: Option<&str>) -> Response {
    match find(st, name, v) {
        Ok((s, _)) => {
            let ready = !st.draining.load(Ordering::Relaxed);
            let status = if ready { StatusCode::OK } else { StatusCode::BAD_REQUEST };
            (status, Json(ModelReady { name: s.name.clone(), ready })).into_response()
        }
        Err(e) => e.into_response(),
    }
}

async fn model_config(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> Response {
    config_of(&st, &name, None)
}

async fn model_config_v(State(st): State<Arc<AppState>>, Path((name, v)): Path<(String, String)>) -> Response {
    config_of(&st, &name, Some(&v))
}

fn config_of(st: &AppState, name: &str, v: Option<&str>) -> Response {
    match find(st, name, v) {
        Ok((s, m)) => Json(ModelConfigResponse::of(&s.name, &m, &s.batching, s.reloads.counts())).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn model_contract(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> Response {
    contract_of(&st, &name, None)
}

async fn model_contract_v(State(st): State<Arc<AppState>>, Path((name, v)): Path<(String, String)>) -> Response {
    contract_of(&st, &name, Some(&v))
}

/// A pipeline's deployment contract as the YAML ProtoMotions' exporter
/// writes next to its ONNX graph (`unified_pipeline.yaml`); 404 for a policy.
fn contract_of(st: &AppState, name: &str, v: Option<&str>) -> Response {
    let (s, m) = match find(st, name, v) {
        Ok(found) => found,
        Err(e) => return e.into_response(),
    };
    match m.contract() {
        Some(c) => ([(header::CONTENT_TYPE, "application/yaml")], c.to_yaml()).into_response(),
        None => RequestError::NoContract { name: s.name.clone() }.into_response(),
    }
}

/// Largest body of a repository request (`{"ready": true}`, `{"parameters": {}}`).
const MAX_REPOSITORY_BODY: usize = 4096;

/// The repository served, if `repository_name` names it (empty: the one
/// served; else its directory's path or last component).
fn repository_of(st: &AppState, repository_name: &str) -> Result<Arc<Repository>, RepositoryError> {
    let Some(r) = &st.repository else {
        return Err(RepositoryError::NoRepository);
    };
    let dir = r.dir();
    let named = repository_name.is_empty()
        || std::path::Path::new(repository_name) == dir
        || dir.file_name().is_some_and(|n| n == repository_name);
    if !named {
        return Err(RepositoryError::BadRequest {
            reason: format!(
                "unknown repository \"{}\": this server serves {}",
                clip_name(repository_name).escape_debug(),
                dir.display()
            ),
        });
    }
    Ok(r.clone())
}

/// At most 64 characters of a client's string, for error messages.
fn clip_name(s: &str) -> String {
    s.chars().take(64).collect()
}

/// The repository index, shared by both transports.
pub(crate) async fn repository_index(
    st: &Arc<AppState>,
    repository_name: &str,
    ready: bool,
) -> Result<Vec<IndexEntry>, RepositoryError> {
    let r = repository_of(st, repository_name)?;
    let st = st.clone();
    // a directory listing: off the async workers
    tokio::task::spawn_blocking(move || r.index(&st.models, ready))
        .await
        .map_err(|e| RepositoryError::BadRequest { reason: e.to_string() })?
}

/// Loads a model of the repository, shared by both transports.
pub(crate) async fn repository_load(st: &AppState, repository_name: &str, name: &str) -> Result<(), RepositoryError> {
    let r = repository_of(st, repository_name)?;
    r.check_control()?;
    if st.draining.load(Ordering::Relaxed) {
        return Err(RepositoryError::ShuttingDown);
    }
    r.load(&st.models, name).await
}

/// Unloads a model of the repository, shared by both transports.
pub(crate) async fn repository_unload(st: &AppState, repository_name: &str, name: &str) -> Result<(), RepositoryError> {
    let r = repository_of(st, repository_name)?;
    r.check_control()?;
    r.unload(&st.models, name).await
}

fn repository_error(e: &RepositoryError) -> Response {
    (e.status(), Json(serde_json::json!({ "error": e.to_string() }))).into_response()
}

/// A repository request's JSON body (empty: `{}`), at most [`MAX_REPOSITORY_BODY`] bytes.
async fn small_json(body: Body) -> Result<serde_json::Map<String, serde_json::Value>, RepositoryError> {
    let bad = |reason: String| RepositoryError::BadRequest { reason };
    let bytes = axum::body::to_bytes(body, MAX_REPOSITORY_BODY)
        .await
        .map_err(|_| bad(format!("the body must be a JSON object of at most {MAX_REPOSITORY_BODY} bytes")))?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::Map::new());
    }
    match serde_json::from_slice(&bytes) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(_) => Err(bad("the body must be a JSON object".into())),
        Err(e) => Err(bad(format!("the body is not JSON: {e}"))),
    }
}

/// `POST /v2/repository/index` (`{"ready": true}`: only what is ready).
async fn repo_index(State(st): State<Arc<AppState>>, body: Body) -> Response {
    let r = async {
        let m = small_json(body).await?;
        let ready = match m.get("ready") {
            None => false,
            Some(v) => v
                .as_bool()
                .ok_or_else(|| RepositoryError::BadRequest { reason: "`ready` must be true or false".into() })?,
        };
        repository_index(&st, "", ready).await
    };
    match r.await {
        Ok(list) => Json(list).into_response(),
        Err(e) => repository_error(&e),
    }
}

/// A load or unload body: `{}` or `{"parameters": {}}` (parameters are refused).
async fn no_load_parameters(body: Body) -> Result<(), RepositoryError> {
    let m = small_json(body).await?;
    let empty = match m.get("parameters") {
        None => true,
        Some(serde_json::Value::Object(p)) => p.is_empty(),
        Some(_) => false,
    };
    if !empty || m.keys().any(|k| k != "parameters") {
        return Err(RepositoryError::BadRequest {
            reason: "load and unload parameters are not supported (configure a model by its config.json)".into(),
        });
    }
    Ok(())
}

/// `POST /v2/repository/models/NAME/load`.
async fn repo_load(State(st): State<Arc<AppState>>, Path(name): Path<String>, body: Body) -> Response {
    let r = async {
        no_load_parameters(body).await?;
        repository_load(&st, "", &name).await
    };
    match r.await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => repository_error(&e),
    }
}

/// `POST /v2/repository/models/NAME/unload`.
async fn repo_unload(State(st): State<Arc<AppState>>, Path(name): Path<String>, body: Body) -> Response {
    let r = async {
        no_load_parameters(body).await?;
        repository_unload(&st, "", &name).await
    };
    match r.await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => repository_error(&e),
    }
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let text = st.render_metrics();
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response()
}

async fn infer(State(st): State<Arc<AppState>>, Path(name): Path<String>, headers: HeaderMap, body: Body) -> Response {
    infer_counted(st, name, None, headers, body).await
}

async fn infer_v(
    State(st): State<Arc<AppState>>,
    Path((name, v)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    infer_counted(st, name, Some(v), headers, body).await
}

async fn infer_counted(
    st: Arc<AppState>,
    name: String,
    version: Option<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let start = Instant::now();
    // counted on the model's metrics; a request naming no served model on the server's
    let target = find(&st, &name, version.as_deref());
    let metrics = match &target {
        Ok((s, _)) => s.metrics.clone(),
        Err(_) => st.metrics.clone(),
    };
    metrics.requests.inc();
    // dropped with this future, also when hyper drops it for a closed connection
    let _in_flight = InFlight::enter(&metrics.in_flight);
    let r = match target {
        Ok((s, model)) => infer_inner(&st, &s, model, &headers, body).await,
        Err(e) => Err(e),
    };
    metrics.latency.observe(start.elapsed().as_secs_f64());
    match r {
        Ok(r) => r,
        Err(e) => {
            metrics.error(&e);
            e.into_response()
        }
    }
}

/// Counts a request in `pmstate_requests_in_flight` while it lives.
pub(crate) struct InFlight(prometheus_client::metrics::gauge::Gauge);

impl InFlight {
    pub(crate) fn enter(g: &prometheus_client::metrics::gauge::Gauge) -> InFlight {
        g.inc();
        InFlight(g.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Bytes of the in-flight body budget one request holds, counted in
/// `pmstate_body_bytes_reserved`; given back when dropped.
pub(crate) struct Reservation {
    permit: tokio::sync::OwnedSemaphorePermit,
    gauge: prometheus_client::metrics::gauge::Gauge,
}

impl Reservation {
    /// An empty reservation on `st`'s body budget (None once it is closed: shutting down).
    pub(crate) fn empty(st: &AppState) -> Option<Reservation> {
        let permit = st.body_budget.clone().try_acquire_many_owned(0).ok()?;
        Some(Reservation { permit, gauge: st.metrics.body_bytes_reserved.clone() })
    }

    /// Charges `n` more bytes, if the budget has them.
    pub(crate) fn grow(&mut self, budget: &Arc<tokio::sync::Semaphore>, n: usize) -> bool {
        let Ok(n32) = u32::try_from(n) else { return false };
        match budget.clone().try_acquire_many_owned(n32) {
            Ok(more) => {
                self.permit.merge(more);
                self.gauge.inc_by(i64::from(n32));
                true
            }
            Err(_) => false,
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.gauge.dec_by(self.permit.num_permits() as i64);
    }
}

/// The transfer coding of `headers` other than `chunked`, if any: hyper
/// reads only chunked bodies and would ignore the rest (`gzip, chunked`
/// would be read as if it were not gzipped), so such a request is
/// answered 501 (RFC 9112, 6.1).
pub(crate) fn unknown_coding(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| String::from_utf8_lossy(v.as_bytes()).split(',').map(|c| c.trim().to_owned()).collect::<Vec<_>>())
        .find(|c| !c.is_empty() && !c.eq_ignore_ascii_case("chunked"))
}

/// The answer to a request with an unknown transfer coding (see [`unknown_coding`]).
pub(crate) fn refuse_coding(st: &AppState, coding: String) -> Response {
    let e = RequestError::TransferCoding { coding };
    st.metrics.error(&e);
    let mut r = error_response(&e);
    r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Reads a refused request's body (at most `limit` bytes, within `timeout`,
/// each piece within `stall`) without keeping any of it. A server that
/// answered and closed while the client is still sending would reset the
/// connection, and the client would lose the answer (and its
/// `Retry-After`) to the reset.
async fn discard(mut body: Body, limit: usize, timeout: Duration, stall: Duration) {
    let drain = async {
        let mut seen = 0usize;
        while let Ok(Some(Ok(frame))) = tokio::time::timeout(stall, body.frame()).await {
            seen = seen.saturating_add(frame.data_ref().map_or(0, |d| d.len()));
            if seen > limit {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(timeout, drain).await;
}

/// Reads the body within the size limit, the memory budget and the time
/// limits. The budget is charged as bytes arrive (not by what
/// Content-Length declares): a client that declares 64 MiB and sends one
/// byte holds one byte. The bytes held are at most twice those charged
/// (the buffer grows by doubling).
async fn read_body(st: &AppState, headers: &HeaderMap, mut body: Body) -> Result<(Bytes, Reservation), RequestError> {
    let limit = st.limits.max_body_bytes;
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(RequestError::TooLarge { limit });
    }
    let Some(mut held) = Reservation::empty(st) else {
        return Err(RequestError::ShuttingDown);
    };
    let (total, stall) = (st.limits.body_timeout, st.limits.body_stall_timeout);
    let deadline = tokio::time::Instant::now() + total;
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Err(RequestError::BodyTimeout { seconds: total.as_secs() });
        }
        let frame = match tokio::time::timeout_at(deadline.min(now + stall), body.frame()).await {
            Err(_) if tokio::time::Instant::now() >= deadline => {
                return Err(RequestError::BodyTimeout { seconds: total.as_secs() })
            }
            Err(_) => return Err(RequestError::BodyStalled { seconds: stall.as_secs_f64() }),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(RequestError::BodyRead(Arc::new(e))),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else { continue };
        if data.len() > limit - buf.len() {
            return Err(RequestError::TooLarge { limit });
        }
        if !held.grow(&st.body_budget, data.len()) {
            drop(held);
            discard(body, limit, total, stall).await;
            return Err(RequestError::Busy { budget: st.limits.max_inflight_body_bytes });
        }
        buf.extend_from_slice(&data);
    }
    Ok((Bytes::from(buf), held))
}

/// Permits for `n` bytes (the budget is under 4 GiB: more never fits).
fn permits(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Reserves `bytes` of the answer budget: 400 when the whole budget could
/// not hold them, 503 while answers in flight leave too little.
fn reserve_answer(st: &AppState, bytes: usize) -> Result<AnswerReservation, RequestError> {
    let budget = st.limits.max_inflight_answer_bytes;
    if bytes > budget {
        return Err(RequestError::AnswerTooLarge { bytes, budget });
    }
    let permit = st.answer_budget.clone().try_acquire_many_owned(permits(bytes)).map_err(|e| match e {
        tokio::sync::TryAcquireError::Closed => RequestError::ShuttingDown,
        tokio::sync::TryAcquireError::NoPermits => RequestError::AnswersBusy { budget },
    })?;
    let gauge = st.metrics.answer_bytes_reserved.clone();
    gauge.inc_by(permit.num_permits() as i64);
    Ok(AnswerReservation { permit, gauge })
}

/// Bytes of the answer budget one request holds, counted in
/// `pmstate_answer_bytes_reserved`; given back when dropped.
pub(crate) struct AnswerReservation {
    permit: tokio::sync::OwnedSemaphorePermit,
    gauge: prometheus_client::metrics::gauge::Gauge,
}

impl AnswerReservation {
    /// An answer that came out at `len` bytes, over the `bound` reserved
    /// (an open width counted as 1): charges the rest when the budget has it.
    pub(crate) fn charge_beyond(&mut self, st: &AppState, bound: usize, len: usize) {
        if len > bound {
            if let Ok(more) = st.answer_budget.clone().try_acquire_many_owned(permits(len - bound)) {
                self.gauge.inc_by(more.num_permits() as i64);
                self.permit.merge(more);
            }
        }
    }
}

impl Drop for AnswerReservation {
    fn drop(&mut self) {
        self.gauge.dec_by(self.permit.num_permits() as i64);
    }
}

/// An encoded answer and its share of the answer budget, given back when
/// the last reference to the bytes is dropped (after hyper has written them).
struct HeldAnswer {
    body: Vec<u8>,
    _held: AnswerReservation,
}

impl AsRef<[u8]> for HeldAnswer {
    fn as_ref(&self) -> &[u8] {
        &self.body
    }
}

/// A request run by the batcher, with what its transport needs to answer it.
pub(crate) struct Ran {
    /// The outputs.
    pub answer: crate::batcher::Answer,
    /// Its share of the answer budget, to hold until the answer is sent.
    pub held: AnswerReservation,
    /// The bound reserved ([`answer_bound`]).
    pub bound: usize,
    /// The request's id.
    pub id: Option<String>,
    /// Its rows.
    pub rows: usize,
}

/// What every transport does with a decoded request: reserves a bound of
/// its answer, queues it for the batcher and waits for its outputs. The
/// model handle is dropped before the wait (a reload may swap it meanwhile;
/// the batcher runs whichever is served and says which in the answer).
pub(crate) async fn run(
    st: &AppState,
    served: &Served,
    model: Arc<LoadedModel>,
    decoded: crate::decode::Decoded,
) -> Result<Ran, RequestError> {
    let bound = answer_bound(&model.interface, decoded.rows, &decoded.outputs);
    drop(model);
    let held = reserve_answer(st, bound)?;
    let id = decoded.id.clone();
    let rows = decoded.rows;
    let (tx, rx) = oneshot::channel();
    served.batcher.submit(Job { req: decoded, enqueued: Instant::now(), reply: tx })?;
    let answer = rx.await.map_err(|_| RequestError::ShuttingDown)??;
    Ok(Ran { answer, held, bound, id, rows })
}

async fn infer_inner(
    st: &Arc<AppState>,
    served: &Served,
    model: Arc<LoadedModel>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, RequestError> {
    let header_len =
        match headers.get(HEADER_LENGTH) {
            None => None,
            Some(v) => Some(v.to_str().ok().and_then(|s| s.trim().parse::<usize>().ok()).ok_or_else(|| {
                RequestError::HeaderLength { value: String::from_utf8_lossy(v.as_bytes()).into_owned() }
            })?),
        };
    let (bytes, _permit) = read_body(st, headers, body).await?;
    let (non_finite, max_rows) = (st.non_finite, served.batching.max_batch);
    let decoded = if bytes.len() <= DECODE_INLINE_BYTES {
        decode(&bytes, header_len, &Expect { iface: &model.interface, non_finite, max_rows })?
    } else {
        let m = model.clone();
        tokio::task::spawn_blocking(move || {
            decode(&bytes, header_len, &Expect { iface: &m.interface, non_finite, max_rows })
        })
        .await
        .map_err(|e| RequestError::Task { what: "decoding", source: Arc::new(e) })??
    };
    let Ran { answer, mut held, bound, id, rows } = run(st, served, model, decoded).await?;
    let enc = encode(&served.name, id.as_deref(), &answer);
    drop(answer);
    held.charge_beyond(st, bound, enc.body.len());
    served.metrics.rows.inc_by(rows as u64);
    let header_len = enc.header_len;
    // the reservation lives as long as the bytes: hyper drops them once they are written
    let bytes = Bytes::from_owner(HeldAnswer { body: enc.body, _held: held });
    let mut r = Response::new(Body::from(bytes));
    let h = r.headers_mut();
    match header_len {
        Some(n) => {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
            h.insert(HEADER_LENGTH, HeaderValue::from(n));
        }
        None => {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
    }
    Ok(r)
}
