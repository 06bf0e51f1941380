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
use std::ops::Range;

use candle_core::{DType, Device, Storage, Tensor};
use rayon::prelude::*;

use super::{AttentionMasks, EncoderLayer, Keep, SelfAttention, TransformerEncoder};
use crate::activation::Activation;
use crate::error::{PolicyError, Result};
use crate::kernels::{Epilogue, PackedLinear, Supported};
use crate::mlp::{lane_sum, layer_norm_row, LayerNorm, Linear};
use crate::problem::AttentionProblem;
use crate::problem::GraphProblem;
use pmstate_kernels::per_isa;

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

/// The unpadded positions of each batch row, for a forward that leaves
/// the padded ones out: row `r`'s present tokens are rows
/// `start[r]..start[r + 1]` of the compacted buffers, at the sequence
/// positions `pos` holds there (increasing).
struct Live {
    /// Sequence length.
    s: usize,
    /// `b + 1` offsets into `pos`.
    start: Vec<usize>,
    /// The present positions, row after row.
    pos: Vec<usize>,
}

impl Live {
    /// The present positions under `bias`, or `None` where leaving the
    /// padded ones out would not be the forward torch's fast path runs:
    /// an additive mask, no padding at all, or a row whose position 0 is
    /// padded (the fast path returns zeros there).
    fn of(bias: &ScoreBias, b: usize) -> Option<Live> {
        let padding = bias.padding.as_ref().filter(|_| bias.additive.is_none())?;
        let s = bias.s;
        if s == 0 || padding.len() != b * s || !padding.iter().any(|&p| p != 0.0) {
            return None;
        }
        if padding.chunks_exact(s).any(|row| row[0] != 0.0) {
            return None;
        }
        let mut start = Vec::with_capacity(b + 1);
        let mut pos = Vec::new();
        for row in padding.chunks_exact(s) {
            start.push(pos.len());
            pos.extend(row.iter().enumerate().filter(|(_, &p)| p == 0.0).map(|(j, _)| j));
        }
        start.push(pos.len());
        Some(Live { s, start, pos })
    }

    /// Present tokens in all.
    fn rows(&self) -> usize {
        self.pos.len()
    }

    /// `h` (`[b * s, d]`) down to the present tokens' rows, in order.
    fn gather(&self, h: &mut Vec<f32>, d: usize) {
        for (r, w) in self.start.windows(2).enumerate() {
            for (c, &j) in (w[0]..w[1]).zip(&self.pos[w[0]..w[1]]) {
                let from = (r * self.s + j) * d;
                // c <= r * s + j: every row moves down, in order
                h.copy_within(from..from + d, c * d);
            }
        }
        h.truncate(self.rows() * d);
    }

    /// Each batch row's share of `ctx` (`d` floats a token) and of `qkv`
    /// (`3d` a token).
    fn split<'a>(&'a self, ctx: &'a mut [f32], qkv: &'a [f32], d: usize) -> Vec<RowShare<'a>> {
        let mut out = Vec::with_capacity(self.start.len().saturating_sub(1));
        let mut rest = ctx;
        for (row, w) in self.start.windows(2).enumerate() {
            let (ctx, more) = std::mem::take(&mut rest).split_at_mut((w[1] - w[0]) * d);
            rest = more;
            out.push(RowShare { row, pos: &self.pos[w[0]..w[1]], ctx, qkv: &qkv[w[0] * 3 * d..w[1] * 3 * d] });
        }
        out
    }
}

/// One batch row's part of a [`Live`] forward's buffers.
struct RowShare<'a> {
    /// The batch row.
    row: usize,
    /// Its present positions.
    pos: &'a [usize],
    /// Its present tokens' context rows.
    ctx: &'a mut [f32],
    /// Its present tokens' q, k, v.
    qkv: &'a [f32],
}

thread_local! {
    /// Each thread's activation buffers, kept across calls.
    static BUFFERS: RefCell<Buffers> = RefCell::new(Buffers::default());
}

/// `f` on this thread's [`BUFFERS`], or on fresh buffers for a forward
/// inside a forward on this thread.
fn with_buffers<R>(f: impl FnOnce(&mut Buffers) -> R) -> R {
    BUFFERS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut bufs) => f(&mut bufs),
        Err(_) => f(&mut Buffers::default()),
    })
}

impl TransformerEncoder {
    /// Whether every Linear has CPU-packed weights (the row path needs them).
    pub(crate) fn rows_ready(&self) -> bool {
        self.linears().all(|l| l.packed.is_some())
    }

