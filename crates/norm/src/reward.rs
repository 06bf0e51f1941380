//! `RewardRunningMeanStd`: scales rewards by the std of discounted returns.

use candle_core::{DType, Device, Tensor};

use crate::combine::Moments;
use crate::config::{validate_gamma, NormConfig};
use crate::error::{NormError, Result};
use crate::promote;
use crate::running::{apply, NormState, RunningMeanStd};

/// ProtoMotions' `RewardRunningMeanStd` (after Gymnasium's `NormalizeReward`):
/// tracks the running variance of the discounted return
/// `G = G * gamma * (1 - terminated) + r` and divides rewards by its std
/// (no mean subtraction). The return resets on termination only, and is not
/// part of the checkpointed state.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use pmstate_norm::{NormConfig, RewardRunningMeanStd};
/// let dev = Device::Cpu;
/// let mut rew = RewardRunningMeanStd::new(NormConfig::default(), 0.5, Some(&[2]), &dev)?;
/// rew.record_reward(&Tensor::new(&[1f32, 2.], &dev)?, &Tensor::new(&[0u8, 0], &dev)?)?;
/// rew.record_reward(&Tensor::new(&[1f32, 2.], &dev)?, &Tensor::new(&[0u8, 1], &dev)?)?;
/// assert_eq!(rew.discounted_reward().unwrap().to_vec1::<f32>()?, [1.5, 2.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct RewardRunningMeanStd {
    rms: RunningMeanStd,
    gamma: f64,
    discounted: Option<Tensor>,
}

impl RewardRunningMeanStd {
    /// A reward normalizer with discount `gamma` in [0, 1]; ProtoMotions
    /// passes `shape=(1,)`.
    pub fn new(config: NormConfig, gamma: f64, shape: Option<&[usize]>, device: &Device) -> Result<Self> {
        validate_gamma(gamma)?;
        Ok(Self { rms: RunningMeanStd::new(config, shape, device)?, gamma, discounted: None })
    }

    /// Uses `collective` for the moment updates.
    pub fn with_collective(mut self, collective: std::sync::Arc<dyn crate::Collective>) -> Self {
        self.rms = self.rms.with_collective(collective);
        self
    }

    /// The discount factor.
    pub fn gamma(&self) -> f64 {
        self.gamma
    }

    /// The running statistics (shared machinery with observation normalizers).
    pub fn running(&self) -> &RunningMeanStd {
        &self.rms
    }

    /// The discounted return after the last `record_reward`.
    pub fn discounted_reward(&self) -> Option<&Tensor> {
        self.discounted.as_ref()
    }

    /// Forgets the discounted return (a fresh run; it is never checkpointed).
    pub fn reset_discounted_reward(&mut self) {
        self.discounted = None;
    }

    /// Folds one step's rewards into the discounted return and records its
    /// moments. `terminated` is a mask of the reward's shape (U8 0/1, or any
    /// dtype: it is converted to float as `terminated.float()` does).
    ///
    /// On error nothing changes, the discounted return included (the
    /// reference would keep its new return when the moments update fails).
    pub fn record_reward(&mut self, reward: &Tensor, terminated: &Tensor) -> Result<()> {
        let g = self.next_discounted(reward, terminated)?;
        self.rms.record_moments(&g)?;
        self.discounted = Some(g);
        Ok(())
    }

    /// record_reward with precomputed moments of the new discounted return
    /// (pinned replay); the return itself is still computed here.
    /// Returns the new discounted return and (rank 0, W > 1) the combined
    /// moments.
    pub fn record_reward_with_moments(
        &mut self,
        reward: &Tensor,
        terminated: &Tensor,
        m: Moments,
    ) -> Result<(Tensor, Option<Moments>)> {
        let g = self.next_discounted(reward, terminated)?;
        let combined = self.rms.record_batch_moments(m)?;
        self.discounted = Some(g.clone());
        Ok((g, combined))
    }

    /// record_reward, returning the new discounted return, its batch moments
    /// and (rank 0, W > 1) the combined moments, for replay to compare.
    pub fn record_reward_traced(
        &mut self,
        reward: &Tensor,
        terminated: &Tensor,
    ) -> Result<(Tensor, Moments, Option<Moments>)> {
        let g = self.next_discounted(reward, terminated)?;
        let (m, combined) = self.rms.record_moments_traced(&g)?;
        self.discounted = Some(g.clone());
        Ok((g, m, combined))
    }

