//! What stops a migration. Every variant names the file, the config key or
//! the class at fault, so a refusal says exactly what today's ProtoMotions
//! lacks rather than failing later inside its loader.

/// Why `pmstate migrate` refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigrateError {
    /// Reading the old checkpoint or its configs, or writing an output, failed.
    #[error(transparent)]
    Ckpt(#[from] pmstate_ckpt::CkptError),
    /// No resolved configs next to the old checkpoint.
    #[error("{checkpoint}: no resolved_configs.pt or resolved_configs_inference.pt next to it")]
    ConfigNotFound {
        /// The old checkpoint.
        checkpoint: String,
    },
    /// The configs are not of a release this migrates (v3.0, v3.1).
    #[error("{file}: not a ProtoMotions release migrate knows ({why}); migrate reads v3.0 and v3.1 configs")]
    UnknownRelease {
        /// The configs file.
        file: String,
        /// What was found instead (the env's class, or a missing key).
        why: String,
    },
    /// The configs are already today's layout: nothing to migrate.
    #[error("{file}: already today's layout ({key} is {class}); nothing to migrate")]
    AlreadyCurrent {
        /// The configs file.
        file: String,
        /// The key whose class says so.
        key: String,
        /// Today's class found there.
        class: String,
    },
    /// Only PPO motion trackers are migrated.
    #[error("{file}: not a PPO motion tracker ({key} is {found}); migrate handles v3.0/v3.1 motion trackers only")]
    NotATracker {
        /// The configs file.
        file: String,
        /// The key looked at.
        key: String,
        /// What it holds.
        found: String,
    },
    /// No recorded template of today's configs for this robot.
    #[error("{file}: no template of today's configs for robot class {class} (recorded: {known})")]
    NoTemplate {
        /// The configs file.
        file: String,
        /// The old robot config's class.
        class: String,
        /// The robot classes with a template.
        known: String,
    },
    /// A release whose observations today's code cannot compute the same way.
    #[error("{file}: {release} cannot be migrated: {key} ({class}): {why}")]
    NotMigratable {
        /// The configs file.
        file: String,
        /// The release (`v3.0`).
        release: &'static str,
        /// The config key at fault.
        key: String,
        /// Its class or function.
        class: String,
        /// Why today's ProtoMotions has no equivalent.
        why: String,
    },
    /// A component (reward, termination, observation) whose function today's code lacks.
    #[error("{file}: {key}: {function} has no counterpart in today's ProtoMotions with the same math ({why})")]
    NoCounterpart {
        /// The configs file.
        file: String,
        /// The component's key (`env.reward_components.foo`).
        key: String,
        /// The old function, `module.name`.
        function: String,
        /// What differs.
        why: String,
    },
    /// The old robot differs from the template's robot in what today's
    /// action config was computed from (joint limits, gains, action scale).
    #[error(
        "{file}: {key} differs from today's template robot ({template}): today's action config \
         (PD offsets, scales and gains) was computed from the template robot's, so the old policy's \
         actions would drive other PD targets"
    )]
    RobotDiffers {
        /// The old configs file.
        file: String,
        /// The robot key that differs (`robot.kinematic_info.dof_limits_lower`).
        key: String,
        /// The template it was compared with (`g1_tracker`).
        template: &'static str,
    },
    /// A config value is not what the release writes there.
    #[error("{file}: {key}: expected {expected}, found {found}")]
    Malformed {
        /// The configs file.
        file: String,
        /// The dotted key.
        key: String,
        /// What the release writes.
        expected: &'static str,
        /// What is there.
        found: String,
    },
    /// The old checkpoint's model state does not fit the migrated model.
    #[error("{file}: model state key {key}: {why}")]
    StateDict {
        /// The old checkpoint.
        file: String,
        /// The state-dict key.
        key: String,
        /// What is wrong.
        why: String,
    },
    /// OUT_DIR exists and holds files; migrate never overwrites without --force.
    #[error(
        "{dir}: exists and is not empty ({first}); refusing to overwrite (pass --force to replace migrate's files)"
    )]
    OutDirNotEmpty {
        /// The output folder.
        dir: String,
        /// One file found there.
        first: String,
    },
    /// Creating OUT_DIR or writing the report failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

impl MigrateError {
    /// The file the error names, if any.
    pub fn file(&self) -> Option<&str> {
        use MigrateError as E;
        match self {
            E::Ckpt(_) => None,
            E::ConfigNotFound { checkpoint } => Some(checkpoint),
            E::UnknownRelease { file, .. }
            | E::AlreadyCurrent { file, .. }
            | E::NotATracker { file, .. }
            | E::NoTemplate { file, .. }
            | E::NotMigratable { file, .. }
            | E::NoCounterpart { file, .. }
            | E::Malformed { file, .. }
            | E::RobotDiffers { file, .. }
            | E::StateDict { file, .. } => Some(file),
            E::OutDirNotEmpty { dir, .. } => Some(dir),
            E::Io { path, .. } => Some(path),
        }
    }

    /// The config or state-dict key the error names, if any.
    pub fn key(&self) -> Option<&str> {
        use MigrateError as E;
        match self {
            E::AlreadyCurrent { key, .. }
            | E::NotATracker { key, .. }
            | E::NotMigratable { key, .. }
            | E::NoCounterpart { key, .. }
            | E::Malformed { key, .. }
            | E::RobotDiffers { key, .. }
            | E::StateDict { key, .. } => Some(key),
            _ => None,
        }
    }

    /// A stable name of the variant, for `--json` (`migrate.not_a_tracker`).
    pub fn kind(&self) -> &'static str {
        use MigrateError as E;
        match self {
            E::Ckpt(_) => "ckpt",
            E::ConfigNotFound { .. } => "config_not_found",
            E::UnknownRelease { .. } => "unknown_release",
            E::AlreadyCurrent { .. } => "already_current",
            E::NotATracker { .. } => "not_a_tracker",
            E::NoTemplate { .. } => "no_template",
            E::NotMigratable { .. } => "not_migratable",
            E::NoCounterpart { .. } => "no_counterpart",
            E::Malformed { .. } => "malformed",
            E::RobotDiffers { .. } => "robot_differs",
            E::StateDict { .. } => "state_dict",
            E::OutDirNotEmpty { .. } => "out_dir_not_empty",
            E::Io { .. } => "io",
        }
    }
}
