//! ProtoMotions' GPC prior, `DiscreteAutoregressiveLatentPriorModel`
//! (`agents/supervised/latent_prior_model.py`), in eval mode.
//!
//! A context encoder (`MLPWithConcat` over the context observations) gives
//! one `d_model` vector, the first element of the sequence; each prior
//! token enters as its one-hot vector through the token encoder (a Linear
//! of `vocab x d_model`: computed here as the row of the weight, which is
//! the one-hot product exactly), learned positions are added, and a
//! post-norm `nn.TransformerEncoder` runs under `generate_causal_mask(T, 1)`
//! (the context attends to itself, token `i` to the context and tokens
//! `<= i`). The output head turns position `i` into the logits of token
//! `i` (position 0, the context, predicts the first token).
//!
//! Tokens are unpacked to FSQ indices ([`tokens::Tokenization`]), the
//! indices to codes (`index - levels // 2`, as `indices_to_codes`), and the
//! frozen FSQ decoder of the tracker turns the codes and its other inputs
//! into the action.
//!
//! Two modes: [`LatentPrior::teacher_forced`] (tokens given: logits of
//! every position and the action of those tokens; the parity path) and
//! [`LatentPrior::generate`] (tokens drawn one at a time with the config's
//! temperature and top-p, [`top_p`]).

pub mod config;
pub mod describe;
pub mod problem;
mod reference;
pub mod served;
pub mod tokens;
pub mod top_p;

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use pmstate_ckpt::Checkpoint;

use self::config::PriorModelConfig;
use self::problem::PriorProblem;
pub use self::reference::PriorReference;
use self::tokens::Tokenization;
use crate::error::{PolicyError, Result};
use crate::load::{AllowedGlobal, LoadOptions};
use crate::network::{Network, TensorMap, Trace};
use crate::obs_check::{check_obs, ObsKeys};
use crate::problem::GraphProblem;
use crate::shapes::Widths;
use crate::transformer::{AttentionMasks, TransformerEncoder, TransformerSpec};

/// The most elements of a one-hot token tensor built for a token encoder
/// that is not a plain table (2^26 f32: 256 MiB). The published prior's
/// encoder is a table and never builds one.
pub const MAX_ONE_HOT_ELEMENTS: usize = 1 << 26;

/// The most logits one call returns (`B x tokens x vocab` float32 values:
/// 2^28, 1 GiB). The published prior's 8 x 59049 logits per row make a
/// batch of 568 rows at most; a larger batch is refused before any work.
pub const MAX_LOGITS_ELEMENTS: usize = 1 << 28;

/// Most rows generated together position by position
/// ([`LatentPrior::generate`] on the CPU): enough to keep the products
/// batched.
const GENERATION_ROWS: usize = 64;

/// Most bytes of key/value cache one chunk of generated rows holds (fewer
/// rows per chunk when a row's cache is large, one at least): the
/// published prior's 64 rows take 42 MB (9 positions x 3072 floats x 6
/// layers a row).
const GENERATION_CACHE_BYTES: usize = 256 << 20;

/// How the token encoder turns tokens into embeddings.
#[derive(Debug, Clone)]
enum TokenEncoder {
    /// One Linear over the one-hot tokens: `weight[:, token] + bias`.
    Table {
        /// `weight.T`, `[vocab, d_model]`.
        table: Tensor,
        /// `[d_model]`.
        bias: Tensor,
    },
    /// Anything else: the one-hot tensor through the module.
    Module(Network),
}

/// A loaded GPC prior.
#[derive(Debug, Clone)]
pub struct LatentPrior {
    config: PriorModelConfig,
    context_encoder: Network,
    token_encoder: TokenEncoder,
    /// `_pos_emb[0]`, `[max_seq_len, d_model]`.
    positions: Tensor,
    transformer: TransformerEncoder,
    output_head: Network,
    /// The FSQ decoder (`latent_decoder.decoder`).
    decoder: Network,
    decoder_latent_key: String,
    widths: Widths,
    /// See [`MAX_LOGITS_ELEMENTS`].
    max_logits: usize,
    device: Device,
    checkpoint: String,
    config_file: Option<String>,
    allowed_globals: Vec<AllowedGlobal>,
}

/// What the teacher-forced forward returns.
#[derive(Debug, Clone)]
pub struct PriorOutputs {
    /// `[B, T, vocab]`: the logits of each token given the context and the tokens before it.
    pub logits: Tensor,
    /// `[B, A]`: the decoder's action for the tokens.
    pub mean_action: Tensor,
    /// `[B, T]` int64: the tokens (given, or drawn by [`LatentPrior::generate`]).
    pub tokens: Tensor,
    /// `[B, num_fsq_scalars]` f32: the FSQ codes the decoder read.
    pub latent_codes: Tensor,
    /// The context encoder's (first) normalizer output, when it normalizes.
    pub norm_obs: Option<Tensor>,
}

