//! Property tests of the normalizer's algebra.

mod common;

use candle_core::{DType, Device, Tensor};
use common::*;
use pmstate_norm::{batch_moments, combine_moments, Arithmetic, NormConfig, NormState, RunningMeanStd};
use proptest::prelude::*;

/// Per-part data: k parts of 1..12 rows, d features.
fn parts() -> impl Strategy<Value = (usize, Vec<Vec<f64>>)> {
    (1usize..4, 1usize..9).prop_flat_map(|(d, k)| {
        let part = (1usize..12).prop_flat_map(move |n| proptest::collection::vec(-1e3f64..1e3, n * d));
        (Just(d), proptest::collection::vec(part, k))
    })
}

fn moments_f64(data: &[f64], d: usize) -> (Vec<f64>, Vec<f64>) {
    let n = (data.len() / d) as f64;
    let mean: Vec<f64> = (0..d).map(|c| data.iter().skip(c).step_by(d).sum::<f64>() / n).collect();
    let var = (0..d).map(|c| data.iter().skip(c).step_by(d).map(|x| (x - mean[c]).powi(2)).sum::<f64>() / n).collect();
    (mean, var)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Bound: with L = ceil(log2 k) + 1 tree levels, M = max|x| and unit
    /// roundoff u, each merge adds a few rounding errors of size u times the
    /// magnitudes involved (|mean| <= M, var and delta^2 <= 4 M^2), so
    /// |mean - true| <= 8 (L+1) u M and |var - true| <= 32 (L+1) u M^2.
    /// Exact mode: u = 2^-53. Compat mode: the weights count_b/total and
    /// count_a*count_b/total are float32, so u = 2^-24.
    #[test]
    fn combine_matches_the_concatenated_data((d, data) in parts()) {
        let dev = Device::Cpu;
        let all: Vec<f64> = data.iter().flatten().copied().collect();
        let (tm, tv) = moments_f64(&all, d);
        let m_max = all.iter().fold(0f64, |a, x| a.max(x.abs())).max(1e-300);
        let k = data.len();
        let levels = (k as f64).log2().ceil() + 1.0;
        let (mut means, mut vars, mut counts) = (vec![], vec![], vec![]);
        for p in &data {
            let (m, v) = moments_f64(p, d);
            means.push(Tensor::new(m.as_slice(), &dev).unwrap());
            vars.push(Tensor::new(v.as_slice(), &dev).unwrap());
            counts.push((p.len() / d) as i64);
        }
        for (arith, u) in [(Arithmetic::Exact, 2f64.powi(-53)), (Arithmetic::Compat, 2f64.powi(-24))] {
            let c = combine_moments(&means, &vars, &counts, arith).unwrap();
            prop_assert_eq!(c.count, (all.len() / d) as i64);
            let (gm, gv) = (f64s(&c.mean), f64s(&c.var));
            for j in 0..d {
                prop_assert!((gm[j] - tm[j]).abs() <= 8.0 * (levels + 1.0) * u * m_max, "{:?} mean {} vs {}", arith, gm[j], tm[j]);
                prop_assert!((gv[j] - tv[j]).abs() <= 32.0 * (levels + 1.0) * u * m_max * m_max, "{:?} var {} vs {}", arith, gv[j], tv[j]);
            }
        }
    }

    /// The pairwise tree and a left-to-right merge agree within the same bound.
    #[test]
    fn pairwise_tree_and_sequential_merge_agree((d, data) in parts()) {
        let dev = Device::Cpu;
        let all: Vec<f64> = data.iter().flatten().copied().collect();
        let m_max = all.iter().fold(0f64, |a, x| a.max(x.abs())).max(1e-300);
        let parts: Vec<(Tensor, Tensor, i64)> = data.iter().map(|p| {
            let (m, v) = moments_f64(p, d);
            (Tensor::new(m.as_slice(), &dev).unwrap(), Tensor::new(v.as_slice(), &dev).unwrap(), (p.len() / d) as i64)
        }).collect();
        let tree = combine_moments(
            &parts.iter().map(|p| p.0.clone()).collect::<Vec<_>>(),
            &parts.iter().map(|p| p.1.clone()).collect::<Vec<_>>(),
            &parts.iter().map(|p| p.2).collect::<Vec<_>>(),
            Arithmetic::Exact,
        ).unwrap();
        let mut acc = parts[0].clone();
        for p in &parts[1..] {
            let c = combine_moments(&[acc.0.clone(), p.0.clone()], &[acc.1.clone(), p.1.clone()], &[acc.2, p.2], Arithmetic::Exact).unwrap();
            acc = (c.mean, c.var, c.count);
        }
        let u = 2f64.powi(-53);
        let k = parts.len() as f64;
        prop_assert_eq!(tree.count, acc.2);
        for (a, b) in f64s(&tree.mean).iter().zip(f64s(&acc.0)) {
            prop_assert!((a - b).abs() <= 16.0 * (k + 1.0) * u * m_max);
        }
        for (a, b) in f64s(&tree.var).iter().zip(f64s(&acc.1)) {
            prop_assert!((a - b).abs() <= 64.0 * (k + 1.0) * u * m_max * m_max);
        }
    }

    /// Batch moments of the fused kernel against a plain f64 two-pass:
    /// both accumulate in f64, so they agree to a few f64 ulps before the
    /// final rounding to float32; after it, within 1 float32 ulp.
    #[test]
    fn batch_moments_match_a_two_pass_in_f64(
        d in 1usize..6, n in 1usize..300, offset in -1e4f64..1e4, scale in 1e-3f64..1e3, seed in any::<u64>()
    ) {
        let mut s = seed | 1;
        let data: Vec<f32> = (0..n * d).map(|_| {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            (offset + scale * ((s >> 11) as f64 / (1u64 << 53) as f64 - 0.5)) as f32
        }).collect();
        let x = Tensor::from_vec(data.clone(), (n, d), &Device::Cpu).unwrap();
        let m = batch_moments(&x).unwrap();
        let wide: Vec<f64> = data.iter().map(|&v| v as f64).collect();
        let (tm, tv) = moments_f64(&wide, d);
        let (gm, gv) = (m.mean.to_vec1::<f32>().unwrap(), m.var.to_vec1::<f32>().unwrap());
        for j in 0..d {
            let ulp_m = f32::EPSILON as f64 * (tm[j] as f32).abs().max(f32::MIN_POSITIVE) as f64;
            prop_assert!((gm[j] as f64 - tm[j]).abs() <= ulp_m, "mean {} vs {}", gm[j], tm[j]);
            let ulp_v = f32::EPSILON as f64 * (tv[j] as f32).abs().max(f32::MIN_POSITIVE) as f64;
            prop_assert!((gv[j] as f64 - tv[j]).abs() <= ulp_v, "var {} vs {}", gv[j], tv[j]);
        }
    }

    /// normalize is torch's `clamp((x - m) / s)` element for element, and
    /// un_norm(normalize(x)) returns x within 4 u (|x| + |m| + |x - m|),
    /// u = 2^-24, wherever the clamp did not bite; where it did, un_norm
    /// gives exactly fl(fl(±c s) + m).
    #[test]
    fn normalize_round_trips_within_the_clamp(
        d in 1usize..5, n in 1usize..40, mean in -100f64..100.0, var in 1e-3f64..1e3, clamp in 0.5f64..10.0,
        xs in proptest::collection::vec(-300f32..300.0, 200),
    ) {
        let cfg = NormConfig { clamp_value: Some(clamp), ..NormConfig::default() };
        let mut rms = RunningMeanStd::new(cfg, Some(&[d]), &Device::Cpu).unwrap();
        rms.load_state(NormState {
            mean: Tensor::full(mean, d, &Device::Cpu).unwrap(),
            var: Tensor::full(var, d, &Device::Cpu).unwrap(),
            count: 7,
        }).unwrap();
        let data: Vec<f32> = xs.iter().cycle().take(n * d).copied().collect();
        let x = Tensor::from_vec(data.clone(), (n, d), &Device::Cpu).unwrap();
        let z = f32s(&rms.normalize(&x).unwrap());
        let back = f32s(&rms.un_norm(&Tensor::from_vec(z.clone(), (n, d), &Device::Cpu).unwrap()).unwrap());
        let (m, s, c) = (mean as f32, (var as f32 + 1e-5f32).sqrt(), clamp as f32);
        let u = 2f32.powi(-24);
        for i in 0..n * d {
            let raw = (data[i] - m) / s;
            let want_z = if raw < -c { -c } else if raw > c { c } else { raw };
            prop_assert_eq!(z[i].to_bits(), want_z.to_bits());
            if raw.abs() < c {
                let tol = 4.0 * u * (data[i].abs() + m.abs() + (data[i] - m).abs());
                prop_assert!((back[i] - data[i]).abs() <= tol, "{} -> {} -> {}", data[i], z[i], back[i]);
            } else {
                prop_assert_eq!(back[i].to_bits(), (want_z * s + m).to_bits());
            }
        }
    }

    /// state() -> load_state() gives back the same bits, and the reloaded
    /// normalizer normalizes identically.
    #[test]
    fn state_round_trips_exactly(
        d in 1usize..6, means in proptest::collection::vec(any::<f64>(), 6),
        vars in proptest::collection::vec(0f64..1e30, 6), count in 0i64..i64::MAX,
    ) {
        let dev = Device::Cpu;
        let s = NormState {
            mean: Tensor::new(&means[..d], &dev).unwrap(),
            var: Tensor::new(&vars[..d], &dev).unwrap(),
            count,
        };
        let mut a = RunningMeanStd::new(NormConfig::default(), None, &dev).unwrap();
        a.load_state(s.clone()).unwrap();
        let got = a.state().unwrap();
        let bits = |t: &Tensor| f64s(t).iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(bits(&got.mean), bits(&s.mean));
        prop_assert_eq!(bits(&got.var), bits(&s.var));
        prop_assert_eq!(got.count, count);
        let mut b = RunningMeanStd::new(NormConfig::default(), Some(&[d]), &dev).unwrap();
        b.load_state(got).unwrap();
        let x = Tensor::ones((3, d), DType::F32, &dev).unwrap();
        let (ya, yb) = (f32s(&a.normalize(&x).unwrap()), f32s(&b.normalize(&x).unwrap()));
        prop_assert_eq!(
            ya.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            yb.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    /// Arbitrary configs and inputs: errors or results, never a panic, and
    /// a failed update leaves the state unchanged.
    #[test]
    fn invalid_inputs_are_errors_not_panics(
        epsilon in prop_oneof![any::<f64>(), Just(1e-5)],
        clamp in proptest::option::of(any::<f64>()),
        ema in proptest::option::of(any::<f64>()),
        shape in proptest::option::of(proptest::collection::vec(0usize..4, 0..3)),
        dims in proptest::collection::vec(0usize..4, 0..4),
        dtype in prop_oneof![Just(DType::F32), Just(DType::F64), Just(DType::U8), Just(DType::I64), Just(DType::F16)],
    ) {
        let dev = Device::Cpu;
        let cfg = NormConfig { epsilon, clamp_value: clamp, ema_decay: ema, ..NormConfig::default() };
        let Ok(mut rms) = RunningMeanStd::new(cfg, shape.as_deref(), &dev) else { return Ok(()) };
        let x = Tensor::ones(dims.as_slice(), dtype, &dev).unwrap();
        let before = rms.state();
        if rms.record_moments(&x).is_err() {
            match (before, rms.state()) {
                (None, after) => prop_assert!(after.is_none()),
                (Some(b), Some(a)) => {
                    prop_assert_eq!(f64s(&b.mean), f64s(&a.mean));
                    prop_assert_eq!(b.count, a.count);
                }
                (Some(_), None) => prop_assert!(false, "state lost"),
            }
        }
        let _ = rms.normalize(&x);
        let _ = rms.un_norm(&x);
    }
}
