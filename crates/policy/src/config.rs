//! Typed model configs, parsed from a resolved-configs tree with strict
//! checks, or built in Rust for [`crate::Policy::from_parts`].
//!
//! Modules are chosen the way ProtoMotions chooses them, by their config's
//! `_target_` (`get_class(cfg._target_)(config=cfg)`), and module
//! operations by their config class (`isinstance`). Every field of every
//! object is accounted for: the ones the forward uses are parsed, the
//! training-only ones listed per class are skipped, and any other field
//! (from a newer ProtoMotions, or a custom subclass) must be absent or
//! neutral (`None`, `False`, empty, `""`), else loading refuses with
//! [`PolicyError::UnsupportedField`] naming the class and the field.

use pmstate_ckpt::Node;
use serde::Serialize;

use crate::activation::Activation;
use crate::config_object::Obj;
use crate::error::{PolicyError, Result};
use crate::module_ops::ModuleOp;
use crate::problem::{FieldProblem, FsqKeyRole};

/// `_target_` of a PPO model.
pub const PPO_MODEL: &str = "protomotions.agents.ppo.model.PPOModel";
/// `_target_` of an AMP model.
pub const AMP_MODEL: &str = "protomotions.agents.amp.model.AMPModel";
/// `_target_` of the PPO actor.
pub const PPO_ACTOR: &str = "protomotions.agents.ppo.model.PPOActor";
/// `_target_` of an MLP over concatenated inputs.
pub const MLP_WITH_CONCAT: &str = "protomotions.agents.common.mlp.MLPWithConcat";
/// `_target_` of an observation processor (normalizer and module operations, no MLP).
pub const OBS_PROCESSOR: &str = "protomotions.agents.common.common.ObsProcessor";
/// `_target_` of a container running its models in order.
pub const MODULE_CONTAINER: &str = "protomotions.agents.common.common.ModuleContainer";
/// `_target_` of the AMP discriminator (a container).
pub const DISCRIMINATOR: &str = "protomotions.agents.amp.model.Discriminator";
/// `_target_` of the finite-scalar-quantized autoencoder (FSQ trackers' `mu_model`).
pub const FSQ_AUTOENCODER: &str = "protomotions.agents.common.fsq.FSQAutoEncoder";

/// `_target_` of ProtoMotions' transformer over tokens (MaskedMimic's prior).
pub const TRANSFORMER: &str = "protomotions.agents.common.transformer.Transformer";
/// `_target_` of the MaskedMimic VAE student ([`crate::masked_mimic`]).
pub const MASKED_MIMIC_MODEL: &str = "protomotions.agents.supervised.masked_mimic_model.MaskedMimicModel";

/// Model families [`crate::Policy`] builds (MaskedMimic has its own type,
/// [`crate::masked_mimic::MaskedMimic`]: [`crate::model_target`] tells which to load).
pub const SUPPORTED_MODELS: [&str; 2] = [PPO_MODEL, AMP_MODEL];
/// Modules built here (actor `mu_model`, critic, discriminator parts).
pub const SUPPORTED_MODULES: [&str; 6] =
    [MLP_WITH_CONCAT, OBS_PROCESSOR, MODULE_CONTAINER, DISCRIMINATOR, FSQ_AUTOENCODER, TRANSFORMER];

/// The whole model: `agent.model` of a resolved-configs file.
#[derive(Debug, Clone, Serialize)]
pub struct ModelConfig {
    /// PPO or AMP.
    pub family: Family,
    /// The config's `in_keys` (may list keys no network reads, quirk 15).
    pub in_keys: Vec<String>,
    /// The actor.
    pub actor: ActorConfig,
    /// The critic (writes `value`).
    pub critic: ModuleConfig,
    /// AMP only: the discriminator (writes `disc_logits`) and its critic (writes `disc_value`).
    pub amp: Option<AmpConfig>,
}

/// Which model class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Family {
    /// `PPOModel`: actor and critic.
    Ppo,
    /// `AMPModel`: actor, critic, discriminator, discriminator critic.
    Amp,
}

impl Family {
    /// The model's `_target_`.
    pub fn target(self) -> &'static str {
        match self {
            Family::Ppo => PPO_MODEL,
            Family::Amp => AMP_MODEL,
        }
    }
}