/// The intermediate tensors of a teacher-forced forward (for parity tests).
#[derive(Debug, Clone)]
pub struct PriorStages {
    /// `[B, d_model]`.
    pub context_embedding: Tensor,
    /// `[B, T, d_model]`.
    pub token_embedding: Tensor,
    /// `[B, T + 1, d_model]`: context and tokens, positions added.
    pub sequence: Tensor,
    /// Each layer's output, `[B, T + 1, d_model]`.
    pub layers: Vec<Tensor>,
    /// `[B, num_fsq_scalars]` int64.
    pub fsq_indices: Tensor,
    /// The outputs.
    pub outputs: PriorOutputs,
}

/// How [`LatentPrior::generate`] draws.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// Seed of the draws ([`top_p::draw`]: one per row and step).
    pub seed: u64,
    /// Softmax temperature (the config's by default).
    pub temperature: f64,
    /// Nucleus mass (the config's by default).
    pub top_p: f64,
}

/// Which draws one batch row of [`LatentPrior::generate_rows`] takes:
/// those of row `row` under `seed` ([`top_p::draw`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowDraw {
    /// The seed of the row's request.
    pub seed: u64,
    /// The row's index within its request.
    pub row: u64,
}

fn prior_err(path: &str, problem: PriorProblem) -> PolicyError {
    PolicyError::Prior { path: path.to_owned(), problem }
}

/// `generate_causal_mask(num_target, 1)`: `[S, S]` with `S = num_target + 1`,
/// `-inf` above the diagonal (the context prefix of one sees only itself,
/// which makes it the plain causal mask of `S`).
pub fn causal_mask(num_target: usize, dev: &Device) -> Result<Tensor> {
    let s = num_target + 1;
    let v: Vec<f32> = (0..s * s).map(|i| if i % s > i / s { f32::NEG_INFINITY } else { 0.0 }).collect();
    Ok(Tensor::from_vec(v, (s, s), dev)?)
}

/// Whether the configs file holds a GPC prior model config.
pub fn is_latent_prior(configs: &Checkpoint) -> bool {
    ["agent.model", "model"].iter().any(|k| {
        configs.get(&format!("{k}._target_")).and_then(|n| n.as_str()).is_some_and(|t| t == config::LATENT_PRIOR_MODEL)
    })
}

impl LatentPrior {
    /// Loads the prior of `checkpoint` with the resolved configs found as
    /// [`crate::Policy::load`] finds them, under the same rules for globals.
    pub fn load_with(
        checkpoint: impl AsRef<Path>,
        config: Option<&Path>,
        device: &Device,
        opts: &LoadOptions,
    ) -> Result<Self> {
        let o = crate::load::open_vetted(checkpoint.as_ref(), config, opts, |configs| {
            let (node, key) = crate::load::model_node(configs)?;
            PriorModelConfig::from_node(node, &key)
        })?;
        let mut p = Self::from_parts(o.model, &o.ckpt, device)?;
        p.config_file = Some(o.config_path.display().to_string());
        p.allowed_globals = o.allowed;
        Ok(p)
    }

