//! `TransformerEncoder` against torch's `nn.TransformerEncoder` as
//! ProtoMotions' `Transformer` builds it (testdata/policy/transformer_encoder,
//! written by testdata/policy/record_transformer.py): 2 post-norm layers,
//! d = 16, 4 heads, ff 24, relu and gelu, with no mask, a key-padding
//! mask (one row fully padded), a 0/-inf causal mask with a context prefix,
//! both, and a mask with finite entries.
//!
//! The bound is derived (`pmstate_policy::bound::attention`): torch's and
//! this crate's float32 outputs lie within it of the float64 reference, and
//! within twice it of each other; both of this crate's paths are checked
//! (the float32 CPU row path, and the candle path other devices take).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use pmstate_ckpt::Checkpoint;
use pmstate_policy::bound::{within, Bounded};
use pmstate_policy::transformer::{zero_padded_positions, AttentionMasks, TransformerEncoder, TransformerSpec};
use pmstate_policy::{Activation, AttentionProblem, PolicyError};

fn data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy/transformer_encoder").join(rel)
}

fn cases() -> HashMap<String, Tensor> {
    candle_core::safetensors::load(data("cases.safetensors"), &Device::Cpu).unwrap()
}

fn spec(activation: Activation) -> TransformerSpec {
    TransformerSpec { d_model: 16, heads: 4, ff: 24, layers: 2, activation }
}

fn encoder(act: &str, activation: Activation) -> TransformerEncoder {
    let ckpt = Checkpoint::open(data("weights.safetensors")).unwrap();
    TransformerEncoder::load(&ckpt, "", act, spec(activation), "test.transformer", &Device::Cpu).unwrap()
}

fn flat(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().flatten_all().unwrap().to_vec1::<f64>().unwrap()
}

fn masks<'a>(c: &'a HashMap<String, Tensor>, case: &str) -> AttentionMasks<'a> {
    let pad = Some(&c["key_padding"]);
    match case {
        "none" => AttentionMasks::default(),
        "pad" => AttentionMasks { key_padding: pad, additive: None },
        "add" => AttentionMasks { key_padding: None, additive: Some(&c["additive"]) },
        "both" => AttentionMasks { key_padding: pad, additive: Some(&c["additive"]) },
        "soft" => AttentionMasks { key_padding: None, additive: Some(&c["additive_soft"]) },
        other => panic!("{other}"),
    }
}

#[test]
fn every_position_matches_torchs_slow_path_within_the_derived_bound() {
    let c = cases();
    let mut loosest = 0.0f64;
    for (act, activation) in [("relu", Activation::Relu), ("gelu", Activation::Gelu)] {
        let rows = encoder(act, activation);
        for (path, enc) in [("rows", &rows), ("candle", &candle_path(&rows))] {
            for case in ["none", "pad", "add", "both", "soft"] {
                let m = masks(&c, case);
                let reference = enc.reference(&c["x"], &m).unwrap();
                let got = f32s(&enc.forward(&c["x"], &m).unwrap());
                let torch = f32s(&c[&format!("{act}.{case}.slow")]);
                let torch_f64 = flat(&c[&format!("{act}.{case}.f64")]);
                // messages name the path too
                let act = format!("{act}/{path}");
                assert_eq!(reference.shape, c["x"].dims());
                // the reference is torch's float64 forward (to float64 rounding)
                for (i, (a, b)) in reference.value.iter().zip(&torch_f64).enumerate() {
                    assert!((a - b).abs() <= 1e-9 * (1.0 + b.abs()), "{act}/{case} [{i}]: f64 {a} vs torch f64 {b}");
                }
                assert!(got.iter().all(|v| v.is_finite()), "{act}/{case}: non-finite output");
                assert_eq!(within(&torch, &reference, 1.0), None, "{act}/{case}: torch float32 outside the bound");
                assert_eq!(within(&got, &reference, 1.0), None, "{act}/{case}: ours outside the bound");
                let torch_as_ref = Bounded {
                    shape: reference.shape.clone(),
                    value: torch.iter().map(|v| *v as f64).collect(),
                    bound: reference.bound.clone(),
                };
                assert_eq!(within(&got, &torch_as_ref, 2.0), None, "{act}/{case}: |ours - torch| > 2 bound");
                loosest = loosest.max(looseness(&reference, &[&torch, &got]));
                let max_bound = reference.bound.iter().fold(0.0f64, |m, b| m.max(*b));
                let max_err = torch.iter().zip(&reference.value).fold(0.0f64, |m, (t, v)| m.max((*t as f64 - v).abs()));
                // the bound says something: far below the outputs' scale
                let scale = reference.value.iter().fold(0.0f64, |m, v| m.max(v.abs()));
                assert!(max_bound < 1e-3 * scale, "{act}/{case}: bound {max_bound:e} vs scale {scale:e}");
                eprintln!("{act}/{case}: max bound {max_bound:.1e}, torch's max error {max_err:.1e}");
            }
        }
    }
    eprintln!("transformer_encoder: max over elements of bound / observed error = {loosest:.0}");
}

