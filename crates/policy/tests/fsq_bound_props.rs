//! The FSQ error bound holds on random autoencoders: with both CPU
//! kernels, every code whose bounded latent lies farther than its bound
//! from a rounding boundary is exactly the float64 reference's, every other
//! code lies within its (integer) bound, and the mean action lies within
//! its bound, for random encoder/decoder depths and widths, level counts,
//! latent widths and input scales (tanh near 0 and saturated).

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use pmstate_ckpt::Checkpoint;
use pmstate_policy::bound::within;
use pmstate_policy::config::{
    ActorConfig, Family, FsqConfig, LayerConfig, MlpConfig, ModelConfig, ModuleConfig, NormSettings, Number,
};
use pmstate_policy::module_ops::ModuleOp;
use pmstate_policy::{Activation, CpuKernels, Policy};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Case {
    width_a: usize,
    width_b: usize,
    enc_layers: Vec<usize>,
    dec_layers: Vec<usize>,
    levels: usize,
    scalars: usize,
    actions: usize,
    gain: f64,
    rows: usize,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        (1usize..9, 1usize..9),
        prop::collection::vec(1usize..24, 0..3),
        prop::collection::vec(1usize..24, 0..3),
        prop_oneof![Just(3usize), Just(5), Just(7), Just(9)],
        1usize..12,
        1usize..6,
        prop_oneof![Just(0.5), Just(2.0), Just(6.0)],
        1usize..13,
        any::<u64>(),
    )
        .prop_map(|((width_a, width_b), enc_layers, dec_layers, levels, scalars, actions, gain, rows, seed)| {
            Case { width_a, width_b, enc_layers, dec_layers, levels, scalars, actions, gain, rows, seed }
        })
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }
}

fn mlp_cfg(in_keys: &[&str], out_key: &str, layers: &[usize], num_out: usize) -> MlpConfig {
    MlpConfig {
        in_keys: in_keys.iter().map(|k| k.to_string()).collect(),
        out_key: out_key.into(),
        norm: NormSettings { normalize_obs: true, clamp: Some(Number::Int(5)), ema_decay: None },
        layers: layers
            .iter()
            .map(|&u| LayerConfig { units: u, activation: Activation::Relu, use_layer_norm: false })
            .collect(),
        num_out,
        output_activation: None,
        module_operations: vec![ModuleOp::Forward],
    }
}

/// Weights and normalizer statistics of one MLPWithConcat at `prefix`.
fn add_mlp(
    sd: &mut HashMap<String, Tensor>,
    rng: &mut Rng,
    prefix: &str,
    fan: usize,
    layers: &[usize],
    out: usize,
    gain: f64,
) {
    let dev = Device::Cpu;
    let mut fan_in = fan;
    for (i, &u) in layers.iter().chain([out].iter()).enumerate() {
        let bound = gain / (fan_in as f64).sqrt();
        let w: Vec<f32> = (0..u * fan_in).map(|_| (rng.next() * bound) as f32).collect();
        let b: Vec<f32> = (0..u).map(|_| (rng.next() * bound) as f32).collect();
        sd.insert(format!("{prefix}.mlp.{}.weight", 2 * i), Tensor::from_vec(w, (u, fan_in), &dev).unwrap());
        sd.insert(format!("{prefix}.mlp.{}.bias", 2 * i), Tensor::from_vec(b, u, &dev).unwrap());
        fan_in = u;
    }
    let mean: Vec<f64> = (0..fan).map(|_| rng.next()).collect();
    let var: Vec<f64> = (0..fan).map(|_| (rng.next() + 1.05) * 2.0).collect();
    sd.insert(format!("{prefix}.norm.running_obs_norm.mean"), Tensor::from_vec(mean, fan, &dev).unwrap());
    sd.insert(format!("{prefix}.norm.running_obs_norm.var"), Tensor::from_vec(var, fan, &dev).unwrap());
    sd.insert(format!("{prefix}.norm.running_obs_norm.count"), Tensor::new(7i64, &dev).unwrap());
}

