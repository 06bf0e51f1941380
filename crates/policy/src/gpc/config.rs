//! `DiscreteAutoregressiveLatentPriorModelConfig` and its
//! `DiscreteAutoregressiveTransformerConfig`, parsed with the same strict
//! field accounting as the PPO/AMP configs ([`crate::config`]).

use pmstate_ckpt::Node;
use serde::Serialize;

use super::problem::PriorProblem;
use super::tokens::Tokenization;
use crate::activation::Activation;
use crate::config::{ContainerConfig, FsqConfig, MlpConfig, ModuleConfig, MLP_WITH_CONCAT, MODULE_CONTAINER};
use crate::config_object::Obj;
use crate::error::{PolicyError, Result};

/// `_target_` of the GPC prior model.
pub const LATENT_PRIOR_MODEL: &str =
    "protomotions.agents.supervised.latent_prior_model.DiscreteAutoregressiveLatentPriorModel";
/// `_target_` of its autoregressive transformer.
pub const AUTOREGRESSIVE_TRANSFORMER: &str =
    "protomotions.agents.common.autoregressive.DiscreteAutoregressiveTransformer";

/// The whole GPC prior model config (`agent.model`).
#[derive(Debug, Clone, Serialize)]
pub struct PriorModelConfig {
    /// The frozen FSQ autoencoder whose decoder turns codes into actions
    /// (`latent_decoder.module_config`; its encoder is training-only).
    pub decoder: FsqConfig,
    /// The transformer.
    pub prior: TransformerPriorConfig,
    /// The token packing, from the decoder's FSQ sizes and `fsq_scalars_per_prior_token`.
    #[serde(skip)]
    pub tokenization: Tokenization,
    /// `fsq_scalars_per_prior_token`.
    pub fsq_scalars_per_prior_token: usize,
    /// `temperature` of generation.
    pub temperature: f64,
    /// `top_p` of generation.
    pub top_p: f64,
    /// `rollout_action_std`: the noise of supervised rollouts, not applied here.
    pub rollout_action_std: f64,
}

/// `DiscreteAutoregressiveTransformerConfig`, with `num_tokens` and
/// `vocab_size` resolved as `resolve_discrete_autoregressive_config` does.
#[derive(Debug, Clone, Serialize)]
pub struct TransformerPriorConfig {
    /// `in_keys`.
    pub in_keys: Vec<String>,
    /// `token_key`: the teacher-forced tokens' key.
    pub token_key: String,
    /// `logits_key`.
    pub logits_key: String,
    /// `context_embedding_key`: what the context encoder writes.
    pub context_embedding_key: String,
    /// `token_embedding_key`: what the token encoder writes.
    pub token_embedding_key: String,
    /// `hidden_key`: what the output head reads.
    pub hidden_key: String,
    /// `context_encoder`.
    pub context_encoder: ModuleConfig,
    /// `token_encoder` (reads the one-hot tokens).
    pub token_encoder: ModuleConfig,
    /// `output_head` (its MLP writing `logits_key` gets `num_out = vocab`).
    pub output_head: ModuleConfig,
    /// `d_model`.
    pub d_model: usize,
    /// `num_heads`.
    pub num_heads: usize,
    /// `num_layers`.
    pub num_layers: usize,
    /// `ff_size`.
    pub ff_size: usize,
    /// `activation` of the feed-forward.
    pub activation: Activation,
    /// `max_seq_len`, or `num_tokens + 1` when the config holds 0.
    pub max_seq_len: usize,
}

fn prior_err(path: &str, problem: PriorProblem) -> PolicyError {
    PolicyError::Prior { path: path.to_owned(), problem }
}

fn float(o: &Obj<'_>, field: &str, default: f64) -> Result<f64> {
    match o.get(field) {
        None => Ok(default),
        Some(Node::Float(f)) => Ok(*f),
        Some(Node::Int(i)) => Ok(*i as f64),
        Some(other) => Err(o.wrong_type(field, "a number", other)),
    }
}

fn int_or(o: &Obj<'_>, field: &str, default: i64) -> Result<i64> {
    match o.get(field) {
        None => Ok(default),
        Some(Node::Int(i)) => Ok(*i),
        Some(other) => Err(o.wrong_type(field, "an int", other)),
    }
}

fn string_or(o: &Obj<'_>, field: &str, default: &str) -> Result<String> {
    match o.get(field) {
        None => Ok(default.to_owned()),
        Some(_) => o.string(field),
    }
}

