//! The one error type of `pmstate-norm`.

use std::fmt;

use candle_core::DType;

/// Everything that can go wrong in a normalizer operation.
///
/// Every variant names the operation (`op`) and the value or field at fault,
/// and an operation that returns an error has left the normalizer's state
/// exactly as it was.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NormError {
    /// A configuration value outside its domain.
    #[error("invalid config: {field} = {value}: {reason}")]
    InvalidConfig {
        /// The configuration or state field at fault.
        field: &'static str,
        /// The offending value.
        value: f64,
        /// Why it is refused.
        reason: &'static str,
    },
    /// An input whose shape does not fit the normalizer (or another input).
    #[error("{op}: shape mismatch: {what} has shape {}, expected {expected}", dims(got))]
    ShapeMismatch {
        /// The operation that failed.
        op: &'static str,
        /// The input or field at fault.
        what: &'static str,
        /// What was given.
        got: Vec<usize>,
        /// What was expected.
        expected: String,
    },
    /// An input of a dtype the operation does not take.
    #[error("{op}: {what} has dtype {}; {expected}", dtype.as_str())]
    UnsupportedDType {
        /// The operation that failed.
        op: &'static str,
        /// The input or field at fault.
        what: &'static str,
        /// The dtype given.
        dtype: DType,
        /// What was expected.
        expected: &'static str,
    },
    /// A batch with no rows: the reference would silently turn the state into NaN.
    #[error("{op}: empty batch ({what} has shape {}); the state is unchanged", dims(shape))]
    EmptyBatch {
        /// The operation that failed.
        op: &'static str,
        /// The input or field at fault.
        what: &'static str,
        /// The shape given.
        shape: Vec<usize>,
    },
    /// Non-finite data rejected by the opt-in guard (`NormConfig::reject_non_finite`).
    #[error(
        "{op}: {what} contains a non-finite value (NaN or infinity); the batch was rejected and the state is unchanged"
    )]
    NonFinite {
        /// The operation that failed.
        op: &'static str,
        /// The input at fault.
        what: &'static str,
    },
    /// A lazy normalizer used before its shape is known.
    #[error("{op}: the normalizer has no state yet (lazy shape, nothing recorded or loaded)")]
    Uninitialized {
        /// The operation that failed.
        op: &'static str,
    },
    /// A sample count that no longer fits in an i64 (exact mode) or is negative.
    #[error("{op}: invalid count: {reason}")]
    InvalidCount {
        /// The operation that failed.
        op: &'static str,
        /// Why the count is refused.
        reason: String,
    },
    /// Inputs to `combine_moments` that do not line up.
    #[error("combine_moments: {reason}")]
    InvalidParts {
        /// Which part and what is wrong with it.
        reason: String,
    },
    /// A loaded state that is not a normalizer state.
    #[error("load_state: {field}: {reason}")]
    InvalidState {
        /// The configuration or state field at fault.
        field: &'static str,
        /// Why it is refused.
        reason: String,
    },
    /// A tensor on a different device than the normalizer.
    #[error("{op}: {what} is on {}, the normalizer lives on {}", location(got), location(expected))]
    DeviceMismatch {
        /// The operation that failed.
        op: &'static str,
        /// The input or field at fault.
        what: &'static str,
        /// What was given.
        got: candle_core::DeviceLocation,
        /// What was expected.
        expected: candle_core::DeviceLocation,
    },
    /// A collective operation that failed on this rank.
    #[error("collective {op} on rank {rank} of {world_size}: {reason}")]
    Collective {
        /// The operation that failed.
        op: &'static str,
        /// This participant's rank.
        rank: usize,
        /// The number of participants.
        world_size: usize,
        /// Why it is refused.
        reason: String,
    },
    /// An error from candle itself (allocation, device, backend).
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
}

/// A shape as torch prints one: `[2, 3]`. Shared by every crate of the
/// workspace that names a shape in a message.
#[derive(Debug, Clone, Copy)]
pub struct Dims<'a>(pub &'a [usize]);

impl fmt::Display for Dims<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// A shape as `[2, 3]`.
pub(crate) fn dims(d: &[usize]) -> String {
    Dims(d).to_string()
}

/// A device as people name it: `cpu`, `cuda:0`, `metal:0`.
pub(crate) fn location(l: &candle_core::DeviceLocation) -> String {
    match l {
        candle_core::DeviceLocation::Cpu => "cpu".into(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

/// Result alias of this crate.
pub type Result<T, E = NormError> = std::result::Result<T, E>;
