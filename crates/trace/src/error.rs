//! The one error type of `pmstate-trace`.

/// What can be wrong with a trace file, or go wrong replaying it.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Reference commit or version.
        source: std::io::Error,
    },
    /// Not a valid safetensors file.
    #[error("not a safetensors file: {0}")]
    Container(String),
    /// The `__metadata__` of the file is not a pm-trace one.
    #[error("__metadata__: {0}")]
    Metadata(String),
    /// The trace JSON does not parse.
    #[error("trace JSON: {0}")]
    Json(String),
    /// A version this reader does not know.
    #[error("unsupported pm-trace version {0} (this reader knows version 1)")]
    Version(u64),
    /// A structural problem, named by step and field.
    #[error("step {step} ({op}): field {field}: {reason}")]
    Field {
        /// Step index.
        step: usize,
        /// The operation.
        op: String,
        /// The field compared.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// A problem in the module or header part of the document.
    #[error("{field}: {reason}")]
    Header {
        /// The field compared.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// A trace that cannot be written.
    #[error("writing trace: {0}")]
    Write(String),
    /// The replay itself failed (a rank panicked, a module could not be built).
    #[error("replay: {0}")]
    Replay(String),
}

/// Result alias of this crate.
pub type Result<T, E = TraceError> = std::result::Result<T, E>;
