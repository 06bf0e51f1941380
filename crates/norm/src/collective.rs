//! Cross-process aggregation: the two collectives the reference uses.

use candle_core::Tensor;

use crate::error::Result;

/// The collectives ProtoMotions' normalizers call through Lightning Fabric.
///
/// Every rank of a group calls the same sequence of operations with tensors
/// of the same shape and dtype. `all_gather` returns the W tensors ordered by
/// rank; `broadcast` returns `src`'s tensor on every rank. Implementations
/// report a failed or stuck peer as [`NormError::Collective`](crate::NormError::Collective).
pub trait Collective: Send + Sync {
    /// This participant's rank in `0..world_size()`.
    fn rank(&self) -> usize;
    /// The number of participants.
    fn world_size(&self) -> usize;
    /// Every rank's `t`, index = rank.
    fn all_gather(&self, t: &Tensor) -> Result<Vec<Tensor>>;
    /// Rank `src`'s `t`, on every rank.
    fn broadcast(&self, t: &Tensor, src: usize) -> Result<Tensor>;
}

/// One process, no peers: world size 1. `all_gather` returns the tensor
/// itself, `broadcast` returns its argument.
///
/// ```
/// use pmstate_norm::{Collective, SingleProcess};
/// let c = SingleProcess;
/// assert_eq!((c.rank(), c.world_size()), (0, 1));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SingleProcess;

impl Collective for SingleProcess {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_gather(&self, t: &Tensor) -> Result<Vec<Tensor>> {
        Ok(vec![t.clone()])
    }
    fn broadcast(&self, t: &Tensor, _src: usize) -> Result<Tensor> {
        Ok(t.clone())
    }
}
