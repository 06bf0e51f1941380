//! The KServe V2 gRPC API (`inference.GRPCInferenceService`) with Triton's
//! `ModelStreamInfer`, served beside the HTTP endpoint on the same model,
//! batcher, limits and metrics: a gRPC request is decoded by the same core
//! as a REST one ([`crate::decode::read_tensors`], [`crate::decode::assemble`]),
//! only the tensor data comes in gRPC's forms ([`GrpcData`]: one
//! `raw_input_contents` entry per input, or typed `contents`), and it is
//! queued, bounded and counted exactly as a REST request is.
//!
//! Bounds a client cannot get around:
//! - a message over [`crate::Limits::max_body_bytes`] is refused by tonic
//!   before it is decoded (`OUT_OF_RANGE`), and the stream or call ends;
//! - each decoded request is charged to the same in-flight body budget as
//!   REST bodies (`UNAVAILABLE` when it is full), and its answer to the same
//!   answer budget;
//! - a unary call must be answered within [`crate::Limits::body_timeout`]
//!   (a client that sends its message slowly gets `CANCELLED` after it);
//!   a stream on which no complete request arrives for
//!   [`crate::Limits::header_timeout`] is ended with `DEADLINE_EXCEEDED`;
//! - at most [`crate::Limits::max_connections`] gRPC connections are open
//!   (more wait in the listen backlog), each with at most
//!   [`MAX_STREAMS_PER_CONNECTION`] calls at once; HTTP/2 keep-alive pings
//!   close connections whose peer vanished;
//! - a stream's client that goes away has its queued requests skipped
//!   (counted in `pmstate_infer_cancelled_total`), as for a REST client.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::decode::{assemble, read_tensors, values_from_le, Expect, Params, TensorIn, TensorSource, Values};
use crate::error::{Dims, InputError, RequestError};
use crate::model::{Datatype, LoadedModel};
use crate::options::GrpcAddr;
use crate::protocol::{self, Name, ParamValue, Parameters, RequestOutput};
use crate::routes::{find, run, InFlight, Reservation};
use crate::state::{AppState, Served};

/// The messages and service of `proto/inference.proto`, generated at build
/// time (protox + tonic-prost-build): the server's trait and the client.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("inference");
}

use proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use proto::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
use proto::infer_parameter::ParameterChoice;
use proto::model_infer_request::InferInputTensor;
use proto::model_infer_response::InferOutputTensor;
use proto::{
    InferParameter, InferTensorContents, ModelInferRequest, ModelInferResponse, ModelMetadataRequest,
    ModelMetadataResponse, ModelReadyRequest, ModelReadyResponse, ModelStreamInferResponse, RepositoryIndexRequest,
    RepositoryIndexResponse, RepositoryModelLoadRequest, RepositoryModelLoadResponse, RepositoryModelUnloadRequest,
    RepositoryModelUnloadResponse, ServerLiveRequest, ServerLiveResponse, ServerMetadataRequest,
    ServerMetadataResponse, ServerReadyRequest, ServerReadyResponse,
};

/// Most calls (unary or streams) open at once on one connection.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 128;
/// Most requests of one stream waiting for their answers: the stream is
/// read no further until the oldest is answered (what lets one stream
/// fill a batch without holding an unbounded backlog).
pub const STREAM_WINDOW: usize = 64;
/// Largest header block of a call (its metadata).
const MAX_HEADER_LIST_BYTES: u32 = 64 << 10;
/// Requests larger than this are decoded off the async workers (as for REST).
const DECODE_INLINE_BYTES: usize = 256 << 10;

/// The gRPC status of a refusal: the code a gRPC client reads for the
/// HTTP status REST gives, the message the same text.
pub fn status_of(e: &RequestError) -> Status {
    use tonic::Code;
    let code = match e.kind() {
        "not_found" => Code::NotFound,
        "too_large" => Code::ResourceExhausted,
        "body_timeout" => Code::DeadlineExceeded,
        "queue_full" | "busy" | "shutting_down" => Code::Unavailable,
        "method" | "transfer_coding" => Code::Unimplemented,
        "internal" => Code::Internal,
        _ => Code::InvalidArgument,
    };
    Status::new(code, e.to_string())
}