impl PriorModelConfig {
    /// Parses the model config object `node` at config path `path` (`agent.model`).
    pub fn from_node(node: &Node, path: &str) -> Result<Self> {
        let o = Obj::new(node, path)?;
        let target = o.string("_target_")?;
        if target != LATENT_PRIOR_MODEL {
            return Err(PolicyError::UnsupportedClass {
                path: path.to_owned(),
                class: target,
                supported: vec![LATENT_PRIOR_MODEL],
            });
        }
        // recomputed by the model from its parts
        o.get("in_keys");
        o.get("out_keys");
        // training only
        o.get("optimizer");
        let decoder = parse_decoder(o.req("latent_decoder")?, &o.sub("latent_decoder"))?;
        let per_token = match o.get("fsq_scalars_per_prior_token") {
            None => 1,
            Some(_) => o.count("fsq_scalars_per_prior_token")?,
        };
        let tokenization =
            Tokenization::new(decoder.num_fsq_levels, decoder.num_fsq_scalars, per_token).ok_or_else(|| {
                let problem = if per_token == 0 || !decoder.num_fsq_scalars.is_multiple_of(per_token) {
                    PriorProblem::ScalarsPerToken { per_token, scalars: decoder.num_fsq_scalars }
                } else {
                    PriorProblem::VocabTooLarge { levels: decoder.num_fsq_levels, per_token }
                };
                prior_err(&o.sub("fsq_scalars_per_prior_token"), problem)
            })?;
        let temperature = float(&o, "temperature", 1.0)?;
        if temperature.is_nan() || temperature <= 0.0 || temperature.is_infinite() {
            return Err(prior_err(&o.sub("temperature"), PriorProblem::Temperature { value: temperature }));
        }
        let top_p = float(&o, "top_p", 0.9)?;
        if top_p.is_nan() {
            return Err(prior_err(&o.sub("top_p"), PriorProblem::TopP { value: top_p }));
        }
        let rollout_action_std = float(&o, "rollout_action_std", 1e-4)?;
        let prior = TransformerPriorConfig::parse(o.req("prior")?, &o.sub("prior"), &tokenization)?;
        o.finish()?;
        Ok(PriorModelConfig {
            decoder,
            prior,
            tokenization,
            fsq_scalars_per_prior_token: per_token,
            temperature,
            top_p,
            rollout_action_std,
        })
    }

    /// `prior_context_keys`: the prior's in_keys but its token key.
    pub fn context_keys(&self) -> Vec<String> {
        self.prior.in_keys.iter().filter(|k| **k != self.prior.token_key).cloned().collect()
    }
}

/// `PretrainedModelConfig` as an inference config holds it: the module's
/// config embedded, no checkpoint path.
fn parse_decoder(node: &Node, path: &str) -> Result<FsqConfig> {
    let o = Obj::new(node, path)?;
    let checkpoint_path = o.opt_string("checkpoint_path")?.unwrap_or_default();
    // how a module would be found in another checkpoint: unused with module_config
    for f in ["module_path", "module_config_path", "config_path", "state_dict_key", "strict", "freeze"] {
        o.get(f);
    }
    let module = match o.get("module_config") {
        None | Some(Node::None) => {
            return Err(prior_err(&o.sub("module_config"), PriorProblem::NoDecoderConfig { checkpoint_path }))
        }
        Some(n) => n,
    };
    if !checkpoint_path.is_empty() {
        return Err(prior_err(&o.sub("checkpoint_path"), PriorProblem::DecoderCheckpoint { checkpoint_path }));
    }
    let mpath = o.sub("module_config");
    let cfg = ModuleConfig::from_node(module, &mpath)?;
    o.finish()?;
    match cfg {
        ModuleConfig::Fsq(f) => Ok(*f),
        _ => {
            let class = Obj::new(module, &mpath)?.string("_target_")?;
            Err(prior_err(&mpath, PriorProblem::DecoderNotFsq { class }))
        }
    }
}

