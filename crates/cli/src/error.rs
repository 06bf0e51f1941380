//! The CLI's errors: everything is exit 2 except what a command decides
//! itself (a difference, a refusal: exit 1).

/// Why a command could not do its job.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The arguments do not make sense together (or name nothing usable).
    #[error("{0}")]
    Usage(String),
    /// `config --get KEY`: the file has no such key.
    #[error("{file}: no key {key}")]
    NoKey {
        /// The file.
        file: String,
        /// The dotted key asked for.
        key: String,
    },
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
    /// A model could not be loaded for a reason of the interface itself
    /// (a `--width` pin, a GPC prior too large for one forward); a
    /// family's own errors are [`CliError::Policy`] or [`CliError::Deploy`].
    #[error(transparent)]
    Load(pmstate_policy::served::LoadError),
    /// A model of a family outside this workspace's failed to run.
    #[error(transparent)]
    Run(pmstate_policy::RunError),
    /// Reading or replaying a trace failed.
    #[error(transparent)]
    Trace(#[from] pmstate_trace::TraceError),
    /// The inference server could not start or stopped on an error.
    #[error(transparent)]
    Serve(#[from] pmstate_serve::StartError),
    /// `config FILE.yaml`: a Hydra config that could not be read or resolved.
    #[error(transparent)]
    Hydra(Box<pmstate_ckpt::hydra::HydraError>),
    /// `deploy sim`: the simulator, its MJCF or an option (boxed: it
    /// carries the tracker's errors).
    #[error(transparent)]
    Sim(Box<pmstate_sim::SimError>),
    /// `migrate`: refused or failed (boxed: it carries the checkpoint's errors).
    #[error(transparent)]
    Migrate(Box<pmstate_policy::migrate::MigrateError>),
}

impl From<pmstate_policy::migrate::MigrateError> for CliError {
    fn from(e: pmstate_policy::migrate::MigrateError) -> Self {
        match e {
            pmstate_policy::migrate::MigrateError::Ckpt(c) => CliError::Ckpt(c),
            e => CliError::Migrate(Box::new(e)),
        }
    }
}

impl From<pmstate_sim::SimError> for CliError {
    fn from(e: pmstate_sim::SimError) -> Self {
        match e {
            pmstate_sim::SimError::Deploy(d) => CliError::Deploy(d),
            e => CliError::Sim(Box::new(e)),
        }
    }
}

impl From<pmstate_deploy::DeployError> for CliError {
    fn from(e: pmstate_deploy::DeployError) -> Self {
        CliError::Deploy(Box::new(e))
    }
}

impl From<pmstate_policy::served::LoadError> for CliError {
    fn from(e: pmstate_policy::served::LoadError) -> Self {
        match e {
            pmstate_policy::served::LoadError::Policy(e) => CliError::Policy(e),
            e => CliError::Load(e),
        }
    }
}

impl From<pmstate_policy::RunError> for CliError {
    fn from(e: pmstate_policy::RunError) -> Self {
        match e {
            pmstate_policy::RunError::Policy(e) => CliError::Policy(e),
            pmstate_policy::RunError::Family { model, source } => {
                match source.downcast::<pmstate_deploy::DeployError>() {
                    Ok(e) => CliError::Deploy(e),
                    Err(source) => CliError::Run(pmstate_policy::RunError::Family { model, source }),
                }
            }
            e => CliError::Run(e),
        }
    }
}

/// What `--json` prints for an error: one JSON object on stderr (stdout
/// keeps the results, so a script parses each stream one way), with the
/// exit code unchanged.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ErrorReport {
    /// What went wrong, stable for scripts to match: the error's family and
    /// variant (`ckpt.not_found`, `policy.obs_width`, `usage`).
    pub kind: String,
    /// The message text mode prints (after `pmstate: error: `).
    pub message: String,
    /// The file at fault, where the error names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The key (dotted checkpoint key, config path or observation key) at fault, where there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl ErrorReport {
    /// A report of `kind` with `message`, naming no file or key.
    pub fn new(kind: impl Into<String>, message: impl Into<String>) -> Self {
        ErrorReport { kind: kind.into(), message: message.into(), file: None, key: None }
    }

    fn at(mut self, file: Option<&str>, key: Option<&str>) -> Self {
        self.file = file.map(str::to_owned);
        self.key = key.map(str::to_owned);
        self
    }
}

