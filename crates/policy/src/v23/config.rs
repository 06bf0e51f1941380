//! v2.3's model configs, read from the resolved Hydra tree
//! (`agent.config.model` of `config.yaml`) into typed specs.
//!
//! v2.3 builds every module with `hydra.utils.instantiate(cfg)`: the
//! `_target_` names the class, `num_in`/`num_out` sit beside it, and the
//! class reads its settings from `config`. Each class is mapped here to the
//! spec this crate builds; a `_target_` outside the list is refused naming
//! it and the classes that are read.

use serde_json::Value;

use crate::activation::Activation;
use crate::config::{LayerConfig, NormSettings, Number};
use crate::error::{PolicyError, Result};
use crate::module_ops::{ModuleOp, ReshapeDim};
use crate::problem::FieldProblem;

/// v2.3's class paths.
pub mod class {
    /// The PPO model (the motion tracker).
    pub const PPO_MODEL: &str = "protomotions.agents.ppo.model.PPOModel";
    /// Its actor: `tanh(mu_model(obs))` with a fixed log-std.
    pub const PPO_ACTOR: &str = "protomotions.agents.ppo.model.PPOActor";
    /// MaskedMimic's model (a VAE whose prior is a Transformer).
    pub const VAE_MODEL: &str = "protomotions.agents.masked_mimic.model.VaeDeterministicOutputModel";
    /// A VAE's encoder or prior: trunk, then mu and logvar heads.
    pub const VAE_MODULE: &str = "protomotions.agents.masked_mimic.model.VaeModule";
    /// Input models concatenated, then a trunk MLP.
    pub const MULTI_HEADED_MLP: &str = "protomotions.agents.common.mlp.MultiHeadedMLP";
    /// Tokens through `nn.TransformerEncoder`, token 0 out.
    pub const TRANSFORMER: &str = "protomotions.agents.common.transformer.Transformer";
    /// A plain MLP.
    pub const MLP: &str = "protomotions.agents.common.mlp.MLP";
    /// A normalizer, then an MLP.
    pub const MLP_WITH_NORM: &str = "protomotions.agents.common.mlp.MLP_WithNorm";
    /// `nn.Flatten`, then a normalizer.
    pub const FLATTEN: &str = "protomotions.agents.common.common.Flatten";
}

/// Every class this module reads, for refusals.
pub const READ_CLASSES: &[&str] = &[
    class::PPO_MODEL,
    class::PPO_ACTOR,
    class::VAE_MODEL,
    class::VAE_MODULE,
    class::MULTI_HEADED_MLP,
    class::TRANSFORMER,
    class::MLP,
    class::MLP_WITH_NORM,
    class::FLATTEN,
];

/// A node of the resolved tree with its dotted path, for errors.
#[derive(Clone, Copy)]
pub(crate) struct J<'a> {
    pub v: &'a Value,
    pub path: &'a str,
}

fn kind(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("{b}"),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("\"{}\"", s.chars().take(40).collect::<String>()),
        Value::Array(a) => format!("a list of {}", a.len()),
        Value::Object(_) => "a mapping".into(),
    }
}

