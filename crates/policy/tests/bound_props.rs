//! The documented float32 error bound holds on random MLPs: this crate's
//! forward (both CPU kernels) stays within `bound` of the float64 reference
//! for random widths, depths, activations, LayerNorm, output activations,
//! normalizer statistics, clamps, and inputs up to 1e3.

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use pmstate_ckpt::Checkpoint;
use pmstate_policy::bound::within;
use pmstate_policy::config::{
    ActorConfig, Family, LayerConfig, MlpConfig, ModelConfig, ModuleConfig, NormSettings, Number,
};
use pmstate_policy::module_ops::ModuleOp;
use pmstate_policy::{Activation, CpuKernels, Policy};
use proptest::prelude::*;

const ACTS: [Activation; 7] = [
    Activation::Tanh,
    Activation::Relu,
    Activation::Elu,
    Activation::Gelu,
    Activation::Identity,
    Activation::Silu,
    Activation::Mish,
];

#[derive(Debug, Clone)]
struct Case {
    width_a: usize,
    width_b: usize,
    layers: Vec<(usize, usize, bool)>,
    out_act: Option<usize>,
    num_out: usize,
    clamp: Option<f64>,
    sphere: bool,
    rows: usize,
    seed: u64,
    scale: f64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        1usize..9,
        1usize..9,
        prop::collection::vec((1usize..40, 0usize..7, any::<bool>()), 0..4),
        prop::option::of(0usize..7),
        1usize..8,
        prop::option::of(0.5f64..6.0),
        any::<bool>(),
        1usize..13,
        any::<u64>(),
        prop_oneof![Just(1.0), Just(30.0), Just(1000.0)],
    )
        .prop_map(|(width_a, width_b, layers, out_act, num_out, clamp, sphere, rows, seed, scale)| Case {
            width_a,
            width_b,
            layers,
            out_act,
            num_out,
            clamp,
            sphere,
            rows,
            seed,
            scale,
        })
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }
}

fn mlp_cfg(c: &Case, out_key: &str, num_out: usize) -> MlpConfig {
    let mut ops = vec![];
    if c.sphere {
        ops.push(ModuleOp::SphereProjection);
    }
    ops.push(ModuleOp::Forward);
    MlpConfig {
        in_keys: vec!["a".into(), "b".into()],
        out_key: out_key.into(),
        norm: NormSettings { normalize_obs: true, clamp: c.clamp.map(Number::Float), ema_decay: None },
        layers: c
            .layers
            .iter()
            .map(|&(u, a, ln)| LayerConfig { units: u, activation: ACTS[a], use_layer_norm: ln })
            .collect(),
        num_out,
        output_activation: c.out_act.map(|a| ACTS[a]),
        module_operations: ops,
    }
}

fn build(c: &Case, dir: &std::path::Path) -> Policy {
    let mut rng = Rng(c.seed);
    let width = c.width_a + c.width_b;
    let dev = Device::Cpu;
    let mut sd: HashMap<String, Tensor> = HashMap::new();
    for (prefix, num_out) in [("_actor.mu", c.num_out), ("_critic", 1)] {
        let mut fan_in = width;
        let mut idx = 0;
        let dims: Vec<(usize, bool)> =
            c.layers.iter().enumerate().map(|(i, &(u, _, ln))| (u, ln && i == 0)).chain([(num_out, false)]).collect();
        for (u, ln) in dims {
            let bound = 1.5 / (fan_in as f64).sqrt();
            let w: Vec<f32> = (0..u * fan_in).map(|_| (rng.next() * bound) as f32).collect();
            let b: Vec<f32> = (0..u).map(|_| (rng.next() * bound) as f32).collect();
            sd.insert(format!("{prefix}.mlp.{idx}.weight"), Tensor::from_vec(w, (u, fan_in), &dev).unwrap());
            sd.insert(format!("{prefix}.mlp.{idx}.bias"), Tensor::from_vec(b, u, &dev).unwrap());
            idx += 1;
            if ln {
                let g: Vec<f32> = (0..u).map(|_| (1.0 + 0.5 * rng.next()) as f32).collect();
                let be: Vec<f32> = (0..u).map(|_| (0.3 * rng.next()) as f32).collect();
                sd.insert(format!("{prefix}.mlp.{idx}.weight"), Tensor::from_vec(g, u, &dev).unwrap());
                sd.insert(format!("{prefix}.mlp.{idx}.bias"), Tensor::from_vec(be, u, &dev).unwrap());
                idx += 1;
            }
            idx += 1;
            fan_in = u;
        }
        let mean: Vec<f64> = (0..width).map(|_| rng.next() * 3.0).collect();
        let var: Vec<f64> = (0..width).map(|_| (rng.next() + 1.05) * 2.0).collect();
        sd.insert(format!("{prefix}.norm.running_obs_norm.mean"), Tensor::from_vec(mean, width, &dev).unwrap());
        sd.insert(format!("{prefix}.norm.running_obs_norm.var"), Tensor::from_vec(var, width, &dev).unwrap());
        sd.insert(format!("{prefix}.norm.running_obs_norm.count"), Tensor::new(7i64, &dev).unwrap());
    }
    sd.insert("_actor.logstd".into(), Tensor::full(-1.0f32, c.num_out, &dev).unwrap());
    let path = dir.join(format!("case-{}.safetensors", c.seed));
    candle_core::safetensors::save(&sd, &path).unwrap();
    let ckpt = Checkpoint::open(&path).unwrap();
    let cfg = ModelConfig {
        family: Family::Ppo,
        in_keys: vec!["a".into(), "b".into()],
        actor: ActorConfig {
            mu_key: "mu".into(),
            num_out: c.num_out,
            actor_logstd: -1.0,
            learnable_std: true,
            mu_model: ModuleConfig::Mlp(mlp_cfg(c, "mu", c.num_out)),
        },
        critic: ModuleConfig::Mlp(mlp_cfg(c, "value", 1)),
        amp: None,
    };
    Policy::from_parts(cfg, &ckpt, &dev).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]
    #[test]
    fn forward_stays_within_the_bound_of_the_f64_reference(c in case()) {
        let dir = std::env::temp_dir().join(format!("pmstate-policy-props-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let policy = build(&c, &dir);
        let mut rng = Rng(c.seed ^ 0xabcdef);
        let mut obs = HashMap::new();
        for (k, w) in [("a", c.width_a), ("b", c.width_b)] {
            let v: Vec<f32> = (0..c.rows * w).map(|_| (rng.next() * c.scale) as f32).collect();
            obs.insert(k.to_string(), Tensor::from_vec(v, (c.rows, w), &Device::Cpu).unwrap());
        }
        let reference = policy.reference(&obs).unwrap();
        for kernels in [CpuKernels::Packed, CpuKernels::Candle] {
            let p = policy.clone().with_cpu_kernels(kernels).unwrap();
            let out = p.forward(&obs).unwrap();
            for (name, t) in [("mu", &out.mean_action), ("value", &out.value)] {
                let r = &reference.values[name];
                prop_assert!(r.bound.iter().all(|b| b.is_finite()));
                let got = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                if let Some((i, d, b)) = within(&got, r, 1.0) {
                    prop_assert!(false, "{kernels:?} {name}[{i}] = {} is {d:e} from {}, bound {b:e}", got[i], r.value[i]);
                }
            }
        }
    }
}