impl CliError {
    /// The error as `--json` reports it.
    pub fn report(&self) -> ErrorReport {
        let message = self.to_string();
        match self {
            CliError::Usage(_) => ErrorReport::new("usage", message),
            CliError::NoKey { file, key } => ErrorReport::new("no_key", message).at(Some(file), Some(key)),
            CliError::Norm(_) => ErrorReport::new("norm", message),
            CliError::Candle(_) => ErrorReport::new("candle", message),
            CliError::Io(_) => ErrorReport::new("io", message),
            CliError::Remove { path, .. } => {
                ErrorReport::new("remove", message).at(Some(&path.display().to_string()), None)
            }
            CliError::Json(_) => ErrorReport::new("json", message),
            CliError::Ckpt(e) => {
                let (kind, file, key) = ckpt_parts(e);
                ErrorReport::new(format!("ckpt.{kind}"), message).at(file, key)
            }
            CliError::Policy(e) => policy_report(e, message),
            CliError::Deploy(e) => deploy_report(e, message),
            CliError::Obs { path, problem, .. } => {
                ErrorReport::new(format!("obs.{}", obs_kind(problem)), message).at(Some(path), obs_key(problem))
            }
            CliError::Load(e) => load_report(e, message),
            CliError::Run(_) => ErrorReport::new("run", message),
            CliError::Trace(_) => ErrorReport::new("trace", message),
            CliError::Serve(_) => ErrorReport::new("serve", message),
            CliError::Sim(e) => sim_report(e, message),
            CliError::Hydra(e) => hydra_report(e, message),
            CliError::Migrate(e) => ErrorReport::new(format!("migrate.{}", e.kind()), message).at(e.file(), e.key()),
        }
    }
}

/// The report of a model-interface load error: its variant, and the
/// checkpoint or pinned key it names.
fn load_report(e: &pmstate_policy::served::LoadError, message: String) -> ErrorReport {
    use pmstate_policy::served::LoadError as E;
    match e {
        E::Policy(e) => policy_report(e, message),
        E::Pin(p) => ErrorReport::new("load.pin", message).at(None, Some(&p.key)),
        E::TooManyLogits { path, .. } => ErrorReport::new("load.too_many_logits", message).at(Some(path), None),
    }
}

/// The variant name, file and key of a checkpoint error.
fn ckpt_parts(e: &pmstate_ckpt::CkptError) -> (&'static str, Option<&str>, Option<&str>) {
    use pmstate_ckpt::CkptError as E;
    match e {
        E::Io { path, .. } => ("io", Some(path), None),
        E::NotAFile { path, .. } => ("not_a_file", Some(path), None),
        E::NotSeekable { path, .. } => ("not_seekable", Some(path), None),
        E::InputChanged { path } => ("input_changed", Some(path), None),
        E::NotACheckpoint { path } => ("not_a_checkpoint", Some(path), None),
        E::TorchScript { path } => ("torchscript", Some(path), None),
        E::Zip { path, .. } => ("zip", Some(path), None),
        E::Entry { path, entry, .. } => ("entry", Some(path), Some(entry)),
        E::DuplicateEntries { path, .. } => ("duplicate_entries", Some(path), None),
        E::CentralDirectoryMismatch { path, .. } => ("central_directory_mismatch", Some(path), None),
        E::MissingRecord { path, record } => ("missing_record", Some(path), Some(record)),
        E::RecordSize { path, record, .. } => ("record_size", Some(path), Some(record)),
        E::Truncated { path, .. } => ("truncated", Some(path), None),
        E::InflateLimit { path, record, .. } => ("inflate_limit", Some(path), Some(record)),
        E::Inflate { path, record, .. } => ("inflate", Some(path), Some(record)),
        E::ByteOrder { path, .. } => ("byte_order", Some(path), None),
        E::Pickle { path, record, .. } => ("pickle", Some(path), Some(record)),
        E::Legacy { path, .. } => ("legacy", Some(path), None),
        E::Safetensors { path, .. } => ("safetensors", Some(path), None),
        E::Header { path, .. } => ("header", Some(path), None),
        E::Metadata { path, .. } => ("metadata", Some(path), Some("__metadata__")),
        E::Value { path, key, .. } => ("value", Some(path), Some(key)),
        E::UnsupportedDtype { path, key, .. } => ("unsupported_dtype", Some(path), key.as_deref()),
        E::UnsafeGlobals { key, .. } => ("unsafe_globals", None, Some(key)),
        E::Limit { path, .. } => ("limit", Some(path), None),
        E::StorageRange { .. } => ("storage_range", None, None),
        E::NotFound { path, key, .. } => ("not_found", Some(path), Some(key)),
        E::WrongKind { path, key, .. } => ("wrong_kind", Some(path), Some(key)),
        E::NormalizerNotFound { path, name, .. } => ("normalizer_not_found", Some(path), Some(name)),
        E::Norm { group, .. } => ("norm", None, Some(group)),
        E::Candle { key, .. } => ("candle", None, key.as_deref()),
        E::WouldNotReadBack { output, record, .. } => ("would_not_read_back", Some(output), Some(record)),
        E::Unwritable { output, key, .. } => ("unwritable", Some(output), Some(key)),
        // a variant added later: the family alone
        _ => ("other", None, None),
    }
}