impl<'a> J<'a> {
    fn field(&self, name: &str) -> Option<&'a Value> {
        self.v.get(name).filter(|v| !v.is_null())
    }

    fn need(&self, name: &str, class: &str) -> Result<&'a Value> {
        self.field(name).ok_or_else(|| PolicyError::MissingField {
            path: self.path.to_owned(),
            class: short(class).to_owned(),
            field: name.to_owned(),
        })
    }

    fn type_err(&self, name: &str, expected: &'static str, found: &Value) -> PolicyError {
        PolicyError::FieldType { path: self.path.to_owned(), field: name.to_owned(), expected, found: kind(found) }
    }

    pub(crate) fn string(&self, name: &str, class: &str) -> Result<&'a str> {
        let v = self.need(name, class)?;
        v.as_str().ok_or_else(|| self.type_err(name, "a string", v))
    }

    fn opt_string(&self, name: &str) -> Result<Option<&'a str>> {
        match self.field(name) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| self.type_err(name, "a string or null", v)),
        }
    }

    fn usize(&self, name: &str, class: &str) -> Result<usize> {
        let v = self.need(name, class)?;
        v.as_u64()
            .and_then(|u| usize::try_from(u).ok())
            .filter(|&u| u > 0)
            .ok_or_else(|| self.type_err(name, "a positive int", v))
    }

    fn f64(&self, name: &str, class: &str) -> Result<f64> {
        let v = self.need(name, class)?;
        v.as_f64().ok_or_else(|| self.type_err(name, "a number", v))
    }

    fn bool_or(&self, name: &str, default: bool) -> Result<bool> {
        match self.field(name) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.type_err(name, "a bool", v)),
        }
    }
}

/// The class name without its module, as errors name config classes.
fn short(class: &str) -> &str {
    class.rsplit('.').next().unwrap_or(class)
}

/// The `_target_` of a node, checked against the classes allowed there.
fn target<'a>(j: J<'a>, allowed: &[&'static str]) -> Result<&'static str> {
    let t = j.string("_target_", "instantiated module")?;
    allowed.iter().copied().find(|a| *a == t).ok_or_else(|| PolicyError::UnsupportedClass {
        path: j.path.to_owned(),
        class: t.to_owned(),
        supported: allowed.to_vec(),
    })
}

/// A hidden-layer list (`config.layers`).
fn layers(j: J<'_>, class: &str) -> Result<Vec<LayerConfig>> {
    let v = j.need("layers", class)?;
    let items = v.as_array().ok_or_else(|| j.type_err("layers", "a list of layers", v))?;
    items
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let path = format!("{}.layers.{i}", j.path);
            let lj = J { v: l, path: &path };
            let act = lj.string("activation", "layer")?;
            Ok(LayerConfig {
                units: lj.usize("units", "layer")?,
                activation: Activation::parse(act, &format!("{path}.activation"))?,
                use_layer_norm: lj.bool_or("use_layer_norm", false)?,
            })
        })
        .collect()
}

/// `normalize_obs` and `norm_clamp_value` (v2.3's `NormObsBase`: no EMA).
fn norm(j: J<'_>) -> Result<NormSettings> {
    let normalize_obs = j.bool_or("normalize_obs", false)?;
    let clamp = match j.field("norm_clamp_value") {
        None => None,
        Some(v) => Some(match (v.as_i64(), v.as_f64()) {
            (Some(i), _) => Number::Int(i),
            (None, Some(f)) => Number::Float(f),
            _ => return Err(j.type_err("norm_clamp_value", "a number or null", v)),
        }),
    };
    if let Some(c) = clamp.filter(|c| c.as_f64() <= 0.0) {
        return Err(PolicyError::BadField {
            path: j.path.to_owned(),
            field: "norm_clamp_value".into(),
            problem: FieldProblem::ClampNotPositive { value: c.to_string() },
        });
    }
    Ok(NormSettings { normalize_obs, clamp, ema_decay: None })
}

/// A plain `MLP` (`num_in` where the config gives it; the trunk of a
/// `MultiHeadedMLP` gets its width from its inputs).
#[derive(Debug, Clone)]
pub struct MlpSpec {
    /// Config path.
    pub path: String,
    /// `num_in`, when given.
    pub num_in: Option<usize>,
    /// `num_out`.
    pub num_out: usize,
    /// `config.layers`.
    pub layers: Vec<LayerConfig>,
}

impl MlpSpec {
    pub(crate) fn read(j: J<'_>) -> Result<Self> {
        target(j, &[class::MLP])?;
        let cpath = format!("{}.config", j.path);
        let c = J { v: j.need("config", class::MLP)?, path: &cpath };
        Ok(MlpSpec {
            path: j.path.to_owned(),
            num_in: j.field("num_in").map(|_| j.usize("num_in", class::MLP)).transpose()?,
            num_out: j.usize("num_out", class::MLP)?,
            layers: layers(c, class::MLP)?,
        })
    }
}

