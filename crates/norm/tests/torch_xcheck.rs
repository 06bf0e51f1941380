//! Bit-exactness against PyTorch running ProtoMotions' normalization.py.
//!
//! `testdata/torch/norm_xcheck.json` was written by
//! `testdata/record_norm_xcheck.py` on real torch. Each update is replayed
//! with the batch moments torch computed, and each normalize with torch's
//! std: everything left is elementwise arithmetic, so states, combined
//! moments, discounted returns and outputs must match bit for bit. Our own
//! batch moments (f64 accumulation) are checked against torch's within a
//! float32 summation bound, and our correctly rounded std within 1 ulp.

mod common;

use candle_core::{DType, Device, Tensor};
use pmstate_norm::{
    batch_moments, combine_moments, Arithmetic, Direction, Moments, NormConfig, NormState, Normalizer, RewardConfig,
    RewardRunningMeanStd, RunningMeanStd,
};
use serde_json::Value;

fn load() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/torch/norm_xcheck.json");
    let text = std::fs::read_to_string(path).expect("testdata/torch/norm_xcheck.json is committed");
    serde_json::from_str(&text).unwrap()
}

fn hex_bytes(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn tensor(v: &Value) -> Tensor {
    let dtype = match v["dtype"].as_str().unwrap() {
        "f32" => DType::F32,
        "f64" => DType::F64,
        "i64" => DType::I64,
        "u8" => DType::U8,
        other => panic!("dtype {other}"),
    };
    let shape: Vec<usize> = v["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
    Tensor::from_raw_buffer(&hex_bytes(v["hex"].as_str().unwrap()), dtype, &shape, &Device::Cpu).unwrap()
}

/// The exact bits of a float tensor, with its dtype and shape.
fn bits(t: &Tensor) -> (DType, Vec<usize>, Vec<u64>) {
    let b = match t.dtype() {
        DType::F32 => t.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|v| v.to_bits() as u64).collect(),
        DType::F64 => t.flatten_all().unwrap().to_vec1::<f64>().unwrap().iter().map(|v| v.to_bits()).collect(),
        d => panic!("bits of {d:?}"),
    };
    (t.dtype(), t.dims().to_vec(), b)
}

fn assert_state(ctx: &str, got: &NormState, want: &Value) {
    assert_eq!(bits(&got.mean), bits(&tensor(&want["mean"])), "{ctx}: mean");
    assert_eq!(bits(&got.var), bits(&tensor(&want["var"])), "{ctx}: var");
    assert_eq!(got.count, want["count"].as_i64().unwrap(), "{ctx}: count");
}

fn moments(step: &Value) -> Moments {
    Moments {
        mean: tensor(&step["batch_mean"]),
        var: tensor(&step["batch_var"]),
        count: step["batch_count"].as_i64().unwrap(),
    }
}

fn config(case: &Value) -> NormConfig {
    NormConfig {
        epsilon: case["epsilon"].as_f64().unwrap(),
        clamp_value: case["clamp"].as_f64(),
        ema_decay: case["ema_decay"].as_f64(),
        ..NormConfig::default()
    }
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().flatten_all().unwrap().to_vec1::<f64>().unwrap()
}

/// Our f64-accumulated batch moments against torch's float32 reductions:
/// a float32 sum of n terms (torch sums pairwise/cascaded) is off by at most
/// about ceil(log2 n)+1 units of u = 2^-24 times the sum of |terms|, plus
/// the final rounding of both results (1 ulp).
fn assert_moments_close(ctx: &str, x: &Tensor, ours: &Moments, torch_m: &Moments) {
    if x.dtype() != DType::F32 {
        return;
    }
    let n = x.dims()[0];
    let u = 2f64.powi(-24);
    let levels = (n as f64).log2().ceil() + 2.0;
    let xs = f64s(x);
    let cols = xs.len() / n;
    let (om, tm) = (f64s(&ours.mean), f64s(&torch_m.mean));
    let (ov, tv) = (f64s(&ours.var), f64s(&torch_m.var));
    for c in 0..cols {
        let abs_mean: f64 = (0..n).map(|r| xs[r * cols + c].abs()).sum::<f64>() / n as f64;
        let tol_m = levels * u * abs_mean + 2.0 * u * om[c].abs();
        assert!(
            (om[c] - tm[c]).abs() <= tol_m,
            "{ctx}: batch mean col {c}: ours {} torch {} tol {tol_m}",
            om[c],
            tm[c]
        );
        let dev2: f64 = (0..n).map(|r| (xs[r * cols + c] - om[c]).powi(2)).sum::<f64>() / n as f64;
        // torch's var also carries its mean's error into every deviation.
        let tol_v = 3.0 * levels * u * (dev2 + abs_mean * tol_m) + 2.0 * u * ov[c].abs() + tol_m * tol_m;
        assert!((ov[c] - tv[c]).abs() <= tol_v, "{ctx}: batch var col {c}: ours {} torch {} tol {tol_v}", ov[c], tv[c]);
    }
}

fn ulps_apart(a: f32, b: f32) -> u32 {
    (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
}

#[test]
fn every_recorded_case_replays_bit_exactly() {
    let doc = load();
    let mut std_checked = 0;
    for case in doc["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let shape: Option<Vec<usize>> =
            case["shape"].as_array().map(|a| a.iter().map(|d| d.as_u64().unwrap() as usize).collect());
        let cfg = config(case);
        let dev = Device::Cpu;
        let reward = case["kind"] == "reward";
        let mut rms = RunningMeanStd::new(cfg, shape.as_deref(), &dev).unwrap();
        let mut rew = reward.then(|| {
            let config = RewardConfig { norm: cfg, gamma: case["gamma"].as_f64().unwrap() };
            RewardRunningMeanStd::new(config, shape.as_deref(), &dev).unwrap()
        });
        if !case["init"].is_null() {
            let s = &case["init"];
            rms.load_state(NormState {
                mean: tensor(&s["mean"]),
                var: tensor(&s["var"]),
                count: s["count"].as_i64().unwrap(),
            })
            .unwrap();
        }
        for (i, step) in case["steps"].as_array().unwrap().iter().enumerate() {
            let ctx = format!("{name} step {i} ({})", step["op"]);
            match step["op"].as_str().unwrap() {
                "record" => {
                    let x = tensor(&step["x"]);
                    let ours = batch_moments(&x).unwrap();
                    let theirs = moments(step);
                    assert_eq!(ours.mean.dtype(), theirs.mean.dtype(), "{ctx}");
                    assert_eq!(ours.mean.dims(), theirs.mean.dims(), "{ctx}");
                    assert_moments_close(&ctx, &x, &ours, &theirs);
                    rms.record_batch_moments(theirs).unwrap();
                    assert_state(&ctx, &rms.state().unwrap(), &step["state"]);
                }
                "reward" => {
                    let r = rew.as_mut().unwrap();
                    let g = r
                        .record_reward_moments(&tensor(&step["reward"]), &tensor(&step["terminated"]), moments(step))
                        .unwrap()
                        .discounted;
                    assert_eq!(bits(&g), bits(&tensor(&step["discounted"])), "{ctx}: discounted");
                    assert_state(&ctx, &r.state().unwrap(), &step["state"]);
                }
                "normalize" => {
                    let x = tensor(&step["x"]);
                    let std = tensor(&step["std"]);
                    let direction =
                        if step["un_norm"].as_bool().unwrap() { Direction::UnNormalize } else { Direction::Normalize };
                    let norm: &mut dyn Normalizer = match rew.as_mut() {
                        Some(r) => r,
                        None => &mut rms,
                    };
                    norm.init_shape_from(&x).unwrap();
                    let out = norm.apply_with_std(&x, &std, direction).unwrap();
                    let own_std = norm.std_f32().unwrap().clone();
                    assert_eq!(bits(&out), bits(&tensor(&step["out"])), "{ctx}: out");
                    let a = own_std.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                    let b = std.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                    for (p, q) in a.iter().zip(&b) {
                        assert!(ulps_apart(*p, *q) <= 1, "{ctx}: std {p} vs torch {q}");
                        std_checked += 1;
                    }
                    let st = match &rew {
                        Some(r) => r.state().unwrap(),
                        None => rms.state().unwrap(),
                    };
                    assert_state(&ctx, &st, &step["state"]);
                }
                "set_ema" => {
                    let d = step["ema_decay"].as_f64();
                    rms.set_ema_decay(d).unwrap();
                    assert_state(&ctx, &rms.state().unwrap(), &step["state"]);
                }
                other => panic!("{ctx}: unknown op {other}"),
            }
        }
    }
    assert!(std_checked > 0);
}

#[test]
fn combine_moments_matches_torch_bit_for_bit() {
    let doc = load();
    for (i, c) in doc["combine"].as_array().unwrap().iter().enumerate() {
        let means: Vec<Tensor> = c["means"].as_array().unwrap().iter().map(tensor).collect();
        let vars: Vec<Tensor> = c["vars"].as_array().unwrap().iter().map(tensor).collect();
        let counts: Vec<i64> = c["counts"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
        let m = combine_moments(&means, &vars, &counts, Arithmetic::Compat).unwrap();
        assert_eq!(bits(&m.mean), bits(&tensor(&c["mean"])), "combine {i}: mean");
        assert_eq!(bits(&m.var), bits(&tensor(&c["var"])), "combine {i}: var");
        assert_eq!(m.count, c["count"].as_i64().unwrap(), "combine {i}: count");
    }
}
