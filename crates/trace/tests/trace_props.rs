//! Property tests of pm-trace: write/read round trips, self-replay, the
//! free-mode bound against a float32 reduction, hostile bytes.

use candle_core::{Device, Tensor};
use pmstate_norm::{Direction, Moments, NormConfig, RunningMeanStd};
use pmstate_trace::{
    read_bytes, replay, to_bytes, Mode, ModuleClass, ModuleSpec, Op, Recorder, ReplayOptions, Trace, UpdateResult,
};
use proptest::prelude::*;

fn data(seed: u64, n: usize, scale: f64, offset: f64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (offset + scale * ((s >> 11) as f64 / (1u64 << 53) as f64 - 0.5)) as f32
        })
        .collect()
}

#[derive(Debug, Clone)]
enum Act {
    Record(usize, f64, f64),
    Normalize(usize, Direction),
    Ema(Option<f64>),
    Load(f64, f64, i64),
    Combine(usize),
}

fn acts() -> impl Strategy<Value = Vec<Act>> {
    let act = prop_oneof![
        4 => (1usize..40, 0.01f64..100.0, -50f64..50.0).prop_map(|(n, s, o)| Act::Record(n, s, o)),
        2 => (1usize..8, prop_oneof![Just(Direction::Normalize), Just(Direction::UnNormalize)]).prop_map(|(n, u)| Act::Normalize(n, u)),
        1 => proptest::option::of(0.5f64..0.9999).prop_map(Act::Ema),
        1 => (-5f64..5.0, 0.01f64..10.0, 0i64..20_000_000).prop_map(|(m, v, c)| Act::Load(m, v, c)),
        1 => (1usize..6).prop_map(Act::Combine),
    ];
    proptest::collection::vec(act, 1..10)
}

/// A trace recorded from our own normalizer, of random steps.
fn recorded(d: usize, lazy: bool, clamp: Option<f64>, ema: Option<f64>, seed: u64, steps: &[Act]) -> Trace {
    let spec = ModuleSpec {
        class: ModuleClass::RunningMeanStd,
        shape: (!lazy).then(|| vec![d]),
        epsilon: 1e-5,
        clamp_value: clamp,
        ema_decay: ema,
        gamma: None,
    };
    let dev = Device::Cpu;
    let mut rec = Recorder::new(spec, "proptest").unwrap();
    for (k, a) in steps.iter().enumerate() {
        let seed = seed.wrapping_add(k as u64 * 7919);
        match a {
            Act::Record(n, s, o) => {
                rec.record_moments(&Tensor::from_vec(data(seed, n * d, *s, *o), (*n, d), &dev).unwrap()).unwrap()
            }
            Act::Normalize(n, u) => {
                rec.normalize(&Tensor::from_vec(data(seed, n * d, 10.0, 0.0), (*n, d), &dev).unwrap(), *u).unwrap()
            }
            Act::Ema(e) => rec.set_ema_decay(*e).unwrap(),
            Act::Load(m, v, c) => {
                rec.load_state(&Tensor::full(*m, d, &dev).unwrap(), &Tensor::full(*v, d, &dev).unwrap(), *c).unwrap()
            }
            Act::Combine(k) => {
                let means: Vec<Tensor> =
                    (0..*k).map(|i| Tensor::from_vec(data(seed + i as u64, d, 4.0, 1.0), d, &dev).unwrap()).collect();
                let vars: Vec<Tensor> = (0..*k)
                    .map(|i| Tensor::from_vec(data(seed + 99 + i as u64, d, 2.0, 1.0), d, &dev).unwrap())
                    .collect();
                let counts: Vec<i64> = (0..*k).map(|i| 1 + (seed as i64 + i as i64).rem_euclid(50)).collect();
                rec.combine(&means, &vars, &counts).unwrap()
            }
        }
    }
    rec.finish()
}

