//! The activations `get_activation_func` accepts, by name.
//!
//! ProtoMotions lower-cases the name and accepts exactly `tanh`, `relu`,
//! `elu` (alpha 1), `gelu` (the erf form), `identity`, `silu` and `mish`.
//! Its config help also lists `selu`, `sigmoid` and `None`, which it
//! rejects at build time; so does this crate.

use candle_core::Tensor;
use serde::Serialize;

use crate::error::{PolicyError, Result};

/// Unit roundoff of float32 (2^-24): the relative error of one correctly
/// rounded operation.
pub const U: f64 = 1.0 / (1u64 << 24) as f64;

/// One activation function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// `nn.Tanh`.
    Tanh,
    /// `nn.ReLU`.
    Relu,
    /// `nn.ELU(alpha=1.0)`.
    Elu,
    /// `nn.GELU(approximate="none")`: `x * Phi(x)` with the erf.
    Gelu,
    /// `nn.Identity`.
    Identity,
    /// `nn.SiLU`: `x * sigmoid(x)`.
    Silu,
    /// `nn.Mish`: `x * tanh(softplus(x))`.
    Mish,
}

impl Activation {
    /// Parses a name as `get_activation_func` does (any case); `path` names the config field in errors.
    pub fn parse(name: &str, path: &str) -> Result<Self> {
        Ok(match name.to_lowercase().as_str() {
            "tanh" => Activation::Tanh,
            "relu" => Activation::Relu,
            "elu" => Activation::Elu,
            "gelu" => Activation::Gelu,
            "identity" => Activation::Identity,
            "silu" => Activation::Silu,
            "mish" => Activation::Mish,
            _ => return Err(PolicyError::UnknownActivation { path: path.to_owned(), name: name.to_owned() }),
        })
    }

    /// The lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Activation::Tanh => "tanh",
            Activation::Relu => "relu",
            Activation::Elu => "elu",
            Activation::Gelu => "gelu",
            Activation::Identity => "identity",
            Activation::Silu => "silu",
            Activation::Mish => "mish",
        }
    }

    /// Applies it elementwise (any device).
    pub fn apply(self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Activation::Tanh => x.tanh()?,
            // As torch.relu: NaN and -0.0 pass through (candle's relu, a
            // max with 0, turns NaN into 0).
            Activation::Relu => x.lt(0f64)?.where_cond(&x.zeros_like()?, x)?,
            Activation::Elu => x.elu(1.0)?,
            Activation::Gelu => x.gelu_erf()?,
            Activation::Identity => x.clone(),
            Activation::Silu => x.silu()?,
            Activation::Mish => {
                // softplus with torch's threshold: x itself above 20
                let sp = x.exp()?.affine(1.0, 1.0)?.log()?;
                let big = x.gt(20f64)?;
                let sp = big.where_cond(x, &sp)?;
                (x * sp.tanh()?)?
            }
        })
    }

    /// The same in f64 (the reference forward of the `bound` module).
    pub fn eval_f64(self, x: f64) -> f64 {
        match self {
            Activation::Tanh => x.tanh(),
            Activation::Relu => {
                if x < 0.0 {
                    0.0
                } else {
                    x
                }
            }
            Activation::Elu => {
                if x > 0.0 {
                    x
                } else {
                    x.exp_m1()
                }
            }
            Activation::Gelu => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
            Activation::Identity => x,
            Activation::Silu => x / (1.0 + (-x).exp()),
            Activation::Mish => {
                let sp = if x > 20.0 { x } else { x.exp().ln_1p() };
                x * sp.tanh()
            }
        }
    }

    /// A Lipschitz constant (the largest slope): a perturbation `e` of the
    /// input moves the output by at most `lipschitz() * e`. GELU's slope
    /// peaks at 1.1289 (x = 1.4), SiLU's at 1.0998 (x = 2.4), Mish's at
    /// 1.0886 (x = 1.7) (checked numerically in the tests).
    pub fn lipschitz(self) -> f64 {
        match self {
            Activation::Tanh | Activation::Relu | Activation::Elu | Activation::Identity => 1.0,
            Activation::Gelu => 1.129,
            Activation::Silu => 1.100,
            Activation::Mish => 1.089,
        }
    }

    /// Bound on the rounding error of one float32 evaluation at `x` (either
    /// side: torch's vectorized kernels or candle's), in absolute terms:
    /// 0 for the exact ones, else `8u (|f(x)| + |x| + 1)` with u = 2^-24,
    /// which covers a few ulps of the result plus the cancellation of
    /// `exp(x) - 1` and `log(1 + exp(x))` for negative x.
    pub fn rounding(self, x: f64) -> f64 {
        match self {
            Activation::Relu | Activation::Identity => 0.0,
            _ => 8.0 * U * (self.eval_f64(x).abs() + x.abs() + 1.0),
        }
    }
}

