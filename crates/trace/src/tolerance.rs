//! Free-mode tolerances, derived from float32 reduction error bounds.
//!
//! In free mode we compute batch moments ourselves (f64 accumulation) while
//! torch reduced in float32. With unit roundoff u (2^-24 for float32 input,
//! 2^-53 for float64), N rows and L = ceil(log2 N) + 2 (the depth of a
//! pairwise/cascaded sum plus the division), per feature:
//!
//! - mean: a float32 sum of N terms is off by at most L·u·Σ|x|, and both
//!   results are rounded once more: `tol_mean = L·u·S1 + 2u·|μ|`, S1 = mean|x|;
//! - var: summing the N squared deviations adds L·u·S2 (S2 = mean (x-μ)²),
//!   forming each deviation and square 2u·S2, the final roundings 2u·S2; a
//!   mean off by e shifts the mean squared deviation by at most 2·A·e + e²
//!   (A = mean|x-μ|): `tol_var = (L+4)·u·S2 + 2·A·tol_mean + tol_mean²`.
//!
//! These propagate through each update with the update's own weights (a
//! convex combination cannot amplify them), plus the roundings in which the
//! two sides may differ: float32 products of the batch terms (2u times the
//! term) and f64 roundings of the result (4·2^-53 times it). Normalize
//! outputs follow from the state's bounds, a 1-ulp difference in std (torch's
//! float32 sqrt) and the output's own roundings. The replay engine applies
//! these; the README repeats the derivation.

use candle_core::{DType, Tensor};
use pmstate_norm::Direction;

/// 2^-24.
pub const U32: f64 = 5.960_464_477_539_063e-8;
/// 2^-53.
pub const U64: f64 = 1.110_223_024_625_156_5e-16;

/// The unit roundoff of a dtype's arithmetic (float32 for anything but F64).
pub fn unit_roundoff(d: DType) -> f64 {
    if d == DType::F64 {
        U64
    } else {
        U32
    }
}

/// Per-feature bounds on |recorded - replayed| for moments.
#[derive(Debug, Clone, Default)]
pub struct MomentTol {
    /// Mean.
    pub mean: Vec<f64>,
    /// Variance (population).
    pub var: Vec<f64>,
}

fn values(t: &Tensor) -> Vec<f64> {
    t.flatten_all().and_then(|t| t.to_dtype(DType::F64)).and_then(|t| t.to_vec1::<f64>()).unwrap_or_default()
}

/// Bounds on torch's float32 batch moments of `x` ([N, ...]) against exact ones.
pub fn batch(x: &Tensor) -> MomentTol {
    let n = x.dims().first().copied().unwrap_or(0);
    let v = values(x);
    if n == 0 || v.is_empty() {
        return MomentTol::default();
    }
    let cols = v.len() / n;
    let u = unit_roundoff(x.dtype());
    let l = (n as f64).log2().ceil() + 2.0;
    let mut t = MomentTol { mean: vec![0.0; cols], var: vec![0.0; cols] };
    for c in 0..cols {
        let col = || v.iter().skip(c).step_by(cols);
        let mu = col().sum::<f64>() / n as f64;
        let s1 = col().map(|x| x.abs()).sum::<f64>() / n as f64;
        let s2 = col().map(|x| (x - mu) * (x - mu)).sum::<f64>() / n as f64;
        let a = col().map(|x| (x - mu).abs()).sum::<f64>() / n as f64;
        let tm = l * u * s1 + 2.0 * u * mu.abs();
        t.mean[c] = tm;
        t.var[c] = (l + 4.0) * u * s2 + 2.0 * a * tm + tm * tm;
    }
    t
}

fn at(v: &[f64], i: usize) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v[i % v.len()]
    }
}

/// Bounds on the cross-rank `combine_moments` of W parts (ours vs torch's),
/// given each part's bounds. `u_c` is the unit roundoff of the combine's
/// arithmetic (float32 for float32 parts).
#[allow(clippy::needless_range_loop)] // j indexes several per-feature vectors
pub fn combined(parts: &[(Vec<f64>, Vec<f64>, i64)], tols: &[MomentTol], mean: &[f64], u_c: f64) -> MomentTol {
    let n: f64 = parts.iter().map(|p| p.2 as f64).sum();
    let levels = (parts.len() as f64).log2().ceil() + 1.0;
    let d = mean.len();
    let mut out = MomentTol { mean: vec![0.0; d], var: vec![0.0; d] };
    for j in 0..d {
        let big_m = mean[j];
        let max_m = parts.iter().map(|p| at(&p.0, j).abs()).fold(0.0, f64::max);
        let max_dev = parts.iter().map(|p| (at(&p.0, j) - big_m).abs()).fold(0.0, f64::max);
        let max_v = parts.iter().map(|p| at(&p.1, j).abs()).fold(0.0, f64::max);
        let dm: f64 = parts.iter().zip(tols).map(|(p, t)| p.2 as f64 / n * at(&t.mean, j)).sum::<f64>()
            + 4.0 * levels * u_c * (max_m + max_dev);
        let dv: f64 = parts
            .iter()
            .zip(tols)
            .map(|(p, t)| {
                let e = at(&t.mean, j) + dm;
                p.2 as f64 / n * (at(&t.var, j) + 2.0 * (at(&p.0, j) - big_m).abs() * e + e * e)
            })
            .sum::<f64>()
            + 8.0 * levels * u_c * (max_v + max_dev * max_dev);
        out.mean[j] = dm;
        out.var[j] = dv;
    }
    out
}

