//! The encoder's float32 CPU path: the whole stack on flat row-major
//! buffers instead of candle tensors.
//!
//! Why by hand: at MaskedMimic's batch 256 (2,816 token rows of 512) half
//! the candle forward's time was outside the matrix products: every op
//! allocated a fresh 5-17 MB output (page faults and zeroing on each call,
//! the allocator hands such blocks back), the attention split heads with
//! transposes and copies, and residual adds and LayerNorms were separate
//! passes. Here the Linears run the packed kernels into buffers kept per
//! thread across calls, the attention reads q, k and v where `in_proj`
//! wrote them (`[rows, 3d]`: no transposes) and writes each head's context
//! in place (`[rows, d]`), and the residual add is fused into the
//! LayerNorm's pass over the row.
//!
//! The attention and the LayerNorms are row-wise loops compiled per
//! instruction set ([`per_isa`]), on the one the packed Linears run with.
//! Compiled for the baseline alone (SSE2 on x86_64) they took 13 % of
//! MaskedMimic's batch-256 forward on an AVX-512 CPU for 0.5 % of its
//! multiply-adds; the bits are the same on every instruction set (tested).
//!
//! The arithmetic is the candle path's, operation for operation (queries
//! times `1/sqrt(head_dim)` after the bias, scores plus the mask bias,
//! torch's `_safe_softmax`, `exp(s - max) / sum`), in another summation
//! order (16-lane dot products and sums): inside the derived bound of
//! `crate::bound::attention` as the candle path is. Every batch row is
//! computed from its own tokens alone, so its bits do not depend on the
//! other rows or the thread count (the server's batching promise).

use std::cell::RefCell;

use candle_core::{DType, Device, Storage, Tensor};
use rayon::prelude::*;

use super::{AttentionMasks, EncoderLayer, TransformerEncoder};
use crate::activation::Activation;
use crate::error::{PolicyError, Result};
use crate::kernels::{per_isa, Epilogue, PackedLinear, Supported};
use crate::mlp::{lane_sum, layer_norm_row, LayerNorm, Linear};
use crate::problem::GraphProblem;

/// The activation buffers of one forward, kept per thread across calls.
#[derive(Default)]
struct Buffers {
    /// The layer's input and output, `[rows, d]`.
    h: Vec<f32>,
    /// `in_proj`'s output, `[rows, 3d]`.
    qkv: Vec<f32>,
    /// The attention's context, `[rows, d]`.
    ctx: Vec<f32>,
    /// A `[rows, d]` Linear output (`out_proj`, `linear2`).
    y: Vec<f32>,
    /// `linear1`'s output, `[rows, ff]`.
    ff: Vec<f32>,
}

/// The masks as host data: scores get `additive[i][j] + padding[b][j]`
/// (each term present only if its mask is).
struct ScoreBias {
    /// `[S, S]`.
    additive: Option<Vec<f32>>,
    /// `[B, S]`: `-inf` at padded keys, `0` elsewhere.
    padding: Option<Vec<f32>>,
    s: usize,
}

impl ScoreBias {
    fn new(masks: &AttentionMasks<'_>, s: usize) -> Result<Self> {
        let additive = match masks.additive {
            Some(m) => Some(m.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?),
            None => None,
        };
        let padding = match masks.key_padding {
            Some(m) => Some(
                m.flatten_all()?
                    .to_vec1::<u8>()?
                    .into_iter()
                    .map(|p| if p != 0 { f32::NEG_INFINITY } else { 0.0 })
                    .collect(),
            ),
            None => None,
        };
        Ok(ScoreBias { additive, padding, s })
    }

    /// The bias of query `i`, key `j` in batch row `b`, as the candle path
    /// forms it (`additive + padding` when both are given).
    #[inline(always)]
    fn at(&self, b: usize, i: usize, j: usize) -> Option<f32> {
        let a = self.additive.as_ref().map(|a| a[i * self.s + j]);
        let p = self.padding.as_ref().map(|p| p[b * self.s + j]);
        match (a, p) {
            (Some(a), Some(p)) => Some(a + p),
            (a, p) => a.or(p),
        }
    }
}