/// What an input model is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum InputKind {
    /// `Flatten`: `nn.Flatten`, then the normalizer.
    Flatten,
    /// `MLP_WithNorm`: the normalizer, then an MLP.
    MlpWithNorm,
}

impl InputKind {
    /// The class's name.
    pub fn name(self) -> &'static str {
        match self {
            InputKind::Flatten => "Flatten",
            InputKind::MlpWithNorm => "MLP_WithNorm",
        }
    }
}

/// One operation a v2.3 `Transformer` applies to an input before it
/// becomes tokens (`config.operations`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenOp {
    /// A shape operation (`reshape`, `permute`, `squeeze`, `unsqueeze`, `expand`).
    Shape(ModuleOp),
    /// `encode`: the input model on the tensor.
    Encode,
}

impl TokenOp {
    /// The operation's `type`, as the config names it.
    pub fn name(&self) -> &'static str {
        match self {
            TokenOp::Encode => "encode",
            TokenOp::Shape(ModuleOp::Reshape(_)) => "reshape",
            TokenOp::Shape(ModuleOp::Permute(_)) => "permute",
            TokenOp::Shape(ModuleOp::Squeeze(_)) => "squeeze",
            TokenOp::Shape(ModuleOp::Unsqueeze(_)) => "unsqueeze",
            TokenOp::Shape(ModuleOp::Expand(_)) => "expand",
            TokenOp::Shape(op) => op.name(),
        }
    }
}

/// The operation types read; v2.3's others (`positional_encoding`,
/// `mask_multiply`, `mask_multiply_concat`, `concat_obs`) are refused by
/// name: no published v2.3 model uses them.
pub const READ_OPS: &[&str] = &["reshape", "permute", "squeeze", "unsqueeze", "expand", "encode"];

fn ints(j: J<'_>, name: &str) -> Result<Vec<i64>> {
    let v = j.need(name, "operation")?;
    let items = v.as_array().ok_or_else(|| j.type_err(name, "a list of ints", v))?;
    items.iter().map(|x| x.as_i64().ok_or_else(|| j.type_err(name, "a list of ints", v))).collect()
}

fn token_op(j: J<'_>) -> Result<TokenOp> {
    let ty = j.string("type", "operation")?;
    let int = |name: &str| -> Result<i64> {
        let v = j.need(name, "operation")?;
        v.as_i64().ok_or_else(|| j.type_err(name, "an int", v))
    };
    Ok(match ty {
        "encode" => TokenOp::Encode,
        "reshape" => {
            let v = j.need("new_shape", "operation")?;
            let items = v.as_array().ok_or_else(|| j.type_err("new_shape", "a list", v))?;
            let dims = items
                .iter()
                .enumerate()
                .map(|(i, x)| match (x.as_i64(), x.as_str()) {
                    (Some(n), _) => Ok(ReshapeDim::Size(n)),
                    // v2.3 replaces the string "batch_size" at index 0 only
                    (None, Some("batch_size")) if i == 0 => Ok(ReshapeDim::Batch("batch_size".into())),
                    _ => Err(PolicyError::BadField {
                        path: j.path.to_owned(),
                        field: "new_shape".into(),
                        problem: FieldProblem::ReshapeElement { index: i, found: kind(x) },
                    }),
                })
                .collect::<Result<Vec<_>>>()?;
            TokenOp::Shape(ModuleOp::Reshape(dims))
        }
        "permute" => TokenOp::Shape(ModuleOp::Permute(ints(j, "new_order")?)),
        "squeeze" => TokenOp::Shape(ModuleOp::Squeeze(int("squeeze_dim")?)),
        "unsqueeze" => TokenOp::Shape(ModuleOp::Unsqueeze(int("unsqueeze_dim")?)),
        "expand" => TokenOp::Shape(ModuleOp::Expand(ints(j, "expand_shape")?)),
        other => {
            return Err(PolicyError::UnsupportedClass {
                path: j.path.to_owned(),
                class: format!("operation type {other}"),
                supported: READ_OPS.to_vec(),
            })
        }
    })
}

