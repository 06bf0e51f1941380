//! The bounded float64 reference forward of a [`TransformerEncoder`] (and of
//! ProtoMotions' `Transformer` network around it): per output element, a
//! bound on how far any float32 forward (this crate's, torch's slow path,
//! any summation order, with or without FMA) can be from the float64 value.
//!
//! The rules, first order in `u = 2^-24` like the rest of [`crate::bound`]
//! (`e_x` is an input's bound, `gamma(n) = n u / (1 - n u)`):
//!
//! - **q/k/v projections** and **out_proj**: the Linear rule.
//! - **scaled scores** `s_ij = (q_i . k_j) / sqrt(hd)` over the head width
//!   `hd`; both operands carry error:
//!   `e_s = (sum_c |q_c| e_kc + e_qc |k_c| + e_qc e_kc + gamma(hd + 4) sum_c |q_c||k_c|) / sqrt(hd)`.
//!   The `+ 4` covers the scale's own rounding wherever it is applied
//!   (torch scales q, or q and k by `hd^-1/4` each, or the product; the
//!   float32 constant `1/sqrt(hd)` is itself rounded).
//! - **masks**: a `-inf` entry (padded key, forbidden pair) gives the key
//!   weight exactly 0 on both sides, so it is dropped from the softmax; a
//!   finite additive entry `m` adds one rounding, `u |s + m|`. A query whose
//!   keys are all masked gets zero weights (torch's `_safe_softmax`): its
//!   context is exactly 0.
//! - **softmax** over the `n` unmasked keys (shift by the max): each score
//!   may move by `D_j = e_j + u |s_j - max| + 2u` (its error, the rounding of
//!   the shift, and the exp's one ulp, taken as a perturbation of the
//!   exponent). With `w` the float64 weights,
//!   `w'_i / w_i = exp(d_i) / sum_j w_j exp(d_j)`, `|d_j| <= D_j`, so its
//!   relative error is at most
//!   `rho_i = max(exp(D_i) / lo - 1, 1 - exp(-D_i) / up)` with
//!   `up = sum_j w_j exp(D_j)`, `lo = sum_j w_j exp(-D_j)` (exact for that
//!   model, tighter than `exp(2 max_j D_j) - 1` because a large `D_j` only
//!   counts through its own weight). The sum and division then add
//!   `gamma(n + 4)` (the `+ 4` leaves room for torch's deferred
//!   normalisation): `e_w_i = w_i ((1 + rho_i)(1 + gamma(n + 4)) - 1)`, plus
//!   the smallest normal float32 for an exp that underflows.
//! - **weighted sum of v**: `e_ctx = sum_j e_w_j (|v_j| + e_vj) + w_j e_vj + gamma(n + 1) sum_j w_j |v_j|`.
//! - **residual adds** `a + b`: `e = e_a + e_b + u |a + b|`.
//! - **LayerNorm**, the **feed-forward** `linear2(act(linear1(x)))`: the
//!   LayerNorm, Linear and activation rules of [`crate::bound`].
//! - **token 0 selection** (and the token concatenation): moves elements
//!   with their bounds; the key-padding mask comes from observations, which
//!   are exact.
//!
//! These layer-by-layer rules are always valid but loose: they count every
//! `|W|` row sum and LayerNorm `1/std` as if no sign cancelled (14 for
//! outputs of magnitude 4 on the recorded two-layer encoder). So, as for
//! MLPs, the first-order bound through the signed Jacobian at the
//! reference point is also computed (`bound/tape.rs`: one reverse pass per
//! output element, each rounding site above weighted by `|d out / d site|`,
//! times 1.01 for the neglected second-order terms) and the smaller wins.
//! The ReLU inputs of the feed-forward are tightened that way first, and a
//! ReLU input within its bound of 0 takes the slope 1/2 plus `e / 2` (either
//! side of the kink). docs/numerics.md reports how loose the result is on
//! the recordings (hundreds to a few thousand times the observed error).
//!
//! Cost: one reverse pass (about one forward of a row) per bounded element
//! (every output, every inner layer's output, and each ReLU input the
//! layer-by-layer bound leaves within reach of the kink), per batch
//! row. The recorded models (d 16 to 32, 2 layers) take milliseconds to a
//! second; at published widths (d 512, ff 1024, 4 layers, 11 tokens) that
//! is tens of thousands of reverse passes of ~1e8 flops per row: a reference for
//! tests and offline reports on shrunk models, not for serving (no CLI
//! command computes it).

use candle_core::{DType, Tensor};

use super::tape::{Seeds, Tape, Tighten};
use super::{activation, gamma, vec_f64, Bounded, Reference, U};
use crate::activation::Activation;
use crate::error::{PolicyError, Result};
use crate::network::TransformerNetwork;
use crate::problem::AttentionProblem;
use crate::transformer::{AttentionMasks, EncoderLayer, SelfAttention, TransformerEncoder};

