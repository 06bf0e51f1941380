//! torch's `nn.TransformerEncoder` of `nn.TransformerEncoderLayer(batch_first=True,
//! norm_first=False)` in eval mode (dropout off), as ProtoMotions' `Transformer`
//! (`agents/common/transformer.py`) and the GPC prior build it.
//!
//! Each layer is post-norm: `x = LN1(x + SelfAttn(x))`, `x = LN2(x + FF(x))`
//! with `FF = linear2(act(linear1(x)))`. Self attention projects with
//! `in_proj_weight`/`in_proj_bias` (`[3d, d]`, `[3d]`: q, k, v stacked),
//! splits `d` into `heads` heads, scales the queries by `1/sqrt(head_dim)`
//! (after the bias, as torch's `_native_multi_head_attention` does), adds the
//! masks to the scores, takes the softmax over keys, and projects back with
//! `out_proj`.
//!
//! Masks ([`AttentionMasks`]): a boolean key-padding mask `[B, S]` (true =
//! the key is ignored) and a float additive mask `[S, S]` added to every
//! head's scores (`-inf` entries forbid a query-key pair: the GPC prior's
//! causal mask with a context prefix).
//!
//! Two torch behaviours decide what this module returns where the masks
//! take everything away:
//! - A query whose keys are all masked: torch's attention (its
//!   `_safe_softmax`, torch >= 2.5) gives it zero weights, so the attention
//!   output is `out_proj.bias` there, finite. So does this module (checked
//!   against torch's slow path in tests); an older torch gives NaN there.
//! - torch's fast path (eval, no grad, key-padding mask only, no additive
//!   mask: `nn.TransformerEncoder` converts the batch to a nested tensor)
//!   drops the padded positions and returns ZERO at them. This module
//!   computes every position (torch's slow path values); the unpadded
//!   positions agree with both paths (padded keys never reach them).
//!   [`zero_padded_positions`] turns an output into the fast path's, for
//!   callers that want its zeros. MaskedMimic reads token 0, which is never
//!   padded, so both paths give it the same value wherever the padded
//!   positions' keys and values are finite. [`TransformerEncoder::forward_first`]
//!   (token 0 alone, what MaskedMimic reads) leaves padded positions out on
//!   the CPU as the fast path does, so a non-finite padded position does
//!   not reach token 0 there (in the slow path it makes it NaN).

use candle_core::{DType, Device, Tensor, D};
use pmstate_ckpt::Checkpoint;

use crate::activation::Activation;
use crate::error::{PolicyError, Result};
use crate::mlp::{load_linear, load_linear_keys, load_vec, LayerNorm, Linear};
use crate::problem::AttentionProblem;

mod rows;

/// Which layers' outputs a forward returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// The last layer's (none without layers).
    Last,
    /// Every layer's.
    Every,
}

impl Keep {
    /// Whether layer `i` of `n` is kept.
    fn keeps(self, i: usize, n: usize) -> bool {
        self == Keep::Every || i + 1 == n
    }

    /// How many of `n` layers are kept.
    fn count(self, n: usize) -> usize {
        match self {
            Keep::Every => n,
            Keep::Last => n.min(1),
        }
    }
}

/// The sizes of a `TransformerEncoder`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransformerSpec {
    /// `d_model` (ProtoMotions' `latent_dim`).
    pub d_model: usize,
    /// `nhead` (`num_heads`): must divide `d_model`.
    pub heads: usize,
    /// `dim_feedforward` (`ff_size`).
    pub ff: usize,
    /// `num_layers`.
    pub layers: usize,
    /// The feed-forward activation (`activation`).
    pub activation: Activation,
}

/// The masks of one forward; both optional.
#[derive(Debug, Clone, Copy, Default)]
pub struct AttentionMasks<'a> {
    /// `src_key_padding_mask`: `[B, S]`, u8 (candle's bool), nonzero = ignore that key.
    pub key_padding: Option<&'a Tensor>,
    /// `mask`: `[S, S]` float, added to the scores of every batch row and head.
    pub additive: Option<&'a Tensor>,
}

