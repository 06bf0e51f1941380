#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
#![deny(unsafe_code)]

#[cfg(feature = "mujoco")]
pub mod closed_loop;
mod error;
pub mod metrics;
pub mod mjcf;
#[cfg(feature = "mujoco")]
pub mod mujoco;
pub mod perturb;
mod reading;

pub use error::{Result, SimError};
pub use metrics::{FallCriteria, StepMetrics, StepTimes, Summary};
pub use perturb::{Perturbations, Perturber, Push, SensorNoise};
pub use reading::Reading;