/// What one update did, in the terms the bound needs (ours, per feature).
pub struct UpdateTerms<'a> {
    /// `None` (Welford) or the EMA decay.
    pub ema_decay: Option<f64>,
    /// Exact arithmetic (adds the EMA between-batch term).
    pub exact: bool,
    /// Replayed count before the update.
    pub count_before: i64,
    /// Rows in the batch the update used.
    pub batch_count: i64,
    /// Replayed mean before the update.
    pub mean_before: &'a [f64],
    /// Batch mean the update used.
    pub batch_mean: &'a [f64],
    /// Batch variance the update used.
    pub batch_var: &'a [f64],
    /// Replayed mean after the update.
    pub mean_after: &'a [f64],
    /// Replayed var after the update.
    pub var_after: &'a [f64],
    /// Unit roundoff of the batch moments' dtype.
    pub u_batch: f64,
}

/// The state's bounds after an update, from its bounds before and the
/// batch's.
pub fn update(state: &MomentTol, batch: &MomentTol, t: &UpdateTerms<'_>) -> MomentTol {
    let d = t.mean_after.len();
    let mut out = MomentTol { mean: vec![0.0; d], var: vec![0.0; d] };
    let (wa, wb) = match t.ema_decay {
        Some(dcy) => (dcy, 1.0 - dcy),
        None => {
            let n = (t.count_before + t.batch_count) as f64;
            if n == 0.0 {
                (1.0, 0.0)
            } else {
                (t.count_before as f64 / n, t.batch_count as f64 / n)
            }
        }
    };
    for j in 0..d {
        let delta = (at(t.batch_mean, j) - at(t.mean_before, j)).abs();
        let e = at(&state.mean, j) + at(&batch.mean, j);
        let cross = match (t.ema_decay, t.exact) {
            (None, _) | (Some(_), true) => wa * wb * (2.0 * delta * e + e * e),
            (Some(_), false) => 0.0,
        };
        out.mean[j] = wa * at(&state.mean, j)
            + wb * at(&batch.mean, j)
            + 2.0 * t.u_batch * wb * at(t.batch_mean, j).abs()
            + 4.0 * U64 * (at(t.mean_after, j).abs() + wb * delta);
        out.var[j] = wa * at(&state.var, j)
            + wb * at(&batch.var, j)
            + 2.0 * t.u_batch * wb * at(t.batch_var, j).abs()
            + cross
            + 4.0 * U64 * at(t.var_after, j).abs();
    }
    out
}

/// Per-feature bounds on normalize's (or un_norm's) output and on std, from
/// the state's bounds. `mean`, `var`: the replayed buffers; `std`: ours.
/// Bounds on normalize's inputs: std and the float32 mean.
pub struct NormalizeTol {
    /// Float32 std, `sqrt(var.float() + eps)`.
    pub std: Vec<f64>,
    /// Bound on |Δ mean.float()|.
    pub mean32: Vec<f64>,
}

#[allow(clippy::needless_range_loop)]
/// The std and float32-mean bounds for normalize, from the state's bounds.
pub fn normalize_terms(state: &MomentTol, mean: &[f64], var: &[f64], std: &[f64]) -> NormalizeTol {
    let d = std.len();
    let mut out = NormalizeTol { std: vec![0.0; d], mean32: vec![0.0; d] };
    for j in 0..d {
        let s = std[j].max(f64::MIN_POSITIVE);
        out.mean32[j] = at(&state.mean, j) + 2.0 * U32 * at(mean, j).abs();
        out.std[j] = (at(&state.var, j) + 2.0 * U32 * at(var, j).abs()) / (2.0 * s) + 3.0 * U32 * s;
    }
    out
}

/// What normalize's output bound depends on besides the state's bounds
/// ([`NormalizeTol`]): the step's values, flattened (the state's shape repeating).
pub struct NormalizeValues<'a> {
    /// The input.
    pub x: &'a [f64],
    /// The recorded output.
    pub y: &'a [f64],
    /// The float32 mean the observation normalizer subtracts; `None` for
    /// the reward normalizer, which only scales.
    pub mean32: Option<&'a [f64]>,
    /// Our float32 std.
    pub std: &'a [f64],
    /// The module's clamp, if any.
    pub clamp: Option<f64>,
    /// Unit roundoff of the output dtype.
    pub u_out: f64,
}

/// Per-element bounds on the output of normalize (or of un_norm, by
/// `direction`) for the step's values `v`.
pub fn normalize_output(t: &NormalizeTol, v: &NormalizeValues<'_>, direction: Direction) -> Vec<f64> {
    v.x.iter()
        .zip(v.y)
        .enumerate()
        .map(|(i, (&xv, &yv))| {
            let s = at(v.std, i).max(f64::MIN_POSITIVE);
            let dm = if v.mean32.is_some() { at(&t.mean32, i) } else { 0.0 };
            let m = v.mean32.map_or(0.0, |m| at(m, i));
            match direction {
                Direction::UnNormalize => {
                    let cx = v.clamp.map_or(xv, |c| xv.clamp(-c, c));
                    cx.abs() * at(&t.std, i) + dm + 4.0 * v.u_out * (cx.abs() * s + m.abs())
                }
                Direction::Normalize => dm / s + (xv - m).abs() * at(&t.std, i) / (s * s) + 4.0 * v.u_out * yv.abs(),
            }
        })
        .collect()
}
