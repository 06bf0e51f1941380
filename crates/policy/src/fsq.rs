//! ProtoMotions' `FiniteScalarQuantizer` (`agents/common/fsq.py`) in eval
//! mode: `codes = round(tanh(z) * half_L)`, rounding half to even as
//! `torch.round` does.
//!
//! The quantizer's buffers are registered with `persistent=False`, so no
//! checkpoint holds them: they are recomputed here in float32, operation
//! by operation as `__init__` computes them (see [`Quantizer::new`]).

use candle_core::{Device, Tensor};

use crate::error::Result;

/// `FiniteScalarQuantizer`'s default `eps` (the tanh shrink factor).
pub const FSQ_EPS: f64 = 1e-4;

/// The quantizer of one `FSQAutoEncoder`.
#[derive(Debug, Clone)]
pub struct Quantizer {
    /// `num_fsq_levels`.
    pub levels: usize,
    /// `num_fsq_scalars`.
    pub scalars: usize,
    /// The `half_L` buffer, one value per scalar (all equal: one shared level count).
    pub half_l: Vec<f32>,
    /// `half_width = levels // 2`: codes lie in `[-half_width, half_width]`.
    pub half_width: f32,
    /// `half_L` as a `[1, scalars]` tensor on the policy's device.
    half_l_row: Tensor,
}

/// `half_L` as `FiniteScalarQuantizer.__init__` computes it, in float32:
/// `levels = full(levels, f32)`, `half_l = (levels - 1) * (1 - eps) / 2`
/// (the Python float `1 - eps` enters the f32 product as f32),
/// `half_width = float(levels // 2)`, `L = levels * (half_l / half_width)`,
/// `half_L = L / 2`.
pub fn half_l(levels: usize) -> f32 {
    let l = levels as f32;
    let half_l = (l - 1.0) * ((1.0 - FSQ_EPS) as f32) / 2.0;
    let half_width = (levels / 2) as f32;
    let big_l = l * (half_l / half_width);
    big_l / 2.0
}

impl Quantizer {
    /// The quantizer of `levels` levels (odd, at least 3: the config parser
    /// checks) over `scalars` latent scalars, on `dev`.
    pub fn new(levels: usize, scalars: usize, dev: &Device) -> Result<Self> {
        let h = half_l(levels);
        let half_l = vec![h; scalars];
        let half_l_row = Tensor::from_vec(half_l.clone(), (1, scalars), dev)?;
        Ok(Quantizer { levels, scalars, half_l, half_width: (levels / 2) as f32, half_l_row })
    }

    /// `bound`: `tanh(z) * half_L`, in float32 (`z`: `[B, scalars]`).
    pub fn bound(&self, z: &Tensor) -> Result<Tensor> {
        Ok(z.tanh()?.broadcast_mul(&self.half_l_row)?)
    }

    /// `quantize` in eval mode: [`round_ste`] of the bounded latent.
    pub fn quantize(&self, z: &Tensor) -> Result<Tensor> {
        round_ste(&self.bound(z)?)
    }
}

/// `round_ste` as the module computes it, `z + (round(z) - z)` in float32,
/// with `round` half to even. In value that is `round(z)`: `round(z) - z` is
/// exact (a multiple of z's ulp no larger than 1/2, for |z| < 2^23) and so
/// is the sum, except for the sign of zero: where `round(z)` is `-0`
/// (z in (-1/2, 0]) the sum is `+0`. The codes are those bits.
pub fn round_ste(z: &Tensor) -> Result<Tensor> {
    let r = round_half_even(z)?;
    Ok((z + (r - z)?)?)
}

/// Rounds each element to the nearest integer, ties to even, as
/// `torch.round` (C's `nearbyint`); candle's `round` sends ties away from
/// zero. A tie is exactly an `x` with `2x` an integer and `x` not one (both
/// tests exact in floating point for every finite `x`); a tie `k + 1/2`
/// goes to `2 round(x / 2)`, the even one of `k` and `k + 1` (`x / 2` is
/// exact, and `x / 2 = k/2 + 1/4` is never itself a tie). NaN and
/// infinities pass through as `round` leaves them.
pub fn round_half_even(x: &Tensor) -> Result<Tensor> {
    let r = x.round()?;
    let twice = (x * 2.0)?;
    let twice_integral = twice.eq(&twice.round()?)?;
    let not_integral = x.ne(&r)?;
    let tie = twice_integral.mul(&not_integral)?;
    let even = ((x * 0.5)?.round()? * 2.0)?;
    Ok(tie.where_cond(&even, &r)?)
}