    /// [`TransformerEncoder::forward`] on float32 CPU `x` (`[b, s, d]`,
    /// shape and masks already checked) through the row path; the outputs
    /// of the layers `keep` names.
    pub(super) fn forward_rows(
        &self,
        x: &Tensor,
        b: usize,
        s: usize,
        masks: &AttentionMasks<'_>,
        keep: Keep,
    ) -> Result<Vec<Tensor>> {
        let bias = ScoreBias::new(masks, s)?;
        with_buffers(|bufs| self.forward_rows_in(x, b, s, &bias, bufs, keep))
    }

    fn forward_rows_in(
        &self,
        x: &Tensor,
        b: usize,
        s: usize,
        bias: &ScoreBias,
        bufs: &mut Buffers,
        keep: Keep,
    ) -> Result<Vec<Tensor>> {
        let d = self.spec.d_model;
        copy_f32(x, &mut bufs.h)?;
        let n = self.layers.len();
        let mut out = Vec::with_capacity(keep.count(n));
        for (i, layer) in self.layers.iter().enumerate() {
            layer.forward_rows(b, s, d, bias, bufs)?;
            if keep.keeps(i, n) {
                out.push(Tensor::from_slice(&bufs.h, (b, s, d), &Device::Cpu)?);
            }
        }
        Ok(out)
    }

    /// [`TransformerEncoder::forward_first`] on float32 CPU `x` (`[b, s, d]`,
    /// `b`, `s` and the layers not zero, shape and masks already checked).
    ///
    /// Under a key-padding mask alone, with position 0 of every row
    /// unpadded, the padded positions are left out altogether ([`Live`]),
    /// as torch's fast path (eval, no grad, key padding only) leaves them
    /// out of its nested tensors: a padded position is a key nobody may
    /// attend to, so its own outputs reach no other position. Position 0's
    /// bits are those of the whole forward wherever the padded positions'
    /// keys and values are finite (their weights are exactly 0, and each
    /// term they would add is a zero); where one is not, torch's slow path
    /// and the whole forward give NaN (`0 * inf`), its fast path and this
    /// one do not.
    pub(super) fn forward_rows_first(
        &self,
        x: &Tensor,
        b: usize,
        s: usize,
        masks: &AttentionMasks<'_>,
    ) -> Result<Tensor> {
        let bias = ScoreBias::new(masks, s)?;
        let d = self.spec.d_model;
        let live = Live::of(&bias, b);
        with_buffers(|bufs| {
            copy_f32(x, &mut bufs.h)?;
            let Some((last, before)) = self.layers.split_last() else {
                return Ok(x.narrow(1, 0, 1)?.squeeze(1)?);
            };
            match &live {
                Some(live) => {
                    live.gather(&mut bufs.h, d);
                    for layer in before {
                        layer.forward_rows_live(live, d, &bias, bufs)?;
                    }
                    last.forward_rows_first_live(live, d, &bias, bufs)?;
                }
                None => {
                    for layer in before {
                        layer.forward_rows(b, s, d, &bias, bufs)?;
                    }
                    last.forward_rows_first(b, s, d, &bias, bufs)?;
                }
            }
            Ok(Tensor::from_slice(&bufs.h[..b * d], (b, d), &Device::Cpu)?)
        })
    }

    /// A key/value cache for [`TransformerEncoder::step`]: `rows`
    /// sequences of `mask`'s `S` positions, under `mask` (`[S, S]`, float,
    /// causal: every later key forbidden to every query).
    pub(crate) fn step_cache(&self, rows: usize, mask: &Tensor) -> Result<StepCache> {
        let s = mask.dim(0).unwrap_or(0);
        if mask.dims() != [s, s] || !mask.dtype().is_float() {
            let (shape, dtype) = (mask.dims().to_vec(), mask.dtype().as_str());
            return Err(self.err(AttentionProblem::AdditiveMask { shape, dtype, seq: s }));
        }
        let bias = ScoreBias::new(&AttentionMasks { additive: Some(mask), key_padding: None }, s)?;
        if let Some(a) = &bias.additive {
            for query in 0..s {
                if let Some(key) = (query + 1..s).find(|&key| a[query * s + key] != f32::NEG_INFINITY) {
                    return Err(self.err(AttentionProblem::NotCausal { query, key }));
                }
            }
        } else if s > 1 {
            return Err(self.err(AttentionProblem::NotCausal { query: 0, key: 1 }));
        }
        let d3 = 3 * self.spec.d_model;
        let per_layer = rows.checked_mul(s).and_then(|n| n.checked_mul(d3)).filter(|&n| n <= isize::MAX as usize / 4);
        let Some(per_layer) = per_layer.filter(|_| self.rows_ready()) else {
            return Err(self.err(AttentionProblem::StepCache { rows, positions: s }));
        };
        let qkv = (0..self.layers.len()).map(|_| vec![0f32; per_layer]).collect();
        Ok(StepCache { rows, s, t: 0, qkv, bias })
    }

