//! The micro-kernel: one block of `MR` rows by `G` panels of `W` output
//! columns over a range of k, its accumulators in registers.
//!
//! Generic and `#[inline(always)]`: it has no instruction set of its own.
//! [`super::dispatch`] instantiates it inside functions compiled with
//! `#[target_feature]` for AVX-512 and AVX2 (and once plainly, the
//! portable path), so the fused multiply-adds below become `vfmadd` on
//! zmm or ymm registers there. Nothing here may be recursive or stay out
//! of line: a call that is not inlined runs without the caller's
//! features, and `f32::mul_add` then becomes a call of libm's `fmaf`
//! (what made the batch-1 forward 19x too slow on AVX-512).

use super::{relu, Cols, Epilogue};

/// Where a block's sums start: the bias on the first range of k, the
/// partial sums stored by the previous range after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Start {
    /// The first range of k: start from the bias.
    Bias,
    /// A later range: continue from what `out` holds.
    Partial,
}

/// `out[r][g] = epilogue(start + a[.., r] . b_g)` for `MR` rows and `G`
/// consecutive panels.
///
/// - `a`: the micro-panel's k range, `[kc][MR]` (row values interleaved by k);
/// - `b`: the k range of the first panel; panel `g` starts `g * stride`
///   rows further (a panel is `stride` = K rows long);
/// - `bias`: the `G` panels' biases; `out`: `[MR][G]`.
///
/// Every output is one chain `acc = start; acc = fma(x[k], w[k], acc)` in
/// k order, whatever `MR` and `G` are: the row-independence argument of
/// the module docs.
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
pub(super) fn block<const MR: usize, const W: usize, const G: usize>(
    a: &[f32],
    b: &[Cols<W>],
    stride: usize,
    bias: &[Cols<W>],
    out: &mut [Cols<W>],
    start: Start,
    epilogue: Epilogue,
) {
    let kc = a.len() / MR;
    let panels: [&[Cols<W>]; G] = std::array::from_fn(|g| &b[g * stride..][..kc]);
    let out = &mut out[..MR * G];
    let mut acc = [[[0f32; W]; G]; MR];
    for (r, acc) in acc.iter_mut().enumerate() {
        for (g, acc) in acc.iter_mut().enumerate() {
            *acc = match start {
                Start::Bias => bias[g].0,
                Start::Partial => out[r * G + g].0,
            };
        }
    }
    for (kk, av) in a.chunks_exact(MR).enumerate() {
        let bv: [&[f32; W]; G] = std::array::from_fn(|g| &panels[g][kk].0);
        for (acc, &x) in acc.iter_mut().zip(av) {
            for (acc, bv) in acc.iter_mut().zip(&bv) {
                for (s, &w) in acc.iter_mut().zip(bv.iter()) {
                    *s = x.mul_add(w, *s);
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (g, acc) in acc.iter().enumerate() {
            let o = &mut out[r * G + g].0;
            match epilogue {
                Epilogue::Identity => *o = *acc,
                Epilogue::Relu => {
                    for (d, &v) in o.iter_mut().zip(acc) {
                        *d = relu(v);
                    }
                }
            }
        }
    }
}
