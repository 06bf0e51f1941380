//! Any-device paths through candle's ops (CUDA, and unusual layouts on CPU).

use candle_core::{DType, Tensor};

use super::Direction;
use crate::error::Result;
use crate::promote;

/// Mean and population variance over dim 0, accumulated in f64, returned as f64.
pub(crate) fn moments(x: &Tensor) -> Result<(Tensor, Tensor)> {
    let x64 = x.to_dtype(DType::F64)?;
    let mean = x64.mean_keepdim(0)?;
    let var = x64.broadcast_sub(&mean)?.sqr()?.mean(0)?;
    Ok((mean.squeeze(0)?, var))
}

/// normalize / un_norm by torch's ops in torch's order: the result dtype is
/// promote(x, f32), every op rounds once.
pub(crate) fn normalize(
    x: &Tensor,
    mean_f32: Option<&Tensor>,
    std_f32: &Tensor,
    clamp: Option<f64>,
    direction: Direction,
) -> Result<Tensor> {
    let clamp_if = |t: Tensor| -> Result<Tensor> {
        match clamp {
            Some(c) => promote::clamp_sym(&t, c),
            None => Ok(t),
        }
    };
    match direction {
        Direction::Normalize => {
            let centered = match mean_f32 {
                Some(m) => promote::sub(x, m)?,
                None => x.clone(),
            };
            clamp_if(promote::div(&centered, std_f32)?)
        }
        Direction::UnNormalize => {
            let scaled = promote::mul(&clamp_if(x.clone())?, std_f32)?;
            match mean_f32 {
                Some(m) => promote::add(&scaled, m),
                None => Ok(scaled),
            }
        }
    }
}