    /// The next position of the sequences in `cache`: `x` is its input
    /// (`[rows, d_model]`, float32 on the CPU), the result the last
    /// layer's output there (`[rows, d_model]`). Bitwise what
    /// [`TransformerEncoder::forward`] gives at that position for the
    /// whole sequence under the cache's mask (tested): the same kernels,
    /// the same attention over the keys so far (the later ones masked),
    /// in the same order.
    pub(crate) fn step(&self, x: &Tensor, cache: &mut StepCache) -> Result<Tensor> {
        let d = self.spec.d_model;
        let StepCache { rows, s, t, qkv, bias } = cache;
        if x.dims() != [*rows, d] || *t >= *s || !x.device().is_cpu() || x.dtype() != DType::F32 {
            let (shape, position, rows, positions) = (x.dims().to_vec(), *t, *rows, *s);
            return Err(self.err(AttentionProblem::StepShape { shape, position, rows, positions }));
        }
        let h = with_buffers(|bufs| -> Result<Tensor> {
            copy_f32(x, &mut bufs.h)?;
            for (layer, cached) in self.layers.iter().zip(qkv.iter_mut()) {
                layer.step_rows(*rows, *t, *s, d, bias, bufs, cached)?;
            }
            Ok(Tensor::from_slice(&bufs.h, (*rows, d), &Device::Cpu)?)
        })?;
        *t += 1;
        Ok(h)
    }
}

/// What [`TransformerEncoder::step`] keeps between positions: each layer's
/// q, k and v of the positions so far.
pub(crate) struct StepCache {
    rows: usize,
    /// Positions in all.
    s: usize,
    /// Positions done.
    t: usize,
    /// Per layer `[rows, s, 3d]`: each position's `in_proj` output, as
    /// [`attention`] reads it (positions from `t` on not yet written).
    qkv: Vec<Vec<f32>>,
    bias: ScoreBias,
}

impl EncoderLayer {
    /// One post-norm layer on `bufs.h` (`[b * s, d]`), in place.
    fn forward_rows(&self, b: usize, s: usize, d: usize, bias: &ScoreBias, bufs: &mut Buffers) -> Result<()> {
        let rows = b * s;
        let in_proj = packed(&self.self_attn.in_proj)?;
        let isa = in_proj.supported();
        in_proj.forward_into(&bufs.h, rows, Epilogue::Identity, &mut bufs.qkv);
        bufs.ctx.resize(rows * d, 0.0);
        attention(isa, &bufs.qkv, &mut bufs.ctx, b, s, d, self.self_attn.heads, bias);
        self.after_attention(isa, rows, d, bufs)
    }

    /// [`EncoderLayer::forward_rows`] for position 0 alone: `bufs.h` goes
    /// from `[b * s, d]` to position 0's rows, `[b, d]`. Every position's
    /// q, k and v, then the rest for position 0 (the same code on the same
    /// rows as the whole layer: the same bits there).
    fn forward_rows_first(&self, b: usize, s: usize, d: usize, bias: &ScoreBias, bufs: &mut Buffers) -> Result<()> {
        let isa = self.in_proj_first(b * s, (0..b).map(|row| row * s), d, bufs)?;
        bufs.ctx.resize(b * d, 0.0);
        let heads = self.self_attn.heads;
        let first = Positions { queries: 0..1, keys: s, s };
        bufs.ctx
            .par_chunks_mut(d)
            .zip(bufs.qkv.par_chunks(s * 3 * d))
            .enumerate()
            .for_each(|(row, (out, tokens))| attention_row(isa, out, tokens, row, first.clone(), d, heads, bias));
        // position 0's residual rows, packed to the front
        for row in 1..b {
            bufs.h.copy_within(row * s * d..row * s * d + d, row * d);
        }
        bufs.h.truncate(b * d);
        self.after_attention(isa, b, d, bufs)
    }