fn build(c: &Case, dir: &std::path::Path) -> Policy {
    let mut rng = Rng(c.seed);
    let mut sd: HashMap<String, Tensor> = HashMap::new();
    add_mlp(&mut sd, &mut rng, "_actor.mu.encoder", c.width_a, &c.enc_layers, c.scalars, c.gain);
    add_mlp(&mut sd, &mut rng, "_actor.mu.decoder", c.width_b + c.scalars, &c.dec_layers, c.actions, 1.5);
    add_mlp(&mut sd, &mut rng, "_critic", c.width_a + c.width_b, &[], 1, 1.5);
    sd.insert("_actor.logstd".into(), Tensor::full(-1.0f32, c.actions, &Device::Cpu).unwrap());
    let path = dir.join(format!("fsq-case-{}.safetensors", c.seed));
    candle_core::safetensors::save(&sd, &path).unwrap();
    let ckpt = Checkpoint::open(&path).unwrap();
    let fsq = FsqConfig {
        in_keys: vec!["a".into(), "b".into()],
        encoder: ModuleConfig::Mlp(mlp_cfg(&["a"], "latent", &c.enc_layers, c.scalars)),
        decoder: ModuleConfig::Mlp(mlp_cfg(&["b", "latent"], "mu", &c.dec_layers, c.actions)),
        latent_key: "latent".into(),
        num_fsq_levels: c.levels,
        num_fsq_scalars: c.scalars,
    };
    let cfg = ModelConfig {
        family: Family::Ppo,
        in_keys: vec!["a".into(), "b".into()],
        actor: ActorConfig {
            mu_key: "mu".into(),
            num_out: c.actions,
            actor_logstd: -1.0,
            learnable_std: true,
            mu_model: ModuleConfig::Fsq(Box::new(fsq)),
        },
        critic: ModuleConfig::Mlp(mlp_cfg(&["a", "b"], "value", &[], 1)),
        amp: None,
    };
    Policy::from_parts(cfg, &ckpt, &Device::Cpu).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]
    #[test]
    fn codes_and_mean_action_stay_within_the_bound(c in case()) {
        let dir = std::env::temp_dir().join(format!("pmstate-policy-fsq-props-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let policy = build(&c, &dir);
        let mut rng = Rng(c.seed ^ 0x5eed);
        let mut obs = HashMap::new();
        for (k, w) in [("a", c.width_a), ("b", c.width_b)] {
            let v: Vec<f32> = (0..c.rows * w).map(|_| (rng.next() * 4.0) as f32).collect();
            obs.insert(k.to_string(), Tensor::from_vec(v, (c.rows, w), &Device::Cpu).unwrap());
        }
        let reference = policy.reference(&obs).unwrap();
        let stage = &reference.fsq[0];
        let half_width = (c.levels / 2) as f64;
        for kernels in [CpuKernels::Packed, CpuKernels::Candle] {
            let p = policy.clone().with_cpu_kernels(kernels).unwrap();
            let out = p.forward(&obs).unwrap();
            let codes = out.latent_codes.unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            prop_assert_eq!(codes.len(), c.rows * c.scalars);
            for (i, (&got, (&want, &bound))) in codes.iter().zip(stage.codes.value.iter().zip(&stage.codes.bound)).enumerate() {
                let g = f64::from(got);
                prop_assert!(g.fract() == 0.0 && g.abs() <= half_width, "code {} = {}", i, g);
                if bound == 0.0 {
                    prop_assert_eq!(g, want, "{:?}: certain code {} (distance {:e}, bound {:e})",
                        kernels, i, stage.boundary_distance[i], stage.bounded.bound[i]);
                } else {
                    prop_assert!((g - want).abs() <= bound, "{:?}: code {} = {}, reference {}, bound {}", kernels, i, g, want, bound);
                }
            }
            let r = &reference.values["mu"];
            prop_assert!(r.bound.iter().all(|b| b.is_finite()));
            let got = out.mean_action.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            if let Some((i, d, b)) = within(&got, r, 1.0) {
                prop_assert!(false, "{:?} mu[{}] = {} is {:e} from {}, bound {:e}", kernels, i, got[i], d, r.value[i], b);
            }
        }
    }
}

/// A latent placed on rounding boundaries (`tanh(e) * half_L = k + 1/2` up
/// to float32 rounding of `e`): the reference marks those codes uncertain
/// (bound 1), the forward picks either neighbour, and the mean action
/// still lies within its (wider) bound.
#[test]
fn latents_on_rounding_boundaries_are_uncertain_and_the_bound_still_holds() {
    let dev = Device::Cpu;
    let levels = 9;
    let half_l = f64::from(pmstate_policy::fsq::half_l(levels));
    let targets = [0.5f64, -0.5, 1.5, -2.5, 3.5, 0.25];
    let s = targets.len();
    let mut sd: HashMap<String, Tensor> = HashMap::new();
    // encoder: identity Linear, no normalizer: e = x
    let mut eye = vec![0f32; s * s];
    for i in 0..s {
        eye[i * s + i] = 1.0;
    }
    sd.insert("_actor.mu.encoder.mlp.0.weight".into(), Tensor::from_vec(eye, (s, s), &dev).unwrap());
    sd.insert("_actor.mu.encoder.mlp.0.bias".into(), Tensor::zeros(s, candle_core::DType::F32, &dev).unwrap());
    let mut rng = Rng(11);
    add_mlp(&mut sd, &mut rng, "_actor.mu.decoder", 1 + s, &[8], 3, 1.5);
    add_mlp(&mut sd, &mut rng, "_critic", s + 1, &[], 1, 1.5);
    sd.insert("_actor.logstd".into(), Tensor::full(-1.0f32, 3, &dev).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("boundaries.safetensors");
    candle_core::safetensors::save(&sd, &path).unwrap();
    let ckpt = Checkpoint::open(&path).unwrap();
    let mut enc = mlp_cfg(&["a"], "latent", &[], s);
    enc.norm.normalize_obs = false;
    let fsq = FsqConfig {
        in_keys: vec!["a".into(), "b".into()],
        encoder: ModuleConfig::Mlp(enc),
        decoder: ModuleConfig::Mlp(mlp_cfg(&["b", "latent"], "mu", &[8], 3)),
        latent_key: "latent".into(),
        num_fsq_levels: levels,
        num_fsq_scalars: s,
    };
    let cfg = ModelConfig {
        family: Family::Ppo,
        in_keys: vec!["a".into(), "b".into()],
        actor: ActorConfig {
            mu_key: "mu".into(),
            num_out: 3,
            actor_logstd: -1.0,
            learnable_std: true,
            mu_model: ModuleConfig::Fsq(Box::new(fsq)),
        },
        critic: ModuleConfig::Mlp(mlp_cfg(&["a", "b"], "value", &[], 1)),
        amp: None,
    };
    let policy = Policy::from_parts(cfg, &ckpt, &dev).unwrap();
    let a: Vec<f32> = targets.iter().map(|t| (t / half_l).atanh() as f32).collect();
    let mut obs = HashMap::new();
    obs.insert("a".to_string(), Tensor::from_vec(a, (1, s), &dev).unwrap());
    obs.insert("b".to_string(), Tensor::from_vec(vec![0.3f32], (1, 1), &dev).unwrap());
    let reference = policy.reference(&obs).unwrap();
    let stage = &reference.fsq[0];
    // the five on a boundary are uncertain with bound 1; 0.25 is certain
    let uncertain: Vec<bool> = stage.codes.bound.iter().map(|b| *b > 0.0).collect();
    assert_eq!(uncertain, [true, true, true, true, true, false], "{:?}", stage.boundary_distance);
    assert!(stage.codes.bound[..5].iter().all(|b| *b == 1.0));
    assert!(stage.min_margin() < 0.0);
    for kernels in [CpuKernels::Packed, CpuKernels::Candle] {
        let out = policy.clone().with_cpu_kernels(kernels).unwrap().forward(&obs).unwrap();
        let codes = out.latent_codes.unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for (i, (&g, (&want, &bound))) in codes.iter().zip(stage.codes.value.iter().zip(&stage.codes.bound)).enumerate()
        {
            assert!((f64::from(g) - want).abs() <= bound, "{kernels:?}: code {i} = {g}, reference {want}");
        }
        assert_eq!(codes[5], 0.0);
        let got = out.mean_action.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(within(&got, &reference.values["mu"], 1.0).is_none(), "{kernels:?}");
    }
}
