#![doc = include_str!("../README.md")]
// The README's examples are pasted into new crates: a warning there (an
// unused import) is a failure here.
#![doc(test(attr(deny(warnings))))]
#![warn(missing_docs)]
// unsafe only where pmstate_kernels::per_isa expands (calls of #[target_feature] functions)
#![deny(unsafe_code)]

pub mod activation;
/// The packed CPU matrix product (its own crate, `pmstate-kernels`: it
/// changes for CPUs, not for ProtoMotions).
pub use pmstate_kernels as kernels;
pub mod actor;
pub mod bound;
pub mod config;
mod config_object;
pub mod describe;
pub mod discriminator;
mod error;
mod flat;
pub mod fsq;
pub mod gpc;
mod load;
pub mod masked_mimic;
pub mod migrate;
pub mod mlp;
mod model;
pub mod module_ops;
pub mod network;
mod obs_check;
pub mod obs_widths;
pub mod problem;
pub mod releases;
pub mod sample;
pub mod served;
mod served_masked_mimic;
mod served_policy;
pub mod shapes;
pub mod transformer;
pub mod v23;

pub use activation::Activation;
pub use config::{ModelConfig, ModuleConfig, Number};
pub use describe::Description;
pub use error::{GlobalRule, OlderRelease, PolicyError, Result};
pub use flat::ActorScratch;
pub use load::{find_config, model_target, read_model_config, AllowedGlobal, Globals, LoadOptions, CONFIG_NAMES};
pub use masked_mimic::{MaskedMimic, MaskedMimicConfig, MaskedMimicOutputs};
pub use mlp::CpuKernels;
pub use model::{ActorOutputs, AmpNetworks, DiscOutputs, Outputs, Part, Policy, Sampled};
pub use network::TensorMap;
pub use problem::{AttentionProblem, ExprProblem, FieldProblem, FsqKeyRole, GraphProblem, OpProblem};
pub use served::{Batch, Model, ModelDescription, ModelOptions, Named, RunError, Segment, Signature, Wanted};
pub use served_masked_mimic::MaskedMimicModel;
pub use served_policy::PolicyModel;