    /// The discounted return this step would produce.
    pub fn next_discounted(&self, reward: &Tensor, terminated: &Tensor) -> Result<Tensor> {
        const OP: &str = "record_reward";
        if !matches!(reward.dtype(), DType::F32 | DType::F64) {
            return Err(NormError::UnsupportedDType {
                op: OP,
                what: "reward",
                dtype: reward.dtype(),
                expected: "need F32 or F64",
            });
        }
        for (what, t) in [("reward", reward), ("terminated", terminated)] {
            if !t.device().same_device(self.rms.device()) {
                return Err(NormError::DeviceMismatch {
                    op: OP,
                    what,
                    got: t.device().location(),
                    expected: self.rms.device().location(),
                });
            }
        }
        if self.rms.config().reject_non_finite && !crate::running::all_finite(reward)? {
            return Err(NormError::NonFinite { op: OP, what: "reward" });
        }
        let Some(prev) = &self.discounted else {
            return Ok(reward.copy()?);
        };
        let shape = promote::broadcast_shapes(prev.dims(), terminated.dims())
            .and_then(|s| promote::broadcast_shapes(&s, reward.dims()));
        if shape.is_none() {
            return Err(NormError::ShapeMismatch {
                op: OP,
                what: "reward/terminated",
                got: reward.dims().to_vec(),
                expected: format!(
                    "shapes that broadcast with the discounted return {:?} (terminated {:?})",
                    prev.dims(),
                    terminated.dims()
                ),
            });
        }
        // discounted * gamma * (1 - terminated.float()) + reward, op by op.
        let keep =
            promote::sub(&promote::scalar(1.0, DType::F32, reward.device())?, &terminated.to_dtype(DType::F32)?)?;
        let decayed = promote::mul(&promote::scalar_mul(self.gamma, prev)?, &keep)?;
        promote::add(&decayed, reward)
    }

    /// `normalize(r)`: `clamp(r / sqrt(var + eps))`. Errors on a normalizer
    /// with no state (the reference raises there too).
    pub fn normalize(&self, r: &Tensor) -> Result<Tensor> {
        self.apply(r, false, None)
    }

    /// `normalize(r, un_norm=True)`: `clamp(r) * sqrt(var + eps)`.
    pub fn un_norm(&self, r: &Tensor) -> Result<Tensor> {
        self.apply(r, true, None)
    }

    /// normalize / un_norm with a given float32 std (pinned replay).
    pub fn normalize_with_std(&self, r: &Tensor, std_f32: &Tensor, un_norm: bool) -> Result<Tensor> {
        self.apply(r, un_norm, Some(std_f32))
    }

    fn apply(&self, r: &Tensor, un_norm: bool, std: Option<&Tensor>) -> Result<Tensor> {
        let op = if un_norm { "un_norm" } else { "normalize" };
        let own = self.rms.std_f32().ok_or(NormError::Uninitialized { op })?;
        let std = match std {
            Some(s) if s.dtype() == DType::F32 && s.dims() == own.dims() => s,
            Some(s) => {
                return Err(NormError::ShapeMismatch {
                    op,
                    what: "std",
                    got: s.dims().to_vec(),
                    expected: format!("an F32 tensor of shape {:?} (got {:?})", own.dims(), s.dtype()),
                })
            }
            None => own,
        };
        apply(&self.rms, op, r, None, std, un_norm)
    }

    /// See [`RunningMeanStd::state`].
    pub fn state(&self) -> Option<NormState> {
        self.rms.state()
    }

    /// See [`RunningMeanStd::load_state`]; the discounted return is kept.
    pub fn load_state(&mut self, state: NormState) -> Result<()> {
        self.rms.load_state(state)
    }

    /// See [`RunningMeanStd::set_ema_decay`].
    pub fn set_ema_decay(&mut self, ema_decay: Option<f64>) -> Result<()> {
        self.rms.set_ema_decay(ema_decay)
    }

    /// Records a batch of returns directly (no discounting).
    pub fn record_moments(&mut self, x: &Tensor) -> Result<()> {
        self.rms.record_moments(x)
    }

    /// See [`RunningMeanStd::record_moments_traced`].
    pub fn record_moments_traced(&mut self, x: &Tensor) -> Result<(Moments, Option<Moments>)> {
        self.rms.record_moments_traced(x)
    }

    /// See [`RunningMeanStd::record_batch_moments`].
    pub fn record_batch_moments(&mut self, m: Moments) -> Result<Option<Moments>> {
        self.rms.record_batch_moments(m)
    }
}