fn same_trace(a: &Trace, b: &Trace) {
    assert_eq!(a.description, b.description);
    assert_eq!(a.reference, b.reference);
    assert_eq!(a.module, b.module);
    assert_eq!(a.world_size, b.world_size);
    assert_eq!(a.steps.len(), b.steps.len());
    // Compare through the canonical bytes: every tensor's bits and every field.
    assert_eq!(to_bytes(a).unwrap(), to_bytes(b).unwrap());
}

/// torch-like float32 moments: pairwise float32 sums, as torch's cascade
/// reduction does, then float32 division.
fn pairwise_f32(v: &[f32]) -> f32 {
    if v.len() <= 8 {
        return v.iter().fold(0f32, |a, b| a + b);
    }
    let (l, r) = v.split_at(v.len() / 2);
    pairwise_f32(l) + pairwise_f32(r)
}

fn f32_moments(x: &[f32], n: usize, d: usize) -> (Vec<f32>, Vec<f32>) {
    let cols: Vec<Vec<f32>> = (0..d).map(|c| x.iter().skip(c).step_by(d).copied().collect()).collect();
    let mean: Vec<f32> = cols.iter().map(|c| pairwise_f32(c) / n as f32).collect();
    let var = cols
        .iter()
        .zip(&mean)
        .map(|(c, m)| pairwise_f32(&c.iter().map(|v| (v - m) * (v - m)).collect::<Vec<_>>()) / n as f32)
        .collect();
    (mean, var)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn written_traces_read_back_identical(
        d in 1usize..5, lazy in any::<bool>(), clamp in proptest::option::of(0.5f64..8.0),
        ema in proptest::option::of(0.5f64..0.999), seed in any::<u64>(), steps in acts(),
    ) {
        let t = recorded(d, lazy, clamp, ema, seed, &steps);
        let bytes = to_bytes(&t).unwrap();
        let back = read_bytes(&bytes).unwrap();
        same_trace(&t, &back);
        // Writing is deterministic.
        prop_assert_eq!(to_bytes(&back).unwrap(), bytes);
    }

    #[test]
    fn a_rust_written_trace_replays_against_itself_bit_exactly(
        d in 1usize..5, lazy in any::<bool>(), clamp in proptest::option::of(0.5f64..8.0),
        ema in proptest::option::of(0.5f64..0.999), seed in any::<u64>(), steps in acts(),
    ) {
        let t = read_bytes(&to_bytes(&recorded(d, lazy, clamp, ema, seed, &steps)).unwrap()).unwrap();
        for mode in [Mode::Pinned, Mode::Free] {
            let r = replay(&t, &ReplayOptions { mode, ..Default::default() }).unwrap();
            let bad: Vec<_> = r.fields.iter().filter(|f| !f.pass).collect();
            prop_assert!(r.pass, "{:?}: {:#?}", mode, bad);
            // Against itself even free mode is exact: same moments, same std.
            prop_assert!(r.fields.iter().all(|f| f.max_ulps == 0 || f.note.is_some()), "{:?}", mode);
        }
    }

    /// A trace whose recorded moments came from float32 pairwise reductions
    /// (as torch's) and whose std is 1 ulp off (as torch's sqrt can be)
    /// replays in free mode within the documented bounds.
    #[test]
    fn free_mode_errors_stay_within_the_bound(
        d in 1usize..5, ema in proptest::option::of(0.8f64..0.999), seed in any::<u64>(),
        batches in proptest::collection::vec((1usize..300, 0.001f64..1000.0, -1e4f64..1e4), 1..5),
        nudge in any::<bool>(),
    ) {
        let dev = Device::Cpu;
        let cfg = NormConfig { ema_decay: ema, clamp_value: Some(5.0), ..NormConfig::default() };
        let spec = ModuleSpec { class: ModuleClass::RunningMeanStd, shape: Some(vec![d]), epsilon: 1e-5,
                                clamp_value: Some(5.0), ema_decay: ema, gamma: None };
        // Record with our engine, then swap in float32 moments and rebuild the states from them.
        let mut rec = Recorder::new(spec, "f32 reductions").unwrap();
        let mut xs = vec![];
        for (k, (n, s, o)) in batches.iter().enumerate() {
            let x = data(seed.wrapping_add(k as u64), n * d, *s, *o);
            rec.record_moments(&Tensor::from_vec(x.clone(), (*n, d), &dev).unwrap()).unwrap();
            xs.push((x, *n));
        }
        let probe = Tensor::from_vec(data(seed ^ 0xabc, 4 * d, 20.0, 0.0), (4, d), &dev).unwrap();
        rec.normalize(&probe, Direction::Normalize).unwrap();
        let mut t = rec.finish();
        let mut torch_like = RunningMeanStd::new(cfg, Some(&[d]), &dev).unwrap();
        for (step, (x, n)) in t.steps.iter_mut().zip(&xs) {
            let (m, v) = f32_moments(x, *n, d);
            let bm = Moments { mean: Tensor::new(m.as_slice(), &dev).unwrap(), var: Tensor::new(v.as_slice(), &dev).unwrap(), count: *n as i64 };
            torch_like.record_batch_moments(bm.clone()).unwrap();
            let s = torch_like.state().unwrap();
            if let Op::RecordMoments { result: Some(u), .. } = &mut step.op {
                *u = UpdateResult {
                    batch: vec![bm],
                    combined: None,
                    state: s,
                };
            }
        }
        let own_std = torch_like.std_f32().unwrap().to_vec1::<f32>().unwrap();
        let std: Vec<f32> = own_std.iter().map(|s| if nudge { f32::from_bits(s.to_bits() + 1) } else { *s }).collect();
        let std_t = Tensor::new(std.as_slice(), &dev).unwrap();
        let out = torch_like.apply_with_std(&probe, &std_t, Direction::Normalize).unwrap();
        let s = torch_like.state().unwrap();
        if let Some(step) = t.steps.last_mut() {
            if let Op::Normalize { result: Some(r), .. } = &mut step.op {
                r.out = out;
                r.std = std_t;
                r.state = s;
            }
        }
        let r = replay(&t, &ReplayOptions { mode: Mode::Free, ..Default::default() }).unwrap();
        let bad: Vec<_> = r.fields.iter().filter(|f| !f.pass).collect();
        prop_assert!(r.pass, "{:#?}", bad);
    }

    #[test]
    fn the_reader_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = read_bytes(&bytes);
    }

    #[test]
    fn the_reader_never_panics_on_damaged_traces(cut in any::<prop::sample::Index>(), flips in proptest::collection::vec((any::<prop::sample::Index>(), 0u8..8), 0..4)) {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/traces/dist_w3_welford.pmtrace.safetensors");
        let mut b = std::fs::read(path).unwrap();
        for (i, bit) in flips {
            let i = i.index(b.len());
            b[i] ^= 1 << bit;
        }
        let keep = cut.index(b.len() + 1);
        b.truncate(keep);
        if let Ok(t) = read_bytes(&b) {
            // Whatever parses must also replay without panicking.
            let _ = replay(&t, &ReplayOptions { timeout: std::time::Duration::from_secs(5), ..Default::default() });
        }
    }
}

#[test]
fn replays_of_a_tampered_trace_fail() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/traces/fixed_clamp.pmtrace.safetensors");
    let mut t = read_bytes(&std::fs::read(path).unwrap()).unwrap();
    if let Op::RecordMoments { result: Some(u), .. } = &mut t.steps[0].op {
        let m = &u.state.mean;
        u.state.mean = (m + 1e-9).unwrap();
    }
    let pinned = replay(&t, &ReplayOptions::default()).unwrap();
    assert!(!pinned.pass);
    let f = pinned.fields.iter().find(|f| !f.pass).unwrap();
    assert_eq!((f.step, f.field.as_str()), (0, "state.mean"));
    assert!(f.max_ulps > 0 && f.first_mismatch == Some(0));
}
