//! The one error type of `pmstate-policy`. Every message names the file,
//! the config path (`agent.model.actor.mu_model.layers.0`), the class, the
//! field or the observation key at fault.

/// What can stop a policy from loading or running.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// Reading the checkpoint or the configs file failed.
    #[error(transparent)]
    Ckpt(#[from] pmstate_ckpt::CkptError),
    /// No configs file given and none next to the checkpoint.
    #[error("{checkpoint}: no resolved_configs_inference.pt or resolved_configs.pt next to it; pass the configs file")]
    ConfigNotFound {
        /// The checkpoint.
        checkpoint: String,
    },
    /// The config tree has no model config where one is expected.
    #[error("{file}: no model config at {path}")]
    NoModelConfig {
        /// The configs file.
        file: String,
        /// The dotted path looked at (`agent.model`).
        path: String,
    },
    /// A model family this crate does not build (transformer, FSQ autoencoder, ...).
    #[error("{path}: {class} is not supported (supported: {})", supported.join(", "))]
    UnsupportedClass {
        /// Config path of the module.
        path: String,
        /// Its `_target_` (or config class).
        class: String,
        /// What is supported there.
        supported: Vec<&'static str>,
    },
    /// A config field this crate does not understand holds a non-default value.
    #[error("{path}: {class}.{field} = {value} is not supported (only its default, or leaving it out)")]
    UnsupportedField {
        /// Config path of the object.
        path: String,
        /// Its class.
        class: String,
        /// The field.
        field: String,
        /// The value found, in short form.
        value: String,
    },
    /// A config field is missing or has the wrong type or value.
    #[error("{path}.{field}: {reason}")]
    BadField {
        /// Config path of the object.
        path: String,
        /// The field.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// An activation name `get_activation_func` would reject.
    #[error("{path}: activation {name:?} is not one ProtoMotions accepts (tanh, relu, elu, gelu, identity, silu, mish, any case)")]
    UnknownActivation {
        /// Config path of the field.
        path: String,
        /// The name found.
        name: String,
    },
    /// The checkpoint lacks a tensor the config requires.
    #[error("{file}: no tensor {key} (required by {path})")]
    MissingWeight {
        /// The checkpoint.
        file: String,
        /// The state-dict key.
        key: String,
        /// Config path of the module that needs it.
        path: String,
    },
    /// A checkpoint tensor has a shape the config does not allow.
    #[error("{file}: {key} has shape {got:?}, expected {expected}")]
    WeightShape {
        /// The checkpoint.
        file: String,
        /// The state-dict key.
        key: String,
        /// The shape found.
        got: Vec<usize>,
        /// What the config implies.
        expected: String,
    },
    /// A module reads a key nothing provides, or two modules disagree about widths.
    #[error("{path}: {reason}")]
    Graph {
        /// Config path of the module.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// An observation is missing.
    #[error("missing observation {key} (width {})", width_text(*width))]
    MissingObs {
        /// The key.
        key: String,
        /// Its expected width, when the checkpoint determines it.
        width: Option<usize>,
    },
    /// An observation nothing reads.
    #[error("unexpected observation {key}: the model's in_keys are {}", expected.join(", "))]
    ExtraObs {
        /// The key.
        key: String,
        /// The keys the model takes.
        expected: Vec<String>,
    },
    /// An observation with the wrong shape or dtype.
    #[error("observation {key}: {reason}")]
    BadObs {
        /// The key.
        key: String,
        /// What is wrong (names the expected width).
        reason: String,
    },
    /// A module operation cannot apply to the tensor it gets.
    #[error("{path}: module operation {index} ({op}): {reason}")]
    ModuleOp {
        /// Config path of the module.
        path: String,
        /// Index in `module_operations`.
        index: usize,
        /// The operation.
        op: String,
        /// What is wrong.
        reason: String,
    },
    /// A normalizer could not be built or applied.
    #[error("{path}: {source}")]
    Norm {
        /// The normalizer's state-dict prefix or config path.
        path: String,
        /// The normalizer's error.
        source: Box<pmstate_norm::NormError>,
    },
    /// The discriminator was asked for on a model without one.
    #[error("{class} has no discriminator (only AMP models do)")]
    NoDiscriminator {
        /// The model class.
        class: String,
    },
    /// candle failed.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
}

fn width_text(w: Option<usize>) -> String {
    match w {
        Some(w) => w.to_string(),
        None => "not determined by the checkpoint".into(),
    }
}

/// Result alias of this crate.
pub type Result<T, E = PolicyError> = std::result::Result<T, E>;
