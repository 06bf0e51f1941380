//! Normalizer configuration and its validation.

use crate::error::{NormError, Result};

/// How the moment updates do their arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Arithmetic {
    /// Bit-for-bit ProtoMotions: counts pass through float32 inside
    /// `combine_moments` (so they round past 2^24), every intermediate has the
    /// dtype torch's type promotion gives it, and EMA leaves out the
    /// between-batch variance term.
    #[default]
    Compat,
    /// A deliberate deviation from the reference, for long runs: counts stay
    /// i64 (overflow is an error), all arithmetic is float64, and EMA adds the
    /// between-batch term `d(1-d)(batch_mean - mean)^2` so that the variance
    /// of a drifting signal is not underestimated.
    Exact,
}

/// Settings of a [`RunningMeanStd`](crate::RunningMeanStd); ProtoMotions keeps
/// these in its Python config, never in the checkpoint.
///
/// ```
/// use pmstate_norm::NormConfig;
/// let cfg = NormConfig { clamp_value: Some(5.0), ema_decay: Some(0.999), ..NormConfig::default() };
/// cfg.validate().unwrap();
/// assert!(NormConfig { epsilon: 0.0, ..NormConfig::default() }.validate().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NormConfig {
    /// Added to the variance under the square root (`sqrt(var + epsilon)`); > 0.
    pub epsilon: f64,
    /// Clamp normalized values to `[-c, c]` (and clamp before un-normalizing); > 0.
    pub clamp_value: Option<f64>,
    /// `None`: Welford (all-time statistics). `Some(d)`, d in (0, 1): EMA.
    pub ema_decay: Option<f64>,
    /// Compat (the reference's numbers) or Exact (i64 counts, f64, EMA δ² term).
    pub arithmetic: Arithmetic,
    /// Opt-in guard: reject a batch holding NaN or infinity with an error
    /// instead of letting it poison the statistics as the reference does.
    pub reject_non_finite: bool,
}

impl Default for NormConfig {
    fn default() -> Self {
        Self {
            epsilon: 1e-5,
            clamp_value: None,
            ema_decay: None,
            arithmetic: Arithmetic::Compat,
            reject_non_finite: false,
        }
    }
}

impl NormConfig {
    /// Checks every field; the error names the first one out of its domain.
    pub fn validate(&self) -> Result<()> {
        if !(self.epsilon > 0.0 && self.epsilon.is_finite()) {
            return Err(NormError::InvalidConfig {
                field: "epsilon",
                value: self.epsilon,
                reason: "must be finite and > 0",
            });
        }
        if let Some(c) = self.clamp_value {
            // Written so that NaN fails too.
            #[allow(clippy::neg_cmp_op_on_partial_ord)]
            if !(c > 0.0) {
                return Err(NormError::InvalidConfig {
                    field: "clamp_value",
                    value: c,
                    reason: "must be > 0 (or None for no clamp)",
                });
            }
        }
        validate_ema_decay(self.ema_decay)
    }
}

pub(crate) fn validate_ema_decay(ema_decay: Option<f64>) -> Result<()> {
    match ema_decay {
        Some(d) if !(d > 0.0 && d < 1.0) => Err(NormError::InvalidConfig {
            field: "ema_decay",
            value: d,
            reason: "must lie in the open interval (0, 1) (or None for Welford)",
        }),
        _ => Ok(()),
    }
}

pub(crate) fn validate_gamma(gamma: f64) -> Result<()> {
    if (0.0..=1.0).contains(&gamma) {
        Ok(())
    } else {
        Err(NormError::InvalidConfig { field: "gamma", value: gamma, reason: "must lie in [0, 1]" })
    }
}