/// The gRPC status of a refused repository request.
pub fn repository_status(e: &crate::error::RepositoryError) -> Status {
    use crate::error::RepositoryError as R;
    use tonic::Code;
    let code = match e {
        R::NoModel { .. } => Code::NotFound,
        R::BadName { .. } | R::BadRequest { .. } => Code::InvalidArgument,
        R::ControlMode | R::NoRepository => Code::FailedPrecondition,
        R::ShuttingDown => Code::Unavailable,
        _ => Code::Internal,
    };
    Status::new(code, e.to_string())
}

/// Load and unload parameters (Triton's config overrides and file
/// contents) are not taken: refused rather than ignored.
fn no_parameters(n: usize) -> Result<(), Status> {
    if n > 0 {
        let e = crate::error::RepositoryError::BadRequest {
            reason: "load and unload parameters are not supported (configure a model by its config.json)".into(),
        };
        return Err(repository_status(&e));
    }
    Ok(())
}

/// A gRPC input's values: its entry of `raw_input_contents`, or its typed `contents`.
#[derive(Debug)]
pub enum GrpcData {
    /// Little-endian bytes, row-major.
    Raw(Bytes),
    /// Typed values.
    Typed(InferTensorContents),
}

/// The typed lists of [`InferTensorContents`] by name, with how many values each holds.
fn filled_lists(c: &InferTensorContents) -> [(&'static str, usize); 8] {
    [
        ("bool_contents", c.bool_contents.len()),
        ("int_contents", c.int_contents.len()),
        ("int64_contents", c.int64_contents.len()),
        ("uint_contents", c.uint_contents.len()),
        ("uint64_contents", c.uint64_contents.len()),
        ("fp32_contents", c.fp32_contents.len()),
        ("fp64_contents", c.fp64_contents.len()),
        ("bytes_contents", c.bytes_contents.len()),
    ]
}

impl TensorSource for GrpcData {
    type Shared = ();

    fn values(
        self,
        _: &mut (),
        name: &str,
        shape: &[u64],
        count: usize,
        datatype: Datatype,
    ) -> Result<Values, InputError> {
        let input = || name.to_owned();
        match self {
            GrpcData::Raw(bytes) => {
                let needed = count.saturating_mul(datatype.size());
                if bytes.len() != needed {
                    return Err(InputError::RawSize {
                        input: input(),
                        bytes: bytes.len(),
                        datatype: datatype.name(),
                        shape: Dims(shape.to_vec()),
                        needed,
                    });
                }
                Ok(values_from_le(&bytes, datatype))
            }
            GrpcData::Typed(c) => {
                let expected = match datatype {
                    Datatype::Fp32 => "fp32_contents",
                    Datatype::Int64 => "int64_contents",
                    Datatype::Bool => "bool_contents",
                };
                if let Some((field, _)) = filled_lists(&c).into_iter().find(|(f, n)| *n > 0 && *f != expected) {
                    return Err(InputError::ContentsField {
                        input: input(),
                        field,
                        datatype: datatype.name(),
                        expected,
                    });
                }
                let values = match datatype {
                    Datatype::Fp32 => Values::F32(c.fp32_contents),
                    Datatype::Int64 => Values::I64(c.int64_contents),
                    Datatype::Bool => {
                        Values::F32(c.bool_contents.into_iter().map(|b| if b { 1.0 } else { 0.0 }).collect())
                    }
                };
                if values.len() != count {
                    return Err(InputError::DataLength {
                        input: input(),
                        values: values.len(),
                        shape: Dims(shape.to_vec()),
                        needed: count,
                    });
                }
                Ok(values)
            }
        }
    }
}

/// A parameter as the REST path reads it (an empty one, no value chosen, is left out).
fn param_value(p: InferParameter) -> Option<ParamValue> {
    Some(match p.parameter_choice? {
        ParameterChoice::BoolParam(b) => ParamValue::Bool(b),
        ParameterChoice::Int64Param(i) => match u64::try_from(i) {
            Ok(u) => ParamValue::UInt(u),
            Err(_) => ParamValue::Int(i),
        },
        ParameterChoice::Uint64Param(u) => ParamValue::UInt(u),
        ParameterChoice::DoubleParam(x) => ParamValue::Float(x),
        ParameterChoice::StringParam(s) => ParamValue::Str(s),
    })
}

/// A parameters map, bounded as REST's `parameters` object is.
fn parameters(map: HashMap<String, InferParameter>, scope: &'static str) -> Result<Parameters, InputError> {
    bounded(scope, map.len(), protocol::MAX_PARAMETERS)?;
    Ok(Parameters(map.into_iter().filter_map(|(k, v)| Some((k, param_value(v)?))).collect()))
}

/// Refuses a list of `n` items over `max`, as REST refuses the JSON array.
fn bounded(what: &'static str, n: usize, max: usize) -> Result<(), InputError> {
    if n > max {
        return Err(InputError::TooMany { what, count: n, max });
    }
    Ok(())
}

/// The shape of a gRPC tensor (int64 dimensions) as REST's (non-negative), bounded as REST's.
fn shape(name: &str, dims: &[i64]) -> Result<Vec<u64>, InputError> {
    bounded("shape dimensions", dims.len(), protocol::MAX_DIMS)?;
    dims.iter()
        .map(|&d| u64::try_from(d))
        .collect::<Result<Vec<u64>, _>>()
        .map_err(|_| InputError::NegativeShape { input: name.to_owned(), shape: pmstate_norm::Dims(dims).to_string() })
}

/// A gRPC request decoded against `expect`: its inputs with their values
/// (raw for all or typed for all), then the same checks as a REST request.
/// Returns the request ready for the batcher and whether the answer goes
/// raw (as the inputs came, unless `binary_data_output` says otherwise).
pub fn decode_grpc(req: ModelInferRequest, expect: &Expect) -> Result<(crate::decode::Decoded, bool), RequestError> {
    let ModelInferRequest { id, parameters: params, inputs, outputs, raw_input_contents, .. } = req;
    let params = parameters(params, "parameters")?;
    let p = Params::read(&params, expect.non_finite)?;
    bounded("inputs", inputs.len(), protocol::MAX_INPUTS)?;
    bounded("outputs", outputs.len(), protocol::MAX_OUTPUTS)?;
    let raw = !raw_input_contents.is_empty();
    if raw && raw_input_contents.len() != inputs.len() {
        return Err(InputError::RawCount { raw: raw_input_contents.len(), inputs: inputs.len() }.into());
    }
    let mut raws = raw_input_contents.into_iter();
    let mut list = Vec::with_capacity(inputs.len());
    for t in inputs {
        let InferInputTensor { name, datatype, shape: dims, contents, .. } = t;
        let source = match (raws.next(), contents) {
            (Some(_), Some(_)) => return Err(InputError::RawAndTyped { input: name }.into()),
            (Some(bytes), None) => GrpcData::Raw(bytes),
            (None, Some(c)) => GrpcData::Typed(c),
            (None, None) => return Err(InputError::NoContents { input: name }.into()),
        };
        let shape = shape(&name, &dims)?;
        list.push(TensorIn { name, datatype, shape, source });
    }
    let (inputs, rows) = read_tensors(list, &mut (), expect, p.non_finite)?;
    let outputs = if outputs.is_empty() {
        None
    } else {
        let mut list = Vec::with_capacity(outputs.len());
        for o in outputs {
            let parameters = parameters(o.parameters, "output parameters")?;
            list.push(RequestOutput { name: Name(o.name), parameters });
        }
        Some(list)
    };
    let raw_out = match params.get("binary_data_output") {
        Some(ParamValue::Bool(b)) => *b,
        _ => raw,
    };
    let id = (!id.is_empty()).then_some(id);
    let mut decoded = assemble(id, &p, inputs, rows, outputs, expect)?;
    // one form for all outputs: raw_output_contents holds every output or none
    for w in &mut decoded.outputs {
        w.binary = true;
    }
    Ok((decoded, raw_out))
}

/// The answer as a gRPC response: raw little-endian `raw_output_contents`
/// (one entry per output), or typed `contents`.
pub fn encode_grpc(
    model_name: &str,
    id: Option<&str>,
    answer: &crate::batcher::Answer,
    raw: bool,
) -> ModelInferResponse {
    let mut outputs = Vec::with_capacity(answer.tensors.len());
    let mut raw_output_contents = Vec::new();
    for (w, shape, values) in &answer.tensors {
        let contents = if raw {
            let mut b = Vec::with_capacity(values.len() * values.datatype().size());
            match values {
                Values::F32(v) => v.iter().for_each(|x| b.extend_from_slice(&x.to_le_bytes())),
                Values::I64(v) => v.iter().for_each(|x| b.extend_from_slice(&x.to_le_bytes())),
            }
            raw_output_contents.push(Bytes::from(b));
            None
        } else {
            Some(match values {
                Values::F32(v) => InferTensorContents { fp32_contents: v.clone(), ..Default::default() },
                Values::I64(v) => InferTensorContents { int64_contents: v.clone(), ..Default::default() },
            })
        };
        outputs.push(InferOutputTensor {
            name: w.name.to_owned(),
            datatype: values.datatype().name().to_owned(),
            shape: shape.iter().map(|&d| i64::try_from(d).unwrap_or(i64::MAX)).collect(),
            parameters: HashMap::new(),
            contents,
        });
    }
    ModelInferResponse {
        model_name: model_name.to_owned(),
        model_version: answer.version.to_string(),
        id: id.unwrap_or_default().to_owned(),
        parameters: HashMap::new(),
        outputs,
        raw_output_contents,
    }
}

/// The gRPC service over the server's state.
#[derive(Clone)]
pub(crate) struct Service {
    st: Arc<AppState>,
    /// Turns true when shutdown begins: streams stop reading and end.
    stop: watch::Receiver<bool>,
}

/// `version` as the REST path takes it (empty: whichever is served).
fn version(v: &str) -> Option<&str> {
    (!v.is_empty()).then_some(v)
}

impl Service {
    /// One inference request, counted, limited and answered as a REST one is.
    async fn infer(&self, req: ModelInferRequest) -> Result<ModelInferResponse, RequestError> {
        let st = &self.st;
        let start = Instant::now();
        // counted on the model's metrics; a request naming no served model on the server's
        let target = find(st, &req.model_name, version(&req.model_version));
        let metrics = match &target {
            Ok((s, _)) => s.metrics.clone(),
            Err(_) => st.metrics.clone(),
        };
        metrics.requests.inc();
        // dropped with this future, also when the client goes away
        let _in_flight = InFlight::enter(&metrics.in_flight);
        let r = match target {
            Ok((served, model)) => self.infer_inner(&served, model, req).await,
            Err(e) => Err(e),
        };
        metrics.latency.observe(start.elapsed().as_secs_f64());
        if let Err(e) = &r {
            metrics.error(e);
        }
        r
    }

    async fn infer_inner(
        &self,
        served: &Served,
        model: Arc<LoadedModel>,
        req: ModelInferRequest,
    ) -> Result<ModelInferResponse, RequestError> {
        let st = &self.st;
        // the decoded message is charged to the body budget REST bodies share
        let size = prost::Message::encoded_len(&req);
        let Some(mut body) = Reservation::empty(st) else {
            return Err(RequestError::ShuttingDown);
        };
        if !body.grow(&st.body_budget, size) {
            return Err(RequestError::Busy { budget: st.limits.max_inflight_body_bytes });
        }
        let (non_finite, max_rows) = (st.non_finite, served.batching.max_batch);
        let (decoded, raw) = if size <= DECODE_INLINE_BYTES {
            decode_grpc(req, &Expect { iface: &model.interface, non_finite, max_rows })?
        } else {
            let m = model.clone();
            tokio::task::spawn_blocking(move || decode_grpc(req, &Expect { iface: &m.interface, non_finite, max_rows }))
                .await
                .map_err(|e| RequestError::Task { what: "decoding", source: Arc::new(e) })??
        };
        let ran = run(st, served, model, decoded).await?;
        drop(body);
        let mut held = ran.held;
        let resp = encode_grpc(&served.name, ran.id.as_deref(), &ran.answer, raw);
        drop(ran.answer);
        held.charge_beyond(st, ran.bound, prost::Message::encoded_len(&resp));
        served.metrics.rows.inc_by(ran.rows as u64);
        // the answer budget is held until the response is built; tonic
        // encodes and sends it after this returns (one message at a time
        // per call, at most MAX_STREAMS_PER_CONNECTION calls a connection)
        drop(held);
        Ok(resp)
    }

    fn ready(&self) -> bool {
        !self.st.draining.load(Ordering::Relaxed) && !*self.stop.borrow()
    }
}

/// The answers of one stream, in the order of its requests.
type StreamAnswers = ReceiverStream<Result<ModelStreamInferResponse, Status>>;

#[tonic::async_trait]
impl GrpcInferenceService for Service {
    async fn server_live(&self, _: Request<ServerLiveRequest>) -> Result<Response<ServerLiveResponse>, Status> {
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(&self, _: Request<ServerReadyRequest>) -> Result<Response<ServerReadyResponse>, Status> {
        Ok(Response::new(ServerReadyResponse { ready: self.ready() }))
    }

    async fn model_ready(&self, req: Request<ModelReadyRequest>) -> Result<Response<ModelReadyResponse>, Status> {
        let req = req.into_inner();
        find(&self.st, &req.name, version(&req.version)).map_err(|e| status_of(&e))?;
        Ok(Response::new(ModelReadyResponse { ready: self.ready() }))
    }

    async fn server_metadata(
        &self,
        _: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        let m = protocol::ServerMetadata::new();
        Ok(Response::new(ServerMetadataResponse {
            name: m.name.to_owned(),
            version: m.version.to_owned(),
            extensions: m.extensions.iter().map(|e| (*e).to_owned()).collect(),
        }))
    }

    async fn model_metadata(
        &self,
        req: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        let req = req.into_inner();
        let (served, m) = find(&self.st, &req.name, version(&req.version)).map_err(|e| status_of(&e))?;
        let md = protocol::ModelMetadata::of(&served.name, &m);
        let tensor = |t: protocol::MetadataTensor| proto::model_metadata_response::TensorMetadata {
            name: t.name,
            datatype: t.datatype.to_owned(),
            shape: t.shape,
        };
        Ok(Response::new(ModelMetadataResponse {
            name: md.name,
            versions: md.versions,
            platform: md.platform.to_owned(),
            inputs: md.inputs.into_iter().map(tensor).collect(),
            outputs: md.outputs.into_iter().map(tensor).collect(),
        }))
    }

    async fn model_config(
        &self,
        req: Request<proto::ModelConfigRequest>,
    ) -> Result<Response<proto::ModelConfigResponse>, Status> {
        let req = req.into_inner();
        let (served, m) = find(&self.st, &req.name, version(&req.version)).map_err(|e| status_of(&e))?;
        let c = protocol::ModelConfigResponse::of(&served.name, &m, &served.batching, served.reloads.counts());
        // every datatype a configuration names is in our enum (a wire
        // datatype alone, such as BOOL, never is an input's own)
        let data_type =
            |name: &str| proto::DataType::from_str_name(name).unwrap_or(proto::DataType::TypeInvalid) as i32;
        let config = proto::ModelConfig {
            name: c.name,
            platform: c.platform.to_owned(),
            backend: c.backend.to_owned(),
            max_batch_size: i32::try_from(c.max_batch_size).unwrap_or(i32::MAX),
            input: c
                .input
                .into_iter()
                .map(|t| proto::ModelInput {
                    data_type: data_type(t.data_type),
                    name: t.name,
                    dims: t.dims,
                    optional: t.optional,
                })
                .collect(),
            output: c
                .output
                .into_iter()
                .map(|t| proto::ModelOutput { data_type: data_type(t.data_type), name: t.name, dims: t.dims })
                .collect(),
            dynamic_batching: Some(proto::ModelDynamicBatching {
                max_queue_delay_microseconds: c.dynamic_batching.max_queue_delay_microseconds,
                default_queue_policy: Some(proto::ModelQueuePolicy {
                    max_queue_size: u32::try_from(c.dynamic_batching.default_queue_policy.max_queue_size)
                        .unwrap_or(u32::MAX),
                }),
            }),
        };
        Ok(Response::new(proto::ModelConfigResponse { config: Some(config) }))
    }

    async fn model_infer(&self, req: Request<ModelInferRequest>) -> Result<Response<ModelInferResponse>, Status> {
        self.infer(req.into_inner()).await.map(Response::new).map_err(|e| status_of(&e))
    }

    async fn repository_index(
        &self,
        req: Request<RepositoryIndexRequest>,
    ) -> Result<Response<RepositoryIndexResponse>, Status> {
        let req = req.into_inner();
        let list = crate::routes::repository_index(&self.st, &req.repository_name, req.ready)
            .await
            .map_err(|e| repository_status(&e))?;
        let models = list
            .into_iter()
            .map(|e| proto::repository_index_response::ModelIndex {
                name: e.name,
                version: e.version,
                state: e.state,
                reason: e.reason,
            })
            .collect();
        Ok(Response::new(RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        req: Request<RepositoryModelLoadRequest>,
    ) -> Result<Response<RepositoryModelLoadResponse>, Status> {
        let req = req.into_inner();
        no_parameters(req.parameters.len())?;
        crate::routes::repository_load(&self.st, &req.repository_name, &req.model_name)
            .await
            .map_err(|e| repository_status(&e))?;
        Ok(Response::new(RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        req: Request<RepositoryModelUnloadRequest>,
    ) -> Result<Response<RepositoryModelUnloadResponse>, Status> {
        let req = req.into_inner();
        no_parameters(req.parameters.len())?;
        crate::routes::repository_unload(&self.st, &req.repository_name, &req.model_name)
            .await
            .map_err(|e| repository_status(&e))?;
        Ok(Response::new(RepositoryModelUnloadResponse {}))
    }

    type ModelStreamInferStream = StreamAnswers;

    /// Requests are read as they come and run concurrently (so one stream
    /// can fill a batch), at most [`STREAM_WINDOW`] waiting; answers go out
    /// in request order. A refused request is answered with its
    /// `error_message` and the stream goes on; the stream ends when the
    /// client closes its side (after the last answer), when it stays idle
    /// past `header_timeout` (`DEADLINE_EXCEEDED`), on a message it cannot
    /// decode (too large: `OUT_OF_RANGE`), or at shutdown (`UNAVAILABLE`).
    async fn model_stream_infer(
        &self,
        req: Request<Streaming<ModelInferRequest>>,
    ) -> Result<Response<Self::ModelStreamInferStream>, Status> {
        let mut inbound = req.into_inner();
        let (out_tx, out_rx) = mpsc::channel(STREAM_WINDOW);
        let (order_tx, mut order_rx) = mpsc::channel::<Pending>(STREAM_WINDOW);
        let svc = self.clone();
        let idle = self.st.limits.header_timeout;
        let mut stop = self.stop.clone();
        // the reader: each request becomes a task, queued in order for the
        // writer, and so is how the stream ends
        tokio::spawn(async move {
            let end: Option<Status> = loop {
                let next = tokio::select! {
                    n = tokio::time::timeout(idle, inbound.message()) => n,
                    _ = stop.wait_for(|s| *s) => break Some(Status::unavailable("the server is shutting down")),
                    // the writer is gone: the client went away
                    _ = order_tx.closed() => break None,
                };
                match next {
                    Err(_) => {
                        break Some(Status::deadline_exceeded(format!(
                            "no request arrived on the stream for {} s (header_timeout)",
                            idle.as_secs_f64()
                        )))
                    }
                    Ok(Ok(None)) => break None,
                    Ok(Err(status)) => break Some(status),
                    Ok(Ok(Some(req))) => {
                        let svc = svc.clone();
                        let (name, id) = (req.model_name.clone(), req.id.clone());
                        let task = tokio::spawn(async move {
                            match svc.infer(req).await {
                                Ok(r) => {
                                    ModelStreamInferResponse { error_message: String::new(), infer_response: Some(r) }
                                }
                                Err(e) => ModelStreamInferResponse {
                                    error_message: e.to_string(),
                                    infer_response: Some(ModelInferResponse {
                                        model_name: name,
                                        id,
                                        ..Default::default()
                                    }),
                                },
                            }
                        });
                        if order_tx.send(Pending::Answer(AbortOnDrop(task))).await.is_err() {
                            break None;
                        }
                    }
                }
            };
            if let Some(status) = end {
                // after the answers already queued
                let _ = order_tx.send(Pending::End(status)).await;
            }
        });
        // the writer: answers in request order; gone with the client
        tokio::spawn(async move {
            while let Some(p) = order_rx.recv().await {
                let message = match p {
                    Pending::Answer(mut task) => tokio::select! {
                        done = &mut task => match done {
                            Ok(a) => Ok(a),
                            Err(e) => Err(Status::internal(format!("internal error: a stream request's task failed: {e}"))),
                        },
                        // the client went away while this request waited
                        _ = out_tx.closed() => break,
                    },
                    Pending::End(status) => Err(status),
                };
                if out_tx.send(message).await.is_err() {
                    // dropping `order_rx` aborts every request still pending
                    break;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(out_rx)))
    }
}

/// What a stream's writer sends next: a request's answer (its task,
/// aborted when dropped: the client went away before it was answered, and
/// its job is then skipped by the batcher), or the stream's end.
enum Pending {
    Answer(AbortOnDrop),
    End(Status),
}

/// A task aborted when its handle is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<ModelStreamInferResponse>);

impl std::future::Future for AbortOnDrop {
    type Output = Result<ModelStreamInferResponse, tokio::task::JoinError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One accepted gRPC connection, counted in `pmstate_connections` and
/// holding one of [`crate::Limits::max_connections`] slots while open.
pub(crate) struct Conn {
    io: Io,
    _slot: OwnedSemaphorePermit,
    gauge: Gauge,
}

enum Io {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for Conn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Io::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match &mut self.io {
            Io::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Io::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Tcp(s) => Pin::new(s).poll_flush(cx),
            Io::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Io::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.io {
            Io::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Tcp(s) => s.is_write_vectored(),
            Io::Unix(s) => s.is_write_vectored(),
        }
    }
}

/// A bound gRPC listener.
pub(crate) enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, UnixSocketFile),
}

/// The socket file of a Unix listener, removed when the server stops.
pub(crate) struct UnixSocketFile(PathBuf);

impl Drop for UnixSocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Binds `addr`; returns the listener and the address it is reachable at
/// (port 0 resolved). A Unix socket path already taken by a file nothing
/// answers on (a server that died) is replaced; one a server answers on,
/// or any other file, is refused.
pub(crate) async fn bind(addr: &GrpcAddr) -> io::Result<(Listener, GrpcAddr)> {
    match addr {
        GrpcAddr::Tcp(a) => {
            let l = TcpListener::bind(a).await?;
            let local = l.local_addr()?;
            Ok((Listener::Tcp(l), GrpcAddr::Tcp(local)))
        }
        GrpcAddr::Unix(path) => {
            let l = match UnixListener::bind(path) {
                Ok(l) => l,
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && stale_socket(path).await => {
                    std::fs::remove_file(path)?;
                    UnixListener::bind(path)?
                }
                Err(e) => return Err(e),
            };
            Ok((Listener::Unix(l, UnixSocketFile(path.clone())), GrpcAddr::Unix(path.clone())))
        }
    }
}

/// Whether `path` is a socket file no server answers on.
async fn stale_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    let is_socket = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket());
    is_socket && matches!(UnixStream::connect(path).await, Err(e) if e.kind() == io::ErrorKind::ConnectionRefused)
}

/// Accepts connections while a slot is free (the rest wait in the listen
/// backlog), handing them to tonic through `tx` until tonic stops taking them.
async fn accept(listener: Listener, slots: Arc<Semaphore>, gauge: Gauge, tx: mpsc::Sender<io::Result<Conn>>) {
    let _file = match &listener {
        Listener::Unix(_, f) => Some(f),
        Listener::Tcp(_) => None,
    };
    loop {
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => match s { Ok(s) => s, Err(_) => return },
            _ = tx.closed() => return,
        };
        let accepted = tokio::select! {
            a = async {
                match &listener {
                    Listener::Tcp(l) => l.accept().await.map(|(s, _)| {
                        // small answers go out at once (Nagle would hold them for the client's ACK)
                        let _ = s.set_nodelay(true);
                        Io::Tcp(s)
                    }),
                    Listener::Unix(l, _) => l.accept().await.map(|(s, _)| Io::Unix(s)),
                }
            } => a,
            _ = tx.closed() => return,
        };
        match accepted {
            Ok(io) => {
                gauge.inc();
                if tx.send(Ok(Conn { io, _slot: slot, gauge: gauge.clone() })).await.is_err() {
                    return;
                }
            }
            // out of descriptors or an aborted handshake: wait a little, go on
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Serves the gRPC API on `listener` until `stop` turns true, then drains
/// the calls in flight (streams end at once with `UNAVAILABLE`).
pub(crate) async fn serve(st: Arc<AppState>, listener: Listener, stop: watch::Receiver<bool>) -> io::Result<()> {
    let limits = st.limits;
    let service = GrpcInferenceServiceServer::new(Service { st: st.clone(), stop: stop.clone() })
        .max_decoding_message_size(limits.max_body_bytes)
        .max_encoding_message_size(usize::MAX);
    let (tx, rx) = mpsc::channel(1);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let acceptor = tokio::spawn(accept(listener, slots, st.metrics.connections.clone(), tx));
    let mut stopping = stop;
    let result = tonic::transport::Server::builder()
        .timeout(limits.body_timeout)
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .concurrency_limit_per_connection(MAX_STREAMS_PER_CONNECTION as usize)
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
        .http2_keepalive_interval(Some(limits.header_timeout))
        .http2_keepalive_timeout(Some(limits.body_stall_timeout.max(Duration::from_secs(1))))
        .add_service(service)
        .serve_with_incoming_shutdown(ReceiverStream::new(rx), async move {
            let _ = stopping.wait_for(|s| *s).await;
        })
        .await
        .map_err(|e| io::Error::other(e.to_string()));
    acceptor.abort();
    result
}

/// A client of the gRPC API at `addr` (TCP or Unix socket), for tests and
/// `pmstate bench-serve`.
pub async fn connect(
    addr: &GrpcAddr,
) -> Result<GrpcInferenceServiceClient<tonic::transport::Channel>, tonic::transport::Error> {
    let channel = match addr {
        GrpcAddr::Tcp(a) => tonic::transport::Endpoint::from_shared(format!("http://{a}"))?.connect().await?,
        GrpcAddr::Unix(path) => {
            // the URI is not used: every connection goes to the socket
            tonic::transport::Endpoint::from_static("http://localhost")
                .connect_with_connector(UnixConnector(path.clone()))
                .await?
        }
    };
    Ok(GrpcInferenceServiceClient::new(channel).max_decoding_message_size(usize::MAX))
}

/// Connects a channel to a Unix socket.
#[derive(Clone)]
struct UnixConnector(PathBuf);

impl tower_service::Service<axum::http::Uri> for UnixConnector {
    type Response = hyper_util::rt::TokioIo<UnixStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn std::future::Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: axum::http::Uri) -> Self::Future {
        let path = self.0.clone();
        Box::pin(async move { Ok(hyper_util::rt::TokioIo::new(UnixStream::connect(path).await?)) })
    }
}