/// The AMP parts.
#[derive(Debug, Clone, Serialize)]
pub struct AmpConfig {
    /// `discriminator` (a container; its output key is `disc_logits`).
    pub discriminator: ModuleConfig,
    /// `disc_critic` (its output key is `disc_value`).
    pub disc_critic: ModuleConfig,
}

/// `PPOActorConfig`.
#[derive(Debug, Clone, Serialize)]
pub struct ActorConfig {
    /// The key `mu_model` writes the mean action to.
    pub mu_key: String,
    /// Size of `logstd`.
    pub num_out: usize,
    /// Initial (and, when not learnable, effective) log std.
    pub actor_logstd: f64,
    /// Whether the checkpoint's logstd is trained (else the config's value wins when they differ).
    pub learnable_std: bool,
    /// The network computing the mean.
    pub mu_model: ModuleConfig,
}

/// A TensorDict module.
#[derive(Debug, Clone, Serialize)]
pub enum ModuleConfig {
    /// `MLPWithConcat`.
    Mlp(MlpConfig),
    /// `ObsProcessor`.
    ObsProcessor(ObsProcessorConfig),
    /// `ModuleContainer` or `Discriminator`: models run in order on one TensorDict.
    Container(ContainerConfig),
    /// `FSQAutoEncoder`: encoder, finite scalar quantizer, decoder.
    Fsq(Box<FsqConfig>),
    /// `Transformer`: tokens and masks through a `TransformerEncoder`, token 0 out.
    Transformer(Box<TransformerConfig>),
}

/// `TransformerConfig` (`agents/common/transformer.py`).
#[derive(Debug, Clone, Serialize)]
pub struct TransformerConfig {
    /// Its in_keys: tokens (`[B, d]` or `[B, S, d]`) and mask keys.
    pub in_keys: Vec<String>,
    /// `out_keys[0]`: token 0 of the output, after `output_activation`.
    pub out_key: String,
    /// `input_and_mask_mapping`: token key -> mask key (nonzero = valid), in config order.
    pub masks: Vec<(String, String)>,
    /// `latent_dim`: the token width.
    pub latent_dim: usize,
    /// `num_heads`.
    pub num_heads: usize,
    /// `ff_size`.
    pub ff_size: usize,
    /// `num_layers`.
    pub num_layers: usize,
    /// `activation` of the feed-forward.
    pub activation: Activation,
    /// `output_activation`, applied to token 0.
    pub output_activation: Option<Activation>,
}

impl TransformerConfig {
    /// The in_keys that are tokens (not masks), in order (`_token_input_keys`).
    pub fn token_keys(&self) -> Vec<&String> {
        self.in_keys.iter().filter(|k| !self.masks.iter().any(|(_, m)| m == *k)).collect()
    }
}

impl ModuleConfig {
    /// The keys it reads from outside (a container's: its own `in_keys`).
    pub fn in_keys(&self) -> &[String] {
        match self {
            ModuleConfig::Mlp(m) => &m.in_keys,
            ModuleConfig::ObsProcessor(o) => &o.in_keys,
            ModuleConfig::Container(c) => &c.in_keys,
            ModuleConfig::Fsq(f) => &f.in_keys,
            ModuleConfig::Transformer(t) => &t.in_keys,
        }
    }

    /// Its `out_keys` as the config lists them (a leaf's: its one key).
    pub fn out_keys(&self) -> &[String] {
        match self {
            ModuleConfig::Mlp(m) => std::slice::from_ref(&m.out_key),
            ModuleConfig::ObsProcessor(o) => std::slice::from_ref(&o.out_key),
            ModuleConfig::Container(c) => &c.out_keys,
            ModuleConfig::Fsq(f) => f.decoder.out_keys(),
            ModuleConfig::Transformer(t) => std::slice::from_ref(&t.out_key),
        }
    }

    /// The key it writes last (`out_keys[0]`; a container's last model's).
    pub fn out_key(&self) -> &str {
        match self {
            ModuleConfig::Mlp(m) => &m.out_key,
            ModuleConfig::ObsProcessor(o) => &o.out_key,
            ModuleConfig::Container(c) => c.models.last().map_or("", |m| m.out_key()),
            ModuleConfig::Fsq(f) => f.decoder.out_key(),
            ModuleConfig::Transformer(t) => &t.out_key,
        }
    }
}