/// Multi-head self attention (`nn.MultiheadAttention`, batch first, q = k = v).
#[derive(Debug, Clone)]
pub struct SelfAttention {
    /// `in_proj_weight` / `in_proj_bias` as one Linear `d -> 3d`.
    pub in_proj: Linear,
    /// `out_proj`.
    pub out_proj: Linear,
    /// Number of heads.
    pub heads: usize,
    /// `in_proj` split into its query rows and its key/value rows, packed
    /// on first use by the last layer of [`TransformerEncoder::forward_first`]
    /// (the only one that needs the queries of some tokens alone); `None`
    /// inside when `in_proj` has no packed weights.
    pub(crate) first_only: std::sync::OnceLock<Option<rows::SplitInProj>>,
}

/// One `nn.TransformerEncoderLayer` (post-norm).
#[derive(Debug, Clone)]
pub struct EncoderLayer {
    /// `self_attn`.
    pub self_attn: SelfAttention,
    /// `linear1` (`d -> ff`).
    pub linear1: Linear,
    /// `linear2` (`ff -> d`).
    pub linear2: Linear,
    /// `norm1` (after attention).
    pub norm1: LayerNorm,
    /// `norm2` (after the feed-forward).
    pub norm2: LayerNorm,
    /// The feed-forward activation.
    pub activation: Activation,
}

/// `nn.TransformerEncoder` (no final norm: ProtoMotions passes none).
#[derive(Debug, Clone)]
pub struct TransformerEncoder {
    /// `layers.{i}`.
    pub layers: Vec<EncoderLayer>,
    /// The sizes it was built with.
    pub spec: TransformerSpec,
    /// Config path, for errors.
    pub path: String,
}

impl TransformerEncoder {
    /// Loads `{prefix}.layers.{i}.*` from the state dict `dict` of `ckpt`
    /// (`prefix` empty: the keys start at `layers.`). `path` is the config
    /// path named in errors. Refuses a spec whose heads do not divide
    /// `d_model` and weights of any other shape.
    pub fn load(
        ckpt: &Checkpoint,
        dict: &str,
        prefix: &str,
        spec: TransformerSpec,
        path: &str,
        dev: &Device,
    ) -> Result<Self> {
        if spec.heads == 0 || !spec.d_model.is_multiple_of(spec.heads) {
            return Err(PolicyError::Attention {
                path: path.to_owned(),
                problem: AttentionProblem::HeadsDivide { d_model: spec.d_model, heads: spec.heads },
            });
        }
        let d = spec.d_model;
        let three_d = d.checked_mul(3).ok_or_else(|| PolicyError::Attention {
            path: path.to_owned(),
            problem: AttentionProblem::TooWide { d_model: d },
        })?;
        let key = |rest: String| if prefix.is_empty() { rest } else { format!("{prefix}.{rest}") };
        let mut layers = Vec::with_capacity(spec.layers);
        for i in 0..spec.layers {
            let l = key(format!("layers.{i}"));
            let attn = format!("{l}.self_attn");
            let in_proj = load_linear_keys(
                ckpt,
                dict,
                &format!("{attn}.in_proj_weight"),
                &format!("{attn}.in_proj_bias"),
                Some(three_d),
                Some(d),
                path,
                dev,
            )?;
            let out_proj = load_linear(ckpt, dict, &format!("{attn}.out_proj"), Some(d), Some(d), path, dev)?;
            let linear1 = load_linear(ckpt, dict, &format!("{l}.linear1"), Some(spec.ff), Some(d), path, dev)?;
            let linear2 = load_linear(ckpt, dict, &format!("{l}.linear2"), Some(d), Some(spec.ff), path, dev)?;
            let norm = |n: &str| -> Result<LayerNorm> {
                let k = format!("{l}.{n}");
                Ok(LayerNorm {
                    weight: load_vec(ckpt, dict, &format!("{k}.weight"), d, path, dev)?,
                    bias: load_vec(ckpt, dict, &format!("{k}.bias"), d, path, dev)?,
                    key: k,
                })
            };
            layers.push(EncoderLayer {
                self_attn: SelfAttention { in_proj, out_proj, heads: spec.heads, first_only: Default::default() },
                linear1,
                linear2,
                norm1: norm("norm1")?,
                norm2: norm("norm2")?,
                activation: spec.activation,
            });
        }
        Ok(TransformerEncoder { layers, spec, path: path.to_owned() })
    }

    /// Runs every layer on `x` (`[B, S, d_model]`, f32) under `masks`; returns `[B, S, d_model]`.
    pub fn forward(&self, x: &Tensor, masks: &AttentionMasks<'_>) -> Result<Tensor> {
        let mut layers = self.forward_each(x, masks, Keep::Last)?;
        Ok(layers.pop().unwrap_or_else(|| x.clone()))
    }