    /// [`EncoderLayer::forward_rows`] on the present tokens alone
    /// (`bufs.h`: `[live.rows(), d]`, in place).
    fn forward_rows_live(&self, live: &Live, d: usize, bias: &ScoreBias, bufs: &mut Buffers) -> Result<()> {
        let rows = live.rows();
        let in_proj = packed(&self.self_attn.in_proj)?;
        let isa = in_proj.supported();
        in_proj.forward_into(&bufs.h, rows, Epilogue::Identity, &mut bufs.qkv);
        bufs.ctx.resize(rows * d, 0.0);
        let heads = self.self_attn.heads;
        live.split(&mut bufs.ctx, &bufs.qkv, d).into_par_iter().for_each(|RowShare { row, pos, ctx, qkv }| {
            attention_row_live(isa, ctx, qkv, Present { row, pos, queries: 0..pos.len(), s: live.s }, d, heads, bias)
        });
        self.after_attention(isa, rows, d, bufs)
    }

    /// [`EncoderLayer::forward_rows_first`] on the present tokens alone:
    /// `bufs.h` goes from `[live.rows(), d]` to position 0's rows, `[b, d]`
    /// (position 0 is every row's first present token).
    fn forward_rows_first_live(&self, live: &Live, d: usize, bias: &ScoreBias, bufs: &mut Buffers) -> Result<()> {
        let b = live.start.len() - 1;
        let isa = self.in_proj_first(live.rows(), live.start[..b].iter().copied(), d, bufs)?;
        bufs.ctx.resize(b * d, 0.0);
        let heads = self.self_attn.heads;
        let qkv = &bufs.qkv;
        bufs.ctx.par_chunks_mut(d).enumerate().for_each(|(row, out)| {
            let (from, to) = (live.start[row], live.start[row + 1]);
            let tokens = &qkv[from * 3 * d..to * 3 * d];
            let at = Present { row, pos: &live.pos[from..to], queries: 0..1, s: live.s };
            attention_row_live(isa, out, tokens, at, d, heads, bias)
        });
        for row in 0..b {
            let from = live.start[row] * d;
            bufs.h.copy_within(from..from + d, row * d);
        }
        bufs.h.truncate(b * d);
        self.after_attention(isa, b, d, bufs)
    }

    /// `in_proj` of the `tokens` rows of `bufs.h` into `bufs.qkv`
    /// (`[tokens, 3d]`) where only the rows `firsts` (each row's position
    /// 0) are asked for their query: keys and values of every token, the
    /// queries of those alone ([`SplitInProj`]); the other tokens' query
    /// columns are left as they were (the attention of position 0 reads
    /// none of them). The same bits where written as the whole `in_proj`:
    /// each output is its own column's sum, whichever columns are packed
    /// beside it.
    fn in_proj_first(
        &self,
        tokens: usize,
        firsts: impl Iterator<Item = usize> + Clone,
        d: usize,
        bufs: &mut Buffers,
    ) -> Result<Supported> {
        let in_proj = packed(&self.self_attn.in_proj)?;
        let isa = in_proj.supported();
        let queries = firsts.clone().count();
        let split = if queries < tokens { self.self_attn.split_in_proj() } else { None };
        let Some(split) = split else {
            in_proj.forward_into(&bufs.h, tokens, Epilogue::Identity, &mut bufs.qkv);
            return Ok(isa);
        };
        // y and ff are free until the attention has run: keys and values
        // of every token in y, the first tokens' rows and queries in ff
        split.kv.forward_into(&bufs.h, tokens, Epilogue::Identity, &mut bufs.y);
        let mut firsts_h = std::mem::take(&mut bufs.ff);
        firsts_h.clear();
        for t in firsts.clone() {
            firsts_h.extend_from_slice(&bufs.h[t * d..(t + 1) * d]);
        }
        split.q.forward_into(&firsts_h, queries, Epilogue::Identity, &mut bufs.ctx);
        bufs.ff = firsts_h;
        bufs.qkv.resize(tokens * 3 * d, 0.0);
        for (row, kv) in bufs.qkv.chunks_exact_mut(3 * d).zip(bufs.y.chunks_exact(2 * d)) {
            row[d..].copy_from_slice(kv);
        }
        for (i, t) in firsts.enumerate() {
            bufs.qkv[t * 3 * d..][..d].copy_from_slice(&bufs.ctx[i * d..(i + 1) * d]);
        }
        Ok(isa)
    }

