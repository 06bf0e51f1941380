//! The one error type of `pmstate-trace`.

/// What can be wrong with a trace file, or go wrong replaying it.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("not a safetensors file: {0}")]
    Container(String),
    #[error("__metadata__: {0}")]
    Metadata(String),
    #[error("trace JSON: {0}")]
    Json(String),
    #[error("unsupported pm-trace version {0} (this reader knows version 1)")]
    Version(u64),
    /// A structural problem, named by step and field.
    #[error("step {step} ({op}): field {field}: {reason}")]
    Field { step: usize, op: String, field: String, reason: String },
    /// A problem in the module or header part of the document.
    #[error("{field}: {reason}")]
    Header { field: String, reason: String },
    #[error("writing trace: {0}")]
    Write(String),
    #[error("replay: {0}")]
    Replay(String),
}

pub type Result<T, E = TraceError> = std::result::Result<T, E>;
