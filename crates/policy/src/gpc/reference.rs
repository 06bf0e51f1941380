//! The bounded float64 reference of the GPC prior's teacher-forced forward
//! ([`LatentPrior::teacher_forced_stages`]), per stage, with the rules of
//! [`crate::bound`] and [`crate::bound::attention`]:
//!
//! - the context encoder: the network rules (normalizer, MLP);
//! - the token embedding `W[:, token] + b` (a table row): one rounding,
//!   `u |e|`; a token encoder that is a module runs the one-hot through
//!   the network rules (the one-hot is exact);
//! - the sequence `[context, tokens] + positions`: `e + u |s|`;
//! - the transformer under `generate_causal_mask` (its `-inf` pairs drop
//!   out of the softmax exactly): the attention rules, each layer's output
//!   with the Jacobian bound;
//! - the output head's logits: the network rules on the hidden states;
//! - the action: the tokens unpack to FSQ indices and codes exactly (bound
//!   0), and the FSQ decoder runs through the network rules.

use std::collections::HashMap;

use candle_core::Tensor;

use super::{prior_err, LatentPrior, PriorProblem, TokenEncoder};
use crate::bound::{network, vec_f64, Bounded, Reference, ScoreBias, Seeds, U};
use crate::error::{PolicyError, Result};
use crate::problem::GraphProblem;

/// The teacher-forced stages' float64 values with their bounds.
#[derive(Debug, Clone)]
pub struct PriorReference {
    /// `[B, d_model]`.
    pub context_embedding: Bounded,
    /// `[B, T, d_model]`.
    pub token_embedding: Bounded,
    /// `[B, T + 1, d_model]`.
    pub sequence: Bounded,
    /// Each layer's output, `[B, T + 1, d_model]`.
    pub layers: Vec<Bounded>,
    /// `[B, T, vocab]`.
    pub logits: Bounded,
    /// `[B, num_fsq_scalars]`: exact (bound 0).
    pub latent_codes: Bounded,
    /// `[B, A]`.
    pub mean_action: Bounded,
    /// Every normalizer's output (context encoder, decoder), by module path.
    pub normalized: Vec<(String, Bounded)>,
}

fn unwritten(path: &str, key: &str) -> PolicyError {
    PolicyError::Graph { path: path.into(), problem: GraphProblem::Unwritten { key: key.into() } }
}

