//! What can go wrong when closing the loop.

use pmstate_deploy::DeployError;

/// A simulation error; each names the file, option or quantity at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The MJCF is not well-formed XML.
    #[error("{file}: not an MJCF document MuJoCo could read: {reason}")]
    Mjcf {
        /// The file.
        file: String,
        /// What the XML reader said.
        reason: String,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// MuJoCo refused the model.
    #[error("{file}: MuJoCo could not compile the model: {reason}")]
    Mujoco {
        /// The file.
        file: String,
        /// MuJoCo's message.
        reason: String,
    },
    /// The model and the tracker's robot disagree.
    #[error("{file}: the model has {model} {what}, the tracker's robot {contract}")]
    Mismatch {
        /// The MJCF.
        file: String,
        /// What differs (actuators, joint positions, bodies).
        what: &'static str,
        /// The model's count.
        model: usize,
        /// The contract's.
        contract: String,
    },
    /// An option outside its domain.
    #[error("{option} = {value}: must be {domain}")]
    Option {
        /// The option.
        option: &'static str,
        /// Its value, as given.
        value: String,
        /// Its domain.
        domain: &'static str,
    },
    /// The simulation became non-finite (the model exploded).
    #[error("step {step}: MuJoCo's state is no longer finite ({what}); the simulation diverged")]
    Diverged {
        /// The control step.
        step: usize,
        /// The first non-finite quantity.
        what: &'static str,
    },
    /// The tracker failed (not a refused reading: those are counted);
    /// boxed, it carries the policy's and the checkpoint's errors.
    #[error(transparent)]
    Deploy(Box<DeployError>),
}

impl From<DeployError> for SimError {
    fn from(e: DeployError) -> Self {
        SimError::Deploy(Box::new(e))
    }
}

/// A result with [`SimError`].
pub type Result<T> = std::result::Result<T, SimError>;
