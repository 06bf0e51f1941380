//! Torch's elementwise arithmetic, dtype for dtype, on candle tensors.
//!
//! Bit-exactness with the reference depends less on the formulas than on the
//! dtype each intermediate has. Torch's rule for two float tensors: a 0-dim
//! tensor never widens a dimensioned one of the same category, so
//! `f32[D] * f64[]` stays f32 (the count in `var_b * count_b`), while
//! `f32[D] - f64[D]` is f64. A Python scalar is a "wrapped number": it never
//! widens a tensor and is cast to the tensor's dtype first. These helpers
//! apply those rules and then run one IEEE operation per element, on any
//! candle device.

use candle_core::{DType, Device, Tensor};

use crate::error::Result;

/// torch.promote_types over the float dtypes we do arithmetic in.
pub(crate) fn promote_types(a: DType, b: DType) -> DType {
    use DType::*;
    match (a, b) {
        _ if a == b => a,
        (F64, _) | (_, F64) => F64,
        _ => F32,
    }
}

/// The dtype torch gives `a op b` for two float tensors.
pub(crate) fn result_dtype(a: &Tensor, b: &Tensor) -> DType {
    match (a.rank() == 0, b.rank() == 0) {
        (false, true) => a.dtype(),
        (true, false) => b.dtype(),
        _ => promote_types(a.dtype(), b.dtype()),
    }
}

#[derive(Clone, Copy)]
pub(crate) enum Bin {
    Add,
    Sub,
    Mul,
    Div,
}

/// `a op b` with torch's promotion and broadcasting.
pub(crate) fn binary(a: &Tensor, b: &Tensor, op: Bin) -> Result<Tensor> {
    let dt = result_dtype(a, b);
    let a = a.to_dtype(dt)?;
    let b = b.to_dtype(dt)?;
    Ok(match op {
        Bin::Add => a.broadcast_add(&b)?,
        Bin::Sub => a.broadcast_sub(&b)?,
        Bin::Mul => a.broadcast_mul(&b)?,
        Bin::Div => a.broadcast_div(&b)?,
    })
}

pub(crate) fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(a, b, Bin::Add)
}
pub(crate) fn sub(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(a, b, Bin::Sub)
}
pub(crate) fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(a, b, Bin::Mul)
}
pub(crate) fn div(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(a, b, Bin::Div)
}

/// A 0-dim tensor of `dtype` holding `v` rounded to that dtype.
pub(crate) fn scalar(v: f64, dtype: DType, device: &Device) -> Result<Tensor> {
    Ok(Tensor::new(v, device)?.to_dtype(dtype)?)
}

/// `python_scalar * t`: the scalar is rounded to t's dtype, then one multiply.
pub(crate) fn scalar_mul(s: f64, t: &Tensor) -> Result<Tensor> {
    let s = scalar(s, t.dtype(), t.device())?;
    Ok(t.broadcast_mul(&s)?)
}

/// `t * c` where `c` is a float32 0-dim tensor value (a count in
/// `combine_moments`): torch casts it to t's dtype, exactly.
pub(crate) fn mul_count(t: &Tensor, c: f32) -> Result<Tensor> {
    mul(t, &Tensor::new(c, t.device())?)
}

/// `t / c` for a float32 0-dim count, as [`mul_count`].
pub(crate) fn div_count(t: &Tensor, c: f32) -> Result<Tensor> {
    div(t, &Tensor::new(c, t.device())?)
}

/// `torch.clamp(t, min=lo)`: NaN stays NaN.
pub(crate) fn clamp_min(t: &Tensor, lo: f64) -> Result<Tensor> {
    // candle's maximum is `if v < lo { lo } else { v }`: NaN < lo is false, so
    // NaN survives, as it does in torch.
    Ok(t.maximum(lo)?)
}

/// `torch.clamp(t, -c, c)` with torch's NaN propagation, on any device.
pub(crate) fn clamp_sym(t: &Tensor, c: f64) -> Result<Tensor> {
    let clamped = t.maximum(-c)?.minimum(c)?;
    // Backends differ in how min/max treat NaN; put NaN back explicitly.
    let is_nan = t.ne(t)?;
    Ok(is_nan.where_cond(t, &clamped)?)
}

/// Torch's broadcast of two shapes, or None where torch would raise.
pub(crate) fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i < n - a.len() { 1 } else { a[i - (n - a.len())] };
        let db = if i < n - b.len() { 1 } else { b[i - (n - b.len())] };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[f64], dt: DType) -> Tensor {
        Tensor::new(v, &Device::Cpu).unwrap().to_dtype(dt).unwrap()
    }

    #[test]
    fn zero_dim_never_widens_a_dimensioned_float() {
        let a = t(&[1.0, 2.0], DType::F32);
        let c = Tensor::new(3.0f64, &Device::Cpu).unwrap();
        assert_eq!(result_dtype(&a, &c), DType::F32);
        assert_eq!(result_dtype(&c, &a), DType::F32);
        let b = t(&[1.0, 2.0], DType::F64);
        assert_eq!(result_dtype(&a, &b), DType::F64);
        let c32 = Tensor::new(3.0f32, &Device::Cpu).unwrap();
        assert_eq!(result_dtype(&c, &c32), DType::F64);
    }

    #[test]
    fn f32_times_count_rounds_in_f32_but_f64_does_not() {
        // 0.1f32 * 3 in f32 differs from the f64 product of the same values.
        let a32 = t(&[0.1], DType::F32);
        let a64 = a32.to_dtype(DType::F64).unwrap();
        let p32 = mul_count(&a32, 3.0).unwrap();
        let p64 = mul_count(&a64, 3.0).unwrap();
        assert_eq!(p32.dtype(), DType::F32);
        assert_eq!(p64.dtype(), DType::F64);
        let v32 = p32.to_vec1::<f32>().unwrap()[0];
        let v64 = p64.to_vec1::<f64>().unwrap()[0];
        assert_eq!(v32, 0.1f32 * 3.0f32);
        assert_eq!(v64, 0.1f32 as f64 * 3.0);
        assert_ne!(v32 as f64, v64);
    }

    #[test]
    fn clamp_keeps_nan() {
        let x = t(&[f64::NAN, -9.0, 9.0, 1.0], DType::F32);
        let y = clamp_sym(&x, 5.0).unwrap().to_vec1::<f32>().unwrap();
        assert!(y[0].is_nan());
        assert_eq!(&y[1..], &[-5.0, 5.0, 1.0]);
        let z = clamp_min(&x, 0.0).unwrap().to_vec1::<f32>().unwrap();
        assert!(z[0].is_nan());
        assert_eq!(&z[1..], &[0.0, 9.0, 1.0]);
    }

    #[test]
    fn broadcast_follows_torch() {
        assert_eq!(broadcast_shapes(&[3], &[]), Some(vec![3]));
        assert_eq!(broadcast_shapes(&[3], &[1]), Some(vec![3]));
        assert_eq!(broadcast_shapes(&[1], &[3]), Some(vec![3]));
        assert_eq!(broadcast_shapes(&[2, 3], &[3]), Some(vec![2, 3]));
        assert_eq!(broadcast_shapes(&[2], &[3]), None);
    }
}
