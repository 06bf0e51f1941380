//! The Open Inference Protocol's JSON objects (KServe V2 REST), as this
//! server reads and writes them: the inference request, and the server and
//! model metadata, readiness and Triton-style model configuration answers.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::json_floats::FloatData;
use crate::model::LoadedModel;
use crate::options::Batching;

/// `$inference_request`.
#[derive(Debug, Deserialize)]
pub struct InferRequest {
    /// Echoed in the response.
    #[serde(default)]
    pub id: Option<String>,
    /// Request parameters (`sample`, `seed`, `reject_non_finite`, `binary_data_output`; others ignored).
    #[serde(default)]
    pub parameters: Map<String, Value>,
    /// Input tensors.
    pub inputs: Vec<RequestInput>,
    /// Outputs wanted (default: every output the request allows).
    #[serde(default)]
    pub outputs: Option<Vec<RequestOutput>>,
}

/// `$request_input`.
#[derive(Debug, Deserialize)]
pub struct RequestInput {
    /// The observation key.
    pub name: String,
    /// `[rows, width]`.
    pub shape: Vec<u64>,
    /// Must be `FP32`.
    pub datatype: String,
    /// `binary_data_size` for the binary extension.
    #[serde(default)]
    pub parameters: Map<String, Value>,
    /// Elements in JSON (absent when sent as binary).
    #[serde(default)]
    pub data: Option<FloatData>,
}

/// `$request_output`.
#[derive(Debug, Deserialize)]
pub struct RequestOutput {
    /// The output's name.
    pub name: String,
    /// `binary_data` for the binary extension.
    #[serde(default)]
    pub parameters: Map<String, Value>,
}

/// `$metadata_server_response`.
#[derive(Debug, Serialize)]
pub struct ServerMetadata {
    /// `pmstate`.
    pub name: &'static str,
    /// This crate's version.
    pub version: &'static str,
    /// Extensions implemented.
    pub extensions: [&'static str; 3],
}

impl ServerMetadata {
    /// This server's.
    pub fn new() -> Self {
        ServerMetadata {
            name: "pmstate",
            version: env!("CARGO_PKG_VERSION"),
            extensions: ["binary_tensor_data", "model_configuration", "parameters"],
        }
    }
}

impl Default for ServerMetadata {
    fn default() -> Self {
        Self::new()
    }
}

/// `$metadata_tensor`.
#[derive(Debug, Serialize)]
pub struct MetadataTensor {
    /// Name.
    pub name: String,
    /// `FP32`.
    pub datatype: &'static str,
    /// `-1` where variable (rows; widths the checkpoint leaves open).
    pub shape: Vec<i64>,
}

/// The platform string of model metadata (`<project>_<format>`).
pub const PLATFORM: &str = "protomotions_checkpoint";

/// `$metadata_model_response`.
#[derive(Debug, Serialize)]
pub struct ModelMetadata {
    /// The model name.
    pub name: String,
    /// The version being served (one at a time; it counts reloads).
    pub versions: Vec<String>,
    /// [`PLATFORM`].
    pub platform: &'static str,
    /// One per observation key.
    pub inputs: Vec<MetadataTensor>,
    /// Every output.
    pub outputs: Vec<MetadataTensor>,
}

impl ModelMetadata {
    /// The metadata of `m` served as `name`.
    pub fn of(name: &str, m: &LoadedModel) -> Self {
        ModelMetadata {
            name: name.to_owned(),
            versions: vec![m.version.to_string()],
            platform: PLATFORM,
            inputs: m
                .interface
                .inputs
                .iter()
                .map(|i| MetadataTensor {
                    name: i.name.clone(),
                    datatype: "FP32",
                    shape: vec![-1, i.width.map_or(-1, |w| w as i64)],
                })
                .collect(),
            outputs: m
                .interface
                .outputs
                .iter()
                .map(|o| MetadataTensor { name: o.name.to_owned(), datatype: "FP32", shape: o.shape.clone() })
                .collect(),
        }
    }
}

/// `$ready_model_response`.
#[derive(Debug, Serialize)]
pub struct ModelReady {
    /// The model name.
    pub name: String,
    /// Whether it serves.
    pub ready: bool,
}

/// A tensor of Triton's model configuration (`dims` without the batch dimension).
#[derive(Debug, Serialize)]
pub struct ConfigTensor {
    /// Name.
    pub name: String,
    /// `TYPE_FP32`.
    pub data_type: &'static str,
    /// Shape without the rows (`-1`: open).
    pub dims: Vec<i64>,
}

/// Triton's `dynamic_batching` block.
#[derive(Debug, Serialize)]
pub struct DynamicBatching {
    /// `--max-wait-us`.
    pub max_queue_delay_microseconds: u64,
    /// Triton's queue policy: `--queue`.
    pub default_queue_policy: QueuePolicy,
}

/// Triton's queue policy (only the size applies here).
#[derive(Debug, Serialize)]
pub struct QueuePolicy {
    /// Most requests waiting.
    pub max_queue_size: usize,
}

/// `GET /v2/models/<name>/config`: Triton's model configuration fields
/// (what `tritonclient`'s `get_model_config` reads), plus `pmstate`: the
/// details beyond the protocol.
#[derive(Debug, Serialize)]
pub struct ModelConfigResponse<'a> {
    /// The model name.
    pub name: String,
    /// [`PLATFORM`].
    pub platform: &'static str,
    /// `pmstate`.
    pub backend: &'static str,
    /// `--max-batch`.
    pub max_batch_size: usize,
    /// Inputs, rows left out.
    pub input: Vec<ConfigTensor>,
    /// Outputs, rows left out (`std` keeps its one dimension).
    pub output: Vec<ConfigTensor>,
    /// Batching settings.
    pub dynamic_batching: DynamicBatching,
    /// Layers, normalizers, provenance and more.
    pub pmstate: PmstateDetails<'a>,
}

