//! Hydra-dumped `config.yaml` files read with their OmegaConf interpolations
//! resolved the way OmegaConf 2.3 resolves them, with the resolvers
//! ProtoMotions v2.3 registers (`protomotions/utils/config_utils.py`).
//!
//! ProtoMotions publishes its pretrained models' configs unresolved: sizes
//! such as `num_in: ${eval:${len:${robot.trackable_bodies_subset}}+1}` only
//! exist after resolution, so a reader that stops at the YAML gets strings
//! where the models need integers. Python's `eval` is the resolver those
//! files lean on; here it is a small arithmetic evaluator that refuses
//! anything but literals and operators, so nothing in a file is executed.
//!
//! Typing follows the Python side: YAML scalars are typed as PyYAML's
//! SafeLoader types them with OmegaConf's extra float forms (`1e-3` is a
//! float, `yes` a bool); a whole-value `${a.b}` keeps the referenced node's
//! type (a subtree stays a subtree), a resolver keeps its result's type, and
//! text around an interpolation makes a string built with Python's `str()`.
//!
//! ```
//! let tree = pmstate_ckpt::hydra::resolve_yaml(
//!     "a: 3\nb:\n  c: ${eval:${a}*2}\n  d: x_${a}\n",
//!     "example.yaml",
//! )
//! .unwrap();
//! assert_eq!(tree["b"]["c"], 6);
//! assert_eq!(tree["b"]["d"], "x_3");
//! ```

mod eval;
mod grammar;
mod resolve;
mod value;
mod yaml;

use serde_json::Value as Json;

use resolve::Resolver;
use value::to_json;
use yaml::load_yaml;

/// Deepest nesting accepted anywhere: YAML containers, interpolations inside
/// interpolations, chains of references, expression parentheses. The v2.3
/// files nest about 12 deep; the cap bounds the recursion on hostile input.
pub const MAX_DEPTH: usize = 64;

/// Longest interpolation string (in chars) that is parsed; the v2.3 files'
/// longest is under 200.
pub const MAX_EXPRESSION_CHARS: usize = 4096;

/// Most interpolation strings evaluated for one file (each leaf is cached,
/// so this bounds the work on files whose subtrees reference each other).
pub const MAX_EVALUATIONS: usize = 1_000_000;

/// Longest expression, in tokens, that `eval` parses.
pub const MAX_EVAL_TOKENS: usize = 1024;

/// Why a Hydra config could not be read or resolved.
#[derive(Debug, thiserror::Error)]
pub enum HydraError {
    /// The text is not YAML this reader accepts.
    #[error("{file}: not readable YAML: {message}")]
    Yaml {
        /// The file named by the caller.
        file: String,
        /// What the YAML parser or the tree builder said.
        message: String,
    },
    /// One key's value could not be resolved.
    #[error("{file}: key `{key}`: {problem}")]
    Key {
        /// The file named by the caller.
        file: String,
        /// The dotted key being resolved when the problem was found.
        key: String,
        /// What went wrong.
        problem: Problem,
    },
}

impl HydraError {
    /// The dotted key at fault, when the problem belongs to one.
    pub fn key(&self) -> Option<&str> {
        match self {
            HydraError::Key { key, .. } => Some(key),
            HydraError::Yaml { .. } => None,
        }
    }

    /// The problem, when it belongs to a key.
    pub fn problem(&self) -> Option<&Problem> {
        match self {
            HydraError::Key { problem, .. } => Some(problem),
            HydraError::Yaml { .. } => None,
        }
    }
}

/// What went wrong while resolving one key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Problem {
    /// The interpolation text does not follow OmegaConf's grammar.
    #[error("cannot parse interpolation `{text}`: {reason}")]
    Grammar {
        /// The value's text.
        text: String,
        /// Where it stops making sense.
        reason: String,
    },
    /// `${a.b}` names a key that does not exist.
    #[error("interpolation target `{target}` not found")]
    NotFound {
        /// The target as written.
        target: String,
    },
    /// `${a.b}` names a mandatory value (`???`) nobody filled in.
    #[error("interpolation target `{target}` is a missing mandatory value (???)")]
    MissingValue {
        /// The target's dotted key.
        target: String,
    },
    /// Resolving the key needs its own value.
    #[error("interpolation cycle: {}", keys.join(" -> "))]
    Cycle {
        /// The keys around the cycle, first repeated last.
        keys: Vec<String>,
    },
    /// A resolver ProtoMotions v2.3 does not register, or that this reader
    /// refuses (`oc.env` reads the environment; the published files use none).
    #[error("resolver `{name}` is not supported")]
    UnknownResolver {
        /// The resolver's name.
        name: String,
    },
    /// A resolver got arguments Python would raise on.
    #[error("resolver `{name}`: {reason}")]
    Resolver {
        /// The resolver's name.
        name: String,
        /// Python's complaint, in words.
        reason: String,
    },
    /// An `eval` expression outside the arithmetic this reader evaluates.
    #[error("eval `{expr}` refused: {reason}")]
    EvalRefused {
        /// The expression.
        expr: String,
        /// What was found.
        reason: String,
    },
    /// An `eval` expression Python would raise on.
    #[error("eval `{expr}` failed: {reason}")]
    EvalFailed {
        /// The expression.
        expr: String,
        /// The failure (division by zero, an integer beyond 64 bits, ...).
        reason: String,
    },
    /// A value JSON cannot carry (an infinite or NaN float), or one this
    /// reader does not render into a string (a container inside text).
    #[error("{0}")]
    Unrepresentable(String),
    /// Nesting or size beyond the stated caps.
    #[error("beyond the limit: {0}")]
    Limit(String),
}

/// Reads a Hydra-dumped YAML file and returns it with every interpolation
/// resolved, as `OmegaConf.to_container(cfg, resolve=True)` would. `file`
/// only names the input in errors. A `???` left as a value (not referenced)
/// stays the string `"???"`, as OmegaConf leaves it.
pub fn resolve_yaml(text: &str, file: &str) -> Result<Json, HydraError> {
    let root = load_yaml(text, file)?;
    let mut r = Resolver::new(&root, file);
    let value = r.tree(&[], 0).map_err(|(key, problem)| HydraError::Key { file: file.to_string(), key, problem })?;
    to_json(&value).map_err(|(key, problem)| HydraError::Key { file: file.to_string(), key, problem })
}

/// Reads a Hydra-dumped YAML file and returns the subtree at the dotted
/// `key` (`agent.config.model`) with its interpolations resolved, as
/// OmegaConf resolves `OmegaConf.to_container(cfg.agent.config.model,
/// resolve=True)`: lazily, so a mandatory value (`???`) elsewhere in the
/// file that the subtree does not reference is no error (v2.3's MaskedMimic
/// leaves `motion_file` for its eval's command line). A key naming no
/// node is [`Problem::NotFound`].
pub fn resolve_yaml_at(text: &str, file: &str, key: &str) -> Result<Json, HydraError> {
    let root = load_yaml(text, file)?;
    let mut r = Resolver::new(&root, file);
    let path: Vec<String> = if key.is_empty() { Vec::new() } else { key.split('.').map(str::to_owned).collect() };
    let value = r.tree(&path, 0).map_err(|(key, problem)| HydraError::Key { file: file.to_string(), key, problem })?;
    to_json(&value).map_err(|(key, problem)| HydraError::Key { file: file.to_string(), key, problem })
}