/// An input model of a `MultiHeadedMLP` or a `Transformer` (`Flatten` or
/// `MLP_WithNorm`): it reads `obs_key`.
#[derive(Debug, Clone)]
pub struct InputModel {
    /// Its name among the input models (the state dict's `input_models.<name>`).
    pub name: String,
    /// Config path.
    pub path: String,
    /// Which class.
    pub kind: InputKind,
    /// The observation it reads.
    pub obs_key: String,
    /// `num_in` (the normalizer's width).
    pub num_in: usize,
    /// `num_out`.
    pub num_out: usize,
    /// The normalizer's settings.
    pub norm: NormSettings,
    /// `MLP_WithNorm`'s layers (empty for `Flatten`).
    pub layers: Vec<LayerConfig>,
    /// A Transformer input's mask observation (`mask_key`: nonzero = valid).
    pub mask_key: Option<String>,
    /// A Transformer input's operations; `None`: the input model on the
    /// observation, one token.
    pub operations: Option<Vec<TokenOp>>,
}

impl InputModel {
    fn read(name: &str, j: J<'_>) -> Result<Self> {
        let t = target(j, &[class::FLATTEN, class::MLP_WITH_NORM])?;
        let cpath = format!("{}.config", j.path);
        let c = J { v: j.need("config", t)?, path: &cpath };
        let kind = if t == class::FLATTEN { InputKind::Flatten } else { InputKind::MlpWithNorm };
        let operations = match c.field("operations") {
            None => None,
            Some(v) => {
                let items = v.as_array().ok_or_else(|| c.type_err("operations", "a list", v))?;
                Some(
                    items
                        .iter()
                        .enumerate()
                        .map(|(i, o)| token_op(J { v: o, path: &format!("{cpath}.operations.{i}") }))
                        .collect::<Result<Vec<_>>>()?,
                )
            }
        };
        Ok(InputModel {
            name: name.to_owned(),
            path: j.path.to_owned(),
            kind,
            obs_key: c.string("obs_key", t)?.to_owned(),
            num_in: j.usize("num_in", t)?,
            num_out: j.usize("num_out", t)?,
            norm: norm(c)?,
            layers: if kind == InputKind::MlpWithNorm { layers(c, t)? } else { Vec::new() },
            mask_key: c.opt_string("mask_key")?.map(str::to_owned),
            operations,
        })
    }
}

fn input_models(j: J<'_>, class: &str) -> Result<Vec<InputModel>> {
    let v = j.need("input_models", class)?;
    let map = v.as_object().ok_or_else(|| j.type_err("input_models", "a mapping", v))?;
    map.iter()
        .map(|(name, m)| InputModel::read(name, J { v: m, path: &format!("{}.input_models.{name}", j.path) }))
        .collect()
}

/// `MultiHeadedMLP`: each input model's output concatenated (in the
/// config's order), then the trunk.
#[derive(Debug, Clone)]
pub struct MultiHeadedSpec {
    /// Config path.
    pub path: String,
    /// The input models.
    pub inputs: Vec<InputModel>,
    /// The trunk.
    pub trunk: MlpSpec,
}

/// v2.3's `Transformer`: each input model makes one token (`[B, d]`) or
/// several (`[B, T, d]` after its operations); the tokens go through a
/// post-norm `nn.TransformerEncoder`; token 0 is the output, then the
/// optional output model.
#[derive(Debug, Clone)]
pub struct TransformerSpec23 {
    /// Config path.
    pub path: String,
    /// `latent_dim` (`d_model`).
    pub latent_dim: usize,
    /// `num_heads`.
    pub heads: usize,
    /// `ff_size`.
    pub ff: usize,
    /// `num_layers`.
    pub layers: usize,
    /// `activation` (the feed-forward's).
    pub activation: Activation,
    /// The input models.
    pub inputs: Vec<InputModel>,
    /// `output_model`.
    pub output: Option<MlpSpec>,
}

