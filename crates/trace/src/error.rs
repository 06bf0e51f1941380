//! The one error type of `pmstate-trace`.

use std::fmt;

/// What can be wrong with a trace file, or go wrong replaying it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The input is not a regular file (a directory, a FIFO, a device).
    #[error("{path}: not a regular file ({kind}); a trace is a .pmtrace.safetensors file")]
    NotAFile {
        /// The path given.
        path: String,
        /// What it is instead.
        kind: &'static str,
    },
    /// Not a valid safetensors file.
    #[error("not a safetensors file: {0}")]
    Container(#[source] safetensors::SafeTensorError),
    /// A safetensors file that is not a pm-trace (no `__metadata__`, or no `format: pm-trace`).
    #[error("not a pm-trace file: {0}")]
    NotATrace(&'static str),
    /// The trace JSON document does not parse, or is not shaped as pm-trace v1 requires.
    #[error("trace JSON: {0}")]
    Json(#[source] serde_json::Error),
    /// A version this reader does not know.
    #[error("unsupported pm-trace version {0} (this reader knows version 1)")]
    Version(u64),
    /// A structural problem, named by step and field.
    #[error("step {step} ({op}): field {field}: {problem}")]
    Field {
        /// Step index.
        step: usize,
        /// The operation.
        op: String,
        /// The field at fault (`state.mean`, `batch_var[1]`).
        field: String,
        /// What is wrong.
        #[source]
        problem: FieldProblem,
    },
    /// A problem in the module or header part of the document.
    #[error("{field}: {problem}")]
    Header {
        /// The field at fault (`module.class`, `world_size`).
        field: &'static str,
        /// What is wrong.
        #[source]
        problem: FieldProblem,
    },
    /// A bound on what a trace may make the replayer allocate or run.
    #[error("{limit} needs {needed}, over the limit of {max} ({}); see the README's limits table", limit.name())]
    Limit {
        /// Which limit, and what hit it.
        limit: TraceLimit,
        /// The limit.
        max: u64,
        /// What the input asks for.
        needed: u64,
    },
    /// A trace that cannot be written.
    #[error("writing trace: tensor {tensor}: {problem}")]
    Write {
        /// The tensor's name in the file.
        tensor: String,
        /// What is wrong.
        #[source]
        problem: FieldProblem,
    },
    /// The replay itself failed.
    #[error("replay: {0}")]
    Replay(#[source] ReplayFailure),
}

/// What is wrong with one field of a trace.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FieldProblem {
    /// The field is absent (or null where a value is required).
    #[error("missing")]
    Missing,
    /// A field only some modules need, absent from one that needs it.
    #[error("missing; {0} needs it")]
    RequiredFor(&'static str),
    /// The document's `format` is not `pm-trace`.
    #[error("missing, or not \"pm-trace\"")]
    NotPmTrace,
    /// A number outside the range the format allows.
    #[error("{value} is not in {min}..={max}")]
    OutOfRange {
        /// The value given.
        value: u64,
        /// The smallest allowed.
        min: u64,
        /// The largest allowed.
        max: u64,
    },
    /// A safetensors header that lists a tensor, `__metadata__` or one of
    /// its keys twice (readers disagree on which of the two counts).
    #[error("{0} is listed twice")]
    DuplicateKey(String),
    /// An op name pm-trace v1 does not define (the JSON value given).
    #[error("unknown op {0}")]
    UnknownOp(String),
    /// A step that is not shaped as the format's step table (an unknown
    /// field, a value of the wrong JSON type).
    #[error("{0}")]
    Json(#[source] serde_json::Error),
    /// A list of names where the field takes one tensor name.
    #[error("a list; expected one tensor name")]
    ExpectedOneName,
    /// One name where the field takes a list of tensor names.
    #[error("a single name; expected a list of tensor names")]
    ExpectedNameList,
    /// A tensor name that the file does not hold.
    #[error("tensor '{0}' is not in the file")]
    NoSuchTensor(String),
    /// A tensor whose bytes do not make a tensor of its dtype and shape.
    #[error("tensor '{name}': {source}")]
    BadTensor {
        /// The tensor's name in the file.
        name: String,
        /// candle's error (boxed: errors stay small).
        source: Box<candle_core::Error>,
    },
    /// A tensor of the wrong dtype or rank.
    #[error("{found}; expected {expected}")]
    WrongTensor {
        /// What it is (`F32 of shape [2]`).
        found: String,
        /// What the field needs.
        expected: &'static str,
    },
    /// A tensor whose shape does not agree with another field.
    #[error("shape {} differs from {other}'s {}", Dims(found), Dims(expected))]
    ShapeMismatch {
        /// Its shape.
        found: Vec<usize>,
        /// The other field.
        other: &'static str,
        /// That field's shape.
        expected: Vec<usize>,
    },
    /// A per-rank list of the wrong length.
    #[error("{found} names for world size {world_size}: need one per rank")]
    RankCount {
        /// Names given.
        found: usize,
        /// The trace's world size.
        world_size: usize,
    },
    /// `combine_moments` with unequal numbers of means and vars, or none.
    #[error("{means} means and {vars} vars: need the same number, at least 1")]
    PartCounts {
        /// Means given.
        means: usize,
        /// Vars given.
        vars: usize,
    },
    /// candle refused the tensor (reading a count, moving it to the CPU).
    #[error("{0}")]
    Candle(#[source] Box<candle_core::Error>),
    /// The safetensors writer refused the tensors.
    #[error("{0}")]
    Safetensors(#[source] safetensors::SafeTensorError),
}

/// Which bound a trace hit ([`TraceError::Limit`]), and what hit it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TraceLimit {
    /// A module shape larger than the file could hold buffers for.
    ModuleShape {
        /// The shape `module.shape` declares.
        shape: Vec<usize>,
    },
    /// More ranks than [`MAX_INPROC_WORLD_SIZE`](crate::MAX_INPROC_WORLD_SIZE)
    /// for an in-process replay.
    InprocWorldSize,
    /// Observations beyond
    /// [`ReplayOptions::max_observation_bytes`](crate::ReplayOptions::max_observation_bytes).
    Observations {
        /// Ranks replayed.
        ranks: usize,
        /// Steps of the trace.
        steps: usize,
        /// Features per observation.
        features: usize,
        /// Elements of the outputs kept that have an input's size rather
        /// than the module's (normalize outputs, discounted rewards), all
        /// steps together: a tensor named by many steps costs this each time.
        kept_outputs: u64,
    },
}

impl TraceLimit {
    /// The limit's name.
    pub fn name(&self) -> &'static str {
        match self {
            TraceLimit::ModuleShape { .. } => "module shape: at most max(file bytes / 16, 65536) elements",
            TraceLimit::InprocWorldSize => {
                "MAX_INPROC_WORLD_SIZE (in-process replay; use --collective mpi for larger worlds)"
            }
            TraceLimit::Observations { .. } => "ReplayOptions::max_observation_bytes",
        }
    }
}

/// What hit the limit, in words.
impl fmt::Display for TraceLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceLimit::ModuleShape { shape } => write!(f, "module.shape {}", Dims(shape)),
            TraceLimit::InprocWorldSize => f.write_str("the trace's world size"),
            TraceLimit::Observations { ranks, steps, features, kept_outputs } => {
                write!(f, "{ranks} rank(s) x {steps} steps x {features} features")?;
                if *kept_outputs > 0 {
                    write!(f, " plus {kept_outputs} elements of outputs the size of their inputs")?;
                }
                Ok(())
            }
        }
    }
}

/// Why a replay could not run to the end (as opposed to a result that differs).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayFailure {
    /// The trace's world size and the collective's differ.
    #[error("the trace was recorded with world size {trace}, but this collective has {collective} ranks")]
    WorldSize {
        /// Recorded.
        trace: usize,
        /// The collective's.
        collective: usize,
    },
    /// A rank's thread could not be started.
    #[error("starting the thread of rank {rank}: {source}")]
    Spawn {
        /// The rank.
        rank: usize,
        /// The OS error.
        source: std::io::Error,
    },
    /// A rank's thread panicked (a bug: every failure should be an error).
    #[error("the thread of rank {rank} panicked")]
    Panicked {
        /// The rank.
        rank: usize,
    },
    /// Handing the ranks' observations to rank 0 failed.
    #[error("gathering the ranks' observations: {source}{}", FirstFailure(first_failure.as_ref()))]
    Gather {
        /// The collective's error.
        source: Box<pmstate_norm::NormError>,
        /// This rank's first failed step, when it failed one.
        first_failure: Option<(usize, String)>,
    },
    /// A peer's observations did not decode.
    #[error("rank {rank}'s observations: {problem}")]
    PeerObservations {
        /// The peer's rank.
        rank: usize,
        /// What is wrong.
        #[source]
        problem: WireProblem,
    },
    /// A recorder step that does not apply to the module (record_reward on a RunningMeanStd).
    #[error("{op} on a {class}")]
    WrongModule {
        /// The operation.
        op: &'static str,
        /// The module class.
        class: &'static str,
    },
    /// The normalizer refused a recorder step.
    #[error(transparent)]
    Norm(Box<pmstate_norm::NormError>),
}

