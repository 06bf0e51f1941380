#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
#![deny(unsafe_code)]
// The README's example is pasted into new crates: a warning there is a failure here.
#![doc(test(attr(deny(warnings))))]

pub mod actions;
mod configs;
pub mod context;
pub mod contract;
pub mod envelope;
mod error;
pub mod limits;
pub mod motion;
pub mod observations;
mod pipeline;
pub mod realtime;
mod recorder;
pub mod rotations;
mod served;
/// The heading bound the unit tests share with tests/parity.rs.
#[cfg(test)]
#[path = "../tests/common/heading.rs"]
mod test_heading;
mod tracker;
pub mod v30;

pub use configs::Steps;
pub use contract::{Contract, Fallback};
pub use envelope::{EndOfClip, Envelope, JointLimits, SafePose, SafeReason, SensorBounds, TrackerStatus};
pub use error::{ConfigProblem, DeployError, MotionProblem, Result, SensorProblem};
pub use motion::{MotionClip, MotionPlayer};
pub use pipeline::RobotLimits;
pub use pipeline::{Input, Observation, Outputs, Pipeline, OUTPUT_NAMES};
pub use recorder::{read_log, LogMeta, LogReader, LogRecord, LoggedSensors, RecordKind, RecorderSummary, LOG_VERSION};
pub use served::{PipelineModel, PIPELINE_MODEL};
pub use tracker::{
    quat_mul_np, quat_rotate_np, yaw_quat_np, Alignment, BodyState, PdTargets, Sensors, Stamp, Tracker, TrackerOptions,
};