/// A normalizer's settings (`NormObsBaseConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct NormSettings {
    /// `normalize_obs`.
    pub normalize_obs: bool,
    /// `norm_clamp_value`: ProtoMotions keeps ints as ints (`5` vs `5.0`).
    pub clamp: Option<Number>,
    /// `norm_ema_decay` (`None`: Welford); training only.
    pub ema_decay: Option<f64>,
}

impl Default for NormSettings {
    /// The dataclass defaults: off, clamp 5.0, EMA 0.999.
    fn default() -> Self {
        NormSettings { normalize_obs: false, clamp: Some(Number::Float(5.0)), ema_decay: Some(0.999) }
    }
}

/// An int or a float, as the config holds it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Number {
    /// A Python int.
    Int(i64),
    /// A Python float.
    Float(f64),
}

impl Number {
    /// The value as f64.
    pub fn as_f64(self) -> f64 {
        match self {
            Number::Int(i) => i as f64,
            Number::Float(f) => f,
        }
    }
}

impl std::fmt::Display for Number {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Number::Int(i) => write!(f, "{i}"),
            // a float keeps its point, as Python prints it: `5.0`, not `5`
            Number::Float(x) if x.is_finite() && x.fract() == 0.0 && x.abs() < 1e16 => write!(f, "{x:.1}"),
            Number::Float(x) => write!(f, "{x}"),
        }
    }
}

/// `MLPLayerConfig`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LayerConfig {
    /// Output width of the Linear.
    pub units: usize,
    /// Activation after it.
    pub activation: Activation,
    /// A LayerNorm between the Linear and the activation; honoured on the first layer only (quirk 1).
    pub use_layer_norm: bool,
}

/// `MLPWithConcatConfig`.
#[derive(Debug, Clone, Serialize)]
pub struct MlpConfig {
    /// Inputs, concatenated in this order on the last dim.
    pub in_keys: Vec<String>,
    /// `out_keys[0]`.
    pub out_key: String,
    /// Normalizer settings.
    pub norm: NormSettings,
    /// Hidden layers.
    pub layers: Vec<LayerConfig>,
    /// Width of the final Linear.
    pub num_out: usize,
    /// Applied after the whole module-operation sequence.
    pub output_activation: Option<Activation>,
    /// Operations; `Forward` runs normalizer and MLP.
    pub module_operations: Vec<ModuleOp>,
}

/// `ObsProcessorConfig`.
#[derive(Debug, Clone, Serialize)]
pub struct ObsProcessorConfig {
    /// Inputs, concatenated.
    pub in_keys: Vec<String>,
    /// `out_keys[0]`.
    pub out_key: String,
    /// Normalizer settings.
    pub norm: NormSettings,
    /// Operations (default empty: a passthrough, quirk 3).
    pub module_operations: Vec<ModuleOp>,
}

/// `ModuleContainerConfig` / `DiscriminatorConfig`.
#[derive(Debug, Clone, Serialize)]
pub struct ContainerConfig {
    /// Its in_keys.
    pub in_keys: Vec<String>,
    /// Its out_keys.
    pub out_keys: Vec<String>,
    /// The models, run in order.
    pub models: Vec<ModuleConfig>,
}

/// `FSQAutoEncoderConfig`: `AutoEncoder.forward` runs the encoder, bounds
/// and rounds `encoder_out_keys[0]` to codes, writes them to `latent_key`
/// and runs the decoder on the same TensorDict.
#[derive(Debug, Clone, Serialize)]
pub struct FsqConfig {
    /// What `AutoEncoder.__init__` computes: the encoder's in_keys, then the
    /// decoder's that are not the latent.
    pub in_keys: Vec<String>,
    /// The encoder.
    pub encoder: ModuleConfig,
    /// The decoder (reads the codes under `latent_key`).
    pub decoder: ModuleConfig,
    /// `latent_key` (here always the encoder's output key: the codes replace it).
    pub latent_key: String,
    /// `num_fsq_levels`: odd, at least 3.
    pub num_fsq_levels: usize,
    /// `num_fsq_scalars`: the encoder's output width.
    pub num_fsq_scalars: usize,
}

// ------------------------------------------------------------------ parsing

impl Obj<'_> {
    fn number(&self, field: &str, default: Option<Number>) -> Result<Option<Number>> {
        match self.get(field) {
            None => Ok(default),
            Some(Node::None) => Ok(None),
            Some(Node::Int(i)) => Ok(Some(Number::Int(*i))),
            Some(Node::Float(f)) => Ok(Some(Number::Float(*f))),
            Some(other) => Err(self.wrong_type(field, "a number or None", other)),
        }
    }
}