/// `; this rank first failed at step 3: ...`, or nothing.
struct FirstFailure<'a>(Option<&'a (usize, String)>);

impl fmt::Display for FirstFailure<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some((step, e)) => write!(f, "; this rank first failed at step {step}: {e}"),
            None => Ok(()),
        }
    }
}

/// What is wrong with the observations a peer sent to rank 0 (MPI replay).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WireProblem {
    /// Not a safetensors blob.
    #[error("{0}")]
    Container(#[source] safetensors::SafeTensorError),
    /// No `steps` entry in its `__metadata__`.
    #[error("no steps")]
    NoSteps,
    /// The `steps` entry does not decode.
    #[error("steps: {0}")]
    Steps(#[source] serde_json::Error),
    /// Observations of another number of steps than the trace has.
    #[error("{found} steps, the trace has {expected}")]
    StepCount {
        /// Steps sent.
        found: usize,
        /// Steps of the trace.
        expected: usize,
    },
    /// A tensor a step needs is absent or invalid.
    #[error("{name}: {source}")]
    Tensor {
        /// The tensor's name in the blob.
        name: String,
        /// The safetensors reader's error.
        source: safetensors::SafeTensorError,
    },
    /// A tensor that does not load.
    #[error("{name}: {source}")]
    Load {
        /// The tensor's name in the blob.
        name: String,
        /// candle's error.
        source: Box<candle_core::Error>,
    },
}

pub(crate) use pmstate_norm::Dims;

/// Result alias of this crate.
pub type Result<T, E = TraceError> = std::result::Result<T, E>;