impl TransformerPriorConfig {
    fn parse(node: &Node, path: &str, tok: &Tokenization) -> Result<Self> {
        let o = Obj::new(node, path)?;
        let target = o.string("_target_")?;
        if target != AUTOREGRESSIVE_TRANSFORMER {
            return Err(PolicyError::UnsupportedClass {
                path: path.to_owned(),
                class: target,
                supported: vec![AUTOREGRESSIVE_TRANSFORMER],
            });
        }
        let token_key = string_or(&o, "token_key", "tokens")?;
        let logits_key = string_or(&o, "logits_key", "logits")?;
        let in_keys = o.strings("in_keys")?;
        o.get("out_keys");
        o.get("context_key");
        // generation's output names in the TensorDict: pmstate names its outputs itself
        o.get("generated_tokens_key");
        o.get("logprob_key");
        // training only (the model never applies it in eval)
        o.get("dropout");
        let context_embedding_key = string_or(&o, "context_embedding_key", "_ar_context_embedding")?;
        let token_embedding_key = string_or(&o, "token_embedding_key", "_ar_token_embedding")?;
        let hidden_key = string_or(&o, "hidden_key", "_ar_hidden")?;
        let context_encoder = ModuleConfig::from_node(o.req("context_encoder")?, &o.sub("context_encoder"))?;
        let token_encoder = ModuleConfig::from_node(o.req("token_encoder")?, &o.sub("token_encoder"))?;
        let output_head = parse_head(o.req("output_head")?, &o.sub("output_head"), &logits_key, tok.vocab)?;
        let d_model = o.count("d_model")?;
        let num_heads = o.count("num_heads")?;
        let num_layers = o.count("num_layers")?;
        let ff_size = o.count("ff_size")?;
        let activation = match o.get("activation") {
            None => Activation::Gelu,
            Some(_) => Activation::parse(&o.string("activation")?, &o.sub("activation"))?,
        };
        // num_tokens and vocab_size are resolved from the tokenization at construction
        o.get("num_tokens");
        o.get("vocab_size");
        let max_seq_len = match int_or(&o, "max_seq_len", 0)? {
            m if m <= 0 => tok.tokens + 1,
            m => usize::try_from(m).map_err(|_| o.wrong_type("max_seq_len", "a usize", &Node::Int(m)))?,
        };
        o.finish()?;
        if !in_keys.iter().any(|k| *k != token_key) {
            return Err(prior_err(&o.sub("in_keys"), PriorProblem::NoContextKey { in_keys, token_key }));
        }
        let check = |field: &'static str, expected: &str, role: &'static str, found: &str| {
            if expected == found {
                Ok(())
            } else {
                Err(prior_err(
                    path,
                    PriorProblem::KeyMismatch { field, expected: expected.to_owned(), role, found: found.to_owned() },
                ))
            }
        };
        check("context_embedding_key", &context_embedding_key, "writes", context_encoder.out_key())?;
        check("token_embedding_key", &token_embedding_key, "writes", token_encoder.out_key())?;
        check("logits_key", &logits_key, "writes", output_head.out_key())?;
        check("token_key", &token_key, "reads", token_encoder.in_keys().first().map_or("", String::as_str))?;
        check("hidden_key", &hidden_key, "reads", output_head.in_keys().first().map_or("", String::as_str))?;
        Ok(TransformerPriorConfig {
            in_keys,
            token_key,
            logits_key,
            context_embedding_key,
            token_embedding_key,
            hidden_key,
            context_encoder,
            token_encoder,
            output_head,
            d_model,
            num_heads,
            num_layers,
            ff_size,
            activation,
            max_seq_len,
        })
    }
}

/// The output head container, its MLPs writing exactly `[logits_key]`
/// resolved to `num_out = vocab` (`resolve_discrete_autoregressive_config`).
fn parse_head(node: &Node, path: &str, logits_key: &str, vocab: usize) -> Result<ModuleConfig> {
    let o = Obj::new(node, path)?;
    let target = o.string("_target_")?;
    if target != MODULE_CONTAINER {
        // no resolution outside a container's models: parse as is
        return ModuleConfig::from_node(node, path);
    }
    let mut models = Vec::new();
    for (i, m) in o.list("models")?.iter().enumerate() {
        let mpath = format!("{path}.models.{i}");
        let mo = Obj::new(m, &mpath)?;
        let resolves = mo.get("_target_").and_then(Node::as_str) == Some(MLP_WITH_CONCAT)
            && mo.strings("out_keys")? == [logits_key];
        if resolves {
            let c = MlpConfig::parse_with(&mo, Some(vocab))?;
            mo.finish()?;
            models.push(ModuleConfig::Mlp(c));
        } else {
            models.push(ModuleConfig::from_node(m, &mpath)?);
        }
    }
    if models.is_empty() {
        return Err(o.bad(
            "models",
            crate::problem::FieldProblem::Empty { needs: "the container computes nothing without one" },
        ));
    }
    let c = ContainerConfig { in_keys: o.strings("in_keys")?, out_keys: o.strings("out_keys")?, models };
    o.finish()?;
    Ok(ModuleConfig::Container(c))
}