impl ModelConfig {
    /// Parses the model config object `node` (found at config path `path`,
    /// usually `agent.model`).
    pub fn from_node(node: &Node, path: &str) -> Result<Self> {
        let o = Obj::new(node, path)?;
        let target = o.string("_target_")?;
        let family = match target.as_str() {
            PPO_MODEL => Family::Ppo,
            AMP_MODEL => Family::Amp,
            _ => {
                return Err(PolicyError::UnsupportedClass {
                    path: path.to_owned(),
                    class: target,
                    supported: SUPPORTED_MODELS.to_vec(),
                })
            }
        };
        let in_keys = o.strings("in_keys")?;
        o.get("out_keys");
        let actor = ActorConfig::from_node(o.req("actor")?, &o.sub("actor"))?;
        let critic = ModuleConfig::from_node(o.req("critic")?, &o.sub("critic"))?;
        let amp = match family {
            Family::Ppo => None,
            Family::Amp => Some(AmpConfig {
                discriminator: ModuleConfig::from_node(o.req("discriminator")?, &o.sub("discriminator"))?,
                disc_critic: ModuleConfig::from_node(o.req("disc_critic")?, &o.sub("disc_critic"))?,
            }),
        };
        o.finish()?;
        Ok(ModelConfig { family, in_keys, actor, critic, amp })
    }
}

impl ActorConfig {
    fn from_node(node: &Node, path: &str) -> Result<Self> {
        let o = Obj::new(node, path)?;
        let target = o.string("_target_")?;
        if target != PPO_ACTOR {
            return Err(PolicyError::UnsupportedClass {
                path: path.to_owned(),
                class: target,
                supported: vec![PPO_ACTOR],
            });
        }
        let mu_key = o.string("mu_key")?;
        o.get("in_keys");
        o.get("out_keys");
        let num_out = o.count("num_out")?;
        let actor_logstd = match o.number("actor_logstd", Some(Number::Float(-2.9)))? {
            Some(n) => n.as_f64(),
            None => return Err(o.wrong_type("actor_logstd", "a float", &Node::None)),
        };
        let learnable_std = o.bool_or("learnable_std", false)?;
        let mu_model = ModuleConfig::from_node(o.req("mu_model")?, &o.sub("mu_model"))?;
        o.finish()?;
        Ok(ActorConfig { mu_key, num_out, actor_logstd, learnable_std, mu_model })
    }
}

impl ModuleConfig {
    /// Parses one TensorDict module config, dispatching on its `_target_`.
    pub fn from_node(node: &Node, path: &str) -> Result<Self> {
        let o = Obj::new(node, path)?;
        let target = o.string("_target_")?;
        let module = match target.as_str() {
            MLP_WITH_CONCAT => ModuleConfig::Mlp(MlpConfig::parse(&o)?),
            OBS_PROCESSOR => ModuleConfig::ObsProcessor(ObsProcessorConfig::parse(&o)?),
            MODULE_CONTAINER | DISCRIMINATOR => ModuleConfig::Container(ContainerConfig::parse(&o)?),
            FSQ_AUTOENCODER => ModuleConfig::Fsq(Box::new(FsqConfig::parse(&o)?)),
            TRANSFORMER => ModuleConfig::Transformer(Box::new(TransformerConfig::parse(&o)?)),
            _ => {
                return Err(PolicyError::UnsupportedClass {
                    path: path.to_owned(),
                    class: target,
                    supported: SUPPORTED_MODULES.to_vec(),
                })
            }
        };
        o.finish()?;
        Ok(module)
    }
}

pub(crate) fn norm_settings(o: &Obj<'_>) -> Result<NormSettings> {
    let d = NormSettings::default();
    let normalize_obs = o.bool_or("normalize_obs", d.normalize_obs)?;
    let clamp = o.number("norm_clamp_value", d.clamp)?;
    let ema_decay = o.number("norm_ema_decay", d.ema_decay.map(Number::Float))?.map(Number::as_f64);
    Ok(NormSettings { normalize_obs, clamp, ema_decay })
}