impl TransformerEncoder {
    /// Whether every Linear has CPU-packed weights (the row path needs them).
    pub(super) fn rows_ready(&self) -> bool {
        self.linears().all(|l| l.packed.is_some())
    }

    /// [`TransformerEncoder::forward`] on float32 CPU `x` (`[b, s, d]`,
    /// shape and masks already checked) through the row path.
    pub(super) fn forward_rows(&self, x: &Tensor, b: usize, s: usize, masks: &AttentionMasks<'_>) -> Result<Tensor> {
        thread_local! {
            static BUFFERS: RefCell<Buffers> = RefCell::new(Buffers::default());
        }
        let bias = ScoreBias::new(masks, s)?;
        BUFFERS.with(|cell| match cell.try_borrow_mut() {
            Ok(mut bufs) => self.forward_rows_in(x, b, s, &bias, &mut bufs),
            // a forward inside a forward on this thread: fresh buffers
            Err(_) => self.forward_rows_in(x, b, s, &bias, &mut Buffers::default()),
        })
    }

    fn forward_rows_in(&self, x: &Tensor, b: usize, s: usize, bias: &ScoreBias, bufs: &mut Buffers) -> Result<Tensor> {
        let d = self.spec.d_model;
        copy_f32(x, &mut bufs.h)?;
        for layer in &self.layers {
            layer.forward_rows(b, s, d, bias, bufs)?;
        }
        Ok(Tensor::from_slice(&bufs.h, (b, s, d), &Device::Cpu)?)
    }
}

impl EncoderLayer {
    /// One post-norm layer on `bufs.h` (`[b * s, d]`), in place.
    fn forward_rows(&self, b: usize, s: usize, d: usize, bias: &ScoreBias, bufs: &mut Buffers) -> Result<()> {
        let rows = b * s;
        let Buffers { h, qkv, ctx, y, ff } = bufs;
        let in_proj = packed(&self.self_attn.in_proj)?;
        let isa = in_proj.supported();
        in_proj.forward_into(h, rows, Epilogue::Identity, qkv);
        ctx.resize(rows * d, 0.0);
        attention(isa, qkv, ctx, b, s, d, self.self_attn.heads, bias);
        packed(&self.self_attn.out_proj)?.forward_into(ctx, rows, Epilogue::Identity, y);
        add_and_norm(isa, h, y, d, &self.norm1)?;
        match self.activation {
            Activation::Relu => packed(&self.linear1)?.forward_into(h, rows, Epilogue::Relu, ff),
            Activation::Identity => packed(&self.linear1)?.forward_into(h, rows, Epilogue::Identity, ff),
            other => {
                // the other activations as candle computes them, on the buffer
                packed(&self.linear1)?.forward_into(h, rows, Epilogue::Identity, ff);
                let width = self.linear1.out_features();
                let t = Tensor::from_slice(ff, (rows, width), &Device::Cpu)?;
                copy_f32(&other.apply(&t)?, ff)?;
            }
        }
        packed(&self.linear2)?.forward_into(ff, rows, Epilogue::Identity, y);
        add_and_norm(isa, h, y, d, &self.norm2)
    }
}

fn packed(l: &Linear) -> Result<&PackedLinear> {
    l.packed.as_ref().ok_or_else(|| PolicyError::Graph { path: l.key.clone(), problem: GraphProblem::WeightsNotPacked })
}

/// `out` = the float32 elements of `t` in row-major order, without an
/// intermediate vector when `t` is contiguous on the CPU.
fn copy_f32(t: &Tensor, out: &mut Vec<f32>) -> Result<()> {
    out.clear();
    {
        let (storage, layout) = t.storage_and_layout();
        if let (Storage::Cpu(cpu), Some((start, end))) = (&*storage, layout.contiguous_offsets()) {
            if let Ok(all) = cpu.as_slice::<f32>() {
                if let Some(part) = all.get(start..end) {
                    out.extend_from_slice(part);
                    return Ok(());
                }
            }
        }
    }
    out.extend_from_slice(&t.flatten_all()?.to_vec1::<f32>()?);
    Ok(())
}

