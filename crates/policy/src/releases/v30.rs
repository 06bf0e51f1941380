//! ProtoMotions v3.0's module tree (`agents/common/common.py` of that
//! release): `SequentialModule` (its `input_models` run in order, saved as
//! `sequential_models`), `MultiInputModule` and `MultiOutputModule` (their
//! `input_models` / `output_models` run in order, saved under the same
//! names), and `Flatten` (a normalizer, then `nn.Flatten`), around the
//! `MLPWithConcat` and `Transformer` that today's release still has.
//!
//! Each module is read as the [`ModuleConfig`] that computes the same (a
//! container as a `ModuleContainer`, a `Flatten` as an `ObsProcessor` that
//! normalizes), for the model's config and `describe`; the tree keeps
//! v3.0's child names, which its config paths and state-dict keys use.

use candle_core::Device;
use pmstate_ckpt::{Checkpoint, Node};

use crate::config::{
    module_ops, norm_settings, ContainerConfig, ModuleConfig, ObsProcessorConfig, MLP_WITH_CONCAT, TRANSFORMER,
};
use crate::config_object::Obj;
use crate::error::{PolicyError, Result};
use crate::module_ops::ModuleOp;
use crate::network::Network;
use crate::problem::FieldProblem;

/// `_target_` of v3.0's sequential container (`input_models`, saved as `sequential_models`).
pub const SEQUENTIAL_MODULE: &str = "protomotions.agents.common.common.SequentialModule";
/// `_target_` of v3.0's container of input heads (`input_models`).
pub const MULTI_INPUT_MODULE: &str = "protomotions.agents.common.common.MultiInputModule";
/// `_target_` of v3.0's container of output heads (`output_models`).
pub const MULTI_OUTPUT_MODULE: &str = "protomotions.agents.common.common.MultiOutputModule";
/// `_target_` of v3.0's normalize-and-flatten module.
pub const FLATTEN: &str = "protomotions.agents.common.common.Flatten";

/// The module classes of v3.0's layout read here.
pub const V30_MODULES: [&str; 6] =
    [SEQUENTIAL_MODULE, MULTI_INPUT_MODULE, MULTI_OUTPUT_MODULE, FLATTEN, MLP_WITH_CONCAT, TRANSFORMER];

/// One module of a v3.0 tree.
#[derive(Debug, Clone)]
pub enum V30Module {
    /// `SequentialModule`, `MultiInputModule` or `MultiOutputModule`: each
    /// runs its children in order on one TensorDict.
    Container {
        /// Config path.
        path: String,
        /// Its `in_keys`.
        in_keys: Vec<String>,
        /// Its `out_keys`.
        out_keys: Vec<String>,
        /// The children.
        children: Vec<V30Module>,
        /// Where the children are saved (`sequential_models`, `output_models`).
        state_field: &'static str,
    },
    /// A module today's classes compute: `MLPWithConcat`, `Transformer`, or
    /// a `Flatten` as a normalizing `ObsProcessor`.
    Module {
        /// Config path.
        path: String,
        /// What it computes.
        config: ModuleConfig,
    },
}

impl V30Module {
    /// Parses the v3.0 module config `node` at config path `path`.
    pub fn from_node(node: &Node, path: &str) -> Result<Self> {
        let o = Obj::new(node, path)?;
        let target = o.string("_target_")?;
        let (config_field, state_field) = match target.as_str() {
            SEQUENTIAL_MODULE => ("input_models", "sequential_models"),
            MULTI_INPUT_MODULE => ("input_models", "input_models"),
            MULTI_OUTPUT_MODULE => ("output_models", "output_models"),
            FLATTEN => return Ok(V30Module::Module { path: path.to_owned(), config: flatten(&o)? }),
            MLP_WITH_CONCAT | TRANSFORMER => {
                let mut config = ModuleConfig::from_node(node, path)?;
                super::welford(&mut config);
                return Ok(V30Module::Module { path: path.to_owned(), config });
            }
            _ => {
                return Err(PolicyError::UnsupportedClass {
                    path: path.to_owned(),
                    class: target,
                    supported: V30_MODULES.to_vec(),
                })
            }
        };
        let children = o
            .list(config_field)?
            .iter()
            .enumerate()
            .map(|(i, n)| V30Module::from_node(n, &format!("{path}.{config_field}.{i}")))
            .collect::<Result<Vec<_>>>()?;
        if children.is_empty() {
            return Err(
                o.bad(config_field, FieldProblem::Empty { needs: "the container computes nothing without one" })
            );
        }
        let in_keys = o.strings("in_keys")?;
        let out_keys = o.strings("out_keys")?;
        o.finish()?;
        Ok(V30Module::Container { path: path.to_owned(), in_keys, out_keys, children, state_field })
    }

    /// The module as today's config that computes the same.
    pub fn to_config(&self) -> ModuleConfig {
        match self {
            V30Module::Container { in_keys, out_keys, children, .. } => ModuleConfig::Container(ContainerConfig {
                in_keys: in_keys.clone(),
                out_keys: out_keys.clone(),
                models: children.iter().map(V30Module::to_config).collect(),
            }),
            V30Module::Module { config, .. } => config.clone(),
        }
    }

    /// Its config path.
    pub fn path(&self) -> &str {
        match self {
            V30Module::Container { path, .. } | V30Module::Module { path, .. } => path,
        }
    }

    /// Builds the module at state-dict path `module_path` (`_prior`), with
    /// the weights of the dict `dict` (`model`) of `ckpt`.
    pub fn load(&self, ckpt: &Checkpoint, dict: &str, module_path: &str, dev: &Device) -> Result<Network> {
        match self {
            V30Module::Container { path, in_keys, children, state_field, .. } => {
                let models = children
                    .iter()
                    .enumerate()
                    .map(|(j, c)| c.load(ckpt, dict, &format!("{module_path}.{state_field}.{j}"), dev))
                    .collect::<Result<Vec<_>>>()?;
                Ok(Network::Container { path: path.clone(), in_keys: in_keys.clone(), models })
            }
            V30Module::Module { path, config } => Network::load(config, ckpt, dict, module_path, path, dev),
        }
    }
}

/// `Flatten`: its inputs concatenated, the normalizer (when
/// `normalize_obs`), then `nn.Flatten` (from dim 1). Read with exactly one
/// `Forward`, as v3.0 builds it and every published config has it: on the
/// `[B, W]` rows that leaves, `nn.Flatten` changes nothing, so it is an
/// `ObsProcessor` that normalizes (with no operations v3.0 fails: it reads a
/// normalized output that was never made).
fn flatten(o: &Obj<'_>) -> Result<ModuleConfig> {
    let mut norm = norm_settings(o)?;
    norm.ema_decay = None;
    let ops = module_ops(o, vec![ModuleOp::Forward])?;
    if ops != [ModuleOp::Forward] {
        let found = if ops.is_empty() {
            "no operations".to_owned()
        } else {
            ops.iter().map(|op| op.name()).collect::<Vec<_>>().join(", ")
        };
        return Err(o.bad(
            "module_operations",
            FieldProblem::Operations { found, needs: "v3.0's Flatten is read with one ModuleOperationForwardConfig" },
        ));
    }
    let m = ModuleConfig::ObsProcessor(ObsProcessorConfig {
        in_keys: o.strings("in_keys")?,
        out_key: o.first_out_key()?,
        norm,
        module_operations: ops,
    });
    o.finish()?;
    Ok(m)
}