    /// [`EncoderLayer::forward_rows`] for position `t` of `b` sequences of
    /// `s` (`bufs.h`: `[b, d]`), the earlier positions' q, k, v in
    /// `cached` (`[b, s, 3d]`), where this position's are written too.
    #[allow(clippy::too_many_arguments)]
    fn step_rows(
        &self,
        b: usize,
        t: usize,
        s: usize,
        d: usize,
        bias: &ScoreBias,
        bufs: &mut Buffers,
        cached: &mut [f32],
    ) -> Result<()> {
        let in_proj = packed(&self.self_attn.in_proj)?;
        let isa = in_proj.supported();
        in_proj.forward_into(&bufs.h, b, Epilogue::Identity, &mut bufs.qkv);
        let d3 = 3 * d;
        for (seq, new) in cached.chunks_mut(s * d3).zip(bufs.qkv.chunks(d3)) {
            seq[t * d3..][..d3].copy_from_slice(new);
        }
        bufs.ctx.resize(b * d, 0.0);
        let heads = self.self_attn.heads;
        let positions = Positions { queries: t..t + 1, keys: t + 1, s };
        bufs.ctx
            .par_chunks_mut(d)
            .zip(cached.par_chunks(s * d3))
            .enumerate()
            .for_each(|(row, (out, tokens))| attention_row(isa, out, tokens, row, positions.clone(), d, heads, bias));
        self.after_attention(isa, b, d, bufs)
    }