/// What Triton's configuration has no field for.
#[derive(Debug, Serialize)]
pub struct PmstateDetails<'a> {
    /// The version being served.
    pub version: String,
    /// Checkpoint, configs file, sha256, size, load time, device.
    pub provenance: &'a crate::model::Provenance,
    /// Model class, in_keys with widths, layers, normalizer settings and counts.
    pub description: &'a pmstate_policy::Description,
    /// In_keys the config lists but no network reads: accepted and ignored.
    pub ignored_inputs: &'a [String],
    /// Width sums the checkpoint fixes (`module`, `keys`, `total`).
    pub width_sums: Vec<WidthSum<'a>>,
    /// Reloads so far (successful, failed).
    pub reloads: ReloadCounts,
}

/// A sum of input widths one module needs.
#[derive(Debug, Serialize)]
pub struct WidthSum<'a> {
    /// Config path of the module.
    pub module: &'a str,
    /// Its in_keys.
    pub keys: &'a [String],
    /// Their total width.
    pub total: usize,
}

/// Reload outcomes.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ReloadCounts {
    /// Models swapped in.
    pub ok: u64,
    /// Checkpoints refused (half-written, corrupt, incompatible).
    pub failed: u64,
}

impl<'a> ModelConfigResponse<'a> {
    /// The configuration of `m` served as `name` with `batching`.
    pub fn of(name: &str, m: &'a LoadedModel, batching: &Batching, reloads: ReloadCounts) -> Self {
        let tensor = |name: &str, shape: &[i64], rows: bool| ConfigTensor {
            name: name.to_owned(),
            data_type: "TYPE_FP32",
            dims: if rows { shape[1..].to_vec() } else { shape.to_vec() },
        };
        ModelConfigResponse {
            name: name.to_owned(),
            platform: PLATFORM,
            backend: "pmstate",
            max_batch_size: batching.max_batch,
            input: m
                .interface
                .inputs
                .iter()
                .map(|i| tensor(&i.name, &[-1, i.width.map_or(-1, |w| w as i64)], true))
                .collect(),
            output: m
                .interface
                .outputs
                .iter()
                .map(|o| tensor(o.name, &o.shape, o.shape.first() == Some(&-1)))
                .collect(),
            dynamic_batching: DynamicBatching {
                max_queue_delay_microseconds: batching.max_wait.as_micros() as u64,
                default_queue_policy: QueuePolicy { max_queue_size: batching.queue },
            },
            pmstate: PmstateDetails {
                version: m.version.to_string(),
                provenance: &m.provenance,
                description: &m.description,
                ignored_inputs: &m.interface.ignored,
                width_sums: m
                    .interface
                    .groups
                    .iter()
                    .map(|(module, keys, total)| WidthSum { module, keys, total: *total })
                    .collect(),
                reloads,
            },
        }
    }
}
