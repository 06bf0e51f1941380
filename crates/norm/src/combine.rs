//! `combine_moments`: the pairwise merge of (mean, var, count) parts.

use candle_core::{DType, Tensor};

use crate::config::Arithmetic;
use crate::error::{CountProblem, NormError, PartsProblem, Result};
use crate::promote::{self, add, div, sub};

/// Moments of a set of samples: population variance, sample count.
#[derive(Debug, Clone)]
pub struct Moments {
    /// Per-feature mean.
    pub mean: Tensor,
    /// Per-feature population variance (`unbiased=False`).
    pub var: Tensor,
    /// Number of samples.
    pub count: i64,
}

/// A summary for people (the values are tensors: print those for the
/// numbers): `moments of 4096 samples, shape [3] (f32)`.
///
/// ```
/// use candle_core::{Device, Tensor};
/// let m = pmstate_norm::Moments {
///     mean: Tensor::zeros(3, candle_core::DType::F32, &Device::Cpu)?,
///     var: Tensor::ones(3, candle_core::DType::F32, &Device::Cpu)?,
///     count: 4096,
/// };
/// assert_eq!(m.to_string(), "moments of 4096 samples, shape [3] (f32)");
/// # Ok::<(), candle_core::Error>(())
/// ```
impl std::fmt::Display for Moments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "moments of {} samples, shape {} ({})",
            self.count,
            crate::error::Dims(self.mean.dims()),
            self.mean.dtype().as_str()
        )
    }
}

/// Merges k parts into one, as ProtoMotions' `combine_moments` does: a
/// pairwise tree (parts 0+1, 2+3, ...; an odd last part carried up a level
/// unchanged), then the variance clamped at 0.
///
/// In [`Arithmetic::Compat`] the counts are float32 (`counts.float()` in the
/// reference), every intermediate has torch's promoted dtype, and the result
/// count is the float32 total truncated to i64: past 2^24 it rounds.
/// In [`Arithmetic::Exact`] counts are i64 and everything else is f64.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use pmstate_norm::{combine_moments, Arithmetic};
/// let dev = Device::Cpu;
/// let means = [Tensor::new(&[0f32], &dev)?, Tensor::new(&[4f32], &dev)?];
/// let vars = [Tensor::new(&[1f32], &dev)?, Tensor::new(&[1f32], &dev)?];
/// let m = combine_moments(&means, &vars, &[2, 2], Arithmetic::Compat)?;
/// assert_eq!(m.mean.to_vec1::<f32>()?, [2.0]);
/// assert_eq!(m.var.to_vec1::<f32>()?, [5.0]);
/// assert_eq!(m.count, 4);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn combine_moments(means: &[Tensor], vars: &[Tensor], counts: &[i64], arithmetic: Arithmetic) -> Result<Moments> {
    check_parts(means, vars, counts)?;
    match arithmetic {
        Arithmetic::Compat => combine_compat(means, vars, counts),
        Arithmetic::Exact => combine_exact(means, vars, counts),
    }
}

fn check_parts(means: &[Tensor], vars: &[Tensor], counts: &[i64]) -> Result<()> {
    if means.is_empty() {
        return Err(NormError::InvalidParts { problem: PartsProblem::Empty });
    }
    if means.len() != vars.len() || means.len() != counts.len() {
        return Err(NormError::InvalidParts {
            problem: PartsProblem::Lengths { means: means.len(), vars: vars.len(), counts: counts.len() },
        });
    }
    let dev = means[0].device();
    for (i, (m, v)) in means.iter().zip(vars).enumerate() {
        for (what, t) in [("mean", m), ("var", v)] {
            if !matches!(t.dtype(), DType::F32 | DType::F64) {
                return Err(NormError::InvalidParts {
                    problem: PartsProblem::DType { part: i, what, dtype: t.dtype() },
                });
            }
            if !t.device().same_device(dev) {
                return Err(NormError::InvalidParts { problem: PartsProblem::Device { part: i, what } });
            }
        }
        if promote::broadcast_shapes(m.dims(), v.dims()).is_none() {
            return Err(NormError::InvalidParts {
                problem: PartsProblem::MeanVar { part: i, mean: m.dims().to_vec(), var: v.dims().to_vec() },
            });
        }
    }
    let mut shape: Vec<usize> = vec![];
    for (i, t) in means.iter().chain(vars).enumerate() {
        shape = promote::broadcast_shapes(&shape, t.dims()).ok_or_else(|| NormError::InvalidParts {
            problem: PartsProblem::Shape { part: i % means.len(), shape: t.dims().to_vec(), others: shape.clone() },
        })?;
    }
    if let Some((i, c)) = counts.iter().enumerate().find(|(_, c)| **c < 0) {
        return Err(NormError::InvalidParts { problem: PartsProblem::NegativeCount { part: i, count: *c } });
    }
    Ok(())
}

