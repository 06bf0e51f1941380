//! One interface for every model family: [`Model`].
//!
//! A model takes named tensors and gives named tensors. What it takes and
//! gives is its [`Signature`] (names, element types, shapes with their open
//! dimensions, which inputs may be left out); [`Model::run`] computes the
//! outputs each caller asked for on a [`Batch`] whose rows may belong to
//! several callers ([`Segment`]s, each with its own seed), chunked so that a
//! forward's memory is bounded; [`Model::description`] says what it is.
//!
//! [`load`] reads a checkpoint and its resolved configs and returns the
//! model whatever its family: the family is decided in one place, the
//! [`registry`]. Each family implements [`Model`] next to its own code (PPO
//! and AMP in `served_policy.rs`, MaskedMimic in `served_masked_mimic.rs`,
//! the GPC prior in `gpc/served.rs`; the deployment pipeline in
//! `pmstate-deploy`'s `served.rs`). Serve, the CLI and the benches use this
//! interface and carry no per-family branches; a new family is its module,
//! one line of [`registry::FAMILIES`] and its tests.
//!
//! # Example
//!
//! ```
//! use std::collections::HashMap;
//! use candle_core::{DType, Device, Tensor};
//! use pmstate_policy::served::{self, Batch, ModelOptions, Segment, Source, Wanted};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // PPO, AMP, MaskedMimic or a GPC prior: the configs next to it say which
//! let ckpt = "../../testdata/policy/smpl_tracker/last.ckpt";
//! let model = served::load(ckpt.as_ref(), None, &Device::Cpu, &ModelOptions::default())?;
//! let mut inputs = HashMap::new();
//! for input in model.signature().inputs.iter().filter(|i| i.actor && !i.optional) {
//!     let width = input.width.ok_or("a width the checkpoint leaves open")?;
//!     inputs.insert(input.name.clone(), Tensor::zeros((4, width), DType::F32, &Device::Cpu)?);
//! }
//! // one caller's 4 rows, wanting what the actor computes
//! let segment = Segment { rows: 4, seed: None, wanted: Wanted::Sources(&[Source::Actor]) };
//! let outputs = model.run(&Batch { inputs: &inputs, segments: &[segment], chunk_rows: 1024 })?;
//! let (name, mean) = &outputs[0][0];
//! assert_eq!((*name, mean.dims()), ("mean_action", &[4, model.signature().action_size][..]));
//! # Ok(())
//! # }
//! ```

mod pins;
pub mod registry;
mod rows;
mod signature;

use std::any::Any;
use std::collections::HashMap;

use candle_core::{Device, Tensor};
use serde::Serialize;

pub(crate) use pins::resolve_widths;
pub use pins::{PinError, PinProblem};
pub use registry::{load, LoadError, ModelOptions};
pub use rows::{by_chunks, rows_of, share, split_rows, RowRange};
pub use signature::{Datatype, Difference, InputSpec, OutputSpec, Signature, Source, MAX_LOGITS_PER_FORWARD};

use crate::error::PolicyError;
use crate::load::AllowedGlobal;

/// Outputs by name, in the order the model computes them.
pub type Named = Vec<(&'static str, Tensor)>;

/// What one caller of a [`Batch`] asked for.
#[derive(Debug, Clone, Copy)]
pub enum Wanted<'a> {
    /// These outputs (names of the [`Signature`]'s outputs); a server's
    /// request.
    Names(&'a [&'a str]),
    /// Every output these sources compute, including ones a family gives
    /// only here (a GPC prior's `norm_obs`): `pmstate policy run`.
    Sources(&'a [Source]),
}

impl Wanted<'_> {
    /// Whether the output `name`, computed by `source`, is wanted.
    pub fn wants(&self, name: &str, source: Source) -> bool {
        match self {
            Wanted::Names(names) => names.contains(&name),
            Wanted::Sources(sources) => sources.contains(&source),
        }
    }

    /// Whether any output of `source` among `outputs` is wanted.
    pub fn wants_source(&self, outputs: &[OutputSpec], source: Source) -> bool {
        match self {
            Wanted::Names(names) => outputs.iter().any(|o| o.source == source && names.contains(&o.name)),
            Wanted::Sources(sources) => sources.contains(&source),
        }
    }
}