/// The masks as per-(row, query, key) additive entries (`-inf`: masked).
pub(crate) struct ScoreBias {
    pub(crate) seq: usize,
    /// `[B, S]`: the key is padded.
    pub(crate) padded: Option<Vec<bool>>,
    /// `[S, S]`: added to every row's and head's scores.
    pub(crate) additive: Option<Vec<f64>>,
}

impl ScoreBias {
    pub(super) fn at(&self, b: usize, i: usize, j: usize) -> f64 {
        let s = self.seq;
        if self.padded.as_ref().is_some_and(|p| p[b * s + j]) {
            return f64::NEG_INFINITY;
        }
        self.additive.as_ref().map_or(0.0, |a| a[i * s + j])
    }
}

impl TransformerEncoder {
    /// The float64 reference forward of [`TransformerEncoder::forward`] on
    /// `x` (`[B, S, d_model]`) under `masks`, with a per-element bound on
    /// any float32 forward's distance from it (the module docs of
    /// [`crate::bound::attention`]). Refuses what `forward` refuses.
    pub fn reference(&self, x: &Tensor, masks: &AttentionMasks<'_>) -> Result<Bounded> {
        let dims = x.dims().to_vec();
        let x = Bounded::exact(dims, vec_f64(x)?);
        let bias = masks_of(self, &x, masks)?;
        self.bounded_forward(x, &bias, Seeds::AllTokens)
    }

    /// Every layer on the tape, then the Jacobian bound for the `seeds` outputs.
    fn bounded_forward(&self, x: Bounded, bias: &ScoreBias, seeds: Seeds) -> Result<Bounded> {
        let mut layers = self.bounded_layers(x.clone(), bias, seeds)?;
        Ok(layers.pop().unwrap_or(x))
    }

    /// Each layer's bounded output: the Jacobian bound for every token of
    /// the inner layers, for the `seeds` tokens of the last.
    pub(crate) fn bounded_layers(&self, x: Bounded, bias: &ScoreBias, seeds: Seeds) -> Result<Vec<Bounded>> {
        let mut tape = Tape::new(x);
        let mut h = 0;
        let mut out = Vec::with_capacity(self.layers.len());
        for (i, layer) in self.layers.iter().enumerate() {
            h = layer.bounded(&mut tape, h, bias)?;
            if i + 1 < self.layers.len() {
                tape.tighten(h, bias, Tighten::All);
                out.push(tape.out(h).clone());
            } else {
                out.push(tape.tightened(bias, seeds));
            }
        }
        Ok(out)
    }

    fn refuse(&self, problem: AttentionProblem) -> PolicyError {
        PolicyError::Attention { path: self.path.clone(), problem }
    }
}

fn masks_of(enc: &TransformerEncoder, x: &Bounded, masks: &AttentionMasks<'_>) -> Result<ScoreBias> {
    let [b, s, d] = x.shape[..] else {
        return Err(enc.refuse(AttentionProblem::InputShape { shape: x.shape.clone() }));
    };
    if d != enc.spec.d_model {
        return Err(enc.refuse(AttentionProblem::InputShape { shape: x.shape.clone() }));
    }
    let additive = match masks.additive {
        Some(m) if m.dims() == [s, s] && m.dtype().is_float() => Some(vec_f64(&m.to_dtype(DType::F32)?)?),
        Some(m) => {
            return Err(enc.refuse(AttentionProblem::AdditiveMask {
                shape: m.dims().to_vec(),
                dtype: m.dtype().as_str(),
                seq: s,
            }))
        }
        None => None,
    };
    let padded = match masks.key_padding {
        Some(m) if m.dims() == [b, s] && m.dtype() == DType::U8 => {
            Some(m.flatten_all()?.to_vec1::<u8>()?.into_iter().map(|v| v != 0).collect())
        }
        Some(m) => {
            return Err(enc.refuse(AttentionProblem::KeyPaddingMask {
                shape: m.dims().to_vec(),
                dtype: m.dtype().as_str(),
                batch: b,
                seq: s,
            }))
        }
        None => None,
    };
    Ok(ScoreBias { seq: s, padded, additive })
}

/// `a + b` elementwise (same shapes).
pub(super) fn add(a: &Bounded, b: &Bounded) -> Bounded {
    let value: Vec<f64> = a.value.iter().zip(&b.value).map(|(x, y)| x + y).collect();
    let bound = a.bound.iter().zip(&b.bound).zip(&value).map(|((ea, eb), v)| ea + eb + U * v.abs()).collect();
    Bounded { shape: a.shape.clone(), value, bound }
}

