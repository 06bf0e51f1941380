//! Row independence: a row's outputs do not depend on the batch it is in
//! (its size, its position, the other rows), bit for bit. `pmstate-serve`
//! merges concurrent requests into one forward and promises each caller
//! exactly what serving its rows alone gives; this is that promise, on the
//! seven recorded ProtoMotions policies (every layer kind, module
//! operations, AMP networks) and batch sizes on both sides of the kernels'
//! matrix-vector/matrix-matrix switch.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use pmstate_policy::{Part, Policy};

const VARIANTS: [&str; 10] = [
    "smpl_tracker",
    "g1_amp_deploy",
    "layernorm_activations",
    "welford_clamps",
    "container_obsprocessor",
    "module_ops_ppo",
    "module_ops_amp",
    "soma_tracker",
    "soma_fsq_tracker",
    "soma_fsq_amp",
];

fn dir(v: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy").join(v)
}

/// Rows `idx` of every observation.
fn pick(obs: &HashMap<String, Tensor>, idx: &[u32]) -> HashMap<String, Tensor> {
    let ids = Tensor::new(idx, &Device::Cpu).unwrap();
    obs.iter().map(|(k, t)| (k.clone(), t.index_select(&ids, 0).unwrap())).collect()
}

fn rows(t: &Tensor) -> Vec<Vec<u32>> {
    let t = t.flatten_from(1).unwrap();
    t.to_vec2::<f32>().unwrap().into_iter().map(|r| r.into_iter().map(f32::to_bits).collect()).collect()
}

/// Each output's name and its rows as f32 bits.
type Outputs = Vec<(&'static str, Vec<Vec<u32>>)>;

/// Every named output of one call, as rows of bits.
fn outputs(p: &Policy, obs: &HashMap<String, Tensor>) -> Outputs {
    let s = p.sample(obs, 7).unwrap();
    let mut out = vec![
        ("mean_action", rows(&s.outputs.mean_action)),
        ("value", rows(&s.outputs.value)),
        // per-row draws depend on the whole batch's noise stream: compare
        // the neglogp of the batch's own actions instead
        ("neglogp", rows(&p.neglogp(&s.outputs.mean_action, &s.outputs.mean_action).unwrap().unsqueeze(1).unwrap())),
    ];
    if let Some(n) = &s.outputs.norm_obs {
        if n.dims()[0] == s.outputs.mean_action.dims()[0] {
            out.push(("norm_obs", rows(n)));
        }
    }
    if let Some(c) = &s.outputs.latent_codes {
        out.push(("latent_codes", rows(c)));
    }
    if p.amp().is_some() && p.required_keys(Part::Discriminator).iter().all(|k| obs.contains_key(k)) {
        let d = p.discriminate(obs).unwrap();
        out.push(("disc_logits", rows(&d.disc_logits)));
        out.push(("disc_value", rows(&d.disc_value)));
        out.push(("disc_reward", rows(&d.disc_reward)));
    }
    out
}

#[test]
fn a_row_gives_the_same_bits_alone_and_in_any_batch() {
    for v in VARIANTS {
        let d = dir(v);
        let p = Policy::load(d.join("last.ckpt"), None, &Device::Cpu).unwrap();
        let obs = candle_core::safetensors::load(d.join("obs.safetensors"), &Device::Cpu).unwrap();
        let n = obs.values().next().unwrap().dims()[0] as u32;
        // each row alone: the reference
        let alone: Vec<Outputs> = (0..n).map(|i| outputs(&p, &pick(&obs, &[i]))).collect();
        // batches of 2, 3 (matrix-vector), 5, 8, 13, 64 and 300 (matrix-matrix,
        // several row blocks) with rows in scrambled positions
        for size in [2usize, 3, 5, 8, 13, 64, 300] {
            let idx: Vec<u32> = (0..size).map(|j| ((j * 7 + size) as u32) % n).collect();
            let batch = outputs(&p, &pick(&obs, &idx));
            for (j, &i) in idx.iter().enumerate() {
                for ((name, got), (_, want)) in batch.iter().zip(&alone[i as usize]) {
                    assert_eq!(
                        got[j], want[0],
                        "{v}: {name} of row {i} at position {j} of a batch of {size} differs from the row alone"
                    );
                }
            }
        }
    }
}

/// The same promise for MaskedMimic (the transformer's Linears and
/// attention run through candle's matmul): each output row alone and in
/// batches of every kind.
#[test]
fn a_masked_mimic_row_gives_the_same_bits_alone_and_in_any_batch() {
    let d = dir("masked_mimic");
    let m = pmstate_policy::MaskedMimic::load(d.join("last.ckpt"), None, &Device::Cpu).unwrap();
    let obs = candle_core::safetensors::load(d.join("obs.safetensors"), &Device::Cpu).unwrap();
    let n = obs.values().next().unwrap().dims()[0] as u32;
    let run = |o: &HashMap<String, Tensor>| {
        let out = m.forward(o).unwrap();
        [
            ("mean_action", rows(&out.mean_action)),
            ("latent", rows(&out.latent)),
            ("latent_logvar", rows(&out.latent_logvar)),
        ]
    };
    let alone: Vec<_> = (0..n).map(|i| run(&pick(&obs, &[i]))).collect();
    for size in [2usize, 3, 5, 8, 13, 64, 300] {
        let idx: Vec<u32> = (0..size).map(|j| ((j * 7 + size) as u32) % n).collect();
        let batch = run(&pick(&obs, &idx));
        for (j, &i) in idx.iter().enumerate() {
            for ((name, got), (_, want)) in batch.iter().zip(&alone[i as usize]) {
                assert_eq!(
                    got[j], want[0],
                    "{name} of row {i} at position {j} of a batch of {size} differs from the row alone"
                );
            }
        }
    }
}
