//! The derived float32 bound of the transformer (`pmstate_policy::bound::attention`)
//! holds on random encoders: this crate's float32 forward stays within
//! `bound` of the float64 reference for random widths, heads, depths,
//! feed-forward activations, weight scales (flat to peaked softmax),
//! key-padding masks (rows fully padded included) and additive masks
//! (causal `-inf`, finite, and both mixed).

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use pmstate_ckpt::Checkpoint;
use pmstate_policy::bound::within;
use pmstate_policy::transformer::{AttentionMasks, TransformerEncoder, TransformerSpec};
use pmstate_policy::Activation;
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Case {
    heads: usize,
    head_dim: usize,
    ff: usize,
    layers: usize,
    gelu: bool,
    batch: usize,
    seq: usize,
    /// 0: none, 1: causal `-inf`, 2: finite in [-6, 6], 3: finite with some `-inf`.
    additive: usize,
    padding: bool,
    weight_scale: f64,
    input_scale: f64,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        (1usize..4, 1usize..6, 1usize..24, 1usize..3, any::<bool>()),
        (1usize..4, 1usize..13, 0usize..4, any::<bool>()),
        (prop_oneof![Just(0.5), Just(1.0), Just(3.0)], prop_oneof![Just(1.0), Just(10.0)], any::<u64>()),
    )
        .prop_map(|((heads, head_dim, ff, layers, gelu), (batch, seq, additive, padding), (ws, is, seed))| Case {
            heads,
            head_dim,
            ff,
            layers,
            gelu,
            batch,
            seq,
            additive,
            padding,
            weight_scale: ws,
            input_scale: is,
            seed,
        })
}

struct Rng(u64);
impl Rng {
    /// Uniform in [-1, 1).
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }
}

fn random(rng: &mut Rng, n: usize, scale: f64, offset: f64) -> Vec<f32> {
    (0..n).map(|_| (offset + rng.next() * scale) as f32).collect()
}

fn build(c: &Case, dir: &std::path::Path) -> TransformerEncoder {
    let mut rng = Rng(c.seed);
    let dev = Device::Cpu;
    let d = c.heads * c.head_dim;
    let mut sd = HashMap::new();
    let mut put = |k: String, v: Vec<f32>, shape: &[usize]| {
        sd.insert(k, Tensor::from_vec(v, shape, &dev).unwrap());
    };
    for l in 0..c.layers {
        let p = format!("layers.{l}");
        let wd = c.weight_scale / (d as f64).sqrt();
        let wf = c.weight_scale / (c.ff as f64).sqrt();
        put(format!("{p}.self_attn.in_proj_weight"), random(&mut rng, 3 * d * d, wd, 0.0), &[3 * d, d]);
        put(format!("{p}.self_attn.in_proj_bias"), random(&mut rng, 3 * d, 0.1, 0.0), &[3 * d]);
        put(format!("{p}.self_attn.out_proj.weight"), random(&mut rng, d * d, wd, 0.0), &[d, d]);
        put(format!("{p}.self_attn.out_proj.bias"), random(&mut rng, d, 0.1, 0.0), &[d]);
        put(format!("{p}.linear1.weight"), random(&mut rng, c.ff * d, wd, 0.0), &[c.ff, d]);
        put(format!("{p}.linear1.bias"), random(&mut rng, c.ff, 0.1, 0.0), &[c.ff]);
        put(format!("{p}.linear2.weight"), random(&mut rng, d * c.ff, wf, 0.0), &[d, c.ff]);
        put(format!("{p}.linear2.bias"), random(&mut rng, d, 0.1, 0.0), &[d]);
        for n in ["norm1", "norm2"] {
            put(format!("{p}.{n}.weight"), random(&mut rng, d, 0.5, 1.0), &[d]);
            put(format!("{p}.{n}.bias"), random(&mut rng, d, 0.3, 0.0), &[d]);
        }
    }
    let path = dir.join(format!("encoder-{}.safetensors", c.seed));
    candle_core::safetensors::save(&sd, &path).unwrap();
    let ckpt = Checkpoint::open(&path).unwrap();
    let activation = if c.gelu { Activation::Gelu } else { Activation::Relu };
    let spec = TransformerSpec { d_model: d, heads: c.heads, ff: c.ff, layers: c.layers, activation };
    TransformerEncoder::load(&ckpt, "", "", spec, "props.transformer", &dev).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]
    #[test]
    fn forward_stays_within_the_derived_bound_of_the_f64_reference(c in case()) {
        let dir = std::env::temp_dir().join(format!("pmstate-attention-props-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let enc = build(&c, &dir);
        let (b, s, d) = (c.batch, c.seq, c.heads * c.head_dim);
        let mut rng = Rng(c.seed ^ 0x5eed);
        let x = Tensor::from_vec(random(&mut rng, b * s * d, c.input_scale, 0.0), (b, s, d), &Device::Cpu).unwrap();
        // key padding: each key padded with probability 1/3, the last row fully when b > 1
        let pad: Vec<u8> = (0..b * s).map(|i| u8::from((b > 1 && i / s == b - 1) || rng.next() < -0.33)).collect();
        let pad = Tensor::from_vec(pad, (b, s), &Device::Cpu).unwrap();
        let additive: Vec<f32> = (0..s * s)
            .map(|i| {
                let (q, k) = (i / s, i % s);
                let finite = (6.0 * rng.next()) as f32;
                match c.additive {
                    1 if k > q => f32::NEG_INFINITY,
                    2 => finite,
                    3 if rng.next() < -0.5 => f32::NEG_INFINITY,
                    3 => finite,
                    _ => 0.0,
                }
            })
            .collect();
        let additive = Tensor::from_vec(additive, (s, s), &Device::Cpu).unwrap();
        let masks = AttentionMasks {
            key_padding: c.padding.then_some(&pad),
            additive: (c.additive > 0).then_some(&additive),
        };
        let reference = enc.reference(&x, &masks).unwrap();
        prop_assert!(reference.bound.iter().all(|e| e.is_finite() && *e >= 0.0));
        let got = enc.forward(&x, &masks).unwrap().to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        if let Some((i, diff, bound)) = within(&got, &reference, 1.0) {
            prop_assert!(false, "[{i}] = {} is {diff:e} from {}, bound {bound:e}", got[i], reference.value[i]);
        }
    }
}