/// `h = LayerNorm(h + y)` row by row (rows in parallel).
fn add_and_norm(isa: Supported, h: &mut [f32], y: &[f32], d: usize, ln: &LayerNorm) -> Result<()> {
    let g = ln.weight.to_vec1::<f32>()?;
    let beta = ln.bias.to_vec1::<f32>()?;
    h.par_chunks_mut(d).zip(y.par_chunks(d)).for_each(|(row, add)| add_and_norm_row(isa, row, add, &g, &beta));
    Ok(())
}

per_isa! {
    /// `row = LayerNorm(row + add)` with weight `g` and bias `beta`.
    fn add_and_norm_row(row: &mut [f32], add: &[f32], g: &[f32], beta: &[f32]) => add_and_norm_row_body
}

#[inline(always)]
fn add_and_norm_row_body(row: &mut [f32], add: &[f32], g: &[f32], beta: &[f32]) {
    for (e, &a) in row.iter_mut().zip(add) {
        *e += a;
    }
    layer_norm_row(row, g, beta);
}

/// Multi-head self attention from `qkv` (`[b * s, 3d]`: q, k, v of each
/// token side by side) into `ctx` (`[b * s, d]`, head `h` in columns
/// `h * hd ..`), one batch row per task.
#[allow(clippy::too_many_arguments)]
fn attention(
    isa: Supported,
    qkv: &[f32],
    ctx: &mut [f32],
    b: usize,
    s: usize,
    d: usize,
    heads: usize,
    bias: &ScoreBias,
) {
    debug_assert_eq!(ctx.len(), b * s * d);
    ctx.par_chunks_mut(s * d)
        .zip(qkv.par_chunks(s * 3 * d))
        .enumerate()
        .for_each(|(row, (out, tokens))| attention_row(isa, out, tokens, row, s, d, heads, bias));
}

per_isa! {
    /// The attention of batch row `row`: its `s` tokens' q, k, v in
    /// `tokens` (`[s, 3d]`), their context into `out` (`[s, d]`).
    fn attention_row(out: &mut [f32], tokens: &[f32], row: usize, s: usize, d: usize, heads: usize, bias: &ScoreBias)
        => attention_row_body
}

#[inline(always)]
fn attention_row_body(out: &mut [f32], tokens: &[f32], row: usize, s: usize, d: usize, heads: usize, bias: &ScoreBias) {
    let hd = d / heads;
    // candle's `q / sqrt(hd)` is an affine with the reciprocal
    let scale = (1.0 / (hd as f64).sqrt()) as f32;
    let mut q = vec![0f32; hd];
    let mut w = vec![0f32; s];
    for head in 0..heads {
        let col = head * hd;
        for i in 0..s {
            let qi = &tokens[i * 3 * d + col..][..hd];
            for (dst, &v) in q.iter_mut().zip(qi) {
                *dst = v * scale;
            }
            for (j, wj) in w.iter_mut().enumerate() {
                let kj = &tokens[j * 3 * d + d + col..][..hd];
                let dot = lane_dot(&q, kj);
                *wj = match bias.at(row, i, j) {
                    Some(add) => dot + add,
                    None => dot,
                };
            }
            safe_softmax(&mut w);
            let ci = &mut out[i * d + col..][..hd];
            ci.fill(0.0);
            for (j, &wj) in w.iter().enumerate() {
                let vj = &tokens[j * 3 * d + 2 * d + col..][..hd];
                for (c, &v) in ci.iter_mut().zip(vj) {
                    *c += wj * v;
                }
            }
        }
    }
}

