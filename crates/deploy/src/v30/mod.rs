//! ProtoMotions v3.0's motion trackers. v3.0's `Mimic` env has no
//! observation components: its observations are computed in code
//! (`HumanoidObs`, `MimicObs`), configured by `env.humanoid_obs` and
//! `env.mimic_obs`. This module turns those configs into the pipeline's
//! components (`v30::config`) and implements the functions they name
//! ([`functions`], with v3.0's joint encoding in [`dof_obs`]), so that
//! v3.0 runs through the same pipeline, tracker and C ABI as the later
//! releases: one observation interface, not a second runtime.
//!
//! What v3.0 reads that the later releases do not, and where the tracker
//! sources it (`crate::tracker`): the root body's state (`bodies`, body 0:
//! position, rotation, world angular velocity) and its history, and the
//! reference in the clip's own frame realigned with the robot every step
//! (`mimic.realign_offset`: the robot root's xy minus the reference root's
//! at the previous step, as `BaseEnv.align_motion_with_humanoid` sets
//! `respawn_root_offset` after each step), with the motion clock
//! (`mimic.motion_time`, `mimic.motion_length`) for the time to each target.

pub(crate) mod config;
pub mod dof_obs;
pub mod functions;

pub use functions::{V30Function, V30_HISTORICAL_REDUCED_COORDS, V30_REDUCED_COORDS, V30_TARGET_POSES};