    /// The last layer's output at position 0 alone, `[B, d_model]`: what
    /// ProtoMotions' `Transformer` keeps (`output[:, 0, :]`), bitwise
    /// [`TransformerEncoder::forward`] there (tested). On the CPU row path the
    /// last layer computes only what position 0 needs: every position's
    /// keys and values, then position 0's attention, `out_proj`, norms and
    /// feed-forward. The other positions' are never read (nothing mixes
    /// positions after the attention), and they were 14 % of MaskedMimic's
    /// multiply-adds at the published sizes (11 tokens: 10 of the last
    /// layer's 11 `out_proj` and feed-forward rows). Under a key-padding
    /// mask alone the padded positions are left out of every layer, as
    /// torch's fast path leaves them out (see the module docs for the one
    /// difference from the whole forward: a non-finite padded position).
    pub fn forward_first(&self, x: &Tensor, masks: &AttentionMasks<'_>) -> Result<Tensor> {
        let (b, s, d) = x.dims3().map_err(|_| self.err(AttentionProblem::InputShape { shape: x.dims().to_vec() }))?;
        if d != self.spec.d_model || s == 0 {
            return Err(self.err(AttentionProblem::InputShape { shape: x.dims().to_vec() }));
        }
        // the masks checked as the whole forward checks them
        self.score_bias(b, s, x.device(), masks)?;
        let rows = x.device().is_cpu() && x.dtype() == DType::F32 && self.rows_ready();
        if rows && b > 0 && !self.layers.is_empty() {
            return self.forward_rows_first(x, b, s, masks);
        }
        Ok(self.forward(x, masks)?.narrow(1, 0, 1)?.squeeze(1)?)
    }

    /// [`TransformerEncoder::forward`] keeping every layer's output
    /// (`[B, S, d_model]` each, the first layer's first; none without layers).
    pub fn forward_each_layer(&self, x: &Tensor, masks: &AttentionMasks<'_>) -> Result<Vec<Tensor>> {
        self.forward_each(x, masks, Keep::Every)
    }

    fn forward_each(&self, x: &Tensor, masks: &AttentionMasks<'_>, keep: Keep) -> Result<Vec<Tensor>> {
        let (b, s, d) = x.dims3().map_err(|_| self.err(AttentionProblem::InputShape { shape: x.dims().to_vec() }))?;
        if d != self.spec.d_model {
            return Err(self.err(AttentionProblem::InputShape { shape: x.dims().to_vec() }));
        }
        let bias = self.score_bias(b, s, x.device(), masks)?;
        if x.elem_count() == 0 {
            // no rows or no tokens: nothing to attend to, nothing to map
            return Ok(vec![x.clone(); keep.count(self.layers.len())]);
        }
        if x.device().is_cpu() && x.dtype() == DType::F32 && self.rows_ready() {
            return self.forward_rows(x, b, s, masks, keep);
        }
        let mut h = x.contiguous()?;
        let mut out = Vec::with_capacity(keep.count(self.layers.len()));
        for (i, layer) in self.layers.iter().enumerate() {
            h = layer.forward(&h, bias.as_ref())?;
            if keep.keeps(i, self.layers.len()) {
                out.push(h.clone());
            }
        }
        Ok(out)
    }

    /// The masks as one additive bias on the scores, `[B or 1, 1, S, S]`
    /// (`0` or the additive mask's entry; `-inf` at padded keys).
    fn score_bias(&self, b: usize, s: usize, dev: &Device, masks: &AttentionMasks<'_>) -> Result<Option<Tensor>> {
        let additive = match masks.additive {
            Some(m) => {
                if m.dims() != [s, s] || !m.dtype().is_float() {
                    return Err(self.err(AttentionProblem::AdditiveMask {
                        shape: m.dims().to_vec(),
                        dtype: m.dtype().as_str(),
                        seq: s,
                    }));
                }
                Some(m.to_dtype(DType::F32)?.reshape((1, 1, s, s))?)
            }
            None => None,
        };
        let padding = match masks.key_padding {
            Some(m) => {
                if m.dims() != [b, s] || m.dtype() != DType::U8 {
                    return Err(self.err(AttentionProblem::KeyPaddingMask {
                        shape: m.dims().to_vec(),
                        dtype: m.dtype().as_str(),
                        batch: b,
                        seq: s,
                    }));
                }
                let zeros = Tensor::zeros((b, s), DType::F32, dev)?;
                let ninf = Tensor::full(f32::NEG_INFINITY, (b, s), dev)?;
                Some(m.ne(0u8)?.where_cond(&ninf, &zeros)?.reshape((b, 1, 1, s))?)
            }
            None => None,
        };
        Ok(match (additive, padding) {
            (Some(a), Some(p)) => Some(a.broadcast_add(&p)?),
            (a, p) => a.or(p),
        })
    }