/// `sum a[i] * b[i]` in [`lane_sum`]'s 16-lane order.
#[inline(always)]
fn lane_dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (xa, xb) in ca.zip(cb) {
        for ((s, &x), &y) in acc.iter_mut().zip(xa).zip(xb) {
            *s += x * y;
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// torch's `_safe_softmax` over one row in place: `exp(x - max) / sum`; a
/// row of only `-inf` gets zeros; a NaN stays NaN.
#[inline(always)]
fn safe_softmax(w: &mut [f32]) {
    if w.iter().any(|v| v.is_nan()) {
        w.fill(f32::NAN);
        return;
    }
    let max = w.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let (max, all_masked) = if max == f32::NEG_INFINITY { (0.0, true) } else { (max, false) };
    for v in w.iter_mut() {
        *v = (*v - max).exp();
    }
    let sum = if all_masked { 1.0 } else { lane_sum(w, |v| v) };
    for v in w.iter_mut() {
        *v /= sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_softmax_zeros_an_all_masked_row_and_keeps_nan() {
        let mut w = [f32::NEG_INFINITY; 3];
        safe_softmax(&mut w);
        assert_eq!(w, [0.0; 3]);
        let mut w = [1.0, f32::NAN, 0.0];
        safe_softmax(&mut w);
        assert!(w.iter().all(|v| v.is_nan()), "{w:?}");
        let mut w = [0.0, f32::NEG_INFINITY, 0.0];
        safe_softmax(&mut w);
        assert_eq!(w, [0.5, 0.0, 0.5]);
    }

    #[test]
    fn attention_and_layer_norm_give_the_baselines_bits_on_every_instruction_set() {
        use crate::kernels::tests::values;
        use pmstate_norm::Isa;
        // 4 heads of 19 (one 16-lane chunk and a tail), 3 batch rows of 5
        // tokens; an additive mask and key padding, one row fully padded
        let (b, s, d, heads) = (3usize, 5usize, 76usize, 4usize);
        let qkv = values(b * s * 3 * d, 0x2545_f491, 2.3);
        let mut padding = vec![0f32; b * s];
        padding[3] = f32::NEG_INFINITY;
        padding[s..2 * s].fill(f32::NEG_INFINITY);
        let additive: Vec<f32> = values(s * s, 0x9e37_79b9, 1.5);
        let bias = ScoreBias { additive: Some(additive), padding: Some(padding), s };
        let (y, g, beta) = (values(b * s * d, 7, 1.0), values(d, 11, 1.0), values(d, 13, 0.5));
        let run = |isa: Supported| {
            let mut ctx = vec![0f32; b * s * d];
            attention(isa, &qkv, &mut ctx, b, s, d, heads, &bias);
            let attended = ctx.clone();
            for (row, add) in ctx.chunks_mut(d).zip(y.chunks(d)) {
                add_and_norm_row(isa, row, add, &g, &beta);
            }
            (attended, ctx)
        };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let (want_ctx, want_norm) = run(Supported::check(Isa::Scalar).expect("the baseline runs anywhere"));
        // the fully padded batch row attends to nothing: zeros, as torch
        assert!(want_ctx[s * d..2 * s * d].iter().all(|&v| v == 0.0));
        assert!(want_ctx.iter().chain(&want_norm).all(|v| v.is_finite()));
        for isa in Isa::ALL {
            match Supported::check(isa) {
                Err(e) => eprintln!("skipped {isa}: {e}"),
                Ok(sup) => {
                    let (ctx, norm) = run(sup);
                    assert_eq!(bits(&ctx), bits(&want_ctx), "{isa}: attention");
                    assert_eq!(bits(&norm), bits(&want_norm), "{isa}: add and LayerNorm");
                }
            }
        }
    }

    #[test]
    fn lane_dot_matches_float64_on_a_tail() {
        let a: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let want: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
        assert!((lane_dot(&a, &b) as f64 - want).abs() < 1e-5, "{} vs {want}", lane_dot(&a, &b));
    }
}