/// Each softmax weight's bound from its exponent perturbations `D` (see the
/// module docs): `w_i ((1 + rho_i)(1 + g) - 1)` plus the smallest normal
/// float32 (an exp that underflows).
pub(super) fn weight_errors(w: &[f64], dj: &[f64], g: f64) -> Vec<f64> {
    let up: f64 = w.iter().zip(dj).map(|(w, d)| w * d.exp()).sum();
    let lo: f64 = w.iter().zip(dj).map(|(w, d)| w * (-d).exp()).sum();
    w.iter()
        .zip(dj)
        .map(|(&wi, &di)| {
            let rho = (di.exp() / lo - 1.0).max(1.0 - (-di).exp() / up);
            wi * ((1.0 + rho) * (1.0 + g) - 1.0) + f32::MIN_POSITIVE as f64
        })
        .collect()
}

impl EncoderLayer {
    /// Appends this layer's stages to the tape; returns the output node.
    fn bounded(&self, tape: &mut Tape, x: usize, bias: &ScoreBias) -> Result<usize> {
        let qkv = tape.linear(x, &self.self_attn.in_proj)?;
        let ctx = self.self_attn.context(tape.out(qkv), bias);
        let ctx = tape.attention(qkv, self.self_attn.heads, ctx);
        let sa = tape.linear(ctx, &self.self_attn.out_proj)?;
        let s1 = tape.add(x, sa);
        let x1 = tape.layer_norm(s1, &self.norm1)?;
        let f1 = tape.linear(x1, &self.linear1)?;
        if self.activation == Activation::Relu {
            tape.tighten(f1, bias, Tighten::NearZero);
        }
        let a = tape.act(f1, self.activation);
        let f2 = tape.linear(a, &self.linear2)?;
        let s2 = tape.add(x1, f2);
        tape.layer_norm(s2, &self.norm2)
    }
}

impl SelfAttention {
    /// The attention context `[B, S, d]` (before `out_proj`) from the
    /// projections `qkv` (`[B, S, 3d]`), layer-by-layer bounded.
    fn context(&self, qkv: &Bounded, bias: &ScoreBias) -> Bounded {
        let (b, s, w3) = (qkv.shape[0], qkv.shape[1], qkv.shape[2]);
        let d = w3 / 3;
        let h = self.heads;
        let hd = d / h;
        let inv = 1.0 / (hd as f64).sqrt();
        let g_dot = gamma(hd + 4);
        let mut ctx = Bounded::exact(vec![b, s, d], vec![0.0; b * s * d]);
        let (qv, qe) = (&qkv.value, &qkv.bound);
        let mut sv = vec![0.0; s];
        let mut se = vec![0.0; s];
        for bi in 0..b {
            for hi in 0..h {
                for i in 0..s {
                    let q0 = (bi * s + i) * w3 + hi * hd;
                    let mut keys = Vec::with_capacity(s);
                    for j in 0..s {
                        let m = bias.at(bi, i, j);
                        if m == f64::NEG_INFINITY {
                            continue;
                        }
                        let k0 = (bi * s + j) * w3 + d + hi * hd;
                        let (mut dot, mut prop, mut mag) = (0.0, 0.0, 0.0);
                        for c in 0..hd {
                            let (a, ea, k, ek) = (qv[q0 + c], qe[q0 + c], qv[k0 + c], qe[k0 + c]);
                            dot += a * k;
                            prop += a.abs() * ek + ea * k.abs() + ea * ek;
                            mag += a.abs() * k.abs();
                        }
                        let v = dot * inv + m;
                        sv[j] = v;
                        // a +inf or NaN mask entry: NaN out, unbounded
                        se[j] = if m.is_finite() {
                            (prop + g_dot * mag) * inv + if m != 0.0 { U * v.abs() } else { 0.0 }
                        } else {
                            f64::INFINITY
                        };
                        keys.push(j);
                    }
                    if keys.is_empty() {
                        continue; // zero weights: context exactly 0
                    }
                    let mx = keys.iter().map(|&j| sv[j]).fold(f64::NEG_INFINITY, f64::max);
                    let p: Vec<f64> = keys.iter().map(|&j| (sv[j] - mx).exp()).collect();
                    let z: f64 = p.iter().sum();
                    let w: Vec<f64> = p.iter().map(|v| v / z).collect();
                    let dj: Vec<f64> = keys.iter().map(|&j| se[j] + U * (sv[j] - mx).abs() + 2.0 * U).collect();
                    let n = keys.len();
                    let ew = weight_errors(&w, &dj, gamma(n + 4));
                    let g_sum = gamma(n + 1);
                    let o0 = (bi * s + i) * d + hi * hd;
                    for c in 0..hd {
                        let (mut val, mut prop, mut mag) = (0.0, 0.0, 0.0);
                        for (t, &j) in keys.iter().enumerate() {
                            let v0 = (bi * s + j) * w3 + 2 * d + hi * hd + c;
                            let (v, ev) = (qv[v0], qe[v0]);
                            val += w[t] * v;
                            prop += ew[t] * (v.abs() + ev) + w[t] * ev;
                            mag += w[t] * v.abs();
                        }
                        ctx.value[o0 + c] = val;
                        ctx.bound[o0 + c] = prop + g_sum * mag;
                    }
                }
            }
        }
        ctx
    }
}

