//! Errors of the deploy crate.

use thiserror::Error;

/// Result of this crate.
pub type Result<T, E = DeployError> = std::result::Result<T, E>;

/// What can go wrong building or running a deployment pipeline.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum DeployError {
    /// A component's compute function has no Rust implementation.
    #[error(
        "{file}: {component}: the function {function} has no implementation in pmstate-deploy; supported: {}",
        supported.join(", ")
    )]
    UnknownFunction {
        /// The configs file.
        file: String,
        /// The config path of the component (`env.observation_components.<name>`).
        component: String,
        /// The qualified Python name.
        function: String,
        /// The supported qualified names.
        supported: Vec<String>,
    },
    /// A config value is missing or not what the reference accepts there.
    #[error("{file}: {key}: {problem}")]
    Config {
        /// The configs file.
        file: String,
        /// The dotted config key.
        key: String,
        /// What is wrong.
        problem: ConfigProblem,
    },
    /// An observation reads a context path this crate has no shape for.
    #[error(
        "{file}: {component}: argument {argument} is bound to the context path {path}, which pmstate-deploy does not know"
    )]
    UnknownContextPath {
        /// The configs file.
        file: String,
        /// The component's config path.
        component: String,
        /// The function argument.
        argument: String,
        /// The context path.
        path: String,
    },
    /// The actor reads an observation no component computes.
    #[error("{file}: the actor reads {key}, which no entry of env.observation_components computes")]
    MissingObservation {
        /// The configs file.
        file: String,
        /// The observation key.
        key: String,
    },
    /// A pipeline input is missing.
    #[error("input {name} is missing (shape {}); the pipeline takes: {}", shape_str(expected), names.join(", "))]
    MissingInput {
        /// The input's name.
        name: String,
        /// Its shape, `B` first.
        expected: Vec<String>,
        /// Every input name.
        names: Vec<String>,
    },
    /// An input the pipeline does not take.
    #[error("input {name} is not one the pipeline takes: {}", names.join(", "))]
    UnknownInput {
        /// The name given.
        name: String,
        /// Every input name.
        names: Vec<String>,
    },
    /// An input of the wrong shape or dtype.
    #[error("input {name}: expected float32 of shape {}, got {found}", shape_str(expected))]
    InputShape {
        /// The input's name.
        name: String,
        /// The expected shape, `B` first.
        expected: Vec<String>,
        /// What was given (dtype and shape).
        found: String,
    },
    /// Inputs disagree on the batch size.
    #[error("input {name} has {got} rows, other inputs {others}")]
    Batch {
        /// The input's name.
        name: String,
        /// Its rows.
        got: usize,
        /// The others' rows.
        others: usize,
    },
    /// A motion clip that cannot be played.
    #[error("{file}: {problem}")]
    Motion {
        /// The clip.
        file: String,
        /// What is wrong.
        problem: MotionProblem,
    },
    /// A control period that is not a positive number of seconds (at most [`crate::limits::MAX_CONTROL_DT`]).
    #[error("control period {0} s: expected a positive number of seconds, at most 1")]
    ControlDt(f64),
    /// The tracker cannot source a pipeline input from sensors and the clip.
    #[error("the pipeline reads {path}, which the tracker cannot source from sensors and the reference motion (it sources: {})", sourced.join(", "))]
    Unsourced {
        /// The context path.
        path: String,
        /// What it can source.
        sourced: Vec<String>,
    },
    /// Sensors of the wrong size, or one the pipeline needs left out.
    #[error("sensor {name}: {problem}")]
    Sensor {
        /// The sensor.
        name: &'static str,
        /// What is wrong.
        problem: SensorProblem,
    },
    /// The clip and the pipeline disagree on the robot.
    #[error("the motion clip has {clip} {what}, the pipeline's robot {robot}")]
    ClipMismatch {
        /// `joints` or `bodies`.
        what: &'static str,
        /// The clip's count.
        clip: usize,
        /// The robot's.
        robot: usize,
    },
    /// The observations the configs imply do not have the width the actor reads.
    #[error(
        "{file}: the actor reads {key} with {actor} values per row; the configs' observation components give {observations}"
    )]
    Width {
        /// The configs file.
        file: String,
        /// The observation key (or keys, joined, for a sum the actor fixes).
        key: String,
        /// The width the configs imply.
        observations: usize,
        /// The width the actor's checkpoint reads.
        actor: usize,
    },
    /// An allocation sized by input failed: an error, never an abort.
    #[error("could not allocate {bytes} bytes for {what}")]
    Allocation {
        /// What the memory was for.
        what: &'static str,
        /// How much was asked for.
        bytes: usize,
    },
    /// A tracker option outside its domain.
    #[error("tracker option {option}: {value} is outside its domain ({domain})")]
    Option {
        /// The option (`action_ema_alpha`, `envelope.max_tilt`, ...).
        option: &'static str,
        /// The value given.
        value: String,
        /// What it must be.
        domain: &'static str,
    },
    /// A flight-recorder log that cannot be written or read.
    #[error("flight recorder {file}: {problem}")]
    Log {
        /// The log file.
        file: String,
        /// What is wrong.
        problem: String,
    },
    /// Loading or running the policy failed.
    #[error(transparent)]
    Policy(#[from] pmstate_policy::PolicyError),
    /// Reading a file failed.
    #[error(transparent)]
    Checkpoint(#[from] pmstate_ckpt::CkptError),
    /// A tensor operation failed.
    #[error("tensor operation: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Dimensions as `1, 3, 29` (for messages: no Debug formatting).
pub(crate) fn join(dims: &[usize]) -> String {
    dims.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")
}

fn shape_str(s: &[String]) -> String {
    format!("[{}]", s.join(", "))
}

/// What is wrong with a config value.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ConfigProblem {
    /// The key is absent.
    #[error("missing")]
    Missing,
    /// The value has another type.
    #[error("expected {expected}, found {found}")]
    WrongType {
        /// What the reference accepts.
        expected: &'static str,
        /// What the file holds.
        found: String,
    },
    /// A value the reference accepts but this crate does not implement.
    #[error("{value} is not supported (supported: {supported})")]
    Unsupported {
        /// The value found.
        value: String,
        /// What is supported.
        supported: &'static str,
    },
    /// A parameter the function does not take (or this crate does not know).
    #[error("unknown parameter (the function takes: {known})")]
    UnknownParameter {
        /// The parameters it takes.
        known: String,
    },
    /// A number outside the domain the deploy path accepts (docs/deploy.md).
    #[error("{value}: expected {domain}")]
    OutOfDomain {
        /// The value found.
        value: String,
        /// What is accepted.
        domain: &'static str,
    },
    /// A size past a bound stated in [`crate::limits`].
    #[error("{value} is past the bound of {bound}")]
    Bound {
        /// The size found.
        value: usize,
        /// The bound.
        bound: usize,
    },
    /// Lengths that must agree do not.
    #[error("has {got} values, expected {expected}")]
    Length {
        /// Found.
        got: usize,
        /// Expected.
        expected: usize,
    },
}

/// What is wrong with a motion clip.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum MotionProblem {
    /// A key the `.motion` format requires is absent (or not a tensor).
    #[error("no {0} (a .motion file holds fps, dof_pos, dof_vel, rigid_body_pos/rot/vel/ang_vel)")]
    Missing(&'static str),
    /// Not a positive, finite frame rate.
    #[error("fps {0}: expected a positive number")]
    Fps(f64),
    /// A tensor of another shape than the others imply.
    #[error("{key} has shape [{}], which does not fit dof_pos and rigid_body_pos", join(shape))]
    Shape {
        /// The key.
        key: &'static str,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// No frames, or more than [`crate::motion::MAX_FRAMES`].
    #[error("{0} frames (1 to 10368000 are played)")]
    Frames(usize),
    /// An array whose length is not frames x values per frame.
    #[error("{key} has {got} values, expected {frames} frames x {width}")]
    Length {
        /// The key.
        key: &'static str,
        /// Its length.
        got: usize,
        /// Frames.
        frames: usize,
        /// Values per frame.
        width: usize,
    },
    /// A value that is NaN or infinite.
    #[error("{key}[{index}] is {value}: every value of a clip must be finite")]
    NonFinite {
        /// The key.
        key: &'static str,
        /// The flat index of the value.
        index: usize,
        /// The value.
        value: f32,
    },
    /// A rotation that is not a unit quaternion.
    #[error(
        "rigid_body_rot of frame {frame}, body {body} has norm {norm}: expected 1 within {}",
        crate::limits::QUAT_NORM_TOLERANCE
    )]
    NotUnit {
        /// The source frame.
        frame: usize,
        /// The body.
        body: usize,
        /// Its norm.
        norm: f32,
    },
    /// Resampled at the control period, the clip would take more memory than the player may hold.
    #[error("resampled at {control_dt} s the clip has {frames} frames, {bytes} bytes: past the player's bound of {} bytes (a clip's fps or length is off)", crate::limits::MAX_PLAYER_BYTES)]
    TooLong {
        /// The control period.
        control_dt: f64,
        /// Frames at that period.
        frames: usize,
        /// What they would take.
        bytes: usize,
    },
}