/// `round_half_even` of one float64 (the reference forward's).
pub fn round_half_even_f64(x: f64) -> f64 {
    x.round_ties_even()
}

/// Distance from `x` to the nearest rounding boundary (`k + 1/2`).
pub fn boundary_distance(x: f64) -> f64 {
    (x - x.floor() - 0.5).abs()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(xs: &[f32]) -> Vec<f32> {
        let t = Tensor::from_vec(xs.to_vec(), xs.len(), &Device::Cpu).unwrap();
        round_half_even(&t).unwrap().to_vec1::<f32>().unwrap()
    }

    #[test]
    fn ties_go_to_even_others_to_nearest() {
        let mut xs = Vec::new();
        let mut want = Vec::new();
        for k in -10i32..=10 {
            let tie = k as f32 + 0.5;
            xs.push(tie);
            want.push(tie.round_ties_even());
            // one ulp either side of the tie rounds to the nearest
            let below = f32::from_bits(if tie > 0.0 { tie.to_bits() - 1 } else { tie.to_bits() + 1 });
            let above = f32::from_bits(if tie > 0.0 { tie.to_bits() + 1 } else { tie.to_bits() - 1 });
            xs.push(below);
            want.push(below.round());
            xs.push(above);
            want.push(above.round());
            xs.push(k as f32);
            want.push(k as f32);
        }
        // the ties candle's round gets wrong, spelled out
        assert_eq!(run(&[0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, -3.5]), [0.0, 2.0, 2.0, -0.0, -2.0, -2.0, 4.0, -4.0]);
        let got = run(&xs);
        for ((x, g), w) in xs.iter().zip(&got).zip(&want) {
            assert_eq!(g.to_bits() & 0x7fff_ffff, w.to_bits() & 0x7fff_ffff, "round_half_even({x}) = {g}, want {w}");
        }
    }

    #[test]
    fn large_values_and_non_finite_pass_through() {
        let big = 8_388_609.0f32; // 2^23 + 1: an integer, odd
        let tie_big = 4_194_304.5f32; // 2^22 + 1/2: the largest ties
        let got = run(&[big, tie_big, -tie_big, f32::INFINITY, f32::NEG_INFINITY]);
        assert_eq!(got, [big, 4_194_304.0, -4_194_304.0, f32::INFINITY, f32::NEG_INFINITY]);
        assert!(run(&[f32::NAN])[0].is_nan());
    }

    #[test]
    fn half_l_is_the_modules_float32_arithmetic() {
        // (the bits are checked against torch's buffer in tests/parity.rs)
        assert!((half_l(9) as f64 - 4.5 * 0.9999).abs() < 1e-6);
        // bounded latents never reach the outer rounding boundary half_width + 1/2
        for levels in [3usize, 5, 7, 9, 15] {
            let h = half_l(levels) as f64;
            assert!(h < (levels / 2) as f64 + 0.5 && h > (levels / 2) as f64, "{levels}: {h}");
        }
    }

    #[test]
    fn boundary_distance_is_to_the_nearest_half() {
        assert_eq!(boundary_distance(0.5), 0.0);
        assert_eq!(boundary_distance(-1.5), 0.0);
        assert_eq!(boundary_distance(1.0), 0.5);
        assert!((boundary_distance(2.25) - 0.25).abs() < 1e-15);
        assert!((boundary_distance(-0.4) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn straight_through_rounding_has_no_negative_zero() {
        let z = Tensor::from_vec(vec![-0.3f32, -0.0, 0.0, 0.3, -0.7, 2.5, -2.5, 1.49], 8, &Device::Cpu).unwrap();
        let got = round_ste(&z).unwrap().to_vec1::<f32>().unwrap();
        let want = [0.0f32, 0.0, 0.0, 0.0, -1.0, 2.0, -2.0, 1.0];
        assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want.map(f32::to_bits));
        // round alone keeps the sign of zero
        assert_eq!(run(&[-0.3])[0].to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn quantize_matches_an_f64_rounding_away_from_boundaries() {
        let q = Quantizer::new(9, 4, &Device::Cpu).unwrap();
        let z = Tensor::from_vec(vec![-3.0f32, -0.1, 0.2, 2.0], (1, 4), &Device::Cpu).unwrap();
        let got = q.quantize(&z).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let want: Vec<f32> = [-3.0f64, -0.1, 0.2, 2.0]
            .iter()
            .map(|v| (v.tanh() * q.half_l[0] as f64).round_ties_even() as f32)
            .collect();
        assert_eq!(got, want);
        assert_eq!(q.half_width, 4.0);
    }
}