/// A policy error's report: its variant, and the file and key (config
/// path or observation key) it names.
fn policy_report(e: &pmstate_policy::PolicyError, message: String) -> ErrorReport {
    use pmstate_policy::PolicyError as E;
    let (kind, file, key): (&str, Option<&str>, Option<&str>) = match e {
        E::Ckpt(c) => {
            let (kind, file, key) = ckpt_parts(c);
            return ErrorReport::new(format!("ckpt.{kind}"), message).at(file, key);
        }
        E::UnsafeGlobals { file, key, .. } => ("unsafe_globals", Some(file), Some(key)),
        E::ConfigNotFound { checkpoint } => ("config_not_found", Some(checkpoint), None),
        E::NoModelConfig { file, path } => ("no_model_config", Some(file), Some(path)),
        E::UnsupportedClass { path, .. } => ("unsupported_class", None, Some(path)),
        E::OlderRelease(o) => ("older_release", Some(&o.file), Some(&o.path)),
        E::UnsupportedField { path, .. } => ("unsupported_field", None, Some(path)),
        E::MissingField { path, .. } => ("missing_field", None, Some(path)),
        E::FieldType { path, .. } => ("field_type", None, Some(path)),
        E::BadField { path, .. } => ("bad_field", None, Some(path)),
        E::UnknownActivation { path, .. } => ("unknown_activation", None, Some(path)),
        E::MissingWeight { file, key, .. } => ("missing_weight", Some(file), Some(key)),
        E::WeightShape { file, key, .. } => ("weight_shape", Some(file), Some(key)),
        E::UnprovidedKey { key, .. } => ("unprovided_key", None, Some(key)),
        E::Graph { path, .. } => ("graph", None, Some(path)),
        E::MissingObs { key, .. } => ("missing_obs", None, Some(key)),
        E::ExtraObs { key, .. } => ("extra_obs", None, Some(key)),
        E::NanObservation { key, .. } => ("nan_observation", None, Some(key)),
        E::ConfigRead { file, .. } => ("config_read", Some(file), None),
        E::HydraConfig { file } => ("hydra_config", Some(file), None),
        E::Hydra(h) => {
            return hydra_report(h, message);
        }
        E::ObsDtype { key, .. } => ("obs_dtype", None, Some(key)),
        E::ObsRank { key, .. } => ("obs_rank", None, Some(key)),
        E::ObsWidth { key, .. } => ("obs_width", None, Some(key)),
        E::ObsBatch { key, .. } => ("obs_batch", None, Some(key)),
        E::ObsGroupWidth { key, .. } => ("obs_group_width", None, Some(key)),
        E::ModuleOp { path, .. } => ("module_op", None, Some(path)),
        E::Norm { path, .. } => ("norm", None, Some(path)),
        E::NoDiscriminator { .. } => ("no_discriminator", None, None),
        E::Candle(_) => ("candle", None, None),
        E::Isa(_) => ("isa", None, None),
        _ => ("other", None, None),
    };
    ErrorReport::new(format!("policy.{kind}"), message).at(file, key)
}

/// The variant name of an observations-file problem.
fn obs_kind(p: &crate::cmd::policy::obs::ObsProblem) -> &'static str {
    use crate::cmd::policy::obs::ObsProblem as P;
    match p {
        P::Truncated { .. } => "truncated",
        P::HeaderTooLarge { .. } => "header_too_large",
        P::Header(_) => "header",
        P::Duplicate(_) => "duplicate",
        P::TooManyDims { .. } => "too_many_dims",
        P::Offsets { .. } => "offsets",
        P::NotInt64 { .. } => "not_int64",
    }
}

