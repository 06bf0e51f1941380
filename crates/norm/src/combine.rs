//! `combine_moments`: the pairwise merge of (mean, var, count) parts.

use candle_core::{DType, Tensor};

use crate::config::Arithmetic;
use crate::error::{NormError, Result};
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
        return Err(NormError::InvalidParts { reason: "no parts to combine".into() });
    }
    if means.len() != vars.len() || means.len() != counts.len() {
        return Err(NormError::InvalidParts {
            reason: format!(
                "{} means, {} vars and {} counts: one of each per part",
                means.len(),
                vars.len(),
                counts.len()
            ),
        });
    }
    let dev = means[0].device();
    for (i, (m, v)) in means.iter().zip(vars).enumerate() {
        for (what, t) in [("mean", m), ("var", v)] {
            if !matches!(t.dtype(), DType::F32 | DType::F64) {
                return Err(NormError::InvalidParts {
                    reason: format!("part {i}: {what} has dtype {:?}; need F32 or F64", t.dtype()),
                });
            }
            if !t.device().same_device(dev) {
                return Err(NormError::InvalidParts {
                    reason: format!("part {i}: {what} is on another device than part 0"),
                });
            }
        }
        if promote::broadcast_shapes(m.dims(), v.dims()).is_none() {
            return Err(NormError::InvalidParts {
                reason: format!("part {i}: mean {:?} and var {:?} do not broadcast", m.dims(), v.dims()),
            });
        }
    }
    let mut shape: Vec<usize> = vec![];
    for (i, t) in means.iter().chain(vars).enumerate() {
        shape = promote::broadcast_shapes(&shape, t.dims()).ok_or_else(|| NormError::InvalidParts {
            reason: format!(
                "part {}: shape {:?} does not broadcast with the other parts ({shape:?})",
                i % means.len(),
                t.dims()
            ),
        })?;
    }
    if let Some((i, c)) = counts.iter().enumerate().find(|(_, c)| **c < 0) {
        return Err(NormError::InvalidParts { reason: format!("part {i}: negative count {c}") });
    }
    Ok(())
}

/// The reference, op for op. Count arithmetic happens on 0-dim float32
/// tensors there; f32 scalars here are the same IEEE operations.
fn combine_compat(means: &[Tensor], vars: &[Tensor], counts: &[i64]) -> Result<Moments> {
    let mut means: Vec<Tensor> = means.to_vec();
    let mut vars: Vec<Tensor> = vars.to_vec();
    let mut counts: Vec<f32> = counts.iter().map(|&c| c as f32).collect();
    while means.len() > 1 {
        let (mut nm, mut nv, mut nc) = (vec![], vec![], vec![]);
        for i in (0..means.len()).step_by(2) {
            if i + 1 < means.len() {
                let (ma, va, ca) = (&means[i], &vars[i], counts[i]);
                let (mb, vb, cb) = (&means[i + 1], &vars[i + 1], counts[i + 1]);
                let total = ca + cb;
                let delta = sub(mb, ma)?;
                let mean = add(ma, &promote::mul_count(&delta, cb / total)?)?;
                let m2a = promote::mul_count(va, ca)?;
                let m2b = promote::mul_count(vb, cb)?;
                let cross = promote::mul_count(&delta.sqr()?, ca * cb / total)?;
                let m2 = add(&add(&m2a, &m2b)?, &cross)?;
                nm.push(mean);
                nv.push(promote::div_count(&m2, total)?);
                nc.push(total);
            } else {
                nm.push(means[i].clone());
                nv.push(vars[i].clone());
                nc.push(counts[i]);
            }
        }
        (means, vars, counts) = (nm, nv, nc);
    }
    Ok(Moments {
        mean: means.remove(0),
        var: promote::clamp_min(&vars[0], 0.0)?,
        // `.long()` truncates toward zero.
        count: counts[0] as i64,
    })
}

fn combine_exact(means: &[Tensor], vars: &[Tensor], counts: &[i64]) -> Result<Moments> {
    let f64s = |ts: &[Tensor]| ts.iter().map(|t| t.to_dtype(DType::F64)).collect::<Result<Vec<_>, _>>();
    let mut means = f64s(means)?;
    let mut vars = f64s(vars)?;
    let mut counts: Vec<i64> = counts.to_vec();
    while means.len() > 1 {
        let (mut nm, mut nv, mut nc) = (vec![], vec![], vec![]);
        for i in (0..means.len()).step_by(2) {
            if i + 1 < means.len() {
                let (ma, va, ca) = (&means[i], &vars[i], counts[i]);
                let (mb, vb, cb) = (&means[i + 1], &vars[i + 1], counts[i + 1]);
                let total = ca.checked_add(cb).ok_or_else(|| NormError::InvalidCount {
                    op: "combine_moments",
                    reason: format!("{ca} + {cb} overflows i64"),
                })?;
                if total == 0 {
                    // Two empty parts: nothing to weigh, keep the first.
                    nm.push(ma.clone());
                    nv.push(va.clone());
                    nc.push(0);
                    continue;
                }
                let (fa, fb, ft) = (ca as f64, cb as f64, total as f64);
                let delta = sub(mb, ma)?;
                let mean = add(ma, &promote::scalar_mul(fb / ft, &delta)?)?;
                let m2 = add(
                    &add(&promote::scalar_mul(fa, va)?, &promote::scalar_mul(fb, vb)?)?,
                    &promote::scalar_mul(fa * fb / ft, &delta.sqr()?)?,
                )?;
                let var = div(&m2, &promote::scalar(ft, DType::F64, m2.device())?)?;
                nm.push(mean);
                nv.push(var);
                nc.push(total);
            } else {
                nm.push(means[i].clone());
                nv.push(vars[i].clone());
                nc.push(counts[i]);
            }
        }
        (means, vars, counts) = (nm, nv, nc);
    }
    Ok(Moments { mean: means.remove(0), var: promote::clamp_min(&vars[0], 0.0)?, count: counts[0] })
}
