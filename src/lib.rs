#![doc = include_str!("../README.md")]
//!
//! # The crates
//!
//! - [`norm`]: ProtoMotions-exact running normalizers on candle tensors.
//! - [`pickle`]: a torch-pickle reader that never executes anything, and a
//!   writer torch's `weights_only` loader accepts.
//! - [`ckpt`]: `.pt`/`.ckpt` checkpoints and safetensors, normalizers from
//!   and into checkpoints, a candle `VarBuilder`.
//! - [`trace`]: pm-trace files recorded from the reference, their replay
//!   and comparison.
//! - [`policy`]: ProtoMotions policies rebuilt from their resolved configs.
//! - [`deploy`]: a tracker from its checkpoint to PD targets (observations,
//!   actor, action function, the control loop around them).
#![warn(missing_docs)]
// The README's examples are pasted into new crates: a warning there (an
// unused import) is a failure here.
#![doc(test(attr(deny(warnings))))]

pub use pmstate_ckpt as ckpt;
pub use pmstate_deploy as deploy;
pub use pmstate_norm as norm;
pub use pmstate_pickle as pickle;
pub use pmstate_policy as policy;
pub use pmstate_trace as trace;

pub use pmstate_norm::{
    batch_moments, combine_moments, Arithmetic, Collective, Direction, MomentUpdate, Moments, NormConfig, NormError,
    NormState, Normalizer, RewardConfig, RewardRunningMeanStd, RewardUpdate, RunningMeanStd, SingleProcess,
};

/// The guides under `docs/` that hold Rust examples, included here only so
/// that `cargo test` compiles and runs those examples as doctests (they are
/// pasted into new crates, as the README's are).
#[cfg(doctest)]
pub mod guides {
    #[doc = include_str!("../docs/checkpoints.md")]
    pub struct Checkpoints;
    #[doc = include_str!("../docs/numerics.md")]
    pub struct Numerics;
    #[doc = include_str!("../docs/deploy.md")]
    pub struct Deploy;
}
