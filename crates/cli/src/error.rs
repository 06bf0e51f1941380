//! The CLI's errors: everything is exit 2 except what a command decides
//! itself (a difference, a refusal: exit 1).

/// Why a command could not do its job.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The arguments do not make sense together (or name nothing usable).
    #[error("{0}")]
    Usage(String),
    /// A normalizer operation failed.
    #[error(transparent)]
    Norm(#[from] pmstate_norm::NormError),
    /// candle failed (allocation, device).
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// Writing output failed.
    #[error("writing output: {0}")]
    Io(#[from] std::io::Error),
    /// `clean-tmp --delete` could not remove a stale temporary file.
    #[error("removing {}: {source}", path.display())]
    Remove {
        /// The file.
        path: std::path::PathBuf,
        /// Why not.
        source: std::io::Error,
    },
    /// Encoding JSON output failed.
    #[error("encoding JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// Reading or writing a checkpoint failed.
    #[error(transparent)]
    Ckpt(#[from] pmstate_ckpt::CkptError),
    /// Loading or running a policy failed.
    #[error(transparent)]
    Policy(#[from] pmstate_policy::PolicyError),
    /// An observations file (`policy run --obs`, `deploy run --inputs`) that cannot be read as one.
    #[error("{flag} {path}: {problem}")]
    Obs {
        /// The flag that named the file.
        flag: &'static str,
        /// The file.
        path: String,
        /// What is wrong.
        problem: crate::cmd::policy::obs::ObsProblem,
    },
    /// Loading or running a deployment pipeline failed (boxed: it carries
    /// the policy's and the checkpoint's errors).
    #[error(transparent)]
    Deploy(Box<pmstate_deploy::DeployError>),
    /// Reading or replaying a trace failed.
    #[error(transparent)]
    Trace(#[from] pmstate_trace::TraceError),
    /// The inference server could not start or stopped on an error.
    #[error(transparent)]
    Serve(#[from] pmstate_serve::StartError),
}

impl From<pmstate_deploy::DeployError> for CliError {
    fn from(e: pmstate_deploy::DeployError) -> Self {
        CliError::Deploy(Box::new(e))
    }
}
