//! The one interface both normalizer kinds implement.

use candle_core::Tensor;

use crate::combine::Moments;
use crate::direction::Direction;
use crate::error::Result;

/// A normalizer's buffers as the reference keeps them: `mean` and `var` f64
/// of the module's shape, `count` an i64 (a 0-dim `torch.long` buffer there).
#[derive(Debug, Clone)]
pub struct NormState {
    /// Running mean, F64.
    pub mean: Tensor,
    /// Running population variance, F64.
    pub var: Tensor,
    /// Samples seen, the 1-sample prior included.
    pub count: i64,
}

/// What one moments update did, for callers that check it against a
/// recording (replay) or log it.
#[derive(Debug, Clone)]
pub struct MomentUpdate {
    /// This rank's batch moments (computed, or as given).
    pub batch: Moments,
    /// On rank 0 of a world larger than 1: the cross-rank combination of
    /// every rank's batch moments that the update used. `None` otherwise.
    pub combined: Option<Moments>,
}

/// A running normalizer: [`RunningMeanStd`](crate::RunningMeanStd) (observations)
/// or [`RewardRunningMeanStd`](crate::RewardRunningMeanStd) (rewards).
///
/// Every method that returns an error leaves the normalizer exactly as it was.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use pmstate_norm::{Direction, NormConfig, Normalizer, RunningMeanStd};
/// fn refresh(n: &mut dyn Normalizer, batch: &Tensor) -> pmstate_norm::Result<Tensor> {
///     n.record_moments(batch)?;
///     n.apply(batch, Direction::Normalize)
/// }
/// let dev = Device::Cpu;
/// let mut obs = RunningMeanStd::new(NormConfig::default(), Some(&[2]), &dev)?;
/// let z = refresh(&mut obs, &Tensor::new(&[[1f32, 2.], [3., 4.]], &dev)?)?;
/// assert_eq!(z.dims(), &[2, 2]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Normalizer: Send {
    /// A copy of the buffers (cheap: tensors are reference counted), once
    /// they exist.
    fn state(&self) -> Option<NormState>;

    /// Loads buffers as `load_state_dict` does (a lazy normalizer takes the
    /// state's shape).
    fn load_state(&mut self, state: NormState) -> Result<()>;

    /// Switches between Welford (`None`) and EMA (`Some(d)`), as resuming
    /// with another config does.
    fn set_ema_decay(&mut self, ema_decay: Option<f64>) -> Result<()>;

    /// Records a batch `x` of shape `[N, *shape]`: its moments, then the
    /// (possibly distributed) update.
    fn record_moments(&mut self, x: &Tensor) -> Result<MomentUpdate>;

    /// Records precomputed batch moments: the update alone (what pinned
    /// replay drives).
    fn record_batch_moments(&mut self, batch: Moments) -> Result<MomentUpdate>;

    /// Maps `x` in `direction` by the current statistics, changing nothing
    /// (so a shared normalizer can serve concurrent callers). A normalizer
    /// with no buffers yet is an error; see [`Normalizer::init_shape_from`].
    fn apply(&self, x: &Tensor, direction: Direction) -> Result<Tensor>;

    /// [`Normalizer::apply`] with a given float32 std (the normalizer's
    /// shape) in place of `sqrt(var + eps)`: pinned replay feeds torch's
    /// recorded std, whose float32 sqrt is not always correctly rounded.
    fn apply_with_std(&self, x: &Tensor, std_f32: &Tensor, direction: Direction) -> Result<Tensor>;

    /// `sqrt(var.float() + epsilon)`, correctly rounded, F32, once the buffers exist.
    fn std_f32(&self) -> Option<&Tensor>;

    /// What the reference's `normalize` does first on a lazy observation
    /// normalizer: take the shape `x.shape[1:]` and create fresh buffers. A
    /// no-op when the buffers exist, and for the reward normalizer (whose
    /// `normalize` needs a recorded state).
    fn init_shape_from(&mut self, x: &Tensor) -> Result<()>;
}
