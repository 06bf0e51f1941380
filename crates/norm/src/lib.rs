//! ProtoMotions' running observation and reward normalizers, on candle
//! tensors, with the reference's numbers.
//!
//! A port of `protomotions/agents/utils/normalization.py`: [`RunningMeanStd`]
//! (Welford or EMA, clamp, `un_norm`, lazy shape, f64 mean/var and an i64
//! count), [`RewardRunningMeanStd`] (std of discounted returns),
//! [`combine_moments`] (the pairwise tree) and aggregation over a
//! [`Collective`]. In the default [`Arithmetic::Compat`] mode every update
//! reproduces PyTorch running the reference bit for bit, given the same batch
//! moments: each intermediate has the dtype torch's type promotion gives it,
//! counts pass through float32 inside `combine_moments`, and EMA's
//! `(1 - d) * batch_mean` rounds in float32. [`Arithmetic::Exact`] is the
//! documented deviation for long runs.
//!
//! Batch moments are accumulated in f64 (at least as accurate as torch's
//! float32 reductions, not bit-identical to them), and `sqrt` is correctly
//! rounded; replay can pin both to what torch recorded.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use pmstate_norm::{NormConfig, RunningMeanStd};
//! let dev = Device::Cpu;
//! let cfg = NormConfig { clamp_value: Some(5.0), ..NormConfig::default() };
//! let mut obs_norm = RunningMeanStd::new(cfg, Some(&[3]), &dev)?;
//! let batch = Tensor::new(&[[0f32, 10., -4.], [2., 12., -2.]], &dev)?;
//! obs_norm.record_moments(&batch)?;
//! let z = obs_norm.normalize(&batch)?;
//! assert_eq!(z.dims(), &[2, 3]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

mod collective;
mod combine;
mod config;
#[cfg(any(feature = "mpi", feature = "nccl"))]
mod deadline;
mod error;
pub(crate) mod kernels;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "nccl")]
mod nccl;
mod normalizer;
mod promote;
mod reward;
mod running;
mod tensor_io;
#[cfg(any(feature = "mpi", feature = "nccl"))]
mod wire_header;

/// Kernels exposed for benchmarks (`pmstate bench`, criterion): not part
/// of the stable API.
#[doc(hidden)]
pub mod bench_support {
    pub use crate::kernels::cpu::copy;
}

pub use collective::{Collective, InProcessGroup, SingleProcess};
pub use combine::{combine_moments, Moments};
pub use config::{Arithmetic, NormConfig};
pub use error::{NormError, Result};
#[cfg(feature = "mpi")]
pub use mpi::MpiCollective;
#[cfg(feature = "nccl")]
pub use nccl::{NcclCollective, NcclId};
pub use normalizer::{Direction, MomentUpdate, Normalizer};
pub use reward::{RewardConfig, RewardRunningMeanStd, RewardUpdate};
pub use running::{batch_moments, NormState, RunningMeanStd};
