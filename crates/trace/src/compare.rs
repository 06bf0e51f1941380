//! Field-by-field comparison: max abs error, max ulp distance, first mismatch.

use std::fmt;

use candle_core::{DType, Tensor};
use pmstate_norm::Dims;
use serde::Serialize;

/// Whether a field that is not a value comparison ([`FieldReport::note`]) passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It passes (both the reference and the replay raised).
    Pass,
    /// It fails.
    Fail,
}

/// How one recorded field compared with the replay.
#[derive(Debug, Clone, Serialize)]
pub struct FieldReport {
    /// Step index.
    pub step: usize,
    /// The operation.
    pub op: &'static str,
    /// The field compared.
    pub field: String,
    /// Largest |replayed - recorded| over the elements (0 when equal).
    pub max_abs: f64,
    /// Largest distance in units in the last place of the recorded dtype.
    pub max_ulps: u64,
    /// Index (flattened) of the first element outside its tolerance.
    pub first_mismatch: Option<usize>,
    /// Largest tolerance used (0 for exact comparisons).
    pub tolerance: f64,
    /// Largest |replayed - recorded| / tolerance (free mode): how much of
    /// the bound the worst element used; <= 1 when the field passes.
    pub bound_used: f64,
    /// Whether every compared field matched.
    pub pass: bool,
    /// Why it failed when not a value difference (dtype, shape, error).
    pub note: Option<String>,
}

impl FieldReport {
    /// A report that is not a value comparison (an error, a missing result).
    pub fn note(step: usize, op: &'static str, field: &str, verdict: Verdict, note: String) -> Self {
        let pass = verdict == Verdict::Pass;
        FieldReport {
            step,
            op,
            field: field.to_string(),
            max_abs: if pass { 0.0 } else { f64::INFINITY },
            max_ulps: if pass { 0 } else { u64::MAX },
            first_mismatch: if pass { None } else { Some(0) },
            tolerance: 0.0,
            bound_used: 0.0,
            pass,
            note: Some(note),
        }
    }
}

/// `step 3 normalize out max_ulps 2 max_abs 1.192e-7`, then (free mode)
/// the bound it was judged by and the share of it used, the first
/// mismatch and the note when there are any: a large ulp count alone (a
/// value near zero) says nothing about passing.
impl fmt::Display for FieldReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "step {} {} {} max_ulps ", self.step, self.op, self.field)?;
        match self.max_ulps {
            u64::MAX => f.write_str("inf")?,
            n => write!(f, "{n}")?,
        }
        write!(f, " max_abs {:.3e}", self.max_abs)?;
        if self.tolerance > 0.0 {
            write!(f, " using {:.1}% of its bound (bound up to {:.3e})", self.bound_used * 100.0, self.tolerance)?;
        }
        if let Some(i) = self.first_mismatch {
            write!(f, " first mismatch at element {i}")?;
        }
        if let Some(n) = &self.note {
            write!(f, " ({n})")?;
        }
        Ok(())
    }
}

fn ordered_bits(v: f64, dtype: DType) -> i64 {
    match dtype {
        DType::F32 => {
            let b = (v as f32).to_bits() as i32 as i64;
            if b < 0 {
                i32::MIN as i64 - b
            } else {
                b
            }
        }
        _ => {
            let b = v.to_bits() as i64;
            if b < 0 {
                i64::MIN - b
            } else {
                b
            }
        }
    }
}

fn values(t: &Tensor) -> candle_core::Result<Vec<f64>> {
    t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()
}

/// Compares `got` with the recorded `want`: dtype and shape must agree;
/// then each element must be within `tol` (per element, broadcast from a
/// shorter vector by repetition; `None`: bit for bit). NaN matches NaN.
pub fn compare(
    step: usize,
    op: &'static str,
    field: &str,
    got: &Tensor,
    want: &Tensor,
    tol: Option<&[f64]>,
) -> FieldReport {
    if got.dtype() != want.dtype() || got.dims() != want.dims() {
        return FieldReport::note(
            step,
            op,
            field,
            Verdict::Fail,
            format!(
                "replayed {} {}, recorded {} {}",
                got.dtype().as_str(),
                Dims(got.dims()),
                want.dtype().as_str(),
                Dims(want.dims())
            ),
        );
    }
    let (g, w) = match (values(got), values(want)) {
        (Ok(g), Ok(w)) => (g, w),
        (Err(e), _) | (_, Err(e)) => return FieldReport::note(step, op, field, Verdict::Fail, e.to_string()),
    };
    let dtype = want.dtype();
    let mut rep = FieldReport {
        step,
        op,
        field: field.to_string(),
        max_abs: 0.0,
        max_ulps: 0,
        first_mismatch: None,
        tolerance: 0.0,
        bound_used: 0.0,
        pass: true,
        note: None,
    };
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let both_nan = a.is_nan() && b.is_nan();
        let (abs, ulps) = if both_nan {
            (0.0, 0)
        } else if a.is_nan() || b.is_nan() {
            (f64::INFINITY, u64::MAX)
        } else if dtype.is_float() {
            ((a - b).abs(), ordered_bits(*a, dtype).abs_diff(ordered_bits(*b, dtype)))
        } else {
            ((a - b).abs(), (a - b).abs() as u64)
        };
        let t = tol.map_or(0.0, |t| if t.is_empty() { 0.0 } else { t[i % t.len()] });
        rep.tolerance = rep.tolerance.max(t);
        rep.max_abs = rep.max_abs.max(abs);
        rep.max_ulps = rep.max_ulps.max(ulps);
        if t > 0.0 && abs.is_finite() {
            rep.bound_used = rep.bound_used.max(abs / t);
        }
        let ok = match tol {
            None => {
                ulps == 0
                    && (a.to_bits() == b.to_bits()
                        || both_nan
                        || (*a == 0.0 && *b == 0.0 && a.is_sign_negative() == b.is_sign_negative()))
            }
            Some(_) => both_nan || abs <= t || a == b,
        };
        if !ok && rep.first_mismatch.is_none() {
            rep.first_mismatch = Some(i);
            rep.pass = false;
        }
    }
    rep
}
