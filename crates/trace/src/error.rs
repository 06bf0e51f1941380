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
        problem: FieldProblem,
    },
    /// A problem in the module or header part of the document.
    #[error("{field}: {problem}")]
    Header {
        /// The field at fault (`module.class`, `world_size`).
        field: &'static str,
        /// What is wrong.
        problem: FieldProblem,
    },
    /// A bound on what a trace may make the replayer allocate or run.
    #[error("{what} needs {needed}, over the limit of {max} ({limit}); see the README's limits table")]
    Limit {
        /// The limit's name.
        limit: &'static str,
        /// What hit it.
        what: String,
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
        problem: FieldProblem,
    },
    /// The replay itself failed.
    #[error("replay: {0}")]
    Replay(ReplayFailure),
}

/// What is wrong with one field of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FieldProblem {
    /// The field is absent (or null where a value is required).
    Missing,
    /// A tensor name that the file does not hold.
    NoSuchTensor(String),
    /// A tensor of the wrong dtype or rank.
    WrongTensor {
        /// What it is (`F32 of shape [2]`).
        found: String,
        /// What the field needs.
        expected: &'static str,
    },
    /// A tensor whose shape does not agree with another field.
    ShapeMismatch {
        /// Its shape.
        found: Vec<usize>,
        /// The other field.
        other: &'static str,
        /// That field's shape.
        expected: Vec<usize>,
    },
    /// A per-rank list of the wrong length.
    RankCount {
        /// Names given.
        found: usize,
        /// The trace's world size.
        world_size: usize,
    },
    /// A value out of its domain (an unknown op or class, a world size of 0).
    Invalid(String),
}

impl fmt::Display for FieldProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FieldProblem::Missing => f.write_str("missing"),
            FieldProblem::NoSuchTensor(name) => write!(f, "tensor '{name}' is not in the file"),
            FieldProblem::WrongTensor { found, expected } => write!(f, "{found}; expected {expected}"),
            FieldProblem::ShapeMismatch { found, other, expected } => {
                write!(f, "shape {} differs from {other}'s {}", Dims(found), Dims(expected))
            }
            FieldProblem::RankCount { found, world_size } => {
                write!(f, "{found} names for world size {world_size}: need one per rank")
            }
            FieldProblem::Invalid(reason) => f.write_str(reason),
        }
    }
}

/// Why a replay could not run to the end (as opposed to a result that differs).
#[derive(Debug)]
#[non_exhaustive]
pub enum ReplayFailure {
    /// The trace's world size and the collective's differ.
    WorldSize {
        /// Recorded.
        trace: usize,
        /// The collective's.
        collective: usize,
    },
    /// A rank's thread could not be started.
    Spawn {
        /// The rank.
        rank: usize,
        /// The OS error.
        source: std::io::Error,
    },
    /// A rank's thread panicked (a bug: every failure should be an error).
    Panicked {
        /// The rank.
        rank: usize,
    },
    /// Handing the ranks' observations to rank 0 failed.
    Gather {
        /// The collective's error.
        source: Box<pmstate_norm::NormError>,
        /// This rank's first failed step, when it failed one.
        first_failure: Option<(usize, String)>,
    },
    /// A peer's observations did not decode.
    PeerObservations {
        /// The peer's rank.
        rank: usize,
        /// What is wrong.
        reason: String,
    },
    /// A recorder step that does not apply to the module (record_reward on a RunningMeanStd).
    WrongModule {
        /// The operation.
        op: &'static str,
        /// The module class.
        class: &'static str,
    },
    /// The normalizer refused a recorder step.
    Norm(Box<pmstate_norm::NormError>),
}

impl fmt::Display for ReplayFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayFailure::WorldSize { trace, collective } => {
                write!(f, "the trace was recorded with world size {trace}, but this collective has {collective} ranks")
            }
            ReplayFailure::Spawn { rank, source } => write!(f, "starting the thread of rank {rank}: {source}"),
            ReplayFailure::Panicked { rank } => write!(f, "the thread of rank {rank} panicked"),
            ReplayFailure::Gather { source, first_failure } => {
                write!(f, "gathering the ranks' observations: {source}")?;
                if let Some((step, e)) = first_failure {
                    write!(f, "; this rank first failed at step {step}: {e}")?;
                }
                Ok(())
            }
            ReplayFailure::PeerObservations { rank, reason } => write!(f, "rank {rank}'s observations: {reason}"),
            ReplayFailure::WrongModule { op, class } => write!(f, "{op} on a {class}"),
            ReplayFailure::Norm(e) => write!(f, "{e}"),
        }
    }
}

pub(crate) use pmstate_norm::Dims;

/// Result alias of this crate.
pub type Result<T, E = TraceError> = std::result::Result<T, E>;