pub(crate) fn module_ops(o: &Obj<'_>, default: Vec<ModuleOp>) -> Result<Vec<ModuleOp>> {
    if o.fields.and_then(|f| f.get("module_operations")).is_none() {
        o.get("module_operations");
        return Ok(default);
    }
    let list = o.list("module_operations")?;
    list.iter().enumerate().map(|(i, n)| ModuleOp::from_node(n, &format!("{}.module_operations.{i}", o.path))).collect()
}

impl MlpConfig {
    fn parse(o: &Obj<'_>) -> Result<Self> {
        Self::parse_with(o, None)
    }

    /// Parses an `MLPWithConcatConfig` whose `num_out` a parent resolves
    /// (the GPC prior's output head is saved with `num_out: 0` and gets the
    /// vocabulary size at construction): `num_out` is then read but `resolved` wins.
    pub(crate) fn parse_with(o: &Obj<'_>, resolved_num_out: Option<usize>) -> Result<Self> {
        let norm = norm_settings(o)?;
        let num_out = match resolved_num_out {
            Some(n) => {
                o.get("num_out");
                n
            }
            None => o.count("num_out")?,
        };
        let mut layers = Vec::new();
        for (i, n) in o.list("layers")?.iter().enumerate() {
            let lp = format!("{}.layers.{i}", o.path);
            let l = Obj::new(n, &lp)?;
            let units = match l.get("units") {
                None => 512,
                Some(_) => l.count("units")?,
            };
            let activation = match l.get("activation") {
                None => Activation::Relu,
                Some(Node::Str(s)) => Activation::parse(s, &format!("{lp}.activation"))?,
                Some(other) => {
                    return Err(PolicyError::UnknownActivation {
                        path: format!("{lp}.activation"),
                        name: other.to_string(),
                    })
                }
            };
            let use_layer_norm = l.bool_or("use_layer_norm", false)?;
            l.finish()?;
            layers.push(LayerConfig { units, activation, use_layer_norm });
        }
        let output_activation = match o.opt_string("output_activation")? {
            Some(s) => Some(Activation::parse(&s, &o.sub("output_activation"))?),
            None => None,
        };
        Ok(MlpConfig {
            in_keys: o.strings("in_keys")?,
            out_key: o.first_out_key()?,
            norm,
            layers,
            num_out,
            output_activation,
            module_operations: module_ops(o, vec![ModuleOp::Forward])?,
        })
    }
}

impl ObsProcessorConfig {
    fn parse(o: &Obj<'_>) -> Result<Self> {
        Ok(ObsProcessorConfig {
            in_keys: o.strings("in_keys")?,
            out_key: o.first_out_key()?,
            norm: norm_settings(o)?,
            module_operations: module_ops(o, vec![])?,
        })
    }
}

impl ContainerConfig {
    fn parse(o: &Obj<'_>) -> Result<Self> {
        let models = o
            .list("models")?
            .iter()
            .enumerate()
            .map(|(i, n)| ModuleConfig::from_node(n, &format!("{}.models.{i}", o.path)))
            .collect::<Result<Vec<_>>>()?;
        if models.is_empty() {
            return Err(o.bad("models", FieldProblem::Empty { needs: "the container computes nothing without one" }));
        }
        Ok(ContainerConfig { in_keys: o.strings("in_keys")?, out_keys: o.strings("out_keys")?, models })
    }
}