    /// The rest of the layer after the attention wrote `bufs.ctx`
    /// (`[rows, d]`): out_proj, add and norm, feed-forward, add and norm.
    fn after_attention(&self, isa: Supported, rows: usize, d: usize, bufs: &mut Buffers) -> Result<()> {
        let Buffers { h, qkv: _, ctx, y, ff } = bufs;
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

/// `in_proj`'s query rows and its key/value rows, packed apart for the
/// last layer of a first-position forward: there every token needs its key
/// and value, and only position 0 its query, so the other tokens' queries
/// (a third of `in_proj`, d x d multiply-adds a token) are not computed.
#[derive(Debug, Clone)]
pub(crate) struct SplitInProj {
    /// Rows `0..d`: `[d, d]`.
    q: PackedLinear,
    /// Rows `d..3d`: `[2d, d]`.
    kv: PackedLinear,
}

impl SelfAttention {
    /// [`SplitInProj`] of `in_proj`, packed once (for the instruction set
    /// `in_proj`'s kernels run with); `None` without packed weights.
    fn split_in_proj(&self) -> Option<&SplitInProj> {
        self.first_only.get_or_init(|| SplitInProj::of(&self.in_proj).ok()).as_ref()
    }
}

impl SplitInProj {
    fn of(l: &Linear) -> Result<SplitInProj> {
        let isa = packed(l)?.isa();
        let (n, k) = (l.out_features(), l.in_features());
        let d = n / 3;
        let w = l.weight.flatten_all()?.to_vec1::<f32>()?;
        let b = l.bias.to_vec1::<f32>()?;
        let (wq, wkv) = w.split_at(d * k);
        let (bq, bkv) = b.split_at(d);
        Ok(SplitInProj {
            q: PackedLinear::with_isa(wq, bq, d, k, isa)?,
            kv: PackedLinear::with_isa(wkv, bkv, n - d, k, isa)?,
        })
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

/// The present tokens of one batch row for [`attention_row_live`]: their
/// sequence positions (increasing) and which of them are queries.
#[derive(Debug, Clone)]
struct Present<'a> {
    /// The batch row (for the mask bias).
    row: usize,
    /// The present tokens' positions, in the order their q, k, v are stored.
    pos: &'a [usize],
    /// Which present tokens to compute (their context rows in this order).
    queries: Range<usize>,
    /// The sequence's length: the softmax runs over all `s` positions.
    s: usize,
}

/// Which queries and keys of a sequence of `s` positions one attention
/// call computes.
#[derive(Debug, Clone)]
struct Positions {
    /// The queries (their context rows are written in this order).
    queries: Range<usize>,
    /// Keys `0..keys` exist; later ones are masked (position by position,
    /// under a causal mask, they do not exist yet).
    keys: usize,
    /// The sequence's length: the softmax runs over `s` scores, the
    /// missing keys' as `-inf`, so that its sum adds in the order of the
    /// whole sequence's.
    s: usize,
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
    let all = Positions { queries: 0..s, keys: s, s };
    ctx.par_chunks_mut(s * d)
        .zip(qkv.par_chunks(s * 3 * d))
        .enumerate()
        .for_each(|(row, (out, tokens))| attention_row(isa, out, tokens, row, all.clone(), d, heads, bias));
}

per_isa! {
    /// The attention of batch row `row` at `at.queries`: its tokens' q, k,
    /// v in `tokens` (`[keys, 3d]` at least), the queries' context into
    /// `out` (`[queries, d]`).
    fn attention_row(out: &mut [f32], tokens: &[f32], row: usize, at: Positions, d: usize, heads: usize, bias: &ScoreBias)
        => attention_row_body
}

#[inline(always)]
fn attention_row_body(
    out: &mut [f32],
    tokens: &[f32],
    row: usize,
    at: Positions,
    d: usize,
    heads: usize,
    bias: &ScoreBias,
) {
    // every key that exists, each at its own position
    let pos: Vec<usize> = (0..at.keys).collect();
    attention_row_live_body(out, tokens, Present { row, pos: &pos, queries: at.queries, s: at.s }, d, heads, bias)
}

per_isa! {
    /// [`attention_row`] over the present tokens of one batch row alone
    /// ([`Present`]): `tokens` holds their q, k, v (`[pos.len(), 3d]`), the
    /// queries' context rows go into `out` in order. The same operations
    /// as over the whole row: scores at every one of the `s` positions, the
    /// absent ones `-inf` (what a padded key's score is), the softmax over
    /// all `s`, the context summed over the present keys in position order
    /// (an absent key's term, weight 0 times a finite value, is a zero).
    fn attention_row_live(out: &mut [f32], tokens: &[f32], at: Present<'_>, d: usize, heads: usize, bias: &ScoreBias)
        => attention_row_live_body
}

#[inline(always)]
fn attention_row_live_body(out: &mut [f32], tokens: &[f32], at: Present<'_>, d: usize, heads: usize, bias: &ScoreBias) {
    let Present { row, pos, queries, s } = at;
    let hd = d / heads;
    // candle's `q / sqrt(hd)` is an affine with the reciprocal
    let scale = (1.0 / (hd as f64).sqrt()) as f32;
    let mut q = vec![0f32; hd];
    let mut w = vec![0f32; s];
    for head in 0..heads {
        let col = head * hd;
        for (o, c) in queries.clone().enumerate() {
            let i = pos[c];
            let qi = &tokens[c * 3 * d + col..][..hd];
            for (dst, &v) in q.iter_mut().zip(qi) {
                *dst = v * scale;
            }
            w.fill(f32::NEG_INFINITY);
            for (ck, &j) in pos.iter().enumerate() {
                let kj = &tokens[ck * 3 * d + d + col..][..hd];
                let dot = lane_dot(&q, kj);
                w[j] = match bias.at(row, i, j) {
                    Some(add) => dot + add,
                    None => dot,
                };
            }
            safe_softmax(&mut w);
            let ci = &mut out[o * d + col..][..hd];
            ci.fill(0.0);
            // an absent key's weight is 0: leaving it out adds nothing (the
            // sum starts at +0 and never becomes -0)
            for (ck, &j) in pos.iter().enumerate() {
                let wj = w[j];
                let vj = &tokens[ck * 3 * d + 2 * d + col..][..hd];
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
        use crate::kernels::testing::values;
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
            // batch row 0 over its present tokens alone (position 3 padded):
            // the whole row's context at those positions
            let pos = [0usize, 1, 2, 4];
            let tokens: Vec<f32> = pos.iter().flat_map(|&j| qkv[j * 3 * d..(j + 1) * 3 * d].iter().copied()).collect();
            let mut live = vec![0f32; pos.len() * d];
            let at = Present { row: 0, pos: &pos, queries: 0..pos.len(), s };
            attention_row_live(isa, &mut live, &tokens, at, d, heads, &bias);
            for (c, &j) in pos.iter().enumerate() {
                let same = live[c * d..(c + 1) * d]
                    .iter()
                    .zip(&ctx[j * d..(j + 1) * d])
                    .all(|(a, w)| a.to_bits() == w.to_bits());
                assert!(same, "{}: present token {c} (position {j})", isa.isa());
            }
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

    /// What [`SplitInProj`] relies on, on every instruction set: `in_proj`
    /// packed as its query rows and its key/value rows gives the whole
    /// packing's columns bit for bit, at widths that fill no panel and row
    /// counts on both sides of the kernels' small-batch switch.
    #[test]
    fn query_and_key_value_rows_packed_apart_give_the_whole_projections_bits() {
        use crate::kernels::testing::values;
        use pmstate_norm::Isa;
        for isa in Isa::ALL {
            if let Err(e) = Supported::check(isa) {
                eprintln!("skipped {isa}: {e}");
                continue;
            }
            for (d, k) in [(16usize, 16usize), (76, 40), (64, 64)] {
                let w = values(3 * d * k, 0x5bd1_e995 ^ d as u32, 0.3);
                let b = values(3 * d, 0x27d4_eb2d, 0.5);
                let whole = PackedLinear::with_isa(&w, &b, 3 * d, k, isa).expect("whole");
                let q = PackedLinear::with_isa(&w[..d * k], &b[..d], d, k, isa).expect("q");
                let kv = PackedLinear::with_isa(&w[d * k..], &b[d..], 2 * d, k, isa).expect("kv");
                for m in [1usize, 3, 13, 40] {
                    let x = values(m * k, 0x1656_67b1 ^ m as u32, 1.1);
                    let (all, yq, ykv) = (
                        whole.forward(&x, m, Epilogue::Identity),
                        q.forward(&x, m, Epilogue::Identity),
                        kv.forward(&x, m, Epilogue::Identity),
                    );
                    for r in 0..m {
                        let row = &all[r * 3 * d..(r + 1) * 3 * d];
                        let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                        assert!(same(&row[..d], &yq[r * d..(r + 1) * d]), "{isa}, d {d}, {m} rows: query of row {r}");
                        assert!(
                            same(&row[d..], &ykv[r * 2 * d..(r + 1) * 2 * d]),
                            "{isa}, d {d}, {m} rows: k/v of row {r}"
                        );
                    }
                }
            }
        }
    }

    /// The recorded 2-layer encoder (d 16, 4 heads, ff 24).
    fn recorded(act: &str, activation: Activation) -> TransformerEncoder {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy/transformer_encoder");
        let ckpt = pmstate_ckpt::Checkpoint::open(dir.join("weights.safetensors")).expect("the recorded weights");
        let spec = super::super::TransformerSpec { d_model: 16, heads: 4, ff: 24, layers: 2, activation };
        TransformerEncoder::load(&ckpt, "", act, spec, "test.transformer", &Device::Cpu).expect("the encoder")
    }

    #[test]
    fn step_by_step_gives_the_whole_sequences_bits_at_every_position() {
        use crate::kernels::testing::values;
        // 21 positions: the softmax sums more than one 16-lane chunk
        for (act, activation) in [("relu", Activation::Relu), ("gelu", Activation::Gelu)] {
            let enc = recorded(act, activation);
            for (b, s) in [(3usize, 21usize), (1, 5), (2, 1)] {
                let x = Tensor::from_vec(values(b * s * 16, 0x2545_f491 ^ s as u32, 1.7), (b, s, 16), &Device::Cpu)
                    .expect("x");
                let mask = crate::gpc::causal_mask(s - 1, &Device::Cpu).expect("a causal mask");
                let masks = AttentionMasks { additive: Some(&mask), key_padding: None };
                let whole = enc.forward(&x, &masks).expect("forward").to_vec3::<f32>().expect("out");
                let mut cache = enc.step_cache(b, &mask).expect("a cache");
                for t in 0..s {
                    let xt = x.narrow(1, t, 1).and_then(|v| v.squeeze(1)).expect("position t");
                    let got = enc.step(&xt, &mut cache).expect("a step").to_vec2::<f32>().expect("out");
                    for (r, (got, whole)) in got.iter().zip(&whole).enumerate() {
                        let same = got.iter().zip(&whole[t]).all(|(a, w)| a.to_bits() == w.to_bits());
                        assert!(same, "{act}, {b} x {s}: row {r} position {t}: {got:?} vs {:?}", whole[t]);
                    }
                }
                // the cache is full: one more position is refused, named
                let xt = x.narrow(1, 0, 1).and_then(|v| v.squeeze(1)).expect("position 0");
                let e = enc.step(&xt, &mut cache).expect_err("past the last position");
                assert!(e.to_string().contains(&format!("position {s}")), "{e}");
            }
        }
    }

    #[test]
    fn the_first_position_alone_gives_the_whole_forwards_bits_there() {
        use crate::kernels::testing::values;
        let bits = |t: &Tensor| {
            t.flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .expect("values")
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        };
        let whole_first = |enc: &TransformerEncoder, x: &Tensor, masks: &AttentionMasks<'_>| {
            enc.forward(x, masks).and_then(|o| Ok(o.narrow(1, 0, 1)?.squeeze(1)?)).expect("forward")
        };
        for (act, activation) in [("relu", Activation::Relu), ("gelu", Activation::Gelu)] {
            let enc = recorded(act, activation);
            // 21 positions (softmax over more than one 16-lane chunk), 13 rows
            // (more than one kernel block), one position
            for (b, s) in [(3usize, 21usize), (13, 4), (2, 1)] {
                let v = values(b * s * 16, 0x9e37_79b9 ^ s as u32, 1.7);
                let x = Tensor::from_vec(v.clone(), (b, s, 16), &Device::Cpu).expect("x");
                // padded positions here and there (never position 0), a row
                // with all but position 0 padded, a row with none
                let pad: Vec<u8> = (0..b * s).map(|i| (i % s != 0 && (i / s == 1 || i % 3 == 1)) as u8).collect();
                let pad = Tensor::from_vec(pad, (b, s), &Device::Cpu).expect("padding");
                // position 0 padded in a row: the whole forward's values there
                let mut first_padded = vec![0u8; b * s];
                first_padded[0] = 1;
                let first_padded = Tensor::from_vec(first_padded, (b, s), &Device::Cpu).expect("padding");
                for masks in [
                    AttentionMasks { additive: None, key_padding: Some(&pad) },
                    AttentionMasks { additive: None, key_padding: Some(&first_padded) },
                    AttentionMasks::default(),
                ] {
                    let first = enc.forward_first(&x, &masks).expect("forward_first");
                    assert_eq!(first.dims(), [b, 16]);
                    assert_eq!(bits(&first), bits(&whole_first(&enc, &x, &masks)), "{act}, {b} x {s}");
                }
                if s > 1 {
                    // a NaN at a padded position reaches position 0 in the whole
                    // (torch's slow path: 0 * NaN); here, as in torch's fast
                    // path, padded positions reach nothing
                    let masks = AttentionMasks { additive: None, key_padding: Some(&pad) };
                    let mut nan = v.clone();
                    nan[(s + 1) * 16 + 3] = f32::NAN;
                    let nan = Tensor::from_vec(nan, (b, s, 16), &Device::Cpu).expect("x");
                    let got = enc.forward_first(&nan, &masks).expect("forward_first");
                    assert_eq!(bits(&got), bits(&enc.forward_first(&x, &masks).expect("forward_first")), "{act}");
                    let whole = whole_first(&enc, &nan, &masks).to_vec2::<f32>().expect("rows");
                    assert!(whole[1].iter().all(|v| v.is_nan()), "{act}: the whole forward's row 1");
                }
            }
            // no positions: refused, named
            let empty = Tensor::zeros((2, 0, 16), DType::F32, &Device::Cpu).expect("empty");
            let e = enc.forward_first(&empty, &AttentionMasks::default()).expect_err("no position 0");
            assert!(matches!(&e, PolicyError::Attention { problem: AttentionProblem::InputShape { .. }, .. }), "{e}");
        }
    }

    #[test]
    fn a_mask_that_lets_a_query_see_a_later_key_or_an_overflowing_size_gets_no_step_cache() {
        let enc = recorded("relu", Activation::Relu);
        let mut v = vec![0f32; 9];
        v[2] = 0.0; // query 0 sees key 2
        v[1] = f32::NEG_INFINITY;
        v[5] = f32::NEG_INFINITY;
        let mask = Tensor::from_vec(v, (3, 3), &Device::Cpu).expect("mask");
        let e = enc.step_cache(2, &mask).err().expect("refused");
        assert!(
            matches!(&e, PolicyError::Attention { problem: AttentionProblem::NotCausal { query: 0, key: 2 }, .. }),
            "{e}"
        );
        let none = enc.step_cache(2, &Tensor::zeros((3, 3), DType::F32, &Device::Cpu).expect("zeros")).err();
        assert!(matches!(none, Some(PolicyError::Attention { problem: AttentionProblem::NotCausal { .. }, .. })));
        // a cache whose size overflows is refused before any allocation, named
        let causal = crate::gpc::causal_mask(2, &Device::Cpu).expect("a causal mask");
        let e = enc.step_cache(usize::MAX / 2, &causal).err().expect("refused");
        assert!(
            matches!(&e, PolicyError::Attention { problem: AttentionProblem::StepCache { positions: 3, .. }, .. }),
            "{e}"
        );
    }

    #[test]
    fn lane_dot_matches_float64_on_a_tail() {
        let a: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let want: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
        assert!((lane_dot(&a, &b) as f64 - want).abs() < 1e-5, "{} vs {want}", lane_dot(&a, &b));
    }
}
