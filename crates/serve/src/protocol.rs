//! The Open Inference Protocol's JSON objects (KServe V2 REST), as this
//! server reads and writes them: the inference request, and the server and
//! model metadata, readiness and Triton-style model configuration answers.

use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::model::{Datatype, LoadedModel};
use crate::options::Batching;

// The request is read into these shadow structs and nothing else: each
// accepts only the protocol's fields (an unknown or repeated one is refused
// by serde with its name), and every list and map is counted while it is
// parsed, so a request cannot make the server build more than these limits
// allow before it is refused. Tensor data is kept as the raw JSON text it
// is (borrowed from the body) and only read once its shape has been
// checked, into exactly as many values as that shape holds.

/// Most inputs one request may hold (a model reads a handful of observation keys).
pub const MAX_INPUTS: usize = 64;
/// Most outputs one request may ask for.
pub const MAX_OUTPUTS: usize = 64;
/// Most entries of one `parameters` object.
pub const MAX_PARAMETERS: usize = 64;
/// Most dimensions of one shape.
pub const MAX_DIMS: usize = 8;
/// Longest name (of an input, output, datatype or parameter), in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// `$inference_request`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InferRequest<'a> {
    /// Echoed in the response.
    #[serde(default)]
    pub id: Option<String>,
    /// Request parameters (`sample`, `seed`, `reject_non_finite`, `binary_data_output`; others ignored).
    #[serde(default)]
    pub parameters: Parameters,
    /// Input tensors.
    #[serde(borrow)]
    pub inputs: Bounded<RequestInput<'a>>,
    /// Outputs wanted (default: every output the request allows).
    #[serde(default)]
    pub outputs: Option<Bounded<RequestOutput>>,
}

/// `$request_input`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestInput<'a> {
    /// The observation key.
    pub name: Name,
    /// `[rows, width]` (at most [`MAX_DIMS`] dimensions are read).
    pub shape: Shape,
    /// `FP32` (`INT64` for a GPC prior's tokens).
    pub datatype: Name,
    /// `binary_data_size` for the binary extension.
    #[serde(default)]
    pub parameters: Parameters,
    /// Elements in JSON (absent when sent as binary), unread: see
    /// [`crate::json_floats::read_data`].
    #[serde(default, borrow)]
    pub data: Option<&'a RawValue>,
}

/// `$request_output`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestOutput {
    /// The output's name.
    pub name: Name,
    /// `binary_data` for the binary extension.
    #[serde(default)]
    pub parameters: Parameters,
}

/// A name of at most [`MAX_NAME_BYTES`] bytes; a longer one is refused
/// while parsing, quoting only its first bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Name(pub String);

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Name;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(f, "a name (a string of at most {MAX_NAME_BYTES} bytes)")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Name, E> {
                if v.len() > MAX_NAME_BYTES {
                    return Err(E::custom(format_args!(
                        "a name of {} bytes ({}), at most {MAX_NAME_BYTES} are allowed",
                        v.len(),
                        crate::error::clip_json(v)
                    )));
                }
                Ok(Name(v.to_owned()))
            }
        }
        d.deserialize_str(V)
    }
}

/// What a bounded list holds: its limit and what to call its items.
pub trait Listed {
    /// Most items.
    const MAX: usize;
    /// The items, in a refusal (`inputs`).
    const WHAT: &'static str;
}

impl Listed for RequestInput<'_> {
    const MAX: usize = MAX_INPUTS;
    const WHAT: &'static str = "inputs";
}

impl Listed for RequestOutput {
    const MAX: usize = MAX_OUTPUTS;
    const WHAT: &'static str = "outputs";
}

/// A JSON array of at most `T::MAX` items, refused as soon as one more is seen.
#[derive(Debug)]
pub struct Bounded<T>(pub Vec<T>);

impl<'de, T: Deserialize<'de> + Listed> Deserialize<'de> for Bounded<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de> + Listed> Visitor<'de> for V<T> {
            type Value = Bounded<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(f, "an array of at most {} {}", T::MAX, T::WHAT)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Bounded<T>, A::Error> {
                let mut out = Vec::new();
                while let Some(item) = seq.next_element::<T>()? {
                    if out.len() == T::MAX {
                        return Err(A::Error::custom(format_args!("more than {} {}", T::MAX, T::WHAT)));
                    }
                    out.push(item);
                }
                Ok(Bounded(out))
            }
        }
        d.deserialize_seq(V(std::marker::PhantomData))
    }
}

/// A shape: at most [`MAX_DIMS`] non-negative dimensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape(pub Vec<u64>);

impl<'de> Deserialize<'de> for Shape {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Shape;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(f, "a shape (an array of at most {MAX_DIMS} non-negative integers)")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shape, A::Error> {
                let mut dims = Vec::new();
                while let Some(d) = seq.next_element::<u64>()? {
                    if dims.len() == MAX_DIMS {
                        return Err(A::Error::custom(format_args!("a shape of more than {MAX_DIMS} dimensions")));
                    }
                    dims.push(d);
                }
                Ok(Shape(dims))
            }
        }
        d.deserialize_seq(V)
    }
}