    fn err(&self, problem: AttentionProblem) -> PolicyError {
        PolicyError::Attention { path: self.path.clone(), problem }
    }

    /// Every Linear, layer by layer (in_proj, out_proj, linear1, linear2).
    pub fn linears(&self) -> impl Iterator<Item = &Linear> {
        self.layers.iter().flat_map(|l| [&l.self_attn.in_proj, &l.self_attn.out_proj, &l.linear1, &l.linear2])
    }
}

impl EncoderLayer {
    /// `x = LN1(x + SA(x)); x = LN2(x + FF(x))` on `[B, S, d]`.
    pub fn forward(&self, x: &Tensor, score_bias: Option<&Tensor>) -> Result<Tensor> {
        let sa = self.self_attn.forward(x, score_bias)?;
        let x = self.norm1.forward(&(x + sa)?)?;
        let ff = linear3(&self.linear2, &self.activation.apply(&linear3(&self.linear1, &x)?)?)?;
        self.norm2.forward(&(x + ff)?)
    }
}

impl SelfAttention {
    /// Self attention over `[B, S, d]` with an optional score bias broadcastable to `[B, h, S, S]`.
    pub fn forward(&self, x: &Tensor, score_bias: Option<&Tensor>) -> Result<Tensor> {
        let (b, s, d) = x.dims3()?;
        let h = self.heads;
        let hd = d / h;
        let qkv = linear3(&self.in_proj, x)?; // [B, S, 3d]
        let split = |i: usize| -> Result<Tensor> {
            Ok(qkv.narrow(D::Minus1, i * d, d)?.reshape((b, s, h, hd))?.transpose(1, 2)?.contiguous()?)
        };
        // torch's native MHA divides q (bias included) by sqrt(head_dim)
        let q = (split(0)? / (hd as f64).sqrt())?;
        let k = split(1)?;
        let v = split(2)?;
        let mut scores = q.matmul(&k.t()?.contiguous()?)?; // [B, h, S, S]
        if let Some(bias) = score_bias {
            scores = scores.broadcast_add(bias)?;
        }
        let weights = safe_softmax_last_dim(&scores)?;
        let ctx = weights.matmul(&v)?.transpose(1, 2)?.reshape((b, s, d))?;
        linear3(&self.out_proj, &ctx)
    }
}

/// Softmax over the last dim, `exp(x - max) / sum`, with torch's
/// `_safe_softmax` rule: a row whose entries are all `-inf` gets zero
/// weights (not NaN). NaN in a row stays NaN.
pub fn safe_softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?;
    // an all -inf row: subtract 0 instead of -inf (exp(-inf) = 0 everywhere)
    let all_masked = max.eq(f64::NEG_INFINITY)?;
    let max = all_masked.where_cond(&max.zeros_like()?, &max)?;
    let e = x.broadcast_sub(&max)?.exp()?;
    let sum = e.sum_keepdim(D::Minus1)?;
    let sum = all_masked.where_cond(&sum.ones_like()?, &sum)?;
    Ok(e.broadcast_div(&sum)?)
}

/// A Linear over the last dim of `[B, S, in]`.
fn linear3(l: &Linear, x: &Tensor) -> Result<Tensor> {
    let (b, s, i) = x.dims3()?;
    let y = l.forward(&x.reshape((b * s, i))?)?;
    Ok(y.reshape((b, s, l.out_features()))?)
}

/// torch's nested-tensor fast path output from this module's: zero at every
/// padded position (`key_padding` `[B, S]` u8, nonzero = padded) of `out` `[B, S, d]`.
pub fn zero_padded_positions(out: &Tensor, key_padding: &Tensor) -> Result<Tensor> {
    let (b, s, d) = out.dims3()?;
    let keep = key_padding.eq(0u8)?.reshape((b, s, 1))?.broadcast_as((b, s, d))?;
    Ok(keep.where_cond(out, &out.zeros_like()?)?)
}
