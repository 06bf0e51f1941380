//! The noise of `sample(seed)`: a fixed, documented stream.
//!
//! torch draws actions from its global Mersenne Twister through vectorized
//! Box-Muller code whose logs and cosines are SLEEF's, so its stream cannot
//! be reproduced bit for bit here. This one is SplitMix64 (Steele, Lea,
//! Flood 2014) feeding Box-Muller in f64, rounded to f32: the same seed and
//! shape give the same actions on every platform and device.

/// `n` standard normal samples from `seed`.
pub fn standard_normal(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed;
    let mut next = move || {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut out = Vec::with_capacity(n + 1);
    while out.len() < n {
        // u1 in (0, 1], u2 in [0, 1)
        let u1 = ((next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (next() >> 11) as f64 / (1u64 << 53) as f64;
        let r = (-2.0 * u1.ln()).sqrt();
        let t = 2.0 * std::f64::consts::PI * u2;
        out.push((r * t.cos()) as f32);
        out.push((r * t.sin()) as f32);
    }
    out.truncate(n);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn moments_are_standard() {
        let x = super::standard_normal(7, 200_000);
        let n = x.len() as f64;
        let m = x.iter().map(|&v| v as f64).sum::<f64>() / n;
        let v = x.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / n;
        assert!(m.abs() < 0.01 && (v - 1.0).abs() < 0.01, "mean {m} var {v}");
        assert_eq!(super::standard_normal(7, 5), super::standard_normal(7, 5));
        assert_ne!(super::standard_normal(7, 5), super::standard_normal(8, 5));
    }
}
