//! The one error type of `pmstate-policy`. Every message names the file,
//! the config path (`agent.model.actor.mu_model.layers.0`), the class, the
//! field or the observation key at fault.

use pmstate_norm::Dims;

use crate::problem::{AttentionProblem, FieldProblem, GraphProblem, OpProblem};

/// What can stop a policy from loading or running.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// The GPC prior refuses its config, weights or inputs (`path`: the config path or input key).
    #[error("{path}: {problem}")]
    Prior {
        /// Config path (`agent.model.latent_decoder.module_config`) or input key (`prior_tokens`).
        path: String,
        /// What is wrong.
        problem: crate::gpc::problem::PriorProblem,
    },
    /// Reading the checkpoint or the configs file failed.
    #[error(transparent)]
    Ckpt(#[from] pmstate_ckpt::CkptError),
    /// A global the file should not hold: in the checkpoint, one torch's
    /// safe loader (`weights_only=True`) rejects; in the resolved configs,
    /// one outside ProtoMotions' and torch's namespaces and Python's inert
    /// builtins. Nothing is run either way, but such a file is not what
    /// ProtoMotions writes; `--allow-unsafe-globals` loads it anyway.
    #[error(
        "{file}: refusing {count} {which} global(s) ({first} at {key}); pass --allow-unsafe-globals to load it anyway"
    )]
    UnsafeGlobals {
        /// The file holding them.
        file: String,
        /// Which rule they break.
        which: GlobalRule,
        /// How many.
        count: usize,
        /// The first one, `module.name`.
        first: String,
        /// Its dotted key.
        key: String,
    },
    /// No configs file given and none next to the checkpoint.
    #[error(
        "{checkpoint}: no resolved_configs_inference.pt or resolved_configs.pt next to it (nor a v2.3 config.yaml); \
         pass the configs file with --config"
    )]
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
    /// A model class of an older ProtoMotions release whose module layout
    /// is not read yet (boxed: it names the file, class and layout).
    #[error(transparent)]
    OlderRelease(Box<OlderRelease>),
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
    /// A required config field is absent.
    #[error("{path}.{field}: missing (a {class} needs it)")]
    MissingField {
        /// Config path of the object.
        path: String,
        /// Its class, without the module (`MLPWithConcatConfig`).
        class: String,
        /// The field.
        field: String,
    },
    /// A config field (or a list element of one) has the wrong type.
    #[error("{path}.{field}: expected {expected}, found {found}")]
    FieldType {
        /// Config path of the object.
        path: String,
        /// The field.
        field: String,
        /// What the field must hold (`a positive int`, `a list of strings`).
        expected: &'static str,
        /// What it holds, in short form.
        found: String,
    },
    /// A config field has the right type but a value that cannot work.
    #[error("{path}.{field}: {problem}")]
    BadField {
        /// Config path of the object.
        path: String,
        /// The field.
        field: String,
        /// What is wrong.
        problem: FieldProblem,
    },
    /// An activation name `get_activation_func` would reject.
    #[error("{path}: activation \"{name}\" is not one ProtoMotions accepts (tanh, relu, elu, gelu, identity, silu, mish, any case)")]
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
    #[error("{file}: {key} has shape {}, expected {expected}", Dims(got))]
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
    /// A module reads a key that no observation and no earlier module provides.
    #[error("{path}: reads {key}, which no observation or earlier module provides")]
    UnprovidedKey {
        /// Config path of the module.
        path: String,
        /// The key.
        key: String,
    },
    /// Two modules disagree about widths, or a module computes nothing usable.
    #[error("{path}: {problem}")]
    Graph {
        /// Config path of the module.
        path: String,
        /// What is wrong.
        problem: GraphProblem,
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
    /// An observation that is not float32.
    #[error("observation {key}: dtype {dtype}, expected float32 {}", row_shape(*width))]
    ObsDtype {
        /// The key.
        key: String,
        /// Its dtype (`f64`, `i64`, ...).
        dtype: String,
        /// Its expected width, when the checkpoint determines it.
        width: Option<usize>,
    },
    /// An observation that is not 2-D.
    #[error("observation {key}: shape {}, expected {}", Dims(shape), row_shape(*width))]
    ObsRank {
        /// The key.
        key: String,
        /// Its shape.
        shape: Vec<usize>,
        /// Its expected width, when the checkpoint determines it.
        width: Option<usize>,
    },
    /// An observation whose width is not the one the checkpoint fixes.
    #[error("observation {key}: width {got}, expected {expected}")]
    ObsWidth {
        /// The key.
        key: String,
        /// Its width.
        got: usize,
        /// The width the checkpoint fixes.
        expected: usize,
    },
    /// Observations with different batch sizes.
    #[error("observation {key}: batch {got}, but other observations have {others}")]
    ObsBatch {
        /// The key.
        key: String,
        /// Its batch size.
        got: usize,
        /// The batch size of the observations before it.
        others: usize,
    },
    /// Observations one module concatenates whose widths do not add up to
    /// the width its checkpoint fixes.
    #[error(
        "observation {key}: {module} reads {} = {sum} columns, expected {total} in all",
        parts.iter().map(|(k, w)| format!("{k} {w}")).collect::<Vec<_>>().join(" + ")
    )]
    ObsGroupWidth {
        /// A key of the group whose own width is open (else the first).
        key: String,
        /// Config path of the module reading them.
        module: String,
        /// The keys with the widths given.
        parts: Vec<(String, usize)>,
        /// Their sum.
        sum: usize,
        /// What the checkpoint fixes.
        total: usize,
    },
    /// A module operation cannot apply to the tensor it gets.
    #[error("{path}: module operation {index} ({op}): {problem}")]
    ModuleOp {
        /// Config path of the module.
        path: String,
        /// Index in `module_operations`.
        index: usize,
        /// The operation's config class (`ModuleOperationReshapeConfig`).
        op: &'static str,
        /// What is wrong.
        problem: OpProblem,
    },
    /// A transformer refused its config or its tokens/masks.
    #[error("{path}: {problem}")]
    Attention {
        /// Config path of the transformer.
        path: String,
        /// What is wrong.
        problem: AttentionProblem,
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
    /// A configs file that could not be read (v2.3's `config.yaml`).
    #[error("{file}: {source}")]
    ConfigRead {
        /// The file.
        file: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A v2.3 Hydra `config.yaml` where resolved configs are needed: the
    /// PPO/AMP policy reader and the deploy pipeline read v3.0 and later;
    /// v2.3's models are read through the registry (`served::load`).
    #[error(
        "{file}: a ProtoMotions v2.3 Hydra config: this reads resolved configs (v3.0 and later); v2.3's models \
         are read by `policy describe|run` and `serve` (v2.3 published no robot tracker to deploy)"
    )]
    HydraConfig {
        /// The config file.
        file: String,
    },
    /// A Hydra `config.yaml` whose interpolations do not resolve.
    #[error(transparent)]
    Hydra(#[from] Box<pmstate_ckpt::hydra::HydraError>),
    /// NaN in an observation (or in its normalized form) that a module
    /// refuses: v2.3's `NormObsBase` raises `ValueError("NaN in obs")`.
    #[error("{module}: NaN in observation {key} (v2.3's NormObsBase refuses it)")]
    NanObservation {
        /// Config path of the module.
        module: String,
        /// The observation key.
        key: String,
    },
    /// candle failed.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// The CPU kernels cannot run with the instruction set asked for
    /// (`PMSTATE_CPU_ISA` names an unknown one or one this CPU lacks).
    #[error("CPU kernels: {0}")]
    Isa(#[from] pmstate_norm::IsaError),
    /// A description could not be written as JSON.
    #[error("describing the model as JSON: {0}")]
    Describe(#[source] serde_json::Error),
}

fn width_text(w: Option<usize>) -> String {
    match w {
        Some(w) => w.to_string(),
        None => "not determined by the checkpoint".into(),
    }
}

/// `[B, 1003]`, or `[B, D]` when the width is open.
fn row_shape(w: Option<usize>) -> String {
    match w {
        Some(w) => format!("[B, {w}]"),
        None => "[B, D]".into(),
    }
}

/// Result alias of this crate.
pub type Result<T, E = PolicyError> = std::result::Result<T, E>;

/// Which rule a refused global breaks ([`PolicyError::UnsafeGlobals`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GlobalRule {
    /// A checkpoint global torch's safe loader rejects ([`pmstate_ckpt::is_safe_global`]).
    Checkpoint,
    /// A resolved-configs global outside what configs hold ([`pmstate_ckpt::is_config_global`]).
    Config,
}

impl std::fmt::Display for GlobalRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            GlobalRule::Checkpoint => "unsafe",
            GlobalRule::Config => "foreign (not ProtoMotions', torch's or an inert builtin)",
        })
    }
}

/// A model class of an older ProtoMotions release whose module layout is
/// not read yet (the class moved or was rebuilt since):
/// [`PolicyError::OlderRelease`].
#[derive(Debug, thiserror::Error)]
#[error(
    "{file}: {path}: {class} is {}, {layout}: that release's layout is not read yet (supported: {})",
    class.rsplit('.').next().unwrap_or(class),
    supported.join(", ")
)]
pub struct OlderRelease {
    /// The resolved configs file.
    pub file: String,
    /// Config path of the model (`agent.model`).
    pub path: String,
    /// Its `_target_`.
    pub class: String,
    /// The release and layout met (`v3.0 layout (SequentialModule)`).
    pub layout: &'static str,
    /// The model classes that are read: today's.
    pub supported: Vec<&'static str>,
}
