#![doc = include_str!("../README.md")]
// The README's examples are pasted into new crates: a warning there (an
// unused import) is a failure here.
#![doc(test(attr(deny(warnings))))]
#![warn(missing_docs)]

mod collective;
mod combine;
mod config;
#[cfg(any(feature = "mpi", feature = "nccl"))]
mod deadline;
mod direction;
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
    pub use crate::kernels::isa::{
        current as isa, select as select_isa, try_current as try_isa, Isa, IsaError, ENV as ISA_ENV,
    };
}

pub use collective::{Collective, InProcessGroup, SingleProcess};
pub use combine::{combine_moments, Moments};
pub use config::{Arithmetic, NormConfig};
pub use direction::Direction;
pub use error::{
    Call, CollectiveProblem, CountProblem, Dims, NormError, PartsProblem, Result, StateProblem, Unsendable,
};
pub use kernels::isa::{Isa, IsaError};
#[cfg(feature = "mpi")]
pub use mpi::MpiCollective;
#[cfg(feature = "nccl")]
pub use nccl::{NcclCollective, NcclId};
pub use normalizer::{MomentUpdate, NormState, Normalizer};
pub use reward::{RewardConfig, RewardRunningMeanStd, RewardUpdate};
pub use running::{batch_moments, RunningMeanStd};
