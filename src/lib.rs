//! pmstate: the state of ProtoMotions policies in Rust.
//!
//! A facade over the workspace crates:
//! - [`norm`]: ProtoMotions-exact running normalizers on candle tensors
//!   (CPU and CUDA): [`RunningMeanStd`], [`RewardRunningMeanStd`],
//!   [`combine_moments`], distributed aggregation over a [`Collective`].
//! - [`pickle`]: a torch-pickle reader that never executes anything, and a
//!   writer torch's `weights_only` loader accepts.
//! - [`ckpt`]: ProtoMotions `.pt`/`.ckpt` checkpoints (zip, legacy) and
//!   safetensors, losslessly; normalizers from and into checkpoints; a
//!   candle `VarBuilder` (see `examples/checkpoint_inference.rs`).
//! - [`trace`]: pm-trace files recorded from the reference, their replay and
//!   comparison.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use pmstate::{NormConfig, RunningMeanStd};
//! let dev = Device::Cpu;
//! let mut rms = RunningMeanStd::new(NormConfig { clamp_value: Some(5.0), ..Default::default() }, None, &dev)?;
//! rms.record_moments(&Tensor::new(&[[1f32, 2.], [3., 4.]], &dev)?)?;
//! let z = rms.normalize(&Tensor::new(&[[2f32, 3.]], &dev)?)?;
//! assert_eq!(z.dims(), &[1, 2]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub use pmstate_ckpt as ckpt;
pub use pmstate_norm as norm;
pub use pmstate_pickle as pickle;
pub use pmstate_policy as policy;
pub use pmstate_trace as trace;

pub use pmstate_norm::{
    batch_moments, combine_moments, Arithmetic, Collective, Direction, MomentUpdate, Moments, NormConfig, NormError,
    NormState, Normalizer, RewardConfig, RewardRunningMeanStd, RewardUpdate, RunningMeanStd, SingleProcess,
};
