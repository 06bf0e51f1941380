//! The one error type of `pmstate-norm`.

use candle_core::DType;

/// Everything that can go wrong in a normalizer operation.
///
/// Every variant names the operation (`op`) and the value or field at fault,
/// and an operation that returns an error has left the normalizer's state
/// exactly as it was.
#[derive(Debug, thiserror::Error)]
pub enum NormError {
    /// A configuration value outside its domain.
    #[error("invalid config: {field} = {value}: {reason}")]
    InvalidConfig { field: &'static str, value: f64, reason: &'static str },
    /// An input whose shape does not fit the normalizer (or another input).
    #[error("{op}: shape mismatch: {what} has shape {got:?}, expected {expected}")]
    ShapeMismatch { op: &'static str, what: &'static str, got: Vec<usize>, expected: String },
    /// An input of a dtype the operation does not take.
    #[error("{op}: {what} has dtype {dtype:?}; {expected}")]
    UnsupportedDType { op: &'static str, what: &'static str, dtype: DType, expected: &'static str },
    /// A batch with no rows: the reference would silently turn the state into NaN.
    #[error("{op}: empty batch ({what} has shape {shape:?}); the state is unchanged")]
    EmptyBatch { op: &'static str, what: &'static str, shape: Vec<usize> },
    /// Non-finite data rejected by the opt-in guard (`NormConfig::reject_non_finite`).
    #[error(
        "{op}: {what} contains a non-finite value (NaN or infinity); the batch was rejected and the state is unchanged"
    )]
    NonFinite { op: &'static str, what: &'static str },
    /// A lazy normalizer used before its shape is known.
    #[error("{op}: the normalizer has no state yet (lazy shape, nothing recorded or loaded)")]
    Uninitialized { op: &'static str },
    /// A sample count that no longer fits in an i64 (exact mode) or is negative.
    #[error("{op}: invalid count: {reason}")]
    InvalidCount { op: &'static str, reason: String },
    /// Inputs to `combine_moments` that do not line up.
    #[error("combine_moments: {reason}")]
    InvalidParts { reason: String },
    /// A loaded state that is not a normalizer state.
    #[error("load_state: {field}: {reason}")]
    InvalidState { field: &'static str, reason: String },
    /// A tensor on a different device than the normalizer.
    #[error("{op}: {what} is on {got:?}, the normalizer lives on {expected:?}")]
    DeviceMismatch {
        op: &'static str,
        what: &'static str,
        got: candle_core::DeviceLocation,
        expected: candle_core::DeviceLocation,
    },
    /// A collective operation that failed on this rank.
    #[error("collective {op} on rank {rank} of {world_size}: {reason}")]
    Collective { op: &'static str, rank: usize, world_size: usize, reason: String },
    /// An error from candle itself (allocation, device, backend).
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Result alias of this crate.
pub type Result<T, E = NormError> = std::result::Result<T, E>;