/// How loose the derived bound is: the largest `bound / observed error`,
/// the observed error (the largest over the float32 forwards) floored at
/// half an ulp of the value (`u |v|`, what rounding the result alone costs).
fn looseness(r: &Bounded, forwards: &[&[f32]]) -> f64 {
    (0..r.value.len())
        .map(|i| {
            let e = forwards.iter().map(|f| (f[i] as f64 - r.value[i]).abs()).fold(0.0, f64::max);
            r.bound[i] / e.max(r.value[i].abs() / (1u64 << 24) as f64)
        })
        .fold(0.0, f64::max)
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// `enc` with every Linear on candle's matmul: its forward takes the
/// candle path (the one other devices and dtypes take) instead of the
/// float32 CPU row path.
fn candle_path(enc: &TransformerEncoder) -> TransformerEncoder {
    let mut e = enc.clone();
    for l in &mut e.layers {
        for lin in [&mut l.self_attn.in_proj, &mut l.self_attn.out_proj, &mut l.linear1, &mut l.linear2] {
            lin.packed = None;
        }
    }
    e
}

/// The server's batching promise on the row path: a batch row's output
/// bits are the same computed alone (with its own mask row) as inside the
/// batch, and the same on one thread as on two.
#[test]
fn a_rows_bits_do_not_depend_on_the_batch_or_the_thread_count() {
    let c = cases();
    let x = &c["x"];
    let batch = x.dims()[0];
    let bits = |t: &Tensor| f32s(t).iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    let pool = |n: usize| rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap();
    for (act, activation) in [("relu", Activation::Relu), ("gelu", Activation::Gelu)] {
        let enc = encoder(act, activation);
        for case in ["none", "pad", "add", "both", "soft"] {
            let m = masks(&c, case);
            let one = pool(1).install(|| bits(&enc.forward(x, &m).unwrap()));
            let two = pool(2).install(|| bits(&enc.forward(x, &m).unwrap()));
            assert_eq!(one, two, "{act}/{case}: one thread and two differ");
            let per_row = one.len() / batch;
            for b in 0..batch {
                let xb = x.narrow(0, b, 1).unwrap();
                let pb = m.key_padding.map(|p| p.narrow(0, b, 1).unwrap());
                let mb = AttentionMasks { key_padding: pb.as_ref(), additive: m.additive };
                let alone = bits(&enc.forward(&xb, &mb).unwrap());
                assert_eq!(alone, one[b * per_row..(b + 1) * per_row], "{act}/{case}: row {b} alone differs");
            }
        }
    }
}

#[test]
fn the_fast_path_zeros_padded_positions_and_agrees_elsewhere() {
    let c = cases();
    let pad = &c["key_padding"];
    let pad_rows: Vec<Vec<u8>> = pad.to_vec2::<u8>().unwrap();
    for (act, activation) in [("relu", Activation::Relu), ("gelu", Activation::Gelu)] {
        let enc = encoder(act, activation);
        for case in ["pad", "both"] {
            let out = enc.forward(&c["x"], &masks(&c, case)).unwrap();
            let reference = enc.reference(&c["x"], &masks(&c, case)).unwrap();
            let (s_len, d) = (pad_rows[0].len(), reference.shape[2]);
            let zeroed = zero_padded_positions(&out, pad).unwrap().to_vec3::<f32>().unwrap();
            let fast = c[&format!("{act}.{case}.fast")].to_vec3::<f32>().unwrap();
            let slow = c[&format!("{act}.{case}.slow")].to_vec3::<f32>().unwrap();
            for (b, row) in pad_rows.iter().enumerate() {
                if row.iter().all(|&p| p != 0) {
                    // every key padded: torch's fast path gives 0 (nested
                    // tensor) or NaN (with an additive mask); the slow path,
                    // which this module follows, gives finite values
                    assert!(fast[b].iter().flatten().all(|v| *v == 0.0 || v.is_nan()), "{act}/{case} row {b}");
                    assert!(zeroed[b].iter().flatten().all(|v| *v == 0.0));
                    assert!(slow[b].iter().flatten().all(|v| v.is_finite()));
                    continue;
                }
                for (s, &p) in row.iter().enumerate() {
                    for (j, (&z, &f)) in zeroed[b][s].iter().zip(&fast[b][s]).enumerate() {
                        if p != 0 && case == "pad" {
                            assert_eq!(f, 0.0, "{act}/{case} [{b},{s},{j}]: the fast path zeros padded positions");
                            assert_eq!(z, 0.0);
                        } else if p == 0 {
                            // torch's fused fast path is one more float32 forward: within the bound too
                            let i = (b * s_len + s) * d + j;
                            let (v, e) = (reference.value[i], reference.bound[i]);
                            assert!((f as f64 - v).abs() <= e, "{act}/{case} [{b},{s},{j}]: fast {f} vs {v} +- {e:e}");
                            assert!((z as f64 - v).abs() <= e, "{act}/{case} [{b},{s},{j}]: ours {z} vs {v} +- {e:e}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn token_zero_of_a_fully_padded_row_is_finite_as_in_torchs_slow_path() {
    // row 3 masks every key: torch >= 2.5 gives zero attention weights
    let c = cases();
    let enc = encoder("relu", Activation::Relu);
    let got = enc.forward(&c["x"], &masks(&c, "pad")).unwrap().to_vec3::<f32>().unwrap();
    let want = c["relu.pad.slow"].to_vec3::<f32>().unwrap();
    for (g, w) in got[3].iter().flatten().zip(want[3].iter().flatten()) {
        assert!((g - w).abs() <= 1e-5, "{g} vs {w}");
    }
}

/// A strided input (here `[s, b, d]` data viewed as `[b, s, d]`) is read
/// element by element in its logical order: the row path gives the bits
/// its contiguous copy gives.
#[test]
fn a_strided_input_gives_the_bits_of_its_contiguous_copy() {
    let c = cases();
    let x = &c["x"];
    let strided = x.transpose(0, 1).unwrap().contiguous().unwrap().transpose(0, 1).unwrap();
    assert!(!strided.is_contiguous());
    let bits = |t: &Tensor| f32s(t).iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    let enc = encoder("relu", Activation::Relu);
    for case in ["none", "both"] {
        let m = masks(&c, case);
        let want = bits(&enc.forward(x, &m).unwrap());
        assert_eq!(bits(&enc.forward(&strided, &m).unwrap()), want, "{case}");
    }
}

/// No rows, or rows of no tokens: an empty output of the input's shape on
/// both paths (no panic on a zero-sized chunk, no softmax over nothing).
#[test]
fn an_empty_batch_or_sequence_gives_an_empty_output() {
    let enc = encoder("relu", Activation::Relu);
    for (b, s) in [(0usize, 7usize), (3, 0)] {
        let x = Tensor::zeros((b, s, 16), DType::F32, &Device::Cpu).unwrap();
        let pad = Tensor::zeros((b, s), DType::U8, &Device::Cpu).unwrap();
        for e in [&enc, &candle_path(&enc)] {
            let out = e.forward(&x, &AttentionMasks { key_padding: Some(&pad), additive: None }).unwrap();
            assert_eq!(out.dims(), &[b, s, 16]);
        }
    }
}

#[test]
fn masks_and_tokens_of_the_wrong_shape_are_refused() {
    let c = cases();
    let enc = encoder("relu", Activation::Relu);
    let x = &c["x"];
    let short_pad = c["key_padding"].narrow(1, 0, 6).unwrap();
    let e = enc.forward(x, &AttentionMasks { key_padding: Some(&short_pad), additive: None }).unwrap_err();
    assert_eq!(
        enc.reference(x, &AttentionMasks { key_padding: Some(&short_pad), additive: None }).unwrap_err().to_string(),
        e.to_string()
    );
    assert!(
        matches!(&e, PolicyError::Attention { path, problem: AttentionProblem::KeyPaddingMask { shape, batch: 4, seq: 7, .. } } if path == "test.transformer" && shape == &[4, 6]),
        "{e}"
    );
    let float_pad = c["key_padding"].to_dtype(DType::F32).unwrap();
    let e = enc.forward(x, &AttentionMasks { key_padding: Some(&float_pad), additive: None }).unwrap_err();
    assert_eq!(
        enc.reference(x, &AttentionMasks { key_padding: Some(&float_pad), additive: None }).unwrap_err().to_string(),
        e.to_string()
    );
    assert!(matches!(e, PolicyError::Attention { problem: AttentionProblem::KeyPaddingMask { dtype: "f32", .. }, .. }));
    let bad_add = c["additive"].narrow(0, 0, 3).unwrap();
    let e = enc.forward(x, &AttentionMasks { key_padding: None, additive: Some(&bad_add) }).unwrap_err();
    assert_eq!(
        enc.reference(x, &AttentionMasks { key_padding: None, additive: Some(&bad_add) }).unwrap_err().to_string(),
        e.to_string()
    );
    assert!(matches!(e, PolicyError::Attention { problem: AttentionProblem::AdditiveMask { seq: 7, .. }, .. }), "{e}");
    let narrow = x.narrow(2, 0, 8).unwrap();
    let e = enc.forward(&narrow, &AttentionMasks::default()).unwrap_err();
    assert_eq!(enc.reference(&narrow, &AttentionMasks::default()).unwrap_err().to_string(), e.to_string());
    assert!(matches!(e, PolicyError::Attention { problem: AttentionProblem::InputShape { .. }, .. }), "{e}");
    assert!(e.to_string().contains("test.transformer"), "{e}");
}

#[test]
fn heads_that_do_not_divide_the_width_and_wrong_weights_are_refused() {
    let ckpt = Checkpoint::open(data("weights.safetensors")).unwrap();
    let mut s = spec(Activation::Relu);
    s.heads = 3;
    let e = TransformerEncoder::load(&ckpt, "", "relu", s, "p", &Device::Cpu).unwrap_err();
    assert!(matches!(
        e,
        PolicyError::Attention { problem: AttentionProblem::HeadsDivide { d_model: 16, heads: 3 }, .. }
    ));
    let mut s = spec(Activation::Relu);
    s.ff = 32;
    let e = TransformerEncoder::load(&ckpt, "", "relu", s, "p", &Device::Cpu).unwrap_err();
    assert!(matches!(&e, PolicyError::WeightShape { key, .. } if key == "relu.layers.0.linear1.weight"), "{e}");
    let mut s = spec(Activation::Relu);
    s.layers = 3;
    let e = TransformerEncoder::load(&ckpt, "", "relu", s, "p", &Device::Cpu).unwrap_err();
    assert!(
        matches!(&e, PolicyError::MissingWeight { key, .. } if key == "relu.layers.2.self_attn.in_proj_weight"),
        "{e}"
    );
}