/// A parameter's value: the protocol allows a bool, a number or a string.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamValue {
    /// `true` / `false`.
    Bool(bool),
    /// A non-negative integer.
    UInt(u64),
    /// A negative integer.
    Int(i64),
    /// Any other number.
    Float(f64),
    /// A string.
    Str(String),
}

impl ParamValue {
    /// The value as a non-negative integer, if it is one.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            ParamValue::UInt(u) => Some(*u),
            _ => None,
        }
    }
}

/// As JSON, strings clipped to a few hundred bytes.
impl std::fmt::Display for ParamValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParamValue::Bool(b) => write!(f, "{b}"),
            ParamValue::UInt(u) => write!(f, "{u}"),
            ParamValue::Int(i) => write!(f, "{i}"),
            ParamValue::Float(x) => f.write_str(ryu::Buffer::new().format(*x)),
            ParamValue::Str(s) => f.write_str(&crate::error::clip_json(s)),
        }
    }
}

/// Reads one parameter's value, naming the parameter when it is not a scalar.
struct ParamSeed<'k>(&'k str);

impl<'de> DeserializeSeed<'de> for ParamSeed<'_> {
    type Value = ParamValue;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<ParamValue, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ParamSeed<'_> {
    type Value = ParamValue;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "a bool, number or string for parameter {}", crate::error::clip_json(self.0))
    }
    fn visit_bool<E>(self, v: bool) -> Result<ParamValue, E> {
        Ok(ParamValue::Bool(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<ParamValue, E> {
        Ok(ParamValue::UInt(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<ParamValue, E> {
        Ok(match u64::try_from(v) {
            Ok(u) => ParamValue::UInt(u),
            Err(_) => ParamValue::Int(v),
        })
    }
    fn visit_f64<E>(self, v: f64) -> Result<ParamValue, E> {
        Ok(ParamValue::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<ParamValue, E> {
        Ok(ParamValue::Str(v.to_owned()))
    }
}

/// A `parameters` object: at most [`MAX_PARAMETERS`] entries, each key
/// once (a repeated key is refused by name: readers disagree on which
/// copy wins), each value a bool, number or string.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parameters(pub Vec<(String, ParamValue)>);

impl Parameters {
    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&ParamValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

impl<'de> Deserialize<'de> for Parameters {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Parameters;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(f, "a parameters object (at most {MAX_PARAMETERS} entries)")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Parameters, A::Error> {
                let mut out: Vec<(String, ParamValue)> = Vec::new();
                while let Some(Name(key)) = map.next_key::<Name>()? {
                    if out.iter().any(|(k, _)| *k == key) {
                        return Err(A::Error::custom(format_args!(
                            "parameter {} is given twice",
                            crate::error::clip_json(&key)
                        )));
                    }
                    if out.len() == MAX_PARAMETERS {
                        return Err(A::Error::custom(format_args!("more than {MAX_PARAMETERS} parameters")));
                    }
                    let value = map.next_value_seed(ParamSeed(&key))?;
                    out.push((key, value));
                }
                Ok(Parameters(out))
            }
        }
        d.deserialize_map(V)
    }
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
    /// `FP32`, or `INT64` (a GPC prior's tokens).
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
                .map(|i| MetadataTensor { name: i.name.clone(), datatype: i.datatype.name(), shape: i.shape() })
                .collect(),
            outputs: m
                .interface
                .outputs
                .iter()
                .map(|o| MetadataTensor {
                    name: o.name.to_owned(),
                    datatype: o.datatype.name(),
                    shape: o.shape.clone(),
                })
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
    /// `TYPE_FP32`, or `TYPE_INT64` (a GPC prior's tokens).
    pub data_type: &'static str,
    /// Shape without the rows (`-1`: open).
    pub dims: Vec<i64>,
    /// Triton's `optional`: a request may leave the input out (written only
    /// when true): `vae_noise`, `prior_tokens`, and the inputs only a
    /// policy's critic or discriminator networks read.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
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
    pub description: &'a crate::model::ModelDescription,
    /// In_keys the config lists but no network reads: accepted and ignored.
    pub ignored_inputs: &'a [String],
    /// Width sums the checkpoint fixes (`module`, `keys`, `total`).
    pub width_sums: Vec<WidthSum<'a>>,
    /// Reloads so far (successful, failed).
    pub reloads: ReloadCounts,
    /// A pipeline's deployment contract (also as YAML at
    /// `/v2/models/<name>/contract`); absent for a policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub contract: Option<&'a pmstate_deploy::Contract>,
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
        let tensor = |name: &str, datatype: Datatype, shape: &[i64], rows: bool, optional: bool| ConfigTensor {
            name: name.to_owned(),
            data_type: datatype.config_name(),
            dims: if rows { shape[1..].to_vec() } else { shape.to_vec() },
            optional,
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
                // an input the actor does not read (the critic's or the
                // discriminator's own) may be left out too: the request then
                // gets the actor's outputs
                .map(|i| tensor(&i.name, i.datatype, &i.shape(), true, i.optional || !i.actor))
                .collect(),
            output: m
                .interface
                .outputs
                .iter()
                .map(|o| tensor(o.name, o.datatype, &o.shape, o.shape.first() == Some(&-1), false))
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
                contract: m.contract(),
            },
        }
    }
}