/// A trunk: what a `PPOActor`'s `mu_model`, a critic or a VAE module's
/// `trunk` may be.
#[derive(Debug, Clone)]
pub enum TrunkSpec {
    /// `MultiHeadedMLP`.
    MultiHeaded(MultiHeadedSpec),
    /// `Transformer`.
    Transformer(TransformerSpec23),
}

impl TrunkSpec {
    pub(crate) fn read(j: J<'_>) -> Result<Self> {
        let t = target(j, &[class::MULTI_HEADED_MLP, class::TRANSFORMER])?;
        let cpath = format!("{}.config", j.path);
        let c = J { v: j.need("config", t)?, path: &cpath };
        if t == class::MULTI_HEADED_MLP {
            let trunk = MlpSpec::read(J { v: c.need("trunk", t)?, path: &format!("{cpath}.trunk") })?;
            return Ok(TrunkSpec::MultiHeaded(MultiHeadedSpec {
                path: j.path.to_owned(),
                inputs: input_models(c, t)?,
                trunk,
            }));
        }
        let latent_dim = c.usize("latent_dim", t)?;
        let token = c.usize("transformer_token_size", t)?;
        if token != latent_dim {
            return Err(PolicyError::BadField {
                path: cpath.clone(),
                field: "transformer_token_size".into(),
                problem: FieldProblem::Mismatch { value: token, other: "latent_dim", other_value: latent_dim },
            });
        }
        let output = c.field("output_model").map(|v| MlpSpec::read(J { v, path: &format!("{cpath}.output_model") }));
        Ok(TrunkSpec::Transformer(TransformerSpec23 {
            path: j.path.to_owned(),
            latent_dim,
            heads: c.usize("num_heads", t)?,
            ff: c.usize("ff_size", t)?,
            layers: c.usize("num_layers", t)?,
            activation: Activation::parse(c.string("activation", t)?, &format!("{cpath}.activation"))?,
            inputs: input_models(c, t)?,
            output: output.transpose()?,
        }))
    }

    /// Config path.
    pub fn path(&self) -> &str {
        match self {
            TrunkSpec::MultiHeaded(m) => &m.path,
            TrunkSpec::Transformer(t) => &t.path,
        }
    }

    /// The input models.
    pub fn inputs(&self) -> &[InputModel] {
        match self {
            TrunkSpec::MultiHeaded(m) => &m.inputs,
            TrunkSpec::Transformer(t) => &t.inputs,
        }
    }
}

/// v2.3's `PPOModel`: `_actor` (`tanh(mu_model)`, fixed log-std) and `_critic`.
#[derive(Debug, Clone)]
pub struct PpoSpec {
    /// `actor.config.actor_logstd`.
    pub actor_logstd: f64,
    /// `actor.num_out`.
    pub num_actions: usize,
    /// `actor.config.mu_model`.
    pub mu: TrunkSpec,
    /// `critic`.
    pub critic: TrunkSpec,
}

/// A VAE module (`VaeModule`): its trunk, then mu and logvar heads.
#[derive(Debug, Clone)]
pub struct VaeModuleSpec {
    /// Config path.
    pub path: String,
    /// `config.trunk`.
    pub trunk: TrunkSpec,
    /// `config.mu_head`.
    pub mu_head: MlpSpec,
    /// `config.logvar_head`.
    pub logvar_head: MlpSpec,
}