impl TransformerNetwork {
    fn attention_err(&self, problem: AttentionProblem) -> PolicyError {
        PolicyError::Attention { path: self.path.clone(), problem }
    }

    /// The bounded `Transformer.forward`: tokens (concatenated along the
    /// sequence), the key-padding mask from the observations' masks, the
    /// encoder, token 0, the output activation.
    fn bounded(&self, r: &Reference) -> Result<Bounded> {
        let get = |k: &String| {
            r.values.get(k).ok_or_else(|| PolicyError::UnprovidedKey { path: self.path.clone(), key: k.clone() })
        };
        let d = self.config.latent_dim;
        let mut tokens: Vec<(usize, &Bounded)> = Vec::new();
        let mut pads: Vec<Vec<bool>> = Vec::new(); // per token key: [B, seq]
        let mut batch = None;
        for k in self.config.token_keys() {
            let t = get(k)?;
            let (b, seq) = match t.shape[..] {
                [b, w] if w == d => (b, 1),
                [b, seq, w] if w == d => (b, seq),
                _ => {
                    return Err(self.attention_err(AttentionProblem::TokenShape {
                        key: k.clone(),
                        shape: t.shape.clone(),
                        d,
                    }))
                }
            };
            batch.get_or_insert(b);
            let padded = match self.config.masks.iter().find(|(tok, _)| tok == k) {
                None => vec![false; b * seq],
                Some((_, mask_key)) => {
                    let raw = get(mask_key)?;
                    let bad = || {
                        self.attention_err(AttentionProblem::MaskShape {
                            key: mask_key.clone(),
                            shape: raw.shape.clone(),
                            tokens: seq,
                        })
                    };
                    let (rb, m) = match raw.shape[..] {
                        [rb] => (rb, 1),
                        [rb, m] => (rb, m),
                        _ => return Err(bad()),
                    };
                    if rb != b || (m < seq && m != 1) {
                        return Err(bad());
                    }
                    if let Some(e) = self.mask_rule_refusal(mask_key, &raw.shape, m, seq) {
                        return Err(e);
                    }
                    let invalid = |row: usize, c: usize| raw.value[row * m + c] == 0.0;
                    let mut out = Vec::with_capacity(b * seq);
                    for row in 0..b {
                        for c in 0..seq {
                            out.push(if m > seq {
                                (0..m).all(|c| invalid(row, c))
                            } else if m == 1 {
                                invalid(row, 0)
                            } else {
                                invalid(row, c)
                            });
                        }
                    }
                    out
                }
            };
            tokens.push((seq, t));
            pads.push(padded);
        }
        let b = batch.unwrap_or(0);
        let total: usize = tokens.iter().map(|(s, _)| s).sum();
        let mut value = Vec::with_capacity(b * total * d);
        let mut bound = Vec::with_capacity(b * total * d);
        let mut padded = Vec::with_capacity(b * total);
        for row in 0..b {
            for ((seq, t), p) in tokens.iter().zip(&pads) {
                let span = row * seq * d..(row + 1) * seq * d;
                value.extend_from_slice(&t.value[span.clone()]);
                bound.extend_from_slice(&t.bound[span]);
                padded.extend_from_slice(&p[row * seq..(row + 1) * seq]);
            }
        }
        let x = Bounded { shape: vec![b, total, d], value, bound };
        let bias = ScoreBias { seq: total, padded: Some(padded), additive: None };
        let out = self.encoder.bounded_forward(x, &bias, Seeds::FirstToken)?;
        let first = out
            .gather(vec![b, d], &(0..b).flat_map(|row| (0..d).map(move |c| row * total * d + c)).collect::<Vec<_>>());
        Ok(match self.config.output_activation {
            Some(a) => activation(&first, a),
            None => first,
        })
    }
}

/// The `Network::Transformer` arm of the bounded network forward.
pub(super) fn transformer_network(t: &TransformerNetwork, r: &mut Reference) -> Result<()> {
    let out = t.bounded(r)?;
    r.values.insert(t.config.out_key.clone(), out);
    Ok(())
}