    /// Builds the prior of `config` with the weights of `ckpt` (its `model`
    /// dict, or the root), on `dev`.
    pub fn from_parts(config: PriorModelConfig, ckpt: &Checkpoint, dev: &Device) -> Result<Self> {
        let dict = match ckpt.get("model") {
            Some(pmstate_ckpt::Node::Dict(_)) => "model",
            _ => "",
        };
        let base = "agent.model.prior";
        let pc = &config.prior;
        let context_encoder = Network::load(
            &pc.context_encoder,
            ckpt,
            dict,
            "prior._context_encoder",
            &format!("{base}.context_encoder"),
            dev,
        )?;
        let token_net = Network::load(
            &pc.token_encoder,
            ckpt,
            dict,
            "prior._token_encoder",
            &format!("{base}.token_encoder"),
            dev,
        )?;
        let output_head =
            Network::load(&pc.output_head, ckpt, dict, "prior._output_head", &format!("{base}.output_head"), dev)?;
        let dec_path = "agent.model.latent_decoder.module_config.decoder";
        let decoder = Network::load(&config.decoder.decoder, ckpt, dict, "latent_decoder.decoder", dec_path, dev)?;
        let spec = TransformerSpec {
            d_model: pc.d_model,
            heads: pc.num_heads,
            ff: pc.ff_size,
            layers: pc.num_layers,
            activation: pc.activation,
        };
        let transformer = TransformerEncoder::load(ckpt, dict, "prior._transformer", spec, base, dev)?;
        let pos_key = "prior._pos_emb";
        let pos = crate::mlp::load_f32(ckpt, dict, pos_key, base, dev)?;
        let needed = config.tokenization.tokens + 1;
        let positions = match pos.dims() {
            [1, l, d] if *d == pc.d_model && *l >= needed => pos.squeeze(0)?,
            s => {
                return Err(prior_err(
                    &format!("{base}._pos_emb"),
                    PriorProblem::Positions { shape: s.to_vec(), d_model: pc.d_model, needed },
                ))
            }
        };
        let token_encoder = table_encoder(&token_net, &pc.token_key).unwrap_or(TokenEncoder::Module(token_net));
        let widths = Widths::analyse(&[&context_encoder, &decoder]);
        // the context embedding, token embedding and logits widths
        let check = |what: &'static str, net: &Network, expected: usize| -> Result<()> {
            let w = Widths::analyse(&[net]);
            match w.known.get(net.out_key()) {
                Some(&got) if got != expected => Err(prior_err(base, PriorProblem::Width { what, got, expected })),
                _ => Ok(()),
            }
        };
        check("the context embedding", &context_encoder, pc.d_model)?;
        check("the logits", &output_head, config.tokenization.vocab)?;
        if let TokenEncoder::Table { table, .. } = &token_encoder {
            let (v, d) = table.dims2()?;
            if d != pc.d_model {
                return Err(prior_err(
                    base,
                    PriorProblem::Width { what: "the token embedding", got: d, expected: pc.d_model },
                ));
            }
            if v != config.tokenization.vocab {
                return Err(prior_err(
                    base,
                    PriorProblem::Width {
                        what: "the token encoder's input",
                        got: v,
                        expected: config.tokenization.vocab,
                    },
                ));
            }
        }
        Ok(LatentPrior {
            decoder_latent_key: config.decoder.latent_key.clone(),
            config,
            context_encoder,
            token_encoder,
            positions,
            transformer,
            output_head,
            decoder,
            widths,
            max_logits: MAX_LOGITS_ELEMENTS,
            device: dev.clone(),
            checkpoint: ckpt.path_str().to_owned(),
            config_file: None,
            allowed_globals: Vec::new(),
        })
    }

    /// The parsed config.
    pub fn config(&self) -> &PriorModelConfig {
        &self.config
    }

    /// The token packing.
    pub fn tokenization(&self) -> &Tokenization {
        &self.config.tokenization
    }

    /// The checkpoint it was loaded from.
    pub fn checkpoint_path(&self) -> &str {
        &self.checkpoint
    }

    /// The configs file, when loaded by [`LatentPrior::load_with`].
    pub fn config_path(&self) -> Option<&str> {
        self.config_file.as_deref()
    }

    /// Globals let through at load.
    pub fn allowed_globals(&self) -> &[AllowedGlobal] {
        &self.allowed_globals
    }

    /// The device it runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Widths the checkpoint determines.
    pub fn widths(&self) -> &Widths {
        &self.widths
    }

    /// The observation keys it reads (`get_inference_in_keys`: the context
    /// keys, then the decoder's other inputs), without the token key.
    pub fn obs_keys(&self) -> Vec<String> {
        let mut out = self.config.context_keys();
        for k in self.context_encoder.external_keys().into_iter().chain(self.decoder.external_keys()) {
            if k != self.decoder_latent_key && !out.contains(&k) {
                out.push(k);
            }
        }
        out
    }

    /// The key of the teacher-forced tokens (`prior.token_key`).
    pub fn token_key(&self) -> &str {
        &self.config.prior.token_key
    }

    /// Number of actions (the decoder's output width), when known.
    pub fn action_size(&self) -> Option<usize> {
        Widths::analyse(&[&self.decoder]).known.get(self.decoder.out_key()).copied()
    }

    /// The network parts, for descriptions: context encoder, output head, decoder.
    pub fn networks(&self) -> [&Network; 3] {
        [&self.context_encoder, &self.output_head, &self.decoder]
    }

    /// The transformer.
    pub fn transformer(&self) -> &TransformerEncoder {
        &self.transformer
    }

    /// Checks the observations (not the tokens): each needed key an f32
    /// `[B, D]` of one B, widths as the checkpoint requires, nothing else
    /// but the token key. Returns B.
    pub fn check_obs(&self, obs: &HashMap<String, Tensor>) -> Result<usize> {
        let required = self.obs_keys();
        let mut accepted = required.clone();
        accepted.push(self.token_key().to_owned());
        let keys = ObsKeys { accepted: &accepted, required: &required, optional: &[], known: &self.widths.known };
        check_obs(obs, &keys)
    }

    /// The tokens of `obs[token_key]` as rows, checked: int64 `[batch, T]`, each in `[0, vocab)`.
    fn check_tokens(&self, t: &Tensor, batch: usize) -> Result<Vec<Vec<i64>>> {
        let key = self.token_key();
        let tok = &self.config.tokenization;
        if t.dtype() != DType::I64 {
            return Err(prior_err(
                key,
                PriorProblem::TokensDtype { dtype: t.dtype().as_str().into(), tokens: tok.tokens },
            ));
        }
        if t.dims() != [batch, tok.tokens] {
            return Err(prior_err(
                key,
                PriorProblem::TokensShape { shape: t.dims().to_vec(), batch, tokens: tok.tokens },
            ));
        }
        let rows = t.to_device(&Device::Cpu)?.to_vec2::<i64>()?;
        for (r, row) in rows.iter().enumerate() {
            for (i, &v) in row.iter().enumerate() {
                if v < 0 || v as u64 >= tok.vocab as u64 {
                    return Err(prior_err(
                        key,
                        PriorProblem::TokenRange { row: r, index: i, value: v, vocab: tok.vocab },
                    ));
                }
            }
        }
        Ok(rows)
    }

    fn obs_map(&self, obs: &HashMap<String, Tensor>) -> Result<TensorMap> {
        obs.iter()
            .filter(|(k, _)| k.as_str() != self.token_key())
            .map(|(k, v)| Ok((k.clone(), v.to_device(&self.device)?)))
            .collect()
    }

    /// `encode_context`: `[B, d_model]` and the normalizer outputs.
    fn encode_context(&self, td: &mut TensorMap) -> Result<(Tensor, Trace)> {
        let mut trace = Trace::default();
        self.context_encoder.forward(td, &mut trace)?;
        let key = &self.config.prior.context_embedding_key;
        let c = td.get(key).cloned().ok_or_else(|| PolicyError::Graph {
            path: "agent.model.prior.context_encoder".into(),
            problem: GraphProblem::Unwritten { key: key.clone() },
        })?;
        Ok((c, trace))
    }

    /// `encode_tokens`: `[B, k, d_model]` for `[B, k]` rows of tokens (k may be 0).
    fn encode_tokens(&self, rows: &[Vec<i64>], k: usize) -> Result<Tensor> {
        let b = rows.len();
        let d = self.config.prior.d_model;
        if k == 0 {
            return Ok(Tensor::zeros((b, 0, d), DType::F32, &self.device)?);
        }
        let flat: Vec<u32> = rows.iter().flat_map(|r| r[..k].iter().map(|&t| t as u32)).collect();
        match &self.token_encoder {
            TokenEncoder::Table { table, bias } => {
                let ids = Tensor::from_vec(flat, b * k, &self.device)?;
                let e = table.index_select(&ids, 0)?.broadcast_add(bias)?;
                Ok(e.reshape((b, k, d))?)
            }
            TokenEncoder::Module(net) => {
                let v = self.config.tokenization.vocab;
                let n = b.checked_mul(k).and_then(|x| x.checked_mul(v)).filter(|&n| n <= MAX_ONE_HOT_ELEMENTS);
                let n = n.ok_or_else(|| {
                    prior_err(self.token_key(), PriorProblem::OneHotTooLarge { batch: b, tokens: k, vocab: v })
                })?;
                let mut one_hot = vec![0f32; n];
                for (i, &t) in flat.iter().enumerate() {
                    one_hot[i * v + t as usize] = 1.0;
                }
                let x = Tensor::from_vec(one_hot, (b, k, v), &self.device)?;
                let mut td = TensorMap::new();
                td.insert(self.config.prior.token_key.clone(), x);
                net.forward(&mut td, &mut Trace::default())?;
                let key = &self.config.prior.token_embedding_key;
                td.remove(key).ok_or_else(|| PolicyError::Graph {
                    path: "agent.model.prior.token_encoder".into(),
                    problem: GraphProblem::Unwritten { key: key.clone() },
                })
            }
        }
    }

    /// The sequence `[context, tokens] + positions` and the transformer's
    /// output after each layer.
    fn run(&self, context: &Tensor, token_emb: &Tensor) -> Result<(Tensor, Vec<Tensor>)> {
        let seq = Tensor::cat(&[&context.unsqueeze(1)?, token_emb], 1)?;
        let s = seq.dim(1)?;
        let seq = seq.broadcast_add(&self.positions.narrow(0, 0, s)?.unsqueeze(0)?)?.contiguous()?;
        let mask = causal_mask(s - 1, &self.device)?;
        let masks = AttentionMasks { additive: Some(&mask), key_padding: None };
        let layers = self.transformer.forward_each_layer(&seq, &masks)?;
        Ok((seq, layers))
    }

    /// `decode_logits` of `[B, k, d_model]` hidden states.
    fn decode_logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let mut td = TensorMap::new();
        td.insert(self.config.prior.hidden_key.clone(), hidden.contiguous()?);
        self.output_head.forward(&mut td, &mut Trace::default())?;
        let key = &self.config.prior.logits_key;
        td.remove(key).ok_or_else(|| PolicyError::Graph {
            path: "agent.model.prior.output_head".into(),
            problem: GraphProblem::Unwritten { key: key.clone() },
        })
    }

    /// `decode_latents`: tokens -> FSQ indices -> codes -> the decoder's action.
    fn decode(&self, td: &mut TensorMap, rows: &[Vec<i64>]) -> Result<(Tensor, Tensor, Tensor)> {
        let tok = &self.config.tokenization;
        let b = rows.len();
        let mut idx = Vec::with_capacity(b * tok.scalars);
        for r in rows {
            tok.unpack_row(r, &mut idx);
        }
        let half_width = (tok.levels / 2) as f32;
        // indices.float() - half_width: small integers, exact
        let codes: Vec<f32> = idx.iter().map(|&i| i as f32 - half_width).collect();
        let indices = Tensor::from_vec(idx, (b, tok.scalars), &self.device)?;
        let codes = Tensor::from_vec(codes, (b, tok.scalars), &self.device)?;
        td.insert(self.decoder_latent_key.clone(), codes.clone());
        self.decoder.forward(td, &mut Trace::default())?;
        let key = self.decoder.out_key();
        let action = td.get(key).cloned().ok_or_else(|| PolicyError::Graph {
            path: "agent.model.latent_decoder".into(),
            problem: GraphProblem::Unwritten { key: key.to_owned() },
        })?;
        Ok((action, codes, indices))
    }

    /// Teacher forcing with every stage kept: `obs` holds the observations
    /// and the tokens under the token key.
    pub fn teacher_forced_stages(&self, obs: &HashMap<String, Tensor>) -> Result<PriorStages> {
        let b = self.check_obs(obs)?;
        self.check_logits(b)?;
        let key = self.token_key();
        let tokens = self.config.tokenization.tokens;
        let t = obs.get(key).ok_or_else(|| prior_err(key, PriorProblem::NoTokens { tokens }))?;
        let rows = self.check_tokens(t, b)?;
        let mut td = self.obs_map(obs)?;
        let (context, trace) = self.encode_context(&mut td)?;
        let n = self.config.tokenization.tokens;
        let token_embedding = self.encode_tokens(&rows, n)?;
        let (sequence, layers) = self.run(&context, &token_embedding)?;
        let last = layers.last().cloned().unwrap_or_else(|| sequence.clone());
        let logits = self.decode_logits(&last.narrow(1, 0, n)?)?;
        let (mean_action, latent_codes, fsq_indices) = self.decode(&mut td, &rows)?;
        let norm_obs = trace.norm_outputs.into_iter().next().map(|(_, t)| t);
        Ok(PriorStages {
            context_embedding: context,
            token_embedding,
            sequence,
            layers,
            fsq_indices,
            outputs: PriorOutputs { logits, mean_action, tokens: t.clone(), latent_codes, norm_obs },
        })
    }

    /// Teacher-forced forward: the logits of the given tokens and their action.
    pub fn teacher_forced(&self, obs: &HashMap<String, Tensor>) -> Result<PriorOutputs> {
        Ok(self.teacher_forced_stages(obs)?.outputs)
    }

    /// Another limit on the logits of one call than [`MAX_LOGITS_ELEMENTS`].
    pub fn with_max_logits(mut self, elements: usize) -> Self {
        self.max_logits = elements;
        self
    }

    /// Refuses a batch whose logits would pass the limit.
    fn check_logits(&self, batch: usize) -> Result<()> {
        let t = &self.config.tokenization;
        let n = batch.checked_mul(t.tokens).and_then(|x| x.checked_mul(t.vocab));
        match n {
            Some(n) if n <= self.max_logits => Ok(()),
            _ => Err(prior_err(
                self.token_key(),
                PriorProblem::TooManyLogits {
                    batch,
                    per_row: t.tokens.saturating_mul(t.vocab),
                    limit: self.max_logits,
                },
            )),
        }
    }

    /// The config's sampling settings with `seed`.
    pub fn sampling(&self, seed: u64) -> Sampling {
        Sampling { seed, temperature: self.config.temperature, top_p: self.config.top_p }
    }

    /// The logits of the next token after `prefix` (`[B, k]` rows, k <
    /// num_tokens): `next_logits_from_context`, `[B, vocab]`.
    pub fn next_logits(&self, obs: &HashMap<String, Tensor>, prefix: &[Vec<i64>]) -> Result<Tensor> {
        let b = self.check_obs(obs)?;
        let mut td = self.obs_map(obs)?;
        let (context, _) = self.encode_context(&mut td)?;
        let k = prefix.first().map_or(0, Vec::len);
        if prefix.len() != b || prefix.iter().any(|r| r.len() != k) || k >= self.config.tokenization.tokens {
            let shape = vec![prefix.len(), k];
            return Err(prior_err(
                self.token_key(),
                PriorProblem::TokensShape { shape, batch: b, tokens: self.config.tokenization.tokens },
            ));
        }
        let vocab = self.config.tokenization.vocab;
        for (row, r) in prefix.iter().enumerate() {
            if let Some((index, &value)) = r.iter().enumerate().find(|(_, &v)| v < 0 || v as u64 >= vocab as u64) {
                return Err(prior_err(self.token_key(), PriorProblem::TokenRange { row, index, value, vocab }));
            }
        }
        self.step_logits(&context, prefix, k)
    }

    fn step_logits(&self, context: &Tensor, rows: &[Vec<i64>], k: usize) -> Result<Tensor> {
        let emb = self.encode_tokens(rows, k)?;
        let (seq, layers) = self.run(context, &emb)?;
        let last = layers.last().cloned().unwrap_or(seq);
        let h = last.narrow(1, k, 1)?;
        Ok(self.decode_logits(&h)?.squeeze(1)?)
    }

    /// Generation: `num_tokens` tokens drawn one at a time from the
    /// temperature / top-p distribution of each step's logits
    /// ([`top_p::sample`], the draw of each row and step from
    /// `sampling.seed`: [`top_p::draw`]), then decoded. `logits` holds each step's logits.
    pub fn generate(&self, obs: &HashMap<String, Tensor>, sampling: Sampling) -> Result<PriorOutputs> {
        let b = self.check_obs(obs)?;
        let draws: Vec<RowDraw> = (0..b as u64).map(|row| RowDraw { seed: sampling.seed, row }).collect();
        self.generate_rows(obs, sampling, &draws)
    }

    /// [`LatentPrior::generate`] with each row's draws named apart:
    /// batch row `i` draws as row `draws[i].row` under `draws[i].seed`
    /// ([`top_p::draw`]; `sampling.seed` is not read). Rows of several
    /// requests, each generated under its own seed, run as one batch and
    /// each row gets exactly the tokens [`LatentPrior::generate`] gives its
    /// request alone (the forward is row-independent). `draws` has one
    /// entry per batch row.
    pub fn generate_rows(
        &self,
        obs: &HashMap<String, Tensor>,
        sampling: Sampling,
        draws: &[RowDraw],
    ) -> Result<PriorOutputs> {
        if sampling.temperature.is_nan() || sampling.temperature <= 0.0 || sampling.temperature.is_infinite() {
            return Err(prior_err(
                "agent.model.temperature",
                PriorProblem::Temperature { value: sampling.temperature },
            ));
        }
        let b = self.check_obs(obs)?;
        self.check_logits(b)?;
        if draws.len() != b {
            return Err(prior_err(self.token_key(), PriorProblem::Draws { draws: draws.len(), batch: b }));
        }
        if obs.contains_key(self.token_key()) {
            // generation draws its own tokens
            return Err(PolicyError::ExtraObs { key: self.token_key().to_owned(), expected: self.obs_keys() });
        }
        let mut td = self.obs_map(obs)?;
        let (context, trace) = self.encode_context(&mut td)?;
        let n = self.config.tokenization.tokens;
        let mut rows: Vec<Vec<i64>> = vec![Vec::with_capacity(n); b];
        let temp = Tensor::new(sampling.temperature as f32, &self.device)?;
        let mut draw = |k: usize, logits: &Tensor, rows: &mut [Vec<i64>], first: usize| -> Result<()> {
            let probs = crate::transformer::safe_softmax_last_dim(&logits.broadcast_div(&temp)?)?;
            let probs = probs.to_device(&Device::Cpu)?.to_vec2::<f32>()?;
            for (r, (row, p)) in rows.iter_mut().zip(&probs).enumerate() {
                let d = draws[first + r];
                let u = top_p::draw(d.seed, d.row, k as u64);
                row.push(top_p::sample(p, sampling.top_p, u) as i64);
            }
            Ok(())
        };
        let logits = if n == 0 {
            Tensor::zeros((b, 0, self.config.tokenization.vocab), DType::F32, &self.device)?
        } else if self.steps_ready(&context) {
            self.generate_steps(&context, &mut rows, &mut draw)?
        } else {
            let mut all_logits = Vec::with_capacity(n);
            for k in 0..n {
                let logits = self.step_logits(&context, &rows, k)?;
                draw(k, &logits, &mut rows, 0)?;
                all_logits.push(logits);
            }
            Tensor::stack(&all_logits, 1)?
        };
        let (mean_action, latent_codes, _) = self.decode(&mut td, &rows)?;
        let flat: Vec<i64> = rows.concat();
        let tokens = Tensor::from_vec(flat, (b, n), &self.device)?;
        let norm_obs = trace.norm_outputs.into_iter().next().map(|(_, t)| t);
        Ok(PriorOutputs { logits, mean_action, tokens, latent_codes, norm_obs })
    }

    /// Whether generation can run position by position (a key/value
    /// cache): the transformer's float32 CPU row path.
    fn steps_ready(&self, context: &Tensor) -> bool {
        context.device().is_cpu() && context.dtype() == DType::F32 && self.transformer.rows_ready()
    }

    /// Generation position by position with a key/value cache, in chunks
    /// of at most [`GENERATION_ROWS`] rows whose cache (`rows x (tokens + 1)
    /// x 3 d_model` floats a layer) stays within [`GENERATION_CACHE_BYTES`]
    /// where a row allows: each step runs the transformer on one
    /// new position instead of the whole prefix again. Step `k`'s logits
    /// are bitwise the teacher-forced logits at position `k` of the tokens
    /// drawn (the same row path over the whole sequence's causal mask;
    /// tested). `draw(k, logits, rows, first)` appends token `k` to the
    /// chunk's `rows` (batch rows from `first`). `[B, tokens, vocab]`.
    fn generate_steps(
        &self,
        context: &Tensor,
        rows: &mut [Vec<i64>],
        draw: &mut impl FnMut(usize, &Tensor, &mut [Vec<i64>], usize) -> Result<()>,
    ) -> Result<Tensor> {
        let n = self.config.tokenization.tokens;
        let mask = causal_mask(n, &self.device)?;
        let positions = self.positions.narrow(0, 0, n + 1)?;
        let row_bytes = (n + 1)
            .saturating_mul(3 * self.config.prior.d_model)
            .saturating_mul(self.transformer.layers.len())
            .saturating_mul(std::mem::size_of::<f32>());
        let chunk_rows = (GENERATION_CACHE_BYTES / row_bytes.max(1)).clamp(1, GENERATION_ROWS);
        let mut chunks = Vec::with_capacity(rows.len().div_ceil(chunk_rows));
        for (c, chunk) in rows.chunks_mut(chunk_rows).enumerate() {
            let first = c * chunk_rows;
            let ctx = context.narrow(0, first, chunk.len())?;
            let mut cache = self.transformer.step_cache(chunk.len(), &mask)?;
            let mut steps = Vec::with_capacity(n);
            for k in 0..n {
                // the sequence's position k: the context, then token k - 1
                let x = if k == 0 {
                    ctx.clone()
                } else {
                    let last: Vec<Vec<i64>> = chunk.iter().map(|r| vec![r[k - 1]]).collect();
                    self.encode_tokens(&last, 1)?.squeeze(1)?
                };
                let x = x.broadcast_add(&positions.get(k)?)?.contiguous()?;
                let h = self.transformer.step(&x, &mut cache)?;
                let logits = self.decode_logits(&h.unsqueeze(1)?)?.squeeze(1)?;
                draw(k, &logits, chunk, first)?;
                steps.push(logits);
            }
            chunks.push(Tensor::stack(&steps, 1)?);
        }
        Ok(Tensor::cat(&chunks, 0)?)
    }

    /// `softmax(logits / temperature)` over the last dim, as the sampler computes it.
    pub fn probabilities(&self, logits: &Tensor, temperature: f64) -> Result<Tensor> {
        let temp = Tensor::new(temperature as f32, logits.device())?;
        crate::transformer::safe_softmax_last_dim(&logits.broadcast_div(&temp)?)
    }
}