/// What is wrong with a sensor reading. [`SensorProblem::Length`] and
/// [`SensorProblem::Missing`] are the caller's wiring; the others are a
/// reading refused for one step ([`DeployError::is_refused_reading`]).
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum SensorProblem {
    /// Another length than the robot needs.
    #[error("{got} values, expected {expected}")]
    Length {
        /// Given.
        got: usize,
        /// Needed.
        expected: usize,
    },
    /// The pipeline reads it but it was not given.
    #[error("the pipeline reads it, and none was given")]
    Missing,
    /// NaN or infinite.
    #[error("value {index} is {value}")]
    NonFinite {
        /// Its index in the sensor's array.
        index: usize,
        /// The value.
        value: f32,
    },
    /// A quaternion that is not of unit norm (zero, or a corrupt reading).
    #[error("quaternion {index} has norm {norm}: expected 1 within {}", crate::limits::QUAT_NORM_TOLERANCE)]
    NotUnit {
        /// Which quaternion (0 for the anchor's; the body for body rotations).
        index: usize,
        /// Its norm.
        norm: f32,
    },
    /// Beyond the physical bound stated for the sensor ([`crate::SensorBounds`]).
    #[error("value {index} is {value}, beyond the bound of {bound}")]
    OutOfRange {
        /// Its index in the sensor's array.
        index: usize,
        /// The value.
        value: f32,
        /// The bound on its magnitude.
        bound: f32,
    },
}

impl DeployError {
    /// Whether this is a sensor reading refused for one step (NaN, inf, a
    /// quaternion off unit norm, a value beyond its physical bound): the
    /// tracker's state is as it was before the call, and the next reading
    /// may be good. Wrong lengths and missing sensors are not: they are the
    /// caller's wiring and fail every step.
    pub fn is_refused_reading(&self) -> bool {
        matches!(
            self,
            DeployError::Sensor {
                problem: SensorProblem::NonFinite { .. }
                    | SensorProblem::NotUnit { .. }
                    | SensorProblem::OutOfRange { .. },
                ..
            }
        )
    }
}