impl LatentPrior {
    /// The float64 reference of [`LatentPrior::teacher_forced_stages`] on
    /// `obs` (observations and tokens), with per-element bounds on any
    /// float32 forward's distance. Refuses what the forward refuses.
    pub fn teacher_forced_reference(&self, obs: &HashMap<String, Tensor>) -> Result<PriorReference> {
        let b = self.check_obs(obs)?;
        self.check_logits(b)?;
        let key = self.token_key();
        let n = self.config.tokenization.tokens;
        let t = obs.get(key).ok_or_else(|| prior_err(key, PriorProblem::NoTokens { tokens: n }))?;
        let rows = self.check_tokens(t, b)?;
        let d = self.config.prior.d_model;
        let mut r = Reference::default();
        for (k, v) in obs.iter().filter(|(k, _)| k.as_str() != key) {
            r.values.insert(k.clone(), Bounded::exact(v.dims().to_vec(), vec_f64(v)?));
        }
        network(&self.context_encoder, &mut r)?;
        let ckey = &self.config.prior.context_embedding_key;
        let context =
            r.values.get(ckey).cloned().ok_or_else(|| unwritten("agent.model.prior.context_encoder", ckey))?;
        let token_embedding = self.bounded_tokens(&rows, n)?;
        // [context, tokens] + positions
        let positions = vec_f64(&self.positions.narrow(0, 0, n + 1)?)?;
        let s = n + 1;
        let mut sequence = Bounded::exact(vec![b, s, d], vec![0.0; b * s * d]);
        for row in 0..b {
            for p in 0..s {
                for c in 0..d {
                    let (v, e) = if p == 0 {
                        (context.value[row * d + c], context.bound[row * d + c])
                    } else {
                        let i = (row * n + p - 1) * d + c;
                        (token_embedding.value[i], token_embedding.bound[i])
                    };
                    let out = v + positions[p * d + c];
                    let i = (row * s + p) * d + c;
                    sequence.value[i] = out;
                    sequence.bound[i] = e + U * out.abs();
                }
            }
        }
        let additive = (0..s * s).map(|i| if i % s > i / s { f64::NEG_INFINITY } else { 0.0 }).collect();
        let bias = ScoreBias { seq: s, padded: None, additive: Some(additive) };
        let layers = self.transformer.bounded_layers(sequence.clone(), &bias, Seeds::AllTokens)?;
        let last = layers.last().unwrap_or(&sequence);
        // positions 0..n of the last layer -> the output head
        let idx: Vec<usize> = (0..b).flat_map(|row| (0..n * d).map(move |i| row * s * d + i)).collect();
        let hidden = Bounded {
            shape: vec![b, n, d],
            value: idx.iter().map(|&i| last.value[i]).collect(),
            bound: idx.iter().map(|&i| last.bound[i]).collect(),
        };
        let mut head = Reference::default();
        head.values.insert(self.config.prior.hidden_key.clone(), hidden);
        network(&self.output_head, &mut head)?;
        let lkey = &self.config.prior.logits_key;
        let logits = head.values.remove(lkey).ok_or_else(|| unwritten("agent.model.prior.output_head", lkey))?;
        // tokens -> indices -> codes: small integers, exact
        let tok = &self.config.tokenization;
        let mut idx = Vec::with_capacity(b * tok.scalars);
        for row in &rows {
            tok.unpack_row(row, &mut idx);
        }
        let half_width = (tok.levels / 2) as f64;
        let codes = Bounded::exact(vec![b, tok.scalars], idx.iter().map(|&i| i as f64 - half_width).collect());
        r.values.insert(self.decoder_latent_key.clone(), codes.clone());
        network(&self.decoder, &mut r)?;
        let akey = self.decoder.out_key();
        let mean_action = r.values.remove(akey).ok_or_else(|| unwritten("agent.model.latent_decoder", akey))?;
        Ok(PriorReference {
            context_embedding: context,
            token_embedding,
            sequence,
            layers,
            logits,
            latent_codes: codes,
            mean_action,
            normalized: r.normalized,
        })
    }

    /// `encode_tokens` with bounds: a table row plus the bias (one
    /// rounding), or the one-hot through the token encoder's network rules.
    fn bounded_tokens(&self, rows: &[Vec<i64>], k: usize) -> Result<Bounded> {
        let b = rows.len();
        let d = self.config.prior.d_model;
        match &self.token_encoder {
            TokenEncoder::Table { table, bias } => {
                let table = vec_f64(table)?;
                let bias = vec_f64(bias)?;
                let mut out = Bounded::exact(vec![b, k, d], Vec::with_capacity(b * k * d));
                out.bound.clear();
                for row in rows {
                    for &t in &row[..k] {
                        let t = t as usize; // checked: in [0, vocab)
                        for c in 0..d {
                            let v = table[t * d + c] + bias[c];
                            out.value.push(v);
                            out.bound.push(U * v.abs());
                        }
                    }
                }
                Ok(out)
            }
            TokenEncoder::Module(net) => {
                let v = self.config.tokenization.vocab;
                let len = b.checked_mul(k).and_then(|x| x.checked_mul(v)).filter(|&n| n <= super::MAX_ONE_HOT_ELEMENTS);
                let len = len.ok_or_else(|| {
                    prior_err(self.token_key(), PriorProblem::OneHotTooLarge { batch: b, tokens: k, vocab: v })
                })?;
                let mut one_hot = vec![0.0; len];
                for (i, &t) in rows.iter().flat_map(|r| r[..k].iter()).enumerate() {
                    one_hot[i * v + t as usize] = 1.0;
                }
                let mut r = Reference::default();
                r.values.insert(self.config.prior.token_key.clone(), Bounded::exact(vec![b, k, v], one_hot));
                network(net, &mut r)?;
                let key = &self.config.prior.token_embedding_key;
                r.values.remove(key).ok_or_else(|| unwritten("agent.model.prior.token_encoder", key))
            }
        }
    }
}