/// The token encoder as an embedding table when it is one Linear over the
/// one-hot tokens (no hidden layer, normalizer, operation or activation):
/// `one_hot @ W.T + b` is `W[:, token] + b` exactly (every other product is
/// a zero).
fn table_encoder(net: &Network, token_key: &str) -> Option<TokenEncoder> {
    let leaf = match net {
        Network::Leaf(l) => l.as_ref(),
        Network::Container { models, .. } if models.len() == 1 => match &models[0] {
            Network::Leaf(l) => l.as_ref(),
            _ => return None,
        },
        _ => return None,
    };
    let mlp = leaf.mlp.as_ref()?;
    let plain = leaf.norm.is_none()
        && leaf.output_activation.is_none()
        && leaf.ops == [crate::module_ops::ModuleOp::Forward]
        && leaf.in_keys == [token_key]
        && mlp.hidden.is_empty();
    if !plain {
        return None;
    }
    Some(TokenEncoder::Table { table: mlp.out.weight_t.clone(), bias: mlp.out.bias.clone() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy/gpc_prior")
    }

    /// The one-hot path (for token encoders that are not a table) and the
    /// table give the same embeddings on the recorded prior.
    #[test]
    fn one_hot_module_path_agrees_with_the_table() {
        let mut p =
            LatentPrior::load_with(dir().join("inference_last.ckpt"), None, &Device::Cpu, &LoadOptions::default())
                .unwrap();
        assert!(matches!(p.token_encoder, TokenEncoder::Table { .. }));
        let rows = vec![vec![0i64, 5, 80, 41], vec![80, 0, 1, 2]];
        let table = p.encode_tokens(&rows, 4).unwrap();
        let ckpt = Checkpoint::open(dir().join("inference_last.ckpt")).unwrap();
        let net = Network::load(
            &p.config.prior.token_encoder,
            &ckpt,
            "model",
            "prior._token_encoder",
            "agent.model.prior.token_encoder",
            &Device::Cpu,
        )
        .unwrap();
        p.token_encoder = TokenEncoder::Module(net);
        let module = p.encode_tokens(&rows, 4).unwrap();
        let a = table.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let b = module.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(a, b);
        // over the limit: refused before anything is allocated
        let big = vec![vec![0i64; 4]; MAX_ONE_HOT_ELEMENTS / (4 * 81) + 1];
        let e = p.encode_tokens(&big, 4).unwrap_err();
        assert!(matches!(e, PolicyError::Prior { problem: PriorProblem::OneHotTooLarge { .. }, .. }), "{e}");
    }
    /// Rows of two requests generated as one batch, each under its own
    /// seed and row numbers, get bit for bit what each request gets alone.
    #[test]
    fn generate_rows_matches_each_request_alone() {
        let p = LatentPrior::load_with(dir().join("inference_last.ckpt"), None, &Device::Cpu, &LoadOptions::default())
            .unwrap();
        let obs = candle_core::safetensors::load(dir().join("obs.safetensors"), &Device::Cpu).unwrap();
        let rows = |a: usize, n: usize| -> HashMap<String, Tensor> {
            obs.iter()
                .filter(|(k, _)| k.as_str() != p.token_key())
                .map(|(k, t)| (k.clone(), t.narrow(0, a, n).unwrap()))
                .collect()
        };
        let (first, second) =
            (p.generate(&rows(0, 3), p.sampling(7)).unwrap(), p.generate(&rows(3, 2), p.sampling(11)).unwrap());
        let draws: Vec<RowDraw> =
            (0..3).map(|row| RowDraw { seed: 7, row }).chain((0..2).map(|row| RowDraw { seed: 11, row })).collect();
        let both = p.generate_rows(&rows(0, 5), p.sampling(0), &draws).unwrap();
        let tokens = |t: &Tensor| t.to_vec2::<i64>().unwrap();
        let mut want = tokens(&first.tokens);
        want.extend(tokens(&second.tokens));
        assert_eq!(tokens(&both.tokens), want);
        let bits = |t: &Tensor| {
            t.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        };
        let mut want = bits(&first.mean_action);
        want.extend(bits(&second.mean_action));
        assert_eq!(bits(&both.mean_action), want);
        let e = p.generate_rows(&rows(0, 5), p.sampling(0), &draws[..4]).unwrap_err();
        assert!(matches!(e, PolicyError::Prior { problem: PriorProblem::Draws { draws: 4, batch: 5 }, .. }), "{e}");
    }
}
