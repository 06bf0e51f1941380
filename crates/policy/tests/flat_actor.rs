//! `Policy::mean_action_into` (slices in, the caller's buffers) gives the
//! bits of `Policy::mean_action` on every recorded policy whose actor has
//! the flat shape, at batch sizes on both sides of a kernel block, and
//! declines (`false`) the others.

use std::path::PathBuf;

use candle_core::{Device, Tensor};
use pmstate_policy::{ActorScratch, Policy};

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy").join(rel)
}

fn rows(t: &Tensor, n: usize) -> Tensor {
    // repeat the recorded rows until there are n
    let have = t.dims()[0];
    let idx: Vec<u32> = (0..n).map(|i| (i % have) as u32).collect();
    t.index_select(&Tensor::new(idx, &Device::Cpu).expect("idx"), 0).expect("rows")
}

#[test]
fn flat_actors_give_the_candle_paths_bits() {
    let mut flat = 0;
    for v in ["g1_amp_deploy", "smpl_tracker", "soma_tracker", "layernorm_activations", "module_ops_ppo"] {
        let p = Policy::load(data(&format!("{v}/last.ckpt")), None, &Device::Cpu).expect(v);
        let obs = candle_core::safetensors::load(data(&format!("{v}/obs.safetensors")), &Device::Cpu).expect("obs");
        let keys = p.actor_keys();
        let mut scratch = ActorScratch::default();
        let mut out = Vec::new();
        for n in [1usize, 2, 3, 7, 13, 40] {
            let sub: std::collections::HashMap<String, Tensor> =
                keys.iter().map(|k| (k.clone(), rows(&obs[k], n))).collect();
            let slices: Vec<Vec<f32>> =
                keys.iter().map(|k| sub[k].flatten_all().and_then(|t| t.to_vec1::<f32>()).expect("f32")).collect();
            let ran = p.mean_action_into(n, &|i| &slices[i], &mut scratch, &mut out).expect("mean_action_into");
            if !ran {
                assert!(n == 1, "{v}: declined at {n} rows after running at 1");
                eprintln!("{v}: not a flat actor (declined)");
                break;
            }
            let want =
                p.mean_action(&sub).expect("mean_action").flatten_all().and_then(|t| t.to_vec1::<f32>()).expect("f32");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&out), bits(&want), "{v}, {n} rows");
            if n == 1 {
                flat += 1;
            }
        }
    }
    // the published trackers' actors are flat; the synthetic LayerNorm and
    // module-operation ones are not
    assert_eq!(flat, 3, "flat actors among the five");
}