/// The tensor an observations-file problem names, if one.
fn obs_key(p: &crate::cmd::policy::obs::ObsProblem) -> Option<&str> {
    use crate::cmd::policy::obs::ObsProblem as P;
    match p {
        P::Duplicate(k) | P::TooManyDims { key: k } | P::Offsets { key: k, .. } | P::NotInt64 { key: k, .. } => Some(k),
        _ => None,
    }
}

/// The report of a Hydra config error: `hydra.yaml`, or `hydra.<problem>`
/// with the file and the dotted key.
fn hydra_report(e: &pmstate_ckpt::hydra::HydraError, message: String) -> ErrorReport {
    use pmstate_ckpt::hydra::{HydraError as E, Problem as P};
    match e {
        E::Yaml { file, .. } => ErrorReport::new("hydra.yaml", message).at(Some(file), None),
        E::Key { file, key, problem } => {
            let kind = match problem {
                P::Grammar { .. } => "grammar",
                P::NotFound { .. } => "not_found",
                P::MissingValue { .. } => "missing_value",
                P::Cycle { .. } => "cycle",
                P::UnknownResolver { .. } => "unknown_resolver",
                P::Resolver { .. } => "resolver",
                P::EvalRefused { .. } => "eval_refused",
                P::EvalFailed { .. } => "eval_failed",
                P::Unrepresentable(_) => "unrepresentable",
                P::Limit(_) => "limit",
            };
            ErrorReport::new(format!("hydra.{kind}"), message).at(Some(file), Some(key))
        }
    }
}

/// The report of a `deploy sim` error: its variant and the file or option.
fn sim_report(e: &pmstate_sim::SimError, message: String) -> ErrorReport {
    use pmstate_sim::SimError as E;
    let (kind, file, key): (&str, Option<&str>, Option<&str>) = match e {
        E::Mjcf { file, .. } => ("mjcf", Some(file), None),
        E::Io { path, .. } => ("io", Some(path), None),
        E::Mujoco { file, .. } => ("mujoco", Some(file), None),
        E::Mismatch { file, what, .. } => ("mismatch", Some(file), Some(what)),
        E::Option { option, .. } => ("option", None, Some(option)),
        E::Diverged { what, .. } => ("diverged", None, Some(what)),
        _ => ("other", None, None),
    };
    ErrorReport::new(format!("sim.{kind}"), message).at(file, key)
}

/// The report of a deployment error: its variant, file and key.
fn deploy_report(e: &pmstate_deploy::DeployError, message: String) -> ErrorReport {
    use pmstate_deploy::DeployError as E;
    let (kind, file, key): (&str, Option<&str>, Option<&str>) = match e {
        E::UnknownFunction { file, component, .. } => ("unknown_function", Some(file), Some(component)),
        E::Config { file, key, .. } => ("config", Some(file), Some(key)),
        E::UnknownContextPath { file, component, .. } => ("unknown_context_path", Some(file), Some(component)),
        E::MissingObservation { file, key } => ("missing_observation", Some(file), Some(key)),
        E::MissingInput { name, .. } => ("missing_input", None, Some(name)),
        E::UnknownInput { name, .. } => ("unknown_input", None, Some(name)),
        E::InputShape { name, .. } => ("input_shape", None, Some(name)),
        E::Batch { name, .. } => ("batch", None, Some(name)),
        E::Motion { file, .. } => ("motion", Some(file), None),
        E::ControlDt(_) => ("control_dt", None, None),
        E::Unsourced { path, .. } => ("unsourced", None, Some(path)),
        E::Sensor { name, .. } => ("sensor", None, Some(name)),
        E::ClipMismatch { .. } => ("clip_mismatch", None, None),
        E::Policy(p) => return policy_report(p, message),
        E::Checkpoint(c) => {
            let (kind, file, key) = ckpt_parts(c);
            return ErrorReport::new(format!("ckpt.{kind}"), message).at(file, key);
        }
        E::Candle(_) => ("candle", None, None),
        _ => ("other", None, None),
    };
    ErrorReport::new(format!("deploy.{kind}"), message).at(file, key)
}