impl VaeModuleSpec {
    fn read(j: J<'_>) -> Result<Self> {
        let t = target(j, &[class::VAE_MODULE])?;
        let cpath = format!("{}.config", j.path);
        let c = J { v: j.need("config", t)?, path: &cpath };
        Ok(VaeModuleSpec {
            path: j.path.to_owned(),
            trunk: TrunkSpec::read(J { v: c.need("trunk", t)?, path: &format!("{cpath}.trunk") })?,
            mu_head: MlpSpec::read(J { v: c.need("mu_head", t)?, path: &format!("{cpath}.mu_head") })?,
            logvar_head: MlpSpec::read(J { v: c.need("logvar_head", t)?, path: &format!("{cpath}.logvar_head") })?,
        })
    }
}

/// v2.3's `VaeDeterministicOutputModel` (MaskedMimic): inference runs the
/// prior, draws `z = mu + exp(logvar / 2) * vae_noise`, and the trunk
/// reads `z` as `vae_latent`.
#[derive(Debug, Clone)]
pub struct VaeSpec {
    /// `config.vae_latent_dim`.
    pub latent_dim: usize,
    /// `config.trunk` (a `MultiHeadedMLP`).
    pub trunk: MultiHeadedSpec,
    /// `config.prior`.
    pub prior: VaeModuleSpec,
    /// `config.encoder` (training only: read for the description).
    pub encoder: VaeModuleSpec,
}

/// A v2.3 model config.
#[derive(Debug, Clone)]
pub enum V23Spec {
    /// `PPOModel` (the motion tracker).
    Ppo(Box<PpoSpec>),
    /// `VaeDeterministicOutputModel` (MaskedMimic).
    Vae(Box<VaeSpec>),
}

/// The config path of the model in a v2.3 `config.yaml`.
pub const MODEL_KEY: &str = "agent.config.model";

impl V23Spec {
    /// Reads the resolved model subtree (`agent.config.model`).
    pub fn read(model: &Value) -> Result<Self> {
        let j = J { v: model, path: MODEL_KEY };
        let t = target(j, &[class::PPO_MODEL, class::VAE_MODEL])?;
        let cpath = format!("{MODEL_KEY}.config");
        let c = J { v: j.need("config", t)?, path: &cpath };
        if t == class::PPO_MODEL {
            let apath = format!("{cpath}.actor");
            let a = J { v: c.need("actor", t)?, path: &apath };
            target(a, &[class::PPO_ACTOR])?;
            let acpath = format!("{apath}.config");
            let ac = J { v: a.need("config", class::PPO_ACTOR)?, path: &acpath };
            return Ok(V23Spec::Ppo(Box::new(PpoSpec {
                actor_logstd: ac.f64("actor_logstd", class::PPO_ACTOR)?,
                num_actions: a.usize("num_out", class::PPO_ACTOR)?,
                mu: TrunkSpec::read(J {
                    v: ac.need("mu_model", class::PPO_ACTOR)?,
                    path: &format!("{acpath}.mu_model"),
                })?,
                critic: TrunkSpec::read(J { v: c.need("critic", t)?, path: &format!("{cpath}.critic") })?,
            })));
        }
        let trunk = match TrunkSpec::read(J { v: c.need("trunk", t)?, path: &format!("{cpath}.trunk") })? {
            TrunkSpec::MultiHeaded(m) => m,
            TrunkSpec::Transformer(tr) => {
                return Err(PolicyError::UnsupportedClass {
                    path: tr.path,
                    class: class::TRANSFORMER.into(),
                    supported: vec![class::MULTI_HEADED_MLP],
                })
            }
        };
        Ok(V23Spec::Vae(Box::new(VaeSpec {
            latent_dim: c.usize("vae_latent_dim", t)?,
            trunk,
            prior: VaeModuleSpec::read(J { v: c.need("prior", t)?, path: &format!("{cpath}.prior") })?,
            encoder: VaeModuleSpec::read(J { v: c.need("encoder", t)?, path: &format!("{cpath}.encoder") })?,
        })))
    }

    /// The model class.
    pub fn class(&self) -> &'static str {
        match self {
            V23Spec::Ppo(_) => class::PPO_MODEL,
            V23Spec::Vae(_) => class::VAE_MODEL,
        }
    }
}