/// The rows of one caller within a [`Batch`]: they follow the previous
/// segment's rows.
#[derive(Debug, Clone, Copy)]
pub struct Segment<'a> {
    /// How many rows.
    pub rows: usize,
    /// The seed of what is drawn for these rows (actions around the mean,
    /// a prior's tokens); `None` draws nothing where drawing is optional.
    pub seed: Option<u64>,
    /// The outputs wanted.
    pub wanted: Wanted<'a>,
}

/// Rows of one or more callers, run together.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// Every input, `[rows, ...]`, the segments' rows one after another.
    pub inputs: &'a HashMap<String, Tensor>,
    /// Whose rows are whose, in order.
    pub segments: &'a [Segment<'a>],
    /// Most rows one forward holds (a row-independent family splits the
    /// batch; the outputs do not change: every row's outputs are the same
    /// bits whatever else is in its forward).
    pub chunk_rows: usize,
}

impl Batch<'_> {
    /// All rows.
    pub fn rows(&self) -> usize {
        self.segments.iter().map(|s| s.rows).sum()
    }

    /// Each segment's rows, as ranges of the batch.
    pub fn ranges(&self) -> Vec<RowRange> {
        let mut start = 0;
        self.segments
            .iter()
            .map(|s| {
                let r = RowRange { start, len: s.rows };
                start += s.rows;
                r
            })
            .collect()
    }
}

/// Why [`Model::run`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// A family of this crate failed (its inputs, its weights, the tensor library).
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A family of another crate failed (the deployment pipeline's
    /// `DeployError`): downcast `source` to match it.
    #[error("{source}")]
    Family {
        /// The model class.
        model: &'static str,
        /// Its error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl From<candle_core::Error> for RunError {
    fn from(e: candle_core::Error) -> Self {
        RunError::Policy(e.into())
    }
}

/// What [`Model::description`] returns: layers, normalizers (settings and
/// counts), token structure, whatever the family has to say, as JSON (its
/// family's description's fields, in their order, each number written as
/// its own type writes it: an f32 `4.49955` stays `4.49955`) and as text.
#[derive(Debug, Clone)]
pub struct ModelDescription {
    json: Box<serde_json::value::RawValue>,
    text: String,
}

impl ModelDescription {
    /// The description of a family's description type.
    pub fn of(d: &(impl Serialize + std::fmt::Display)) -> Result<Self, PolicyError> {
        // kept as written: through a `serde_json::Value` an f32 would come
        // back widened to f64 digits (4.499549865722656)
        let json = serde_json::value::to_raw_value(d).map_err(PolicyError::Describe)?;
        Ok(ModelDescription { json, text: d.to_string() })
    }

    /// As JSON text.
    pub fn json(&self) -> &str {
        self.json.get()
    }
}

impl Serialize for ModelDescription {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.json.serialize(s)
    }
}

impl std::fmt::Display for ModelDescription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// A model of any family, ready to run.
pub trait Model: Send + Sync + 'static {
    /// What it takes and gives.
    fn signature(&self) -> &Signature;

    /// What it is.
    fn description(&self) -> &ModelDescription;

    /// The outputs each segment of `batch` wanted, each `[segment rows, ...]`
    /// (`std` `[A]`), in one list per segment. Inputs are checked against
    /// the signature by the family (each error names the key).
    fn run(&self, batch: &Batch<'_>) -> Result<Vec<Named>, RunError>;

    /// Where it runs.
    fn device(&self) -> &Device;

    /// The resolved configs file it was built from, when one was read.
    fn config_path(&self) -> Option<&str>;

    /// Globals let through by `Globals::Allow` at load.
    fn allowed_globals(&self) -> &[AllowedGlobal];

    /// The family's own type, for callers that need more than the
    /// interface (a test comparing against the library, the deploy
    /// contract of a pipeline).
    fn as_any(&self) -> &dyn Any;
}
