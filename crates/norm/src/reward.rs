//! `RewardRunningMeanStd`: scales rewards by the std of discounted returns.

use candle_core::{DType, Device, Tensor};

use crate::combine::Moments;
use crate::config::{validate_gamma, NormConfig};
use crate::direction::Direction;
use crate::error::{dims, NormError, Result};
use crate::normalizer::{MomentUpdate, NormState, Normalizer};
use crate::promote;
use crate::running::{apply, RunningMeanStd};

/// Settings of a [`RewardRunningMeanStd`]: the statistics' own settings and
/// the discount of the returns whose spread it tracks. The reference takes
/// `gamma` as a required argument (ProtoMotions passes its agent's discount).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RewardConfig {
    /// The running statistics (epsilon, clamp, EMA, arithmetic).
    pub norm: NormConfig,
    /// Discount of the return `G = G * gamma * (1 - terminated) + r`, in [0, 1].
    pub gamma: f64,
}

impl RewardConfig {
    /// Default statistics with discount `gamma`.
    pub fn with_gamma(gamma: f64) -> Self {
        RewardConfig { norm: NormConfig::default(), gamma }
    }
}

/// One `record_reward`: the new discounted return and the moments update it made.
#[derive(Debug, Clone)]
pub struct RewardUpdate {
    /// The discounted return after this step.
    pub discounted: Tensor,
    /// The update of the running statistics by the return's moments.
    pub update: MomentUpdate,
}

/// ProtoMotions' `RewardRunningMeanStd` (after Gymnasium's `NormalizeReward`):
/// tracks the running variance of the discounted return
/// `G = G * gamma * (1 - terminated) + r` and divides rewards by its std
/// (no mean subtraction). The return resets on termination only, and is not
/// part of the checkpointed state.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use pmstate_norm::{RewardConfig, RewardRunningMeanStd};
/// let dev = Device::Cpu;
/// let mut rew = RewardRunningMeanStd::new(RewardConfig::with_gamma(0.5), Some(&[2]), &dev)?;
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
    /// A reward normalizer; ProtoMotions passes `shape=(1,)`.
    pub fn new(config: RewardConfig, shape: Option<&[usize]>, device: &Device) -> Result<Self> {
        validate_gamma(config.gamma)?;
        Ok(Self { rms: RunningMeanStd::new(config.norm, shape, device)?, gamma: config.gamma, discounted: None })
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
    pub fn record_reward(&mut self, reward: &Tensor, terminated: &Tensor) -> Result<RewardUpdate> {
        let g = self.next_discounted(reward, terminated)?;
        let update = self.rms.record_moments(&g)?;
        self.discounted = Some(g.clone());
        Ok(RewardUpdate { discounted: g, update })
    }

    /// [`RewardRunningMeanStd::record_reward`] with the batch moments of the
    /// new discounted return given (pinned replay), as
    /// [`RunningMeanStd::record_batch_moments`] is to `record_moments`; the
    /// return itself is still computed here.
    pub fn record_reward_moments(
        &mut self,
        reward: &Tensor,
        terminated: &Tensor,
        batch: Moments,
    ) -> Result<RewardUpdate> {
        let g = self.next_discounted(reward, terminated)?;
        let update = self.rms.record_batch_moments(batch)?;
        self.discounted = Some(g.clone());
        Ok(RewardUpdate { discounted: g, update })
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
                    "shapes that broadcast with the discounted return {} (terminated {})",
                    dims(prev.dims()),
                    dims(terminated.dims())
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
        self.apply(r, Direction::Normalize)
    }

    /// `normalize(r, un_norm=True)`: `clamp(r) * sqrt(var + eps)`.
    pub fn un_norm(&self, r: &Tensor) -> Result<Tensor> {
        self.apply(r, Direction::UnNormalize)
    }

    /// Maps `r` in `direction` by the current std (no mean: rewards are only scaled).
    pub fn apply(&self, r: &Tensor, direction: Direction) -> Result<Tensor> {
        let std = self.rms.std_f32().ok_or(NormError::Uninitialized { op: direction.op_name() })?;
        apply(&self.rms, r, None, std, direction)
    }

    /// [`RewardRunningMeanStd::apply`] with a given float32 std (pinned replay).
    pub fn apply_with_std(&self, r: &Tensor, std_f32: &Tensor, direction: Direction) -> Result<Tensor> {
        let op = direction.op_name();
        let own = self.rms.std_f32().ok_or(NormError::Uninitialized { op })?;
        if std_f32.dtype() != DType::F32 || std_f32.dims() != own.dims() {
            return Err(NormError::ShapeMismatch {
                op,
                what: "std",
                got: std_f32.dims().to_vec(),
                expected: format!("an F32 tensor of shape {} (got {})", dims(own.dims()), std_f32.dtype().as_str()),
            });
        }
        apply(&self.rms, r, None, std_f32, direction)
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
}

impl Normalizer for RewardRunningMeanStd {
    fn state(&self) -> Option<NormState> {
        self.rms.state()
    }
    fn load_state(&mut self, state: NormState) -> Result<()> {
        self.rms.load_state(state)
    }
    fn set_ema_decay(&mut self, ema_decay: Option<f64>) -> Result<()> {
        self.rms.set_ema_decay(ema_decay)
    }
    /// Records a batch of returns directly (no discounting).
    fn record_moments(&mut self, x: &Tensor) -> Result<MomentUpdate> {
        self.rms.record_moments(x)
    }
    fn record_batch_moments(&mut self, batch: Moments) -> Result<MomentUpdate> {
        self.rms.record_batch_moments(batch)
    }
    fn apply(&self, x: &Tensor, direction: Direction) -> Result<Tensor> {
        RewardRunningMeanStd::apply(self, x, direction)
    }
    fn apply_with_std(&self, x: &Tensor, std_f32: &Tensor, direction: Direction) -> Result<Tensor> {
        RewardRunningMeanStd::apply_with_std(self, x, std_f32, direction)
    }
    fn std_f32(&self) -> Option<&Tensor> {
        self.rms.std_f32()
    }
    fn init_shape_from(&mut self, _x: &Tensor) -> Result<()> {
        Ok(())
    }
}
