//! The one error type of `pmstate-ckpt`.

use pmstate_pickle::PickleError;

/// What can be wrong with a checkpoint, or go wrong reading or writing one.
/// Messages name the file and, where there is one, the key (dotted path
/// in the tree) or record at fault.
#[derive(Debug, thiserror::Error)]
pub enum CkptError {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The container (zip, legacy stream, safetensors) is malformed.
    #[error("{path}: {reason}")]
    Container {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A pickle record does not decode.
    #[error("{path}: record {record}: {source}")]
    Pickle {
        /// The file.
        path: String,
        /// The record (`data.pkl`, or the legacy stream's part).
        record: String,
        /// The decoder's error.
        source: PickleError,
    },
    /// A value in the tree is not what its position requires (a tensor
    /// whose view leaves its storage, a storage whose size disagrees...).
    #[error("{path}: {key}: {reason}")]
    Value {
        /// The file (or `<memory>`).
        path: String,
        /// The dotted key of the value.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A dtype this crate cannot carry.
    #[error("{key}: unsupported dtype {dtype}")]
    UnsupportedDtype {
        /// The dotted key of the tensor.
        key: String,
        /// torch's name of the dtype or storage class.
        dtype: String,
    },
    /// Writing a `.pt` would re-emit globals torch's safe loader rejects.
    #[error("refusing to write {count} unsafe global(s) ({first} at {key}); pass --allow-unsafe-globals to write them anyway")]
    UnsafeGlobals {
        /// How many.
        count: usize,
        /// The first one, `module.name`.
        first: String,
        /// Where it is.
        key: String,
    },
    /// A key the caller asked for is not there.
    #[error("{path}: no key {key}")]
    NotFound {
        /// The file.
        path: String,
        /// The key.
        key: String,
    },
    /// No normalizer of that name in the checkpoint.
    #[error("{path}: no normalizer {name}{}", did_you_mean(closest))]
    NormalizerNotFound {
        /// The file.
        path: String,
        /// The name asked for.
        name: String,
        /// The nearest existing names (edit distance), best first.
        closest: Vec<String>,
    },
    /// A normalizer group could not be loaded or stored.
    #[error("normalizer {group}: {source}")]
    Norm {
        /// The group's dotted prefix.
        group: String,
        /// The normalizer's error.
        source: Box<pmstate_norm::NormError>,
    },
    /// candle refused a tensor.
    #[error("{key}: {source}")]
    Candle {
        /// The dotted key of the tensor.
        key: String,
        /// candle's error.
        source: Box<candle_core::Error>,
    },
    /// The caller asked for something inconsistent.
    #[error("{0}")]
    Usage(String),
}

fn did_you_mean(closest: &[String]) -> String {
    if closest.is_empty() {
        String::new()
    } else {
        format!(" (did you mean {}?)", closest.join(", or "))
    }
}

/// Result alias of this crate.
pub type Result<T, E = CkptError> = std::result::Result<T, E>;

pub(crate) fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> CkptError + '_ {
    move |source| CkptError::Io { path: path.display().to_string(), source }
}