/// The error function, to double precision (W. J. Cody's rational
/// approximations as in most libms, via erfc for |x| >= 0.5).
pub(crate) fn erf(x: f64) -> f64 {
    // Abramowitz-Stegun 7.1.26 is too coarse; use a series / continued fraction.
    let ax = x.abs();
    let r = if ax < 2.5 {
        // Taylor series: erf(x) = 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1))
        let mut sum = 0.0;
        let mut term = ax;
        let x2 = ax * ax;
        let mut n = 0.0f64;
        loop {
            let add = term / (2.0 * n + 1.0);
            sum += add;
            if add.abs() < 1e-17 * sum.abs() {
                break;
            }
            n += 1.0;
            term *= -x2 / n;
            if n > 200.0 {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else {
        // erfc continued fraction (Lentz), accurate for x >= 2.5
        let x2 = ax * ax;
        let mut f = ax;
        let mut c = ax;
        let mut d = 0.0;
        let tiny = 1e-300;
        for k in 1..300 {
            let a = k as f64 / 2.0;
            d = ax + a * d;
            if d.abs() < tiny {
                d = tiny;
            }
            c = ax + a / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let delta = c * d;
            f *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        let erfc = (-x2).exp() / (f * std::f64::consts::PI.sqrt());
        1.0 - erfc
    };
    if x < 0.0 {
        -r
    } else {
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_protomotions_reads_them() {
        for (n, a) in [("ReLU", Activation::Relu), ("GELU", Activation::Gelu), ("mish", Activation::Mish)] {
            assert_eq!(Activation::parse(n, "p").unwrap(), a);
        }
        for bad in ["selu", "sigmoid", "None", ""] {
            assert!(matches!(Activation::parse(bad, "p"), Err(PolicyError::UnknownActivation { .. })));
        }
    }

    #[test]
    fn relu_keeps_nan_and_negative_zero_as_torch_does() {
        // torch 2.15: torch.relu(tensor([nan, -0., -1., 2.])) == [nan, -0., 0., 2.],
        // on the scalar and the vectorized paths alike.
        let x = Tensor::new(&[f32::NAN, -0.0, -1.0, 2.0], &candle_core::Device::Cpu).unwrap();
        let y = Activation::Relu.apply(&x).unwrap().to_vec1::<f32>().unwrap();
        assert!(y[0].is_nan());
        assert_eq!(y[1].to_bits(), (-0.0f32).to_bits());
        assert_eq!(y[2].to_bits(), 0.0f32.to_bits());
        assert_eq!(y[3], 2.0);
        let r = Activation::Relu;
        assert!(r.eval_f64(f64::NAN).is_nan());
        assert_eq!(r.eval_f64(-0.0).to_bits(), (-0.0f64).to_bits());
        assert_eq!(r.eval_f64(-3.0), 0.0);
    }

    #[test]
    fn erf_is_accurate() {
        // values from mpmath
        let cases = [
            (0.1, 0.1124629160182849),
            (1.0, 0.8427007929497149),
            (2.0, 0.9953222650189527),
            (3.0, 0.9999779095030014),
            (-0.5, -0.5204998778130465),
        ];
        for (x, want) in cases {
            assert!((erf(x) - want).abs() < 1e-15, "erf({x}) = {} want {want}", erf(x));
        }
    }

    #[test]
    fn lipschitz_constants_cover_the_steepest_slope() {
        for a in [
            Activation::Tanh,
            Activation::Relu,
            Activation::Elu,
            Activation::Gelu,
            Activation::Identity,
            Activation::Silu,
            Activation::Mish,
        ] {
            let h = 1e-6;
            let mut x = -30.0;
            while x < 30.0 {
                let slope = (a.eval_f64(x + h) - a.eval_f64(x - h)) / (2.0 * h);
                assert!(slope.abs() <= a.lipschitz() + 1e-6, "{a:?} slope {slope} at {x}");
                x += 0.001;
            }
        }
    }
}