impl FsqConfig {
    fn parse(o: &Obj<'_>) -> Result<Self> {
        // AutoEncoder.__init__ recomputes in_keys and out_keys from its parts
        o.get("in_keys");
        o.get("out_keys");
        let encoder = ModuleConfig::from_node(o.req("encoder")?, &o.sub("encoder"))?;
        let decoder = ModuleConfig::from_node(o.req("decoder")?, &o.sub("decoder"))?;
        // `encoder_out_keys or encoder.out_keys`: [0] is what is quantized
        let encoder_out = match o.strings("encoder_out_keys")?.into_iter().next() {
            Some(k) => k,
            None => encoder.out_key().to_owned(),
        };
        if encoder_out != encoder.out_key() {
            return Err(
                o.bad("encoder_out_keys", FieldProblem::FsqKey { key: encoder_out, role: FsqKeyRole::EncoderOut })
            );
        }
        // decoder_out_keys only names the model's out_keys; the decoder writes its own
        let decoder_out = o.strings("decoder_out_keys")?;
        if let Some(k) = decoder_out.first() {
            if k != decoder.out_key() {
                return Err(
                    o.bad("decoder_out_keys", FieldProblem::FsqKey { key: k.clone(), role: FsqKeyRole::DecoderOut })
                );
            }
        }
        let latent_key = match o.get("latent_key") {
            None => "latent".to_owned(),
            Some(_) => o.string("latent_key")?,
        };
        if latent_key != encoder_out {
            // a separate latent key would leave the raw encoder output in the
            // TensorDict beside the codes: not implemented
            return Err(o.bad("latent_key", FieldProblem::FsqKey { key: latent_key, role: FsqKeyRole::Latent }));
        }
        let num_fsq_levels = match o.get("num_fsq_levels") {
            None => 7,
            Some(_) => o.count("num_fsq_levels")?,
        };
        if num_fsq_levels % 2 == 0 || num_fsq_levels < 3 {
            return Err(o.bad("num_fsq_levels", FieldProblem::FsqLevels { levels: num_fsq_levels }));
        }
        let num_fsq_scalars = match o.get("num_fsq_scalars") {
            None => 24,
            Some(_) => o.count("num_fsq_scalars")?,
        };
        let mut in_keys: Vec<String> = Vec::new();
        for k in encoder.in_keys().iter().chain(decoder.in_keys().iter().filter(|k| **k != latent_key)) {
            if !in_keys.contains(k) {
                in_keys.push(k.clone());
            }
        }
        Ok(FsqConfig { in_keys, encoder, decoder, latent_key, num_fsq_levels, num_fsq_scalars })
    }
}

impl TransformerConfig {
    fn parse(o: &Obj<'_>) -> Result<Self> {
        let in_keys = o.strings("in_keys")?;
        let out_key = o.first_out_key()?;
        let mut masks = Vec::new();
        if let Some(n) = o.get("input_and_mask_mapping") {
            match n {
                Node::None => {}
                Node::Dict(d) => {
                    for (k, v) in d.entries() {
                        match (k, v) {
                            (Node::Str(k), Node::Str(v)) => masks.push((k.clone(), v.clone())),
                            _ => return Err(o.wrong_type("input_and_mask_mapping", "a dict of key names", n)),
                        }
                    }
                }
                other => return Err(o.wrong_type("input_and_mask_mapping", "a dict of key names", other)),
            }
        }
        for (tok, mask) in &masks {
            for k in [tok, mask] {
                if !in_keys.contains(k) {
                    return Err(o.bad(
                        "input_and_mask_mapping",
                        FieldProblem::NotAnInKey { key: k.clone(), needs: "the mask mapping names in_keys" },
                    ));
                }
            }
        }
        let field = |name: &str, default: usize| -> Result<usize> {
            match o.get(name) {
                None => Ok(default),
                Some(_) => o.count(name),
            }
        };
        let latent_dim = field("latent_dim", 512)?;
        let token_size = field("transformer_token_size", 512)?;
        if token_size != latent_dim {
            // the tokens enter the encoder as they are: their width is latent_dim
            return Err(o.bad(
                "transformer_token_size",
                FieldProblem::Mismatch { value: token_size, other: "latent_dim", other_value: latent_dim },
            ));
        }
        let num_heads = field("num_heads", 4)?;
        if !latent_dim.is_multiple_of(num_heads) {
            return Err(o.bad(
                "num_heads",
                FieldProblem::Mismatch {
                    value: num_heads,
                    other: "latent_dim (must divide it)",
                    other_value: latent_dim,
                },
            ));
        }
        let ff_size = field("ff_size", 1024)?;
        let num_layers = field("num_layers", 4)?;
        // dropout: eval mode ignores it (the reference's model.eval())
        match o.number("dropout", None)? {
            Some(d) if !(0.0..=1.0).contains(&d.as_f64()) => {
                return Err(o.bad("dropout", FieldProblem::OutOfRange { value: d.to_string(), range: "[0, 1]" }))
            }
            _ => {}
        }
        let activation = match o.opt_string("activation")? {
            Some(a) => Activation::parse(&a, &o.sub("activation"))?,
            None => Activation::Relu,
        };
        let output_activation = match o.opt_string("output_activation")? {
            Some(a) => Some(Activation::parse(&a, &o.sub("output_activation"))?),
            None => None,
        };
        Ok(TransformerConfig {
            in_keys,
            out_key,
            masks,
            latent_dim,
            num_heads,
            ff_size,
            num_layers,
            activation,
            output_activation,
        })
    }
}