/// One part of a combine: mean, variance and the count type of the arithmetic.
struct Part<C> {
    mean: Tensor,
    var: Tensor,
    count: C,
}

/// The reference's pairwise tree: parts 0+1, 2+3, ... merged level by
/// level, an odd last part carried up unchanged, until one part is left.
/// `merge` is the arithmetic (compat or exact).
fn pairwise_tree<C: Copy>(
    mut parts: Vec<Part<C>>,
    mut merge: impl FnMut(&Part<C>, &Part<C>) -> Result<Part<C>>,
) -> Result<Part<C>> {
    while parts.len() > 1 {
        let mut next = Vec::with_capacity(parts.len().div_ceil(2));
        let mut it = parts.into_iter();
        while let Some(a) = it.next() {
            match it.next() {
                Some(b) => next.push(merge(&a, &b)?),
                None => next.push(a),
            }
        }
        parts = next;
    }
    parts.pop().ok_or(NormError::InvalidParts { problem: PartsProblem::Empty })
}

/// The reference, op for op. Count arithmetic happens on 0-dim float32
/// tensors there; f32 scalars here are the same IEEE operations.
fn combine_compat(means: &[Tensor], vars: &[Tensor], counts: &[i64]) -> Result<Moments> {
    let parts = means
        .iter()
        .zip(vars)
        .zip(counts)
        .map(|((m, v), &c)| Part { mean: m.clone(), var: v.clone(), count: c as f32 })
        .collect();
    let last = pairwise_tree(parts, |a, b| {
        let total = a.count + b.count;
        let delta = sub(&b.mean, &a.mean)?;
        let mean = add(&a.mean, &promote::mul_count(&delta, b.count / total)?)?;
        let m2a = promote::mul_count(&a.var, a.count)?;
        let m2b = promote::mul_count(&b.var, b.count)?;
        let cross = promote::mul_count(&delta.sqr()?, a.count * b.count / total)?;
        let m2 = add(&add(&m2a, &m2b)?, &cross)?;
        Ok(Part { mean, var: promote::div_count(&m2, total)?, count: total })
    })?;
    Ok(Moments {
        mean: last.mean,
        var: promote::clamp_min(&last.var, 0.0)?,
        // `.long()` truncates toward zero.
        count: last.count as i64,
    })
}

fn combine_exact(means: &[Tensor], vars: &[Tensor], counts: &[i64]) -> Result<Moments> {
    let parts = means
        .iter()
        .zip(vars)
        .zip(counts)
        .map(|((m, v), &c)| Ok(Part { mean: m.to_dtype(DType::F64)?, var: v.to_dtype(DType::F64)?, count: c }))
        .collect::<Result<Vec<_>>>()?;
    let last = pairwise_tree(parts, |a, b| {
        let total = a.count.checked_add(b.count).ok_or_else(|| NormError::InvalidCount {
            op: "combine_moments",
            problem: CountProblem::Overflow(a.count, b.count),
        })?;
        if total == 0 {
            // Two empty parts: nothing to weigh, keep the first.
            return Ok(Part { mean: a.mean.clone(), var: a.var.clone(), count: 0 });
        }
        let (fa, fb, ft) = (a.count as f64, b.count as f64, total as f64);
        let delta = sub(&b.mean, &a.mean)?;
        let mean = add(&a.mean, &promote::scalar_mul(fb / ft, &delta)?)?;
        let m2 = add(
            &add(&promote::scalar_mul(fa, &a.var)?, &promote::scalar_mul(fb, &b.var)?)?,
            &promote::scalar_mul(fa * fb / ft, &delta.sqr()?)?,
        )?;
        let var = div(&m2, &promote::scalar(ft, DType::F64, m2.device())?)?;
        Ok(Part { mean, var, count: total })
    })?;
    Ok(Moments { mean: last.mean, var: promote::clamp_min(&last.var, 0.0)?, count: last.count })
}
